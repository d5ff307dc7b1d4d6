//! The `zipf` workload: many counters, a few of them very hot, as the likes
//! of a site's posts are. It compares slot policies of the crate: fixed
//! slots (`fixed16`, `fixed64`), which spread every counter, hot or cold,
//! over up to that many rows, against `adaptive`, which keeps a counter on
//! one row until its writes contend.
//!
//! A cell, on a fresh table:
//!
//! 1. **History**: every owner gets `--history-rounds` earlier writes, as a
//!    counter that lived a while would have had: per round, one
//!    `DeltaBatch` per 1,000 owners adding 1 to each, applied on the pool.
//!    A batch picks one slot per counter, so with fixed slots a counter
//!    ends with up to `min(rounds, slots)` rows, and with adaptive slots
//!    (no contention in a batch) with one.
//! 2. **Clients**: autocommit `increment`s, each client drawing owners from
//!    a Zipf distribution over `1..=--owners` (owner 1 the hottest, see
//!    [`Zipf`]) with a generator of its own seeded with `--seed` + its
//!    index; a warm-up, then the measured window. The process's adaptive
//!    widths outlive a cell (they cool after 30 s without contention), so
//!    an adaptive cell right after another may start with its hot counters
//!    already wide; the warm-up widens them anyway.
//! 3. **Figures**: all increments per second (`tx_per_s`) and those of the
//!    `--hot-owners` hottest owners (`hot_tx_per_s`); slot rows per cold
//!    counter (owners above `owners / 100`: rows / distinct owners, one
//!    query); the median of 5 timed batch reads of up to 1,000 cold owners
//!    spread over the upper half of the owners, after one untimed read
//!    that warms the caches; and the check that the table's `SUM(value)`
//!    is the history plus every committed increment.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use counter_core::{Counters, DeltaBatch};
use indicatif::ProgressBar;
use rand::{SeedableRng, rngs::SmallRng};
use sea_orm::{DatabaseConnection, DbBackend, DbErr, Statement};

use crate::{
    nodes::Nodes,
    sampler::Zipf,
    writes::{BoxError, COUNTER_TABLE, CellResult, KEY, Setup, Tally, Timing, run_clients, scalar},
};

/// Owners per history batch.
const HISTORY_CHUNK: i64 = 1000;
/// Owners in a cold read.
const COLD_READ_OWNERS: i64 = 1000;
/// Timed cold reads; the median is reported.
const COLD_READS: usize = 5;

/// The `zipf` options, with the distribution built once per run.
#[derive(Debug, Clone)]
pub struct Settings {
    pub owners: i64,
    pub exponent: f64,
    pub history_rounds: u32,
    pub hot_owners: i64,
    pub seed: u64,
    pub draws: Arc<Zipf>,
}

impl Settings {
    pub fn new(
        owners: u64,
        exponent: f64,
        history_rounds: u32,
        hot_owners: u64,
        seed: u64,
    ) -> Result<Self, BoxError> {
        let draws = Zipf::new(owners, exponent)?;
        Ok(Self {
            owners: i64::try_from(draws.owners())?,
            exponent,
            history_rounds,
            hot_owners: i64::try_from(hot_owners.min(owners))?,
            seed,
            draws: Arc::new(draws),
        })
    }
}

/// What a `zipf` cell measured besides the shared [`CellResult`] fields
/// (serialized as fields of the cell).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ZipfFigures {
    pub owners: i64,
    pub zipf_s: f64,
    pub hot_owners: i64,
    pub history_rounds: u32,
    /// Increments written by the history (part of `expected_total`).
    pub history_total: i64,
    /// Committed increments of owners `1..=hot_owners` per second of the
    /// measured window.
    pub hot_tx_per_s: f64,
    /// Slot rows per counter of the owners above `owners / 100`.
    pub rows_per_cold_counter: f64,
    /// The median time of a batch read of `cold_read_owners` cold owners.
    pub cold_read_ms: f64,
    pub cold_read_owners: usize,
}

/// Runs one `zipf` cell on the table `setup` was prepared with.
pub async fn run(
    nodes: &Nodes,
    setup: Arc<Setup>,
    timing: Timing,
    settings: &Settings,
    progress: &ProgressBar,
) -> Result<CellResult, BoxError> {
    let cell = setup.cell;
    let db = nodes.first();
    let history_total = history(db, &setup.counters, settings, progress).await?;

    let clients = run_clients(
        nodes,
        &setup,
        timing,
        |client, db, counters, warm_end, end| {
            let settings = settings.clone();
            let seed = settings.seed.wrapping_add(client as u64);
            async move { drive(&db, &counters, &settings, seed, warm_end, end).await }
        },
    )
    .await?;
    let mut tally = Tally::default();
    let mut hot = 0u64;
    for (client, client_hot) in clients {
        tally.merge(client);
        hot += client_hot;
    }

    let sum = sum_sql(db.get_database_backend());
    let (observed_total, agreed) = nodes.agree(async |db| scalar(db, &sum).await).await?;
    let rows_per_cold_counter = rows_per_counter(db, settings.owners / 100).await?;
    let cold = cold_owners(settings.owners);
    let cold_read_ms = cold_read_ms(db, &setup.counters, &cold).await?;

    let seconds = timing.measured.as_secs_f64();
    let tx_per_s = tally.latencies_ms.len() as f64 / seconds;
    // The history's increments committed too: the stored total holds both.
    tally.committed += u64::try_from(history_total)?;
    let mut result =
        CellResult::checked(cell, tx_per_s, tally, (observed_total, None))?.agreed(agreed);
    result.zipf = Some(ZipfFigures {
        owners: settings.owners,
        zipf_s: settings.exponent,
        hot_owners: settings.hot_owners,
        history_rounds: settings.history_rounds,
        history_total,
        hot_tx_per_s: hot as f64 / seconds,
        rows_per_cold_counter,
        cold_read_ms,
        cold_read_owners: cold.len(),
    });
    Ok(result)
}

/// The history phase: `history_rounds` rounds of one batch per chunk of
/// owners, each adding 1 to every owner of the chunk. Returns the
/// increments written.
async fn history(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    settings: &Settings,
    progress: &ProgressBar,
) -> Result<i64, BoxError> {
    let cell = progress.message();
    let chunks = (settings.owners + HISTORY_CHUNK - 1) / HISTORY_CHUNK;
    let batches = i64::from(settings.history_rounds) * chunks;
    let mut done = 0;
    for _ in 0..settings.history_rounds {
        for first in (1..=settings.owners).step_by(HISTORY_CHUNK as usize) {
            progress.set_message(format!("{cell}: history batch {}/{batches}", done + 1));
            let mut batch = DeltaBatch::new();
            for owner in first..=(first + HISTORY_CHUNK - 1).min(settings.owners) {
                batch.add(counters, owner, KEY, 1)?;
            }
            batch.apply(db).await?;
            done += 1;
        }
    }
    progress.set_message(cell);
    Ok(i64::from(settings.history_rounds) * settings.owners)
}

/// One client until `end`: its tally, and the increments of hot owners
/// committed in the measured window.
async fn drive(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    settings: &Settings,
    seed: u64,
    warm_end: Instant,
    end: Instant,
) -> (Tally, u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut tally = Tally::default();
    let mut hot = 0;
    loop {
        let started = Instant::now();
        if started >= end {
            return (tally, hot);
        }
        // At most 10,000,000 owners: always an i64.
        let owner = settings.draws.sample(&mut rng) as i64;
        let result = counters.increment(db, owner, KEY).await;
        let in_window = started >= warm_end;
        if tally.record(result, started, in_window) && in_window && owner <= settings.hot_owners {
            hot += 1;
        }
    }
}

/// The table's total, however many rows and owners.
fn sum_sql(backend: DbBackend) -> String {
    let cast = match backend {
        DbBackend::MySql => "SIGNED",
        _ => "BIGINT",
    };
    format!("SELECT CAST(COALESCE(SUM(value), 0) AS {cast}) FROM {COUNTER_TABLE}")
}

/// Slot rows per counter of the owners above `above`: rows / distinct
/// owners, in one query (0 if none of them has a row).
async fn rows_per_counter(db: &DatabaseConnection, above: i64) -> Result<f64, BoxError> {
    let sql = format!(
        "SELECT COUNT(*), COUNT(DISTINCT owner_id) FROM {COUNTER_TABLE} WHERE owner_id > {above}"
    );
    let row = counter_core::pooling::query_one(
        db,
        Statement::from_string(db.get_database_backend(), &sql),
    )
    .await?
    .ok_or_else(|| DbErr::RecordNotFound(sql.clone()))?;
    let (rows, owners) = (
        row.try_get_by_index::<i64>(0)?,
        row.try_get_by_index::<i64>(1)?,
    );
    Ok(if owners == 0 {
        0.0
    } else {
        rows as f64 / owners as f64
    })
}

/// Up to [`COLD_READ_OWNERS`] distinct owners spread evenly over the upper
/// half of `1..=owners`, where the draws rarely land.
pub fn cold_owners(owners: i64) -> Vec<i64> {
    let low = owners / 2;
    let span = owners - low;
    let n = span.min(COLD_READ_OWNERS);
    (0..n).map(|i| low + 1 + i * span / n).collect()
}

/// One untimed batch read of `owners` to warm the caches, then the median
/// time of [`COLD_READS`] timed ones.
async fn cold_read_ms(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    owners: &[i64],
) -> Result<f64, BoxError> {
    counters.get_many(db, owners, &[KEY]).await?;
    let mut times = Vec::with_capacity(COLD_READS);
    for _ in 0..COLD_READS {
        let started = Instant::now();
        counters.get_many(db, owners, &[KEY]).await?;
        times.push(started.elapsed());
    }
    times.sort();
    Ok(times
        .get(COLD_READS / 2)
        .copied()
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
        * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cold_reads_cover_the_upper_half_with_distinct_owners() {
        let owners = cold_owners(100_000);
        assert_eq!(owners.len(), 1000);
        assert_eq!(owners[0], 50_001);
        assert_eq!(owners[1] - owners[0], 50);
        assert!(*owners.last().unwrap() <= 100_000);
        let small = cold_owners(1000);
        assert_eq!(small.len(), 500);
        assert_eq!((small[0], small[499]), (501, 1000));
        let mut unique = small.clone();
        unique.dedup();
        assert_eq!(unique.len(), small.len());
    }

    #[test]
    fn the_sum_query_fits_each_backend() {
        assert!(sum_sql(DbBackend::MySql).contains("AS SIGNED"));
        assert!(sum_sql(DbBackend::Postgres).contains("AS BIGINT"));
    }

    #[test]
    fn zipf_figures_are_fields_of_the_cell() {
        let figures = ZipfFigures {
            owners: 5000,
            zipf_s: 1.1,
            hot_owners: 10,
            history_rounds: 4,
            history_total: 20_000,
            hot_tx_per_s: 100.0,
            rows_per_cold_counter: 1.0,
            cold_read_ms: 2.5,
            cold_read_owners: 1000,
        };
        let json = serde_json::to_value(&figures).unwrap();
        assert_eq!(json["rows_per_cold_counter"], 1.0);
        let settings = Settings::new(1000, 1.1, 4, 5000, 1).unwrap();
        assert_eq!(settings.hot_owners, 1000, "no more hot owners than owners");
    }
}
