//! Model-based property tests: random sequences of counter operations, run
//! against the database and against an in-memory model, compared after every
//! step.
//!
//! Each case is 1 to 40 operations over three `i64` owners (`1`, `-42` and
//! `i64::MAX`) and three keys: `likes` (one slot, so its single slot row *is*
//! its total and an overflowing sum is exactly predictable; deltas include
//! `i64::MIN`, `i64::MAX` and random 64-bit values), `views` (four slots,
//! counted per UTC day: `add_at` on five fixed days of June 2025, "now" for
//! the rest) and `recounted` (four slots, repaired from a truth table the
//! sequence edits). The operations: direct `add` / `increment` /
//! `decrement` / `add_at`, `add_many`, `DeltaBatch` (with folded duplicates
//! and net zeros), transactions of adds and batches (`apply` and
//! `apply_in`) committed or rolled back, buffered adds through a
//! `CounterBuffer` whose interval never fires plus explicit flushes,
//! compaction (scoped by owners, keys, `min_rows`, batch size, with or
//! without buckets),
//! truth-table edits and recounts (dry or not, keyset or by owner list).
//!
//! The model predicts every outcome: which calls must fail with
//! `CounterError::Overflow` and leave everything unchanged (a fold or a slot
//! value leaving `i64`; a buffered delta the database refuses at flush is
//! set aside and counted in `rejected_deltas`), each batch's `BatchReport`,
//! the exact rows a compaction leaves and its report, and each recount's
//! drift report. After every step it checks `get`, `get_many` (all owners x
//! keys, zero-filled), `get_all_keys`, the day series and the recent range
//! of `views`, `CounterBuffer::get` (stored + pending), `unflushed` and the
//! buffer's `pending_adds` / `rejected_deltas`; inside a transaction it
//! checks read-your-writes through the transaction.
//!
//! With `COUNTER_TEST_REDIS_URL` set, every case also reads every owner and
//! key through the cache tier (`counter-redis`, on a private `redis-server`)
//! after every step and compares with the model, while Redis is hurt at
//! fixed steps (FLUSHALL, every connection cut, the server restarted empty):
//! see [`Cached`].
//!
//! `model_sequences` runs on every backend (SQLite with
//! `COUNTER_MODEL_CASES` cases, default 64; PostgreSQL and MariaDB with at
//! most [`SERVER_CASES`], or `COUNTER_MODEL_SERVER_CASES`);
//! `COUNTER_MODEL_SEED` replays a run (each backend's test prints the seed it
//! was given; SQLite draws from the seed, PostgreSQL from seed + 1, MySQL
//! from seed + 2). A failure prints the shrunk sequence as Rust, ready to paste
//! into the `regressions` module below, which holds hand-written sequences
//! of the trickiest interleavings.

use std::{
    cell::Cell,
    collections::{BTreeMap, BTreeSet},
    fmt,
    time::Duration,
};

use chrono::{DateTime, TimeZone, Utc};
use counter_core::{
    BatchReport, Compact, CompactStats, CounterBuffer, CounterError, CounterTable, Counters,
    DeltaBatch, Drift, FlushLedger, Reconcile, Truth, Window,
};
use counter_redis::{CachedCounters, RedisTarget};
use counter_tests::{
    Backend, TestDb, backend_test, env_number, figures,
    proxy::Proxy,
    redis::{PrivateRedis, namespace, shared_url, test_cache},
    sql::Sql,
};
use proptest::{
    collection::vec,
    option,
    prelude::*,
    test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner},
};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, TransactionTrait,
    sea_query::{Alias, Expr, ExprTrait, Query},
};

/// The counter table; its day buckets are in [`BUCKETS`].
const TABLE: &str = "model_counters";
const BUCKETS: &str = "model_counters_buckets";
/// The truth of `recounted`: `(owner_id, n)`.
const TRUTH: &str = "model_truth";
/// The owners, by index: an ordinary id, a negative one, the largest.
const OWNERS: [i64; 3] = [1, -42, i64::MAX];
/// Fixed past days `add_at` writes to (see [`day_at`]).
const DAYS: u8 = 5;
/// Cases on PostgreSQL and MariaDB (unless `COUNTER_MODEL_SERVER_CASES`
/// says otherwise). A server case costs three to four times a SQLite one
/// (measured in a debug build on a loaded 2-core machine: ~65 ms on
/// SQLite, ~200 ms on each server; every step is a dozen round trips and
/// each case resets three tables and starts a buffer), so the servers run a
/// bounded sample of the same generator while SQLite carries the breadth:
/// 64 + 24 + 24 cases keep the whole test near 15 s, far inside its minute
/// of CI budget. Deeper runs: raise both variables (1,000 SQLite and 400
/// server cases per backend have been run clean).
const SERVER_CASES: u32 = 24;
/// Safety net for flushes: never reached on a healthy run.
const PATIENCE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Key {
    Likes,
    Views,
    Recounted,
}

impl Key {
    const ALL: [Key; 3] = [Key::Likes, Key::Views, Key::Recounted];

    fn name(self) -> &'static str {
        match self {
            Key::Likes => "likes",
            Key::Views => "views",
            Key::Recounted => "recounted",
        }
    }

    fn named(name: &str) -> Option<Key> {
        Key::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// One delta of a batch: owner index, key, delta, and the fixed day it
/// happened on (`None`: now).
type Item = (usize, Key, i64, Option<u8>);

/// An operation of a sequence. Its `Debug` form, with `[` read as `vec![`,
/// is the Rust that builds it (see [`pasteable`]).
#[derive(Debug, Clone)]
enum Op {
    Add {
        owner: usize,
        key: Key,
        delta: i64,
    },
    Increment {
        owner: usize,
        key: Key,
    },
    Decrement {
        owner: usize,
        key: Key,
    },
    AddAt {
        owner: usize,
        key: Key,
        delta: i64,
        day: u8,
    },
    AddMany(Vec<(usize, Key, i64)>),
    Batch(Vec<Item>),
    Txn {
        ops: Vec<TxnOp>,
        commit: bool,
    },
    Buffered {
        owner: usize,
        key: Key,
        delta: i64,
    },
    Flush,
    Compaction {
        owners: Option<Vec<usize>>,
        keys: Option<Vec<Key>>,
        min_rows: usize,
        /// Rows (or, with `owners`, owners) per batch transaction.
        batch_rows: usize,
        buckets: bool,
    },
    SetTruth {
        owner: usize,
        n: Option<i64>,
    },
    Recount {
        owners: Option<Vec<usize>>,
        batch_size: usize,
        dry_run: bool,
    },
}

/// An operation inside a transaction.
#[derive(Debug, Clone)]
enum TxnOp {
    Write {
        owner: usize,
        key: Key,
        delta: i64,
    },
    /// `DeltaBatch::apply(&txn)`.
    Apply(Vec<Item>),
    /// `DeltaBatch::apply_in(&txn)`.
    ApplyIn(Vec<Item>),
}

/// A sequence as Rust source: `Debug` prints vectors as `[..]`, and no
/// other `[` appears in it.
fn pasteable(ops: &[Op]) -> String {
    format!("{ops:?}").replace('[', "vec![")
}

// ---------------------------------------------------------------- strategies

fn owner() -> impl Strategy<Value = usize> {
    0..OWNERS.len()
}

fn key() -> impl Strategy<Value = Key> {
    prop_oneof![Just(Key::Likes), Just(Key::Views), Just(Key::Recounted)]
}

/// `likes` has one slot: anything goes, extremes included. The other keys
/// have four slots, whose rows the model does not track, so their deltas
/// stay far from `i64`'s bounds.
fn delta(key: Key) -> BoxedStrategy<i64> {
    match key {
        Key::Likes => prop_oneof![
            5 => -5i64..=5,
            2 => any::<i64>(),
            1 => Just(i64::MAX),
            1 => Just(i64::MIN),
            1 => (i64::MAX - 3)..=i64::MAX,
            1 => i64::MIN..=(i64::MIN + 3),
        ]
        .boxed(),
        Key::Views | Key::Recounted => (-1000i64..=1000).boxed(),
    }
}

fn keyed() -> impl Strategy<Value = (Key, i64)> {
    key().prop_flat_map(|k| (Just(k), delta(k)))
}

fn item() -> impl Strategy<Value = Item> {
    (owner(), keyed(), option::of(0..DAYS)).prop_map(|(o, (k, d), day)| (o, k, d, day))
}

/// 1 to 5 deltas, sometimes followed by a pair that folds to nothing.
fn items() -> impl Strategy<Value = Vec<Item>> {
    (vec(item(), 1..6), option::of((owner(), key(), 1i64..100))).prop_map(|(mut items, pair)| {
        if let Some((o, k, d)) = pair {
            items.extend([(o, k, d, None), (o, k, -d, None)]);
        }
        items
    })
}

fn txn_op() -> impl Strategy<Value = TxnOp> {
    prop_oneof![
        (owner(), keyed()).prop_map(|(owner, (key, delta))| TxnOp::Write { owner, key, delta }),
        items().prop_map(TxnOp::Apply),
        items().prop_map(TxnOp::ApplyIn),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (owner(), keyed())
            .prop_map(|(owner, (key, delta))| Op::Add { owner, key, delta })
            .boxed(),
        2 => (owner(), key())
            .prop_map(|(owner, key)| Op::Increment { owner, key })
            .boxed(),
        2 => (owner(), key())
            .prop_map(|(owner, key)| Op::Decrement { owner, key })
            .boxed(),
        3 => (owner(), keyed(), 0..DAYS)
            .prop_map(|(owner, (key, delta), day)| Op::AddAt { owner, key, delta, day })
            .boxed(),
        3 => vec((owner(), keyed()).prop_map(|(o, (k, d))| (o, k, d)), 1..6)
            .prop_map(Op::AddMany)
            .boxed(),
        3 => items().prop_map(Op::Batch).boxed(),
        3 => (vec(txn_op(), 1..4), any::<bool>())
            .prop_map(|(ops, commit)| Op::Txn { ops, commit })
            .boxed(),
        6 => (owner(), keyed())
            .prop_map(|(owner, (key, delta))| Op::Buffered { owner, key, delta })
            .boxed(),
        2 => Just(Op::Flush).boxed(),
        2 => (
            option::of(vec(owner(), 1..3)),
            option::of(vec(key(), 1..3)),
            2usize..=4,
            prop_oneof![Just(1000usize), 1usize..=3],
            any::<bool>(),
        )
            .prop_map(|(owners, keys, min_rows, batch_rows, buckets)| Op::Compaction {
                owners,
                keys,
                min_rows,
                batch_rows,
                buckets,
            })
            .boxed(),
        3 => (owner(), option::of(-3i64..60))
            .prop_map(|(owner, n)| Op::SetTruth { owner, n })
            .boxed(),
        2 => (option::of(vec(owner(), 1..4)), 1usize..=3, prop::bool::weighted(0.25))
            .prop_map(|(owners, batch_size, dry_run)| Op::Recount {
                owners,
                batch_size,
                dry_run,
            })
            .boxed(),
    ]
}

fn sequence() -> impl Strategy<Value = Vec<Op>> {
    vec(op(), 1..=40)
}

// --------------------------------------------------------------------- model

/// Where a `views` delta is counted: one of the fixed days, or the bucket
/// of now (whichever day that is: reads of it span a week around now).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Bucket {
    Day(u8),
    Recent,
}

/// What the database should hold, and what the buffer holds.
#[derive(Debug, Clone, Default)]
struct Model {
    stored: BTreeMap<(usize, Key), i64>,
    buckets: BTreeMap<(usize, Bucket), i64>,
    /// The buffer's unflushed delta per counter.
    pending: BTreeMap<(usize, Key), i64>,
    /// Buffered adds accepted since the last flush.
    pending_adds: u64,
    truth: BTreeMap<usize, i64>,
    /// Buffered deltas the database refused at a flush.
    rejected: u64,
}

/// Deltas folded as a `DeltaBatch` folds them.
#[derive(Debug, Default)]
struct Folded {
    totals: BTreeMap<(usize, Key), i64>,
    buckets: BTreeMap<(usize, Bucket), i64>,
}

impl Folded {
    /// `None` if a fold leaves `i64` (the batch refuses the delta).
    fn of(items: &[Item]) -> Option<Folded> {
        let mut folded = Folded::default();
        for &(o, k, d, day) in items {
            let total = folded.totals.entry((o, k)).or_default();
            *total = total.checked_add(d)?;
            if k == Key::Views {
                let bucket = day.map_or(Bucket::Recent, Bucket::Day);
                let sum = folded.buckets.entry((o, bucket)).or_default();
                *sum = sum.checked_add(d)?;
            }
        }
        Some(folded)
    }

    fn one(owner: usize, key: Key, delta: i64, day: Option<u8>) -> Folded {
        Folded::of(&[(owner, key, delta, day)]).expect("one delta always folds")
    }

    /// What sending it reports: net zeros dropped, one statement per table.
    fn outcome(&self) -> BatchReport {
        let totals = self.totals.values().filter(|d| **d != 0).count();
        let buckets = self.buckets.values().filter(|d| **d != 0).count();
        BatchReport {
            rows: totals + buckets,
            statements: usize::from(totals > 0) + usize::from(buckets > 0),
            sketches: 0,
        }
    }
}

/// `map[k] += d`, checked, for every entry of `deltas`, all or nothing.
fn add_all<K: Ord + Copy>(
    map: &BTreeMap<K, i64>,
    deltas: &BTreeMap<K, i64>,
) -> Option<BTreeMap<K, i64>> {
    let mut next = map.clone();
    for (&k, &d) in deltas.iter().filter(|(_, d)| **d != 0) {
        let sum = next.get(&k).copied().unwrap_or(0).checked_add(d)?;
        next.insert(k, sum);
    }
    Some(next)
}

impl Model {
    fn total(&self, owner: usize, key: Key) -> i64 {
        self.stored.get(&(owner, key)).copied().unwrap_or(0)
    }

    fn bucket(&self, owner: usize, bucket: Bucket) -> i64 {
        self.buckets.get(&(owner, bucket)).copied().unwrap_or(0)
    }

    fn pending(&self, owner: usize, key: Key) -> i64 {
        self.pending.get(&(owner, key)).copied().unwrap_or(0)
    }

    /// The model after `folded` is stored, or `None` if a slot value would
    /// leave `i64` (only `likes` can: its one slot row is its total).
    fn applied(&self, folded: &Folded) -> Option<Model> {
        Some(Model {
            stored: add_all(&self.stored, &folded.totals)?,
            buckets: add_all(&self.buckets, &folded.buckets)?,
            ..self.clone()
        })
    }

    /// A flush: each pending counter stored, or rejected if the database
    /// cannot store it (the others are stored anyway).
    fn flush(&mut self) {
        for ((o, k), p) in std::mem::take(&mut self.pending) {
            match self.applied(&Folded::one(o, k, p, None)) {
                Some(next) => {
                    *self = Model {
                        pending: BTreeMap::new(),
                        ..next
                    }
                }
                None => self.rejected += 1,
            }
        }
        self.pending_adds = 0;
    }
}

/// Owner indices in the order of their ids, without duplicates.
fn by_id(owners: impl IntoIterator<Item = usize>) -> Vec<usize> {
    let set: BTreeSet<(i64, usize)> = owners.into_iter().map(|o| (OWNERS[o], o)).collect();
    set.into_iter().map(|(_, o)| o).collect()
}

// ------------------------------------------------------------------- harness

fn model_counters() -> Counters<i64> {
    Counters::new(
        CounterTable::new(TABLE)
            .and_then(|t| t.with_slots(4))
            .and_then(|t| t.with_key_slots("likes", 1))
            .and_then(|t| t.with_key_window("views", Window::Day))
            .expect("a valid table"),
    )
}

/// Noon-ish of fixed day `day` (June 2025: never "now").
fn day_at(day: u8) -> DateTime<Utc> {
    first_day() + chrono::Duration::days(day.into()) + chrono::Duration::hours(13)
}

fn first_day() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 6, 1, 0, 0, 0).unwrap()
}

/// The tables of a backend, created once.
async fn setup(t: &TestDb) {
    model_counters()
        .create_table(&t.db)
        .await
        .expect("the counter tables");
    t.db.execute_unprepared(&format!(
        "CREATE TABLE {TRUTH} (owner_id BIGINT PRIMARY KEY, n BIGINT NOT NULL)"
    ))
    .await
    .expect("the truth table");
    FlushLedger::default()
        .create_table(&t.db)
        .await
        .expect("the ledger");
}

/// What a run did, for the figures.
#[derive(Default)]
struct Tally {
    cases: Cell<u64>,
    operations: Cell<u64>,
    checks: Cell<u64>,
    lost: Cell<u64>,
    /// Cached reads compared with the model, Redis faults injected, and
    /// cached totals that differed from the model.
    cached_checks: Cell<u64>,
    redis_faults: Cell<u64>,
    stale_reads: Cell<u64>,
}

/// The cache tier under the model (`counter-redis`), on a private Redis the
/// sequence hurts: FLUSHALL, the cache's connection cut by the test proxy
/// in front of the server, the server SIGKILLed and restarted empty, at
/// fixed steps of every case. After every step the cached totals of every
/// owner and key must equal the model's.
struct Cached {
    server: PrivateRedis,
    proxy: Proxy,
    counters: CachedCounters<i64>,
}

impl Cached {
    async fn start(backend: Backend) -> Option<Self> {
        shared_url(backend, "model_sequences")?;
        let server = PrivateRedis::start();
        let proxy = Proxy::start(&format!("127.0.0.1:{}", server.port()))
            .await
            .expect("start the proxy in front of Redis");
        let url = format!("redis://{}", proxy.addr());
        let cache = test_cache(RedisTarget::standalone(url), &namespace(backend, "model"))
            .build()
            .await
            .expect("build the model's cache");
        let counters = cache.table(&model_counters());
        Some(Self {
            server,
            proxy,
            counters,
        })
    }

    /// The fault of step `step`, if it has one.
    fn hurt(&self, step: usize, tally: &Tally) {
        let fault = match step % 24 {
            5 => self.server.cli(&["FLUSHALL"]).is_some(),
            11 => {
                self.proxy.cut_all();
                true
            }
            19 => {
                self.server.restart();
                true
            }
            _ => false,
        };
        if fault {
            Tally::bump(&tally.redis_faults, 1);
        }
    }

    /// The cached totals of every owner and key against the model.
    async fn check(&self, db: &DatabaseConnection, m: &Model, tally: &Tally) -> Result<(), String> {
        let names = Key::ALL.map(Key::name);
        let counts = self
            .counters
            .get_many(db, &OWNERS, &names)
            .await
            .map_err(lib_err("cached get_many"))?;
        Tally::bump(&tally.cached_checks, 9);
        for (o, id) in OWNERS.iter().enumerate() {
            for k in Key::ALL {
                let got = counts[id][k.name()];
                if got != m.total(o, k) {
                    Tally::bump(&tally.stale_reads, 1);
                    return Err(format!(
                        "the cache has {got} for {k:?} of {id}, the model {}",
                        m.total(o, k)
                    ));
                }
            }
        }
        Ok(())
    }
}

impl Tally {
    fn bump(cell: &Cell<u64>, by: u64) {
        cell.set(cell.get() + by);
    }
}

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// `got` against the model's expectation: success, or `Overflow` (in
/// which case nothing may have changed, which the next checks verify).
fn outcome<T: fmt::Debug>(
    what: &str,
    got: counter_core::Result<T>,
    overflow: bool,
) -> Result<Option<T>, String> {
    match got {
        Ok(v) if !overflow => Ok(Some(v)),
        Err(CounterError::Overflow { .. }) if overflow => Ok(None),
        Ok(v) => Err(format!(
            "{what}: the model expected CounterError::Overflow, the library returned Ok({v:?})"
        )),
        Err(e) => Err(format!(
            "{what}: the library returned {e:?}; the model expected {}",
            if overflow { "Overflow" } else { "success" }
        )),
    }
}

fn db_err(what: &str) -> impl FnOnce(sea_orm::DbErr) -> String + '_ {
    move |e| format!("{what}: {e}")
}

fn lib_err(what: &str) -> impl FnOnce(CounterError) -> String + '_ {
    move |e| format!("{what}: {e:?}")
}

/// Slot rows by (owner, key, bucket), then slot.
type Rows = BTreeMap<(i64, String, Option<i64>), BTreeMap<i16, i64>>;

async fn all_rows(db: &DatabaseConnection, table: &str, bucketed: bool) -> Result<Rows, String> {
    let mut columns = vec!["owner_id", "count_key"];
    if bucketed {
        columns.push("bucket");
    }
    columns.extend(["slot", "value"]);
    let select = Query::select()
        .columns(columns.into_iter().map(Alias::new))
        .from(Alias::new(table))
        .to_owned();
    let mut rows = Rows::new();
    let read = Sql::new(db).query_all(&select).await;
    for row in read.map_err(db_err("read rows"))? {
        let get = |e: sea_orm::DbErr| format!("decode a row of {table}: {e}");
        let owner: i64 = row.try_get("", "owner_id").map_err(get)?;
        let key: String = row.try_get("", "count_key").map_err(get)?;
        let bucket: Option<i64> = match bucketed {
            true => Some(row.try_get("", "bucket").map_err(get)?),
            false => None,
        };
        let slot: i16 = row.try_get("", "slot").map_err(get)?;
        let value: i64 = row.try_get("", "value").map_err(get)?;
        rows.entry((owner, key, bucket))
            .or_default()
            .insert(slot, value);
    }
    Ok(rows)
}

/// The rows a compaction must leave, as documented: each counter in scope
/// with `min_rows` rows or more folded into its slot 0 (no row at all if
/// it sums to zero and had no slot 0), the rest untouched; and its report.
fn compacted(
    before: &Rows,
    in_scope: impl Fn(i64, &str) -> bool,
    min_rows: usize,
) -> (Rows, CompactStats) {
    let mut rows = Rows::new();
    let mut stats = CompactStats::default();
    for (group, slots) in before {
        let scoped = in_scope(group.0, &group.1);
        // A total beyond half the slot cap (i64::MAX / 1024 / 2) stays
        // spread: one slot holding it would pass the cap.
        let near_limit = slots
            .values()
            .map(|v| i128::from(*v))
            .sum::<i128>()
            .unsigned_abs()
            > (i64::MAX / 1024 / 2) as u128;
        let after = if scoped && slots.len() >= min_rows && !near_limit {
            stats.counters_folded += 1;
            let sum: i64 = slots.values().sum();
            match slots.contains_key(&0) || sum != 0 {
                true => BTreeMap::from([(0, sum)]),
                false => BTreeMap::new(),
            }
        } else {
            slots.clone()
        };
        if scoped {
            stats.rows_before += slots.len() as u64;
            stats.rows_after += after.len() as u64;
        }
        if !after.is_empty() {
            rows.insert(group.clone(), after);
        }
    }
    (rows, stats)
}

/// One backend's tables, one case's buffer.
struct Run<'a> {
    db: &'a DatabaseConnection,
    counters: &'a Counters<i64>,
    buffer: CounterBuffer,
    tally: &'a Tally,
}

/// Runs `ops` on fresh tables of `t` and compares with the model after
/// every step, then shuts the buffer down and compares once more.
async fn run_case(
    t: &TestDb,
    counters: &Counters<i64>,
    cache: Option<&Cached>,
    ops: &[Op],
    tally: &Tally,
) -> Result<(), String> {
    for table in [TABLE, BUCKETS, TRUTH] {
        let delete = Query::delete().from_table(Alias::new(table)).to_owned();
        t.sql().execute(&delete).await.map_err(db_err("reset"))?;
    }
    if let Some(cache) = cache {
        // The reset is raw SQL, which the cache cannot see.
        cache.counters.invalidate(&OWNERS).await;
    }
    let buffer = CounterBuffer::builder(&t.db)
        .interval(Duration::from_secs(3600))
        .start()
        .await
        .map_err(lib_err("start the buffer"))?;
    Tally::bump(&tally.cases, 1);
    let run = Run {
        db: &t.db,
        counters,
        buffer,
        tally,
    };
    let mut model = Model::default();
    let mut result = Ok(());
    for (i, op) in ops.iter().enumerate() {
        result = run.step(op, &mut model).await;
        if result.is_ok() {
            result = run.check(&model, i).await;
        }
        if let (Ok(()), Some(cache)) = (&result, cache) {
            cache.hurt(i, tally);
            result = cache.check(&t.db, &model, tally).await;
        }
        if let Err(e) = result {
            result = Err(format!("step {i}, {op:?}: {e}"));
            break;
        }
    }
    let stopped = tokio::time::timeout(PATIENCE, run.buffer.shutdown()).await;
    result?;
    let stats = stopped
        .map_err(|_| "buffer shutdown timed out".to_owned())?
        .map_err(lib_err("buffer shutdown"))?;
    model.flush();
    ensure!(
        stats.rejected_deltas == model.rejected && stats.pending_adds == 0,
        "after shutdown: {stats:?}, model rejected {}",
        model.rejected
    );
    // The final comparison, after the shutdown's flush: what was lost.
    let names = Key::ALL.map(Key::name);
    let counts = counters
        .get_many(&t.db, &OWNERS, &names)
        .await
        .map_err(lib_err("final get_many"))?;
    let mut lost = 0u64;
    for (o, id) in OWNERS.iter().enumerate() {
        for k in Key::ALL {
            let diff = i128::from(counts[id][k.name()]) - i128::from(model.total(o, k));
            lost = lost.saturating_add(u64::try_from(diff.unsigned_abs()).unwrap_or(u64::MAX));
        }
    }
    Tally::bump(&tally.checks, 9);
    Tally::bump(&tally.lost, lost);
    ensure!(
        lost == 0,
        "after shutdown: {counts:?} differs from the model {:?}",
        model.stored
    );
    Ok(())
}

impl Run<'_> {
    async fn step(&self, op: &Op, m: &mut Model) -> Result<(), String> {
        Tally::bump(&self.tally.operations, 1);
        let (db, c) = (self.db, self.counters);
        match *op {
            Op::Add { owner, key, delta } => {
                let got = c.add(db, OWNERS[owner], key.name(), delta).await;
                self.direct(m, "add", Folded::one(owner, key, delta, None), got)
            }
            Op::Increment { owner, key } => {
                let got = c.increment(db, OWNERS[owner], key.name()).await;
                self.direct(m, "increment", Folded::one(owner, key, 1, None), got)
            }
            Op::Decrement { owner, key } => {
                let got = c.decrement(db, OWNERS[owner], key.name()).await;
                self.direct(m, "decrement", Folded::one(owner, key, -1, None), got)
            }
            Op::AddAt {
                owner,
                key,
                delta,
                day,
            } => {
                let got = c
                    .add_at(db, OWNERS[owner], key.name(), delta, day_at(day))
                    .await;
                self.direct(m, "add_at", Folded::one(owner, key, delta, Some(day)), got)
            }
            Op::AddMany(ref deltas) => {
                let items: Vec<Item> = deltas.iter().map(|&(o, k, d)| (o, k, d, None)).collect();
                let today = Window::Day.start_of(Utc::now());
                let got = c
                    .add_many(db, deltas.iter().map(|&(o, k, d)| (OWNERS[o], k.name(), d)))
                    .await;
                // `add_many` stamps each delta with its own now: across
                // midnight a `views` counter may take two bucket rows.
                let same_day = Window::Day.start_of(Utc::now()) == today;
                match Folded::of(&items) {
                    None => {
                        outcome("add_many (fold)", got, true)?;
                    }
                    Some(folded) => {
                        let next = m.applied(&folded);
                        if let Some(done) = outcome("add_many", got, next.is_none())? {
                            ensure!(
                                !same_day || done == folded.outcome(),
                                "add_many reported {done:?}, the model {:?}",
                                folded.outcome()
                            );
                            *m = next.expect("checked");
                        }
                    }
                }
                Ok(())
            }
            Op::Batch(ref items) => {
                if let Some(next) = self.batch(db, items, m, false).await? {
                    *m = next;
                }
                Ok(())
            }
            Op::Txn { ref ops, commit } => self.transaction(ops, commit, m).await,
            Op::Buffered { owner, key, delta } => {
                let sum = m.pending(owner, key).checked_add(delta);
                let got = self.buffer.add(c, OWNERS[owner], key.name(), delta);
                if outcome("buffer add", got, sum.is_none())?.is_some() {
                    m.pending.insert((owner, key), sum.expect("checked"));
                    m.pending_adds += 1;
                }
                Ok(())
            }
            Op::Flush => {
                tokio::time::timeout(PATIENCE, self.buffer.flush())
                    .await
                    .map_err(|_| "flush timed out".to_owned())?
                    .map_err(lib_err("flush"))?;
                m.flush();
                Ok(())
            }
            Op::Compaction {
                ref owners,
                ref keys,
                min_rows,
                batch_rows,
                buckets,
            } => {
                let scope = (owners.as_deref(), keys.as_deref());
                self.compaction(scope, min_rows, batch_rows, buckets).await
            }
            Op::SetTruth { owner, n } => {
                let id = OWNERS[owner];
                let delete = Query::delete()
                    .from_table(Alias::new(TRUTH))
                    .and_where(Expr::col(Alias::new("owner_id")).eq(id))
                    .to_owned();
                let db = Sql::new(db);
                db.execute(&delete).await.map_err(db_err("truth delete"))?;
                if let Some(n) = n {
                    let insert = Query::insert()
                        .into_table(Alias::new(TRUTH))
                        .columns([Alias::new("owner_id"), Alias::new("n")])
                        .values_panic([id.into(), n.into()])
                        .to_owned();
                    db.execute(&insert).await.map_err(db_err("truth insert"))?;
                    m.truth.insert(owner, n);
                } else {
                    m.truth.remove(&owner);
                }
                Ok(())
            }
            Op::Recount {
                ref owners,
                batch_size,
                dry_run,
            } => {
                self.recount(owners.as_deref(), batch_size, dry_run, m)
                    .await
            }
        }
    }

    /// A single write on the pool: stored as the model says, or refused
    /// with `Overflow` and nothing changed.
    fn direct(
        &self,
        m: &mut Model,
        what: &str,
        folded: Folded,
        got: counter_core::Result<()>,
    ) -> Result<(), String> {
        let next = m.applied(&folded);
        if outcome(what, got, next.is_none())?.is_some() {
            *m = next.expect("checked");
        }
        Ok(())
    }

    /// Builds and sends a `DeltaBatch` of `items` on `db` (with `apply`, or
    /// `apply_in` when `within`). Returns the model after it, `m` itself if
    /// the batch refused a delta while folding (nothing sent), or `None` if
    /// the database refused it (inside a transaction, which must then roll
    /// back).
    async fn batch<C: ConnectionTrait + TransactionTrait>(
        &self,
        db: &C,
        items: &[Item],
        m: &Model,
        within: bool,
    ) -> Result<Option<Model>, String> {
        let now = Utc::now();
        let mut batch = DeltaBatch::new();
        let mut built = Ok(());
        for &(o, k, d, day) in items {
            built = match (day, k) {
                (None, Key::Likes | Key::Recounted) => {
                    batch.add(self.counters, OWNERS[o], k.name(), d).map(drop)
                }
                _ => batch
                    .add_at(
                        self.counters,
                        OWNERS[o],
                        k.name(),
                        d,
                        day.map_or(now, day_at),
                    )
                    .map(drop),
            };
            if built.is_err() {
                break;
            }
        }
        let Some(folded) = Folded::of(items) else {
            outcome("batch fold", built, true)?;
            return Ok(Some(m.clone()));
        };
        outcome("batch fold", built, false)?;
        let next = m.applied(&folded);
        let got = match within {
            true => batch.apply_in(db).await,
            false => batch.apply(db).await,
        };
        match outcome("batch apply", got, next.is_none())? {
            Some(done) => {
                ensure!(
                    done == folded.outcome(),
                    "the batch reported {done:?}, the model {:?}",
                    folded.outcome()
                );
                Ok(next)
            }
            None => Ok(None),
        }
    }

    async fn transaction(&self, ops: &[TxnOp], commit: bool, m: &mut Model) -> Result<(), String> {
        let txn = self.db.begin().await.map_err(db_err("begin"))?;
        let mut next = m.clone();
        let mut refused = false;
        for (j, op) in ops.iter().enumerate() {
            Tally::bump(&self.tally.operations, 1);
            let what = format!("transaction op {j}, {op:?}");
            let after = match *op {
                TxnOp::Write { owner, key, delta } => {
                    let after = next.applied(&Folded::one(owner, key, delta, None));
                    let got = self
                        .counters
                        .add(&txn, OWNERS[owner], key.name(), delta)
                        .await;
                    outcome(&what, got, after.is_none())?.and(after)
                }
                TxnOp::Apply(ref items) => self.batch(&txn, items, &next, false).await?,
                TxnOp::ApplyIn(ref items) => self.batch(&txn, items, &next, true).await?,
            };
            let Some(after) = after else {
                refused = true;
                break;
            };
            next = after;
            // Read-your-writes, through the transaction.
            self.expect_totals(&txn, &next, &what).await?;
        }
        if commit && !refused {
            txn.commit().await.map_err(db_err("commit"))?;
            *m = next;
        } else {
            txn.rollback().await.map_err(db_err("rollback"))?;
        }
        Ok(())
    }

    async fn compaction(
        &self,
        (owners, keys): (Option<&[usize]>, Option<&[Key]>),
        min_rows: usize,
        batch_rows: usize,
        buckets: bool,
    ) -> Result<(), String> {
        let totals_before = all_rows(self.db, TABLE, false).await?;
        let buckets_before = all_rows(self.db, BUCKETS, true).await?;
        let mut options = Compact::new()
            .min_rows(min_rows)
            .batch_rows(batch_rows)
            .buckets(buckets);
        if let Some(owners) = owners {
            options = options.owners(owners.iter().map(|&o| OWNERS[o]));
        }
        if let Some(keys) = keys {
            options = options.keys(keys.iter().map(|k| k.name()));
        }
        let report = self
            .counters
            .compact(self.db, &options)
            .await
            .map_err(lib_err("compact"))?;
        let in_scope = |owner: i64, key: &str| {
            owners.is_none_or(|os| os.iter().any(|&o| OWNERS[o] == owner))
                && keys.is_none_or(|ks| ks.iter().any(|k| k.name() == key))
        };
        let totals_after = all_rows(self.db, TABLE, false).await?;
        let (want, stats) = compacted(&totals_before, in_scope, min_rows);
        ensure!(
            totals_after == want,
            "compaction left {totals_after:?}, the model {want:?} (before: {totals_before:?})"
        );
        ensure!(
            (
                report.totals.rows_before,
                report.totals.rows_after,
                report.totals.counters_folded
            ) == (stats.rows_before, stats.rows_after, stats.counters_folded),
            "compaction reported {:?}, the model {stats:?} (before: {totals_before:?})",
            report.totals
        );
        let buckets_after = all_rows(self.db, BUCKETS, true).await?;
        let bucket_scope = buckets && keys.is_none_or(|ks| ks.contains(&Key::Views));
        let (want, stats) = match bucket_scope {
            true => compacted(&buckets_before, in_scope, min_rows),
            false => (buckets_before.clone(), CompactStats::default()),
        };
        ensure!(
            buckets_after == want,
            "compaction left buckets {buckets_after:?}, the model {want:?} (before: {buckets_before:?})"
        );
        ensure!(
            (
                report.buckets.rows_before,
                report.buckets.rows_after,
                report.buckets.counters_folded
            ) == (stats.rows_before, stats.rows_after, stats.counters_folded),
            "compaction reported buckets {:?}, the model {stats:?}",
            report.buckets
        );
        let rows = totals_before
            .values()
            .chain(buckets_before.values())
            .map(|s| s.len() as u64);
        Tally::bump(&self.tally.checks, rows.sum::<u64>() + 2);
        Ok(())
    }

    async fn recount(
        &self,
        owners: Option<&[usize]>,
        batch_size: usize,
        dry_run: bool,
        m: &mut Model,
    ) -> Result<(), String> {
        let truth = Truth::statement(
            Query::select()
                .columns([Alias::new("owner_id"), Alias::new("n")])
                .from(Alias::new(TRUTH))
                .to_owned(),
        );
        let mut options = Reconcile::new().batch_size(batch_size).dry_run(dry_run);
        if let Some(owners) = owners {
            options = options.owners(owners.iter().map(|&o| OWNERS[o]));
        }
        let report = self
            .counters
            .reconcile(self.db, Key::Recounted.name(), truth, &options)
            .await
            .map_err(lib_err("reconcile"))?;
        let scope = by_id(owners.map_or_else(|| (0..OWNERS.len()).collect(), <[usize]>::to_vec));
        let truth_of = |o: usize| m.truth.get(&o).copied().unwrap_or(0);
        let drifted: Vec<Drift<i64>> = scope
            .iter()
            .filter_map(|&o| {
                let (truth, current) = (truth_of(o), m.total(o, Key::Recounted));
                let drift = truth - current;
                (drift != 0).then_some(Drift {
                    owner: OWNERS[o],
                    truth,
                    current,
                    drift,
                })
            })
            .collect();
        let abs: u128 = drifted
            .iter()
            .map(|d| u128::from(d.drift.unsigned_abs()))
            .sum();
        ensure!(
            report.drifted == drifted
                && report.owners_drifted == drifted.len() as u64
                && report.total_abs_drift == abs
                && report.dry_run == dry_run,
            "reconcile reported {report:?}, the model drifted {drifted:?}"
        );
        // Listed owners are all checked; a walk checks those with a truth
        // row or slot rows (rows summing to zero included).
        let seen = scope
            .iter()
            .filter(|&&o| m.truth.contains_key(&o) || m.total(o, Key::Recounted) != 0)
            .count() as u64;
        ensure!(
            match owners {
                Some(_) => report.owners_checked == scope.len() as u64,
                None => (seen..=OWNERS.len() as u64).contains(&report.owners_checked),
            },
            "reconcile checked {} owners; the model: {seen} to {}",
            report.owners_checked,
            scope.len()
        );
        Tally::bump(&self.tally.checks, drifted.len() as u64 + 2);
        if !dry_run {
            for &o in &scope {
                m.stored.insert((o, Key::Recounted), truth_of(o));
            }
        }
        Ok(())
    }

    /// `get_many` of every owner and key on `db` against the model.
    async fn expect_totals<C: ConnectionTrait>(
        &self,
        db: &C,
        m: &Model,
        what: &str,
    ) -> Result<(), String> {
        let names = Key::ALL.map(Key::name);
        let counts = self
            .counters
            .get_many(db, &OWNERS, &names)
            .await
            .map_err(lib_err(what))?;
        for (o, id) in OWNERS.iter().enumerate() {
            for k in Key::ALL {
                let got = counts.get(id).and_then(|keys| keys.get(k.name())).copied();
                ensure!(
                    got == Some(m.total(o, k)),
                    "{what}: get_many has {got:?} for {k:?} of {id}, the model {}",
                    m.total(o, k)
                );
            }
        }
        Tally::bump(&self.tally.checks, 9);
        Ok(())
    }

    /// Every read against the model, after step `step`.
    async fn check(&self, m: &Model, step: usize) -> Result<(), String> {
        let (db, c) = (self.db, self.counters);
        self.expect_totals(db, m, "get_many").await?;
        let mut checks = 0u64;

        let all = c
            .get_all_keys(db, &OWNERS)
            .await
            .map_err(lib_err("get_all_keys"))?;
        for (o, id) in OWNERS.iter().enumerate() {
            let keys = all
                .get(id)
                .ok_or_else(|| format!("get_all_keys left out owner {id}"))?;
            for (name, &v) in keys {
                let k = Key::named(name)
                    .ok_or_else(|| format!("get_all_keys invented key {name:?}"))?;
                ensure!(
                    v == m.total(o, k),
                    "get_all_keys has {v} for {k:?} of {id}, the model {}",
                    m.total(o, k)
                );
                checks += 1;
            }
            for k in Key::ALL.into_iter().filter(|&k| m.total(o, k) != 0) {
                ensure!(
                    keys.contains_key(k.name()),
                    "get_all_keys left out {k:?} of {id}"
                );
                checks += 1;
            }
        }

        let (o, k) = (
            step % OWNERS.len(),
            Key::ALL[step / OWNERS.len() % Key::ALL.len()],
        );
        let got = c
            .get(db, OWNERS[o], k.name())
            .await
            .map_err(lib_err("get"))?;
        ensure!(
            got == m.total(o, k),
            "get has {got} for {k:?} of {}, the model {}",
            OWNERS[o],
            m.total(o, k)
        );
        checks += 1;

        let last = first_day() + chrono::Duration::days(DAYS.into());
        let series = c
            .series_many(db, &OWNERS, "views", first_day(), last)
            .await
            .map_err(lib_err("series_many"))?;
        let now = Utc::now();
        let week = chrono::Duration::days(3);
        let recent = c
            .range_many(db, &OWNERS, "views", now - week, now + week)
            .await
            .map_err(lib_err("range_many"))?;
        for (o, id) in OWNERS.iter().enumerate() {
            let want: Vec<(DateTime<Utc>, i64)> = (0..DAYS)
                .map(|d| {
                    (
                        first_day() + chrono::Duration::days(d.into()),
                        m.bucket(o, Bucket::Day(d)),
                    )
                })
                .collect();
            ensure!(
                series[id] == want,
                "series of {id}: {:?}, the model {want:?}",
                series[id]
            );
            let want = m.bucket(o, Bucket::Recent);
            ensure!(
                recent[id] == want,
                "recent views of {id}: {}, the model {want}",
                recent[id]
            );
            let buckets: i64 = m
                .buckets
                .range((o, Bucket::Day(0))..=(o, Bucket::Recent))
                .map(|(_, v)| v)
                .sum();
            ensure!(
                buckets == m.total(o, Key::Views),
                "model: views of {id} are not the sum of its buckets"
            );
            checks += u64::from(DAYS) + 1;
        }

        // The buffer: stored + pending, for every pending counter and one more.
        let mut read: BTreeSet<(usize, Key)> = m
            .pending
            .iter()
            .filter(|(_, p)| **p != 0)
            .map(|(c, _)| *c)
            .collect();
        read.insert((o, k));
        for (o, k) in read {
            let sum = m.total(o, k).checked_add(m.pending(o, k));
            let got = self.buffer.get(c, OWNERS[o], k.name()).await;
            let what = format!("buffer get of {k:?} of {}", OWNERS[o]);
            if let Some(got) = outcome(&what, got, sum.is_none())? {
                ensure!(Some(got) == sum, "{what}: {got}, the model {sum:?}");
            }
            checks += 1;
        }
        for (o, id) in OWNERS.iter().enumerate() {
            for k in Key::ALL {
                let got = self.buffer.unflushed(c, *id, k.name());
                ensure!(
                    got == m.pending(o, k),
                    "unflushed {k:?} of {id}: {got}, the model {}",
                    m.pending(o, k)
                );
                checks += 1;
            }
        }
        let stats = self.buffer.stats();
        ensure!(
            (stats.pending_adds, stats.rejected_deltas) == (m.pending_adds, m.rejected),
            "buffer stats {stats:?}; the model: {} pending adds, {} rejected",
            m.pending_adds,
            m.rejected
        );
        checks += 2;
        Tally::bump(&self.tally.checks, checks);
        Ok(())
    }
}

// ---------------------------------------------------------------------- test

backend_test! {
    fn model_sequences(backend: Backend) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let cases: u32 = env_number("COUNTER_MODEL_CASES").unwrap_or(64);
        let server_cases: u32 =
            env_number("COUNTER_MODEL_SERVER_CASES").unwrap_or(Ord::min(cases, SERVER_CASES));
        let seed: u64 = env_number("COUNTER_MODEL_SEED").unwrap_or_else(rand::random);
        eprintln!("model_sequences on {backend}: COUNTER_MODEL_SEED={seed}");
        let counters = model_counters();
        let Some(t) = runtime.block_on(TestDb::open(backend, "model_sequences")) else {
            return;
        };
        let cache = runtime.block_on(Cached::start(backend));
        runtime.block_on(setup(&t));
        let cases = match t.backend {
            Backend::Sqlite => cases,
            Backend::Postgres | Backend::MySql => server_cases,
        };
        // Each backend draws its own sequences, all from the one seed.
        let backend_seed = seed.wrapping_add(match backend {
            Backend::Sqlite => 0,
            Backend::Postgres => 1,
            Backend::MySql => 2,
        });
        let started = std::time::Instant::now();
        let config = Config {
            cases,
            failure_persistence: None,
            rng_seed: RngSeed::Fixed(backend_seed),
            max_shrink_iters: 2048,
            ..Config::default()
        };
        let tally = Tally::default();
        let result = TestRunner::new(config).run(&sequence(), |ops| {
            runtime
                .block_on(run_case(&t, &counters, cache.as_ref(), &ops, &tally))
                .map_err(TestCaseError::fail)
        });
        match result {
            Ok(()) => {}
            Err(TestError::Fail(reason, ops)) => panic!(
                "[{}] model_sequences failed (COUNTER_MODEL_SEED={seed}): {reason}\n\
                 minimal failing sequence, to paste into a regression test:\n{}",
                t.backend,
                pasteable(&ops)
            ),
            Err(TestError::Abort(reason)) => {
                panic!(
                    "[{}] model_sequences aborted (COUNTER_MODEL_SEED={seed}): {reason}",
                    t.backend
                )
            }
        }
        eprintln!(
            "[{}] model_sequences: {cases} cases in {:.1} s",
            t.backend,
            started.elapsed().as_secs_f64()
        );
        figures(
            "model_sequences",
            t.backend,
            &[
                ("cases", tally.cases.get()),
                ("operations", tally.operations.get()),
                ("checks", tally.checks.get()),
                ("increments_lost", tally.lost.get()),
                ("cached_checks", tally.cached_checks.get()),
                ("redis_faults", tally.redis_faults.get()),
                ("stale_reads", tally.stale_reads.get()),
            ],
        );
        drop(cache);
        runtime.block_on(t.finish());
    }
}

/// Hand-written sequences of the trickiest interleavings, and shrunk
/// failures of `model_sequences`, replayed on every backend.
mod regressions {
    use super::{Key::*, Op::*, TxnOp::*, *};

    /// Runs one sequence on `t`'s backend, failing with the model's message.
    async fn replay(t: TestDb, ops: Vec<Op>) {
        let counters = model_counters();
        setup(&t).await;
        let tally = Tally::default();
        if let Err(e) = run_case(&t, &counters, None, &ops, &tally).await {
            let test = t.label();
            panic!("[{}] {test}: {e}\nsequence: {}", t.backend, pasteable(&ops));
        }
        assert_eq!(tally.lost.get(), 0);
        t.finish().await;
    }

    backend_test! {
        /// A buffered add stays pending through a rolled-back batch, a
        /// compaction and a recount (which corrects only what is stored), then
        /// lands on top of the repaired total at the flush; a second recount
        /// undoes it again.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[label = "model_buffer_rollback_compact_recount"]
        async fn buffered_add_survives_rollback_compaction_and_recount(t: TestDb) {
            replay(
                t,
                vec![
                    Buffered {
                        owner: 0,
                        key: Recounted,
                        delta: 7,
                    },
                    Buffered {
                        owner: 1,
                        key: Views,
                        delta: 3,
                    },
                    Add {
                        owner: 0,
                        key: Recounted,
                        delta: 5,
                    },
                    Add {
                        owner: 0,
                        key: Recounted,
                        delta: -2,
                    },
                    Add {
                        owner: 0,
                        key: Recounted,
                        delta: 4,
                    },
                    Txn {
                        ops: vec![Apply(vec![
                            (0, Recounted, 4, None),
                            (1, Views, 2, Some(1)),
                            (2, Likes, 9, None),
                        ])],
                        commit: false,
                    },
                    Compaction {
                        owners: None,
                        keys: None,
                        min_rows: 2,
                        batch_rows: 1,
                        buckets: true,
                    },
                    SetTruth {
                        owner: 0,
                        n: Some(3),
                    },
                    Recount {
                        owners: None,
                        batch_size: 1,
                        dry_run: false,
                    },
                    Flush,
                    Recount {
                        owners: Some(vec![0, 2]),
                        batch_size: 2,
                        dry_run: true,
                    },
                    Recount {
                        owners: None,
                        batch_size: 3,
                        dry_run: false,
                    },
                    Compaction {
                        owners: Some(vec![1]),
                        keys: Some(vec![Views]),
                        min_rows: 2,
                        batch_rows: 1,
                        buckets: true,
                    },
                ],
            )
            .await;
        }
    }

    backend_test! {
        /// The third write of a transaction overflows `likes`: the whole
        /// transaction rolls back, the earlier writes (a windowed batch among
        /// them) included, and the pool still works.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[label = "model_txn_overflow"]
        async fn overflow_inside_a_transaction_rolls_it_all_back(t: TestDb) {
            replay(
                t,
                vec![
                    Add {
                        owner: 0,
                        key: Likes,
                        delta: i64::MAX,
                    },
                    Txn {
                        ops: vec![
                            Write {
                                owner: 1,
                                key: Likes,
                                delta: 5,
                            },
                            Apply(vec![
                                (2, Views, 3, Some(0)),
                                (2, Views, 4, None),
                                (1, Recounted, 1, None),
                            ]),
                            ApplyIn(vec![(1, Likes, 1, None), (0, Likes, 1, None)]),
                        ],
                        commit: true,
                    },
                    Txn {
                        ops: vec![
                            Write {
                                owner: 0,
                                key: Likes,
                                delta: 1,
                            },
                            Write {
                                owner: 1,
                                key: Likes,
                                delta: 1,
                            },
                        ],
                        commit: true,
                    },
                    Increment {
                        owner: 0,
                        key: Likes,
                    },
                    Decrement {
                        owner: 0,
                        key: Likes,
                    },
                    AddMany(vec![(1, Likes, 2), (0, Likes, 1)]),
                ],
            )
            .await;
        }
    }

    backend_test! {
        /// A buffered delta that would overflow its stored total is set aside
        /// at the flush; the other counters of that flush are stored.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[label = "model_buffer_rejected"]
        async fn an_overflowing_buffered_delta_is_rejected_alone(t: TestDb) {
            replay(
                t,
                vec![
                    Add {
                        owner: 2,
                        key: Likes,
                        delta: i64::MAX - 1,
                    },
                    Buffered {
                        owner: 2,
                        key: Likes,
                        delta: 5,
                    },
                    Buffered {
                        owner: 1,
                        key: Likes,
                        delta: 3,
                    },
                    Buffered {
                        owner: 2,
                        key: Views,
                        delta: 2,
                    },
                    Buffered {
                        owner: 0,
                        key: Likes,
                        delta: i64::MIN,
                    },
                    Buffered {
                        owner: 0,
                        key: Likes,
                        delta: -1,
                    },
                    Flush,
                    Buffered {
                        owner: 2,
                        key: Likes,
                        delta: -7,
                    },
                    Add {
                        owner: 2,
                        key: Likes,
                        delta: 2,
                    },
                ],
            )
            .await;
        }
    }

    backend_test! {
        /// Folds to zero send nothing (not even in a transaction); a fold
        /// that overflows refuses the batch before anything is sent.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[label = "model_folds"]
        async fn net_zero_and_overflowing_folds(t: TestDb) {
            replay(
                t,
                vec![
                    Batch(vec![
                        (0, Likes, 5, None),
                        (0, Likes, -5, None),
                        (1, Views, 4, Some(2)),
                        (1, Views, -4, Some(2)),
                    ]),
                    Batch(vec![(1, Views, 4, Some(2)), (1, Views, -4, Some(3))]),
                    Batch(vec![
                        (0, Likes, i64::MAX, None),
                        (0, Likes, 1, None),
                        (1, Recounted, 1, None),
                    ]),
                    AddMany(vec![(2, Likes, i64::MIN), (2, Likes, -1)]),
                    Txn {
                        ops: vec![ApplyIn(vec![
                            (2, Recounted, 8, None),
                            (2, Recounted, -8, None),
                        ])],
                        commit: true,
                    },
                    Compaction {
                        owners: None,
                        keys: Some(vec![Likes, Views]),
                        min_rows: 2,
                        batch_rows: 1,
                        buckets: false,
                    },
                    Compaction {
                        owners: None,
                        keys: None,
                        min_rows: 3,
                        batch_rows: 1000,
                        buckets: true,
                    },
                ],
            )
            .await;
        }
    }
}
