//! Recognising database errors across backends.

use sea_orm::DbErr;

/// What a failed statement means to the caller.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Classified {
    /// The database refused the statement and undid it: deadlock,
    /// serialization failure, lock wait timeout, SQLite busy. Safe to retry
    /// outside a transaction, because nothing was applied.
    Conflict,
    /// The table does not exist.
    MissingTable,
    /// A value left the `i64` range.
    Overflow,
    /// Anything else, including a dropped connection, whose outcome is
    /// unknown and which must therefore never be retried blindly.
    Other,
}

/// Classifies by SQLSTATE / SQLite result code where the driver gives one
/// (with any `sqlx-*` feature of this crate), else by the server's message.
/// A code always wins: messages are read only where the code is generic
/// (SQLite's 1 "SQL error", MySQL's HY000) or missing.
pub(crate) fn classify(err: &DbErr) -> Classified {
    match database_code(err).as_deref() {
        // PostgreSQL deadlock / serialization failure; MySQL 1213 reports 40001.
        Some("40P01" | "40001") => Classified::Conflict,
        // SQLite SQLITE_BUSY and SQLITE_LOCKED with their extended codes.
        Some("5" | "6" | "261" | "262" | "517") => Classified::Conflict,
        // PostgreSQL undefined_table; MySQL 1146 reports 42S02.
        Some("42P01" | "42S02") => Classified::MissingTable,
        // numeric_value_out_of_range (PostgreSQL, MySQL 1690).
        Some("22003") => Classified::Overflow,
        Some("1" | "HY000") | None => classify_message(&err.to_string()),
        Some(_) => Classified::Other,
    }
}

/// Whether the server refused `err`'s statement because of where the
/// connection landed, not because of the statement: a standby or a demoted
/// primary that takes no writes (PostgreSQL's 25006 "cannot execute ... in
/// a read-only transaction", MariaDB's `--read-only` and 1792), or a
/// transaction pooler that moved the session between server connections
/// so that a prepared statement is missing (26000) or left behind by
/// another client (42P05). Nothing was applied, and the same statement
/// succeeds once the connection reaches a primary (after a failover, the
/// next pooled connection), so it is
/// [`ErrorKind::Transient`](crate::ErrorKind::Transient), never a
/// permanent database error.
pub(crate) fn is_misrouted(err: &DbErr) -> bool {
    if !matches!(err, DbErr::Exec(_) | DbErr::Query(_)) {
        return false;
    }
    match database_code(err).as_deref() {
        Some("25006" | "26000" | "42P05") => true,
        // MariaDB/MySQL report `--read-only` (1290, 1836) as HY000.
        Some("HY000") | None => {
            let message = err.to_string();
            [
                "--read-only option",
                "read-only transaction",
                "read-only mode",
            ]
            .iter()
            .any(|needle| message.contains(needle))
        }
        Some(_) => false,
    }
}

/// Whether `err` is the connection failing rather than the statement: the
/// pool could not give one, the server could not be reached or closed it
/// (a reset, a broken pipe, a server shutting down, a Galera node that left
/// its cluster's primary component), whatever call met it. Every such error
/// has one kind, [`ErrorKind::Transient`](crate::ErrorKind::Transient): a
/// caller's retry policy must not depend on whether the fault came at a
/// `BEGIN` (sea-orm's `DbErr::Conn`) or mid-statement (`DbErr::Exec`).
pub(crate) fn is_connection_fault(err: &DbErr) -> bool {
    match err {
        DbErr::Conn(_) | DbErr::ConnectionAcquire(_) => true,
        DbErr::Exec(_) | DbErr::Query(_) => {
            if let Some(lost) = driver_connection_fault(err) {
                return lost;
            }
            match database_code(err).as_deref() {
                // Class 08: connection exception (MySQL 1047 "WSREP has not
                // yet prepared node", 1053 "server shutdown" report 08S01);
                // PostgreSQL operator intervention: admin or crash shutdown,
                // cannot connect now.
                Some(code) if code.starts_with("08") => true,
                Some("57P01" | "57P02" | "57P03") => true,
                Some(_) => false,
                None => {
                    let message = err.to_string();
                    [
                        "Connection reset",
                        "Broken pipe",
                        "connection closed",
                        "server has gone away",
                        "Lost connection to",
                    ]
                    .iter()
                    .any(|needle| message.contains(needle))
                }
            }
        }
        _ => false,
    }
}

/// Whether a write that failed with `err` may have been applied anyway: its
/// statement (or its `COMMIT`) went out and no answer came back, as when
/// the connection is lost mid-call. A server's error answer (whatever its
/// code: the statement failed and was undone) and a pool that gave no
/// connection (nothing was sent) applied nothing; anything else is unknown.
pub(crate) fn outcome_unknown(err: &DbErr) -> bool {
    match err {
        DbErr::ConnectionAcquire(_) => false,
        DbErr::Exec(_) | DbErr::Query(_) => !answered_or_unsent(err),
        _ => true,
    }
}

/// Whether the driver says the server answered `err`'s statement with an
/// error, or that the statement was never sent (no connection to send it on).
#[cfg(any(
    feature = "sqlx-sqlite",
    feature = "sqlx-postgres",
    feature = "sqlx-mysql"
))]
fn answered_or_unsent(err: &DbErr) -> bool {
    use sea_orm::{RuntimeErr, sqlx::Error};
    match err {
        DbErr::Exec(RuntimeErr::SqlxError(e)) | DbErr::Query(RuntimeErr::SqlxError(e)) => {
            matches!(
                &**e,
                Error::Database(_) | Error::PoolTimedOut | Error::PoolClosed
            )
        }
        _ => false,
    }
}

#[cfg(not(any(
    feature = "sqlx-sqlite",
    feature = "sqlx-postgres",
    feature = "sqlx-mysql"
)))]
fn answered_or_unsent(_: &DbErr) -> bool {
    false
}

/// Whether `err` is the driver's own report of a lost connection (an I/O
/// error, a closed pool, a protocol stream out of step), when the driver
/// says.
#[cfg(any(
    feature = "sqlx-sqlite",
    feature = "sqlx-postgres",
    feature = "sqlx-mysql"
))]
fn driver_connection_fault(err: &DbErr) -> Option<bool> {
    use sea_orm::{RuntimeErr, sqlx::Error};
    match err {
        DbErr::Exec(RuntimeErr::SqlxError(e)) | DbErr::Query(RuntimeErr::SqlxError(e)) => {
            match &**e {
                Error::Io(_)
                | Error::Tls(_)
                | Error::Protocol(_)
                | Error::PoolTimedOut
                | Error::PoolClosed
                | Error::WorkerCrashed => Some(true),
                // A server's answer: decided by its code.
                Error::Database(_) => None,
                _ => Some(false),
            }
        }
        _ => None,
    }
}

#[cfg(not(any(
    feature = "sqlx-sqlite",
    feature = "sqlx-postgres",
    feature = "sqlx-mysql"
)))]
fn driver_connection_fault(_: &DbErr) -> Option<bool> {
    None
}

/// Whether a "no such table" error is about `table`: PostgreSQL quotes it
/// (`relation "t" does not exist`), MySQL qualifies it (`Table 'db.t'
/// doesn't exist`), SQLite names it last (`no such table: t`).
pub(crate) fn names_table(err: &DbErr, table: &str) -> bool {
    let message = err.to_string();
    let sqlite = format!("no such table: {table}");
    // SQLite's form is unquoted: `t` must not match `t_buckets`.
    let sqlite_names = message.match_indices(&sqlite).any(|(at, _)| {
        !message[at + sqlite.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
    });
    sqlite_names
        || [
            format!("\"{table}\""),
            format!(".{table}'"),
            format!("'{table}'"),
        ]
        .iter()
        .any(|form| message.contains(form.as_str()))
}

/// The messages behind the codes above.
fn classify_message(message: &str) -> Classified {
    const CONFLICT: [&str; 5] = [
        "deadlock detected",
        "could not serialize access",
        "Deadlock found when trying to get lock",
        "Lock wait timeout exceeded",
        "database is locked",
    ];
    const OVERFLOW: [&str; 3] = [
        "bigint out of range",
        "BIGINT value is out of range",
        "integer overflow",
    ];
    let has = |needles: &[&str]| needles.iter().any(|n| message.contains(n));
    // "relation "t" does not exist", but not "column "c" of relation "t" does not exist".
    let pg_missing = message.contains(": relation \"") && message.ends_with("does not exist");
    if has(&CONFLICT) {
        Classified::Conflict
    } else if pg_missing || has(&["no such table", "(42S02)"]) {
        Classified::MissingTable
    } else if has(&OVERFLOW) {
        Classified::Overflow
    } else {
        Classified::Other
    }
}

#[cfg(any(
    feature = "sqlx-sqlite",
    feature = "sqlx-postgres",
    feature = "sqlx-mysql"
))]
fn database_code(err: &DbErr) -> Option<String> {
    use sea_orm::RuntimeErr;
    match err {
        DbErr::Exec(RuntimeErr::SqlxError(e)) | DbErr::Query(RuntimeErr::SqlxError(e)) => {
            match &**e {
                sea_orm::sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
                _ => None,
            }
        }
        _ => None,
    }
}

#[cfg(not(any(
    feature = "sqlx-sqlite",
    feature = "sqlx-postgres",
    feature = "sqlx-mysql"
)))]
fn database_code(_: &DbErr) -> Option<String> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_of_each_backend() {
        let db = "error returned from database:";
        let cases = [
            ("deadlock detected", Classified::Conflict),
            (
                "1213 (40001): Deadlock found when trying to get lock; try restarting transaction",
                Classified::Conflict,
            ),
            (
                "1205 (HY000): Lock wait timeout exceeded; try restarting transaction",
                Classified::Conflict,
            ),
            ("(code: 5) database is locked", Classified::Conflict),
            (
                "relation \"post_counters\" does not exist",
                Classified::MissingTable,
            ),
            (
                "1146 (42S02): Table 'test.post_counters' doesn't exist",
                Classified::MissingTable,
            ),
            (
                "(code: 1) no such table: post_counters",
                Classified::MissingTable,
            ),
            ("bigint out of range", Classified::Overflow),
            ("(code: 1) integer overflow", Classified::Overflow),
            (
                "column \"slot\" of relation \"c\" does not exist",
                Classified::Other,
            ),
            (
                "1054 (42S22): Unknown column 'slot' in 'field list'",
                Classified::Other,
            ),
        ];
        for (message, expected) in cases {
            let message = format!("{db} {message}");
            assert_eq!(classify_message(&message), expected, "{message}");
        }
        let pool = "pool timed out while waiting for an open connection";
        assert_eq!(classify_message(pool), Classified::Other);
    }
}
