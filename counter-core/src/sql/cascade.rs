//! Adding or removing the `ON DELETE CASCADE` reference of a counter table
//! that already exists (the cascade migration).

use sea_orm::{
    Statement,
    sea_query::{Alias, ForeignKey, ForeignKeyAction},
};

use super::{
    Dialect, Layout, col, ddl,
    owners::{delete_orphans, owner_ref},
};
use crate::{owner::OwnerColumn, table::CounterTable};

/// One row per foreign key the table has (`SELECT 1 ...`): whether the
/// reference to the owner is there.
pub(crate) fn foreign_keys(dialect: Dialect, table: &str) -> Statement {
    let backend = dialect.backend();
    match dialect {
        Dialect::Postgres => Statement::from_sql_and_values(
            backend,
            "SELECT 1 FROM information_schema.table_constraints \
             WHERE table_schema = current_schema() AND table_name = $1 \
             AND constraint_type = 'FOREIGN KEY'",
            [table.into()],
        ),
        Dialect::MySql => Statement::from_sql_and_values(
            backend,
            "SELECT 1 FROM information_schema.TABLE_CONSTRAINTS \
             WHERE CONSTRAINT_SCHEMA = DATABASE() AND TABLE_NAME = ? \
             AND CONSTRAINT_TYPE = 'FOREIGN KEY'",
            [table.into()],
        ),
        Dialect::Sqlite => Statement::from_sql_and_values(
            backend,
            "SELECT 1 FROM pragma_foreign_key_list(?)",
            [table.into()],
        ),
    }
}

/// The statements that give `name` (a table of `table`'s, of `layout`) the
/// reference to its owner (`cascade` on) or take it away (off), keeping
/// every count of an owner that exists. Adding the reference first deletes
/// the counts of owners that are gone, which it would refuse.
///
/// PostgreSQL and MySQL alter the table. SQLite cannot add or drop a
/// constraint, so the table is rebuilt under its own name: renamed aside,
/// created anew, its rows copied, the old one dropped, the key index
/// recreated; the caller runs this in one transaction.
pub(crate) fn set_cascade(
    dialect: Dialect,
    table: &CounterTable,
    name: &str,
    layout: Layout,
    owner_column: OwnerColumn,
    on: bool,
) -> Vec<Statement> {
    let Some(owner) = table.owner() else {
        return Vec::new();
    };
    let fk_name = ddl::owner_fk_name(name);
    let backend = dialect.backend();
    let mut statements = Vec::new();
    if on {
        statements.push(delete_orphans(dialect, name, owner));
    }
    match dialect {
        Dialect::Postgres | Dialect::MySql if on => {
            let mut fk = ForeignKey::create();
            fk.name(&fk_name)
                .from(Alias::new(name), Alias::new(col::OWNER_ID))
                .to(owner_ref(owner), Alias::new(owner.column.as_ref()))
                .on_delete(ForeignKeyAction::Cascade);
            statements.push(backend.build(&fk));
        }
        Dialect::Postgres | Dialect::MySql => {
            let drop = ForeignKey::drop()
                .name(&fk_name)
                .table(Alias::new(name))
                .to_owned();
            statements.push(backend.build(&drop));
        }
        Dialect::Sqlite => {
            let aside = format!("{name}__rebuild");
            let target = if on {
                table.clone().with_cascade(owner.clone())
            } else {
                table.without_cascade()
            };
            let columns: Vec<&str> = layout
                .primary_key()
                .iter()
                .copied()
                .chain([col::VALUE])
                .collect();
            let columns = columns
                .iter()
                .map(|c| format!("\"{c}\""))
                .collect::<Vec<_>>()
                .join(", ");
            statements.push(Statement::from_string(
                backend,
                format!("ALTER TABLE \"{name}\" RENAME TO \"{aside}\""),
            ));
            statements.push(backend.build(&ddl::table_def(
                dialect,
                &target,
                name,
                layout,
                owner_column,
            )));
            statements.push(Statement::from_string(
                backend,
                format!("INSERT INTO \"{name}\" ({columns}) SELECT {columns} FROM \"{aside}\""),
            ));
            statements.push(Statement::from_string(
                backend,
                format!("DROP TABLE \"{aside}\""),
            ));
            if layout == Layout::Totals {
                statements.push(ddl::create_key_index(dialect, name, true));
            }
        }
    }
    statements
}
