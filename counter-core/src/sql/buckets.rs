//! The statements of time buckets: range sums and pruning.

use sea_orm::{
    Statement, Value,
    sea_query::{Alias, Expr, ExprTrait, Query},
};

use super::{Dialect, OwnerRange, col, range::condition};

/// The sums of `key`'s buckets starting in `[from, to)` (Unix seconds), per
/// owner, or per owner and bucket for a series:
///
/// ```sql
/// SELECT owner_id, [bucket,] CAST(SUM(value) AS TEXT) AS total FROM t_buckets
/// WHERE owner_id IN (..) AND count_key = ? AND bucket >= ? AND bucket < ?
/// GROUP BY owner_id[, bucket]
/// ```
///
/// A range of the primary key `(owner_id, count_key, bucket, slot)` per
/// owner: the rows read are the buckets asked for, however old the counter.
pub(crate) fn bucket_sums(
    dialect: Dialect,
    table: &str,
    owners: Vec<Value>,
    key: &str,
    (from, to): (i64, i64),
    per_bucket: bool,
) -> Statement {
    let mut group = vec![Alias::new(col::OWNER_ID)];
    if per_bucket {
        group.push(Alias::new(col::BUCKET));
    }
    let bucket = || Expr::col(Alias::new(col::BUCKET));
    let mut select = Query::select();
    select
        .columns(group.clone())
        .expr_as(
            Expr::col(Alias::new(col::VALUE))
                .sum()
                .cast_as(Alias::new(super::text_type(dialect))),
            Alias::new(col::TOTAL),
        )
        .from(Alias::new(table))
        .and_where(Expr::col(Alias::new(col::OWNER_ID)).is_in(owners))
        .and_where(Expr::col(Alias::new(col::COUNT_KEY)).eq(key))
        .and_where(bucket().gte(from))
        .and_where(bucket().lt(to))
        .group_by_columns(group);
    dialect.backend().build(&select)
}

/// Deletes the buckets of `keys` starting at or before `last` for the
/// owners of `range`:
///
/// ```sql
/// DELETE FROM t_buckets WHERE owner_id > ? AND owner_id <= ? AND count_key IN (..) AND bucket <= ?
/// ```
pub(crate) fn prune_buckets(
    dialect: Dialect,
    table: &str,
    range: &OwnerRange,
    keys: Vec<String>,
    floor: Option<i64>,
    last: i64,
    slots: super::FoldSlots,
) -> Statement {
    let mut delete = Query::delete();
    delete.from_table(Alias::new(table));
    if let Some(owners) = condition(Expr::col(Alias::new(col::OWNER_ID)), range) {
        delete.and_where(owners);
    }
    delete
        .and_where(Expr::col(Alias::new(col::COUNT_KEY)).is_in(keys))
        .and_where(Expr::col(Alias::new(col::BUCKET)).lte(last));
    // Above `floor`, when rows below it are no buckets (a sketch table's
    // all-time sketches).
    if let Some(floor) = floor {
        delete.and_where(Expr::col(Alias::new(col::BUCKET)).gt(floor));
    }
    if let Some(share) = slots.condition() {
        delete.and_where(share);
    }
    dialect.backend().build(&delete)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_and_prune_statements() {
        let pg = bucket_sums(
            Dialect::Postgres,
            "c_buckets",
            vec![1i64.into()],
            "views",
            (0, 86_400),
            true,
        );
        assert_eq!(
            pg.sql,
            r#"SELECT "owner_id", "bucket", CAST(SUM("value") AS TEXT) AS "total" FROM "c_buckets" WHERE "owner_id" IN ($1) AND "count_key" = $2 AND "bucket" >= $3 AND "bucket" < $4 GROUP BY "owner_id", "bucket""#
        );
        let range = OwnerRange::Keyset {
            after: Some(1i64.into()),
            upto: Some(9i64.into()),
            limit: 0,
        };
        let my = prune_buckets(
            Dialect::MySql,
            "c_buckets",
            &range,
            vec!["views".into()],
            None,
            0,
            super::super::FoldSlots::ALL,
        );
        let kept = prune_buckets(
            Dialect::Sqlite,
            "c_sketches",
            &range,
            vec!["v".into()],
            Some(i64::MIN),
            0,
            super::super::FoldSlots::share(1, 2),
        )
        .to_string();
        assert!(
            kept.contains(&format!("\"bucket\" > {}", i64::MIN)),
            "all-time sketches stay: {kept}"
        );
        assert!(
            kept.ends_with(r#"AND "slot" % 2 = 1"#),
            "a region prunes its own slots: {kept}"
        );
        assert_eq!(
            my.sql,
            "DELETE FROM `c_buckets` WHERE `owner_id` > ? AND `owner_id` <= ? AND `count_key` IN (?) AND `bucket` <= ?"
        );
    }
}
