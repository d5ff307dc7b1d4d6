//! Which owners a statement covers, and walking a table's owners in
//! primary-key order, one bounded stretch at a time.

use sea_orm::{
    Statement, Value,
    sea_query::{Alias, Expr, ExprTrait, Order, Query, SelectStatement},
};

use super::{Dialect, col};

/// The owners one statement or batch covers.
#[derive(Debug, Clone)]
pub(crate) enum OwnerRange {
    /// Owners in key order after `after` (`None`: from the first), up to
    /// and including `upto` (`None`: no bound), at most `limit` of them
    /// where the statement takes a limit.
    Keyset {
        after: Option<Value>,
        upto: Option<Value>,
        limit: u64,
    },
    /// Exactly these owners.
    In(Vec<Value>),
}

/// Keeps the owners of `range` (`owner` is the column that holds them).
pub(crate) fn restrict(select: &mut SelectStatement, owner: Expr, range: &OwnerRange) {
    if let Some(condition) = condition(owner, range) {
        select.and_where(condition);
    }
}

/// The condition of `range` on the column `owner`, if it has one.
pub(crate) fn condition(owner: Expr, range: &OwnerRange) -> Option<Expr> {
    match range {
        OwnerRange::Keyset { after, upto, .. } => {
            let after = after.clone().map(|a| owner.clone().gt(a));
            let upto = upto.clone().map(|u| owner.lte(u));
            match (after, upto) {
                (Some(a), Some(u)) => Some(a.and(u)),
                (a, u) => a.or(u),
            }
        }
        OwnerRange::In(owners) => Some(owner.is_in(owners.iter().cloned())),
    }
}

/// The owner of the `n`-th row after owner `after` in `table`'s primary-key
/// order (`NULL`, no row, when fewer are left):
///
/// ```sql
/// SELECT owner_id FROM t WHERE owner_id > ? ORDER BY owner_id LIMIT 1 OFFSET n-1
/// ```
///
/// An index walk of `n` entries on every backend. `(after, that owner]` is
/// the next batch of a table-wide pass: at least `n` rows, plus the rest of
/// the last owner's, so the pass is linear in the table's rows.
pub(crate) fn nth_row_owner(
    dialect: Dialect,
    table: &str,
    after: Option<Value>,
    n: u64,
) -> Statement {
    let mut select = Query::select();
    select
        .column(Alias::new(col::OWNER_ID))
        .from(Alias::new(table));
    if let Some(after) = after {
        select.and_where(Expr::col(Alias::new(col::OWNER_ID)).gt(after));
    }
    select
        .order_by(Alias::new(col::OWNER_ID), Order::Asc)
        .limit(1)
        .offset(n.saturating_sub(1));
    dialect.backend().build(&select)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nth_row_is_an_index_walk() {
        let pg = nth_row_owner(Dialect::Postgres, "c", Some(5i64.into()), 1000);
        assert_eq!(
            pg.sql,
            r#"SELECT "owner_id" FROM "c" WHERE "owner_id" > $1 ORDER BY "owner_id" ASC LIMIT $2 OFFSET $3"#
        );
    }
}
