//! Which owners a write changed, told after its commit: the hook a cache in
//! front of the counters (the `counter-redis` crate) invalidates through.
//!
//! Every write path of the crate reports the owners it touched: single
//! writes, [`DeltaBatch`](crate::DeltaBatch)es, counter-cache hooks and the
//! `*_counted` helpers, [`CounterBuffer`](crate::CounterBuffer) flushes,
//! recount repairs, resets and purges. What happens to the report depends on who
//! owns the transaction:
//!
//! * **The crate committed it** (a write on a pool, a transaction of its
//!   own): every [`CommitObserver`] registered for the table is told
//!   [`committed`](CommitObserver::committed) and awaited before the call
//!   returns. On a pool this runs in the same detached task as the
//!   statement (see the crate's "Dropped calls"), so a caller dropped after
//!   the commit still has its owners told.
//! * **The caller's transaction**, which only the caller can commit: inside
//!   a [`scope`] the owners are collected, and the caller hands them to
//!   [`Touched::committed`] after its `COMMIT`. Outside any scope the
//!   observers are told [`uncommitted`](CommitObserver::uncommitted), and
//!   can only guess when the commit comes.
//!
//! Observers are process-wide, per table name, like a `tracing` subscriber:
//! a cache installed for `post_counters` sees every write this process makes
//! to it through the library, whichever handle made it. With no observer
//! registered, reporting costs one atomic load.

use std::{
    collections::BTreeMap,
    future::Future,
    pin::Pin,
    sync::{
        Arc, Mutex, RwLock, Weak,
        atomic::{AtomicUsize, Ordering},
    },
};

use sea_orm::Value;

/// A boxed future of an observer's reaction.
pub type ObserverFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Something told which owners of a counter table the library's writes
/// changed: a cache that must forget them. Register it with [`register`].
///
/// Owners are the `owner_id` values as bound in SQL (`Value::BigInt`,
/// `Value::String`, ...). The calls must not fail: an observer that cannot
/// do its job (Redis is down) keeps the owners and retries on its own, since
/// the write they report has committed and must not be reported as failed.
pub trait CommitObserver: Send + Sync + 'static {
    /// `owners` of `table` were written and committed (or the outcome is
    /// unknown: a lost `COMMIT` reply is reported too, as a commit).
    fn committed<'a>(&'a self, table: &'a str, owners: &'a [Value]) -> ObserverFuture<'a>;

    /// `owners` of `table` were written in a transaction the library does
    /// not own, outside any [`scope`]: the commit has not happened yet, and
    /// nobody will say when it does.
    fn uncommitted(&self, table: &str, owners: &[Value]);

    /// Every count of `table` was deleted ([`Counters::clear`](crate::Counters::clear)).
    fn cleared<'a>(&'a self, table: &'a str) -> ObserverFuture<'a>;

    /// Every count of `table` was deleted in a transaction the library does
    /// not own, outside any [`scope`].
    fn uncommitted_clear(&self, table: &str);
}

type Observers = BTreeMap<String, Vec<Weak<dyn CommitObserver>>>;

static OBSERVERS: RwLock<Observers> = RwLock::new(BTreeMap::new());
/// Live registrations, so that reporting without observers is one load.
static REGISTERED: AtomicUsize = AtomicUsize::new(0);

/// Tells `observer` about every write to `table` from now on, for as long
/// as it lives: the registry keeps a weak reference, so dropping the last
/// `Arc` of the observer ends it.
pub fn register(table: &str, observer: &Arc<dyn CommitObserver>) {
    let mut observers = OBSERVERS.write().unwrap_or_else(|e| e.into_inner());
    let list = observers.entry(table.to_owned()).or_default();
    list.retain(|o| o.strong_count() > 0);
    let new = Arc::downgrade(observer);
    // Registering twice (a handle taken per request) changes nothing.
    if !list.iter().any(|o| o.ptr_eq(&new)) {
        list.push(new);
    }
    observers.retain(|_, list| {
        list.retain(|o| o.strong_count() > 0);
        !list.is_empty()
    });
    let live = observers.values().map(Vec::len).sum();
    REGISTERED.store(live, Ordering::Release);
}

/// The live observers of `table`.
fn observers_of(table: &str) -> Vec<Arc<dyn CommitObserver>> {
    if REGISTERED.load(Ordering::Acquire) == 0 {
        return Vec::new();
    }
    let observers = OBSERVERS.read().unwrap_or_else(|e| e.into_inner());
    observers
        .get(table)
        .map(|list| list.iter().filter_map(Weak::upgrade).collect())
        .unwrap_or_default()
}

/// Whether any observer is registered at all: write paths skip collecting
/// owners when none is.
pub(crate) fn active() -> bool {
    REGISTERED.load(Ordering::Acquire) > 0
}

/// Owners touched per counter table, to be told once their transaction has
/// committed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Touched {
    tables: BTreeMap<String, Vec<Value>>,
    /// Tables whose every count was deleted.
    cleared: std::collections::BTreeSet<String>,
}

impl Touched {
    /// Nothing touched.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `owners` of `table` as touched: for raw SQL on a counter
    /// table inside a [`scope`]d transaction.
    pub fn touch<V: Into<Value>>(&mut self, table: &str, owners: impl IntoIterator<Item = V>) {
        let list = self.tables.entry(table.to_owned()).or_default();
        list.extend(owners.into_iter().map(Into::into));
    }

    /// Whether no owner was touched and no table cleared.
    pub fn is_empty(&self) -> bool {
        self.tables.values().all(Vec::is_empty) && self.cleared.is_empty()
    }

    /// Records every count of `table` as deleted (if any observer is
    /// registered).
    pub(crate) fn clear(table: &str) -> Self {
        let mut touched = Self::new();
        if active() {
            touched.cleared.insert(table.to_owned());
        }
        touched
    }

    /// The touched owners, by table.
    pub fn tables(&self) -> impl Iterator<Item = (&str, &[Value])> {
        self.tables.iter().map(|(t, o)| (t.as_str(), o.as_slice()))
    }

    /// Adds everything `other` touched.
    pub fn merge(&mut self, other: Touched) {
        for (table, owners) in other.tables {
            self.tables.entry(table).or_default().extend(owners);
        }
        self.cleared.extend(other.cleared);
    }

    /// Tells every observer of each table that its owners committed, and
    /// waits for them. Call it after the `COMMIT` of the transaction the
    /// owners were touched in.
    pub async fn committed(self) {
        for (table, owners) in &self.tables {
            for observer in observers_of(table) {
                observer.committed(table, owners).await;
            }
        }
        for table in &self.cleared {
            for observer in observers_of(table) {
                observer.cleared(table).await;
            }
        }
    }

    /// Reports a write: `committed` when it ran on a pool (autocommit),
    /// else it ran in a transaction someone else commits.
    pub(crate) async fn wrote(self, committed: bool) {
        if self.is_empty() {
            return;
        }
        if committed {
            return self.committed().await;
        }
        self.in_transaction();
    }

    /// The owners of one table, if any observer is registered (else
    /// nothing, and nothing is allocated).
    pub(crate) fn of(table: &str, owners: impl IntoIterator<Item = Value>) -> Self {
        let mut touched = Self::new();
        if active() {
            touched.touch(table, owners);
        }
        touched
    }

    /// The owners were written in a transaction someone else commits.
    pub(crate) fn in_transaction(self) {
        if self.is_empty() {
            return;
        }
        let leftover = SCOPE
            .try_with(|scope| {
                scope
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .merge(self.clone());
            })
            .is_err();
        if leftover {
            for (table, owners) in &self.tables {
                for observer in observers_of(table) {
                    observer.uncommitted(table, owners);
                }
            }
            for table in &self.cleared {
                for observer in observers_of(table) {
                    observer.uncommitted_clear(table);
                }
            }
        }
    }
}

tokio::task_local! {
    static SCOPE: Arc<Mutex<Touched>>;
}

/// Runs `work` (the body of a transaction the caller commits) collecting
/// the owners that the library's writes inside it touch, counter-cache
/// hooks included; returns them beside its output. Hand them to
/// [`Touched::committed`] after the `COMMIT`; drop them after a rollback.
///
/// The collection is task-local: writes in tasks that `work` spawns are not
/// seen (they are told as uncommitted).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use counter_core::{CounterTable, Counters, observe};
/// use sea_orm::TransactionTrait;
///
/// let db = sea_orm::Database::connect("sqlite::memory:").await?;
/// let posts = Counters::<i64>::new(CounterTable::new("post_counters")?);
/// posts.create_table(&db).await?;
///
/// let txn = db.begin().await?;
/// let (written, touched) = observe::scope(posts.increment(&txn, 7, "likes")).await;
/// written?;
/// txn.commit().await?;
/// touched.committed().await; // a cache forgets post 7 now
/// # Ok(())
/// # }
/// ```
pub async fn scope<F: Future>(work: F) -> (F::Output, Touched) {
    let collected = Arc::new(Mutex::new(Touched::new()));
    let output = SCOPE.scope(collected.clone(), work).await;
    let touched = std::mem::take(&mut *collected.lock().unwrap_or_else(|e| e.into_inner()));
    (output, touched)
}
