//! The lock that keeps two recounts of one counter apart: held from before
//! a batch's snapshot until after its repair has committed, so the next
//! recount's snapshot sees the repair and does not correct the same drift
//! again.

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Statement, Value};

use super::Dialect;
use crate::error::{CounterError, Result};

/// How long a recount waits for another recount of the same counter.
pub(crate) const LOCK_WAIT_SECS: i64 = 60;

/// The name of a recount's `GET_LOCK` on MySQL, given the table and key's
/// [`lock_id`] in hex: 63 characters (MySQL allows 64), the connection's
/// database hashed in. A macro, so that the statements stay `&'static str`
/// (sqlx's guard against SQL built at run time).
#[cfg(feature = "sqlx-mysql")]
macro_rules! mysql_lock_name {
    () => {
        "CONCAT('counter_core:reconcile:', SHA1(CONCAT(IFNULL(DATABASE(), ''), ':', ?)))"
    };
}
#[cfg(feature = "sqlx-mysql")]
const _: () = assert!("counter_core:reconcile:".len() + 40 <= 64);

/// One recount's hold on its counter's lock.
///
/// The lock is named by the table and key, and by the table itself as the
/// connection resolves it (PostgreSQL: its oid, through `search_path`) or
/// the database it is in (MySQL: `DATABASE()`), so that recounts of
/// same-named tables in different schemas or databases on one server (a
/// schema per tenant) never wait for each other, while two connections that
/// reach one table share its lock whatever their `search_path`.
///
/// * PostgreSQL: `pg_advisory_xact_lock`, taken inside each batch's
///   transaction ([`RecountLock::in_transaction`]) and released by its
///   COMMIT or ROLLBACK, whatever happens to the client.
/// * MySQL/MariaDB: `GET_LOCK`, which belongs to a session, not a
///   transaction. It is taken on a connection of its own, outside the batch
///   transaction (acquire, then the batch commits, then release), and that
///   connection is closed rather than returned to the pool when dropped: a
///   recount cancelled or failed midway cannot leave the lock held in a
///   pooled connection. (`GET_LOCK` is local to one server: with Galera or
///   multi-primary replication, run recounts against one node.)
/// * SQLite: nothing; the batch's `BEGIN IMMEDIATE` holds the database's
///   write lock.
pub(crate) enum RecountLock {
    InTransaction,
    #[cfg(feature = "sqlx-mysql")]
    Session {
        conn: sea_orm::sqlx::pool::PoolConnection<sea_orm::sqlx::MySql>,
        name: String,
    },
    None,
}

impl RecountLock {
    /// Prepares the lock of `key` in `table` for a recount on `db`.
    pub(crate) async fn new(db: &DatabaseConnection, table: &str, key: &str) -> Result<Self> {
        match Dialect::of(db)? {
            Dialect::Sqlite => Ok(Self::None),
            Dialect::Postgres => Ok(Self::InTransaction),
            Dialect::MySql => {
                // `GET_LOCK` is one node's: on a Galera node another
                // node's recount would not wait for it (`ClusterUnsafe`).
                if crate::cluster::is_galera_node(db).await? {
                    return Err(CounterError::ClusterUnsafe {
                        operation: "a recount that repairs",
                        reason: "its lock (GET_LOCK) is local to one node, so recounts of \
                                 one counter on two nodes could both add the drift; a dry run \
                                 is allowed",
                    });
                }
                mysql_session(db, table, key).await
            }
        }
    }

    /// Waits for the lock, before a batch's transaction begins (MySQL).
    pub(crate) async fn acquire(&mut self, table: &str, key: &str) -> Result<()> {
        #[cfg(feature = "sqlx-mysql")]
        if let Self::Session { conn, name } = self {
            let acquired: Option<i64> = sea_orm::sqlx::query_scalar(concat!(
                "SELECT GET_LOCK(",
                mysql_lock_name!(),
                ", ?)"
            ))
            .bind(name.as_str())
            .bind(LOCK_WAIT_SECS)
            .fetch_one(&mut **conn)
            .await
            .map_err(|e| CounterError::Database(DbErr::Custom(format!("GET_LOCK: {e}"))))?;
            if acquired != Some(1) {
                return Err(busy(table, key));
            }
        }
        let _ = (table, key);
        Ok(())
    }

    /// The part of the lock a batch takes inside its transaction
    /// (PostgreSQL), if any: owned, so that the batch can run in a task of
    /// its own.
    pub(crate) fn in_transaction(&self, table: &str, key: &str) -> Option<InTransaction> {
        let Self::InTransaction = self else {
            return None;
        };
        let lock = Statement::from_sql_and_values(
            Dialect::Postgres.backend(),
            "SELECT pg_advisory_xact_lock($1 # COALESCE(to_regclass($2)::oid::bigint, 0))",
            [
                Value::from(lock_id(table, key)),
                Value::from(super::quote(Dialect::Postgres, table)),
            ],
        );
        Some(InTransaction { lock })
    }

    /// Releases the lock after the batch's transaction ended, committed or
    /// not (MySQL). If that fails, the connection is dropped, and closing it
    /// releases the lock.
    pub(crate) async fn release(&mut self) {
        #[cfg(feature = "sqlx-mysql")]
        if let Self::Session { conn, name } = self {
            let released =
                sea_orm::sqlx::query(concat!("DO RELEASE_LOCK(", mysql_lock_name!(), ")"))
                    .bind(name.as_str())
                    .execute(&mut **conn)
                    .await;
            if released.is_err() {
                *self = Self::None;
            }
        }
    }
}

/// Whether writes of natural-key rows take [`row_key_locks`] on `dialect`:
/// only PostgreSQL needs them (see there).
pub(crate) fn takes_row_key_locks(dialect: Dialect) -> bool {
    dialect == Dialect::Postgres
}

/// PostgreSQL: the statements that lock child rows' primary keys for the
/// rest of the transaction (`exclusive` for a delete or a move, shared for
/// an insert), one per distinct key in one global order (so two writers of
/// several keys cannot wait for each other in a circle); none on the other
/// backends, which need none.
///
/// Why: a counter-cache hook decides by a locking read of the row. Under
/// READ COMMITTED a delete (or move) that finds no row, because the insert
/// of that key has not committed yet, would then have its `DELETE` run
/// under a new snapshot and remove the row committed in between, which it
/// never uncounted. With this lock, taken before the read by the deleter
/// and after the `INSERT` by the inserter, the two are ordered: either the
/// delete's read sees the committed row, or the insert commits after the
/// delete has finished. Only keys an application chooses can meet again
/// (natural keys: a join table's `(article_id, user_id)`), so entities with
/// an auto-increment key skip it. MySQL/MariaDB need none: their locking
/// reads wait for an uncommitted insert of the key and, under REPEATABLE
/// READ, lock the gap where a missing key would go; SQLite's writers are
/// serialised by `BEGIN IMMEDIATE`.
///
/// The two-`int4` advisory lock space (table hash, key hash) is apart from
/// the recount lock's `bigint` one; a hash collision only makes two
/// writers wait for each other. Within one transaction the crate takes a
/// key's lock before the row's (`FOR UPDATE`), on every path. A caller's
/// transaction that deletes several natural-key rows while another inserts
/// them in another order can still deadlock; PostgreSQL aborts one of the
/// two (retried on a pool, `CounterError::Conflict` in a transaction).
pub(crate) fn row_key_locks<'k>(
    dialect: Dialect,
    table: &str,
    keys: impl IntoIterator<Item = &'k [Value]>,
    exclusive: bool,
) -> Vec<Statement> {
    if !takes_row_key_locks(dialect) {
        return Vec::new();
    }
    let table_id = super::fnv1a(table.bytes()) as u32 as i32;
    // One lock per distinct key, in one order for every writer.
    let mut ids: Vec<i32> = keys
        .into_iter()
        .map(|key| {
            let mut bytes = Vec::new();
            for value in key {
                bytes.extend(canonical(value).into_bytes());
                bytes.push(0);
            }
            super::fnv1a(bytes) as u32 as i32
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let sql = match exclusive {
        true => "SELECT pg_advisory_xact_lock($1, $2)",
        false => "SELECT pg_advisory_xact_lock_shared($1, $2)",
    };
    ids.into_iter()
        .map(|key_id| {
            Statement::from_sql_and_values(
                Dialect::Postgres.backend(),
                sql,
                [Value::from(table_id), Value::from(key_id)],
            )
        })
        .collect()
}

/// A key column's value as text that is the same for every integer width,
/// so an `i32` and an `i64` of one key lock alike.
fn canonical(value: &Value) -> String {
    match value {
        Value::TinyInt(Some(v)) => v.to_string(),
        Value::SmallInt(Some(v)) => v.to_string(),
        Value::Int(Some(v)) => v.to_string(),
        Value::BigInt(Some(v)) => v.to_string(),
        Value::TinyUnsigned(Some(v)) => v.to_string(),
        Value::SmallUnsigned(Some(v)) => v.to_string(),
        Value::Unsigned(Some(v)) => v.to_string(),
        Value::BigUnsigned(Some(v)) => v.to_string(),
        Value::String(Some(v)) => v.clone(),
        Value::Uuid(Some(v)) => v.to_string(),
        other => format!("{other:?}"),
    }
}

/// Bounds every lock wait of the rest of the transaction on `txn` to
/// [`LOCK_WAIT_SECS`]: the crate's own maintenance transactions (compaction
/// and recount batches) never wait forever behind a lock someone else holds
/// (an idle transaction, a stuck session). PostgreSQL waits forever by
/// default, so `SET LOCAL lock_timeout`; MySQL/MariaDB already give up
/// after `innodb_lock_wait_timeout` (50 s by default) and SQLite after the
/// pool's busy timeout.
pub(crate) async fn bound_lock_waits<C: ConnectionTrait>(txn: &C) -> Result<(), DbErr> {
    if txn.get_database_backend() == sea_orm::DbBackend::Postgres {
        txn.execute_unprepared(&format!("SET LOCAL lock_timeout = '{LOCK_WAIT_SECS}s'"))
            .await?;
    }
    Ok(())
}

/// A recount lock taken inside a batch's transaction (PostgreSQL), with a
/// lock timeout so a recount never waits forever.
pub(crate) struct InTransaction {
    lock: Statement,
}

impl InTransaction {
    /// Waits for the lock, at most [`LOCK_WAIT_SECS`]; the transaction's
    /// end releases it.
    pub(crate) async fn take<C: ConnectionTrait>(&self, txn: &C) -> Result<(), DbErr> {
        bound_lock_waits(txn).await?;
        txn.execute_raw(self.lock.clone()).await?;
        Ok(())
    }
}

#[cfg(feature = "sqlx-mysql")]
async fn mysql_session(db: &DatabaseConnection, table: &str, key: &str) -> Result<RecountLock> {
    use sea_orm::DatabaseConnectionType;
    if !matches!(db.inner, DatabaseConnectionType::SqlxMySqlPoolConnection(_)) {
        return Err(CounterError::UnsupportedBackend(
            "a MySQL connection that is not a sqlx pool (recounts need one for their lock)".into(),
        ));
    }
    let mut conn = db
        .get_mysql_connection_pool()
        .acquire()
        .await
        .map_err(|e| CounterError::Database(DbErr::Custom(format!("a lock connection: {e}"))))?;
    conn.close_on_drop();
    let name = format!("{:016x}", lock_id(table, key));
    Ok(RecountLock::Session { conn, name })
}

#[cfg(not(feature = "sqlx-mysql"))]
async fn mysql_session(_: &DatabaseConnection, _: &str, _: &str) -> Result<RecountLock> {
    Err(CounterError::UnsupportedBackend(
        "MySQL without counter-core's `sqlx-mysql` feature (recounts need it for their lock)"
            .into(),
    ))
}

#[cfg(feature = "sqlx-mysql")]
fn busy(table: &str, key: &str) -> CounterError {
    CounterError::ReconcileBusy {
        table: table.to_owned(),
        key: key.to_owned(),
        waited_secs: LOCK_WAIT_SECS,
    }
}

/// FNV-1a of the table and key: the same in every process and build (the
/// standard library's hasher is not), so every recounter agrees on the lock.
fn lock_id(table: &str, key: &str) -> i64 {
    let hash = super::fnv1a(table.bytes().chain([0]).chain(key.bytes()));
    i64::from_ne_bytes(hash.to_ne_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_key_locks_are_postgres_only_sorted_and_width_blind() {
        let lock = |key: Value| {
            row_key_locks(Dialect::Postgres, "favorites", [&[key][..]], true)
                .into_iter()
                .map(|s| s.values)
                .collect::<Vec<_>>()
        };
        assert_eq!(lock(Value::from(7i32)), lock(Value::from(7i64)));
        assert_ne!(lock(Value::from(7i64)), lock(Value::from(8i64)));
        let (a, b) = ([Value::from(1i64)], [Value::from(2i64)]);
        let forward = row_key_locks(Dialect::Postgres, "f", [&a[..], &b[..], &a[..]], false);
        let backward = row_key_locks(Dialect::Postgres, "f", [&b[..], &a[..]], false);
        assert_eq!(forward.len(), 2);
        assert_eq!(
            forward.iter().map(|s| &s.values).collect::<Vec<_>>(),
            backward.iter().map(|s| &s.values).collect::<Vec<_>>()
        );
        assert!(row_key_locks(Dialect::MySql, "f", [&a[..]], true).is_empty());
    }

    #[test]
    fn lock_ids_are_stable_and_distinct() {
        assert_eq!(lock_id("t", "k"), lock_id("t", "k"));
        assert_ne!(lock_id("t", "k"), lock_id("tk", ""));
    }
}
