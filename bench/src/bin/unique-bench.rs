//! Unique counts against the table they replace, measured in one run: a
//! membership table `(owner_id, member)` with its primary key, read with
//! `COUNT(DISTINCT member)`, and the sketches of the same memberships.
//!
//! 1. The data set: `--owners` owners (1..=owners) with `--memberships`
//!    distinct memberships between them, owners drawn Zipf (exponent 1: the
//!    first has about `memberships / H(owners)`, most a few hundred); owner
//!    0 with exactly `--hot-members` distinct members; and a small set of
//!    the same shape at a hundredth of the size (owners 1,000,001 and up,
//!    `--memberships / 100` memberships), for the read at two sizes. Every
//!    membership is inserted into the membership table and observed
//!    (`observe_many`, 50,000 at a time); the sketch table is compacted.
//! 2. Reads: the unique counts of each owner set (`unique_many`, one query)
//!    against `SELECT owner_id, COUNT(DISTINCT member) ... WHERE owner_id IN
//!    (..) GROUP BY owner_id`, medians of `--reads` runs each. Every
//!    estimate is compared with the exact count: the run fails if one is
//!    off by more than 5 standard errors (4 %) or their root mean square
//!    passes 2 (over a thousand owners a few pass 3 by chance).
//! 3. Storage: each table with its indexes as the database reports it
//!    (`pg_total_relation_size`; `data_length + index_length` after
//!    `ANALYZE TABLE` on MySQL/MariaDB; SQLite's `dbstat` where compiled in),
//!    and the serialized sketch of 10, 1,000 and 1,000,000 members.
//! 4. Writes on one hot owner, `--writers` tasks for `--write-secs` each
//!    way: `INSERT .. ON CONFLICT DO NOTHING` (MySQL: `ON DUPLICATE KEY
//!    UPDATE`) into the membership table, against `CounterBuffer::observe`
//!    (the buffered path) until a final flush has committed; and direct
//!    `observe` calls for reference. Members are random among 10 million.
//!
//! Ratios are the membership table's cost over the sketch's (time, bytes),
//! or the sketch's throughput over the table's. Tables are dropped at the
//! end. `cargo run --release -p bench --bin unique-bench -- --database-url
//! URL --json PATH`

use std::{
    collections::HashMap,
    path::PathBuf,
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bench::stats::median;
use clap::Parser;
use counter_core::{
    CounterBuffer, CounterTable, Counters, FlushLedger,
    unique::{Sketch, sketch::STANDARD_ERROR},
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement,
    sea_query::{Alias, Expr, ExprTrait, Query},
};
use serde_json::json;

/// Measures unique counts against a membership table on one database.
#[derive(Debug, Clone, Parser)]
struct Args {
    /// Database to measure (default: a temporary SQLite file).
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Where to write the figures as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Owners of the Zipf set.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(10..=100_000))]
    owners: u64,
    /// Memberships of the Zipf set.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1_000..=20_000_000))]
    memberships: u64,
    /// Distinct members of the hot owner (owner 0).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1_000..=20_000_000))]
    hot_members: u64,
    /// Timed runs of each read.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=100))]
    reads: u64,
    /// Concurrent writers of the hot owner.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=512))]
    writers: u64,
    /// Seconds each write design runs.
    #[arg(long, default_value_t = 5.0)]
    write_secs: f64,
}

const MEMBERS: &str = "unique_bench_members";
const COUNTERS: &str = "unique_bench_counters";
const KEY: &str = "viewers";
/// The first owner of the small set.
const SMALL_BASE: i64 = 1_000_001;
/// The owner the write phase writes (not in either set).
const WRITE_OWNER: i64 = -1;
/// Memberships per `INSERT` and per `observe_many`.
const CHUNK: usize = 5_000;
const OBSERVE_CHUNK: usize = 50_000;

use bench::{BoxError, members};

#[tokio::main]
async fn main() -> ExitCode {
    bench::exit_code("unique-bench", run(Args::parse()).await)
}

async fn run(args: Args) -> Result<bool, BoxError> {
    let (url, _temp) = bench::database_url(args.database_url.as_deref(), "unique-bench");
    let mut options = ConnectOptions::new(&url);
    options
        .max_connections(args.writers as u32 + 4)
        .sqlx_logging(false);
    let db = Database::connect(options).await?;
    if db.get_database_backend() == DbBackend::Sqlite {
        db.execute_unprepared("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL")
            .await?;
    }
    let counters = Counters::<i64>::new(
        CounterTable::new(COUNTERS)?
            .with_slots(16)?
            .with_unique_key(KEY)?,
    );
    drop_tables(&db, &counters).await;
    counters.create_table(&db).await?;
    FlushLedger::default().create_table(&db).await?;
    members::create(&db, MEMBERS).await?;
    let outcome = bench(&db, &counters, &args).await;
    drop_tables(&db, &counters).await;
    db.close().await?;
    let (figures, ok) = outcome?;
    println!("{}", serde_json::to_string_pretty(&figures)?);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&figures)? + "\n")?;
    }
    Ok(ok)
}

async fn drop_tables(db: &DatabaseConnection, counters: &Counters<i64>) {
    let _ = counters.drop_table(db).await;
    members::drop(db, MEMBERS).await;
}

/// Members per owner for `memberships` memberships over `owners` owners,
/// Zipf with exponent 1 (each at least 1).
fn zipf(owners: u64, memberships: u64) -> Vec<u64> {
    let harmonic: f64 = (1..=owners).map(|k| 1.0 / k as f64).sum();
    (1..=owners)
        .map(|k| Ord::max((memberships as f64 / harmonic / k as f64).round() as u64, 1))
        .collect()
}

/// The members of an owner: `n` distinct ids, spread out.
fn members_of(owner: i64, n: u64) -> impl Iterator<Item = i64> {
    (0..n as i64).map(move |i| i * 7_919 + owner.rem_euclid(7_919))
}

/// One set of owners with its exact member counts.
struct OwnerSet {
    owners: Vec<i64>,
    exact: HashMap<i64, u64>,
}

async fn bench(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    args: &Args,
) -> Result<(serde_json::Value, bool), BoxError> {
    let backend = format!("{:?}", db.get_database_backend()).to_lowercase();
    println!(
        "unique-bench on {backend}: {} owners, {} memberships (Zipf), hot owner {} members",
        args.owners, args.memberships, args.hot_members
    );
    // 1. The data set.
    let started = Instant::now();
    let mut big = OwnerSet {
        owners: vec![0],
        exact: HashMap::from([(0, args.hot_members)]),
    };
    for (k, n) in zipf(args.owners, args.memberships).into_iter().enumerate() {
        big.owners.push(k as i64 + 1);
        big.exact.insert(k as i64 + 1, n);
    }
    let mut small = OwnerSet {
        owners: Vec::new(),
        exact: HashMap::new(),
    };
    for (k, n) in zipf(args.owners, args.memberships / 100)
        .into_iter()
        .enumerate()
    {
        small.owners.push(SMALL_BASE + k as i64);
        small.exact.insert(SMALL_BASE + k as i64, n);
    }
    let mut rows = 0u64;
    for set in [&big, &small] {
        rows += load(db, counters, set).await?;
    }
    let compaction = counters.compact(db, &Default::default()).await?;
    println!(
        "loaded {rows} memberships in {:.1} s; sketches compacted: {} counters folded",
        started.elapsed().as_secs_f64(),
        compaction.sketches.counters_folded
    );

    // 2. Reads.
    let mut ok = true;
    let mut reads = serde_json::Map::new();
    let mut read_ratios = HashMap::new();
    for (name, set) in [("small", &small), ("big", &big)] {
        let (sketch_ms, estimates) = time_unique(db, counters, &set.owners, args.reads).await?;
        let (distinct_ms, exact) = time_count_distinct(db, &set.owners, args.reads).await?;
        let (mut worst, mut squares): (f64, f64) = (0.0, 0.0);
        for owner in &set.owners {
            let truth = exact.get(owner).copied().unwrap_or(0);
            if truth != set.exact[owner] {
                return Err(
                    format!("owner {owner}: {truth} rows, {} inserted", set.exact[owner]).into(),
                );
            }
            let estimate = estimates[owner][KEY];
            let error = (estimate as f64 - truth as f64).abs() / truth as f64;
            worst = worst.max(error);
            squares += error * error;
        }
        let rms = (squares / set.owners.len() as f64).sqrt();
        // Over a thousand owners a few land past 3 standard errors by
        // chance (0.27 % each); a broken sketch misses by far more.
        if worst > 5.0 * STANDARD_ERROR || rms > 2.0 * STANDARD_ERROR {
            eprintln!(
                "FAIL: {name} set: worst estimate {:.2} % off, root mean square {:.2} %",
                worst * 100.0,
                rms * 100.0
            );
            ok = false;
        }
        let memberships: u64 = set.exact.values().sum();
        println!(
            "read {name} ({} owners, {memberships} memberships): sketches {sketch_ms:.2} ms, COUNT(DISTINCT) {distinct_ms:.2} ms, error worst {:.3} % rms {:.3} %",
            set.owners.len(),
            worst * 100.0,
            rms * 100.0
        );
        read_ratios.insert(name, distinct_ms / sketch_ms);
        reads.insert(
            name.to_owned(),
            json!({
                "owners": set.owners.len(),
                "memberships": memberships,
                "sketch_ms": sketch_ms,
                "count_distinct_ms": distinct_ms,
                "ratio": distinct_ms / sketch_ms,
                "worst_relative_error": worst,
                "rms_relative_error": rms,
            }),
        );
    }
    let hot = counters.unique(db, 0, KEY).await?;
    let relative_error_at_1m =
        (hot as f64 - args.hot_members as f64).abs() / args.hot_members as f64;

    // 3. Storage.
    let sketch_table = counters.table().sketch_table().unwrap_or_default();
    let member_bytes = table_bytes(db, MEMBERS).await?;
    let sketch_bytes = table_bytes(db, &sketch_table).await?;
    let sizes: Vec<usize> = [10u64, 1_000, 1_000_000]
        .into_iter()
        .map(|n| {
            let mut sketch = Sketch::new();
            for member in members_of(7, n) {
                sketch.insert(&member);
            }
            sketch.to_bytes().len()
        })
        .collect();
    let storage_ratio = match (member_bytes, sketch_bytes) {
        (Some(m), Some(s)) if s > 0 => Some(m as f64 / s as f64),
        _ => None,
    };
    println!(
        "storage: membership table {member_bytes:?} bytes, sketch table {sketch_bytes:?} bytes; sketch of 10 / 1k / 1M members: {sizes:?} bytes"
    );

    // 4. Writes on one hot owner.
    let insert_rate = write_members(db, args).await?;
    let (buffered_rate, buffered_ok) = write_buffered(db, counters, args).await?;
    let direct_rate = write_direct(db, counters, args).await?;
    ok &= buffered_ok;
    println!(
        "writes on one owner, {} writers: membership insert {insert_rate:.0}/s, buffered observe {buffered_rate:.0}/s, direct observe {direct_rate:.0}/s",
        args.writers
    );

    let figures = json!({
        "backend": backend,
        "ratios": {
            "read_vs_count_distinct": read_ratios["big"],
            "read_vs_count_distinct_at_10k": read_ratios["small"],
            "storage_vs_membership": storage_ratio,
            "observe_vs_membership_insert": buffered_rate / insert_rate,
            "direct_observe_vs_membership_insert": direct_rate / insert_rate,
        },
        "sketch_bytes_at_10": sizes[0],
        "sketch_bytes_at_1k": sizes[1],
        "sketch_bytes_at_1m": sizes[2],
        "relative_error_at_1m": relative_error_at_1m,
        "estimate_at_1m": hot,
        "reads": reads,
        "storage": {
            "membership_table_bytes": member_bytes,
            "sketch_table_bytes": sketch_bytes,
            "membership_rows": rows,
        },
        "writes_per_second": {
            "membership_insert": insert_rate,
            "buffered_observe": buffered_rate,
            "direct_observe": direct_rate,
        },
        "config": {
            "owners": args.owners,
            "memberships": args.memberships,
            "hot_members": args.hot_members,
            "writers": args.writers,
            "write_secs": args.write_secs,
            "reads": args.reads,
        },
    });
    Ok((figures, ok))
}

/// Inserts and observes every membership of `set`; the rows inserted.
async fn load(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    set: &OwnerSet,
) -> Result<u64, BoxError> {
    let mut pending: Vec<(i64, i64)> = Vec::with_capacity(OBSERVE_CHUNK);
    let mut rows = 0u64;
    for owner in &set.owners {
        for member in members_of(*owner, set.exact[owner]) {
            pending.push((*owner, member));
            if pending.len() == OBSERVE_CHUNK {
                rows += flush_load(db, counters, &mut pending).await?;
            }
        }
    }
    rows += flush_load(db, counters, &mut pending).await?;
    Ok(rows)
}

async fn flush_load(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    pending: &mut Vec<(i64, i64)>,
) -> Result<u64, BoxError> {
    for chunk in pending.chunks(CHUNK) {
        let mut insert = Query::insert();
        insert
            .into_table(Alias::new(MEMBERS))
            .columns([Alias::new("owner_id"), Alias::new("member")]);
        for &(owner, member) in chunk {
            insert.values_panic([owner.into(), member.into()]);
        }
        db.execute(&insert).await?;
    }
    counters
        .observe_many(
            db,
            pending.iter().map(|&(owner, member)| (owner, KEY, member)),
        )
        .await?;
    let rows = pending.len() as u64;
    pending.clear();
    Ok(rows)
}

/// `unique_many` of `owners`: median time (ms) of `runs` runs after a
/// warm-up, and the estimates.
async fn time_unique(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    owners: &[i64],
    runs: u64,
) -> Result<(f64, counter_core::unique::UniqueMap<i64>), BoxError> {
    let mut estimates = counters.unique_many(db, owners, &[KEY]).await?;
    let mut times = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        estimates = counters.unique_many(db, owners, &[KEY]).await?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    Ok((median(times), estimates))
}

/// `COUNT(DISTINCT member)` grouped over `owners`: median time (ms) of
/// `runs` runs after a warm-up, and the counts.
async fn time_count_distinct(
    db: &DatabaseConnection,
    owners: &[i64],
    runs: u64,
) -> Result<(f64, HashMap<i64, u64>), BoxError> {
    let select = Query::select()
        .column(Alias::new("owner_id"))
        .expr_as(
            Expr::col(Alias::new("member")).count_distinct(),
            Alias::new("n"),
        )
        .from(Alias::new(MEMBERS))
        .and_where(Expr::col(Alias::new("owner_id")).is_in(owners.iter().copied()))
        .group_by_col(Alias::new("owner_id"))
        .to_owned();
    let read = || async {
        let rows = db.query_all(&select).await?;
        rows.iter()
            .map(|row| {
                Ok((
                    row.try_get::<i64>("", "owner_id")?,
                    row.try_get::<i64>("", "n")? as u64,
                ))
            })
            .collect::<Result<HashMap<i64, u64>, sea_orm::DbErr>>()
    };
    let mut counts = read().await?;
    let mut times = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        counts = read().await?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    Ok((median(times), counts))
}

/// A table's bytes with its indexes, as the database reports them.
async fn table_bytes(db: &DatabaseConnection, table: &str) -> Result<Option<u64>, BoxError> {
    let backend = db.get_database_backend();
    let sql = match backend {
        DbBackend::Postgres => {
            format!("SELECT CAST(pg_total_relation_size('{table}') AS BIGINT) AS n")
        }
        DbBackend::MySql => {
            db.execute_unprepared(&format!("ANALYZE TABLE `{table}`"))
                .await?;
            format!(
                "SELECT CAST(data_length + index_length AS SIGNED) AS n FROM information_schema.TABLES \
                 WHERE table_schema = DATABASE() AND table_name = '{table}'"
            )
        }
        _ => format!(
            "SELECT SUM(pgsize) AS n FROM dbstat WHERE name = '{table}' OR tbl_name = '{table}'"
        ),
    };
    // Table names are this bench's constants: no input reaches the SQL.
    match db.query_one_raw(Statement::from_string(backend, sql)).await {
        Ok(Some(row)) => Ok(row.try_get::<Option<i64>>("", "n")?.map(|n| n as u64)),
        Ok(None) => Ok(None),
        // SQLite without the dbstat table.
        Err(_) if backend == DbBackend::Sqlite => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Runs `writers` tasks of `op` for `--write-secs`; operations per second.
async fn load_for<F, Fut>(args: &Args, op: F) -> Result<f64, BoxError>
where
    F: Fn(i64) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), BoxError>> + Send,
{
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(args.write_secs);
    let started = Instant::now();
    let tasks: Vec<_> = (0..args.writers)
        .map(|w| {
            let (op, done) = (op.clone(), done.clone());
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(w);
                while Instant::now() < deadline {
                    op(rng.random_range(0..10_000_000)).await?;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<(), BoxError>(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// `INSERT .. ON CONFLICT DO NOTHING` of members of the write owner.
async fn write_members(db: &DatabaseConnection, args: &Args) -> Result<f64, BoxError> {
    let db = db.clone();
    load_for(args, move |member| {
        let db = db.clone();
        async move { members::insert(&db, MEMBERS, WRITE_OWNER, member).await }
    })
    .await
}

/// `CounterBuffer::observe` of members of the write owner, until a final
/// flush committed: the rate counts the flush. The stored sketch must hold
/// exactly what was observed.
async fn write_buffered(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    args: &Args,
) -> Result<(f64, bool), BoxError> {
    let buffer = CounterBuffer::builder(db)
        .interval(Duration::from_millis(100))
        .start()
        .await?;
    let observed = Arc::new(std::sync::Mutex::new(Sketch::new()));
    let started = Instant::now();
    let ops = {
        let (buffer, counters, observed) = (buffer.clone(), counters.clone(), observed.clone());
        load_for(args, move |member| {
            let (buffer, counters, observed) = (buffer.clone(), counters.clone(), observed.clone());
            async move {
                buffer.observe(&counters, WRITE_OWNER, KEY, &member)?;
                if member % 64 == 0 {
                    // A sample kept for the check below (every member
                    // would serialize the writers on this lock).
                    observed.lock().map_err(|e| e.to_string())?.insert(&member);
                }
                tokio::task::yield_now().await;
                Ok(())
            }
        })
        .await?
    };
    let observes = ops * args.write_secs;
    buffer.flush().await?;
    let rate = observes / started.elapsed().as_secs_f64();
    let stats = buffer.shutdown().await?;
    let stored = counters.sketch(db, WRITE_OWNER, KEY).await?;
    let mut check = stored.clone();
    let sample = observed.lock().map_err(|e| e.to_string())?.clone();
    let ok = !check.merge(&sample) && stats.pending_sketches == 0;
    if !ok {
        eprintln!("FAIL: the stored sketch misses members the buffer took");
    }
    Ok((rate, ok))
}

/// Direct `observe` calls on the write owner (a fresh owner id).
async fn write_direct(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    args: &Args,
) -> Result<f64, BoxError> {
    let (db, counters) = (db.clone(), counters.clone());
    load_for(args, move |member| {
        let (db, counters) = (db.clone(), counters.clone());
        async move {
            counters.observe(&db, WRITE_OWNER - 1, KEY, &member).await?;
            Ok(())
        }
    })
    .await
}
