//! The cache tier beside its raw limits: an all-hit batch read of 1,000
//! owners x 4 keys through `counter-redis` against one raw `MGET` of the
//! same keys, the packed values decoded by hand into the same map
//! (`cache_read`); and the service's cached `counts:batchGet` of the same
//! owners over HTTP against the same read in process
//! (`service_cached_read`).

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use bench::{BoxError, http, stats::median};
use counter_core::{CounterTable, Counters, DeltaBatch};
use counter_redis::{CountCache, RedisTarget};
use sea_orm::DatabaseConnection;

use crate::{Args, Limit, Section};

const TABLE: &str = "limits_cache";
const KEYS: [&str; 4] = ["likes", "comments", "views", "shares"];

type Totals = HashMap<i64, HashMap<String, i64>>;

/// The seeded total of `key` of `owner`: distinct per owner and key.
fn seeded(owner: i64, key: usize) -> i64 {
    owner * 10 + key as i64 + 1
}

pub(crate) async fn run(
    args: &Args,
    db: &DatabaseConnection,
    url: &str,
    redis_url: &str,
) -> Result<Section, BoxError> {
    let counters = Counters::<i64>::new(CounterTable::new(TABLE)?.with_slots(4)?);
    let _ = counters.drop_table(db).await;
    counters.create_table(db).await?;
    let owners: Vec<i64> = (1..=args.owners as i64).collect();
    let mut seed = DeltaBatch::new();
    for &owner in &owners {
        for (k, key) in KEYS.iter().enumerate() {
            seed.add(&counters, owner, *key, seeded(owner, k))?;
        }
    }
    seed.apply(db).await?;
    let expected: Totals = owners
        .iter()
        .map(|&owner| {
            let keys = KEYS
                .iter()
                .enumerate()
                .map(|(k, key)| ((*key).to_owned(), seeded(owner, k)));
            (owner, keys.collect())
        })
        .collect();

    let namespace = format!("limits{}", std::process::id());
    let cache = CountCache::builder(RedisTarget::standalone(redis_url))
        .namespace(namespace.clone())
        .ttl(Duration::from_secs(600))
        .build()
        .await?;
    let cached = cache.table(&counters);
    // Filled by a first read (the fills are stored in the background),
    // then read until a read is all hits.
    let hits = || cache.stats().hits;
    let mut warm = false;
    for _ in 0..100 {
        let before = hits();
        cached.get_many(db, &owners, &KEYS).await?;
        if hits() - before == owners.len() as u64 {
            warm = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let client = redis::Client::open(redis_url)?;
    let mut redis = client.get_multiplexed_async_connection().await?;
    let keys: Vec<String> = owners
        .iter()
        .map(|owner| format!("sc2:{namespace}:{{{TABLE}:{owner}}}"))
        .collect();
    let mut section = Section {
        ok: warm,
        ..Section::default()
    };
    if !warm {
        eprintln!("FAIL: the cache never answered a read of every owner from Redis");
    }
    let (mut own, mut raw) = (Vec::new(), Vec::new());
    // Each answer is checked after its timing stops (a comparison of
    // 1,000 maps would weigh on both sides).
    for _ in 0..args.rounds {
        let before = hits();
        let mut answers = Vec::with_capacity(args.reads as usize);
        let started = Instant::now();
        for _ in 0..args.reads {
            answers.push(cached.get_many(db, &owners, &KEYS).await?);
        }
        own.push(started.elapsed().as_secs_f64() * 1e6 / args.reads as f64);
        section.ok &= hits() - before == owners.len() as u64 * args.reads;
        section.ok &= answers.drain(..).all(|got| got == expected);
        let started = Instant::now();
        for _ in 0..args.reads {
            let values: Vec<Option<Vec<u8>>> = redis::cmd("MGET")
                .arg(&keys)
                .query_async(&mut redis)
                .await?;
            answers.push(decode(&owners, &values));
        }
        raw.push(started.elapsed().as_secs_f64() * 1e6 / args.reads as f64);
        section.ok &= answers.into_iter().all(|got| got == expected);
    }
    if !section.ok {
        eprintln!(
            "FAIL: a cached read was not all hits, or a read differed from the seeded totals"
        );
    }
    section.limits.push((
        "cache_read",
        Limit {
            own_us: median(own),
            raw_us: median(raw),
        },
    ));
    let service = service_read(
        args,
        db,
        &cached,
        &owners,
        &expected,
        (url, &namespace, redis_url),
    )
    .await?;
    section.ok &= service.is_some();
    section
        .limits
        .extend(service.map(|limit| ("service_cached_read", limit)));
    let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut redis).await?;
    let _ = counters.drop_table(db).await;
    Ok(section)
}

/// The service's cached batch get over HTTP (a service on the same table
/// and cache namespace) against `cached.get_many` in process, interleaved;
/// `None` (and a message) if an answer differs from the seeded totals.
async fn service_read(
    args: &Args,
    db: &DatabaseConnection,
    cached: &counter_redis::CachedCounters<i64>,
    owners: &[i64],
    expected: &Totals,
    (url, namespace, redis_url): (&str, &str, &str),
) -> Result<Option<Limit>, BoxError> {
    let keys: String = KEYS.iter().map(|k| format!("keys.{k} = {{}}\n")).collect();
    let config = format!(
        "[server]\nopen = true\nmax_batch_keys = 4\n[database]\nurl = \"{url}\"\nmax_connections = 8\n\
         [cache]\nredis_url = \"{redis_url}\"\nnamespace = \"{namespace}\"\n\n\
         [namespaces.cached]\ntable = \"{TABLE}\"\nowner = \"integer\"\nslots = 4\n{keys}"
    );
    let base = http::serve(&config, "limits").await?;
    let client = http::client(8);
    let read_url = format!("{base}/v1/cached/counts:batchGet");
    let body = serde_json::json!({"owners": owners, "keys": KEYS}).to_string();
    let (mut own, mut in_process) = (Vec::new(), Vec::new());
    // Timed until an answer's bytes are in (what the service costs); each
    // checked after its timing stops.
    for _ in 0..args.rounds {
        let mut bodies = Vec::with_capacity(args.reads as usize);
        let started = Instant::now();
        for _ in 0..args.reads {
            bodies.push(http::post_bytes(&client, &read_url, body.clone()).await?);
        }
        own.push(started.elapsed().as_secs_f64() * 1e6 / args.reads as f64);
        for bytes in bodies {
            let answer: serde_json::Value = serde_json::from_slice(&bytes)?;
            let got: Totals = owners
                .iter()
                .map(|owner| {
                    let counts = KEYS.iter().map(|key| {
                        let total = answer["counts"][owner.to_string()][key]
                            .as_i64()
                            .unwrap_or(-1);
                        ((*key).to_owned(), total)
                    });
                    (*owner, counts.collect())
                })
                .collect();
            if &got != expected {
                eprintln!("FAIL: the service's cached batch get differs from the seeded totals");
                return Ok(None);
            }
        }
        let mut answers = Vec::with_capacity(args.reads as usize);
        let started = Instant::now();
        for _ in 0..args.reads {
            answers.push(cached.get_many(db, owners, &KEYS).await?);
        }
        in_process.push(started.elapsed().as_secs_f64() * 1e6 / args.reads as f64);
        if answers.iter().any(|got| got != expected) {
            eprintln!("FAIL: the cached read in process differs from the seeded totals");
            return Ok(None);
        }
    }
    Ok(Some(Limit {
        own_us: median(own),
        raw_us: median(in_process),
    }))
}

/// The packed values of `owners` (`c1|likes=3,views=7`) decoded by hand.
fn decode(owners: &[i64], values: &[Option<Vec<u8>>]) -> Totals {
    let mut totals = Totals::with_capacity(owners.len());
    for (owner, value) in owners.iter().zip(values) {
        let Some(body) = value.as_deref().and_then(|v| v.strip_prefix(b"c1|")) else {
            continue;
        };
        let mut counts = HashMap::with_capacity(KEYS.len());
        for pair in body.split(|b| *b == b',').filter(|p| !p.is_empty()) {
            let mut parts = pair.splitn(2, |b| *b == b'=');
            let (Some(key), Some(total)) = (parts.next(), parts.next()) else {
                continue;
            };
            let total = std::str::from_utf8(total)
                .ok()
                .and_then(|t| t.parse().ok())
                .unwrap_or(0);
            counts.insert(String::from_utf8_lossy(key).into_owned(), total);
        }
        totals.insert(*owner, counts);
    }
    totals
}
