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

use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement, Value};

/// The dedup table's name.
pub const APPLIED_MESSAGES: &str = "counter_applied_messages";
/// Rows deleted by one pruning statement.
pub(crate) const PRUNE_BATCH: u64 = 10_000;

/// The database's current time in Unix seconds: one clock for every
/// consumer, so a consumer whose clock is ahead cannot prune rows another
/// still needs.
fn now(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Postgres => "CAST(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) AS BIGINT)",
        DbBackend::MySql => "UNIX_TIMESTAMP()",
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
        match backend {
            // MySQL has no `IF NOT EXISTS` for indexes; the table's own
            // `IF NOT EXISTS` guards this statement (see `create_table`).
            DbBackend::MySql => format!(
                "CREATE INDEX {APPLIED_MESSAGES}_applied_at ON {APPLIED_MESSAGES} (applied_at)"
            ),
            _ => format!(
                "CREATE INDEX IF NOT EXISTS {APPLIED_MESSAGES}_applied_at ON {APPLIED_MESSAGES} (applied_at)"
            ),
        },
    ]
}

/// Creates the dedup table and its index if missing (what the
/// [`AppliedMessagesMigration`] runs).
pub async fn create_table<C: ConnectionTrait>(db: &C) -> Result<(), DbErr> {
    let backend = db.get_database_backend();
    let exists = table_exists(db).await?;
    let [table, index] = create_statements(backend);
    db.execute_unprepared(&table).await?;
    if !exists || backend != DbBackend::MySql {
        db.execute_unprepared(&index).await?;
    }
    Ok(())
}

/// Drops the dedup table.
pub async fn drop_table<C: ConnectionTrait>(db: &C) -> Result<(), DbErr> {
    db.execute_unprepared(&format!("DROP TABLE IF EXISTS {APPLIED_MESSAGES}"))
        .await
        .map(drop)
}

async fn table_exists<C: ConnectionTrait>(db: &C) -> Result<bool, DbErr> {
    let probe = format!("SELECT 1 FROM {APPLIED_MESSAGES} WHERE 1 = 0");
    match db.execute_unprepared(&probe).await {
        Ok(_) => Ok(true),
        Err(_) => Ok(false),
    }
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
    let mut sql = String::with_capacity(64 + sorted.len() * 48);
    sql.push_str(match backend {
        DbBackend::MySql => "INSERT IGNORE INTO ",
        _ => "INSERT INTO ",
    });
    sql.push_str(APPLIED_MESSAGES);
    sql.push_str(" (source, msg_id, applied_at) VALUES ");
    let mut values = Vec::with_capacity(sorted.len() * 2);
    for (i, id) in sorted.iter().enumerate() {
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
    let rows = db
        .query_all_raw(Statement::from_sql_and_values(backend, sql, values))
        .await?;
    rows.iter()
        .map(|row| row.try_get_by_index::<String>(0))
        .collect()
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
    let result = db
        .execute_raw(Statement::from_sql_and_values(backend, sql, values))
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
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            backend,
            sql,
            [Value::from(source)],
        ))
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
    /// `Migrator` (its name follows the `mYYYYMMDD_HHMMSS_` convention, so
    /// it sorts among your own migrations):
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
