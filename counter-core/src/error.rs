//! The one error type every counter operation returns.

use sea_orm::DbErr;

/// Everything that can go wrong in a counter operation.
///
/// Bad input (keys, table names, slot counts, overflowing deltas) is rejected
/// before any SQL runs, so a caller can match on these variants instead of
/// parsing database messages. Database failures that we can recognise across
/// backends (a missing companion table, a deadlock) get variants of their own;
/// everything else is passed through untouched in [`CounterError::Database`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CounterError {
    /// A counter key broke the rules in [`crate::key`].
    #[error("invalid counter key {key:?}: {reason}")]
    InvalidKey {
        /// The offending key (shortened to 80 characters for display).
        key: String,
        /// Which rule it broke.
        reason: &'static str,
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

    /// A slot count outside `1..=1024`.
    #[error("slot count {slots} is out of range: it must be between 1 and {max}", max = crate::Slots::MAX)]
    SlotsOutOfRange {
        /// The requested slot count.
        slots: i64,
    },

    /// A value would not fit in an `i64`: a folded batch delta, a negated
    /// delta, a slot value or a counter total. Checked, never wrapped.
    #[error("counter overflow: {context} does not fit in a signed 64-bit integer")]
    Overflow {
        /// What overflowed.
        context: String,
    },

    /// The companion table is not in the database.
    #[error(
        "counter table `{table}` does not exist: run its migration \
         (`CounterTableMigration`, or `cargo run -p migration -- up` in this workspace) \
         before counting"
    )]
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
    #[error(
        "write conflict on counter table `{table}` after {attempts} attempt(s) \
         (deadlock, serialization failure or lock timeout){hint}",
        hint = if *.in_transaction { "; not retried on a connection that may be a transaction: \
               if it is one, roll back and retry the whole transaction" } else { "" }
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

    /// The connection's backend is not one this crate has SQL for.
    #[error(
        "unsupported database backend {0}: counter-core speaks SQLite, PostgreSQL and MySQL/MariaDB"
    )]
    UnsupportedBackend(String),

    /// Any other database error, unchanged.
    #[error("database error: {0}")]
    Database(#[from] DbErr),
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
