//! The counting service over HTTP, against a naive service and against the
//! library called in process, in one run.
//!
//! Cells, each on fresh tables of one database:
//!
//! * **hot**: `--clients` HTTP clients add to one counter, `--adds` in all,
//!   with an `Idempotency-Key` each, then without; the same load on the
//!   naive service built in here (one row per counter, `UPDATE ... SET
//!   value = value + 1`). Every total is checked: `lost` and `doubled`.
//!   Then the same requests answered by a route that touches no database:
//!   what HTTP alone allows here (`http_ceiling`; `ceiling_vs_naive` is the
//!   most `hot_vs_naive` could be on this machine).
//! * **read**: a batch get of `--owners` owners × 4 keys, over HTTP and
//!   with `Counters::get_many` in process; with `--redis-url`, over HTTP
//!   through the cache and in process through the cache (the share of the
//!   cached read that is Redis's, not HTTP's); the naive service's read is
//!   a `SELECT` per owner and key.
//! * **rate**: adds with keys offered at `--rate` per second for
//!   `--rate-secs` (open loop: each request leaves on schedule, whatever the
//!   answers before it): p50 and p99 latency.
//!
//! `cargo run --release -p bench --bin service-bench -- --database-url URL [--redis-url URL] --json PATH`

use std::{
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    extract::State,
    http::StatusCode,
    routing::{get, post},
};
use bench::{
    http::{self, HttpClient, call},
    stats::percentile,
};
use clap::Parser;
use counter_core::{CounterTable, Counters};
use hyper::Method;
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement, Value};
use serde_json::json;
use tokio::net::TcpListener;

/// Measures the service against a naive one and the library in process.
#[derive(Debug, Parser)]
struct Args {
    /// Database to measure (default: a temporary SQLite file).
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Redis, for the cached read cell.
    #[arg(long)]
    redis_url: Option<String>,
    /// Where to write the figures as JSON.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Concurrent HTTP clients of the hot cells, 1 to 1,024.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1_024))]
    clients: u64,
    /// Adds per hot cell, 1 to 10,000,000.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    adds: u64,
    /// Owners of the batch get, 1 to 1,000 (the service's default bound).
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=1_000))]
    owners: u64,
    /// The service's `add_workers` (its default when not given), 1 to 64.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=64))]
    add_workers: Option<u64>,
    /// Batch gets timed per read cell, 1 to 100,000.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    reads: u64,
    /// Adds offered per second in the rate cell, 1 to 100,000.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    rate: u64,
    /// Seconds of the rate cell, 1 to 600.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    rate_secs: u64,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
const KEYS: [&str; 4] = ["likes", "views", "shares", "saves"];
const TABLE: &str = "service_bench_counters";
const NAIVE: &str = "service_bench_naive";

fn config(database_url: &str, redis: Option<&str>, add_workers: Option<u64>) -> String {
    let workers = add_workers.map_or_else(String::new, |n| format!("add_workers = {n}\n"));
    let cache = redis.map_or_else(String::new, |url| {
        format!(
            "[cache]\nredis_url = \"{url}\"\nnamespace = \"service-bench-{}\"\n",
            std::process::id()
        )
    });
    format!(
        "[server]\nopen = true\nmax_batch_keys = 4\n{workers}[database]\nurl = \"{database_url}\"\nmax_connections = 24\n{cache}\n\
         [namespaces.bench]\ntable = \"{TABLE}\"\nowner = \"integer\"\nslots = 32\n\
         keys.likes = {{}}\nkeys.views = {{}}\nkeys.shares = {{}}\nkeys.saves = {{}}\n"
    )
}

/// What a hot cell did: adds per second and how many were acknowledged.
struct Hot {
    per_s: f64,
    acknowledged: u64,
}

/// `adds` POSTs of `url` from `clients` tasks. Any answer but 200 fails the
/// cell, but a 503 where `refusals` is [`Refusals::Counted`] (the naive
/// service, whose `UPDATE` may wait out SQLite's busy timeout): then only
/// the 200s are in the rate and in the total the cell is checked against.
async fn hot(
    client: &HttpClient,
    url: String,
    clients: u64,
    adds: u64,
    keyed: Option<&'static str>,
    refusals: Refusals,
) -> Result<Hot, BoxError> {
    let next = Arc::new(AtomicU64::new(0));
    let acknowledged = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (client, url, next, acknowledged) = (
                client.clone(),
                url.clone(),
                next.clone(),
                acknowledged.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= adds {
                        return Ok::<(), BoxError>(());
                    }
                    let key = keyed.map(|prefix| format!("{prefix}-{n}"));
                    let body = json!({"owner": 1, "key": "likes"}).to_string();
                    let (status, text) =
                        call(&client, Method::POST, &url, key.as_deref(), Some(body)).await?;
                    let refused = refusals == Refusals::Counted && status == 503;
                    if status == 200 {
                        acknowledged.fetch_add(1, Ordering::Relaxed);
                    } else if !refused {
                        return Err(
                            format!("{url}: {status} {}", String::from_utf8_lossy(&text)).into(),
                        );
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    let acknowledged = acknowledged.load(Ordering::Relaxed);
    Ok(Hot {
        // What was applied: a refused add is not a served one.
        per_s: acknowledged as f64 / start.elapsed().as_secs_f64(),
        acknowledged,
    })
}

/// Whether a hot cell fails on a 503 (it always fails on another answer
/// but 200).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusals {
    Fail,
    Counted,
}

/// An acknowledged count against the stored one: `(lost, doubled)`.
fn difference(acknowledged: u64, stored: u64) -> (u64, u64) {
    (
        acknowledged.saturating_sub(stored),
        stored.saturating_sub(acknowledged),
    )
}

/// The naive service: a row per counter, updated in place; a `SELECT` per
/// owner and key.
async fn naive(db: DatabaseConnection) -> Result<String, BoxError> {
    async fn add(
        State(db): State<DatabaseConnection>,
        Json(body): Json<serde_json::Value>,
    ) -> Result<Json<serde_json::Value>, (StatusCode, String)> {
        let backend = db.get_database_backend();
        let sql = match backend {
            DbBackend::Postgres => format!(
                "UPDATE {NAIVE} SET value = value + 1 WHERE owner_id = $1 AND count_key = $2"
            ),
            _ => {
                format!("UPDATE {NAIVE} SET value = value + 1 WHERE owner_id = ? AND count_key = ?")
            }
        };
        let owner = body["owner"].as_i64().unwrap_or(0);
        let key = body["key"].as_str().unwrap_or("likes").to_owned();
        db.execute_raw(Statement::from_sql_and_values(
            backend,
            sql,
            [Value::from(owner), Value::from(key)],
        ))
        .await
        // A bare `String` error would answer 200: the add is refused.
        .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
        Ok(Json(json!({"applied": true})))
    }
    async fn batch(
        State(db): State<DatabaseConnection>,
        Json(body): Json<serde_json::Value>,
    ) -> Result<Json<serde_json::Value>, (StatusCode, String)> {
        let backend = db.get_database_backend();
        let sql = match backend {
            DbBackend::Postgres => {
                format!("SELECT value FROM {NAIVE} WHERE owner_id = $1 AND count_key = $2")
            }
            _ => format!("SELECT value FROM {NAIVE} WHERE owner_id = ? AND count_key = ?"),
        };
        let mut counts = serde_json::Map::new();
        for owner in body["owners"].as_array().into_iter().flatten() {
            let mut by_key = serde_json::Map::new();
            for key in body["keys"].as_array().into_iter().flatten() {
                let row = db
                    .query_one_raw(Statement::from_sql_and_values(
                        backend,
                        sql.clone(),
                        [Value::from(owner.as_i64()), Value::from(key.as_str())],
                    ))
                    .await
                    .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
                let value: i64 = row.and_then(|r| r.try_get_by_index(0).ok()).unwrap_or(0);
                by_key.insert(key.as_str().unwrap_or_default().to_owned(), value.into());
            }
            counts.insert(owner.to_string(), by_key.into());
        }
        Ok(Json(json!({"counts": counts})))
    }
    let router = Router::new()
        .route("/add", post(add))
        .route("/batchGet", post(batch))
        .route("/healthz", get(|| async { "ok" }))
        // The same request and answer as an add, and no database: what
        // HTTP alone allows on this machine (the ceiling of every cell).
        .route(
            "/noop",
            post(|Json(_): Json<serde_json::Value>| async { Json(json!({"applied": true})) }),
        )
        .with_state(db);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(base)
}

/// The mean requests per committed add group so far, from the service's
/// `/metrics`.
async fn mean_add_group(client: &HttpClient, service: &str) -> Result<f64, BoxError> {
    let (sum, count) =
        http::histogram(client, service, "counter_service_add_group_requests").await?;
    Ok(if count > 0.0 { sum / count } else { 0.0 })
}

/// Seconds per batch get of `owners` × 4 keys by `read`, over `reads` runs
/// (after one to warm up).
async fn time_reads<F, Fut>(reads: u64, mut read: F) -> Result<f64, BoxError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), BoxError>>,
{
    read().await?;
    let start = Instant::now();
    for _ in 0..reads {
        read().await?;
    }
    Ok(start.elapsed().as_secs_f64() / reads as f64)
}

async fn http_read(
    client: &HttpClient,
    url: &str,
    body: &str,
    expect: i64,
) -> Result<(), BoxError> {
    let (status, text) = call(client, Method::POST, url, None, Some(body.to_owned())).await?;
    let value: serde_json::Value = serde_json::from_slice(&text)?;
    let sum: i64 = value["counts"]
        .as_object()
        .into_iter()
        .flatten()
        .flat_map(|(_, keys)| {
            keys.as_object()
                .into_iter()
                .flatten()
                .filter_map(|(_, v)| v.as_i64())
        })
        .sum();
    if status != 200 || sum != expect {
        return Err(format!("{url}: {status}, sum {sum} where {expect} was written").into());
    }
    Ok(())
}

/// Open loop at `rate` per second for `secs`: latencies in milliseconds.
async fn offered(
    client: &HttpClient,
    url: &str,
    rate: u64,
    secs: u64,
) -> Result<Vec<f64>, BoxError> {
    let total = rate * secs;
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for n in 0..total {
        let due = start + Duration::from_secs_f64(n as f64 / rate as f64);
        tokio::time::sleep_until(due.into()).await;
        let (client, url) = (client.clone(), url.to_owned());
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let body = json!({"owner": 2, "key": "likes"}).to_string();
            let (status, _) = call(
                &client,
                Method::POST,
                &url,
                Some(&format!("rate-{n}")),
                Some(body),
            )
            .await?;
            if status != 200 {
                return Err::<f64, BoxError>(format!("rate cell: {status}").into());
            }
            Ok(sent.elapsed().as_secs_f64() * 1_000.0)
        }));
    }
    let mut latencies = Vec::with_capacity(tasks.len());
    for task in tasks {
        latencies.push(task.await??);
    }
    latencies.sort_by(f64::total_cmp);
    Ok(latencies)
}

async fn run(args: Args) -> Result<serde_json::Value, BoxError> {
    let temp = std::env::temp_dir().join(format!("service-bench-{}.db", std::process::id()));
    let url = args
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}?mode=rwc", temp.display()));
    // The naive service gets as many connections as the real one.
    let mut options = sea_orm::ConnectOptions::new(url.clone());
    options.max_connections(24).sqlx_logging(false);
    let db = Database::connect(options).await?;
    let backend = match db.get_database_backend() {
        DbBackend::Postgres => "postgres",
        DbBackend::MySql => "mysql",
        _ => "sqlite",
    };
    let counters = Counters::<i64>::new(CounterTable::new(TABLE)?.with_slots(32)?);
    counters.drop_table(&db).await?;
    db.execute_unprepared(&format!("DROP TABLE IF EXISTS {NAIVE}"))
        .await?;
    db.execute_unprepared(&format!(
        "CREATE TABLE {NAIVE} (owner_id BIGINT NOT NULL, count_key VARCHAR(64) NOT NULL, value BIGINT NOT NULL, PRIMARY KEY (owner_id, count_key))"
    ))
    .await?;
    // Earlier runs' keys would be replays.
    db.execute_unprepared("DELETE FROM counter_applied_messages WHERE source = 'http:bench'")
        .await
        .ok();
    db.execute_unprepared("DELETE FROM counter_service_replies WHERE source = 'http:bench'")
        .await
        .ok();

    let client = http::client(1_024);
    let service = http::serve(&config(&url, None, args.add_workers), "service-bench").await?;
    let naive = naive(db.clone()).await?;
    let add = format!("{service}/v1/bench/counters:add");

    // Hot counter: keyed, plain, naive.
    eprintln!(
        "[{backend}] hot counter, {} clients, {} adds per cell",
        args.clients, args.adds
    );
    let keyed = hot(
        &client,
        add.clone(),
        args.clients,
        args.adds,
        Some("hot"),
        Refusals::Fail,
    )
    .await?;
    let plain = hot(
        &client,
        add.clone(),
        args.clients,
        args.adds,
        None,
        Refusals::Fail,
    )
    .await?;
    let group = mean_add_group(&client, &service).await?;
    db.execute_unprepared(&format!(
        "INSERT INTO {NAIVE} (owner_id, count_key, value) VALUES (1, 'likes', 0)"
    ))
    .await?;
    let naive_hot = hot(
        &client,
        format!("{naive}/add"),
        args.clients,
        args.adds,
        None,
        Refusals::Counted,
    )
    .await?;
    let ceiling = hot(
        &client,
        format!("{naive}/noop"),
        args.clients,
        args.adds,
        None,
        Refusals::Fail,
    )
    .await?;
    let total = counters.get(&db, 1, "likes").await? as u64;
    let naive_total: i64 = db
        .query_one_raw(Statement::from_string(
            db.get_database_backend(),
            format!("SELECT value FROM {NAIVE} WHERE owner_id = 1"),
        ))
        .await?
        .map(|r| r.try_get_by_index(0))
        .transpose()?
        .unwrap_or(0);
    let hot_difference = difference(keyed.acknowledged + plain.acknowledged, total);
    let naive_difference = difference(naive_hot.acknowledged, naive_total as u64);

    // Batch get of owners × 4 keys.
    eprintln!("[{backend}] batch get, {} owners x 4 keys", args.owners);
    let owners: Vec<i64> = (1_000..1_000 + args.owners as i64).collect();
    let mut deltas = Vec::new();
    for owner in &owners {
        for (k, key) in KEYS.iter().enumerate() {
            deltas.push((*owner, *key, 1 + k as i64));
        }
    }
    for chunk in deltas.chunks(2_000) {
        counters.add_many(&db, chunk.iter().copied()).await?;
        let mut values = Vec::new();
        let rows: Vec<String> = chunk
            .iter()
            .map(|(o, k, d)| {
                values.push(Value::from(*o));
                values.push(Value::from(*k));
                values.push(Value::from(*d));
                match db.get_database_backend() {
                    DbBackend::Postgres => {
                        let n = values.len();
                        format!("(${}, ${}, ${})", n - 2, n - 1, n)
                    }
                    _ => "(?, ?, ?)".to_owned(),
                }
            })
            .collect();
        db.execute_raw(Statement::from_sql_and_values(
            db.get_database_backend(),
            format!(
                "INSERT INTO {NAIVE} (owner_id, count_key, value) VALUES {}",
                rows.join(",")
            ),
            values,
        ))
        .await?;
    }
    let written = owners.len() as i64 * 10;
    let body = json!({"owners": owners, "keys": KEYS}).to_string();
    let batch_url = format!("{service}/v1/bench/counts:batchGet");
    let http = time_reads(args.reads, || {
        http_read(&client, &batch_url, &body, written)
    })
    .await?;
    let in_process = time_reads(args.reads, || async {
        let totals = counters.get_many(&db, &owners, &KEYS).await?;
        let sum: i64 = totals.values().flat_map(|t| t.values()).sum();
        if sum != written {
            return Err(format!("in process: sum {sum} where {written} was written").into());
        }
        Ok(())
    })
    .await?;
    let naive_url = format!("{naive}/batchGet");
    let naive_read = time_reads(args.reads.min(5), || {
        http_read(&client, &naive_url, &body, written)
    })
    .await?;
    let (cached, in_process_cached) = match &args.redis_url {
        None => (None, None),
        Some(redis) => {
            let cached_service = http::serve(
                &config(&url, Some(redis), args.add_workers),
                "service-bench",
            )
            .await?;
            let cached_url = format!("{cached_service}/v1/bench/counts:batchGet");
            let over_http = time_reads(args.reads, || {
                http_read(&client, &cached_url, &body, written)
            })
            .await?;
            // The same cached read without HTTP and JSON: what the
            // service's cached answer spends in Redis.
            let cache = counter_redis::CountCache::builder(counter_redis::RedisTarget::standalone(
                redis.clone(),
            ))
            .namespace(format!("service-bench-in-process-{}", std::process::id()))
            .build()
            .await?;
            let cached_counters = cache.table(&counters);
            let in_process = time_reads(args.reads, || async {
                let totals = cached_counters.get_many(&db, &owners, &KEYS).await?;
                let sum: i64 = totals.values().flat_map(|t| t.values()).sum();
                if sum != written {
                    return Err(format!(
                        "in process, cached: sum {sum} where {written} was written"
                    )
                    .into());
                }
                Ok(())
            })
            .await?;
            (Some(over_http), Some(in_process))
        }
    };

    // Latency at a fixed offered rate.
    eprintln!(
        "[{backend}] {} adds/s offered for {} s",
        args.rate, args.rate_secs
    );
    let latencies = offered(&client, &add, args.rate, args.rate_secs).await?;
    let rate_total = counters.get(&db, 2, "likes").await? as u64;
    let rate_difference = difference(args.rate * args.rate_secs, rate_total);
    // Each cell's `[lost, doubled]`: which one, when a total is wrong.
    let by_cell = json!({
        "hot": [hot_difference.0, hot_difference.1],
        "naive": [naive_difference.0, naive_difference.1],
        "rate": [rate_difference.0, rate_difference.1],
    });
    let lost = hot_difference.0 + naive_difference.0 + rate_difference.0;
    let doubled = hot_difference.1 + naive_difference.1 + rate_difference.1;

    counters.drop_table(&db).await?;
    db.execute_unprepared(&format!("DROP TABLE {NAIVE}"))
        .await?;
    if args.database_url.is_none() {
        let _ = std::fs::remove_file(&temp);
    }
    let ratio = |a: f64, b: f64| (a / b * 100.0).round() / 100.0;
    let mut figures = json!({
        "backend": backend,
        "clients": args.clients,
        "add_workers": args.add_workers.unwrap_or(2),
        "adds_per_cell": args.adds,
        "adds_per_s": {
            "idempotent": keyed.per_s.round(),
            "plain": plain.per_s.round(),
            "naive": naive_hot.per_s.round(),
            "http_ceiling": ceiling.per_s.round(),
        },
        "batch_get_ms": {
            "http": http * 1e3,
            "in_process": in_process * 1e3,
            "naive_http": naive_read * 1e3,
            "http_cached": cached.map(|c| c * 1e3),
            "in_process_cached": in_process_cached.map(|c| c * 1e3),
        },
        "ratios": {
            "hot_vs_naive": ratio(keyed.per_s, naive_hot.per_s),
            "idempotent_vs_plain": ratio(keyed.per_s, plain.per_s),
            "http_vs_inprocess_read": ratio(http, in_process),
            "cached_vs_uncached_read": cached.map(|c| ratio(http, c)),
            "read_vs_naive": ratio(naive_read, http),
            // The most `hot_vs_naive` could be here: a service that answers
            // without a database against the naive one.
            "ceiling_vs_naive": ratio(ceiling.per_s, naive_hot.per_s),
        },
        // Requests per committed group over the keyed and plain cells.
        "mean_add_group": (group * 10.0).round() / 10.0,
        "offered_rate": args.rate,
        "p50_ms_at_rate": percentile(&latencies, 0.50),
        "p99_ms_at_rate": percentile(&latencies, 0.99),
        "lost": lost,
        "doubled": doubled,
        "lost_doubled_by_cell": by_cell,
        // Adds the naive service refused (its `UPDATE` failed, on SQLite
        // a busy timeout under load): not in its total, not lost.
        "naive_refused": args.adds - naive_hot.acknowledged,
    });
    // The name for the figure at the target rate.
    figures[format!("p99_ms_at_{}", args.rate)] = percentile(&latencies, 0.99).into();
    Ok(figures)
}

#[tokio::main]
async fn main() -> ExitCode {
    // `RUST_LOG=warn` shows what a failed cell's service said.
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let args = Args::parse();
    let json_path = args.json.clone();
    match run(args).await {
        Ok(figures) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&figures).unwrap_or_default()
            );
            if let Some(path) = json_path
                && let Err(e) = std::fs::write(&path, figures.to_string())
            {
                eprintln!("service-bench: cannot write {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
            if figures["lost"] != 0 || figures["doubled"] != 0 {
                eprintln!(
                    "service-bench: totals differ: lost {}, doubled {} ([lost, doubled] by cell: {})",
                    figures["lost"], figures["doubled"], figures["lost_doubled_by_cell"]
                );
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("service-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
