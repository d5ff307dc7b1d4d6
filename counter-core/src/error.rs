//! The one error type every counter operation returns, and its classes.

use sea_orm::DbErr;

/// What a caller can do about a [`CounterError`]: its class, from
/// [`CounterError::kind`]. An HTTP handler maps each class to one status;
/// a job runner retries [`ErrorKind::Transient`] and nothing else.
///
/// ```
/// use counter_core::{CounterError, ErrorKind};
///
/// fn status(err: &CounterError) -> u16 {
///     match err.kind() {
///         ErrorKind::InvalidInput => 400,
///         ErrorKind::Overflow => 409,
///         ErrorKind::Transient => 503,
///         _ => 500,
///     }
/// }
/// let err = counter_core::validate_key("no spaces").unwrap_err();
/// assert_eq!(status(&err), 400);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The caller's argument was refused before any SQL ran: a bad key,
    /// owner or table name, an unknown key name, a number out of range, a
    /// reversed time range, a range read of a key without a window. Safe to
    /// show to whoever sent it.
    InvalidInput,
    /// A sum would leave `i64`: a delta, a fold, a total. Nothing was written.
    Overflow,
    /// Worth retrying as it is, later: a write conflict (a deadlock, a
    /// serialization failure, a lock wait timeout) whose retries ran out, or
    /// that happened in the caller's transaction (retry the transaction),
    /// a busy recount, a full buffer, an unresolved flush, a database that
    /// could not be reached or a connection lost (reset, closed, a server
    /// shutting down, a Galera node leaving its cluster), a server that
    /// takes no writes now (a standby, a primary demoted in a failover), a
    /// transaction pooler that lost a prepared statement, whichever call met
    /// it and wherever in the call.
    ///
    /// A write whose connection was lost mid-statement or at its `COMMIT`
    /// may have committed: retrying it may count it twice. Where that
    /// matters, write through a path that applies an id once (a
    /// `CounterBuffer`'s ledger, `counter-mq`, the counting service's
    /// `Idempotency-Key`).
    Transient,
    /// The companion table (or the buffer's ledger table) does not exist:
    /// a migration has not run.
    SchemaMissing,
    /// The program used the crate in a way it refuses: a counter-cache write
    /// on a pool, a multi-statement batch outside a transaction, a truth
    /// that names no counter cache, a buffer used after shutdown or outside
    /// a runtime, an unsupported backend, a walk the database ordered unlike
    /// the companion table. Fix the code; retrying does not help.
    Misuse,
    /// Any other database error, passed through as it came.
    Database,
}

/// Everything that can go wrong in a counter operation.
///
/// Bad input (keys, table names, slot counts, overflowing deltas) is rejected
/// before any SQL runs, so a caller can match on these variants instead of
/// parsing database messages. Database failures that we can recognise across
/// backends (a missing companion table, a deadlock) get variants of their own;
/// everything else is passed through untouched in [`CounterError::Database`].
/// Callers that only need to know what to do match on
/// [`CounterError::kind`]. Messages are one line and say what happened; what
/// to do about each is told here, on its variant.
///
/// It converts into `sea_orm::DbErr` (for code and hooks that return
/// `DbErr`, with `?`) and back, typed: see [`From<CounterError> for
/// DbErr`](#impl-From%3CCounterError%3E-for-DbErr). With the `loco` feature
/// it converts into `loco_rs::Error`, so `?` works in a Loco handler. An
/// application's own error type needs one `From` impl, which can sort by
/// [`CounterError::kind`]:
///
/// ```
/// use counter_core::{CounterError, ErrorKind};
///
/// #[derive(Debug)]
/// enum AppError {
///     BadRequest(String),
///     Unavailable,
///     Internal(CounterError),
/// }
///
/// impl From<CounterError> for AppError {
///     fn from(err: CounterError) -> Self {
///         match err.kind() {
///             ErrorKind::InvalidInput => AppError::BadRequest(err.to_string()),
///             ErrorKind::Transient => AppError::Unavailable,
///             _ => AppError::Internal(err),
///         }
///     }
/// }
///
/// fn handler(key: &str) -> Result<(), AppError> {
///     counter_core::validate_key(key)?; // `?` converts
///     Ok(())
/// }
/// assert!(matches!(handler("bad key"), Err(AppError::BadRequest(_))));
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CounterError {
    /// A counter key broke the rules of [`CounterKey`](crate::CounterKey).
    #[error("invalid counter key {key:?}: {reason}")]
    InvalidKey {
        /// The offending key (shortened to 80 characters for display).
        key: String,
        /// Which rule it broke.
        reason: &'static str,
    },

    /// A string that names none of an entity's declared counters, when
    /// parsing a key enum generated by `#[derive(SlottedCounter)]`.
    #[error("unknown counter key {key:?}: expected one of {known}", known = .expected.join(", "))]
    UnknownKey {
        /// The string given (shortened to 80 characters for display).
        key: String,
        /// The declared keys.
        expected: &'static [&'static str],
    },

    /// A companion table name broke the rules in [`crate::CounterTable::new`].
    #[error("invalid counter table name {name:?}: {reason}")]
    InvalidTableName {
        /// The offending name (shortened to 80 characters for display).
        name: String,
        /// Which rule it broke.
        reason: &'static str,
    },

    /// An owner id the companion table cannot store exactly (see [`crate::OwnerId`]).
    #[error("invalid owner id {owner:?}: {reason}")]
    InvalidOwner {
        /// The offending id (shortened to 80 characters for display).
        owner: String,
        /// Which rule it broke.
        reason: &'static str,
    },

    /// A number outside its allowed range: a slot count, a page or batch
    /// size, a buffer setting. The bounds are in [`crate::limits`] and on the
    /// setting's own documentation.
    #[error("{what} {value} is out of range: it must be between {min} and {max}")]
    OutOfRange {
        /// Which setting.
        what: &'static str,
        /// The value given.
        value: i128,
        /// The smallest allowed.
        min: i128,
        /// The largest allowed.
        max: i128,
    },

    /// A value would not fit in an `i64`: a folded batch delta, a negated
    /// delta, a slot value or a counter total. Checked, never wrapped.
    #[error("counter overflow: {context} does not fit in a signed 64-bit integer")]
    Overflow {
        /// What overflowed.
        context: String,
    },

    /// The companion table is not in the database: run its migration
    /// ([`Counters::migration`](crate::Counters::migration)) before counting.
    #[error("counter table `{table}` does not exist")]
    MissingTable {
        /// The table that was not found.
        table: String,
        /// The database's own error.
        #[source]
        source: DbErr,
    },

    /// A deadlock, serialization failure or lock timeout: the database undid
    /// the statement. On a pool it is returned only after the retries ran
    /// out. On any other connection it is returned at once: inside a
    /// transaction, PostgreSQL has aborted the transaction and MySQL has
    /// rolled it back (deadlock) or undone the statement (lock wait timeout),
    /// and only the caller can run the transaction again.
    ///
    /// On MySQL/MariaDB, a deadlock inside a savepoint the crate opened in
    /// the caller's transaction (a windowed `add`, a batch of several
    /// statements) has rolled back the whole transaction, but the driver
    /// still counts the savepoint: the caller's `rollback()` may then fail
    /// with 1305 "SAVEPOINT does not exist". Nothing is applied either way;
    /// dropping the transaction is enough.
    #[error(
        "write conflict on counter table `{table}` after {attempts} attempt(s){inside}",
        inside = if *.in_transaction { " in a transaction" } else { "" }
    )]
    Conflict {
        /// The table written to.
        table: String,
        /// How many times the statement was tried.
        attempts: u32,
        /// Whether the connection was not known to be a pool (so no retry
        /// was made): a transaction, or a connection type that may be one.
        in_transaction: bool,
        /// The last database error.
        #[source]
        source: DbErr,
    },

    /// The connection's backend is not one this crate has SQL for (it
    /// speaks SQLite, PostgreSQL and MySQL/MariaDB).
    #[error("unsupported database backend {0}")]
    UnsupportedBackend(String),

    /// [`Counters::purge_orphans`](crate::Counters::purge_orphans) or a
    /// [`Counters::cascade_migration`](crate::Counters::cascade_migration)
    /// needs the owner table, and the handle was built by hand without
    /// [`CounterTable::with_owner`](crate::CounterTable::with_owner).
    #[error("counter table `{table}` does not know its owner table")]
    NoOwnerTable {
        /// The counter table.
        table: String,
    },

    /// [`Truth::counter_cache`](crate::Truth::counter_cache) named a child
    /// entity that declares no counter cache for the counter being recounted.
    #[error("{child} declares no counter cache for key `{key}` of table `{table}`")]
    NoCounterCache {
        /// The child entity's type.
        child: &'static str,
        /// The counter table being recounted.
        table: String,
        /// The key being recounted.
        key: String,
    },

    /// Another recount of the same counter held its lock for longer than
    /// the wait: run recounts of one counter one at a time.
    #[error("another recount of `{key}` in table `{table}` held its lock for {waited_secs} s")]
    ReconcileBusy {
        /// The counter table.
        table: String,
        /// The key being recounted.
        key: String,
        /// How long this recount waited.
        waited_secs: i64,
    },

    /// An operation whose exactness rests on a lock that a multi-primary
    /// cluster keeps on one node, refused on a MariaDB Galera node
    /// (`wsrep_on`). A recount's repair is serialised by `GET_LOCK`, which
    /// another node never sees: two recounts of one counter on two nodes
    /// would both add the drift. Run recounts against a server outside the
    /// cluster's writers, or use a dry run to measure the drift (see the
    /// guide's "Clusters and distributed SQL").
    #[error("{operation} is refused on a Galera cluster node (wsrep_on is ON): {reason}")]
    ClusterUnsafe {
        /// What was refused.
        operation: &'static str,
        /// Why it cannot be exact there.
        reason: &'static str,
    },

    /// An operation that would change rows of other regions than this
    /// process's, or that is exact only with every region's rows in front
    /// of it, refused on a table placed in a [`Region`](crate::Region): a
    /// repairing recount (it adds `truth - current`, and `current` misses
    /// whatever replication has not brought yet), a reset or purge of
    /// named owners, folding every slot or another share, settling an add
    /// at the slot cap. Replication carries only each region's own rows, so
    /// a change to another's would never reach it. See the guide's
    /// "Regions" for what to run instead.
    #[error(
        "{operation} is refused in region `{region}`: it would change or depend on rows other regions own"
    )]
    CrossRegion {
        /// The region of the table (or the process).
        region: String,
        /// What was refused.
        operation: &'static str,
    },

    /// A region name broke the rules of [`Region::new`](crate::Region::new).
    #[error("invalid region name {name:?}: {reason}")]
    InvalidRegion {
        /// The offending name (shortened to 80 characters for display).
        name: String,
        /// Which rule it broke.
        reason: &'static str,
    },

    /// A counter table that something else created (SeaORM's schema sync)
    /// has a column that [`Counters::create_table`](crate::Counters::create_table)
    /// cannot give the collation counting needs: on MySQL a string
    /// `owner_id` that compares case-insensitively and references its
    /// owner (MySQL refuses to change a referencing column, and refuses a
    /// reference between columns of different collations). Owners differing
    /// only in case would share counts. Create the table with its migration
    /// (or `create_table`) before schema sync runs, without `cascade` when the
    /// owner's key compares case-insensitively.
    #[error(
        "counter table `{table}`: `{column}` compares as {found}, not byte-wise, and cannot be changed: {source}"
    )]
    TableShape {
        /// The table.
        table: String,
        /// The column.
        column: &'static str,
        /// Its collation now.
        found: String,
        /// The database's refusal.
        #[source]
        source: Box<DbErr>,
    },

    /// A row of an entity with a counter cache was written on a
    /// connection pool (`am.insert(&db)`), outside any transaction: the row
    /// and its counters would be two commits, and two deletes of one row
    /// could both see it. Raised by the hooks before anything is written.
    /// Write the row with `insert_counted` / `update_counted` /
    /// `delete_counted` ([`CounterCache`](crate::CounterCache)), which open
    /// their own transaction, or pass a transaction (`db.begin()`) instead
    /// of the pool. The message names the call (`call_site`) when the
    /// build has debug info, as tests do: run the tests of every path that
    /// writes the child to find them all before production does.
    #[error(
        "`{table}` has a counter cache: `{operation}` on a connection pool would commit the row \
         and its counts apart{}; use `Entity::{operation}_counted(&db, am)` or pass a transaction",
        call_site.as_ref().map(|at| format!(" (called at {at})")).unwrap_or_default()
    )]
    TransactionRequired {
        /// The child table.
        table: String,
        /// `insert`, `update` or `delete` (`save` is one of the first two).
        operation: &'static str,
        /// Where the application made the call, `path:line:column`, when
        /// the build has debug info.
        call_site: Option<String>,
    },

    /// [`DeltaBatch::apply_in`](crate::DeltaBatch::apply_in) was given a
    /// pool and a batch of several statements, which would not be all or
    /// nothing there. Raised before anything is written. Use
    /// [`DeltaBatch::apply`](crate::DeltaBatch::apply), or pass a
    /// transaction instead of the pool.
    #[error("a batch of {statements} statements was applied outside a transaction")]
    BatchNeedsTransaction {
        /// The statements the batch would send.
        statements: usize,
    },

    /// A time range that is reversed, or a series longer than
    /// [`MAX_SERIES_BUCKETS`](crate::limits::MAX_SERIES_BUCKETS).
    #[error("invalid time range: {reason}")]
    InvalidRange {
        /// What is wrong with it.
        reason: String,
    },

    /// A range or series read of a key that has no time window, so no
    /// buckets to read. Declare it as `keys(views(window = day))` (or
    /// [`CounterTable::with_key_window`](crate::CounterTable::with_key_window))
    /// to count it in buckets.
    #[error("counter `{key}` of table `{table}` has no time window")]
    NotWindowed {
        /// The counter table.
        table: String,
        /// The key read.
        key: String,
    },

    /// A unique key ([`CounterTable::with_unique_key`](crate::CounterTable::with_unique_key))
    /// given to an operation on deltas (`add`, `get`, a batch), or a key
    /// that counts deltas given to one on members (`observe`, `unique`).
    /// A typed handle cannot make this mistake: its unique keys are another
    /// type.
    #[error(
        "counter `{key}` of table `{table}` is {}: `{operation}` takes {}",
        if *unique { "a unique count (it counts distinct members)" } else { "a count of deltas" },
        if *unique { "keys that count deltas" } else { "unique keys (`observe`, `unique`)" }
    )]
    WrongKeyKind {
        /// The counter table.
        table: String,
        /// The key given.
        key: String,
        /// Whether the key is a unique count.
        unique: bool,
        /// The operation that refused it.
        operation: &'static str,
    },

    /// A stored sketch of a unique count is not in the sketch format
    /// ([`Sketch::from_bytes`](crate::unique::Sketch::from_bytes)): a row
    /// written by hand, or by a newer format this version cannot read.
    /// Nothing was written.
    #[error("a sketch in table `{table}` cannot be read: {source}")]
    BadSketch {
        /// The sketch table.
        table: String,
        /// What is wrong with it.
        source: crate::unique::SketchFormatError,
    },

    /// The write-behind buffer refused a delta or a read: see [`BufferError`].
    #[cfg(feature = "buffer")]
    #[error(transparent)]
    Buffer(#[from] BufferError),

    /// A batch of a recount, compaction or prune walk did not move strictly
    /// forward through the owners, or returned owners outside its bounds:
    /// the database ordered owner ids unlike the companion table (a
    /// hand-written truth query that compares owners in another collation;
    /// see [`Truth::query`](crate::Truth::query)). The walk stops here
    /// instead of repeating batches. Each batch up to this one, this one
    /// included, was applied and is exact on its own (one snapshot each);
    /// owners after it were not visited.
    #[error("the {walk} of `{table}` cannot advance past owner {owner}: {reason}")]
    WalkStalled {
        /// `recount`, `compaction` or `prune`.
        walk: &'static str,
        /// The counter table walked.
        table: String,
        /// The owner the walk had reached (debug form).
        owner: String,
        /// What the batch did wrong.
        reason: &'static str,
    },

    /// Any other database error, unchanged.
    #[error("database error: {0}")]
    Database(DbErr),
}

/// Why a [`CounterBuffer`](crate::CounterBuffer) refused: the variants of
/// [`CounterError::Buffer`]. On an add, the delta was not taken.
#[cfg(feature = "buffer")]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BufferError {
    /// A [`CounterBuffer`](crate::CounterBuffer) holds its capacity of
    /// distinct counters and could not wait for room (its policy is
    /// [`WhenFull::Fail`](crate::WhenFull::Fail), or the add ran on a
    /// current-thread runtime, where blocking would stop the flusher). The
    /// delta was not taken.
    /// Write the delta directly, retry, or raise the capacity.
    #[error("counter buffer full: {capacity} distinct counters are waiting for a flush")]
    Full {
        /// The buffer's capacity, in distinct counters.
        capacity: usize,
    },

    /// The [`CounterBuffer`](crate::CounterBuffer) is shutting down or has
    /// stopped; the delta was not taken.
    #[error("counter buffer closed: it is shutting down or has stopped")]
    Closed,

    /// A buffered read could not be made exact within 5 seconds: a flush's
    /// `COMMIT` reply was lost and the buffer is still resolving, through
    /// its ledger, whether it committed (usually because the database is
    /// unreachable). Retry the read.
    #[error("a buffered read could not be made exact: a flush's commit is in doubt")]
    FlushInDoubt,

    /// A [`CounterBuffer`](crate::CounterBuffer) add through a handle whose
    /// table the buffer already holds with another owner type, another
    /// window for the key or another [`Region`](crate::Region): one buffer
    /// keeps one configuration per table name. The delta was not taken.
    #[error(
        "counter table `{table}` is already in this buffer with another configuration of `{key}`"
    )]
    TableMismatch {
        /// The table.
        table: String,
        /// The key added to.
        key: String,
    },

    /// A [`CounterBuffer`](crate::CounterBuffer)'s flusher task stopped
    /// without flushing everything: it panicked, or the Tokio runtime it ran
    /// on shut down. Deltas accepted and not yet committed are lost, as in
    /// a crash.
    #[error("the counter buffer's flusher stopped; {unflushed} accepted adds were not flushed")]
    FlusherStopped {
        /// Accepted adds left unflushed.
        unflushed: u64,
    },

    /// A [`CounterBuffer`](crate::CounterBuffer) was started outside a Tokio
    /// runtime, which its flusher task needs.
    #[error("a counter buffer was started outside a Tokio runtime")]
    NoRuntime,
}

impl CounterError {
    /// The class of this error: what a caller can do about it.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidKey { .. }
            | Self::UnknownKey { .. }
            | Self::InvalidTableName { .. }
            | Self::InvalidOwner { .. }
            | Self::OutOfRange { .. }
            | Self::InvalidRange { .. }
            | Self::NotWindowed { .. }
            | Self::InvalidRegion { .. } => ErrorKind::InvalidInput,
            Self::Overflow { .. } => ErrorKind::Overflow,
            Self::Conflict { .. } | Self::ReconcileBusy { .. } => ErrorKind::Transient,
            Self::MissingTable { .. } => ErrorKind::SchemaMissing,
            Self::UnsupportedBackend(_)
            | Self::NoCounterCache { .. }
            | Self::NoOwnerTable { .. }
            | Self::TransactionRequired { .. }
            | Self::BatchNeedsTransaction { .. }
            | Self::ClusterUnsafe { .. }
            | Self::CrossRegion { .. }
            | Self::TableShape { .. }
            | Self::WrongKeyKind { .. }
            | Self::WalkStalled { .. } => ErrorKind::Misuse,
            #[cfg(feature = "buffer")]
            Self::Buffer(e) => match e {
                BufferError::Full { .. } | BufferError::FlushInDoubt => ErrorKind::Transient,
                BufferError::Closed
                | BufferError::TableMismatch { .. }
                | BufferError::FlusherStopped { .. }
                | BufferError::NoRuntime => ErrorKind::Misuse,
            },
            Self::BadSketch { .. } => ErrorKind::Database,
            // A connection lost, or a statement the database refused and
            // undid (a deadlock, a serialization failure, a lock wait that
            // timed out, SQLite busy): the same kind from every path,
            // whether the crate's own retries ran out (`Conflict`) or the
            // error came from a transaction the crate does not retry.
            // A standby refusing a write mid-failover, a pooler's lost
            // statement: nothing applied, the next connection succeeds.
            Self::Database(e)
                if crate::sql::is_connection_fault(e)
                    || crate::sql::is_misrouted(e)
                    || crate::sql::classify(e) == crate::sql::Classified::Conflict =>
            {
                ErrorKind::Transient
            }
            Self::Database(_) => ErrorKind::Database,
        }
    }

    /// Whether the write that failed with this error may have been applied
    /// anyway: its connection was lost after the statement or its `COMMIT`
    /// went out and before an answer came (or a buffer's flush is in doubt).
    /// Any other failure of a write the crate commits itself (on a pool)
    /// applied nothing, so sending it again cannot count it twice; a write
    /// in the caller's transaction stands or falls with that transaction.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            Self::Database(e) => crate::sql::outcome_unknown(e),
            #[cfg(feature = "buffer")]
            Self::Buffer(BufferError::FlushInDoubt) => true,
            _ => false,
        }
    }

    /// `Ok` if `min <= value <= max`, else [`CounterError::OutOfRange`].
    pub(crate) fn check_range(
        what: &'static str,
        value: impl Into<i128>,
        min: impl Into<i128>,
        max: impl Into<i128>,
    ) -> Result<()> {
        let (value, min, max) = (value.into(), min.into(), max.into());
        if (min..=max).contains(&value) {
            Ok(())
        } else {
            Err(Self::OutOfRange {
                what,
                value,
                min,
                max,
            })
        }
    }

    /// [`CounterError::check_range`] of a size (sizes are `usize`).
    pub(crate) fn check_size(
        what: &'static str,
        value: usize,
        min: usize,
        max: usize,
    ) -> Result<()> {
        let wide = |n: usize| i128::try_from(n).unwrap_or(i128::MAX);
        Self::check_range(what, wide(value), wide(min), wide(max))
    }

    /// Splits an error for [`retry::run`](crate::retry): a database error
    /// goes back as the `DbErr` it was (`Err`), so a deadlock is still seen
    /// as one and retried; the crate's own errors stay typed (`Ok`).
    pub(crate) fn split(self) -> std::result::Result<Self, DbErr> {
        match self {
            Self::Database(e) | Self::Conflict { source: e, .. } => Err(e),
            other => Ok(other),
        }
    }
}

/// The `from` and `into` of the `DbErr::TryIntoErr` that carries a
/// [`CounterError`] inside a `DbErr` (sea-orm's only variant that can hold
/// an error of another type): it reads "Error converting `CounterError`
/// into `DbErr`: " and the counter error's own message.
const CARRIED: (&str, &str) = ("CounterError", "DbErr");

/// A counter error as a `DbErr`, for code that works in `DbErr` (a sea-orm
/// hook, a migration, an application whose errors wrap `DbErr`), so `?`
/// works there.
///
/// Database errors go back as they came (a deadlock is still recognised as
/// one by whoever retries the transaction); the crate's own errors ride
/// inside `DbErr::TryIntoErr`, whose message is theirs, and
/// `CounterError::from(db_err)` gets them back typed.
///
/// ```
/// use counter_core::{CounterError, ErrorKind};
///
/// let err = counter_core::validate_key("").unwrap_err();
/// let db: sea_orm::DbErr = err.into();
/// let back = CounterError::from(db);
/// assert_eq!(back.kind(), ErrorKind::InvalidInput);
/// ```
impl From<CounterError> for DbErr {
    fn from(err: CounterError) -> Self {
        err.into_db_err()
    }
}

/// A `DbErr` as a counter error: the crate's own error back, typed, if the
/// `DbErr` carries one (see [`From<CounterError> for DbErr`](#impl-From%3CCounterError%3E-for-DbErr)),
/// else [`CounterError::Database`].
impl From<DbErr> for CounterError {
    fn from(err: DbErr) -> Self {
        match Self::from_hook_error(&err) {
            Some(own) => own,
            None => Self::Database(err),
        }
    }
}

impl CounterError {
    /// This error as a `DbErr` (see the `From` impl).
    pub(crate) fn into_db_err(self) -> DbErr {
        match self.split() {
            Err(db) => db,
            Ok(own) => own.carry(),
        }
    }

    /// This error inside a `DbErr`, whatever it is: [`retry::run`](crate::retry)
    /// returns it as it is, without a retry.
    pub(crate) fn carry(self) -> DbErr {
        DbErr::TryIntoErr {
            from: CARRIED.0,
            into: CARRIED.1,
            source: std::sync::Arc::new(self),
        }
    }

    /// The crate's own error inside a `DbErr`, if it carries one: what
    /// `am.insert(&txn)` returns when a counter-cache hook refused (a pool,
    /// an overflow). `CounterError::from(db_err)` does this and falls back to
    /// [`CounterError::Database`].
    pub(crate) fn from_hook_error(err: &DbErr) -> Option<Self> {
        match err {
            DbErr::TryIntoErr { from, into, source } if (*from, *into) == CARRIED => {
                source.downcast_ref::<Self>().cloned()
            }
            _ => None,
        }
    }
}

/// The error of parsing a string that is none of `expected`: the generated
/// key enum's `FromStr`.
#[doc(hidden)]
pub fn unknown_key(key: &str, expected: &'static [&'static str]) -> CounterError {
    CounterError::UnknownKey {
        key: preview(key),
        expected,
    }
}

/// Shortens user input for error messages so a 10 KB key cannot flood a log.
pub(crate) fn preview(input: &str) -> String {
    const MAX: usize = 80;
    match input.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &input[..cut]),
        None => input.to_owned(),
    }
}

/// The crate's `Result`.
pub type Result<T, E = CounterError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_and_undone_statement_is_transient_from_any_path() {
        let database = |message: &str| {
            CounterError::from(DbErr::Exec(sea_orm::RuntimeErr::Internal(format!(
                "error returned from database: {message}"
            ))))
        };
        for undone in [
            "1213 (40001): Deadlock found when trying to get lock; try restarting transaction",
            "deadlock detected",
            "1205 (HY000): Lock wait timeout exceeded; try restarting transaction",
            "(code: 5) database is locked",
        ] {
            assert_eq!(database(undone).kind(), ErrorKind::Transient, "{undone}");
        }
        let other = database("1054 (42S22): Unknown column 'slot' in 'field list'");
        assert_eq!(other.kind(), ErrorKind::Database);
    }

    #[test]
    fn only_a_call_left_unanswered_has_an_unknown_outcome() {
        use sea_orm::{RuntimeErr, sqlx};
        let driver = |e: sqlx::Error| {
            CounterError::from(DbErr::Exec(RuntimeErr::SqlxError(std::sync::Arc::new(e))))
        };
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(driver(sqlx::Error::Io(reset)).outcome_unknown());
        assert!(driver(sqlx::Error::Protocol("out of step".into())).outcome_unknown());
        // Nothing sent: no connection to send it on (the driver says so
        // with a driver feature; without one every driver error is unknown).
        let drivers = cfg!(any(
            feature = "sqlx-sqlite",
            feature = "sqlx-postgres",
            feature = "sqlx-mysql"
        ));
        assert_eq!(
            driver(sqlx::Error::PoolTimedOut).outcome_unknown(),
            !drivers
        );
        assert!(
            !CounterError::from(DbErr::ConnectionAcquire(
                sea_orm::error::ConnAcquireErr::Timeout
            ))
            .outcome_unknown()
        );
        // Undone by the database, retries ran out.
        let conflict = CounterError::Conflict {
            table: "t".into(),
            attempts: 3,
            in_transaction: false,
            source: DbErr::Custom("deadlock".into()),
        };
        assert!(!conflict.outcome_unknown());
        assert!(
            !CounterError::Overflow {
                context: "x".into()
            }
            .outcome_unknown()
        );
    }

    #[test]
    fn own_errors_cross_a_hook_typed_and_database_errors_unchanged() {
        let own = CounterError::Overflow {
            context: "x".into(),
        };
        let through = own.into_db_err();
        assert!(
            through.to_string().contains("counter overflow: x"),
            "{through}"
        );
        assert!(matches!(
            CounterError::from_hook_error(&through),
            Some(CounterError::Overflow { .. })
        ));
        let db = CounterError::Database(DbErr::Custom("deadlock".into())).into_db_err();
        assert!(matches!(db, DbErr::Custom(_)));
        assert!(CounterError::from_hook_error(&db).is_none());
    }
}
