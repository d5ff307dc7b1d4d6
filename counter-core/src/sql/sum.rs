//! The read: one grouped `SUM` per chunk of owners.

use sea_orm::{
    QueryResult, Statement, TryGetable, Value,
    sea_query::{Alias, Expr, ExprTrait, Query},
};

use super::{Dialect, col};
use crate::error::{CounterError, Result};

/// `SELECT owner_id, count_key, CAST(SUM(value) AS <text>) AS total FROM t
///  WHERE owner_id IN (..) [AND count_key IN (..)] GROUP BY owner_id, count_key`.
///
/// The total comes back as text and is parsed in Rust. A bare `SUM` is
/// NUMERIC on PostgreSQL and DECIMAL on MySQL (no `i64` decodes it), and
/// `CAST(.. AS SIGNED)` on MySQL clamps an out-of-range sum to `i64::MAX`
/// with only a warning; text keeps every digit, so an overflowing total is
/// reported as [`CounterError::Overflow`] on every backend instead.
/// (SQLite's integer `sum()` raises its own "integer overflow" error.)
pub(crate) fn sums(
    dialect: Dialect,
    table: &str,
    owners: Vec<Value>,
    keys: Option<Vec<String>>,
) -> Statement {
    let text = super::text_type(dialect);
    let mut select = Query::select();
    select
        .columns([col::OWNER_ID, col::COUNT_KEY].map(Alias::new))
        .expr_as(
            Expr::col(Alias::new(col::VALUE))
                .sum()
                .cast_as(Alias::new(text)),
            Alias::new(col::TOTAL),
        )
        .from(Alias::new(table))
        .and_where(Expr::col(Alias::new(col::OWNER_ID)).is_in(owners));
    if let Some(keys) = keys {
        select.and_where(Expr::col(Alias::new(col::COUNT_KEY)).is_in(keys));
    }
    select.group_by_columns([col::OWNER_ID, col::COUNT_KEY].map(Alias::new));
    dialect.backend().build(&select)
}

/// One row of [`sums`].
pub(crate) struct SumRow<I> {
    pub owner: I,
    pub key: String,
    pub total: i64,
}

impl<I: TryGetable + Clone + Into<Value>> SumRow<I> {
    pub(crate) fn decode(row: &QueryResult, table: &str) -> Result<Self> {
        let owner = row.try_get::<I>("", col::OWNER_ID)?;
        let key = row.try_get::<String>("", col::COUNT_KEY)?;
        let total = row.try_get::<String>("", col::TOTAL)?;
        let total = parse_total(&total, || total_context(&key, &owner.clone().into(), table))?;
        Ok(Self { owner, key, total })
    }
}

/// How an out-of-range total is named: its key, its owner, its table.
pub(crate) fn total_context(key: &str, owner: &Value, table: &str) -> String {
    format!(
        "the total of `{key}` of owner {} in `{table}`",
        crate::settle::owner_text(owner)
    )
}

/// Every slot row's value of `owners` (and `keys`): what a read sums in
/// Rust when the database's own sum overflowed (SQLite's `sum()` raises
/// for the whole query), to name the counter.
pub(crate) fn slot_values(
    dialect: Dialect,
    table: &str,
    owners: Vec<Value>,
    keys: Option<Vec<String>>,
) -> Statement {
    let mut select = Query::select();
    select
        .columns([col::OWNER_ID, col::COUNT_KEY, col::VALUE].map(Alias::new))
        .from(Alias::new(table))
        .and_where(Expr::col(Alias::new(col::OWNER_ID)).is_in(owners));
    if let Some(keys) = keys {
        select.and_where(Expr::col(Alias::new(col::COUNT_KEY)).is_in(keys));
    }
    dialect.backend().build(&select)
}

/// Parses a summed total, telling overflow apart from garbage.
pub(crate) fn parse_total(text: &str, context: impl FnOnce() -> String) -> Result<i64> {
    let text = text.trim();
    text.parse::<i64>().map_err(|_| {
        let numeric = text.strip_prefix('-').unwrap_or(text);
        if !numeric.is_empty() && numeric.bytes().all(|b| b.is_ascii_digit()) {
            CounterError::Overflow { context: context() }
        } else {
            CounterError::Database(sea_orm::DbErr::Type(format!(
                "counter total {text:?} is not an integer"
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_sum_per_backend() {
        let pg = sums(
            Dialect::Postgres,
            "c",
            vec![1i64.into(), 2i64.into()],
            Some(vec!["likes".into()]),
        );
        assert_eq!(
            pg.sql,
            r#"SELECT "owner_id", "count_key", CAST(SUM("value") AS TEXT) AS "total" FROM "c" WHERE "owner_id" IN ($1, $2) AND "count_key" IN ($3) GROUP BY "owner_id", "count_key""#
        );
        let my = sums(Dialect::MySql, "c", vec![1i64.into()], None);
        assert_eq!(
            my.sql,
            "SELECT `owner_id`, `count_key`, CAST(SUM(`value`) AS CHAR) AS `total` FROM `c` WHERE `owner_id` IN (?) GROUP BY `owner_id`, `count_key`"
        );
    }

    #[test]
    fn totals_overflow_is_typed() {
        assert_eq!(parse_total("-42", String::new).unwrap(), -42);
        assert_eq!(
            parse_total(&i64::MIN.to_string(), String::new).unwrap(),
            i64::MIN
        );
        let over = (i64::MAX as i128 + 1).to_string();
        assert!(matches!(
            parse_total(&over, String::new),
            Err(CounterError::Overflow { .. })
        ));
        assert!(matches!(
            parse_total("1.5", String::new),
            Err(CounterError::Database(_))
        ));
    }
}
