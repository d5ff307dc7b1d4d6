//! The cache itself: a connection, its settings and counters, and what
//! every handle of it shares: the in-process flights, the fill bound and
//! the set of owners whose invalidation is still owed.

use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex, Weak},
    time::{Duration, Instant},
};

use counter_core::{
    Counters, KeySpace, OwnerId,
    observe::{self, CommitObserver, ObserverFuture},
};
use sea_orm::Value;
use tokio::sync::{Notify, Semaphore, watch};
use tracing::Instrument;

use crate::{
    CacheBuilder, CacheError, CacheStats, CachedCounters, RedisTarget,
    breaker::Breaker,
    config::Config,
    keys,
    link::Link,
    stats::{Meter, bump},
};

/// A shared Redis cache of counter totals: one value per owner, read many
/// owners at a time, filled under leases, deleted after every commit.
///
/// Cheap to clone; build one per process and Redis target, then take a
/// handle per counter table with [`CountCache::table`]. See the crate
/// documentation for what it guarantees.
#[derive(Clone)]
pub struct CountCache {
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) link: Link,
    /// Where Redis is: a subscription connects on its own.
    pub(crate) target: crate::RedisTarget,
    pub(crate) config: Config,
    pub(crate) meter: Meter,
    pub(crate) breaker: Breaker,
    /// Owners whose deletion is owed (it failed, or a commit may still
    /// come). Reads here skip them: this process never serves a value it
    /// knows may be stale.
    pub(crate) owed: Mutex<HashMap<Vec<u8>, Owed>>,
    /// Fills in progress in this process, by key: later readers of the
    /// same owner wait for them instead of filling again.
    /// Dropping the sender (the fill ended, however) wakes them.
    pub(crate) flights: Mutex<HashMap<Vec<u8>, watch::Sender<()>>>,
    pub(crate) fills: Semaphore,
    /// Wakes the retry task when an owner becomes owed.
    pub(crate) retry_wake: Notify,
    /// This cache, for tasks it spawns.
    me: Weak<Shared>,
    /// The runtime the cache was built on, where its connection lives.
    /// Writes are reported from whatever runtime made them (a test suite
    /// runs one per test; the registry is process-wide): their Redis work
    /// runs here, never on a runtime that may shut down under the
    /// connection, and a failure there never reaches the writer.
    runtime: tokio::runtime::Handle,
}

/// A deletion this process owes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Owed {
    /// When to try it (next).
    due: Instant,
    /// When it was last owed: a deletion sent before that does not pay it.
    since: Instant,
    /// The earliest a deletion pays it: when it was owed, for a failed
    /// deletion; after the delay, for the second deletion of a write in a
    /// transaction outside any scope (whose commit may come later).
    pays_from: Instant,
}

/// Keys per `UNLINK`, each its own Redis operation under the timeout.
const UNLINK_CHUNK: usize = 1_000;
/// Owed deletions the retry task sends per pass.
const RETRY_BATCH: usize = 20_000;

impl std::fmt::Debug for CountCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountCache")
            .field("namespace", &self.shared.config.namespace)
            .field("stats", &self.stats())
            .finish()
    }
}

impl CountCache {
    /// Settings for a cache on `target`.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), counter_redis::CacheError> {
    /// use counter_redis::{CountCache, RedisTarget};
    /// let cache = CountCache::builder(RedisTarget::standalone("redis://127.0.0.1:6379"))
    ///     .namespace("blog")
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn builder(target: RedisTarget) -> CacheBuilder {
        CacheBuilder::new(target)
    }

    pub(crate) fn start(link: Link, target: crate::RedisTarget, config: Config) -> Self {
        let shared = Arc::new_cyclic(|me| Shared {
            me: me.clone(),
            runtime: tokio::runtime::Handle::current(),
            link,
            target,
            meter: Meter::default(),
            breaker: Breaker::new(config.breaker_failures, config.breaker_open),
            owed: Mutex::default(),
            flights: Mutex::default(),
            fills: Semaphore::new(config.max_concurrent_fills),
            retry_wake: Notify::new(),
            config,
        });
        tokio::spawn(retry_owed(Arc::downgrade(&shared)));
        Self { shared }
    }

    /// A cached handle on `counters`' table (`post::Entity::counters()`,
    /// or an untyped one). From now on every write this process makes to
    /// that table through the library deletes the owners it touched after
    /// its commit (see [`counter_core::observe`]), whichever handle made it.
    pub fn table<I: OwnerId, S: KeySpace>(
        &self,
        counters: &Counters<I, S>,
    ) -> CachedCounters<I, S> {
        let observer: Arc<dyn CommitObserver> = self.shared.clone();
        observe::register(counters.table().name(), &observer);
        CachedCounters::new(self.clone(), counters.clone())
    }

    /// What the cache has done since it was built.
    pub fn stats(&self) -> CacheStats {
        let mut stats = self.shared.meter.snapshot();
        stats.invalidations_pending = self.shared.owed().len() as u64;
        stats
    }

    /// Waits until every deletion this process owed when it was called has
    /// reached Redis, sending them again now, for at most `within`. `Ok`
    /// means read-your-writes holds for every write this process made
    /// before the call: other processes' cached reads include them.
    ///
    /// A write through the library returns `Ok` once it committed, even if
    /// the deletion after it could not reach Redis (a timeout, a paused or
    /// failing-over server): then other processes may read the old total
    /// until the deletion is retried or the TTL ends. A caller that must
    /// know, such as a handler that redirects to a page another process
    /// renders, calls this after the write:
    ///
    /// ```no_run
    /// # async fn f(posts: counter_redis::CachedCounters<i64>, db: sea_orm::DatabaseConnection) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// posts.increment(&db, 7, "likes").await?;
    /// match posts.cache().flush_invalidations(Duration::from_millis(200)).await {
    ///     Ok(()) => {}          // every process reads the new total
    ///     Err(owed) => tracing::warn!(%owed, "other processes may read the old total for a while"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// Owners written in a transaction outside any scope stay owed until
    /// their second deletion, `unscoped_delay` after the write. Costs
    /// nothing when nothing is owed (one lock of the owed set).
    pub async fn flush_invalidations(&self, within: Duration) -> Result<(), CacheError> {
        let deadline = Instant::now() + within;
        let snapshot: Vec<Vec<u8>> = self.shared.owed().keys().cloned().collect();
        let mut pause = Duration::from_millis(5);
        loop {
            let still: Vec<Vec<u8>> = {
                let owed = self.shared.owed();
                snapshot
                    .iter()
                    .filter(|key| owed.contains_key(*key))
                    .cloned()
                    .collect()
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if still.is_empty() {
                return Ok(());
            }
            if left.is_zero() {
                return Err(CacheError::InvalidationsOwed {
                    owners: still.len(),
                    within,
                });
            }
            // Bounded by what is left: each chunk's deletion is bounded by
            // the cache's timeout, a flush by `within`.
            let _ = tokio::time::timeout(left, self.shared.unlink_all(&still)).await;
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// Whether Redis answers a `PING` within `within` (a cluster: every
    /// master): a readiness probe's question. The cache never needs it to
    /// serve: a Redis that does not answer sends reads to the database.
    pub async fn ping(&self, within: Duration) -> Result<(), CacheError> {
        match tokio::time::timeout(within, self.shared.link.ping()).await {
            Ok(answer) => answer.map_err(CacheError::Redis),
            Err(_) => Err(CacheError::Redis(redis::RedisError::from((
                redis::ErrorKind::Io,
                "no answer to PING",
                format!("within {within:?}"),
            )))),
        }
    }

    /// The namespace of its keys.
    pub fn namespace(&self) -> &str {
        &self.shared.config.namespace
    }

    /// Runs `work` in a new transaction on `db`, commits it, then deletes
    /// every owner the library's writes inside it touched (counter-cache
    /// hooks included): the one way to write in your own transaction and
    /// keep read-your-writes. On an error `work` returns, the transaction
    /// rolls back and nothing is deleted.
    ///
    /// ```no_run
    /// # async fn f(cache: counter_redis::CountCache, db: sea_orm::DatabaseConnection) -> Result<(), sea_orm::DbErr> {
    /// use sea_orm::{ActiveModelTrait, DatabaseTransaction};
    /// cache
    ///     .transaction(&db, |txn: &DatabaseTransaction| Box::pin(async move {
    ///         // comment.insert(txn).await?; (counter-cache hooks count the post)
    ///         Ok::<_, sea_orm::DbErr>(())
    ///     }))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn transaction<T, E, F>(
        &self,
        db: &sea_orm::DatabaseConnection,
        work: F,
    ) -> Result<T, E>
    where
        F: for<'c> FnOnce(
            &'c sea_orm::DatabaseTransaction,
        )
            -> std::pin::Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'c>>,
        E: From<sea_orm::DbErr>,
    {
        use sea_orm::{SqliteTransactionMode, TransactionOptions, TransactionTrait};
        // BEGIN IMMEDIATE on SQLite, as the library's own counted writes:
        // a deferred transaction that reads, then writes, fails when
        // another writer commits in between.
        let options = TransactionOptions {
            sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
            ..Default::default()
        };
        let txn = db.begin_with_options(options).await?;
        let (outcome, touched) = observe::scope(work(&txn)).await;
        match outcome {
            Ok(value) => {
                let committed = txn.commit().await;
                // Told even if COMMIT failed: its outcome is unknown.
                touched.committed().await;
                committed?;
                Ok(value)
            }
            Err(e) => {
                // The caller's error, not the rollback's.
                if let Err(rollback) = txn.rollback().await {
                    tracing::warn!(%rollback, "counter cache: rolling back a failed transaction failed");
                }
                Err(e)
            }
        }
    }
}

impl Shared {
    pub(crate) fn key(&self, table: &str, owner: &Value) -> Vec<u8> {
        keys::owner_key(&self.config.namespace, table, owner)
    }

    pub(crate) fn owed(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Owed>> {
        self.owed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `op` against Redis, bounded by the timeout and skipped while the
    /// breaker is open; failures are counted and fed to the breaker.
    pub(crate) async fn redis<T>(
        &self,
        op: impl Future<Output = redis::RedisResult<T>>,
    ) -> Option<T> {
        if !self.breaker.allows() {
            return None;
        }
        self.attempt(op).await
    }

    /// `op` against Redis, bounded by the timeout, whatever the breaker
    /// says: a deletion after a commit is always tried once (the breaker
    /// may have opened on reads of something else), and skipping it would
    /// leave other processes stale although Redis answers.
    pub(crate) async fn attempt<T>(
        &self,
        op: impl Future<Output = redis::RedisResult<T>>,
    ) -> Option<T> {
        let outcome = tokio::time::timeout(self.config.timeout, op).await;
        match outcome {
            Ok(Ok(value)) => {
                self.breaker.success();
                Some(value)
            }
            failed => {
                bump(&self.meter.redis_errors, 1);
                if self.breaker.failure() {
                    bump(&self.meter.breaker_opens, 1);
                    tracing::warn!(
                        open_for_ms = self.config.breaker_open.as_millis() as u64,
                        "counter cache: Redis keeps failing; reads go to the database for a while"
                    );
                }
                match failed {
                    Ok(Err(error)) => {
                        tracing::debug!(%error, "counter cache: Redis operation failed")
                    }
                    _ => tracing::debug!("counter cache: Redis operation timed out"),
                }
                None
            }
        }
    }

    /// Deletes the keys of `keys` now; any that cannot be deleted are
    /// owed, retried in the background, and skipped by this process's
    /// reads until they are.
    pub(crate) async fn invalidate(&self, mut keys: Vec<Vec<u8>>) {
        keys.sort_unstable();
        keys.dedup();
        let failed = self.unlink_all(&keys).await;
        if failed.is_empty() {
            return;
        }
        bump(&self.meter.invalidation_failures, failed.len());
        tracing::warn!(
            owners = failed.len(),
            "counter cache: could not delete owners after a commit; retrying in the background (stale for at most the TTL elsewhere)"
        );
        let now = Instant::now();
        self.owe(failed, now + Duration::from_millis(50), now);
    }

    /// `UNLINK`s `keys`, a chunk per Redis operation (each must fit the
    /// timeout); pays the owed deletions they cover; returns the keys of
    /// the chunks that failed.
    async fn unlink_all(&self, keys: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let mut failed = Vec::new();
        for chunk in keys.chunks(UNLINK_CHUNK) {
            let sent = Instant::now();
            if self.attempt(self.link.unlink(chunk)).await.is_none() {
                failed.extend_from_slice(chunk);
                continue;
            }
            bump(&self.meter.invalidations, chunk.len());
            // Only what was owed before this delete was sent, and may be
            // paid by then: a failure recorded since, or a second delete
            // still to come (a write in a transaction outside a scope),
            // stays owed.
            let mut owed = self.owed();
            for key in chunk {
                if owed
                    .get(key)
                    .is_some_and(|o| o.since <= sent && o.pays_from <= sent)
                {
                    owed.remove(key);
                }
            }
        }
        failed
    }

    /// Owes the deletion of `keys`: tried at `due`, paid by a deletion
    /// sent from `pays_from` on.
    fn owe(&self, keys: Vec<Vec<u8>>, due: Instant, pays_from: Instant) {
        let now = Instant::now();
        let mut owed = self.owed();
        for key in keys {
            let entry = owed.entry(key).or_insert(Owed {
                due,
                since: now,
                pays_from,
            });
            entry.due = entry.due.max(due);
            entry.since = now;
            entry.pays_from = entry.pays_from.max(pays_from);
        }
        drop(owed);
        self.retry_wake.notify_one();
    }

    /// Deletes every key of `table`, scanning a standalone server a step at
    /// a time (each step its own operation under the timeout). A cluster
    /// is left to the TTL: a scan would have to visit every master.
    async fn clear(&self, table: &str) {
        let pattern = keys::table_pattern(&self.config.namespace, table);
        let mut backoff = Duration::from_millis(50);
        for attempt in 1..=10 {
            if self.clear_once(&pattern).await {
                return;
            }
            bump(&self.meter.invalidation_failures, 1);
            tracing::warn!(
                table,
                attempt,
                "counter cache: could not delete a cleared table's owners; trying again"
            );
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
        tracing::error!(
            table,
            "counter cache: gave up deleting a cleared table's owners; stale for at most the TTL"
        );
    }

    /// One pass of [`Shared::clear`]; false if a scan step failed.
    async fn clear_once(&self, pattern: &str) -> bool {
        let mut cursor = 0;
        loop {
            let Some((next, keys)) = self.attempt(self.link.scan(pattern, cursor)).await else {
                return false;
            };
            self.invalidate(keys).await;
            if next == 0 {
                return true;
            }
            cursor = next;
        }
    }
}

impl Shared {
    /// Runs `work` on the cache's own runtime (see `runtime`) and waits for
    /// it; if that runtime is gone or the work panicked, the owners are
    /// counted as failed deletions (stale elsewhere for at most the TTL).
    async fn on_own_runtime<F, Fut>(&self, owners: usize, work: F)
    where
        F: FnOnce(Arc<Shared>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Some(shared) = self.me.upgrade() else {
            return;
        };
        // In the writer's span: a failed deletion's warning names its request.
        let work = work(shared).instrument(tracing::Span::current());
        if self.runtime.spawn(work).await.is_err() {
            bump(&self.meter.invalidation_failures, owners);
            tracing::warn!(
                owners,
                "counter cache: the cache's runtime could not delete owners after a commit"
            );
        }
    }
}

impl CommitObserver for Shared {
    fn committed<'a>(&'a self, table: &'a str, owners: &'a [Value]) -> ObserverFuture<'a> {
        let keys: Vec<Vec<u8>> = owners.iter().map(|o| self.key(table, o)).collect();
        Box::pin(self.on_own_runtime(keys.len(), |shared| async move {
            shared.invalidate(keys).await;
        }))
    }

    fn uncommitted(&self, table: &str, owners: &[Value]) {
        // The commit is still to come and nobody will say when: delete now
        // (so that no value older than the write is served for long) and
        // again after the delay (a fill before the commit may have stored
        // the old total); this process skips them until then.
        bump(&self.meter.unscoped_writes, owners.len());
        let keys: Vec<Vec<u8>> = owners.iter().map(|o| self.key(table, o)).collect();
        // `unscoped_delay` is bounded at build, so this cannot overflow.
        let second = Instant::now() + self.config.unscoped_delay;
        self.owe(keys.clone(), second, second);
        if let Some(shared) = self.me.upgrade() {
            let unlink = async move {
                for chunk in keys.chunks(UNLINK_CHUNK) {
                    shared.attempt(shared.link.unlink(chunk)).await;
                }
            };
            self.runtime
                .spawn(unlink.instrument(tracing::Span::current()));
        }
    }

    fn cleared<'a>(&'a self, table: &'a str) -> ObserverFuture<'a> {
        let table = table.to_owned();
        Box::pin(self.on_own_runtime(1, |shared| async move {
            shared.clear(&table).await;
        }))
    }

    fn uncommitted_clear(&self, table: &str) {
        // As `uncommitted`: now, and again after the delay.
        bump(&self.meter.unscoped_writes, 1);
        let Some(shared) = self.me.upgrade() else {
            return;
        };
        let table = table.to_owned();
        let clear = async move {
            shared.clear(&table).await;
            tokio::time::sleep(shared.config.unscoped_delay).await;
            shared.clear(&table).await;
        };
        self.runtime
            .spawn(clear.instrument(tracing::Span::current()));
    }
}

/// The background task: deletes owed owners when they come due, up to
/// [`RETRY_BATCH`] per pass, backing off while Redis fails; ends when the
/// cache is dropped.
async fn retry_owed(shared: Weak<Shared>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let Some(cache) = shared.upgrade() else {
            return;
        };
        let now = Instant::now();
        let (due, next): (Vec<Vec<u8>>, Option<Instant>) = {
            let owed = cache.owed();
            let due = owed
                .iter()
                .filter(|(_, o)| o.due <= now)
                .take(RETRY_BATCH)
                .map(|(k, _)| k.clone())
                .collect();
            let next = owed.values().map(|o| o.due).filter(|at| *at > now).min();
            (due, next)
        };
        if !due.is_empty() {
            let failed = cache.unlink_all(&due).await;
            if failed.is_empty() {
                backoff = Duration::from_millis(50);
            } else {
                let retry_at = Instant::now() + backoff;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                let mut owed = cache.owed();
                for key in failed {
                    if let Some(o) = owed.get_mut(&key) {
                        o.due = o.due.max(retry_at);
                    }
                }
            }
            continue;
        }
        let wait = next.map_or(Duration::from_secs(1), |at| {
            at.saturating_duration_since(now)
        });
        // Holding the cache for at most a second: a dropped cache's task
        // ends at its next turn.
        let wake = cache.retry_wake.notified();
        tokio::select! {
            () = wake => {}
            () = tokio::time::sleep(wait.min(Duration::from_secs(1))) => {}
        }
    }
}
