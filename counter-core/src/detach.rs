//! Statements that run to the end even when their caller is dropped.
//!
//! axum drops a handler's future when its client goes away, and with it
//! any counter call in flight. sqlx's connections are not safe to drop at
//! every `.await`: a MySQL/MariaDB connection dropped while it prepares a
//! statement keeps the half-read answer in its socket and a note that it
//! still expects a result; the ping sqlx sends before returning it to the
//! pool then waits, with no timeout, for an answer the server never sends.
//! That connection is never returned and never closed: the pool has one
//! connection fewer for good, `close()` never returns, and once enough calls
//! were dropped every acquire times out (sessions idle, nothing on the
//! wire). Upstream: transact-rs/sqlx#563 (dropped MySQL futures leave the
//! connection out of step), #4349 and the open #4363 (the release ping is
//! unbounded and strands the pool's permit).
//!
//! The crate never leaves a connection half way: on a pool (a
//! [`DatabaseConnection`]; sea-orm's `RestrictedConnection` and other
//! wrappers are used in place), every statement it sends runs in a task of
//! its own ([`query_all`], [`query_one`], [`execute`]), and so does every
//! transaction it opens there ([`Detached::run`]). Dropping the caller then drops
//! only the wait for the answer; the statement or transaction ends as it
//! would have, and its connection goes back to the pool in step. (Its
//! outcome is what it would have been: a dropped write may have committed,
//! as a write whose reply was lost may have.) In the caller's own
//! transaction the crate cannot own the connection: dropping a transaction
//! mid-statement there is the application's, and the same sqlx issue applies.
//!
//! The task runs in the caller's `tracing` span, so its log lines carry
//! the caller's fields (a request id) as if it ran in place. Without a
//! Tokio runtime (nothing to spawn on) they run in place.

use std::future::Future;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, ExecResult, QueryResult, Statement};
use tracing::Instrument;

use crate::{observe::Touched, pooling, retry::is_pool};

/// `db` as the pool it is, if it is one (a `DatabaseConnection`; sea-orm's
/// `RestrictedConnection` and other wrappers are used as they are).
pub(crate) fn pool<C: ConnectionTrait>(db: &C) -> Option<&DatabaseConnection> {
    // `typeid::of` erases lifetimes; `DatabaseConnection` has none, so
    // equal ids mean `C` is `DatabaseConnection` itself.
    if typeid::of::<C>() != typeid::of::<DatabaseConnection>() {
        return None;
    }
    // SAFETY: `C` and `DatabaseConnection` are the same type (above).
    Some(unsafe { &*std::ptr::from_ref(db).cast::<DatabaseConnection>() })
}

/// A pool whose work runs apart from the caller, in a task of its own on
/// the current Tokio runtime (in place where there is none).
pub(crate) struct Detached {
    pool: DatabaseConnection,
    runtime: Option<tokio::runtime::Handle>,
}

/// `db` detached, when it is a pool; `None` otherwise (run on `db`).
pub(crate) fn detached<C: ConnectionTrait>(db: &C) -> Option<Detached> {
    pool(db).map(Detached::pool)
}

impl Detached {
    /// The pool `db`, detached.
    pub(crate) fn pool(db: &DatabaseConnection) -> Self {
        Self {
            pool: db.clone(),
            runtime: tokio::runtime::Handle::try_current().ok(),
        }
    }

    /// Runs `work` on the pool in a task of its own and waits for it; the
    /// caller's future may be dropped while it waits, the task runs on.
    pub(crate) async fn run<T, F, Fut>(&self, work: F) -> Result<T, DbErr>
    where
        F: FnOnce(DatabaseConnection) -> Fut,
        Fut: Future<Output = Result<T, DbErr>> + Send + 'static,
        T: Send + 'static,
    {
        let Some(runtime) = &self.runtime else {
            return work(self.pool.clone()).await;
        };
        // In the caller's span: the statement's log lines (sqlx's, a
        // retry's) keep the request they belong to (an axum or Loco
        // `request_id`), although they run in a task of their own.
        let work = work(self.pool.clone()).instrument(tracing::Span::current());
        match runtime.spawn(work).await {
            Ok(done) => done,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(DbErr::Custom(format!(
                "a counter statement's task did not finish: {e}"
            ))),
        }
    }
}

/// `db.query_all_raw(stmt)`, finished even if the caller is dropped.
pub(crate) async fn query_all<C: ConnectionTrait>(
    db: &C,
    stmt: Statement,
) -> Result<Vec<QueryResult>, DbErr> {
    match detached(db) {
        Some(pool) => {
            pool.run(|p| async move { pooling::query_all_alone(&p, stmt).await })
                .await
        }
        None => db.query_all_raw(stmt).await,
    }
}

/// `db.query_one_raw(stmt)`, finished even if the caller is dropped.
pub(crate) async fn query_one<C: ConnectionTrait>(
    db: &C,
    stmt: Statement,
) -> Result<Option<QueryResult>, DbErr> {
    match detached(db) {
        Some(pool) => {
            pool.run(|p| async move { pooling::query_one_alone(&p, stmt).await })
                .await
        }
        None => db.query_one_raw(stmt).await,
    }
}

/// `db.execute_raw(stmt)`, finished even if the caller is dropped.
pub(crate) async fn execute<C: ConnectionTrait>(
    db: &C,
    stmt: Statement,
) -> Result<ExecResult, DbErr> {
    match detached(db) {
        Some(pool) => {
            pool.run(|p| async move { pooling::execute_alone(&p, stmt).await })
                .await
        }
        None => db.execute_raw(stmt).await,
    }
}

/// [`execute`] of a write to the owners in `touched`, then their report
/// (see [`crate::observe`]): on a pool in the same detached task, so a
/// caller dropped after the commit still has them told; on a connection the
/// caller owns, as a write in the caller's transaction (unless it is
/// autocommit). Reported whatever the outcome: a failed statement may have
/// committed (a lost reply), and forgetting an owner is always safe.
pub(crate) async fn execute_observed<C: ConnectionTrait>(
    db: &C,
    stmt: Statement,
    touched: &Touched,
) -> Result<ExecResult, DbErr> {
    match detached(db) {
        Some(pool) => {
            let touched = touched.clone();
            pool.run(|p| async move {
                let done = pooling::execute_alone(&p, stmt).await;
                touched.committed().await;
                done
            })
            .await
        }
        None => {
            let done = db.execute_raw(stmt).await;
            touched.clone().wrote(is_pool::<C>()).await;
            done
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pools_are_recognised_and_transactions_are_not() {
        use sea_orm::TransactionTrait;
        let db = sea_orm::Database::connect("sqlite::memory:").await.unwrap();
        assert!(pool(&db).is_some());
        let txn = db.begin().await.unwrap();
        assert!(pool(&txn).is_none());
        assert!(detached(&txn).is_none());
        drop(txn); // the in-memory database's one connection
        let one = detached(&db).unwrap();
        let answer = one
            .run(|pool| async move {
                pool.query_one_raw(sea_orm::Statement::from_string(
                    pool.get_database_backend(),
                    "SELECT 7 AS n",
                ))
                .await
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(answer.try_get::<i32>("", "n").unwrap(), 7);
    }
}
