//! Running a statement, retrying what the database refused outright.

use std::{any::type_name, future::Future, time::Duration};

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};

use crate::{
    error::{CounterError, Result},
    sql::{Classified, classify, names_table},
};

/// Attempts before a conflict is handed to the caller.
pub(crate) const MAX_ATTEMPTS: u32 = 10;
const FIRST_BACKOFF: Duration = Duration::from_millis(2);
const MAX_BACKOFF: Duration = Duration::from_millis(200);

/// Runs `op`, one statement on the counter table `table`, and turns its
/// error into a [`CounterError`]. Only the type of `_db` matters: it tells
/// whether a retry is safe.
///
/// A conflict (deadlock, serialization failure, lock timeout, SQLite busy) is
/// retried with full-jitter exponential backoff, but only on a pool: the
/// database undid the statement, so running it again cannot count twice. On
/// anything else (the caller's transaction, which the database has already
/// aborted, or an unknown connection type) it is returned at once. Other
/// errors, such as a connection lost mid-statement whose outcome is unknown,
/// are never retried.
pub(crate) async fn run<C, T, F, Fut>(db: &C, table: &str, op: F) -> Result<T>
where
    C: ConnectionTrait + ?Sized,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, DbErr>>,
{
    run_with(db, table, &[table], op).await
}

/// [`run`] for statements on several counter tables (a windowed key's
/// totals and buckets), named `label` in a conflict; a missing table is
/// reported as whichever of `tables` the database named.
pub(crate) async fn run_on<C, T, F, Fut>(db: &C, label: &str, tables: &[&str], op: F) -> Result<T>
where
    C: ConnectionTrait + ?Sized,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, DbErr>>,
{
    run_with(db, label, tables, op).await
}

/// [`run`] for a whole transaction (`op` begins and commits it) that writes
/// other tables too, named `label` in a conflict. Only conflicts are
/// interpreted: a missing table or an overflow there may be the child
/// table's, so they stay [`CounterError::Database`]; the counter writes
/// inside classify their own errors, which come back typed (see
/// `CounterError::into_db_err`).
pub(crate) async fn run_transaction<C, T, F, Fut>(db: &C, label: &str, op: F) -> Result<T>
where
    C: ConnectionTrait + ?Sized,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, DbErr>>,
{
    run_with(db, label, &[], op).await
}

async fn run_with<C, T, F, Fut>(
    _db: &C,
    table: &str,
    counter_tables: &[&str],
    mut op: F,
) -> Result<T>
where
    C: ConnectionTrait + ?Sized,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, DbErr>>,
{
    let retry = is_pool::<C>();
    let mut attempt = 1;
    loop {
        let err = match op().await {
            Ok(value) => return Ok(value),
            Err(err) => err,
        };
        // A counter-cache hook's own error, through sea-orm: typed again.
        if let Some(own) = CounterError::from_hook_error(&err) {
            return Err(own);
        }
        match classify(&err) {
            Classified::Conflict if retry && attempt < MAX_ATTEMPTS => {
                let pause = backoff(attempt);
                tracing::debug!(table, attempt, ?pause, error = %err, "counter write conflict, retrying");
                // Runtime-neutral: no panic on a runtime without a timer driver.
                futures_timer::Delay::new(pause).await;
                attempt += 1;
            }
            Classified::Conflict => {
                return Err(CounterError::Conflict {
                    table: table.to_owned(),
                    attempts: attempt,
                    in_transaction: !retry,
                    source: err,
                });
            }
            Classified::MissingTable => {
                // Only when the message names a counter table: a recount's
                // truth query reads other tables.
                return Err(match counter_tables.iter().find(|t| names_table(&err, t)) {
                    Some(counter) => CounterError::MissingTable {
                        table: (*counter).to_owned(),
                        source: err,
                    },
                    None => CounterError::Database(err),
                });
            }
            Classified::Overflow if !counter_tables.is_empty() => {
                return Err(CounterError::Overflow {
                    context: format!("{} in table `{table}`", crate::settle::FAST_WRITE),
                });
            }
            Classified::Overflow | Classified::Other => return Err(CounterError::Database(err)),
        }
    }
}

/// Whether `C` is a connection pool (`DatabaseConnection`, or sea-orm's
/// `RestrictedConnection` wrapper of one). `ConnectionTrait` cannot say
/// whether a transaction is open, and a retry inside one would be wrong on
/// every backend, so only types known to be pools are retried; any other
/// type (a transaction, `DatabaseExecutor`, a proxy) gets the error back.
/// Both type names come from the same compiler run, so comparing them is
/// exact even though their text is not a stable format.
pub(crate) fn is_pool<C: ?Sized>() -> bool {
    let name = type_name::<C>().trim_start_matches('&');
    name == type_name::<DatabaseConnection>()
        || (name.starts_with("sea_orm::") && name.ends_with("::RestrictedConnection"))
}

fn backoff(attempt: u32) -> Duration {
    use rand::Rng;
    let ceiling = FIRST_BACKOFF
        .saturating_mul(1 << attempt.min(16))
        .min(MAX_BACKOFF);
    rand::rng().random_range(Duration::ZERO..=ceiling)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sea_orm::{DatabaseExecutor, DatabaseTransaction};

    #[test]
    fn only_the_pool_is_retried() {
        assert!(is_pool::<DatabaseConnection>());
        assert!(is_pool::<&DatabaseConnection>());
        assert!(!is_pool::<DatabaseTransaction>());
        assert!(!is_pool::<DatabaseExecutor<'static>>());
    }

    #[test]
    fn missing_tables_are_told_apart() {
        let pg = DbErr::Custom(
            r#"error returned from database: relation "post_counters" does not exist"#.into(),
        );
        let my = DbErr::Custom("Table 'test.post_counters' doesn't exist".into());
        let lite = DbErr::Custom("no such table: post_counters".into());
        for err in [&pg, &my, &lite] {
            assert!(names_table(err, "post_counters"), "{err}");
            assert!(!names_table(err, "counters"), "{err}");
        }
    }

    #[test]
    fn backoff_is_bounded() {
        for attempt in 1..=MAX_ATTEMPTS + 40 {
            assert!(backoff(attempt) <= MAX_BACKOFF);
        }
    }
}
