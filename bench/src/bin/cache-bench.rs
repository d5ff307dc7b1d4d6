//! What the Redis cache of `counter-redis` buys and costs, measured in one
//! run, and whether it ever served a total the database did not hold.
//!
//! One counter table (4 slots) holds 1,000 "read" owners (ids 1 to 1,000)
//! with four keys each (`likes`, `comments`, `views`, `shares`), and
//! `--zipf-owners` owners (ids from 1,000,001) with `likes` only, for the
//! Zipf workload. Then, for each Redis target (the standalone server, then
//! the cluster if `--redis-cluster` is given), with a cache of its own:
//!
//! 1. **reads**: the 1,000 owners × 4 keys in one call, the median of
//!    `--repeats` timings in three modes: `uncached` (`Counters::get_many`,
//!    the database alone), `hit` (the cached read after a warm-up read: one
//!    Redis round trip) and `miss` (the cached read after deleting every
//!    owner outside the timing: leases, one grouped database read, fills).
//!    `hit_speedup` is uncached / hit, `miss_ratio` miss / uncached (what a
//!    cold cache costs over no cache).
//! 2. **bytes_per_owner**: the average Redis `MEMORY USAGE` of 100 cached
//!    read owners' hashes (standalone only; `null` on a cluster, whose
//!    nodes this bench does not connect to one by one).
//! 3. **hit_ratio**: `--zipf-ops` operations by 8 concurrent tasks, each on
//!    an owner drawn by Zipf (s = 1.1) over the Zipf owners, 10 % an `add`
//!    of 1 to `likes` (which deletes the owner's hash after its commit) and
//!    90 % a cached read of it. The first 20 % of the operations warm the
//!    cache; hits / (hits + misses) of the cache's stats over the rest.
//!    Bounded by the operation count and by `--max-secs`.
//! 4. **fills_per_invalidation**: `--herd-rounds` rounds of one `add` to
//!    owner 7, then 64 concurrent cached reads of it: the fills per round,
//!    1.0 when the readers of a deleted owner share one fill, up to 64 for
//!    a thundering herd.
//!
//! Every figure comes with a check. The bench keeps a ledger of everything
//! written (the seed plus each acknowledged `add`): the database must hold
//! exactly it (`totals_ok`). A cached read that differs from the database
//! read is a stale read (`stale_reads`): every read of step 1, every
//! touched owner read through the cache after step 3, every reader of
//! step 4, which must see its round's `add` (read your writes). The run
//! fails (exit 1) unless the totals are right and no read was stale.
//!
//! The keys live under a namespace drawn per run (`b` and 8 hex digits), so
//! runs sharing a Redis never see each other's keys; each target's keys are
//! deleted owner by owner at its end (never a `FLUSHALL`), and anything
//! left behind expires with the cache's 10-minute TTL. The counter table is
//! dropped at the end, and a temporary SQLite file removed.
//!
//! `cargo run --release -p bench --bin cache-bench -- --database-url <URL>
//! --redis-url redis://127.0.0.1:6379 [--redis-cluster <URL>,<URL>,<URL>]
//! [--json <PATH>]`

use std::{
    collections::{BTreeSet, HashMap},
    fmt::Display,
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
use counter_core::{CounterTable, Counters, SlottedCounter};
use counter_redis::{CacheStats, CachedCounters, CountCache, RedisTarget};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend};
use serde::Serialize;

/// Measures the Redis cache in front of a counter table: read times, hit
/// ratio, fills per invalidation and memory, each checked against the
/// database.
///
/// The ranges bound the work before any table is touched.
#[derive(Debug, Parser)]
struct Args {
    /// Database to measure (default: a temporary SQLite file).
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// The standalone Redis server.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// Seed nodes of a Redis Cluster, comma-separated: measured after the
    /// standalone server.
    #[arg(long, value_delimiter = ',')]
    redis_cluster: Vec<String>,
    /// Where to write the results as JSON (one object per Redis target).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Timed reads per read mode, 1 to 1,000 (the median is reported).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1_000))]
    repeats: u64,
    /// Owners of the Zipf workload, 1 to 1,000,000 (each seeded with `likes`).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    zipf_owners: u64,
    /// Operations of the Zipf workload, warm-up included, 5 to 10,000,000.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(5..=10_000_000))]
    zipf_ops: u64,
    /// Rounds of one write and 64 concurrent reads, 1 to 10,000.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    herd_rounds: u64,
    /// Deadline of the Zipf workload in seconds, 1 to 3,600: it stops
    /// there even with operations left.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    max_secs: u64,
}

const TABLE: &str = "cache_bench_counters";
const SLOTS: u16 = 4;
/// The keys of every read owner.
const KEYS: [&str; 4] = ["likes", "comments", "views", "shares"];

/// The same table as an application declares it, so that the timed reads
/// are the ones a page of posts makes: the typed `counts_many`, uncached
/// and cached (each owner's totals straight into its `Counts`).
mod owner {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "cache_bench_owners")]
    #[counter(
        keys(likes, comments, views, shares),
        slots = 4,
        table = "cache_bench_counters"
    )]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// Typed counts as totals by key name, for the checks.
fn by_name(counts: HashMap<i64, owner::counters::Counts>) -> Totals {
    counts
        .into_iter()
        .map(|(id, c)| {
            let totals = [
                ("likes", c.likes),
                ("comments", c.comments),
                ("views", c.views),
                ("shares", c.shares),
            ];
            (
                id,
                totals.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            )
        })
        .collect()
}
/// Read owners: ids 1 to this.
const READ_OWNERS: i64 = 1_000;
/// Zipf owners: ids above this, rank 1 (the most popular) first.
const ZIPF_BASE: i64 = 1_000_000;
const ZIPF_S: f64 = 1.1;
/// The share of the Zipf operations that write.
const WRITE_SHARE: f64 = 0.1;
/// Concurrent tasks of the Zipf workload.
const ZIPF_TASKS: u64 = 8;
/// The owner the herd writes and reads (a read owner).
const HERD_OWNER: i64 = 7;
/// Concurrent readers per herd round.
const HERD_READERS: usize = 64;
/// Read owners whose hash sizes are averaged (ids 1 to this).
const MEMORY_SAMPLE: i64 = 100;
/// Deltas per `add_many` while seeding.
const SEED_CHUNK: usize = 10_000;
/// Owners per read when checking or deleting many owners: well under every
/// backend's bound on bound parameters.
const OWNER_CHUNK: usize = 1_000;
/// The cache's TTL: what a bench that dies before cleaning up leaves behind
/// lives this long at most.
const CACHE_TTL: Duration = Duration::from_secs(600);
/// How many problems of one target are printed.
const SHOWN: u64 = 10;

use bench::BoxError;

/// Totals by owner, then by key name: what an untyped batch read returns.
type Totals = HashMap<i64, HashMap<String, i64>>;

/// The results of one Redis target, in the JSON shape of the issue.
#[derive(Debug, Serialize)]
struct TargetReport {
    backend: &'static str,
    redis: &'static str,
    reads: Vec<ReadTime>,
    hit_ratio: f64,
    fills_per_invalidation: f64,
    bytes_per_owner: Option<f64>,
    stale_reads: u64,
    totals_ok: bool,
    hit_speedup: f64,
    miss_ratio: f64,
}

/// The median time of one read mode.
#[derive(Debug, Serialize)]
struct ReadTime {
    mode: &'static str,
    owners: u64,
    keys: usize,
    ms: f64,
}

impl TargetReport {
    fn read_ms(&self, mode: Mode) -> f64 {
        self.reads
            .iter()
            .find(|r| r.mode == mode.name())
            .map_or(f64::NAN, |r| r.ms)
    }

    fn passed(&self) -> bool {
        self.totals_ok && self.stale_reads == 0
    }
}

/// How a timed read of the read owners is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The database alone, no cache.
    Uncached,
    /// Every owner cached.
    Hit,
    /// Every owner deleted just before: leases, database read, fills.
    Miss,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Uncached, Mode::Hit, Mode::Miss];

    fn name(self) -> &'static str {
        match self {
            Mode::Uncached => "uncached",
            Mode::Hit => "hit",
            Mode::Miss => "miss",
        }
    }
}

/// Everything written to the table: the seed, a function of the owner and
/// key, plus the `likes` each acknowledged `add` wrote. What the database
/// must hold.
#[derive(Debug, Default)]
struct Ledger {
    added: HashMap<i64, i64>,
}

impl Ledger {
    /// The seeded value: 1 to 10 for every key of a read owner (so each
    /// has all four keys, the hash measured in bytes), 1 to 5 for the
    /// `likes` of a Zipf owner.
    fn seed(owner: i64, key: &str) -> i64 {
        if owner > ZIPF_BASE {
            return if key == "likes" { 1 + owner % 5 } else { 0 };
        }
        match KEYS.iter().position(|&k| k == key) {
            Some(k) => 1 + owner * (k as i64 + 1) % 10,
            None => 0,
        }
    }

    fn add(&mut self, owner: i64, likes: i64) {
        *self.added.entry(owner).or_default() += likes;
    }

    fn expected(&self, owner: i64, key: &str) -> i64 {
        let added = if key == "likes" {
            self.added.get(&owner).copied().unwrap_or(0)
        } else {
            0
        };
        Self::seed(owner, key) + added
    }

    /// What a `get_many` of `keys` for `owners` must return.
    fn totals(&self, owners: &[i64], keys: &[&str]) -> Totals {
        owners
            .iter()
            .map(|&owner| {
                let by_key = keys
                    .iter()
                    .map(|&key| (key.to_owned(), self.expected(owner, key)))
                    .collect();
                (owner, by_key)
            })
            .collect()
    }
}

/// What went wrong on one target: reads that differed from the database,
/// and whether the database held the ledger's totals. The first problems
/// are printed, the rest only counted.
#[derive(Debug)]
struct Checks {
    target: &'static str,
    stale_reads: u64,
    totals_ok: bool,
    problems: u64,
}

impl Checks {
    fn new(target: &'static str) -> Self {
        Self {
            target,
            stale_reads: 0,
            totals_ok: true,
            problems: 0,
        }
    }

    fn problem(&mut self, what: impl Display) {
        if self.problems < SHOWN {
            eprintln!("cache-bench: {}: {what}", self.target);
        } else if self.problems == SHOWN {
            eprintln!("cache-bench: {}: more problems, not shown", self.target);
        }
        self.problems += 1;
    }

    /// A read from the database must hold the ledger's totals.
    fn database(&mut self, what: &str, got: &Totals, ledger: &Ledger, keys: &[&str]) {
        let owners: Vec<i64> = got.keys().copied().collect();
        let want = ledger.totals(&owners, keys);
        if let Some(owner) = differing(got, &want).first() {
            self.totals_ok = false;
            self.problem(format_args!(
                "{what}: the database holds {:?} for owner {owner}, {:?} was written",
                got.get(owner),
                want.get(owner)
            ));
        }
    }

    /// A cached read must equal the database read: one stale read if not.
    fn read(&mut self, what: &str, cached: &Totals, db: &Totals) {
        if let Some(owner) = differing(cached, db).first() {
            self.stale_reads += 1;
            self.problem(format_args!(
                "{what}: read {:?} for owner {owner}, the database holds {:?}",
                cached.get(owner),
                db.get(owner)
            ));
        }
    }

    /// Each owner whose cached totals differ from the database's: one stale
    /// read per owner.
    fn owners(&mut self, what: &str, cached: &Totals, db: &Totals) {
        for owner in differing(cached, db) {
            self.stale_reads += 1;
            self.problem(format_args!(
                "{what}: read {:?} for owner {owner}, the database holds {:?}",
                cached.get(&owner),
                db.get(&owner)
            ));
        }
    }
}

/// The owners of either side whose totals differ, in order.
fn differing(a: &Totals, b: &Totals) -> Vec<i64> {
    let owners: BTreeSet<i64> = a.keys().chain(b.keys()).copied().collect();
    owners
        .into_iter()
        .filter(|o| a.get(o) != b.get(o))
        .collect()
}

/// Owner ranks drawn with probability proportional to 1 / rank^s: a few
/// owners take most of the traffic, as popular posts do. A precomputed CDF,
/// binary-searched per draw.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// Ranks 1 to `n` (at least 1).
    fn new(n: usize, s: f64) -> Self {
        let mut cdf = Vec::with_capacity(n);
        let mut sum = 0.0;
        for rank in 1..=n.max(1) {
            sum += (rank as f64).powf(-s);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        Self { cdf }
    }

    /// A rank in 1 to `n`.
    fn sample(&self, rng: &mut impl Rng) -> usize {
        let u: f64 = rng.random();
        // Rounding can leave the last entry a hair under 1.
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1) + 1
    }
}

/// What the Zipf tasks did: operations, owners touched, `likes` added.
#[derive(Debug, Default)]
struct Work {
    ops: u64,
    touched: BTreeSet<i64>,
    added: HashMap<i64, i64>,
}

impl Work {
    fn merge(&mut self, other: Work) {
        self.ops += other.ops;
        self.touched.extend(other.touched);
        for (owner, n) in other.added {
            *self.added.entry(owner).or_default() += n;
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    bench::exit_code("cache-bench", run(Args::parse()).await)
}

async fn run(args: Args) -> Result<bool, BoxError> {
    // Declared before the connection, so dropped after it.
    let (url, _temp) = bench::database_url(args.database_url.as_deref(), "cache-bench");
    let mut options = ConnectOptions::new(&url);
    // The Zipf tasks plus a few concurrent fills.
    options.max_connections(16).sqlx_logging(false);
    let db = Database::connect(options).await?;
    let backend = backend_name(db.get_database_backend())?;
    if db.get_database_backend() == DbBackend::Sqlite {
        db.execute_unprepared("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL")
            .await?;
    }
    let counters = Counters::<i64>::new(CounterTable::new(TABLE)?.with_slots(SLOTS)?);
    counters.drop_table(&db).await?;
    counters.create_table(&db).await?;
    let outcome = bench(&db, &counters, &args, backend).await;
    let dropped = counters.drop_table(&db).await;
    db.close().await?;
    let reports = outcome?;
    dropped?;

    print_table(&reports);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&reports)? + "\n")?;
        println!("wrote {}", path.display());
    }
    let ok = reports.iter().all(TargetReport::passed);
    if !ok {
        eprintln!("cache-bench: a cached read differed from the database, or a total was wrong");
    }
    Ok(ok)
}

/// The backend's name in the JSON.
fn backend_name(backend: DbBackend) -> Result<&'static str, BoxError> {
    match backend {
        DbBackend::Sqlite => Ok("sqlite"),
        DbBackend::Postgres => Ok("postgres"),
        DbBackend::MySql => Ok("mysql"),
        other => Err(format!("unsupported database backend {other:?}").into()),
    }
}

/// Seeds the table, then measures each Redis target in turn.
async fn bench(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    args: &Args,
    backend: &'static str,
) -> Result<Vec<TargetReport>, BoxError> {
    let started = Instant::now();
    seed(db, counters, args.zipf_owners).await?;
    println!(
        "backend {backend}: seeded {READ_OWNERS} owners x {} keys and {} Zipf owners in {:.1} s",
        KEYS.len(),
        args.zipf_owners,
        started.elapsed().as_secs_f64()
    );
    let namespace = format!("b{:08x}", rand::random::<u32>());
    println!("namespace {namespace}");
    let mut targets = vec![("standalone", RedisTarget::standalone(&args.redis_url))];
    if !args.redis_cluster.is_empty() {
        targets.push(("cluster", RedisTarget::cluster(args.redis_cluster.clone())));
    }
    let mut ledger = Ledger::default();
    let mut reports = Vec::new();
    for (redis, target) in targets {
        println!("\n## {redis}");
        let cache = CountCache::builder(target.clone())
            .namespace(&namespace)
            .ttl(CACHE_TTL)
            .build()
            .await?;
        let cached = cache.table(counters);
        let report =
            measure_target(db, &cached, args, &mut ledger, (backend, redis), &target).await;
        print_stats(&cache.stats());
        reports.push(report?);
    }
    Ok(reports)
}

/// Steps 1 to 4 of the module docs on one target, then its keys deleted.
async fn measure_target(
    db: &DatabaseConnection,
    cached: &CachedCounters<i64>,
    args: &Args,
    ledger: &mut Ledger,
    (backend, redis): (&'static str, &'static str),
    target: &RedisTarget,
) -> Result<TargetReport, BoxError> {
    let mut checks = Checks::new(redis);
    let reads = measure_reads(db, cached, args.repeats, ledger, &mut checks).await?;
    let bytes_per_owner = match target {
        RedisTarget::Standalone(url) => {
            bytes_per_owner(db, cached, url, ledger, &mut checks).await?
        }
        // A cluster's keys are spread over its masters.
        _ => None,
    };
    println!(
        "bytes per owner: {}",
        bytes_per_owner.map_or("n/a (cluster)".into(), |b| format!("{b:.0}"))
    );
    let (hit_ratio, touched) = zipf_workload(db, cached, args, ledger, &mut checks).await?;
    let fills = herd(db, cached, args.herd_rounds, ledger, &mut checks).await?;

    // Leave nothing behind: every owner this target may have cached.
    let mut owners: Vec<i64> = (1..=READ_OWNERS).collect();
    owners.extend(touched);
    for chunk in owners.chunks(OWNER_CHUNK) {
        cached.invalidate(chunk).await;
    }
    let mut report = TargetReport {
        backend,
        redis,
        reads,
        hit_ratio,
        fills_per_invalidation: fills,
        bytes_per_owner,
        stale_reads: checks.stale_reads,
        totals_ok: checks.totals_ok,
        hit_speedup: 0.0,
        miss_ratio: 0.0,
    };
    let uncached = report.read_ms(Mode::Uncached);
    report.hit_speedup = uncached / report.read_ms(Mode::Hit);
    report.miss_ratio = report.read_ms(Mode::Miss) / uncached;
    Ok(report)
}

/// The read owners' four keys and the Zipf owners' `likes`, with
/// `add_many` a chunk at a time.
async fn seed(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    zipf_owners: u64,
) -> Result<(), BoxError> {
    let read =
        (1..=READ_OWNERS).flat_map(|owner| KEYS.map(|key| (owner, key, Ledger::seed(owner, key))));
    // Bounded by the CLI range: at most 10^6.
    let zipf = (1..=zipf_owners as i64).map(|rank| {
        let owner = ZIPF_BASE + rank;
        (owner, "likes", Ledger::seed(owner, "likes"))
    });
    let mut deltas = read.chain(zipf);
    loop {
        let chunk: Vec<(i64, &str, i64)> = deltas.by_ref().take(SEED_CHUNK).collect();
        if chunk.is_empty() {
            return Ok(());
        }
        counters.add_many(db, chunk).await?;
    }
}

/// Step 1: the median time of each [`Mode`] reading the read owners' four
/// keys, each read checked against the database.
async fn measure_reads(
    db: &DatabaseConnection,
    cached: &CachedCounters<i64>,
    repeats: u64,
    ledger: &Ledger,
    checks: &mut Checks,
) -> Result<Vec<ReadTime>, BoxError> {
    let owners: Vec<i64> = (1..=READ_OWNERS).collect();
    let truth = cached.counters().get_many(db, &owners, &KEYS).await?;
    checks.database("reads", &truth, ledger, &KEYS);
    let typed = cached.cache().table(owner::Entity::counters());
    let mut times = Vec::new();
    for mode in Mode::ALL {
        if mode == Mode::Hit {
            let warm = cached.get_many(db, &owners, &KEYS).await?;
            checks.read("warm-up read", &warm, &truth);
        }
        let mut ms = Vec::new();
        for _ in 0..repeats {
            // A miss stores its fills in the background: each timed read
            // starts with none of them still running.
            settle(cached.cache()).await;
            if mode == Mode::Miss {
                cached.invalidate(&owners).await;
            }
            let started = Instant::now();
            let got = match mode {
                Mode::Uncached => owner::Entity::counters().counts_many(db, &owners).await?,
                Mode::Hit | Mode::Miss => typed.counts_many(db, &owners).await?,
            };
            ms.push(started.elapsed().as_secs_f64() * 1e3);
            let got = by_name(got);
            if mode == Mode::Uncached {
                // Nothing written since `truth`: the database must agree
                // with itself.
                checks.database("uncached read", &got, ledger, &KEYS);
            } else {
                checks.read(&format!("{} read", mode.name()), &got, &truth);
            }
        }
        let median = median(ms);
        println!("read {:>8}: {median:.2} ms", mode.name());
        times.push(ReadTime {
            mode: mode.name(),
            owners: READ_OWNERS as u64,
            keys: KEYS.len(),
            ms: median,
        });
    }
    Ok(times)
}

/// Waits (at most 10 s) until no fill is storing in the background and no
/// deletion is owed.
async fn settle(cache: &counter_redis::CountCache) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let stats = cache.stats();
        if stats.fills_in_flight == 0 && stats.invalidations_pending == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Step 2: the average `MEMORY USAGE` of the sample owners' hashes, read
/// through the cache first so that they are there; `None` if none is.
async fn bytes_per_owner(
    db: &DatabaseConnection,
    cached: &CachedCounters<i64>,
    url: &str,
    ledger: &Ledger,
    checks: &mut Checks,
) -> Result<Option<f64>, BoxError> {
    let owners: Vec<i64> = (1..=MEMORY_SAMPLE).collect();
    let got = cached.get_many(db, &owners, &KEYS).await?;
    checks.read("memory sample read", &got, &ledger.totals(&owners, &KEYS));
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let namespace = cached.cache().namespace();
    let (mut bytes, mut counted) = (0u64, 0u64);
    for owner in owners {
        let key = format!("sc2:{namespace}:{{{TABLE}:{owner}}}");
        let usage: Option<u64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&key)
            .query_async(&mut conn)
            .await?;
        if let Some(usage) = usage {
            bytes += usage;
            counted += 1;
        }
    }
    Ok((counted > 0).then(|| bytes as f64 / counted as f64))
}

/// Step 3: the hit ratio of the measured part of the Zipf workload, then
/// every touched owner read through the cache and from the database.
/// Returns the ratio and the touched owners.
async fn zipf_workload(
    db: &DatabaseConnection,
    cached: &CachedCounters<i64>,
    args: &Args,
    ledger: &mut Ledger,
    checks: &mut Checks,
) -> Result<(f64, BTreeSet<i64>), BoxError> {
    let zipf = Arc::new(Zipf::new(args.zipf_owners as usize, ZIPF_S));
    let deadline = Instant::now() + Duration::from_secs(args.max_secs);
    let warmup = args.zipf_ops / 5;
    let mut work = run_zipf_ops(db, cached, &zipf, warmup, deadline, 0).await?;
    let before = cached.cache().stats();
    let started = Instant::now();
    let measured = run_zipf_ops(db, cached, &zipf, args.zipf_ops - warmup, deadline, 1).await?;
    let secs = started.elapsed().as_secs_f64();
    let after = cached.cache().stats();
    let measured_ops = measured.ops;
    work.merge(measured);
    for (&owner, &n) in &work.added {
        ledger.add(owner, n);
    }

    let hits = after.hits.saturating_sub(before.hits);
    let misses = after.misses.saturating_sub(before.misses);
    let hit_ratio = if hits + misses == 0 {
        0.0
    } else {
        hits as f64 / (hits + misses) as f64
    };
    let cut = if work.ops < args.zipf_ops {
        format!(
            " (stopped by --max-secs after {} of {} ops)",
            work.ops, args.zipf_ops
        )
    } else {
        String::new()
    };
    println!(
        "zipf: {measured_ops} measured ops in {secs:.2} s, hit ratio {hit_ratio:.3}, {} owners touched{cut}",
        work.touched.len()
    );

    let touched: Vec<i64> = work.touched.iter().copied().collect();
    for chunk in touched.chunks(OWNER_CHUNK) {
        let from_cache = cached.get_many(db, chunk, &["likes"]).await?;
        let from_db = cached.counters().get_many(db, chunk, &["likes"]).await?;
        checks.owners("zipf owner after the workload", &from_cache, &from_db);
        checks.database(
            "zipf owner after the workload",
            &from_db,
            ledger,
            &["likes"],
        );
    }
    Ok((hit_ratio, work.touched))
}

/// Up to `ops` Zipf operations by [`ZIPF_TASKS`] tasks, claimed one at a
/// time from a shared count, stopping at `deadline`; `phase` varies the
/// random seeds.
async fn run_zipf_ops(
    db: &DatabaseConnection,
    cached: &CachedCounters<i64>,
    zipf: &Arc<Zipf>,
    ops: u64,
    deadline: Instant,
    phase: u64,
) -> Result<Work, BoxError> {
    let claimed = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..ZIPF_TASKS)
        .map(|task| {
            let (db, cached, zipf, claimed) =
                (db.clone(), cached.clone(), zipf.clone(), claimed.clone());
            let mut rng = StdRng::seed_from_u64(phase * ZIPF_TASKS + task);
            tokio::spawn(async move {
                let mut work = Work::default();
                while Instant::now() < deadline && claimed.fetch_add(1, Ordering::SeqCst) < ops {
                    let owner = ZIPF_BASE + zipf.sample(&mut rng) as i64;
                    work.touched.insert(owner);
                    if rng.random_bool(WRITE_SHARE) {
                        cached.add(&db, owner, "likes", 1).await?;
                        *work.added.entry(owner).or_default() += 1;
                    } else {
                        cached.get_many(&db, &[owner], &["likes"]).await?;
                    }
                    work.ops += 1;
                }
                Ok::<_, BoxError>(work)
            })
        })
        .collect();
    let mut work = Work::default();
    for task in tasks {
        work.merge(task.await??);
    }
    Ok(work)
}

/// Step 4: `rounds` rounds of one write to [`HERD_OWNER`] and
/// [`HERD_READERS`] concurrent cached reads of it, each of which must see
/// the write. Returns the fills per round.
async fn herd(
    db: &DatabaseConnection,
    cached: &CachedCounters<i64>,
    rounds: u64,
    ledger: &mut Ledger,
    checks: &mut Checks,
) -> Result<f64, BoxError> {
    let cached = Arc::new(cached.clone());
    let before = cached.cache().stats();
    let started = Instant::now();
    for round in 1..=rounds {
        cached.add(db, HERD_OWNER, "likes", 1).await?;
        ledger.add(HERD_OWNER, 1);
        let want = ledger.expected(HERD_OWNER, "likes");
        let readers: Vec<_> = (0..HERD_READERS)
            .map(|_| {
                let (db, cached) = (db.clone(), cached.clone());
                tokio::spawn(async move { cached.get_many(&db, &[HERD_OWNER], &["likes"]).await })
            })
            .collect();
        for reader in readers {
            let totals = reader.await??;
            let seen = totals
                .get(&HERD_OWNER)
                .and_then(|t| t.get("likes"))
                .copied();
            if seen != Some(want) {
                checks.stale_reads += 1;
                checks.problem(format_args!(
                    "herd round {round}: a reader saw {seen:?}, the round's total is {want}"
                ));
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let fills = cached.cache().stats().fills.saturating_sub(before.fills);
    let from_db = cached
        .counters()
        .get_many(db, &[HERD_OWNER], &["likes"])
        .await?;
    checks.database("herd owner", &from_db, ledger, &["likes"]);
    let per_round = fills as f64 / rounds as f64;
    println!(
        "herd: {rounds} rounds x {HERD_READERS} readers in {secs:.2} s, {per_round:.2} fills per invalidation"
    );
    Ok(per_round)
}

/// The cache's counters over the whole target: where reads went besides
/// hits, which explains a poor figure (Redis errors, lost fills).
fn print_stats(stats: &CacheStats) {
    println!(
        "cache stats: hits {}, misses {}, fills {}, fill_cas_lost {}, lease_waits {}, \
         uncached_reads {}, db_fallbacks {}, redis_errors {}, invalidations {}",
        stats.hits,
        stats.misses,
        stats.fills,
        stats.fill_cas_lost,
        stats.lease_waits,
        stats.uncached_reads,
        stats.db_fallbacks,
        stats.redis_errors,
        stats.invalidations,
    );
    if stats.redis_errors > 0 || stats.db_fallbacks > 0 {
        eprintln!(
            "cache-bench: warning: Redis failed {} times ({} owners read from the database instead): the figures measure fallbacks too",
            stats.redis_errors, stats.db_fallbacks
        );
    }
}

/// One line per target, the figures of the JSON.
fn print_table(reports: &[TargetReport]) {
    println!(
        "\n| backend | redis | uncached ms | hit ms | miss ms | hit speedup | miss / uncached | hit ratio | fills / invalidation | bytes / owner | stale reads | totals |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in reports {
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.1}x | {:.2} | {:.3} | {:.2} | {} | {} | {} |",
            r.backend,
            r.redis,
            r.read_ms(Mode::Uncached),
            r.read_ms(Mode::Hit),
            r.read_ms(Mode::Miss),
            r.hit_speedup,
            r.miss_ratio,
            r.hit_ratio,
            r.fills_per_invalidation,
            r.bytes_per_owner
                .map_or("n/a".to_owned(), |b| format!("{b:.0}")),
            r.stale_reads,
            if r.totals_ok { "ok" } else { "WRONG" },
        );
    }
}
