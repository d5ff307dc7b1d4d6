//! The write-behind buffer: increments folded in memory and flushed by a
//! background task, a handful of statements for any number of increments.

mod flusher;
mod ledger;
mod pending;
mod sink;
mod sketches;
mod stats;

use std::{
    sync::{
        Arc, Condvar, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use chrono::Utc;
use sea_orm::DatabaseConnection;
use tokio::{
    runtime::{Handle, RuntimeFlavor},
    sync::{Notify, watch},
};

pub use ledger::FlushLedger;
#[cfg(feature = "migration")]
pub use ledger::migration::FlushLedgerMigration;
pub use sink::{Flush, FlushSink, FlushedDelta, SinkFuture};
pub use stats::BufferStats;

use crate::{
    Counters, detach,
    error::BufferError,
    error::{CounterError, Result},
    key::validate_key,
    owner::{OwnerId, SortOwner},
    retry,
    sql::{self, Dialect},
    typed::{KeyOf, KeySpace, UniqueKeyOf},
    unique::{Member, Sketch, murmur64a},
};
use flusher::Shared;
use pending::{CounterRef, Pending, Refused};
use sketches::{PendingSketches, SketchId, SketchRefused};
use stats::Meter;

/// What [`CounterBuffer::add`] does when `capacity` distinct counters are
/// pending and the new one does not fit. Adds to a counter that is already
/// pending always succeed: they take no memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WhenFull {
    /// Wake the flusher and block the calling thread until its drain makes
    /// room (back-pressure on the producers), for at most 30 seconds, after
    /// which the add fails with [`BufferError::Full`]. Do not add
    /// while holding a pooled connection (inside a transaction) with a pool
    /// so small that the flusher could find none free: it could not drain
    /// until that wait ran out. On a multi-thread Tokio runtime
    /// the wait runs in `block_in_place`, so other tasks keep running; on a
    /// current-thread runtime, where blocking would stop the flusher itself,
    /// the add fails with [`BufferError::Full`] instead.
    #[default]
    Block,
    /// Fail the add at once with [`BufferError::Full`]; the delta is
    /// not taken, and the caller decides (write directly, retry, shed).
    Fail,
}

/// The pending sketches an observe of `(owner, key)` at `at` merges into:
/// the all-time one and, for a windowed key, its bucket's.
fn sketch_ids<I: OwnerId, S: KeySpace>(
    counters: &Counters<I, S>,
    owner: I,
    key: &str,
    at: chrono::DateTime<Utc>,
) -> Vec<SketchId> {
    let table = counters.table();
    let owner = SortOwner::from_value(owner.into());
    table
        .sketch_buckets(key, at)
        .map(|bucket| SketchId {
            table: table.name().to_owned(),
            owner: owner.clone(),
            key: key.to_owned(),
            bucket,
        })
        .collect()
}

/// A buffer's settings, fixed when it starts.
#[derive(Debug, Clone)]
struct Config {
    interval: Duration,
    flush_at: usize,
    capacity: usize,
    when_full: WhenFull,
    ledger: FlushLedger,
    retention: Duration,
    sink: Option<sink::Sink>,
    sketch_capacity: usize,
}

/// Longest time a [`WhenFull::Block`] add waits for room before it fails
/// with [`BufferError::Full`]: a flusher that cannot drain (the
/// database down, or every pooled connection held by blocked callers) must
/// not hang its producers for good.
const MAX_BLOCK: Duration = Duration::from_secs(30);
/// Longest time [`CounterBuffer::get`] waits for a flush's commit to be
/// resolved before giving up with [`BufferError::FlushInDoubt`].
const READ_WAIT: Duration = Duration::from_secs(5);
/// The shortest ledger retention: an hour, so that one buffer cannot prune
/// the row of another that is retrying through a short outage.
const MIN_LEDGER_RETENTION_SECS: usize = 3600;
use crate::limits::MAX_BUFFER_CAPACITY;

/// Settings for a [`CounterBuffer`]; from [`CounterBuffer::builder`].
#[derive(Debug, Clone)]
pub struct BufferBuilder {
    db: DatabaseConnection,
    config: Config,
}

impl BufferBuilder {
    /// How often the flusher drains (default 1 s): the longest an increment
    /// waits before its flush starts, when nothing else triggers one.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.config.interval = interval;
        self
    }

    /// Flush early once this many distinct counters are pending (default
    /// 10,000); at most the capacity.
    pub fn flush_at(mut self, counters: usize) -> Self {
        self.config.flush_at = counters;
        self
    }

    /// The most sketches of unique keys pending at once (default 10,000:
    /// one per counter observed since the last flush, and per bucket of a
    /// windowed key), each at most 16 kB in memory (dense), most far less;
    /// past it, [`CounterBuffer::observe`] of a new counter waits or fails
    /// by the [`WhenFull`] policy.
    pub fn sketch_capacity(mut self, sketches: usize) -> Self {
        self.config.sketch_capacity = sketches;
        self
    }

    /// The most distinct counters pending at once (default 100,000; at most
    /// [`MAX_BUFFER_CAPACITY`]). Memory is bounded by twice this (pending, plus
    /// the flush under way), about 100 bytes a counter plus its key and
    /// owner.
    pub fn capacity(mut self, counters: usize) -> Self {
        self.config.capacity = counters;
        self
    }

    /// What an add does when the capacity is reached (default
    /// [`WhenFull::Block`]).
    pub fn when_full(mut self, policy: WhenFull) -> Self {
        self.config.when_full = policy;
        self
    }

    /// The ledger table (default [`FlushLedger::default`]).
    pub fn ledger(mut self, ledger: FlushLedger) -> Self {
        self.config.ledger = ledger;
        self
    }

    /// Sends each flush to `sink` (a message queue: `counter-mq`'s
    /// `BufferSink`) instead of writing it to the database; the ledger is
    /// then not used. Every flush is retried, with the same
    /// [`Flush::id`], until the sink takes it, so a consumer that applies
    /// ids once applies each flush once: thousands of adds per second cost
    /// one message per flush interval.
    ///
    /// Reads through the buffer ([`CounterBuffer::get`]) count what is
    /// pending and in flight, then the database: a flush the sink took but
    /// no consumer applied yet is in neither, so such a read is low until
    /// the consumer catches up.
    pub fn sink(mut self, sink: Arc<dyn FlushSink>) -> Self {
        self.config.sink = Some(sink::Sink(sink));
        self
    }

    /// How long the ledger row of a buffer that stopped flushing (a crashed
    /// process) is kept before another buffer prunes it (default 7 days).
    /// It must outlast any outage a buffer retries through: a flush retried
    /// after its row was pruned could be applied twice. At least an hour.
    pub fn ledger_retention(mut self, retention: Duration) -> Self {
        self.config.retention = retention;
        self
    }

    /// Checks the settings and the ledger table, and spawns the flusher on
    /// the current Tokio runtime.
    ///
    /// Errors: [`CounterError::OutOfRange`] for an interval outside 1 ms to
    /// 1 hour, a capacity or threshold out of range, or a retention under
    /// an hour, [`CounterError::MissingTable`] if the
    /// ledger table does not exist, [`BufferError::NoRuntime`] outside a
    /// Tokio runtime.
    pub async fn start(self) -> Result<CounterBuffer> {
        let Self { db, config } = self;
        let millis = usize::try_from(config.interval.as_millis()).unwrap_or(usize::MAX);
        CounterError::check_size("buffer interval (ms)", millis, 1, 3_600_000)?;
        CounterError::check_size("buffer capacity", config.capacity, 1, MAX_BUFFER_CAPACITY)?;
        CounterError::check_size("buffer flush_at", config.flush_at, 1, config.capacity)?;
        CounterError::check_size(
            "buffer sketch_capacity",
            config.sketch_capacity,
            1,
            MAX_BUFFER_CAPACITY,
        )?;
        let retention = usize::try_from(config.retention.as_secs()).unwrap_or(usize::MAX);
        CounterError::check_size(
            "buffer ledger retention (s)",
            retention,
            MIN_LEDGER_RETENTION_SECS,
            usize::MAX,
        )?;
        let runtime =
            Handle::try_current().map_err(|_| CounterError::from(BufferError::NoRuntime))?;
        let dialect = Dialect::of(&db)?;
        let writer = uuid::Uuid::new_v4().to_string();
        let ledger = config.ledger.name().to_owned();
        if config.sink.is_none() {
            // Fails now, by name, when the ledger's migration has not run.
            let probe = sql::ledger::last_flush(dialect, &ledger, &writer);
            retry::run(&db, &ledger, || detach::query_one(&db, probe.clone())).await?;
        }
        let shards = std::thread::available_parallelism().map_or(8, |n| n.get() * 4);
        let (flushed, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            pending: Pending::new(shards, config.capacity),
            sketches: PendingSketches::new(config.sketch_capacity),
            db,
            dialect,
            config,
            writer,
            in_flight: Mutex::default(),
            drain_epoch: AtomicU64::new(0),
            commit_epoch: AtomicU64::new(0),
            wake: Notify::new(),
            room: (Mutex::new(()), Condvar::new()),
            requests: AtomicU64::new(0),
            flushed,
            closing: AtomicBool::new(false),
            stopped_cleanly: AtomicBool::new(false),
            meter: Default::default(),
        });
        flusher::spawn(&runtime, shared.clone());
        Ok(CounterBuffer {
            handle: Arc::new(Owner { shared }),
        })
    }
}

/// A write-behind buffer for counters: [`CounterBuffer::add`] folds a delta
/// into memory without touching the database, and a background task flushes
/// everything pending every [`interval`](BufferBuilder::interval) (or
/// sooner, at [`flush_at`](BufferBuilder::flush_at) distinct counters) as
/// one sorted multi-row upsert per table, in one transaction. A page viewed
/// 10,000 times a second costs a few statements a second.
///
/// Clone it freely (every clone is the same buffer). Any counter table, owner
/// type and key goes through one buffer.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use counter_core::{CounterBuffer, CounterTable, Counters, FlushLedger};
///
/// let db = sea_orm::Database::connect("sqlite::memory:").await?;
/// let views = Counters::<i64>::new(CounterTable::new("post_counters")?);
/// views.create_table(&db).await?;
/// FlushLedger::default().create_table(&db).await?;
///
/// let buffer = CounterBuffer::start(&db).await?;
/// for _ in 0..1_000 {
///     buffer.add(&views, 7, "views", 1)?; // synchronous, no database
/// }
/// assert_eq!(buffer.get(&views, 7, "views").await?, 1_000); // read-your-writes
/// buffer.flush().await?; // one transaction for the 1,000
/// assert_eq!(views.get(&db, 7, "views").await?, 1_000);
/// let stats = buffer.shutdown().await?;
/// assert_eq!((stats.adds, stats.pending_adds, stats.flushes), (1_000, 0, 1));
/// # Ok(())
/// # }
/// ```
///
/// # Durability contract
///
/// * `add` returning `Ok` means **accepted, not stored**. A delta is
///   stored when the flush holding it commits: [`CounterBuffer::flush`] and
///   [`CounterBuffer::shutdown`] return after that.
/// * **A process crash (or a kill, or a runtime dropped without
///   `shutdown`) loses every accepted delta not yet committed**: those of
///   the last interval, more while the database is unreachable, at most
///   twice the capacity in distinct counters. [`BufferStats::pending_adds`]
///   is that exposure. Call `shutdown().await` before exiting.
/// * **A failed flush loses nothing**: its deltas are kept and it is retried
///   with backoff (50 ms doubling to 5 s), for as long as it takes; new adds
///   keep folding into the next flush meanwhile, up to the capacity. That
///   includes a missing table (create it and the flush goes through; until
///   then `last_error` names it) and an attempt that hangs (abandoned after
///   60 s, its outcome settled by the ledger).
/// * **No flush is applied twice**: each claims its number in the
///   [`FlushLedger`] in its own transaction, so a retry after a lost `COMMIT`
///   reply finds its number taken and applies nothing.
/// * A flush is all or nothing: every counter of it, total and buckets, or
///   none. The one exception is a delta the database refuses for good (a
///   slot value would leave `i64`): no retry could store it, so the flush
///   is split counter by counter, the others are stored, and that delta is
///   set aside, counted in [`BufferStats::rejected_deltas`] and logged at
///   `error` with its counter.
/// * A windowed key's delta counts in the bucket of the moment it was
///   added, not of its flush.
/// * If the flusher task dies (a panic, or its runtime shut down without
///   `shutdown`), adds fail with [`BufferError::Closed`] and `flush`
///   / `shutdown` with [`BufferError::FlusherStopped`], which says how many
///   adds were left unflushed.
///
/// # Reads
///
/// [`CounterBuffer::get`] returns the stored total plus the deltas pending
/// and in flight in this buffer: a process reads its own writes. Other
/// processes (and [`Counters::get`]) see them after the flush. A read that
/// overlaps a flush's commit waits for it (the read is exact either way).
///
/// # Observability
///
/// [`CounterBuffer::stats`] returns a [`BufferStats`]; the flusher emits
/// `tracing` events: `debug` per committed flush (counters, adds, rows,
/// elapsed), `warn` per failed attempt (error, next retry), `info` when the
/// ledger skips a replay.
#[derive(Clone)]
pub struct CounterBuffer {
    handle: Arc<Owner>,
}

/// Closes the buffer when the last clone of it goes away: its flusher
/// drains what is left and stops.
struct Owner {
    shared: Arc<Shared>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.shared.close();
    }
}

impl std::fmt::Debug for CounterBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CounterBuffer")
            .field("writer", &self.shared().writer)
            .field("config", &self.shared().config)
            .finish_non_exhaustive()
    }
}

impl CounterBuffer {
    /// Settings for a buffer writing through `db` (a pool; the buffer keeps
    /// a clone of it).
    pub fn builder(db: &DatabaseConnection) -> BufferBuilder {
        BufferBuilder {
            db: db.clone(),
            config: Config {
                interval: Duration::from_secs(1),
                flush_at: 10_000,
                capacity: 100_000,
                when_full: WhenFull::Block,
                ledger: FlushLedger::default(),
                retention: Duration::from_secs(7 * 24 * 3600),
                sink: None,
                sketch_capacity: 10_000,
            },
        }
    }

    /// A buffer with the default settings (see [`BufferBuilder`]).
    pub async fn start(db: &DatabaseConnection) -> Result<Self> {
        Self::builder(db).start().await
    }

    fn shared(&self) -> &Shared {
        &self.handle.shared
    }

    /// Adds `delta` to `key` of `owner` in `counters`' table, in memory.
    /// Never waits on the database; allocates only for a counter that is
    /// not pending yet.
    ///
    /// Errors: a bad key or owner, [`CounterError::WrongKeyKind`] for a
    /// unique key (see [`CounterBuffer::observe`]), [`CounterError::Overflow`] if the
    /// counter's pending sum would leave `i64`, [`BufferError::Full`]
    /// (see [`WhenFull`]), [`BufferError::Closed`] once
    /// [`CounterBuffer::shutdown`] has begun. An error means the delta was
    /// not taken.
    pub fn add<I: OwnerId, S: KeySpace, K: KeyOf<S>>(
        &self,
        counters: &Counters<I, S>,
        owner: I,
        key: K,
        delta: i64,
    ) -> Result<()> {
        let key = key.as_key_str();
        validate_key(key)?;
        owner.check()?;
        let table = counters.table();
        table.check_kind(key, false, "add")?;
        let bucket = table.window_for(key).map(|w| w.bucket_of(Utc::now()));
        let owner = SortOwner::from_value(owner.into());
        let id = CounterRef {
            table: table.name(),
            owner: &owner,
            key,
        };
        let shared = self.shared();
        let mut waited = None;
        loop {
            match shared
                .pending
                .add(table, I::COLUMN, id, delta, bucket, &shared.closing)
            {
                Ok(added) => {
                    if added.new {
                        let meter = &shared.meter;
                        meter
                            .peak_pending
                            .fetch_max(added.counters, Ordering::Relaxed);
                        if added.counters >= shared.config.flush_at {
                            shared.wake.notify_one();
                        }
                    }
                    return Ok(());
                }
                Err(Refused::Overflow) => {
                    return Err(CounterError::Overflow {
                        context: format!("the buffered delta of `{key}`"),
                    });
                }
                Err(Refused::Closed) => return Err(BufferError::Closed.into()),
                Err(Refused::Mismatch) => {
                    return Err(BufferError::TableMismatch {
                        table: table.name().to_owned(),
                        key: key.to_owned(),
                    }
                    .into());
                }
                Err(Refused::Full) => {
                    let since = *waited.get_or_insert_with(|| {
                        Meter::bump(&shared.meter.full_waits, 1);
                        Instant::now()
                    });
                    self.wait_for_room(since)?;
                }
            }
        }
    }

    /// Counts `member` among the distinct members of a unique key, in
    /// memory: the member is hashed and merged into the counter's pending
    /// sketch (and its bucket's, for a windowed key), and the flusher
    /// merges each sketch into the sketch table once per flush. Never waits
    /// on the database; 64 writers of one hot owner share one sketch.
    ///
    /// A flush is one short transaction per table whatever the number of
    /// members, and applying a flush twice changes nothing (no ledger
    /// needed). With a [sink](BufferBuilder::sink), sketches still go to
    /// the database directly.
    ///
    /// Errors: a bad key or owner, [`CounterError::WrongKeyKind`] for a key
    /// that is not unique, [`BufferError::Full`] past
    /// [`sketch_capacity`](BufferBuilder::sketch_capacity) (see
    /// [`WhenFull`]), [`BufferError::Closed`] once shutting down.
    pub fn observe<I, S, K, M>(
        &self,
        counters: &Counters<I, S>,
        owner: I,
        key: K,
        member: &M,
    ) -> Result<()>
    where
        I: OwnerId,
        S: KeySpace,
        K: UniqueKeyOf<S>,
        M: Member + ?Sized,
    {
        let key = key.as_key_str();
        counters.check_unique(&owner, key, "observe")?;
        let hash = member.with_bytes(murmur64a);
        let ids = sketch_ids(counters, owner, key, Utc::now());
        let shared = self.shared();
        let mut waited = None;
        loop {
            if shared.is_closing() {
                return Err(BufferError::Closed.into());
            }
            match shared.sketches.observe(
                counters.table(),
                I::COLUMN,
                ids.clone(),
                hash,
                &shared.closing,
            ) {
                Ok(pending) => {
                    if pending >= shared.config.flush_at {
                        shared.wake.notify_one();
                    }
                    return Ok(());
                }
                Err(SketchRefused::Closed) => return Err(BufferError::Closed.into()),
                Err(SketchRefused::Mismatch) => {
                    return Err(BufferError::TableMismatch {
                        table: counters.table().name().to_owned(),
                        key: key.to_owned(),
                    }
                    .into());
                }
                Err(SketchRefused::Full) => {
                    let since = *waited.get_or_insert_with(|| {
                        Meter::bump(&shared.meter.full_waits, 1);
                        Instant::now()
                    });
                    let sketches = &shared.sketches;
                    self.wait_until_room(since, sketches.capacity(), || sketches.is_full())?;
                }
            }
        }
    }

    /// The estimated distinct members of a unique key as this process sees
    /// it: the stored sketch merged with what this buffer holds for it
    /// (read-your-writes). Always exact about this buffer's members: a
    /// member moving from pending to the database during the read is
    /// merged from one or the other, and merging it twice counts it once.
    pub async fn unique<I, S, K>(&self, counters: &Counters<I, S>, owner: I, key: K) -> Result<u64>
    where
        I: OwnerId,
        S: KeySpace,
        K: UniqueKeyOf<S>,
    {
        let key = key.as_key_str();
        counters.check_unique(&owner, key, "unique")?;
        let shared = self.shared();
        let id = sketch_ids(counters, owner.clone(), key, Utc::now()).swap_remove(0);
        // Pending and in flight (under one lock), then stored: a sketch
        // moves in that order, so it is read before it can leave the next.
        let mut merged = Sketch::new();
        shared.sketches.merge_into(&id, &mut merged);
        let untyped = counters.untyped();
        merged.merge(&untyped.sketch(&shared.db, owner, key).await?);
        Ok(merged.estimate())
    }

    /// Applies the full-buffer policy to an add waiting `since`; `Ok` once
    /// there may be room.
    fn wait_for_room(&self, since: Instant) -> Result<()> {
        let shared = self.shared();
        self.wait_until_room(since, shared.config.capacity, || shared.pending.is_full())
    }

    /// Applies the full-buffer policy to a caller waiting `since` for
    /// `is_full` to end, in a buffer of `capacity`; `Ok` once there may be
    /// room.
    fn wait_until_room(
        &self,
        since: Instant,
        capacity: usize,
        is_full: impl Fn() -> bool,
    ) -> Result<()> {
        let shared = self.shared();
        let full = BufferError::Full { capacity };
        if shared.config.when_full == WhenFull::Fail || since.elapsed() >= MAX_BLOCK {
            return Err(full.into());
        }
        shared.wake.notify_one();
        let wait = || {
            let guard = shared.room.0.lock().unwrap_or_else(PoisonError::into_inner);
            // A timeout, too: a drain's wake-up may come between the check
            // and the wait.
            let _ = shared
                .room
                .1
                .wait_timeout_while(guard, Duration::from_millis(50), |()| {
                    is_full() && !shared.is_closing()
                });
        };
        match Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(RuntimeFlavor::CurrentThread) => return Err(full.into()),
            Ok(_) => tokio::task::block_in_place(wait),
            Err(_) => wait(),
        }
        Ok(())
    }

    /// The delta this buffer holds for a counter and has not committed yet
    /// (pending and in flight).
    pub fn unflushed<I: OwnerId, S: KeySpace, K: KeyOf<S>>(
        &self,
        counters: &Counters<I, S>,
        owner: I,
        key: K,
    ) -> i64 {
        let owner = SortOwner::from_value(owner.into());
        let id = CounterRef {
            table: counters.table().name(),
            owner: &owner,
            key: key.as_key_str(),
        };
        let shared = self.shared();
        let mut spins = 0u32;
        loop {
            let before = shared.drain_epoch.load(Ordering::Acquire);
            if before.is_multiple_of(2) {
                let flying = shared
                    .in_flight()
                    .map_or(0, |d| shared.pending.get_in(&d, id));
                let held = shared.pending.get(id).saturating_add(flying);
                if shared.drain_epoch.load(Ordering::Acquire) == before {
                    return held;
                }
            }
            // A drain is a move in memory: wait it out on this thread.
            spins += 1;
            if spins.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// The counter's total as this process sees it: stored, plus what this
    /// buffer holds for it (read-your-writes). Exact: a read that overlaps
    /// a flush's commit is repeated. With a
    /// [sink](BufferBuilder::sink), a flush the sink took is in neither
    /// until its consumer applies it: the read is low meanwhile.
    ///
    /// Errors: those of [`Counters::get`]; [`BufferError::FlushInDoubt`] if
    /// no exact read could be made in 5 seconds (a flush's commit unresolved:
    /// its reply lost and the database unreachable); [`CounterError::Overflow`] if the sum
    /// leaves `i64`.
    pub async fn get<I: OwnerId, S: KeySpace, K: KeyOf<S>>(
        &self,
        counters: &Counters<I, S>,
        owner: I,
        key: K,
    ) -> Result<i64> {
        let counters = counters.untyped();
        let key = key.as_key_str();
        let shared = self.shared();
        let deadline = Instant::now() + READ_WAIT;
        loop {
            let before = shared.commit_epoch.load(Ordering::Acquire);
            if before.is_multiple_of(2) {
                let held = self.unflushed(&counters, owner.clone(), key);
                let stored = counters.get(&shared.db, owner.clone(), key).await?;
                if shared.commit_epoch.load(Ordering::Acquire) == before {
                    return stored
                        .checked_add(held)
                        .ok_or_else(|| CounterError::Overflow {
                            context: format!("the total of `{key}` with its buffered delta"),
                        });
                }
            } else {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            if Instant::now() >= deadline {
                return Err(BufferError::FlushInDoubt.into());
            }
        }
    }

    /// Flushes now and returns once every delta added before the call has
    /// committed (with a [sink](BufferBuilder::sink): was taken by it).
    /// While the database (or the sink) is unreachable it waits (the flush
    /// is being retried); wrap it in `tokio::time::timeout` to bound that.
    ///
    /// Sketches of unique keys ([`CounterBuffer::observe`]) are flushed in
    /// the same cycle: committed when this returns, unless three attempts
    /// failed, in which case they are pending again (still read by
    /// [`CounterBuffer::unique`], retried by the next cycle, the error in
    /// [`BufferStats::last_error`]); a sketch table that is missing never
    /// holds the deltas' flushes back.
    pub async fn flush(&self) -> Result<()> {
        let shared = self.shared();
        let target = shared.requests.fetch_add(1, Ordering::SeqCst) + 1;
        shared.wake.notify_one();
        let mut flushed = shared.flushed.subscribe();
        let done = *flushed
            .wait_for(|done| *done >= target)
            .await
            .map_err(|_| CounterError::from(BufferError::Closed))?;
        if done == u64::MAX {
            self.stopped()?;
        }
        Ok(())
    }

    /// `Ok` if the flusher stopped after flushing everything.
    fn stopped(&self) -> Result<()> {
        if self.shared().stopped_cleanly.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(BufferError::FlusherStopped {
                unflushed: self.stats().pending_adds,
            }
            .into())
        }
    }

    /// Stops taking adds, flushes everything pending, waits for it to
    /// commit, and stops the flusher. Later adds fail with
    /// [`BufferError::Closed`]. Like [`CounterBuffer::flush`] it
    /// waits out an unreachable database or sink.
    pub async fn shutdown(&self) -> Result<BufferStats> {
        let shared = self.shared();
        shared.close();
        let mut flushed = shared.flushed.subscribe();
        flushed
            .wait_for(|done| *done == u64::MAX)
            .await
            .map_err(|_| CounterError::from(BufferError::Closed))?;
        self.stopped()?;
        Ok(self.stats())
    }

    /// What the buffer holds and has done so far.
    pub fn stats(&self) -> BufferStats {
        let shared = self.shared();
        let flying = shared.in_flight().map_or(0, |d| d.adds);
        let (accepted, waiting) = shared.pending.accepted_and_waiting();
        shared.meter.snapshot(
            accepted,
            waiting,
            flying,
            shared.pending.counters(),
            shared.sketches.len(),
        )
    }

    /// This buffer's id in the [`FlushLedger`] (a UUID, new per start).
    pub fn writer_id(&self) -> &str {
        &self.shared().writer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CounterTable;

    #[test]
    fn a_flusher_that_dies_with_its_runtime_is_reported() {
        let runtime = |()| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
        };
        let first = runtime(());
        let counters = Counters::<i64>::new(CounterTable::new("t").expect("a valid name"));
        let buffer = first.block_on(async {
            let db = sea_orm::Database::connect("sqlite::memory:")
                .await
                .expect("SQLite");
            counters.create_table(&db).await.expect("the table");
            FlushLedger::default()
                .create_table(&db)
                .await
                .expect("the ledger");
            let buffer = CounterBuffer::builder(&db)
                .interval(Duration::from_secs(3600))
                .start()
                .await
                .expect("a buffer");
            buffer.add(&counters, 1, "likes", 1).expect("taken");
            buffer
        });
        // The flusher task goes with its runtime, its delta unflushed.
        drop(first);
        let err = runtime(())
            .block_on(buffer.flush())
            .expect_err("not flushed");
        assert!(
            matches!(
                err,
                CounterError::Buffer(BufferError::FlusherStopped { unflushed: 1 })
            ),
            "{err:?}"
        );
        let err = buffer.add(&counters, 1, "likes", 1).expect_err("closed");
        assert!(
            matches!(err, CounterError::Buffer(BufferError::Closed)),
            "{err:?}"
        );
    }
}
