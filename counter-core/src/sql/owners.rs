//! A counter table and its owner table: deleting the counts of owners that
//! are gone.

use sea_orm::{
    Statement, Value,
    sea_query::{Alias, Expr, ExprTrait, Query, SimpleExpr, TableRef},
};

use super::{Dialect, FoldSlots, col};
use crate::table::OwnerTable;

pub(super) fn owner_ref(owner: &OwnerTable) -> TableRef {
    match &owner.schema {
        Some(schema) => (
            Alias::new(schema.as_ref()),
            Alias::new(owner.table.as_ref()),
        )
            .into(),
        None => Alias::new(owner.table.as_ref()).into(),
    }
}

/// `DELETE FROM t WHERE owner_id IN (...) [AND slot % n = i]`: a region
/// deletes only its own slots.
pub(crate) fn delete_owners(
    dialect: Dialect,
    table: &str,
    owners: Vec<Value>,
    slots: FoldSlots,
) -> Statement {
    let mut delete = Query::delete()
        .from_table(Alias::new(table))
        .and_where(Expr::col(Alias::new(col::OWNER_ID)).is_in(owners))
        .to_owned();
    if let Some(share) = slots.condition() {
        delete.and_where(share);
    }
    dialect.backend().build(&delete)
}

/// `DELETE FROM t WHERE owner_id IN (...) AND count_key = ?`: one key of
/// some owners.
pub(crate) fn delete_key_of_owners(
    dialect: Dialect,
    table: &str,
    owners: Vec<Value>,
    key: &str,
) -> Statement {
    let delete = Query::delete()
        .from_table(Alias::new(table))
        .and_where(Expr::col(Alias::new(col::OWNER_ID)).is_in(owners))
        .and_where(Expr::col(Alias::new(col::COUNT_KEY)).eq(key))
        .to_owned();
    dialect.backend().build(&delete)
}

/// `DELETE FROM t [WHERE slot % n = i]` (every count, or a region's).
pub(crate) fn delete_all(dialect: Dialect, table: &str, slots: FoldSlots) -> Statement {
    let mut delete = Query::delete().from_table(Alias::new(table)).to_owned();
    if let Some(share) = slots.condition() {
        delete.and_where(share);
    }
    dialect.backend().build(&delete)
}

/// The condition "the owner row of this slot row exists".
fn owner_exists(table: &str, owner: &OwnerTable) -> SimpleExpr {
    let exists = Query::select()
        .expr(Expr::val(1))
        .from(owner_ref(owner))
        .and_where(
            Expr::col((
                Alias::new(owner.table.as_ref()),
                Alias::new(owner.column.as_ref()),
            ))
            .equals((Alias::new(table), Alias::new(col::OWNER_ID))),
        )
        .to_owned();
    Expr::exists(exists)
}

/// `DELETE FROM t WHERE NOT EXISTS (SELECT 1 FROM owner WHERE owner.id =
/// t.owner_id)`: the counts no owner row holds any more, in one statement
/// (the cascade migration's, under its lock).
#[cfg_attr(not(feature = "migration"), allow(dead_code))]
pub(crate) fn delete_orphans(dialect: Dialect, table: &str, owner: &OwnerTable) -> Statement {
    let delete = Query::delete()
        .from_table(Alias::new(table))
        .and_where(owner_exists(table, owner).not())
        .to_owned();
    dialect.backend().build(&delete)
}

/// `SELECT DISTINCT owner_id FROM t WHERE NOT EXISTS (...)`: the owners
/// whose rows are gone, read without locking anything.
pub(crate) fn orphan_owners(dialect: Dialect, table: &str, owner: &OwnerTable) -> Statement {
    let select = Query::select()
        .distinct()
        .column(Alias::new(col::OWNER_ID))
        .from(Alias::new(table))
        .and_where(owner_exists(table, owner).not())
        .to_owned();
    dialect.backend().build(&select)
}

/// [`delete_owners`] of those of `owners` whose row is still gone: a row
/// inserted again since [`orphan_owners`] read keeps its counts.
pub(crate) fn delete_orphans_of(
    dialect: Dialect,
    table: &str,
    owner: &OwnerTable,
    owners: Vec<Value>,
    slots: FoldSlots,
) -> Statement {
    let mut delete = Query::delete()
        .from_table(Alias::new(table))
        .and_where(Expr::col(Alias::new(col::OWNER_ID)).is_in(owners))
        .and_where(owner_exists(table, owner).not())
        .to_owned();
    if let Some(share) = slots.condition() {
        delete.and_where(share);
    }
    dialect.backend().build(&delete)
}
