//! Whether a connection reaches a server that takes writes now.
//!
//! A pool whose server was a primary can find a standby at the same
//! address after a failover (a demoted primary that HAProxy has not yet
//! marked down, a replica port given by mistake): a ping answers, every
//! write fails. A readiness check asks this instead, so a load balancer
//! stops sending writes to a process that cannot make them.

use sea_orm::{ConnectionTrait, DbBackend, Statement};

use crate::{CounterError, Result, detach};

/// `Ok(true)` if `db`'s server takes writes: on PostgreSQL, not in recovery
/// (a standby) and not read-only by default; on MySQL and MariaDB,
/// `read_only` off; SQLite always. One round trip; an unreachable server
/// is the error it is.
pub async fn accepts_writes<C: ConnectionTrait>(db: &C) -> Result<bool> {
    let sql = match db.get_database_backend() {
        DbBackend::Postgres => {
            "SELECT CAST(CASE WHEN NOT pg_is_in_recovery() \
             AND current_setting('default_transaction_read_only') = 'off' \
             THEN 1 ELSE 0 END AS BIGINT)"
        }
        DbBackend::MySql => "SELECT CAST(@@global.read_only = 0 AS SIGNED)",
        _ => return Ok(true),
    };
    let statement = Statement::from_string(db.get_database_backend(), sql);
    let row = detach::query_one(db, statement)
        .await
        .map_err(CounterError::Database)?;
    let writable: i64 = match row {
        Some(row) => row.try_get_by_index(0).map_err(CounterError::Database)?,
        None => 0,
    };
    Ok(writable == 1)
}
