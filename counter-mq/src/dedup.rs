//! The dedup table: one row per applied message id, written in the same
//! transaction as the message's deltas, so a redelivered id finds its row
//! and is skipped. Every SQL difference between backends is in this file.
//!
//! ```sql
//! CREATE TABLE counter_applied_messages (
//!     source     VARCHAR(64)  NOT NULL,  -- ascii_bin on MySQL
//!     msg_id     VARCHAR(128) NOT NULL,  -- ascii_bin on MySQL
//!     applied_at BIGINT       NOT NULL,  -- Unix seconds, the database's clock
//!     PRIMARY KEY (source, msg_id));
//! CREATE INDEX counter_applied_messages_applied_at ON counter_applied_messages (applied_at);
//! ```

use std::{collections::HashSet, time::Duration};

use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, TransactionTrait, Value,
};

use crate::error::MqError;

/// The dedup table's name.
pub const APPLIED_MESSAGES: &str = "counter_applied_messages";
/// Rows deleted by one pruning statement.
pub(crate) const PRUNE_BATCH: u64 = 10_000;

/// The database's current time in Unix seconds: one clock for every
/// consumer, so a consumer whose clock is ahead cannot prune rows another
/// still needs.
pub(crate) fn now(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Postgres => "CAST(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) AS BIGINT)",
        // Signed: `UNIX_TIMESTAMP()` is unsigned, and a cutoff before 1970
        // (a retention of decades) would be out of range.
        DbBackend::MySql => "CAST(UNIX_TIMESTAMP() AS SIGNED)",
        _ => "CAST(strftime('%s', 'now') AS INTEGER)",
    }
}

fn create_statements(backend: DbBackend) -> [String; 2] {
    // Ids are compared byte for byte: MySQL's default collations would make
    // `A` and `a` one id, and a second event would be skipped as a replay.
    let text = |len| match backend {
        DbBackend::MySql => format!("VARCHAR({len}) CHARACTER SET ascii COLLATE ascii_bin"),
        _ => format!("VARCHAR({len})"),
    };
    [
        format!(
            "CREATE TABLE IF NOT EXISTS {APPLIED_MESSAGES} (source {} NOT NULL, msg_id {} NOT NULL, \
             applied_at BIGINT NOT NULL, PRIMARY KEY (source, msg_id))",
            text(64),
            text(128)
        ),
        // MariaDB has `IF NOT EXISTS` for indexes (10.1.4+); MySQL 8 has
        // neither it nor the `RETURNING` a batch needs (see `probe`).
        format!(
            "CREATE INDEX IF NOT EXISTS {APPLIED_MESSAGES}_applied_at ON {APPLIED_MESSAGES} (applied_at)"
        ),
    ]
}

/// Creates the dedup table and its index if missing (what the
/// [`AppliedMessagesMigration`] runs).
///
/// Both statements are idempotent and probe nothing, so they also run inside
/// the transaction sea-orm-migration wraps a PostgreSQL migration in.
pub async fn create_table<C: ConnectionTrait>(db: &C) -> Result<(), DbErr> {
    for statement in create_statements(db.get_database_backend()) {
        db.execute_unprepared(&statement).await?;
    }
    Ok(())
}

/// Drops the dedup table.
pub async fn drop_table<C: ConnectionTrait>(db: &C) -> Result<(), DbErr> {
    db.execute_unprepared(&format!("DROP TABLE IF EXISTS {APPLIED_MESSAGES}"))
        .await
        .map(drop)
}

/// Checks, in a transaction rolled back, that the dedup table exists and
/// that this database runs the batch's `INSERT ... RETURNING` (MySQL 8 has
/// no `RETURNING`; MariaDB 10.5+, PostgreSQL and SQLite 3.35+ do): a
/// consumer fails at start, by name, instead of retrying every batch.
pub(crate) async fn probe(db: &DatabaseConnection, source: &str) -> Result<(), MqError> {
    let txn = db.begin().await?;
    let probed = record_new(&txn, source, &["counter-mq:probe"]).await;
    txn.rollback().await?;
    let Err(error) = probed else { return Ok(()) };
    if table_readable_where_unwritable(db, &error).await {
        return Ok(());
    }
    if db.get_database_backend() == DbBackend::MySql && !is_mariadb(db).await {
        return Err(MqError::Counter(
            counter_core::CounterError::UnsupportedBackend(
                "MySQL has no `INSERT ... RETURNING`, which a batch's dedup insert needs: \
             counter-mq runs on MariaDB 10.5+, PostgreSQL and SQLite 3.35+"
                    .into(),
            ),
        ));
    }
    Err(MqError::SchemaMissing {
        table: APPLIED_MESSAGES.into(),
        hint: "run `AppliedMessagesMigration` (or `counter_mq::create_table`)",
        source: Box::new(error),
    })
}

/// Whether the probe's write failed only because the server takes no
/// writes now (a standby or a demoted primary in a failover, a connection
/// lost), while the table is there to read: a consumer or a service that
/// starts mid-failover starts, and says it is not ready until the primary
/// is back, rather than calling a table that exists missing.
async fn table_readable_where_unwritable(db: &DatabaseConnection, error: &DbErr) -> bool {
    let kind = counter_core::CounterError::Database(error.clone()).kind();
    if kind != counter_core::ErrorKind::Transient {
        return false;
    }
    let read = Statement::from_string(
        db.get_database_backend(),
        format!("SELECT 1 FROM {APPLIED_MESSAGES} WHERE 1 = 0"),
    );
    counter_core::pooling::query_all(db, read).await.is_ok()
}

async fn is_mariadb(db: &DatabaseConnection) -> bool {
    let version = counter_core::pooling::query_one(
        db,
        Statement::from_string(DbBackend::MySql, "SELECT VERSION()"),
    )
    .await;
    matches!(version, Ok(Some(row)) if row.try_get_by_index::<String>(0).is_ok_and(|v| v.contains("MariaDB")))
}

/// Records `ids` of `source` as applied and returns the ones that were new:
/// one `INSERT` that skips existing ids and returns the inserted ones
/// (`ON CONFLICT DO NOTHING RETURNING` on PostgreSQL and SQLite ≥ 3.35,
/// `INSERT IGNORE ... RETURNING` on MariaDB ≥ 10.5). Ids are sent sorted,
/// so two consumers inserting overlapping ids lock them in one order.
pub(crate) async fn record_new<C: ConnectionTrait>(
    db: &C,
    source: &str,
    ids: &[&str],
) -> Result<HashSet<String>, DbErr> {
    if ids.is_empty() {
        return Ok(HashSet::new());
    }
    let backend = db.get_database_backend();
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let (sql, values) = if backend == DbBackend::Postgres {
        // One text and two parameters whatever the batch size: the server
        // parses it once per connection, and the statement stays small (a
        // statement over one TCP segment waits out a delayed ACK: sqlx 0.9
        // leaves Nagle's algorithm on). The ids go as one string split on
        // spaces, which no id contains (`check_id`).
        let sql = format!(
            "INSERT INTO {APPLIED_MESSAGES} (source, msg_id, applied_at) SELECT $1, id, {} \
             FROM unnest(string_to_array($2, ' ')) WITH ORDINALITY AS t(id, n) ORDER BY n \
             ON CONFLICT DO NOTHING RETURNING msg_id",
            now(backend)
        );
        (
            sql,
            vec![Value::from(source), Value::from(sorted.join(" "))],
        )
    } else {
        rows_insert(backend, source, &sorted)
    };
    let rows =
        counter_core::pooling::query_all(db, Statement::from_sql_and_values(backend, sql, values))
            .await?;
    rows.iter()
        .map(|row| row.try_get_by_index::<String>(0))
        .collect()
}

/// `INSERT IGNORE` (MySQL) or `INSERT ... ON CONFLICT DO NOTHING`
/// (SQLite) of one row per id, returning the inserted ids.
fn rows_insert(backend: DbBackend, source: &str, ids: &[&str]) -> (String, Vec<Value>) {
    let mut sql = String::with_capacity(64 + ids.len() * 48);
    sql.push_str(match backend {
        DbBackend::MySql => "INSERT IGNORE INTO ",
        _ => "INSERT INTO ",
    });
    sql.push_str(APPLIED_MESSAGES);
    sql.push_str(" (source, msg_id, applied_at) VALUES ");
    let mut values = Vec::with_capacity(ids.len() * 2);
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            sql.push(',');
        }
        sql.push('(');
        sql.push_str(&placeholder(backend, values.len() + 1));
        sql.push(',');
        sql.push_str(&placeholder(backend, values.len() + 2));
        sql.push(',');
        sql.push_str(now(backend));
        sql.push(')');
        values.push(Value::from(source));
        values.push(Value::from(*id));
    }
    if backend != DbBackend::MySql {
        sql.push_str(" ON CONFLICT DO NOTHING");
    }
    sql.push_str(" RETURNING msg_id");
    (sql, values)
}

/// Sets `applied_at` of `ids` (duplicates just seen) to now: retention then
/// counts from the last time an id was seen, so a publisher that keeps
/// re-sending one id (a buffer retrying a flush through a long outage) keeps
/// its row alive. One statement, only in batches that had duplicates.
pub(crate) async fn touch<C: ConnectionTrait>(
    db: &C,
    source: &str,
    ids: &[&str],
) -> Result<(), DbErr> {
    if ids.is_empty() {
        return Ok(());
    }
    let backend = db.get_database_backend();
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut values = vec![Value::from(source)];
    let list: Vec<String> = sorted
        .iter()
        .enumerate()
        .map(|(i, id)| {
            values.push(Value::from(*id));
            placeholder(backend, i + 2)
        })
        .collect();
    let sql = format!(
        "UPDATE {APPLIED_MESSAGES} SET applied_at = {} WHERE source = {} AND msg_id IN ({})",
        now(backend),
        placeholder(backend, 1),
        list.join(",")
    );
    counter_core::pooling::execute(db, Statement::from_sql_and_values(backend, sql, values))
        .await
        .map(drop)
}

fn placeholder(backend: DbBackend, n: usize) -> String {
    match backend {
        DbBackend::Postgres => format!("${n}"),
        _ => "?".to_owned(),
    }
}

/// Deletes up to [`PRUNE_BATCH`] rows of `source` older than `retention`
/// (by the database's clock); returns how many went.
pub(crate) async fn prune_once<C: ConnectionTrait>(
    db: &C,
    source: &str,
    retention: Duration,
) -> Result<u64, DbErr> {
    let backend = db.get_database_backend();
    let cutoff = format!("{} - {}", now(backend), retention.as_secs());
    let sql = match backend {
        DbBackend::MySql => format!(
            "DELETE FROM {APPLIED_MESSAGES} WHERE source = ? AND applied_at < {cutoff} \
             ORDER BY applied_at LIMIT {PRUNE_BATCH}"
        ),
        _ => format!(
            "DELETE FROM {APPLIED_MESSAGES} WHERE source = {} AND msg_id IN (SELECT msg_id FROM \
             {APPLIED_MESSAGES} WHERE source = {} AND applied_at < {cutoff} ORDER BY applied_at LIMIT {PRUNE_BATCH})",
            placeholder(backend, 1),
            placeholder(backend, 2)
        ),
    };
    let mut values = vec![Value::from(source)];
    if backend != DbBackend::MySql {
        values.push(Value::from(source));
    }
    let result =
        counter_core::pooling::execute(db, Statement::from_sql_and_values(backend, sql, values))
            .await?;
    Ok(result.rows_affected())
}

/// Rows of `source` in the dedup table (tests and tools).
pub async fn applied_count<C: ConnectionTrait>(db: &C, source: &str) -> Result<u64, DbErr> {
    let backend = db.get_database_backend();
    let sql = format!(
        "SELECT COUNT(*) FROM {APPLIED_MESSAGES} WHERE source = {}",
        placeholder(backend, 1)
    );
    let row = counter_core::pooling::query_one(
        db,
        Statement::from_sql_and_values(backend, sql, [Value::from(source)]),
    )
    .await?
    .ok_or_else(|| DbErr::RecordNotFound("COUNT(*) returned no row".into()))?;
    row.try_get_by_index::<i64>(0).map(|n| n.max(0) as u64)
}

pub use migration::AppliedMessagesMigration;

mod migration {
    //! The `sea-orm-migration` migration that creates the dedup table.

    use sea_orm::DbErr;
    use sea_orm_migration::{
        MigrationName, MigrationTrait, SchemaManager, async_trait::async_trait,
    };

    /// Creates (`up`) or drops (`down`) the dedup table. Add it to your
    /// `Migrator`'s list (they run in list order; its name follows the
    /// `mYYYYMMDD_HHMMSS_` convention of the rest):
    ///
    /// ```
    /// use sea_orm_migration::{MigrationTrait, MigratorTrait, async_trait::async_trait};
    ///
    /// pub struct Migrator;
    ///
    /// #[async_trait]
    /// impl MigratorTrait for Migrator {
    ///     fn migrations() -> Vec<Box<dyn MigrationTrait>> {
    ///         vec![
    ///             // Box::new(m20220101_000001_create_post::Migration), ...
    ///             Box::new(counter_mq::AppliedMessagesMigration),
    ///         ]
    ///     }
    /// }
    /// ```
    #[derive(Debug, Clone, Copy, Default)]
    pub struct AppliedMessagesMigration;

    impl MigrationName for AppliedMessagesMigration {
        fn name(&self) -> &str {
            "m20261127_000001_create_counter_applied_messages"
        }
    }

    #[async_trait]
    impl MigrationTrait for AppliedMessagesMigration {
        async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            super::create_table(manager.get_connection()).await
        }

        async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            super::drop_table(manager.get_connection()).await
        }
    }
}
