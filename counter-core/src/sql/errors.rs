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
pub(crate) fn classify(err: &DbErr) -> Classified {
    if let Some(code) = database_code(err) {
        match code.as_str() {
            // PostgreSQL deadlock / serialization failure; MySQL 1213 reports 40001.
            "40P01" | "40001" => return Classified::Conflict,
            // SQLite SQLITE_BUSY and SQLITE_LOCKED with their extended codes.
            "5" | "6" | "261" | "262" | "517" => return Classified::Conflict,
            // PostgreSQL undefined_table; MySQL 1146 reports 42S02.
            "42P01" | "42S02" => return Classified::MissingTable,
            // numeric_value_out_of_range (PostgreSQL, MySQL 1690).
            "22003" => return Classified::Overflow,
            _ => {}
        }
    }
    classify_message(&err.to_string())
}

/// The messages behind the codes above, for errors that carry no code.
fn classify_message(message: &str) -> Classified {
    const CONFLICT: [&str; 5] = [
        "deadlock detected",
        "could not serialize access",
        "Deadlock found when trying to get lock",
        "Lock wait timeout exceeded",
        "database is locked",
    ];
    const MISSING: [&str; 2] = ["no such table", "doesn't exist"];
    const OVERFLOW: [&str; 3] = [
        "bigint out of range",
        "BIGINT value is out of range",
        "integer overflow",
    ];
    let has = |needles: &[&str]| needles.iter().any(|n| message.contains(n));
    if has(&CONFLICT) {
        Classified::Conflict
    } else if has(&MISSING)
        || (message.contains("relation \"") && message.contains("\" does not exist"))
    {
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
        let cases = [
            (
                "error returned from database: deadlock detected",
                Classified::Conflict,
            ),
            (
                "error returned from database: 1213 (40001): Deadlock found when trying to get lock; try restarting transaction",
                Classified::Conflict,
            ),
            (
                "error returned from database: 1205 (HY000): Lock wait timeout exceeded; try restarting transaction",
                Classified::Conflict,
            ),
            (
                "error returned from database: (code: 5) database is locked",
                Classified::Conflict,
            ),
            (
                "error returned from database: relation \"post_counters\" does not exist",
                Classified::MissingTable,
            ),
            (
                "error returned from database: 1146 (42S02): Table 'test.post_counters' doesn't exist",
                Classified::MissingTable,
            ),
            (
                "error returned from database: (code: 1) no such table: post_counters",
                Classified::MissingTable,
            ),
            (
                "error returned from database: bigint out of range",
                Classified::Overflow,
            ),
            (
                "error returned from database: (code: 1) integer overflow",
                Classified::Overflow,
            ),
            (
                "pool timed out while waiting for an open connection",
                Classified::Other,
            ),
        ];
        for (message, expected) in cases {
            assert_eq!(classify_message(message), expected, "{message}");
        }
    }
}
