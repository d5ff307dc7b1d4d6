//! Owners ranked by one counter's total.

use sea_orm::{
    Statement, Value,
    sea_query::{Alias, Expr, ExprTrait, Order, Query},
};

use super::{Dialect, col};

/// One page of owners by `key`'s total, highest first, ties by owner id:
///
/// ```sql
/// SELECT owner_id, CAST(SUM(value) AS TEXT) AS total FROM t
/// WHERE count_key = ? GROUP BY owner_id
/// [HAVING SUM(value) < ? OR (SUM(value) = ? AND owner_id > ?)]
/// ORDER BY SUM(value) DESC, owner_id ASC LIMIT ?
/// ```
///
/// The key index `(count_key, owner_id)` hands the rows of `key` over in
/// owner order, so they are summed as they stream by and only `limit`
/// totals are kept for the sort: the cost is one pass over that key's slot
/// rows (no other key's), in memory bounded by the page. The `HAVING` is
/// the keyset cursor of the next page: after `(total, owner)`.
pub(crate) fn ranked(
    dialect: Dialect,
    table: &str,
    key: &str,
    after: Option<(i64, Value)>,
    limit: u64,
) -> Statement {
    let sum = || Expr::col(Alias::new(col::VALUE)).sum();
    let owner = || Expr::col(Alias::new(col::OWNER_ID));
    let mut select = Query::select();
    select
        .column(Alias::new(col::OWNER_ID))
        .expr_as(
            sum().cast_as(Alias::new(super::text_type(dialect))),
            Alias::new(col::TOTAL),
        )
        .from(Alias::new(table))
        .and_where(Expr::col(Alias::new(col::COUNT_KEY)).eq(key))
        .group_by_col(Alias::new(col::OWNER_ID));
    if let Some((total, last)) = after {
        select.and_having(sum().lt(total).or(sum().eq(total).and(owner().gt(last))));
    }
    select
        .order_by_expr(sum(), Order::Desc)
        .order_by(Alias::new(col::OWNER_ID), Order::Asc)
        .limit(limit);
    dialect.backend().build(&select)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranking_statement() {
        let pg = ranked(Dialect::Postgres, "c", "likes", Some((5, 9i64.into())), 10);
        assert_eq!(
            pg.sql,
            r#"SELECT "owner_id", CAST(SUM("value") AS TEXT) AS "total" FROM "c" WHERE "count_key" = $1 GROUP BY "owner_id" HAVING SUM("value") < $2 OR (SUM("value") = $3 AND "owner_id" > $4) ORDER BY SUM("value") DESC, "owner_id" ASC LIMIT $5"#
        );
    }
}
