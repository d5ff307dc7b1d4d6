//! Each hot path beside its raw limit, measured in one run on one machine:
//! what a user choosing this over hand-written code compares.
//!
//! Every ratio is the path's cost per operation over the raw limit's (1.0:
//! at the limit), from medians of interleaved rounds (path, raw, path,
//! raw, ...), so that both meet the same machine. Sections:
//!
//! * **adds** (`adds.rs`): the service's hot adds, keyed and plain, over
//!   HTTP against the same adds through its write path in process (the
//!   same queue, groups and SQL), each at the group sizes it ran at.
//! * **cache** (`cache.rs`, with `--redis-url`): an all-hit cached read
//!   of 1,000 owners x 4 keys against a raw `MGET` plus decoding by hand;
//!   the service's cached batch get over HTTP against the same read in
//!   process.
//! * **unique** (`unique.rs`): observes through the service against the
//!   same members inserted into a membership table by the same clients;
//!   batches spread over many owners (items a second, p99 per request);
//!   the sketch table's bytes on disk against its live sketches; a 30-day
//!   union of 1,000 owners; a unique read of 1,000 owners against a raw
//!   `SELECT` of their sketch rows merged by hand (`unique_read`); a full
//!   compaction of the sketch rows the loads left (rows folded a second).
//! * **mq** (`mq.rs`, with `--nats-url`): the counting consumer of
//!   `counter-mq` draining a JetStream backlog of `--mq-messages` one-event
//!   messages against a loop written by hand on the same backlog (pull
//!   `fetch`, serde decoding, one transaction of the dedup insert and one
//!   multi-row upsert, acknowledgements): messages a second
//!   (`mq_consume`). Every owner's total must equal the messages published
//!   for it, on both sides.
//!
//! With `--floor`, the run measures each of the service's routes as a
//! fraction of what the machine allows it instead (`floor.rs`).
//!
//! With `--growth SIZES`, the run measures how cost grows with the data
//! instead (`growth.rs`, the chart drawn by `chart.rs`).
//!
//! Every figure is checked, not only timed: each owner's stored sketch
//! must equal the sketch of what the service acknowledged, and the run
//! fails otherwise. Tables are dropped at the start and the end.
//!
//! `cargo run --release -p bench --bin limits -- --database-url URL
//! [--redis-url URL] [--nats-url URL] --json PATH`

mod adds;
mod cache;
mod chart;
mod floor;
mod growth;
mod mq;
mod unique;

use std::{path::PathBuf, process::ExitCode, time::Duration};

use bench::BoxError;
use clap::Parser;
use sea_orm::{ConnectOptions, Database, DbBackend};
use serde_json::{Map, Value, json};

/// Measures each hot path beside its raw limit on one database.
#[derive(Debug, Clone, Parser)]
pub(crate) struct Args {
    /// Database to measure (default: a temporary SQLite file).
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Redis, for the cache section (skipped without it).
    #[arg(long)]
    redis_url: Option<String>,
    /// NATS with JetStream, for the MQ section (skipped without it).
    #[arg(long)]
    nats_url: Option<String>,
    /// Messages each side of the MQ section drains per round, 100 to
    /// 1,000,000.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(100..=1_000_000))]
    mq_messages: u64,
    /// Where to write the figures as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Seconds each timed load runs per round, 0.1 to 600.
    #[arg(long, default_value_t = 5.0, value_parser = seconds)]
    secs: f64,
    /// Interleaved rounds per ratio (medians are reported), 1 to 100.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    rounds: u64,
    /// Concurrent clients of the one-item loads, 1 to 1,024.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1_024))]
    clients: u64,
    /// Concurrent clients sending 1,000-item batches, 1 to 256.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=256))]
    batch_clients: u64,
    /// Owners the loads spread over and reads ask for, 1 to 1,000 (the
    /// service's default batch bound).
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=1_000))]
    owners: u64,
    /// Days of the union read, 1 to 366.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=366))]
    days: u32,
    /// Members per owner and day of the union read, 1 to 1,000.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    members_per_day: u32,
    /// The service's `add_workers` (also its observe workers; its default
    /// when not given), 1 to 64.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=64))]
    add_workers: Option<u64>,
    /// Measure how cost grows instead (and nothing else): owners of each
    /// size, e.g. `10000,100000,1000000` (each 10 to 10,000,000).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(10..=10_000_000))]
    growth: Option<Vec<u64>>,
    /// Members per owner-day of the growth's unique sketches.
    #[arg(long, value_delimiter = ',', default_value = "10,1000,1000000", value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    growth_members: Vec<u64>,
    /// Where to draw the growth chart (SVG).
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Measure each service route against the machine's limit instead
    /// (and nothing else): the HTTP floor, the raw SQL and Redis paths, and
    /// each route as a fraction of its limit (`floor.rs`).
    #[arg(long, conflicts_with = "growth")]
    floor: bool,
    /// With `--floor`: the service's log filter (`RUST_LOG`'s syntax; its
    /// default `info`, `off` for none), its lines discarded.
    #[arg(long, default_value = "info")]
    log_filter: String,
    /// Timed reads per round, 1 to 10,000.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    reads: u64,
}

fn seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(secs) if (0.1..=600.0).contains(&secs) => Ok(secs),
        _ => Err(format!("{text}: seconds from 0.1 to 600")),
    }
}

/// One ratio: the path's cost per operation and the raw limit's, in
/// microseconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limit {
    pub own_us: f64,
    pub raw_us: f64,
}

impl Limit {
    fn json(self) -> Value {
        json!({
            "ratio": self.own_us / self.raw_us,
            "own_us": self.own_us,
            "raw_us": self.raw_us,
        })
    }
}

/// What a section measured: its limits, its other figures, and whether
/// every check held.
#[derive(Debug, Default)]
pub(crate) struct Section {
    pub limits: Vec<(&'static str, Limit)>,
    pub figures: Map<String, Value>,
    pub ok: bool,
}

async fn run(args: Args) -> Result<bool, BoxError> {
    let (url, _temp) = bench::database_url(args.database_url.as_deref(), "limits");
    let mut options = ConnectOptions::new(url.clone());
    options
        .max_connections(args.clients as u32 + 8)
        .sqlx_logging(false)
        .acquire_timeout(Duration::from_secs(60));
    let db = Database::connect(options).await?;
    let backend = match db.get_database_backend() {
        DbBackend::Postgres => "postgres",
        DbBackend::MySql => "mysql",
        _ => "sqlite",
    };
    if let Some(sizes) = &args.growth {
        println!("growth on {backend}: {sizes:?} owners");
        let (growth, ok) = growth::run(&args, &db, sizes).await?;
        if let (Some(path), Some(rows)) = (&args.svg, growth["owners"].as_array()) {
            std::fs::write(path, chart::svg(backend, rows))?;
        }
        let report = json!({"backend": backend, "growth": growth});
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")?;
        }
        return Ok(ok);
    }
    if args.floor {
        // The service's binary logs at INFO by default, and its request
        // spans are then formatted even when no line is written: the same
        // subscriber here (its lines discarded) keeps that cost measured.
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(&args.log_filter))
            .with_writer(std::io::sink)
            .init();
        println!(
            "floor on {backend}: {} s a load, {} rounds, {} clients",
            args.secs, args.rounds, args.clients
        );
        let (floor, ok) = floor::run(&args, &db, &url).await?;
        let report = json!({
            "backend": backend,
            "secs": args.secs,
            "rounds": args.rounds,
            "add_workers": args.add_workers,
            "floor": floor,
        });
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")?;
        }
        return Ok(ok);
    }
    println!(
        "limits on {backend}: {} s a load, {} rounds",
        args.secs, args.rounds
    );
    let adds = adds::run(&args, &db, &url).await?;
    let unique = unique::run(&args, &db, &url).await?;
    let cache = match &args.redis_url {
        Some(redis) => cache::run(&args, &db, &url, redis).await?,
        None => Section {
            ok: true,
            ..Section::default()
        },
    };
    let mq = match &args.nats_url {
        Some(nats) => mq::run(&args, &db, nats).await?,
        None => Section {
            ok: true,
            ..Section::default()
        },
    };
    let mut limits = Map::new();
    for (name, limit) in adds
        .limits
        .iter()
        .chain(&cache.limits)
        .chain(&unique.limits)
        .chain(&mq.limits)
    {
        println!(
            "{name:<24} {:>10.1} us {:>10.1} us raw  ratio {:.2}",
            limit.own_us,
            limit.raw_us,
            limit.own_us / limit.raw_us
        );
        limits.insert((*name).to_owned(), limit.json());
    }
    for (name, value) in unique.figures.iter().chain(&mq.figures) {
        println!("{name:<40} {value}");
    }
    let report = json!({
        "backend": backend,
        "secs": args.secs,
        "rounds": args.rounds,
        "args": {
            "clients": args.clients,
            "batch_clients": args.batch_clients,
            "owners": args.owners,
            "days": args.days,
            "members_per_day": args.members_per_day,
            "add_workers": args.add_workers,
            "mq_messages": args.nats_url.as_ref().map(|_| args.mq_messages),
        },
        "limits": limits,
        "adds": adds.figures,
        "unique": unique.figures,
        "mq": mq.figures,
    });
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")?;
    }
    Ok(adds.ok && unique.ok && cache.ok && mq.ok)
}

#[tokio::main]
async fn main() -> ExitCode {
    bench::exit_code("limits", run(Args::parse()).await)
}
