//! Adding or removing the `ON DELETE CASCADE` reference of a counter table
//! that already exists (the cascade migration).

use sea_orm::{QueryResult, Statement};

use super::{Dialect, Layout, col, ddl, owners::delete_orphans};
use crate::{owner::OwnerColumn, table::CounterTable};

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

/// The statements that give `name` (a table of `table`'s, of `layout`) the
/// `ON DELETE CASCADE` reference to its owner (`on`), or take every
/// reference on `owner_id` away, keeping every count of an owner that
/// exists. `existing` are the references it has now ([`owner_keys`]);
/// adding replaces them, and deletes the counts of owners that are gone,
/// which the reference would refuse.
///
/// - PostgreSQL adds the reference `NOT VALID` first, so that no write can
///   make a new orphan meanwhile, then deletes the orphans and validates.
/// - MySQL deletes the orphans, then adds the reference (its `ALTER`
///   commits on its own; the caller retries if a write for a deleted owner
///   slipped in between).
/// - SQLite cannot add or drop a constraint: the table is rebuilt under its
///   own name (renamed aside, created anew, its rows copied, the old one
///   dropped, the key index recreated), in the caller's transaction.
pub(crate) fn set_cascade(
    dialect: Dialect,
    table: &CounterTable,
    name: &str,
    layout: Layout,
    owner_column: OwnerColumn,
    existing: &[OwnerKey],
    on: bool,
) -> Vec<Statement> {
    let Some(owner) = table.owner() else {
        return Vec::new();
    };
    let backend = dialect.backend();
    // Identifiers quoted (and their quote characters doubled) as
    // sea-query quotes them.
    let quote = |ident: &str| match dialect {
        Dialect::MySql => format!("`{}`", ident.replace('`', "``")),
        _ => format!("\"{}\"", ident.replace('"', "\"\"")),
    };
    let sql = |text: String| Statement::from_string(backend, text);
    let mut statements = Vec::new();
    if dialect == Dialect::Sqlite {
        if on {
            statements.push(delete_orphans(dialect, name, owner));
        }
        let aside = format!("{name}__rebuild");
        let target = if on {
            table.clone().with_cascade(owner.clone())
        } else {
            table.without_cascade()
        };
        let columns = layout
            .primary_key()
            .iter()
            .copied()
            .chain([col::VALUE])
            .map(quote)
            .collect::<Vec<_>>()
            .join(", ");
        statements.push(sql(format!(
            "ALTER TABLE {} RENAME TO {}",
            quote(name),
            quote(&aside)
        )));
        statements.push(backend.build(&ddl::table_def(
            dialect,
            &target,
            name,
            layout,
            owner_column,
        )));
        statements.push(sql(format!(
            "INSERT INTO {} ({columns}) SELECT {columns} FROM {}",
            quote(name),
            quote(&aside)
        )));
        statements.push(sql(format!("DROP TABLE {}", quote(&aside))));
        if layout == Layout::Totals {
            statements.push(ddl::create_key_index(dialect, name, true));
        }
        return statements;
    }
    let drop = match dialect {
        Dialect::MySql => "DROP FOREIGN KEY",
        _ => "DROP CONSTRAINT",
    };
    for key in existing {
        statements.push(sql(format!(
            "ALTER TABLE {} {drop} {}",
            quote(name),
            quote(&key.name)
        )));
    }
    if !on {
        return statements;
    }
    let owner_table = match &owner.schema {
        Some(schema) => format!("{}.{}", quote(schema), quote(&owner.table)),
        None => quote(&owner.table),
    };
    let fk_name = ddl::owner_fk_name(name);
    let add = format!(
        "ALTER TABLE {} ADD CONSTRAINT {} FOREIGN KEY ({}) REFERENCES {owner_table} ({}) ON DELETE CASCADE",
        quote(name),
        quote(&fk_name),
        quote(col::OWNER_ID),
        quote(&owner.column),
    );
    if dialect == Dialect::Postgres {
        statements.push(sql(format!("{add} NOT VALID")));
        statements.push(delete_orphans(dialect, name, owner));
        statements.push(sql(format!(
            "ALTER TABLE {} VALIDATE CONSTRAINT {}",
            quote(name),
            quote(&fk_name)
        )));
    } else {
        statements.push(delete_orphans(dialect, name, owner));
        statements.push(sql(add));
    }
    statements
}
