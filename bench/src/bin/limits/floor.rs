//! The floor: each of the service's routes, at the same concurrency, as a
//! fraction of what this machine allows it (`limits --floor`).
//!
//! One client (hyper's, keep-alive) and one run; every load is a closed
//! loop of `--clients` tasks (`--batch-clients` for 1,000-item batches)
//! for `--secs`, and the rounds interleave every load so that all of them
//! meet the same machine. The limits, measured the same way:
//!
//! * **the HTTP floor**: `GET /healthz` on the same service: every layer a
//!   request passes (request id, span, figures, load shedding) around a
//!   handler that does nothing;
//! * **raw SQL**: the route's statement alone, on a pool of as many
//!   connections as the service's (one on SQLite): the one-owner grouped `SUM` a `counts:batchGet` sends,
//!   the add's upsert in autocommit (shown for reference: adds are
//!   committed in groups, so their limit is the floor), and a batch of
//!   1,000 deltas over 1,000 owners through `DeltaBatch::apply` (one
//!   transaction, the library's path);
//! * **raw Redis** (with `--redis-url`): one `GET` of the entry a cached
//!   one-owner read answers from, on one multiplexed connection.
//!
//! A route's fraction is its rate over its limit's (1.0: at the limit):
//! an add over the floor; a read over HTTP and its raw read done one
//! after the other, `1 / (1/floor + 1/raw)`; a one-member observe over a
//! plain add; a 1,000-item batch over the raw batch.
//!
//! Every answer must be 200, and every write checked: the hot counter
//! holds every acknowledged add, each batch key every acknowledged item,
//! the raw upserts' counter every upsert; a read over HTTP must answer
//! what the library reads. Tables are dropped at the start and the end.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use bench::{
    BoxError,
    http::{self, HttpClient},
    load::closed_loop,
    stats::median,
};
use counter_core::{CounterTable, Counters, DeltaBatch};
use hyper::Method;
use sea_orm::{
    ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement,
    sea_query::{Alias, Expr, ExprTrait, OnConflict, Query},
};
use serde_json::{Map, Value, json};

use crate::Args;

const TABLE: &str = "limits_floor";
const CACHED: &str = "limits_floor_cached";
const SLOTS: u32 = 32;
const BATCH_ITEMS: u64 = 1_000;
/// The owner the raw upserts count on (no route writes it).
const RAW_OWNER: i64 = 0;

/// One load of a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Load {
    Healthz,
    RawUpsert,
    PlainAdd,
    KeyedAdd,
    Observe,
    RawSum,
    Read,
    RawGet,
    CachedRead,
    RawBatch,
    Batch,
}

impl Load {
    const ALL: [Load; 11] = [
        Load::Healthz,
        Load::RawUpsert,
        Load::PlainAdd,
        Load::KeyedAdd,
        Load::Observe,
        Load::RawSum,
        Load::Read,
        Load::RawGet,
        Load::CachedRead,
        Load::RawBatch,
        Load::Batch,
    ];

    fn name(self) -> &'static str {
        match self {
            Load::Healthz => "http_floor",
            Load::RawUpsert => "raw_upsert",
            Load::PlainAdd => "plain_add",
            Load::KeyedAdd => "keyed_add",
            Load::Observe => "observe_one",
            Load::RawSum => "raw_sum",
            Load::Read => "batch_get",
            Load::RawGet => "raw_redis_get",
            Load::CachedRead => "cached_batch_get",
            Load::RawBatch => "raw_batch_items",
            Load::Batch => "batch_add_items",
        }
    }

    fn needs_redis(self) -> bool {
        matches!(self, Load::RawGet | Load::CachedRead)
    }

    /// Items an operation carries (rates are reported in items).
    fn items(self) -> u64 {
        match self {
            Load::RawBatch | Load::Batch => BATCH_ITEMS,
            _ => 1,
        }
    }
}

/// Everything a load's operations share.
struct Rig {
    client: HttpClient,
    base: String,
    cached_base: Option<String>,
    db: DatabaseConnection,
    redis: Option<redis::aio::MultiplexedConnection>,
    redis_prefix: String,
    counters: Counters<i64>,
    owners: u64,
    run_id: String,
    batch_body: String,
    /// Requests refused as `overloaded` and sent again.
    refused: AtomicU64,
}

impl Rig {
    /// An owner the `n`th operation of `task` reads, spread over all.
    fn owner(&self, task: u64, n: u64) -> i64 {
        ((task * 7_919 + n) % self.owners) as i64 + 1
    }

    async fn get(&self, url: &str) -> Result<(), BoxError> {
        expect_ok(
            url,
            http::call(&self.client, Method::GET, url, None, None).await?,
        )
    }

    /// A POST that must answer 200. One refused as `overloaded` (the
    /// queue's wait bound: nothing was applied) is counted and sent again
    /// after a short pause, as a client keeping its concurrency would; the
    /// load's rate counts only what was applied.
    async fn post(&self, url: &str, key: Option<&str>, body: String) -> Result<(), BoxError> {
        loop {
            let (status, text) =
                http::call(&self.client, Method::POST, url, key, Some(body.clone())).await?;
            if status == 503 && text.windows(10).any(|w| w == b"overloaded") {
                self.refused.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            return expect_ok(url, (status, text));
        }
    }

    /// One operation of `load`.
    async fn op(&self, load: Load, round: u64, task: u64, n: u64) -> Result<(), BoxError> {
        let base = &self.base;
        match load {
            Load::Healthz => self.get(&format!("{base}/healthz")).await,
            Load::PlainAdd | Load::KeyedAdd => {
                let key =
                    (load == Load::KeyedAdd).then(|| format!("{}-{round}-{task}-{n}", self.run_id));
                let body = json!({"owner": 1, "key": "likes"}).to_string();
                let url = format!("{base}/v1/floor/counters:add");
                self.post(&url, key.as_deref(), body).await
            }
            Load::Observe => {
                let member = format!("{}-{round}-{task}-{n}", self.run_id);
                let body = json!({"observations": [
                    {"owner": self.owner(task, n), "key": "viewers", "member": member}
                ]});
                let url = format!("{base}/v1/floor/counters:observe");
                self.post(&url, None, body.to_string()).await
            }
            Load::Read => {
                let owner = self.owner(task, n);
                let url = format!("{base}/v1/floor/counts:batchGet?owners={owner}&keys=likes");
                self.get(&url).await
            }
            Load::CachedRead => {
                let base = self.cached_base.as_deref().ok_or("no cached service")?;
                let owner = self.owner(task, n);
                let url = format!("{base}/v1/cached/counts:batchGet?owners={owner}&keys=likes");
                self.get(&url).await
            }
            Load::Batch => {
                let url = format!("{base}/v1/floor/counters:batchAdd");
                self.post(&url, None, self.batch_body.clone()).await
            }
            Load::RawUpsert => {
                let slot = (task * 31 + n) % u64::from(SLOTS);
                let upsert = upsert(self.db.get_database_backend(), slot as i64);
                self.db.execute_raw(upsert).await?;
                Ok(())
            }
            Load::RawSum => {
                let sum = sum(self.db.get_database_backend(), self.owner(task, n));
                let rows = self.db.query_all_raw(sum).await?;
                if rows.len() > 1 {
                    return Err(format!("a one-owner sum gave {} rows", rows.len()).into());
                }
                Ok(())
            }
            Load::RawGet => {
                let mut redis = self.redis.clone().ok_or("no Redis")?;
                let key = format!("{}{{{CACHED}:{}}}", self.redis_prefix, self.owner(task, n));
                let value: Option<Vec<u8>> =
                    redis::cmd("GET").arg(key).query_async(&mut redis).await?;
                value
                    .map(|_| ())
                    .ok_or_else(|| "a cached entry was gone".into())
            }
            Load::RawBatch => {
                let mut batch = DeltaBatch::new();
                for i in 0..BATCH_ITEMS {
                    let owner = (i % self.owners) as i64 + 1;
                    batch.add(&self.counters, owner, "raw_batch", 1)?;
                }
                batch.apply(&self.db).await?;
                Ok(())
            }
        }
    }
}

fn expect_ok(url: &str, (status, body): (u16, hyper::body::Bytes)) -> Result<(), BoxError> {
    match status {
        200 => Ok(()),
        _ => Err(format!("{url}: {status} {}", String::from_utf8_lossy(&body)).into()),
    }
}

/// The add's upsert of 1 into `slot` of the raw owner's counter, as the
/// library writes one (`ON CONFLICT .. DO UPDATE`, MySQL's `ON DUPLICATE
/// KEY UPDATE`).
fn upsert(backend: DbBackend, slot: i64) -> Statement {
    let columns = ["owner_id", "count_key", "slot", "value"].map(Alias::new);
    let sum = match backend {
        DbBackend::MySql => "`value` + VALUES(`value`)".to_owned(),
        _ => format!(r#""{TABLE}"."value" + excluded."value""#),
    };
    let mut on_conflict = OnConflict::columns(["owner_id", "count_key", "slot"].map(Alias::new));
    on_conflict.value(Alias::new("value"), Expr::cust(sum));
    let insert = Query::insert()
        .into_table(Alias::new(TABLE))
        .columns(columns)
        .values_panic([RAW_OWNER.into(), "raw".into(), slot.into(), 1i64.into()])
        .on_conflict(on_conflict)
        .to_owned();
    backend.build(&insert)
}

/// The grouped `SUM` a one-owner, one-key `counts:batchGet` sends (the
/// library's statement: the total cast to text).
fn sum(backend: DbBackend, owner: i64) -> Statement {
    let text = match backend {
        DbBackend::MySql => "CHAR",
        _ => "TEXT",
    };
    let select = Query::select()
        .columns(["owner_id", "count_key"].map(Alias::new))
        .expr_as(
            Expr::col(Alias::new("value"))
                .sum()
                .cast_as(Alias::new(text)),
            Alias::new("total"),
        )
        .from(Alias::new(TABLE))
        .and_where(Expr::col(Alias::new("owner_id")).is_in([owner]))
        .and_where(Expr::col(Alias::new("count_key")).is_in(["likes"]))
        .group_by_columns(["owner_id", "count_key"].map(Alias::new))
        .to_owned();
    backend.build(&select)
}

fn config(url: &str, args: &Args) -> String {
    let workers = args
        .add_workers
        .map_or_else(String::new, |n| format!("add_workers = {n}\n"));
    format!(
        "[server]\nopen = true\n{workers}[database]\nurl = \"{url}\"\n\n\
         [namespaces.floor]\ntable = \"{TABLE}\"\nowner = \"integer\"\nslots = {SLOTS}\n\
         keys.likes = {{}}\nkeys.shares = {{}}\nkeys.viewers = {{ unique = true }}\n"
    )
}

/// The cached reads' service: two database connections (its reads are all
/// hits), so that PostgreSQL's default 100 hold the raw loads' 64 and the
/// measured service's default 32.
fn cached_config(url: &str, redis_url: &str, namespace: &str) -> String {
    format!(
        "[server]\nopen = true\n[database]\nurl = \"{url}\"\nmax_connections = 2\n\
         [cache]\nredis_url = \"{redis_url}\"\nnamespace = \"{namespace}\"\nttl_seconds = 3600\n\n\
         [namespaces.cached]\ntable = \"{CACHED}\"\nowner = \"integer\"\nslots = {SLOTS}\nkeys.likes = {{}}\n"
    )
}

fn table_counters(table: &'static str) -> Result<Counters<i64>, BoxError> {
    let table = CounterTable::new(table)?
        .with_slots(SLOTS)?
        .with_unique_key("viewers")?;
    Ok(Counters::new(table))
}

/// Measures the floor on `db` (at `url`): the figures and whether every
/// check held.
pub(crate) async fn run(
    args: &Args,
    db: &DatabaseConnection,
    url: &str,
) -> Result<(Value, bool), BoxError> {
    let counters = table_counters(TABLE)?;
    let cached_counters = table_counters(CACHED)?;
    let _ = counters.drop_table(db).await;
    let _ = cached_counters.drop_table(db).await;
    let text = config(url, args);
    let (base, _) = http::serve_local(&text, "limits").await?;
    let raw_db = raw_pool(url, &text).await?;
    let run_id = format!(
        "{}-{}",
        std::process::id(),
        chrono::Utc::now().timestamp_millis()
    );
    let cache_namespace = format!("floor{}", std::process::id());
    let (cached_base, redis) = match &args.redis_url {
        Some(redis_url) => {
            cached_counters.create_table(db).await?;
            let mut seed = DeltaBatch::new();
            for owner in 1..=args.owners as i64 {
                seed.add(&cached_counters, owner, "likes", owner)?;
            }
            seed.apply(db).await?;
            let text = cached_config(url, redis_url, &cache_namespace);
            let base = http::serve(&text, "limits").await?;
            let client = redis::Client::open(redis_url.as_str())?;
            (
                Some(base),
                Some(client.get_multiplexed_async_connection().await?),
            )
        }
        None => (None, None),
    };
    let items: Vec<Value> = (0..BATCH_ITEMS)
        .map(|i| json!({"owner": (i % args.owners) + 1, "key": "shares", "delta": 1}))
        .collect();
    let rig = Arc::new(Rig {
        client: http::client(1_024),
        base,
        cached_base,
        db: raw_db,
        redis,
        redis_prefix: format!("sc2:{cache_namespace}:"),
        counters: counters.clone(),
        owners: args.owners,
        run_id,
        batch_body: json!({ "items": items }).to_string(),
        refused: AtomicU64::new(0),
    });
    let mut ok = warm(&rig).await?;
    let loads: Vec<Load> = Load::ALL
        .into_iter()
        .filter(|load| rig.redis.is_some() || !load.needs_redis())
        .collect();
    let mut rates: Map<String, Value> = Map::new();
    let mut done = std::collections::HashMap::<Load, u64>::new();
    let mut samples = std::collections::HashMap::<Load, Vec<f64>>::new();
    for round in 0..args.rounds {
        for &load in &loads {
            let clients = match load.items() {
                1 => args.clients,
                _ => args.batch_clients,
            };
            let rig_ = rig.clone();
            let (rate, ops) = closed_loop(clients, args.secs, move |task, n| {
                let rig = rig_.clone();
                async move { rig.op(load, round, task, n).await }
            })
            .await?;
            *done.entry(load).or_default() += ops;
            samples
                .entry(load)
                .or_default()
                .push(rate * load.items() as f64);
        }
    }
    let rate = |load: Load| samples.get(&load).cloned().map(median);
    for &load in &loads {
        let per_s = rate(load).unwrap_or(f64::NAN);
        println!("{:<20} {per_s:>12.0}/s", load.name());
        rates.insert(load.name().into(), json!(per_s));
    }
    ok &= check(&rig, &done).await?;
    let floor = rate(Load::Healthz).unwrap_or(f64::NAN);
    let after = |raw: f64| 1.0 / (1.0 / floor + 1.0 / raw);
    let mut routes = Map::new();
    let mut route = |load: Load, limit: &str, limit_per_s: Option<f64>, target: f64| {
        let (Some(per_s), Some(limit_per_s)) = (rate(load), limit_per_s) else {
            return;
        };
        let fraction = per_s / limit_per_s;
        println!(
            "{:<20} {fraction:>6.2} of {limit} ({per_s:.0} / {limit_per_s:.0}/s, target {target})",
            load.name()
        );
        routes.insert(
            load.name().into(),
            json!({
                "per_s": per_s,
                "limit": limit,
                "limit_per_s": limit_per_s,
                "fraction": fraction,
                "target": target,
            }),
        );
    };
    route(Load::PlainAdd, "the HTTP floor", Some(floor), 0.6);
    route(Load::KeyedAdd, "the HTTP floor", Some(floor), 0.4);
    route(Load::Read, "HTTP + SQL", rate(Load::RawSum).map(after), 0.8);
    route(
        Load::CachedRead,
        "HTTP + Redis",
        rate(Load::RawGet).map(after),
        0.8,
    );
    route(Load::Observe, "a plain add", rate(Load::PlainAdd), 0.8);
    route(
        Load::Batch,
        "the raw batch",
        rate(Load::RawBatch),
        1.0 / 1.3,
    );
    let _ = counters.drop_table(db).await;
    let _ = cached_counters.drop_table(db).await;
    if let Some(mut redis) = rig.redis.clone() {
        let keys: Vec<String> = (1..=args.owners)
            .map(|owner| format!("{}{{{CACHED}:{owner}}}", rig.redis_prefix))
            .collect();
        let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut redis).await?;
    }
    let figures = json!({
        "clients": args.clients,
        "batch_clients": args.batch_clients,
        "rates_per_s": rates,
        "routes": routes,
        "refused_overloaded": rig.refused.load(Ordering::Relaxed),
    });
    Ok((figures, ok))
}

/// The raw loads' pool: the measured service's own pool settings
/// ([`counter_service::pool_options`]: its size, one connection on SQLite,
/// a ping only for a connection idle for a second), so a raw statement
/// meets the database as the route's does; only the acquire waits longer.
async fn raw_pool(url: &str, service: &str) -> Result<DatabaseConnection, BoxError> {
    let config = counter_service::Config::from_text(service, "limits", std::iter::empty(), &[])?;
    let mut options = counter_service::pool_options(&config, url);
    options.acquire_timeout(Duration::from_secs(60));
    Ok(Database::connect(options).await?)
}

/// Fills the cache: each owner read through the cached service until its
/// entry is in Redis (fills are stored in the background). False (and a
/// message) if an entry never appears.
async fn warm(rig: &Rig) -> Result<bool, BoxError> {
    let (Some(base), Some(redis)) = (&rig.cached_base, &rig.redis) else {
        return Ok(true);
    };
    let mut redis = redis.clone();
    for owner in 1..=rig.owners {
        let key = format!("{}{{{CACHED}:{owner}}}", rig.redis_prefix);
        let url = format!("{base}/v1/cached/counts:batchGet?owners={owner}&keys=likes");
        let mut filled = false;
        for _ in 0..100 {
            rig.get(&url).await?;
            let exists: bool = redis::cmd("EXISTS")
                .arg(&key)
                .query_async(&mut redis)
                .await?;
            if exists {
                filled = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if !filled {
            eprintln!("FAIL: the cache never stored owner {owner}'s entry");
            return Ok(false);
        }
    }
    Ok(true)
}

/// Every write of the run in the tables, and reads over HTTP answering
/// what the library reads.
async fn check(rig: &Rig, done: &std::collections::HashMap<Load, u64>) -> Result<bool, BoxError> {
    let done = |load: Load| done.get(&load).copied().unwrap_or(0);
    let (db, counters) = (&rig.db, &rig.counters);
    let mut ok = true;
    let hot = counters.get(db, 1, "likes").await?;
    let adds = done(Load::PlainAdd) + done(Load::KeyedAdd);
    if hot != adds as i64 {
        eprintln!("FAIL: the hot counter holds {hot}, {adds} adds were acknowledged");
        ok = false;
    }
    let raw = counters.get(db, RAW_OWNER, "raw").await?;
    if raw != done(Load::RawUpsert) as i64 {
        eprintln!(
            "FAIL: the raw counter holds {raw}, {} upserts ran",
            done(Load::RawUpsert)
        );
        ok = false;
    }
    let owners: Vec<i64> = (1..=rig.owners as i64).collect();
    for (key, load) in [("shares", Load::Batch), ("raw_batch", Load::RawBatch)] {
        let totals = counters.get_many(db, &owners, &[key]).await?;
        let stored: i64 = totals.values().flat_map(|keys| keys.values()).sum();
        let items = done(load) * BATCH_ITEMS;
        if stored != items as i64 {
            eprintln!(
                "FAIL: `{key}` holds {stored} over all owners, {items} items were acknowledged"
            );
            ok = false;
        }
    }
    let url = format!("{}/v1/floor/counts:batchGet?owners=1&keys=likes", rig.base);
    let (_, body) = http::call(&rig.client, Method::GET, &url, None, None).await?;
    let answer: Value = serde_json::from_slice(&body)?;
    if answer["counts"]["1"]["likes"].as_i64() != Some(hot) {
        eprintln!("FAIL: the service read {answer}, the library {hot}");
        ok = false;
    }
    Ok(ok)
}
