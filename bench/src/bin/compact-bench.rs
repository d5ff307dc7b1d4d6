//! What compaction buys, measured in one run: the rows of one hot counter
//! and the time to read it, before and after `compact`, and the plan and
//! time of a top-N ranking over many owners.
//!
//! 1. `--owners` background owners get a `likes` counter of
//!    `--rows-per-owner` slot rows each (written straight into the table),
//!    so the table is big. The hot counter belongs to the middle owner id,
//!    `owners / 2 + 1`; the background owners take the other ids of
//!    `1..=owners + 1`.
//! 2. The hot counter is written by `--clients` concurrent tasks through
//!    `increment`, exactly `--increments` in all (`--increments` must be at
//!    least `--clients`), over `--hot-slots` slots.
//! 3. Statistics are refreshed (`ANALYZE`), then: read time of the hot
//!    counter (`get`, median and p95 of `--reads` reads) and its row count;
//!    `top(10)` time (median of 5 calls after one warm-up call); the
//!    ranking's plan (`EXPLAIN ANALYZE` on PostgreSQL, `EXPLAIN` on MySQL,
//!    `EXPLAIN QUERY PLAN` on SQLite) of the very statement the warm-up
//!    `top` sent, captured through sea-orm's metric callback, which records
//!    nothing outside that one call.
//! 4. The online pass: `compact` over every owner, timed, started once the
//!    clients have acknowledged at least one more increment, and with the
//!    clients writing the hot counter until the pass ends. Compaction walks
//!    owners in primary-key order, so putting the hot owner in the middle
//!    makes the pass reach the hot counter's rows halfway through, while
//!    the writers are surely still running: that is the simpler of the two
//!    ways to make a batch meet the writers (the other, a hot owner at the
//!    end plus a second compaction loop over it, adds a task and proves no
//!    more). Then the quiet pass: the writers stopped, `compact` of the hot
//!    owner alone folds what they wrote behind the online pass, the state a
//!    periodic compaction keeps a table in. Then step 3 again.
//! 5. The run fails (exit 1) unless the online pass folded some counter,
//!    the hot counter is down to exactly 1 row after the quiet pass, the hot
//!    counter leads the ranking, it equals the increments acknowledged and
//!    every background total is what was written.
//!
//! A temporary SQLite file (the default database) is removed with its
//! `-wal` and `-shm` files on every exit; the bench table is dropped at the
//! end and, where the connection still works, after an error.
//!
//! With `--json PATH` the figures of the maintenance guide's table are
//! written there too ([`Figures`]; `guide-figures` renders the table from
//! `docs/bench/compaction-<backend>.json`), also when a check fails
//! (`totals_ok` false, exit 1).
//!
//! `cargo run --release -p bench --bin compact-bench -- --database-url <URL>
//! [--json PATH]`

use std::{
    path::PathBuf,
    process::ExitCode,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicI64, Ordering},
    },
    time::{Duration, Instant},
};

use clap::Parser;
use counter_core::{Compact, CompactReport, CounterTable, Counters};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::{
    ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement,
    sea_query::{Alias, Query},
};
use serde::Serialize;

/// Measures compaction and ranking on one database.
#[derive(Debug, Clone, Parser)]
struct Args {
    /// Database to measure (default: a temporary SQLite file).
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Owners with a `likes` counter besides the hot one.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=5_000_000))]
    owners: u64,
    /// Slot rows per background owner.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    rows_per_owner: u16,
    /// Slots of the hot counter.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u16).range(1..=1024))]
    hot_slots: u16,
    /// Concurrent writers of the hot counter.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=256))]
    clients: u16,
    /// Increments of the hot counter before the first measurement (at least
    /// `--clients`).
    #[arg(long, default_value_t = 20_000)]
    increments: u64,
    /// Reads per read-time measurement.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..))]
    reads: u64,
    /// Where to write the figures as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// What `--json` writes: the rows of the maintenance guide's table, each
/// before compaction and after both passes.
#[derive(Debug, Serialize)]
struct Figures {
    /// `postgres`, `mysql` or `sqlite`.
    backend: &'static str,
    /// The owners `top(10)` ranks: the background owners and the hot one.
    ranked_owners: u64,
    /// The hot counter's concurrent writers.
    writers: u16,
    /// The hot counter's slot rows.
    hot_slot_rows: BeforeAfter<i64>,
    /// `get` of the hot counter, median and p95 of `--reads`, ms.
    get_median_ms: BeforeAfter<f64>,
    get_p95_ms: BeforeAfter<f64>,
    /// `top(10)`, median of [`TOP_RUNS`], ms.
    top_median_ms: BeforeAfter<f64>,
    /// The online pass, timed while the writers write.
    online_compact: OnlineCompact,
    /// The hot total equals its acknowledged increments and every other
    /// total what was written.
    totals_ok: bool,
}

#[derive(Debug, Serialize)]
struct BeforeAfter<T> {
    before: T,
    after: T,
}

#[derive(Debug, Serialize)]
struct OnlineCompact {
    rows_before: u64,
    rows_after: u64,
    counters_folded: u64,
    secs: f64,
    /// Increments the writers got in while it ran.
    increments_during: i64,
}

const TABLE: &str = "compact_bench_counters";
const KEY: &str = "likes";
/// Timed `top(10)` calls per measurement (after one warm-up call).
const TOP_RUNS: usize = 5;

use bench::BoxError;

#[tokio::main]
async fn main() -> ExitCode {
    bench::exit_code("compact-bench", run(Args::parse()).await)
}

/// The hot counter's owner: the middle owner id (see the module docs).
fn hot_owner(owners: u64) -> i64 {
    owners as i64 / 2 + 1
}

/// The background owners: `1..=owners + 1` without the hot owner.
fn background_owners(owners: u64) -> impl Iterator<Item = i64> {
    let hot = hot_owner(owners);
    (1..=owners as i64 + 1).filter(move |&o| o != hot)
}

/// The statement of one `top` call, captured by the metric callback only
/// while `on` is set.
#[derive(Default)]
struct Capture {
    on: AtomicBool,
    last: Mutex<Option<String>>,
}

async fn run(args: Args) -> Result<bool, BoxError> {
    if args.increments < u64::from(args.clients) {
        return Err(format!(
            "--increments ({}) must be at least --clients ({}): every client writes",
            args.increments, args.clients
        )
        .into());
    }
    // Declared before the connection, so dropped after it.
    let (url, _temp) = bench::database_url(args.database_url.as_deref(), "compact-bench");
    let mut options = sea_orm::ConnectOptions::new(&url);
    options
        .max_connections(u32::from(args.clients) + 4)
        .sqlx_logging(false);
    let mut db = Database::connect(options).await?;
    let capture = Arc::new(Capture::default());
    {
        let capture = capture.clone();
        db.set_metric_callback(move |info| {
            if capture.on.load(Ordering::SeqCst)
                && let Ok(mut last) = capture.last.lock()
            {
                *last = Some(info.statement.to_string());
            }
        });
    }
    if db.get_database_backend() == DbBackend::Sqlite {
        db.execute_unprepared("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL")
            .await?;
    }
    let counters =
        Counters::<i64>::new(CounterTable::new(TABLE)?.with_key_slots(KEY, args.hot_slots)?);
    counters.drop_table(&db).await?;
    counters.create_table(&db).await?;
    let outcome = bench(&db, &counters, &args, &capture).await;
    let dropped = counters.drop_table(&db).await;
    db.close().await?;
    let ok = outcome?;
    dropped?;
    Ok(ok)
}

/// Steps 1 to 5 of the module docs, on a freshly created table.
async fn bench(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    args: &Args,
    capture: &Capture,
) -> Result<bool, BoxError> {
    let hot = hot_owner(args.owners);
    println!(
        "backend {:?}; {} owners x {} slot rows; hot counter (owner {hot}): {} slots, {} clients",
        db.get_database_backend(),
        args.owners,
        args.rows_per_owner,
        args.hot_slots,
        args.clients
    );
    let background = fill(db, args.owners, args.rows_per_owner).await?;
    let acked = Arc::new(AtomicI64::new(0));
    write_hot(db, counters, args, acked.clone(), None).await?;
    let written = acked.load(Ordering::SeqCst);
    if written != args.increments as i64 {
        return Err(format!(
            "{written} increments acknowledged, {} asked for",
            args.increments
        )
        .into());
    }

    let before = measure(db, counters, args, capture).await?;
    // The online pass, while the clients keep writing the hot counter.
    let writing = Arc::new(AtomicBool::new(true));
    let writers = {
        let (db, counters, acked, writing) =
            (db.clone(), counters.clone(), acked.clone(), writing.clone());
        let args = args.clone();
        tokio::spawn(async move { write_hot(&db, &counters, &args, acked, Some(writing)).await })
    };
    // Writes really in flight: at least one more increment acknowledged.
    while acked.load(Ordering::SeqCst) <= written {
        if writers.is_finished() {
            writers.await??;
            return Err("the writers stopped before the compaction started".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let started = Instant::now();
    let online = counters.compact(db, &Compact::new()).await;
    let compact_time = started.elapsed();
    writing.store(false, Ordering::SeqCst);
    writers.await??;
    let increments_during = acked.load(Ordering::SeqCst) - written;
    let online = online?;
    // The quiet pass: the rows written behind the online pass, folded too.
    let quiet = counters.compact(db, &Compact::new().owners([hot])).await?;
    let after = measure(db, counters, args, capture).await?;

    let mut ok = check(db, counters, hot, &background, acked.load(Ordering::SeqCst)).await?;
    print_report(&before, &after, &online, &quiet, compact_time, args.clients);
    let totals_ok = ok;
    if online.totals.counters_folded == 0 {
        eprintln!("FAIL: the online compaction pass folded no counter");
        ok = false;
    }
    if after.hot_rows != 1 {
        eprintln!(
            "FAIL: the hot counter has {} rows after the quiet pass, not 1",
            after.hot_rows
        );
        ok = false;
    }
    if let Some(path) = &args.json {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let both = |f: fn(&Measure) -> Duration| BeforeAfter {
            before: ms(f(&before)),
            after: ms(f(&after)),
        };
        let figures = Figures {
            backend: match db.get_database_backend() {
                DbBackend::Postgres => "postgres",
                DbBackend::MySql => "mysql",
                _ => "sqlite",
            },
            ranked_owners: args.owners + 1,
            writers: args.clients,
            hot_slot_rows: BeforeAfter {
                before: before.hot_rows,
                after: after.hot_rows,
            },
            get_median_ms: both(|m| m.read_median),
            get_p95_ms: both(|m| m.read_p95),
            top_median_ms: both(|m| m.top_median),
            online_compact: OnlineCompact {
                rows_before: online.totals.rows_before,
                rows_after: online.totals.rows_after,
                counters_folded: online.totals.counters_folded,
                secs: compact_time.as_secs_f64(),
                increments_during,
            },
            totals_ok,
        };
        std::fs::write(path, serde_json::to_string_pretty(&figures)? + "\n")?;
        println!("wrote {}", path.display());
    }
    Ok(ok)
}

/// Writes the background owners' slot rows; returns each owner's total.
async fn fill(
    db: &DatabaseConnection,
    owners: u64,
    rows: u16,
) -> Result<Vec<(i64, i64)>, BoxError> {
    let mut rng = StdRng::seed_from_u64(6);
    let mut totals = Vec::with_capacity(owners as usize);
    let mut insert = Query::insert();
    let mut pending = 0;
    for owner in background_owners(owners) {
        let mut total = 0;
        for slot in 0..rows as i16 {
            let value: i64 = rng.random_range(0..50);
            total += value;
            if pending == 0 {
                insert = Query::insert();
                insert
                    .into_table(Alias::new(TABLE))
                    .columns(["owner_id", "count_key", "slot", "value"].map(Alias::new));
            }
            insert.values_panic([owner.into(), KEY.into(), slot.into(), value.into()]);
            pending += 1;
            if pending == 2_000 {
                db.execute(&insert).await?;
                pending = 0;
            }
        }
        totals.push((owner, total));
    }
    if pending > 0 {
        db.execute(&insert).await?;
    }
    Ok(totals)
}

/// Exactly `--increments` increments of the hot counter by `--clients`
/// tasks (the first `increments % clients` tasks make one more); with
/// `until`, the tasks go on until it turns false instead.
async fn write_hot(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    args: &Args,
    acked: Arc<AtomicI64>,
    until: Option<Arc<AtomicBool>>,
) -> Result<(), BoxError> {
    let hot = hot_owner(args.owners);
    let clients = u64::from(args.clients);
    let (per_client, remainder) = (args.increments / clients, args.increments % clients);
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let (db, counters, acked, until) =
                (db.clone(), counters.clone(), acked.clone(), until.clone());
            let share = per_client + u64::from(client < remainder);
            tokio::spawn(async move {
                let mut done = 0;
                loop {
                    let more = match &until {
                        Some(flag) => flag.load(Ordering::SeqCst),
                        None => done < share,
                    };
                    if !more {
                        return Ok::<_, counter_core::CounterError>(());
                    }
                    counters.increment(&db, hot, KEY).await?;
                    acked.fetch_add(1, Ordering::SeqCst);
                    done += 1;
                }
            })
        })
        .collect();
    // Every task is awaited before an error is returned, so none is left
    // writing behind the caller.
    let mut first_error: Option<BoxError> = None;
    for task in tasks {
        let result = match task.await {
            Ok(result) => result.map_err(BoxError::from),
            Err(join) => Err(join.into()),
        };
        if let Err(e) = result {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// One measurement of the hot counter and of the ranking.
struct Measure {
    hot_rows: i64,
    read_median: Duration,
    read_p95: Duration,
    top_median: Duration,
    top_plan: String,
}

/// Refreshes the planner's statistics of the bench table.
async fn analyze(db: &DatabaseConnection) -> Result<(), BoxError> {
    let sql = match db.get_database_backend() {
        DbBackend::Postgres => format!("ANALYZE {}", quote(db, TABLE)),
        DbBackend::MySql => format!("ANALYZE TABLE {}", quote(db, TABLE)),
        _ => "ANALYZE".to_owned(),
    };
    // MySQL answers with a status row: read as a query on every backend.
    db.query_all_raw(Statement::from_string(db.get_database_backend(), sql))
        .await?;
    Ok(())
}

async fn measure(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    args: &Args,
    capture: &Capture,
) -> Result<Measure, BoxError> {
    let hot = hot_owner(args.owners);
    analyze(db).await?;
    let count = Statement::from_sql_and_values(
        db.get_database_backend(),
        format!(
            "SELECT COUNT(*) AS n FROM {} WHERE owner_id = {hot} AND count_key = '{KEY}'",
            quote(db, TABLE)
        ),
        [],
    );
    let hot_rows: i64 = db
        .query_one_raw(count)
        .await?
        .ok_or("no count")?
        .try_get("", "n")?;
    let mut times = Vec::with_capacity(args.reads as usize);
    for _ in 0..args.reads {
        let started = Instant::now();
        counters.get(db, hot, KEY).await?;
        times.push(started.elapsed());
    }
    times.sort();

    // The warm-up call: its statement is the one explained, captured only
    // while the flag is set.
    *capture.last.lock().map_err(|_| "poisoned")? = None;
    capture.on.store(true, Ordering::SeqCst);
    let top = counters.top(db, KEY, 10).await;
    capture.on.store(false, Ordering::SeqCst);
    let top = top?;
    if top.first().map(|r| r.owner) != Some(hot) {
        let leaders: Vec<_> = top.iter().map(|r| (r.owner, r.total)).collect();
        return Err(format!(
            "the hot counter (owner {hot}) does not lead top(10): (owner, total) {leaders:?}"
        )
        .into());
    }
    let mut top_times = Vec::with_capacity(TOP_RUNS);
    for _ in 0..TOP_RUNS {
        let started = Instant::now();
        counters.top(db, KEY, 10).await?;
        top_times.push(started.elapsed());
    }
    top_times.sort();

    let sql = capture
        .last
        .lock()
        .map_err(|_| "poisoned")?
        .clone()
        .ok_or("no statement seen")?;
    let explain = match db.get_database_backend() {
        DbBackend::Postgres => format!("EXPLAIN (ANALYZE, COSTS OFF) {sql}"),
        DbBackend::MySql => format!("EXPLAIN {sql}"),
        _ => format!("EXPLAIN QUERY PLAN {sql}"),
    };
    let rows = db
        .query_all_raw(Statement::from_string(db.get_database_backend(), explain))
        .await?;
    let top_plan = rows
        .iter()
        .map(|row| plan_line(db.get_database_backend(), row))
        .collect::<Vec<_>>()
        .join("\n");
    Ok(Measure {
        hot_rows,
        read_median: times[times.len() / 2],
        read_p95: times[times.len() * 95 / 100],
        top_median: top_times[TOP_RUNS / 2],
        top_plan: format!("{sql}\n{top_plan}"),
    })
}

fn plan_line(backend: DbBackend, row: &sea_orm::QueryResult) -> String {
    match backend {
        DbBackend::Postgres => row.try_get::<String>("", "QUERY PLAN").unwrap_or_default(),
        DbBackend::MySql => ["table", "type", "key", "rows", "Extra"]
            .iter()
            .map(|c| {
                let v = row
                    .try_get::<Option<String>>("", c)
                    .ok()
                    .flatten()
                    .or_else(|| {
                        row.try_get::<Option<i64>>("", c)
                            .ok()
                            .flatten()
                            .map(|n| n.to_string())
                    })
                    .unwrap_or_else(|| "NULL".into());
                format!("{c}={v}")
            })
            .collect::<Vec<_>>()
            .join(" "),
        _ => row.try_get::<String>("", "detail").unwrap_or_default(),
    }
}

fn quote(db: &DatabaseConnection, ident: &str) -> String {
    match db.get_database_backend() {
        DbBackend::MySql => format!("`{ident}`"),
        _ => format!("\"{ident}\""),
    }
}

async fn check(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    hot: i64,
    background: &[(i64, i64)],
    acked: i64,
) -> Result<bool, BoxError> {
    let mut ok = true;
    let hot_total = counters.get(db, hot, KEY).await?;
    if hot_total != acked {
        eprintln!("MISMATCH: hot counter {hot_total}, acknowledged {acked}");
        ok = false;
    }
    for chunk in background.chunks(10_000) {
        let owners: Vec<i64> = chunk.iter().map(|&(owner, _)| owner).collect();
        let totals = counters.get_many(db, &owners, &[KEY]).await?;
        for &(owner, want) in chunk {
            let got = totals[&owner][KEY];
            if got != want {
                eprintln!("MISMATCH: owner {owner} {got} != {want}");
                ok = false;
            }
        }
    }
    println!(
        "check: hot counter {hot_total} = {acked} acknowledged increments; {} background totals {}",
        background.len(),
        if ok { "unchanged" } else { "WRONG" }
    );
    Ok(ok)
}

fn print_report(
    before: &Measure,
    after: &Measure,
    online: &CompactReport,
    quiet: &CompactReport,
    compact_time: Duration,
    clients: u16,
) {
    let ms = |d: Duration| format!("{:.3} ms", d.as_secs_f64() * 1e3);
    println!(
        "online pass (every owner, {clients} clients writing the hot counter; timed): \
         {} rows before, {} after, {} counters folded, {} batches, {:.2} s",
        online.totals.rows_before,
        online.totals.rows_after,
        online.totals.counters_folded,
        online.totals.batches,
        compact_time.as_secs_f64(),
    );
    println!(
        "quiet pass (the hot owner only, writers stopped; untimed): {} rows before, {} after, \
         {} counters folded",
        quiet.totals.rows_before, quiet.totals.rows_after, quiet.totals.counters_folded,
    );
    println!();
    println!("| hot counter | before compaction | after both passes | ratio |");
    println!("|---|---:|---:|---:|");
    println!(
        "| slot rows | {} | {} | {:.0}x |",
        before.hot_rows,
        after.hot_rows,
        before.hot_rows as f64 / after.hot_rows.max(1) as f64
    );
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    println!(
        "| `get` median | {} | {} | {:.2}x |",
        ms(before.read_median),
        ms(after.read_median),
        ratio(before.read_median, after.read_median)
    );
    println!(
        "| `get` p95 | {} | {} | {:.2}x |",
        ms(before.read_p95),
        ms(after.read_p95),
        ratio(before.read_p95, after.read_p95)
    );
    println!(
        "| `top(10)` median of {TOP_RUNS} | {} | {} | {:.2}x |",
        ms(before.top_median),
        ms(after.top_median),
        ratio(before.top_median, after.top_median)
    );
    println!();
    println!("top(10) plan before compaction:\n{}\n", before.top_plan);
    println!("top(10) plan after both passes:\n{}", after.top_plan);
}
