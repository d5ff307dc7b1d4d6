//! How cost grows with the data (`--growth 10000,100000,1000000`): for
//! each number of owners, a fresh table of that many owners x 4 keys in
//! the steady state of adaptive slots (every counter on its one row, the
//! hot 1 % of owners' `likes` and `views` widened to 16 slot rows), then:
//! a page read of 100 random owners through the library and through the
//! cache, one increment's latency, the table's bytes per counter, a `top`
//! page, and a full compaction (its time and rows folded a second). And
//! for unique keys, a day's sketch at 10, 1,000 and 1,000,000 members:
//! bytes per owner-day and a 30-day union of 100 owners.
//!
//! Every read is checked against the totals the seed and the increments
//! made, before and after the compaction; every union against its
//! members. The chart (`--svg PATH`) draws each cost relative to the
//! smallest size.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use bench::{
    BoxError, sizes,
    stats::{median, percentile},
};
use chrono::{DateTime, Days, TimeZone, Utc};
use counter_core::{Compact, CounterTable, Counters, SlotPolicy, Window, unique::Sketch};
use counter_redis::{CountCache, RedisTarget};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, TransactionTrait};
use serde_json::{Value, json};

use crate::Args;

const TABLE: &str = "limits_growth";
const UNIQUE: &str = "limits_growth_unique";
const KEYS: [&str; 4] = ["likes", "views", "comments", "shares"];
/// One owner in this many is hot.
const HOT_EVERY: i64 = 100;
/// Slot rows of a hot counter (`likes` and `views` of a hot owner).
const HOT_SLOTS: i64 = 16;
/// Owners of a page read, a `top` page and a union.
const PAGE: usize = 100;
/// Owners seeded per statement.
const SEED_CHUNK: i64 = 100_000;
/// Days of the union read.
const UNION_DAYS: u32 = 30;

/// The value of the seeded row of `owner`'s key `k` at `slot`.
fn seeded(owner: i64, k: i64, slot: i64) -> i64 {
    1 + (owner * 7 + k * 3 + slot) % 50
}

/// The seeded total of `owner`'s key `k`.
fn seeded_total(owner: i64, k: i64) -> i64 {
    let slots = if owner % HOT_EVERY == 0 && k < 2 {
        HOT_SLOTS
    } else {
        1
    };
    (0..slots).map(|slot| seeded(owner, k, slot)).sum()
}

/// What every counter should read: the seed, plus the increments made.
struct Expected {
    added: HashMap<(i64, usize), i64>,
}

impl Expected {
    fn total(&self, owner: i64, k: usize) -> i64 {
        seeded_total(owner, k as i64) + self.added.get(&(owner, k)).copied().unwrap_or(0)
    }
}

pub(crate) async fn run(
    args: &Args,
    db: &DatabaseConnection,
    sizes: &[u64],
) -> Result<(Value, bool), BoxError> {
    let cache = match &args.redis_url {
        Some(url) => Some(
            CountCache::builder(RedisTarget::standalone(url))
                .namespace(format!("limits-growth{}", std::process::id()))
                .ttl(Duration::from_secs(600))
                .build()
                .await?,
        ),
        None => None,
    };
    let mut ok = true;
    let mut rows = Vec::new();
    for &owners in sizes {
        let (figures, checked) = size(args, db, cache.as_ref(), owners as i64).await?;
        println!("{owners} owners: {figures}");
        ok &= checked;
        rows.push(figures);
    }
    let (unique, checked) = unique(args, db).await?;
    ok &= checked;
    Ok((json!({"owners": rows, "unique": unique}), ok))
}

fn counters() -> Result<Counters<i64>, BoxError> {
    let table = CounterTable::new(TABLE)?.with_slot_policy(SlotPolicy::adaptive(1..=64)?);
    Ok(Counters::new(table))
}

/// One size: the table seeded, measured, compacted, checked, dropped.
async fn size(
    args: &Args,
    db: &DatabaseConnection,
    cache: Option<&CountCache>,
    owners: i64,
) -> Result<(Value, bool), BoxError> {
    let counters = counters()?;
    let _ = counters.drop_table(db).await;
    counters.create_table(db).await?;
    let started = Instant::now();
    seed(db, owners).await?;
    let seed_s = started.elapsed().as_secs_f64();
    let mut expected = Expected {
        added: HashMap::new(),
    };
    let mut rng = StdRng::seed_from_u64(owners as u64);
    let mut ok = true;
    let reads = args.reads.max(3);

    // Pages of random owners, through the library.
    let page = |rng: &mut StdRng| -> Vec<i64> {
        (0..PAGE).map(|_| rng.random_range(1..=owners)).collect()
    };
    let mut times = Vec::new();
    for _ in 0..reads {
        let owners = page(&mut rng);
        let started = Instant::now();
        let totals = counters.get_many(db, &owners, &KEYS).await?;
        times.push(started.elapsed().as_secs_f64() * 1e6);
        ok &= check_page(&totals, &owners, &expected, "page read");
    }
    let page_read_us = median(times);

    // The same page through the cache, once it is all hits.
    let cached_page_read_us = match cache {
        Some(cache) => {
            let cached = cache.table(&counters);
            let owners = page(&mut rng);
            cached.get_many(db, &owners, &KEYS).await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut times = Vec::new();
            for _ in 0..reads {
                let started = Instant::now();
                let totals = cached.get_many(db, &owners, &KEYS).await?;
                times.push(started.elapsed().as_secs_f64() * 1e6);
                ok &= check_page(&totals, &owners, &expected, "cached page read");
            }
            Some(median(times))
        }
        None => None,
    };

    // One increment at a time, on random owners.
    let mut times = Vec::new();
    for _ in 0..reads * 20 {
        let owner = rng.random_range(1..=owners);
        let started = Instant::now();
        counters.add(db, owner, "likes", 1).await?;
        times.push(started.elapsed().as_secs_f64() * 1e6);
        *expected.added.entry((owner, 0)).or_default() += 1;
    }
    times.sort_by(f64::total_cmp);
    let (increment_p50_us, increment_p99_us) = (percentile(&times, 0.5), percentile(&times, 0.99));

    let bytes_per_counter = sizes::table_bytes(db, TABLE)
        .await?
        .map(|bytes| bytes as f64 / (owners * KEYS.len() as i64) as f64);

    // The first page of `top`: the owners with the largest totals.
    let mut times = Vec::new();
    let mut top = Vec::new();
    for _ in 0..reads.min(5) {
        let started = Instant::now();
        top = counters.top(db, "likes", PAGE).await?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let top_page_ms = median(times);
    let best = (1..=owners)
        .map(|o| expected.total(o, 0))
        .max()
        .unwrap_or(0);
    let top_ok = top.len() == PAGE.min(owners as usize)
        && top.first().map(|r| r.total) == Some(best)
        && top.iter().all(|r| r.total == expected.total(r.owner, 0))
        && top.windows(2).all(|w| w[0].total >= w[1].total);
    if !top_ok {
        eprintln!("FAIL: top page of {owners} owners: {:?}", top.first());
    }
    ok &= top_ok;

    // A full compaction: every widened counter folded into one row.
    let started = Instant::now();
    let report = counters.compact(db, &Compact::new()).await?;
    let compact_s = started.elapsed().as_secs_f64();
    let folded = report.totals.rows_before - report.totals.rows_after;
    let widened = (owners / HOT_EVERY) as u64 * 2;
    if folded < widened * (HOT_SLOTS as u64 - 1) {
        eprintln!("FAIL: the compaction folded {folded} rows of {owners} owners");
        ok = false;
    }
    let hot: Vec<i64> = (1..=owners.min(PAGE as i64 * HOT_EVERY))
        .filter(|o| o % HOT_EVERY == 0)
        .collect();
    let totals = counters.get_many(db, &hot, &KEYS).await?;
    ok &= check_page(&totals, &hot, &expected, "read after the compaction");
    let _ = counters.drop_table(db).await;
    let figures = json!({
        "owners": owners,
        "counters": owners * KEYS.len() as i64,
        "seed_s": seed_s,
        "page_read_us": page_read_us,
        "cached_page_read_us": cached_page_read_us,
        "increment_p50_us": increment_p50_us,
        "increment_p99_us": increment_p99_us,
        "bytes_per_counter": bytes_per_counter,
        "top_page_ms": top_page_ms,
        "compact_s": compact_s,
        "compact_rows_folded": folded,
        "compact_rows_per_s": folded as f64 / compact_s,
    });
    Ok((figures, ok))
}

fn check_page(
    totals: &HashMap<i64, HashMap<String, i64>>,
    owners: &[i64],
    expected: &Expected,
    what: &str,
) -> bool {
    for &owner in owners {
        for (k, key) in KEYS.iter().enumerate() {
            let got = totals.get(&owner).and_then(|t| t.get(*key)).copied();
            if got != Some(expected.total(owner, k)) {
                eprintln!(
                    "FAIL: {what}: owner {owner} {key} read {got:?}, expected {}",
                    expected.total(owner, k)
                );
                return false;
            }
        }
    }
    true
}

/// Owners `1..=owners` x 4 keys on one row each, and the hot owners'
/// `likes` and `views` on 15 more: one `INSERT ... SELECT` over a series
/// the server generates per chunk and kind of row.
async fn seed(db: &DatabaseConnection, owners: i64) -> Result<(), BoxError> {
    let backend = db.get_database_backend();
    let keys = KEYS
        .iter()
        .enumerate()
        .map(|(k, key)| format!("SELECT '{key}' AS count_key, {k} AS k"))
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    let hot_keys = keys
        .split(" UNION ALL ")
        .take(2)
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    let mut lo = 1;
    while lo <= owners {
        let hi = (lo + SEED_CHUNK - 1).min(owners);
        let cold = format!(
            "INSERT INTO {TABLE} (owner_id, count_key, slot, value) \
             SELECT g.o, ks.count_key, 0, 1 + (g.o * 7 + ks.k * 3) % 50 \
             FROM {} CROSS JOIN ({keys}) AS ks",
            series(backend, "o", lo, hi)
        );
        db.execute_unprepared(&cold).await?;
        let hot = format!(
            "INSERT INTO {TABLE} (owner_id, count_key, slot, value) \
             SELECT g.o, ks.count_key, s.slot, 1 + (g.o * 7 + ks.k * 3 + s.slot) % 50 \
             FROM {} CROSS JOIN ({hot_keys}) AS ks CROSS JOIN {} WHERE g.o % {HOT_EVERY} = 0",
            series(backend, "o", lo, hi),
            series(backend, "slot", 1, HOT_SLOTS - 1).replace(" AS g", " AS s"),
        );
        db.execute_unprepared(&hot).await?;
        lo = hi + 1;
    }
    // The planner's statistics, as autovacuum (PostgreSQL) or InnoDB's
    // automatic recalculation would have them for a table that grew over
    // time: without them, a read just after a bulk load can be planned as
    // a scan.
    match backend {
        DbBackend::Postgres => db.execute_unprepared(&format!("ANALYZE {TABLE}")).await?,
        DbBackend::MySql => {
            db.execute_unprepared(&format!("ANALYZE TABLE {TABLE}"))
                .await?
        }
        _ => db.execute_unprepared(&format!("ANALYZE {TABLE}")).await?,
    };
    Ok(())
}

/// A derived table `g` of one column `column` holding `lo..=hi`, as each
/// server generates one.
fn series(backend: DbBackend, column: &str, lo: i64, hi: i64) -> String {
    match backend {
        DbBackend::Postgres => format!("generate_series({lo}, {hi}) AS g({column})"),
        // MariaDB's Sequence engine: `seq_1_to_N`, one column `seq`.
        DbBackend::MySql => format!("(SELECT seq AS {column} FROM seq_{lo}_to_{hi}) AS g"),
        _ => format!(
            "(WITH RECURSIVE r(n) AS (SELECT {lo} UNION ALL SELECT n + 1 FROM r WHERE n < {hi}) \
             SELECT n AS {column} FROM r) AS g"
        ),
    }
}

/// Day sketches of 10, 1,000 and 1,000,000 members (each day's members
/// distinct) for 100 owners x 30 days: bytes on disk per owner-day, and a
/// union of the 30 days of the 100 owners, checked against the members.
async fn unique(args: &Args, db: &DatabaseConnection) -> Result<(Value, bool), BoxError> {
    let table = CounterTable::new(UNIQUE)?
        .with_unique_key("visitors")?
        .with_key_window("visitors", Window::Day)?;
    let counters = Counters::<i64>::new(table);
    let owners: Vec<i64> = (1..=PAGE as i64).collect();
    let first = Utc
        .with_ymd_and_hms(2026, 1, 1, 12, 0, 0)
        .single()
        .ok_or("a date")?;
    let day = |d: u32| -> Result<DateTime<Utc>, BoxError> {
        first
            .checked_add_days(Days::new(u64::from(d)))
            .ok_or_else(|| "a day".into())
    };
    let mut ok = true;
    let mut out = Vec::new();
    for &members in &args.growth_members {
        let _ = counters.drop_table(db).await;
        counters.create_table(db).await?;
        for d in 0..UNION_DAYS {
            let mut sketch = Sketch::new();
            for m in 0..members {
                sketch.insert(&(u64::from(d) * members + m));
            }
            // A day's sketches in one transaction.
            let txn = db.begin().await?;
            for &owner in &owners {
                counters
                    .observe_sketch_at(&txn, owner, "visitors", &sketch, day(d)?)
                    .await?;
            }
            txn.commit().await?;
        }
        let owner_days = (owners.len() as u32 * UNION_DAYS) as f64;
        let bytes_per_owner_day = sizes::table_bytes(db, &format!("{UNIQUE}_sketches"))
            .await?
            .map(|bytes| bytes as f64 / owner_days);
        let (from, to) = (day(0)?, day(UNION_DAYS)?);
        let mut times = Vec::new();
        let mut estimates = HashMap::new();
        for _ in 0..args.reads.max(3) {
            let started = Instant::now();
            estimates = counters
                .unique_over_many(db, &owners, "visitors", from, to)
                .await?;
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
        let union_ms = median(times);
        // Within 5 standard errors of the 30 days' distinct members.
        let exact = (members * u64::from(UNION_DAYS)) as f64;
        let bound = 5.0 * 1.04 / 128.0 * exact + 2.0;
        let right = owners.iter().all(|o| {
            estimates
                .get(o)
                .is_some_and(|&e| (e as f64 - exact).abs() <= bound)
        });
        if !right {
            eprintln!(
                "FAIL: a {UNION_DAYS}-day union of {members} members a day: {:?}",
                estimates.get(&1)
            );
        }
        ok &= right;
        let figures = json!({
            "members_per_day": members,
            "bytes_per_owner_day": bytes_per_owner_day,
            "union_30d_100_owners_ms": union_ms,
        });
        println!("unique: {figures}");
        out.push(figures);
    }
    let _ = counters.drop_table(db).await;
    Ok((Value::Array(out), ok))
}
