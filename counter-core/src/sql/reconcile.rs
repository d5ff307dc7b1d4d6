//! The statements of a recount: the snapshot of truth against stored
//! totals, and the lock that keeps two recounts of one counter apart.

use sea_orm::{
    Statement, Value,
    sea_query::{
        Alias, Asterisk, ColumnRef, CommonTableExpression, Expr, ExprTrait, Func, IntoColumnRef,
        IntoTableRef, Order, Query, SelectStatement, TableRef, UnionType, WithClause,
    },
};

use super::{Dialect, OwnerRange, col, order::exact_owner, range::restrict, text_type};
use crate::owner::OwnerColumn;

/// A recount's truth: the query, and where its owners can be listed in
/// order cheaply, if known.
#[derive(Debug, Clone)]
pub(crate) struct TruthSql {
    pub query: SelectStatement,
    pub owners: Option<OwnerIndex>,
}

/// A column holding a truth's owner ids, best with an index (the foreign
/// key a counter cache groups by).
#[derive(Debug, Clone)]
pub(crate) struct OwnerIndex {
    pub table: TableRef,
    pub column: ColumnRef,
}

const TRUTH: &str = "counter_truth";
const TRUTH_TOTAL: &str = "truth_total";
const CURRENT_TOTAL: &str = "current_total";

/// One statement, so one snapshot on every backend, comparing the truth
/// with the stored total of `key` for a range of owners:
///
/// ```sql
/// WITH counter_truth (owner_id, total) AS (<truth>)
/// SELECT owner_id, CAST(COALESCE(SUM(truth_total), 0) AS TEXT) AS truth_total,
///        CAST(COALESCE(SUM(current_total), 0) AS TEXT) AS current_total
/// FROM (SELECT exact(owner_id) AS owner_id, total AS truth_total, 0 AS current_total
///         FROM counter_truth WHERE owner_id IS NOT NULL AND <range on exact(owner_id)>
///       UNION ALL
///       SELECT owner_id, 0, value FROM <table> WHERE count_key = ? AND <range>) AS u
/// GROUP BY owner_id ORDER BY owner_id [LIMIT n]
/// ```
///
/// The `UNION ALL` stands in for a full outer join, which MySQL lacks: an
/// owner with slot rows but no children is found (truth 0), as is one with
/// children but no slot rows (current 0). `exact` is
/// [`exact_owner`]: both sides of the union, and so its grouping, ordering
/// and bounds, compare string owners in the companion table's collation.
pub(crate) fn snapshot(
    dialect: Dialect,
    column: OwnerColumn,
    table: &str,
    key: &str,
    truth: &TruthSql,
    range: &OwnerRange,
) -> Statement {
    let restrict = |select: &mut SelectStatement, owner: Expr| restrict(select, owner, range);
    let exact = |owner: Expr| exact_owner(dialect, column, owner);
    let owner = || Expr::col(Alias::new(col::OWNER_ID));
    // Where the owner column of the truth is known, the batch's range goes
    // into the truth query itself: MariaDB does not push it into a grouped
    // derived table when the bounds are bind parameters, and would group
    // every child row for every batch.
    let mut truth_query = truth.query.clone();
    if let Some(index) = &truth.owners {
        restrict(&mut truth_query, exact(Expr::col(index.column.clone())));
    }

    let mut union = Query::select();
    union
        .expr_as(exact(owner()), Alias::new(col::OWNER_ID))
        .expr_as(Expr::col(Alias::new("total")), Alias::new(TRUTH_TOTAL))
        .expr_as(Expr::val(0i64), Alias::new(CURRENT_TOTAL))
        .from(Alias::new(TRUTH))
        .and_where(owner().is_not_null());
    restrict(&mut union, exact(owner()));
    let mut stored = Query::select();
    stored
        .column(Alias::new(col::OWNER_ID))
        .expr(Expr::val(0i64))
        .column(Alias::new(col::VALUE))
        .from(Alias::new(table))
        .and_where(Expr::col(Alias::new(col::COUNT_KEY)).eq(key));
    restrict(&mut stored, owner());
    union.union(UnionType::All, stored);

    let summed = |column: &str| {
        Expr::expr(Func::coalesce([
            Expr::col(Alias::new(column)).sum(),
            Expr::val(0i64),
        ]))
        .cast_as(Alias::new(text_type(dialect)))
    };
    let mut outer = Query::select();
    outer
        .column(Alias::new(col::OWNER_ID))
        .expr_as(summed(TRUTH_TOTAL), Alias::new(TRUTH_TOTAL))
        .expr_as(summed(CURRENT_TOTAL), Alias::new(CURRENT_TOTAL))
        .from_subquery(union, Alias::new("u"))
        .group_by_col(Alias::new(col::OWNER_ID))
        .order_by(Alias::new(col::OWNER_ID), Order::Asc);
    if let OwnerRange::Keyset { limit, .. } = range {
        outer.limit(*limit);
    }
    dialect.backend().build(&outer.with(truth_cte(truth_query)))
}

/// `WITH counter_truth (owner_id, total) AS (<truth>)`: the truth's first
/// two columns, whatever their names.
fn truth_cte(truth: SelectStatement) -> WithClause {
    let cte = CommonTableExpression::new()
        .query(truth)
        .columns([Alias::new(col::OWNER_ID), Alias::new("total")])
        .table_name(Alias::new(TRUTH))
        .to_owned();
    WithClause::new().cte(cte).to_owned()
}

/// The `n`-th owner after `after` on each side of a recount, the truth's
/// and the stored counters', each `NULL` when that side has fewer:
///
/// ```sql
/// WITH counter_truth (owner_id, total) AS (<truth>)
/// SELECT exact(owner_id) AS owner_id FROM counter_truth WHERE exact(owner_id) > ? ORDER BY owner_id LIMIT 1 OFFSET n-1;
/// SELECT DISTINCT owner_id FROM <table> WHERE count_key = ? AND owner_id > ? ORDER BY owner_id LIMIT 1 OFFSET n-1
/// ```
///
/// (`exact` as in [`snapshot`]: both sides walk in one order.)
///
/// The smaller one bounds the next snapshot (`owner_id <= bound`), so each
/// batch reads its own stretch of both tables instead of everything after
/// `after`: a recount is linear in the owners, not quadratic. (It need not
/// be read in the snapshot: any bound splits the owners into batches that
/// together cover every one of them.)
pub(crate) fn nth_owners(
    dialect: Dialect,
    column: OwnerColumn,
    table: &str,
    key: &str,
    truth: &TruthSql,
    after: Option<Value>,
    n: u64,
) -> [Statement; 2] {
    let after = OwnerRange::Keyset {
        after,
        upto: None,
        limit: n,
    };
    let exact = |owner: Expr| exact_owner(dialect, column, owner);
    let nth = |select: &mut SelectStatement, owner: Expr| {
        restrict(select, owner, &after);
        select
            .order_by(Alias::new(col::OWNER_ID), Order::Asc)
            .limit(1)
            .offset(n.saturating_sub(1));
    };
    let from_truth = match &truth.owners {
        // `SELECT DISTINCT fk AS owner_id FROM child WHERE fk > ? ORDER BY ..`:
        // an index walk on every backend (for string owners, where the
        // column's collation is the exact one `exact_owner` compares in).
        Some(index) => {
            let mut select = Query::select();
            select
                .distinct()
                .expr_as(
                    exact(Expr::col(index.column.clone())),
                    Alias::new(col::OWNER_ID),
                )
                .from(index.table.clone())
                .and_where(Expr::col(index.column.clone()).is_not_null());
            nth(&mut select, exact(Expr::col(index.column.clone())));
            dialect.backend().build(&select)
        }
        // Through the truth query: PostgreSQL pushes the bound into it;
        // MySQL and SQLite compute the whole grouped query per batch.
        None => {
            let mut select = Query::select();
            select
                .expr_as(
                    exact(Expr::col(Alias::new(col::OWNER_ID))),
                    Alias::new(col::OWNER_ID),
                )
                .from(Alias::new(TRUTH))
                .and_where(Expr::col(Alias::new(col::OWNER_ID)).is_not_null());
            nth(&mut select, exact(Expr::col(Alias::new(col::OWNER_ID))));
            dialect
                .backend()
                .build(&select.with(truth_cte(truth.query.clone())))
        }
    };
    let mut stored = Query::select();
    stored
        .distinct()
        .column(Alias::new(col::OWNER_ID))
        .from(Alias::new(table))
        .and_where(Expr::col(Alias::new(col::COUNT_KEY)).eq(key));
    nth(&mut stored, Expr::col(Alias::new(col::OWNER_ID)));
    [from_truth, dialect.backend().build(&stored)]
}

/// The column names [`snapshot`] returns the two totals under.
pub(crate) const SNAPSHOT_TOTALS: [&str; 2] = [TRUTH_TOTAL, CURRENT_TOTAL];

/// The true counts of a declared counter cache:
/// `SELECT exact(via), COUNT(*) | SUM(sum) FROM child WHERE via IS NOT NULL
/// [AND when = b] GROUP BY exact(via)`, grouped in the companion table's
/// collation (see [`exact_owner`]): `abc` and `ABC` are two owners even
/// where the child's column compares them as one.
pub(crate) fn cache_truth<T, C>(
    dialect: Dialect,
    column: OwnerColumn,
    child: T,
    via: C,
    sum: Option<C>,
    when: Option<(C, bool)>,
) -> TruthSql
where
    T: IntoTableRef,
    C: IntoColumnRef + Clone,
{
    let child = child.into_table_ref();
    let owner = exact_owner(dialect, column, Expr::col(via.clone()));
    let mut select = Query::select();
    select.expr(owner.clone());
    match sum {
        Some(amount) => select.expr(Expr::col(amount).sum()),
        None => select.expr(Expr::col(Asterisk).count()),
    };
    select
        .from(child.clone())
        .and_where(Expr::col(via.clone()).is_not_null());
    if let Some((flag, expected)) = when {
        select.and_where(Expr::col(flag).eq(expected));
    }
    select.add_group_by([owner]);
    TruthSql {
        query: select,
        owners: Some(OwnerIndex {
            table: child,
            column: via.into_column_ref(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_is_one_statement_per_backend() {
        let truth = cache_truth(
            Dialect::Postgres,
            OwnerColumn::BigInteger,
            Alias::new("comments"),
            Alias::new("post_id"),
            None,
            Some((Alias::new("published"), true)),
        );
        let [by_index, stored] = nth_owners(
            Dialect::MySql,
            OwnerColumn::BigInteger,
            "c",
            "k",
            &truth,
            Some(7i64.into()),
            100,
        );
        assert_eq!(
            by_index.sql,
            "SELECT DISTINCT `post_id` AS `owner_id` FROM `comments` WHERE `post_id` IS NOT NULL AND `post_id` > ? ORDER BY `owner_id` ASC LIMIT ? OFFSET ?"
        );
        assert!(
            stored
                .sql
                .starts_with("SELECT DISTINCT `owner_id` FROM `c`"),
            "{}",
            stored.sql
        );
        let pg = snapshot(
            Dialect::Postgres,
            OwnerColumn::BigInteger,
            "post_counters",
            "comments",
            &truth,
            &OwnerRange::Keyset {
                after: Some(5i64.into()),
                upto: None,
                limit: 100,
            },
        );
        assert_eq!(
            pg.sql,
            r#"WITH "counter_truth" ("owner_id", "total") AS (SELECT "post_id", COUNT(*) FROM "comments" WHERE "post_id" IS NOT NULL AND "published" = $1 AND "post_id" > $2 GROUP BY "post_id") SELECT "owner_id", CAST(COALESCE(SUM("truth_total"), $3) AS TEXT) AS "truth_total", CAST(COALESCE(SUM("current_total"), $4) AS TEXT) AS "current_total" FROM (SELECT "owner_id" AS "owner_id", "total" AS "truth_total", $5 AS "current_total" FROM "counter_truth" WHERE "owner_id" IS NOT NULL AND "owner_id" > $6 UNION ALL (SELECT "owner_id", $7, "value" FROM "post_counters" WHERE "count_key" = $8 AND "owner_id" > $9)) AS "u" GROUP BY "owner_id" ORDER BY "owner_id" ASC LIMIT $10"#
        );
        let my = snapshot(
            Dialect::MySql,
            OwnerColumn::BigInteger,
            "c",
            "k",
            &truth,
            &OwnerRange::In(vec![1i64.into()]),
        );
        assert!(
            my.sql
                .starts_with("WITH `counter_truth` (`owner_id`, `total`) AS"),
            "{}",
            my.sql
        );
        assert!(my.sql.contains("AS CHAR"), "{}", my.sql);
        assert!(!my.sql.contains("LIMIT"), "{}", my.sql);
    }
}
