//! A table's bytes on disk, as each server reports them: what the limits
//! bench divides by live bytes and by counters.

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};

use crate::BoxError;

/// One number a query answers in its column `n`.
pub async fn number(db: &DatabaseConnection, sql: String) -> Result<u64, BoxError> {
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await?;
    let n = row.map(|row| row.try_get::<i64>("", "n")).transpose()?;
    Ok(u64::try_from(n.unwrap_or(0)).unwrap_or(0))
}

/// `table`'s bytes on disk with its indexes. PostgreSQL: its total
/// relation size (TOAST included) after a `VACUUM`, what autovacuum would
/// have run; MySQL: data and index length after `ANALYZE TABLE`; SQLite:
/// not measured (`None`). `table` is a bench's constant, never input.
pub async fn table_bytes(db: &DatabaseConnection, table: &str) -> Result<Option<u64>, BoxError> {
    match db.get_database_backend() {
        DbBackend::Postgres => {
            db.execute_unprepared(&format!("VACUUM {table}")).await?;
            let sql = format!("SELECT CAST(pg_total_relation_size('{table}') AS BIGINT) AS n");
            Ok(Some(number(db, sql).await?))
        }
        DbBackend::MySql => {
            db.execute_unprepared(&format!("ANALYZE TABLE {table}"))
                .await?;
            let sql = format!(
                "SELECT CAST(data_length + index_length AS SIGNED) AS n FROM information_schema.tables \
                 WHERE table_schema = DATABASE() AND table_name = '{table}'"
            );
            Ok(Some(number(db, sql).await?))
        }
        _ => Ok(None),
    }
}
