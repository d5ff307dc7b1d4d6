//! Adding or removing the `ON DELETE CASCADE` reference of a counter table
//! that already exists (the cascade migration).

use sea_orm::{
    DbErr, Statement,
    sea_query::{Alias, ForeignKey, ForeignKeyAction, Query, Table},
};

use super::{
    Dialect, Layout,
    align::OwnerKey,
    col, ddl,
    owners::{delete_orphans, owner_ref},
};
use crate::{owner::OwnerColumn, table::CounterTable};

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
) -> Result<Vec<Statement>, DbErr> {
    let Some(owner) = table.owner() else {
        return Ok(Vec::new());
    };
    let backend = dialect.backend();
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
        let columns: Vec<Alias> = layout
            .primary_key()
            .iter()
            .chain([&layout.payload()])
            .map(|c| Alias::new(*c))
            .collect();
        let copy = Query::insert()
            .into_table(Alias::new(name))
            .columns(columns.clone())
            .select_from(
                Query::select()
                    .columns(columns)
                    .from(Alias::new(&aside))
                    .to_owned(),
            )
            .map_err(|e| DbErr::Custom(format!("rebuilding {name}: {e}")))?
            .to_owned();
        statements.push(
            backend.build(
                &Table::rename()
                    .table(Alias::new(name), Alias::new(&aside))
                    .to_owned(),
            ),
        );
        statements.push(backend.build(&ddl::table_def(
            dialect,
            &target,
            name,
            layout,
            owner_column,
        )));
        statements.push(backend.build(&copy));
        statements.push(backend.build(&Table::drop().table(Alias::new(&aside)).to_owned()));
        if layout == Layout::Totals {
            statements.push(ddl::create_key_index(dialect, name, true));
        }
        return Ok(statements);
    }
    for key in existing {
        let drop = ForeignKey::drop()
            .name(&key.name)
            .table(Alias::new(name))
            .to_owned();
        statements.push(backend.build(&drop));
    }
    if !on {
        return Ok(statements);
    }
    let fk_name = ddl::owner_fk_name(name);
    let mut add = backend.build(
        ForeignKey::create()
            .name(&fk_name)
            .from(Alias::new(name), Alias::new(col::OWNER_ID))
            .to(owner_ref(owner), Alias::new(owner.column.as_ref()))
            .on_delete(ForeignKeyAction::Cascade),
    );
    if dialect == Dialect::Postgres {
        // PostgreSQL's own clauses, which sea-query does not write.
        let quote = |ident: &str| format!("\"{}\"", ident.replace('"', "\"\""));
        add.sql.push_str(" NOT VALID");
        statements.push(add);
        statements.push(delete_orphans(dialect, name, owner));
        statements.push(Statement::from_string(
            backend,
            format!(
                "ALTER TABLE {} VALIDATE CONSTRAINT {}",
                quote(name),
                quote(&fk_name)
            ),
        ));
    } else {
        statements.push(delete_orphans(dialect, name, owner));
        statements.push(add);
    }
    Ok(statements)
}
