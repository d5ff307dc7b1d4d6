//! Bringing a companion table that something else created to the shape
//! [`create_table`](super::create_table) gives a new one.
//!
//! SeaORM's schema sync creates a registered companion entity from its
//! columns, and an entity cannot say a collation or a second index: on
//! MySQL its `count_key` and string `owner_id` then compare
//! case-insensitively (`Flag` and `flag` would be one counter) and the key
//! index is missing; on PostgreSQL a string `owner_id` sorts in the
//! database's locale instead of byte order (the order recounts walk in).
//! [`Counters::create_table`](crate::Counters::create_table) reads the
//! columns and fixes what differs, in place: a byte-wise collation is
//! stricter than any other, so no existing key can collide.

use sea_orm::{QueryResult, Statement, Value};

use super::{Dialect, col, ddl::key_index_name};
use crate::{owner::OwnerColumn, table::OwnerTable};

/// The collation a column must have, per dialect; `None`: whatever it has.
pub(crate) fn wanted_collation(
    dialect: Dialect,
    column: &str,
    owner: OwnerColumn,
) -> Option<&'static str> {
    let string_owner = column == col::OWNER_ID && owner == OwnerColumn::String;
    match dialect {
        Dialect::MySql if column == col::COUNT_KEY => Some("ascii_bin"),
        Dialect::MySql if string_owner => Some("utf8mb4_bin"),
        Dialect::Postgres if string_owner => Some("C"),
        _ => None,
    }
}

/// `(column, collation)` of `table`'s `owner_id` and `count_key`
/// (PostgreSQL reports `NULL` for the database's default collation).
pub(crate) fn collations(dialect: Dialect, table: &str) -> Option<Statement> {
    let sql = match dialect {
        Dialect::MySql => {
            "SELECT COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? \
             AND COLUMN_NAME IN ('owner_id', 'count_key')"
        }
        Dialect::Postgres => {
            "SELECT column_name::text, collation_name::text FROM information_schema.columns \
             WHERE table_schema = current_schema() AND table_name = $1 \
             AND column_name IN ('owner_id', 'count_key')"
        }
        Dialect::Sqlite => return None,
    };
    Some(Statement::from_sql_and_values(
        dialect.backend(),
        sql,
        [Value::from(table)],
    ))
}

/// One row of [`collations`].
pub(crate) fn collation_row(row: &QueryResult) -> Result<(String, Option<String>), sea_orm::DbErr> {
    Ok((row.try_get_by_index(0)?, row.try_get_by_index(1)?))
}

/// The statement that gives `column` of `table` its wanted collation,
/// keeping its type and `NOT NULL`.
pub(crate) fn set_collation(
    dialect: Dialect,
    table: &str,
    column: &str,
    collation: &str,
) -> Statement {
    let sql = match (dialect, column) {
        (Dialect::MySql, col::COUNT_KEY) => format!(
            "ALTER TABLE `{table}` MODIFY `{column}` VARCHAR(64) CHARACTER SET ascii COLLATE {collation} NOT NULL"
        ),
        (Dialect::MySql, _) => format!(
            "ALTER TABLE `{table}` MODIFY `{column}` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL"
        ),
        _ => format!(
            r#"ALTER TABLE "{table}" ALTER COLUMN "{column}" TYPE VARCHAR(255) COLLATE "{collation}""#
        ),
    };
    Statement::from_string(dialect.backend(), sql)
}

/// A row if `table` exists.
pub(crate) fn table_exists(dialect: Dialect, table: &str) -> Statement {
    let sql = match dialect {
        Dialect::MySql => {
            "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?"
        }
        Dialect::Postgres => {
            "SELECT 1 FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = $1"
        }
        Dialect::Sqlite => "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
    };
    Statement::from_sql_and_values(dialect.backend(), sql, [Value::from(table)])
}

/// A row if the owner table has the declared key column.
pub(crate) fn owner_column_exists(dialect: Dialect, owner: &OwnerTable) -> Statement {
    column_exists(
        dialect,
        owner.schema.as_deref(),
        owner.table.as_ref(),
        owner.column.as_ref(),
    )
}

/// A row if `table` (in `schema`, else the connection's) has `column`.
pub(crate) fn column_exists(
    dialect: Dialect,
    schema: Option<&str>,
    table: &str,
    column: &str,
) -> Statement {
    let schema = schema.map(str::to_owned);
    let sql = match dialect {
        Dialect::MySql => {
            "SELECT 1 FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? AND COLUMN_NAME = ?"
        }
        Dialect::Postgres => {
            "SELECT 1 FROM information_schema.columns \
             WHERE table_schema = COALESCE($1, current_schema()) AND table_name = $2 AND column_name = $3"
        }
        Dialect::Sqlite => {
            "SELECT 1 FROM pragma_table_info(?2, COALESCE(?1, 'main')) WHERE name = ?3"
        }
    };
    Statement::from_sql_and_values(
        dialect.backend(),
        sql,
        [Value::from(schema), Value::from(table), Value::from(column)],
    )
}

/// A row if `table` has its key index (on MySQL a table that existed
/// already does not get it from `CREATE TABLE IF NOT EXISTS`).
pub(crate) fn has_key_index(dialect: Dialect, table: &str) -> Statement {
    let (sql, values) = match dialect {
        Dialect::MySql => (
            "SELECT 1 FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND INDEX_NAME = ? LIMIT 1",
            vec![Value::from(table), Value::from(key_index_name(table))],
        ),
        Dialect::Postgres => (
            "SELECT 1 FROM pg_indexes WHERE schemaname = current_schema() AND indexname = $1",
            vec![Value::from(key_index_name(table))],
        ),
        Dialect::Sqlite => (
            "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?",
            vec![Value::from(key_index_name(table))],
        ),
    };
    Statement::from_sql_and_values(dialect.backend(), sql, values)
}

/// A foreign key on a counter table's `owner_id`, whoever made it (this
/// crate's migration, SeaORM's schema sync, a hand-written migration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OwnerKey {
    /// Its name (SQLite's are not reported, and not needed).
    pub name: String,
    /// Whether deleting the owner row deletes the counts.
    pub cascades: bool,
}

/// The foreign keys on `table.owner_id`, one row each: `(name, delete rule)`.
pub(crate) fn owner_keys(dialect: Dialect, table: &str) -> Statement {
    let backend = dialect.backend();
    match dialect {
        Dialect::Postgres => Statement::from_sql_and_values(
            backend,
            "SELECT k.constraint_name, r.delete_rule \
             FROM information_schema.key_column_usage k \
             JOIN information_schema.referential_constraints r \
               ON r.constraint_schema = k.constraint_schema AND r.constraint_name = k.constraint_name \
             WHERE k.table_schema = current_schema() AND k.table_name = $1 AND k.column_name = $2",
            [table.into(), col::OWNER_ID.into()],
        ),
        Dialect::MySql => Statement::from_sql_and_values(
            backend,
            "SELECT k.CONSTRAINT_NAME, r.DELETE_RULE \
             FROM information_schema.KEY_COLUMN_USAGE k \
             JOIN information_schema.REFERENTIAL_CONSTRAINTS r \
               ON r.CONSTRAINT_SCHEMA = k.CONSTRAINT_SCHEMA AND r.CONSTRAINT_NAME = k.CONSTRAINT_NAME \
             WHERE k.TABLE_SCHEMA = DATABASE() AND k.TABLE_NAME = ? AND k.COLUMN_NAME = ?",
            [table.into(), col::OWNER_ID.into()],
        ),
        Dialect::Sqlite => Statement::from_sql_and_values(
            backend,
            "SELECT '', on_delete FROM pragma_foreign_key_list(?) WHERE \"from\" = ?",
            [table.into(), col::OWNER_ID.into()],
        ),
    }
}

/// A row of [`owner_keys`].
pub(crate) fn owner_key(row: &QueryResult) -> Result<OwnerKey, sea_orm::DbErr> {
    let name: String = row.try_get_by_index(0)?;
    let rule: String = row.try_get_by_index(1)?;
    Ok(OwnerKey {
        name,
        cascades: rule.eq_ignore_ascii_case("CASCADE"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wanted_collations_are_the_ones_create_table_gives() {
        use OwnerColumn::{Integer, String};
        assert_eq!(
            wanted_collation(Dialect::MySql, col::COUNT_KEY, Integer),
            Some("ascii_bin")
        );
        assert_eq!(
            wanted_collation(Dialect::MySql, col::OWNER_ID, Integer),
            None
        );
        assert_eq!(
            wanted_collation(Dialect::MySql, col::OWNER_ID, String),
            Some("utf8mb4_bin")
        );
        assert_eq!(
            wanted_collation(Dialect::Postgres, col::OWNER_ID, String),
            Some("C")
        );
        assert_eq!(
            wanted_collation(Dialect::Postgres, col::COUNT_KEY, String),
            None
        );
        assert_eq!(
            wanted_collation(Dialect::Sqlite, col::COUNT_KEY, String),
            None
        );
    }

    #[test]
    fn a_collation_change_keeps_type_and_not_null() {
        let my = set_collation(Dialect::MySql, "t", col::COUNT_KEY, "ascii_bin");
        assert_eq!(
            my.sql,
            "ALTER TABLE `t` MODIFY `count_key` VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL"
        );
        let pg = set_collation(Dialect::Postgres, "t", col::OWNER_ID, "C");
        assert_eq!(
            pg.sql,
            r#"ALTER TABLE "t" ALTER COLUMN "owner_id" TYPE VARCHAR(255) COLLATE "C""#
        );
    }
}
