//! The `buffered` design: the cell's clients hand their increments of the
//! hot counter to one [`CounterBuffer`], whose background flusher writes
//! them every `--buffer-interval-ms`.
//!
//! What a cell measures, beyond the shared [`CellResult`] fields:
//!
//! * **Increments per second accepted**: `add` calls that returned `Ok` in
//!   the measured window, divided by its length (`tx_per_s`). Accepted is
//!   not stored: the total check after `shutdown` is what proves they all
//!   were.
//! * **Statements per 100,000 increments**: the buffer writes through a
//!   pool of its own, opened per cell, with sea-orm's metric callback
//!   counting every statement it executes (its start-up probe of the
//!   ledger, the ledger claims, the upserts, the ledger prune and the final
//!   removal of its row). sea-orm runs `BEGIN` and `COMMIT` outside the
//!   callback, so a `BEGIN` and a `COMMIT` are added per flush attempt.
//!   `BufferStats::statements` (the buffer's own count, which has the
//!   transaction control but not the probe, prune and removal) is reported
//!   next to it as a cross-check. Both are divided by every add the buffer
//!   accepted in the cell, warm-up and probe included, since the statements
//!   cover the whole cell too.
//! * **Lag**: each of 4 probe tasks adds 1 to a counter of its own (another
//!   owner, same table, same buffer) at random gaps (uniform in 0..100 ms,
//!   so its adds fall at random phases of the flush interval), then polls
//!   `Counters::get` on the benchmark's main pool every millisecond until
//!   the stored value includes that add. The time from the add's return to
//!   the first read that sees it is one sample; the figures are the samples'
//!   p50, p99 and maximum. The poll adds up to about a millisecond (tokio's
//!   timer granularity) plus one read's time.
//!
//! Clients: in `autocommit`, each client calls the synchronous `add` in a
//! loop and calls `tokio::task::yield_now` after every add. `add` never
//! awaits, so without that a client would hold its worker thread for the
//! whole cell and starve the flusher and the probe; yielding per add is
//! also what a request handler does (it awaits something between two
//! increments), so the figure is not a tight-loop best case. Every 256th add
//! is timed for the p50/p99 columns (timing every one would cost as much as
//! the add).
//!
//! In `business`, the child row still has to be stored with its own
//! transaction; only the increment is buffered: `BEGIN; INSERT child;
//! application work; COMMIT`, then `add` once the commit succeeded (an
//! increment must not be accepted for a transaction that rolls back). The
//! figure is then bounded by the child-row transactions, not by the
//! counter, and the counter is no longer in the child's transaction: a
//! crash between the commit and the flush loses the increment (the
//! buffer's durability contract). The statement figure counts the buffer's
//! statements only; each child transaction still sends its own three.
//!
//! On a cluster (several `--database-url`s), the business clients' child
//! transactions go through their own nodes, while the buffer, its ledger
//! and the lag probe use the first node.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use counter_core::{CounterBuffer, FlushLedger};
use rand::Rng;
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, TransactionTrait};

use crate::{
    cli::Workload,
    nodes::Nodes,
    writes::{self, BoxError, CellResult, HOT_OWNER, KEY, Setup, Tally, Timing, percentile},
};

/// The first lag probe's counter: same table and key, an owner no client
/// writes; probe `i` uses `PROBE_OWNER + i`.
const PROBE_OWNER: i64 = 1_000_000_001;
/// Lag probes running side by side, each on its own counter, for more
/// samples per cell.
const PROBES: i64 = 4;
/// The probe's mean gap between two adds; each gap is uniform in 0..2x.
const PROBE_GAP: Duration = Duration::from_millis(50);
/// How often the probe reads the stored value while it waits.
const PROBE_POLL: Duration = Duration::from_millis(1);
/// A probe add not visible after this long fails the cell.
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);
/// An autocommit client times every this many-th add.
const TIME_EVERY: u64 = 256;

/// How the `buffered` cells reach the database and flush.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The benchmark's database (its first node): the buffer gets a pool
    /// of its own there.
    pub url: String,
    /// `--buffer-interval-ms`.
    pub interval: Duration,
}

/// What a `buffered` cell measured besides throughput and the total check.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BufferedFigures {
    /// The buffer's flush interval.
    pub interval_ms: u64,
    /// Adds the buffer accepted in the whole cell (warm-up and lag probe
    /// included): `BufferStats::adds`.
    pub adds: u64,
    /// Flushes committed.
    pub flushes: u64,
    /// Flush attempts that failed and were retried.
    pub failed_attempts: u64,
    /// Statements the buffer's pool executed, as the metric callback saw
    /// them (everything but `BEGIN` and `COMMIT`).
    pub callback_statements: u64,
    /// `callback_statements` plus a `BEGIN` and a `COMMIT` per flush attempt:
    /// everything the buffer sent.
    pub statements: u64,
    /// The buffer's own count, `BufferStats::statements`.
    pub buffer_statements: u64,
    /// `statements * 100_000 / adds`.
    pub statements_per_100k: f64,
    /// `buffer_statements * 100_000 / adds`.
    pub buffer_statements_per_100k: f64,
    /// Lag samples taken by the probe.
    pub lag_samples: usize,
    pub lag_p50_ms: f64,
    pub lag_p99_ms: f64,
    pub lag_max_ms: f64,
    /// The probes' adds, and their counters' stored totals after shutdown.
    pub probe_adds: i64,
    pub probe_stored: i64,
}

/// The bench's flush ledger, dropped and recreated per cell like its other
/// `bench_*` tables.
const LEDGER_TABLE: &str = "bench_flush_ledger";

/// Runs one `buffered` cell on the tables `setup` was prepared with.
pub async fn run(
    nodes: &Nodes,
    setup: Arc<Setup>,
    timing: Timing,
    settings: &Settings,
) -> Result<CellResult, BoxError> {
    let cell = setup.cell;
    let db = nodes.first();
    // A ledger of the bench's own: never the application's, which running
    // buffers elsewhere in the same database may rely on.
    let ledger = FlushLedger::new(LEDGER_TABLE)?;
    ledger.drop_table(db).await?;
    ledger.create_table(db).await?;
    let sent = Arc::new(AtomicU64::new(0));
    let pool = connect(&settings.url, sent.clone()).await?;
    let buffer = CounterBuffer::builder(&pool)
        .interval(settings.interval)
        .ledger(ledger)
        .start()
        .await?;

    let warm_end = Instant::now() + timing.warmup;
    let end = warm_end + timing.measured;
    let clients: Vec<_> = (0..cell.clients)
        .map(|client| {
            let db = nodes.for_client(client).db.clone();
            let (setup, buffer) = (setup.clone(), buffer.clone());
            tokio::spawn(async move { drive(&db, &setup, &buffer, warm_end, end).await })
        })
        .collect();
    let probes: Vec<_> = (0..PROBES)
        .map(|i| {
            let (db, setup, buffer) = (db.clone(), setup.clone(), buffer.clone());
            let owner = PROBE_OWNER + i;
            tokio::spawn(async move { probe(&db, &setup, &buffer, owner, warm_end, end).await })
        })
        .collect();
    let mut tally = Tally::default();
    let mut measured = 0u64;
    for client in clients {
        let (client, timed) = client.await?;
        tally.merge(client);
        measured += timed;
    }
    let mut probe = Ok(Probe::default());
    for one in probes {
        match (one.await?, &mut probe) {
            (Ok(one), Ok(all)) => {
                all.adds += one.adds;
                all.lags_ms.extend(one.lags_ms);
            }
            (Err(e), _) => probe = Err(e),
            (Ok(_), Err(_)) => {}
        }
    }
    // Shut down even if a probe failed: everything accepted gets stored.
    let stats = buffer.shutdown().await?;
    drop(buffer);
    pool.close().await?;
    let probe = probe?;

    let (observed, agreed) = nodes
        .agree(async |db| writes::observe(db, &setup).await)
        .await?;
    let probe_owners: Vec<i64> = (0..PROBES).map(|i| PROBE_OWNER + i).collect();
    let probe_stored: i64 = setup
        .counters
        .get_many(db, &probe_owners, &[KEY])
        .await?
        .values()
        .flat_map(|keys| keys.values())
        .sum();
    let mut lags = probe.lags_ms;
    lags.sort_by(f64::total_cmp);
    let tx_per_s = measured as f64 / timing.measured.as_secs_f64();

    let callback_statements = sent.load(Ordering::Relaxed);
    let statements = callback_statements + 2 * (stats.flushes + stats.failed_attempts);
    let per_100k = |n: u64| n as f64 * 1e5 / stats.adds.max(1) as f64;
    let accounted = stats.adds == tally.committed + probe.adds as u64 && stats.pending_adds == 0;
    let mut result = CellResult::checked(cell, tx_per_s, tally, observed)?.agreed(agreed);
    result.last_error = result.last_error.or(stats.last_error.clone());
    result.total_ok &= probe_stored == probe.adds && accounted;
    result.buffered = Some(BufferedFigures {
        interval_ms: u64::try_from(settings.interval.as_millis()).unwrap_or(u64::MAX),
        adds: stats.adds,
        flushes: stats.flushes,
        failed_attempts: stats.failed_attempts,
        callback_statements,
        statements,
        buffer_statements: stats.statements,
        statements_per_100k: per_100k(statements),
        buffer_statements_per_100k: per_100k(stats.statements),
        lag_samples: lags.len(),
        lag_p50_ms: percentile(&lags, 0.50),
        lag_p99_ms: percentile(&lags, 0.99),
        lag_max_ms: lags.last().copied().unwrap_or(0.0),
        probe_adds: probe.adds,
        probe_stored,
    });
    Ok(result)
}

/// The buffer's own small pool, every statement on it counted in `sent`.
async fn connect(url: &str, sent: Arc<AtomicU64>) -> Result<DatabaseConnection, BoxError> {
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(2)
        .min_connections(1)
        .acquire_timeout(Duration::from_secs(60))
        .sqlx_logging(false);
    let mut pool = Database::connect(options).await?;
    // Set before the buffer clones the pool: clones share the callback.
    pool.set_metric_callback(move |_| {
        sent.fetch_add(1, Ordering::Relaxed);
    });
    Ok(pool)
}

/// One client until `end`: its tally (`committed` = adds accepted, all of
/// them) and the number accepted in the measured window.
async fn drive(
    db: &DatabaseConnection,
    setup: &Setup,
    buffer: &CounterBuffer,
    warm_end: Instant,
    end: Instant,
) -> (Tally, u64) {
    let mut tally = Tally::default();
    let mut measured = 0u64;
    let mut n = 0u64;
    loop {
        let started = Instant::now();
        if started >= end {
            return (tally, measured);
        }
        // `zipf` never runs `buffered` (see `Design::applies_to`): were it
        // to, its adds would be autocommit ones.
        let (result, timed) = match setup.cell.workload {
            Workload::Autocommit | Workload::Zipf => {
                n += 1;
                let result = buffer
                    .add(&setup.counters, HOT_OWNER, KEY, 1)
                    .map_err(BoxError::from);
                (result, n.is_multiple_of(TIME_EVERY))
            }
            Workload::Business => (business(db, setup, buffer).await, true),
        };
        let in_window = started >= warm_end;
        if tally.record(result, started, in_window && timed) && in_window {
            measured += 1;
        }
        if setup.cell.workload != Workload::Business {
            // `add` never awaits: give the flusher, the probe and the other
            // clients their turn after every add.
            tokio::task::yield_now().await;
        }
    }
}

/// The child row in its own transaction, then the buffered increment.
async fn business(
    db: &DatabaseConnection,
    setup: &Setup,
    buffer: &CounterBuffer,
) -> Result<(), BoxError> {
    let txn = db.begin().await?;
    txn.execute(&setup.child_insert).await?;
    tokio::time::sleep(setup.app_work).await;
    txn.commit().await?;
    buffer.add(&setup.counters, HOT_OWNER, KEY, 1)?;
    Ok(())
}

/// The lag probe's adds and samples.
#[derive(Default)]
struct Probe {
    adds: i64,
    lags_ms: Vec<f64>,
}

/// During the measured window: add 1 to `owner`'s probe counter, then read
/// it on the main pool until the add is visible; one lag sample per add.
async fn probe(
    db: &DatabaseConnection,
    setup: &Setup,
    buffer: &CounterBuffer,
    owner: i64,
    warm_end: Instant,
    end: Instant,
) -> Result<Probe, BoxError> {
    tokio::time::sleep_until(warm_end.into()).await;
    let mut probe = Probe::default();
    let max_gap = u64::try_from(PROBE_GAP.as_micros() * 2)?;
    loop {
        let gap = Duration::from_micros(rand::rng().random_range(0..=max_gap));
        tokio::time::sleep(gap).await;
        if Instant::now() >= end {
            return Ok(probe);
        }
        buffer.add(&setup.counters, owner, KEY, 1)?;
        let added = Instant::now();
        probe.adds += 1;
        while setup.counters.get(db, owner, KEY).await? < probe.adds {
            if added.elapsed() > PROBE_TIMEOUT {
                return Err(format!(
                    "a buffered increment was not visible after {PROBE_TIMEOUT:?}"
                )
                .into());
            }
            tokio::time::sleep(PROBE_POLL).await;
        }
        probe.lags_ms.push(added.elapsed().as_secs_f64() * 1e3);
    }
}
