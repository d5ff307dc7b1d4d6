//! The batch-read benchmark: many owners x keys, each spread over 16 slot
//! rows, read three ways. All three must return the same totals.

use std::{collections::HashMap, time::Instant};

use counter_core::{CounterTable, Counters};
use sea_orm::{
    DatabaseConnection, DbBackend, Statement, Value,
    sea_query::{Alias, Query},
};

use crate::writes::{BoxError, placeholder};

const TABLE: &str = "bench_reads";
const KEYS: [&str; 4] = ["likes", "comments", "views", "shares"];
const SLOTS: i16 = 16;
/// Timed repetitions of the fast designs; the median is reported.
const REPEATS: usize = 7;
/// Rows per INSERT while populating.
const INSERT_ROWS: usize = 1000;

/// One read design's median time.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReadResult {
    pub design: &'static str,
    pub owners: usize,
    pub keys: usize,
    pub ms: f64,
}

type Totals = HashMap<(i64, String), i64>;

/// Populates `owners` x 4 keys x 16 slots, then times the crate's batch read,
/// the naive loop (one query per owner per key) and a hand-written grouped
/// query.
pub async fn run(db: &DatabaseConnection, owners: usize) -> Result<Vec<ReadResult>, BoxError> {
    let counters = Counters::<i64>::new(CounterTable::new(TABLE)?);
    counters.drop_table(db).await?;
    counters.create_table(db).await?;
    let ids: Vec<i64> = (1..=owners as i64).collect();
    let expected = populate(db, &ids).await?;
    let (counters, ids) = (&counters, &ids);

    let batch = median_ms(
        REPEATS,
        || async move {
            let counts = counters.get_many(db, ids, &KEYS).await?;
            Ok(counts
                .into_iter()
                .flat_map(|(owner, keys)| keys.into_iter().map(move |(k, v)| ((owner, k), v)))
                .collect())
        },
        &expected,
    )
    .await?;
    let naive = median_ms(
        3,
        || async move {
            let mut totals = Totals::new();
            for owner in ids {
                for key in KEYS {
                    totals.insert(
                        (*owner, key.to_owned()),
                        counters.get(db, *owner, key).await?,
                    );
                }
            }
            Ok(totals)
        },
        &expected,
    )
    .await?;
    let raw = median_ms(REPEATS, || hand_written(db, ids), &expected).await?;

    Ok([("batch", batch), ("naive_loop", naive), ("raw_sql", raw)]
        .into_iter()
        .map(|(design, ms)| ReadResult {
            design,
            owners,
            keys: KEYS.len(),
            ms,
        })
        .collect())
}

/// Writes every slot row directly, with known values, and returns the totals.
async fn populate(db: &DatabaseConnection, ids: &[i64]) -> Result<Totals, BoxError> {
    let mut expected = Totals::new();
    let rows: Vec<(i64, &str, i16, i64)> = ids
        .iter()
        .flat_map(|&owner| {
            KEYS.iter().flat_map(move |&key| {
                (0..SLOTS)
                    .map(move |slot| (owner, key, slot, (owner * 7 + i64::from(slot)) % 10 + 1))
            })
        })
        .collect();
    for chunk in rows.chunks(INSERT_ROWS) {
        let mut insert = Query::insert();
        insert
            .into_table(Alias::new(TABLE))
            .columns(["owner_id", "count_key", "slot", "value"].map(Alias::new));
        for &(owner, key, slot, value) in chunk {
            insert.values([owner.into(), key.into(), slot.into(), value.into()])?;
            *expected.entry((owner, key.to_owned())).or_insert(0) += value;
        }
        counter_core::pooling::execute(db, db.get_database_backend().build(&insert)).await?;
    }
    Ok(expected)
}

/// The grouped query an application would write itself, decoded into a map.
async fn hand_written(db: &DatabaseConnection, ids: &[i64]) -> Result<Totals, BoxError> {
    let backend = db.get_database_backend();
    let cast = match backend {
        DbBackend::MySql => "SIGNED",
        _ => "BIGINT",
    };
    let placeholder = |n| placeholder(backend, n);
    let owner_marks: Vec<String> = (1..=ids.len()).map(placeholder).collect();
    let key_marks: Vec<String> = (ids.len() + 1..=ids.len() + KEYS.len())
        .map(placeholder)
        .collect();
    let sql = format!(
        "SELECT owner_id, count_key, CAST(SUM(value) AS {cast}) FROM {TABLE} \
         WHERE owner_id IN ({}) AND count_key IN ({}) GROUP BY owner_id, count_key",
        owner_marks.join(", "),
        key_marks.join(", ")
    );
    let values: Vec<Value> = ids
        .iter()
        .map(|&id| id.into())
        .chain(KEYS.iter().map(|&k| k.into()))
        .collect();
    let rows =
        counter_core::pooling::query_all(db, Statement::from_sql_and_values(backend, sql, values))
            .await?;
    let mut totals = Totals::with_capacity(rows.len());
    for row in rows {
        totals.insert(
            (row.try_get_by_index(0)?, row.try_get_by_index(1)?),
            row.try_get_by_index(2)?,
        );
    }
    Ok(totals)
}

/// Runs `read` `repeats` times, checks every result against `expected`, and
/// returns the median time in milliseconds.
async fn median_ms<F, Fut>(repeats: usize, mut read: F, expected: &Totals) -> Result<f64, BoxError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Totals, BoxError>>,
{
    let mut times = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let started = Instant::now();
        let totals = read().await?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
        if &totals != expected {
            return Err("a read returned wrong totals".into());
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}
