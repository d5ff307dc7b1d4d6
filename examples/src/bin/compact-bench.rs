//! What compaction buys, measured in one run: the rows of one hot counter
//! and the time to read it, before and after `compact`, and the plan and
//! time of a top-N ranking over many owners.
//!
//! 1. `--owners` owners get a `likes` counter of `--rows-per-owner` slot
//!    rows each (written straight into the table), so the table is big.
//! 2. One hot counter is written by `--clients` concurrent tasks through
//!    `increment`, `--increments` in all, over `--hot-slots` slots.
//! 3. Read time of the hot counter (`get`, median and p95 of `--reads`
//!    reads) and its row count; `top(10)` time; the ranking's plan
//!    (`EXPLAIN ANALYZE` on PostgreSQL, `EXPLAIN` on MySQL, `EXPLAIN QUERY
//!    PLAN` on SQLite) of the very statement `top` sent, captured through
//!    sea-orm's metric callback.
//! 4. `compact`, timed, while the clients keep writing the hot counter;
//!    then step 3 again. Every total is checked: the hot counter must equal
//!    the increments acknowledged, the others what was written (exit 1
//!    otherwise).
//!
//! `cargo run --release -p examples --bin compact-bench -- --database-url <URL>`

use std::{
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
    /// Increments of the hot counter before the first measurement.
    #[arg(long, default_value_t = 20_000)]
    increments: u64,
    /// Reads per read-time measurement.
    #[arg(long, default_value_t = 500)]
    reads: usize,
}

const TABLE: &str = "compact_bench_counters";
const KEY: &str = "likes";
const HOT: i64 = 0;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("compact-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The last statement sea-orm ran, as text with its values inlined.
type LastStatement = Arc<Mutex<Option<String>>>;

async fn run(args: Args) -> Result<bool, BoxError> {
    let url = args.database_url.clone().unwrap_or_else(|| {
        let path = std::env::temp_dir().join(format!("compact-bench-{}.db", std::process::id()));
        format!("sqlite://{}?mode=rwc", path.display())
    });
    let mut options = sea_orm::ConnectOptions::new(&url);
    options
        .max_connections(u32::from(args.clients) + 4)
        .sqlx_logging(false);
    let mut db = Database::connect(options).await?;
    let last: LastStatement = Arc::default();
    {
        let last = last.clone();
        db.set_metric_callback(move |info| {
            if let Ok(mut last) = last.lock() {
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

    println!(
        "backend {:?}; {} owners x {} slot rows; hot counter: {} slots, {} clients",
        db.get_database_backend(),
        args.owners,
        args.rows_per_owner,
        args.hot_slots,
        args.clients
    );
    let background = fill(&db, args.owners, args.rows_per_owner).await?;
    let acked = Arc::new(AtomicI64::new(0));
    write_hot(&db, &counters, &args, acked.clone(), None).await?;

    let before = measure(&db, &counters, &args, &last).await?;
    // Compaction while the clients keep writing the hot counter.
    let writing = Arc::new(AtomicBool::new(true));
    let writers = {
        let (db, counters, acked, writing) =
            (db.clone(), counters.clone(), acked.clone(), writing.clone());
        let args = args.clone();
        tokio::spawn(async move { write_hot(&db, &counters, &args, acked, Some(writing)).await })
    };
    let started = Instant::now();
    let report = counters.compact(&db, &Compact::new()).await?;
    let compact_time = started.elapsed();
    writing.store(false, Ordering::SeqCst);
    writers.await??;
    // The rows written behind the compaction, folded too: the state a
    // periodic compaction keeps a table in.
    let second = counters.compact(&db, &Compact::new().owners([HOT])).await?;
    let after = measure(&db, &counters, &args, &last).await?;

    let ok = check(&db, &counters, &background, acked.load(Ordering::SeqCst)).await?;
    print_report(&before, &after, &report, &second, compact_time);
    counters.drop_table(&db).await?;
    Ok(ok)
}

/// Writes the background owners' slot rows; returns each owner's total.
async fn fill(db: &DatabaseConnection, owners: u64, rows: u16) -> Result<Vec<i64>, BoxError> {
    let mut rng = StdRng::seed_from_u64(6);
    let mut totals = Vec::with_capacity(owners as usize);
    let mut insert = Query::insert();
    let mut pending = 0;
    for owner in 1..=owners as i64 {
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
        totals.push(total);
    }
    if pending > 0 {
        db.execute(&insert).await?;
    }
    Ok(totals)
}

/// `--increments` increments of the hot counter by `--clients` tasks; with
/// `until`, the tasks go on until it turns false instead.
async fn write_hot(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    args: &Args,
    acked: Arc<AtomicI64>,
    until: Option<Arc<AtomicBool>>,
) -> Result<(), BoxError> {
    let per_client = args.increments / u64::from(args.clients);
    let tasks: Vec<_> = (0..args.clients)
        .map(|_| {
            let (db, counters, acked, until) =
                (db.clone(), counters.clone(), acked.clone(), until.clone());
            tokio::spawn(async move {
                let mut done = 0;
                loop {
                    let more = match &until {
                        Some(flag) => flag.load(Ordering::SeqCst),
                        None => done < per_client,
                    };
                    if !more {
                        return Ok::<_, counter_core::CounterError>(());
                    }
                    counters.increment(&db, HOT, KEY).await?;
                    acked.fetch_add(1, Ordering::SeqCst);
                    done += 1;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// One measurement of the hot counter and of the ranking.
struct Measure {
    hot_rows: i64,
    read_median: Duration,
    read_p95: Duration,
    top_time: Duration,
    top_plan: String,
}

async fn measure(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    args: &Args,
    last: &LastStatement,
) -> Result<Measure, BoxError> {
    let count = Statement::from_sql_and_values(
        db.get_database_backend(),
        format!(
            "SELECT COUNT(*) AS n FROM {} WHERE owner_id = {HOT} AND count_key = '{KEY}'",
            quote(db, TABLE)
        ),
        [],
    );
    let hot_rows: i64 = db
        .query_one_raw(count)
        .await?
        .ok_or("no count")?
        .try_get("", "n")?;
    let mut times = Vec::with_capacity(args.reads);
    for _ in 0..args.reads {
        let started = Instant::now();
        counters.get(db, &HOT, KEY).await?;
        times.push(started.elapsed());
    }
    times.sort();
    let started = Instant::now();
    let top = counters.top(db, KEY, 10).await?;
    let top_time = started.elapsed();
    assert_eq!(
        top.first().map(|r| r.owner),
        Some(HOT),
        "the hot counter leads"
    );
    let sql = last
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
        top_time,
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
    background: &[i64],
    acked: i64,
) -> Result<bool, BoxError> {
    let mut ok = true;
    let hot = counters.get(db, &HOT, KEY).await?;
    if hot != acked {
        eprintln!("MISMATCH: hot counter {hot}, acknowledged {acked}");
        ok = false;
    }
    let owners: Vec<i64> = (1..=background.len() as i64).collect();
    for chunk in owners.chunks(10_000) {
        let totals = counters.get_many(db, chunk, &[KEY]).await?;
        for owner in chunk {
            let want = background[(*owner - 1) as usize];
            if totals[owner][KEY] != want {
                eprintln!("MISMATCH: owner {owner} {} != {want}", totals[owner][KEY]);
                ok = false;
            }
        }
    }
    println!(
        "check: hot counter {hot} = {acked} acknowledged increments; {} background totals {}",
        background.len(),
        if ok { "unchanged" } else { "WRONG" }
    );
    Ok(ok)
}

fn print_report(
    before: &Measure,
    after: &Measure,
    report: &CompactReport,
    second: &CompactReport,
    compact_time: Duration,
) {
    let ms = |d: Duration| format!("{:.3} ms", d.as_secs_f64() * 1e3);
    println!(
        "compact: {} rows before, {} after, {} counters folded, {} batches, {:.2} s (writers running); \
         then the hot owner again: {} -> {} rows",
        report.totals.rows_before,
        report.totals.rows_after,
        report.totals.counters_folded,
        report.totals.batches,
        compact_time.as_secs_f64(),
        second.totals.rows_before,
        second.totals.rows_after,
    );
    println!();
    println!("| hot counter | before compaction | after compaction | ratio |");
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
        "| `top(10)` | {} | {} | {:.2}x |",
        ms(before.top_time),
        ms(after.top_time),
        ratio(before.top_time, after.top_time)
    );
    println!();
    println!("top(10) plan before compaction:\n{}\n", before.top_plan);
    println!("top(10) plan after compaction:\n{}", after.top_plan);
}
