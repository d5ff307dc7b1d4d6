//! The dedup ledger for callers other than a [`Consumer`](crate::Consumer):
//! a service that applies requests exactly once by an id of the caller's
//! (`counter-service`'s `Idempotency-Key`) records its ids in the same
//! table, in its own transaction, under a source name of its own.
//!
//! ```no_run
//! # async fn f(db: sea_orm::DatabaseConnection) -> Result<(), Box<dyn std::error::Error>> {
//! use sea_orm::TransactionTrait;
//!
//! let txn = db.begin().await?;
//! let new = counter_mq::ledger::record_new(&txn, "http:posts", &["req-7f3a"]).await?;
//! if new.contains("req-7f3a") {
//!     // ... apply the request's deltas on `txn` ...
//! }
//! txn.commit().await?;
//! # Ok(()) }
//! ```

use std::{collections::HashSet, time::Duration};

use sea_orm::{ConnectionTrait, DbErr};

use crate::dedup;

/// Records `ids` of `source` as applied, on `txn` (a transaction: the ids
/// must commit with what they guard), and returns the ones that were new.
///
/// One `INSERT` that skips recorded ids. A concurrent transaction inserting
/// one of the same ids waits for this one: when it commits, the other finds
/// the id recorded; when it rolls back, the other records it. Ids are 1 to
/// [`MAX_ID_LEN`](crate::message::MAX_ID_LEN) printable ASCII characters
/// without spaces (the caller checks), sources at most 64.
pub async fn record_new<C: ConnectionTrait>(
    txn: &C,
    source: &str,
    ids: &[&str],
) -> Result<HashSet<String>, DbErr> {
    dedup::record_new(txn, source, ids).await
}

/// Deletes up to 10,000 ids of `source` recorded longer than `retention`
/// ago (by the database's clock) and returns how many went: call it until
/// it returns less than 10,000.
pub async fn prune<C: ConnectionTrait>(
    db: &C,
    source: &str,
    retention: Duration,
) -> Result<u64, DbErr> {
    dedup::prune_once(db, source, retention).await
}

/// Rows deleted at most by one [`prune`].
pub const PRUNE_BATCH: u64 = dedup::PRUNE_BATCH;

/// The SQL expression of the database's current time in Unix seconds, the
/// ledger's one clock: a table kept beside the ledger (the service's stored
/// replies) stamps and prunes its rows by the same clock.
pub fn database_clock(backend: sea_orm::DbBackend) -> &'static str {
    dedup::now(backend)
}

/// Checks, in a transaction rolled back, that the ledger table exists and
/// that the database runs the `INSERT ... RETURNING` [`record_new`] needs
/// (MySQL 8 has none; MariaDB 10.5+, PostgreSQL and SQLite 3.35+ do): a
/// service refuses to start, by name, instead of failing every request.
pub async fn probe(db: &sea_orm::DatabaseConnection, source: &str) -> Result<(), crate::MqError> {
    dedup::probe(db, source).await
}
