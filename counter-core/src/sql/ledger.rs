//! The flush ledger: one row per write-behind buffer, holding the sequence
//! number of the last flush it committed.
//!
//! A flush claims its number with a compare-and-set `UPDATE` in its own
//! transaction, so the claim commits with the counter rows or not at all,
//! and a second attempt of a flush that did commit finds its number taken.
//!
//! `updated_at` is the database's clock, written and compared in SQL: a
//! process whose clock is behind cannot make another prune a row that is
//! still in use.

use sea_orm::{
    Statement, Value,
    sea_query::{Alias, ColumnDef, Expr, ExprTrait, Query, SimpleExpr, Table},
};

use super::Dialect;

const WRITER_ID: &str = "writer_id";
const LAST_FLUSH: &str = "last_flush";
const UPDATED_AT: &str = "updated_at";

/// The database's current time in Unix seconds.
fn db_now(dialect: Dialect) -> SimpleExpr {
    Expr::cust(match dialect {
        Dialect::Postgres => "CAST(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) AS BIGINT)",
        Dialect::MySql => "UNIX_TIMESTAMP()",
        Dialect::Sqlite => "CAST(strftime('%s', 'now') AS INTEGER)",
    })
}

/// `CREATE TABLE IF NOT EXISTS <ledger> (writer_id VARCHAR(64) PRIMARY KEY,
/// last_flush BIGINT, updated_at BIGINT)`. `updated_at` is Unix seconds, so
/// pruning compares integers on every backend.
pub(crate) fn create_ledger(dialect: Dialect, ledger: &str) -> Statement {
    let create = Table::create()
        .table(Alias::new(ledger))
        .if_not_exists()
        .col(
            ColumnDef::new(Alias::new(WRITER_ID))
                .string_len(64)
                .not_null()
                .primary_key(),
        )
        .col(
            ColumnDef::new(Alias::new(LAST_FLUSH))
                .big_integer()
                .not_null(),
        )
        .col(
            ColumnDef::new(Alias::new(UPDATED_AT))
                .big_integer()
                .not_null(),
        )
        .to_owned();
    dialect.backend().build(&create)
}

/// `DROP TABLE IF EXISTS <ledger>`.
pub(crate) fn drop_ledger(dialect: Dialect, ledger: &str) -> Statement {
    let drop = Table::drop()
        .table(Alias::new(ledger))
        .if_exists()
        .to_owned();
    dialect.backend().build(&drop)
}

/// `UPDATE <ledger> SET last_flush = seq, updated_at = <now> WHERE writer_id =
/// ? AND last_flush < seq`: one row affected if flush `seq` is new, none if
/// it committed already (or the writer has no row yet).
pub(crate) fn claim(dialect: Dialect, ledger: &str, writer: &str, seq: i64) -> Statement {
    let update = Query::update()
        .table(Alias::new(ledger))
        .value(Alias::new(LAST_FLUSH), seq)
        .value(Alias::new(UPDATED_AT), db_now(dialect))
        .and_where(Expr::col(Alias::new(WRITER_ID)).eq(writer))
        .and_where(Expr::col(Alias::new(LAST_FLUSH)).lt(seq))
        .to_owned();
    dialect.backend().build(&update)
}

/// `SELECT last_flush FROM <ledger> WHERE writer_id = ?`.
pub(crate) fn last_flush(dialect: Dialect, ledger: &str, writer: &str) -> Statement {
    let select = Query::select()
        .column(Alias::new(LAST_FLUSH))
        .from(Alias::new(ledger))
        .and_where(Expr::col(Alias::new(WRITER_ID)).eq(writer))
        .to_owned();
    dialect.backend().build(&select)
}

/// The column [`last_flush`] returns.
pub(crate) const LAST_FLUSH_COLUMN: &str = LAST_FLUSH;

/// `INSERT INTO <ledger> VALUES (writer, seq, <now>)`: a writer's first flush.
pub(crate) fn register(dialect: Dialect, ledger: &str, writer: &str, seq: i64) -> Statement {
    let insert = Query::insert()
        .into_table(Alias::new(ledger))
        .columns([WRITER_ID, LAST_FLUSH, UPDATED_AT].map(Alias::new))
        .values_panic([
            Value::from(writer).into(),
            Value::from(seq).into(),
            db_now(dialect),
        ])
        .to_owned();
    dialect.backend().build(&insert)
}

/// `DELETE FROM <ledger> WHERE updated_at < <now> - retention AND writer_id
/// <> keep`: the rows of writers that have not flushed for `retention`
/// seconds (stopped or crashed processes), never the caller's own.
pub(crate) fn prune(dialect: Dialect, ledger: &str, retention: i64, keep: &str) -> Statement {
    let delete = Query::delete()
        .from_table(Alias::new(ledger))
        .and_where(Expr::col(Alias::new(UPDATED_AT)).lt(db_now(dialect).sub(retention)))
        .and_where(Expr::col(Alias::new(WRITER_ID)).ne(keep))
        .to_owned();
    dialect.backend().build(&delete)
}

/// `DELETE FROM <ledger> WHERE writer_id = ?`: a writer that stopped cleanly
/// has no flush left to resolve.
pub(crate) fn forget(dialect: Dialect, ledger: &str, writer: &str) -> Statement {
    let delete = Query::delete()
        .from_table(Alias::new(ledger))
        .and_where(Expr::col(Alias::new(WRITER_ID)).eq(writer))
        .to_owned();
    dialect.backend().build(&delete)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_claim_is_a_compare_and_set() {
        let pg = claim(Dialect::Postgres, "ledger", "w", 7);
        assert_eq!(
            pg.sql,
            r#"UPDATE "ledger" SET "last_flush" = $1, "updated_at" = CAST(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) AS BIGINT) WHERE "writer_id" = $2 AND "last_flush" < $3"#
        );
        let my = claim(Dialect::MySql, "ledger", "w", 7);
        assert_eq!(
            my.sql,
            "UPDATE `ledger` SET `last_flush` = ?, `updated_at` = UNIX_TIMESTAMP() WHERE `writer_id` = ? AND `last_flush` < ?"
        );
    }

    #[test]
    fn pruning_keeps_the_callers_row() {
        let lite = prune(Dialect::Sqlite, "ledger", 5, "me");
        assert_eq!(
            lite.sql,
            r#"DELETE FROM "ledger" WHERE "updated_at" < (CAST(strftime('%s', 'now') AS INTEGER)) - ? AND "writer_id" <> ?"#
        );
    }
}
