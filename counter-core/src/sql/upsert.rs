//! The increment: an upsert of one slot row, or of many in one statement.

use sea_orm::{
    Statement, Value,
    sea_query::{Alias, Expr, ExprTrait, OnConflict, Query},
};

use super::{Dialect, NEW_ROWS, col, quote};

/// One slot row to add to: `(owner_id, count_key, slot) += delta`.
#[derive(Debug, Clone)]
pub(crate) struct UpsertRow {
    pub owner: Value,
    pub key: String,
    pub slot: i16,
    pub delta: i64,
}

/// `INSERT .. VALUES (o, k, s, d) ON CONFLICT .. DO UPDATE SET value = t.value + d`,
/// with `d` bound twice so one builder serves all three backends (MySQL's
/// `VALUES()` is deprecated and there is no portable `excluded`).
pub(crate) fn add_one(dialect: Dialect, table: &str, row: UpsertRow) -> Statement {
    let delta = row.delta;
    let new_value = match dialect {
        Dialect::Sqlite => Expr::cust_with_values(sqlite_checked_add(table, "?"), [delta]),
        Dialect::Postgres | Dialect::MySql => old_value(table).add(delta),
    };
    let mut insert = Query::insert();
    insert
        .into_table(Alias::new(table))
        .columns(columns())
        .values_panic(row_exprs(row))
        .on_conflict(
            OnConflict::columns(key_columns())
                .value(Alias::new(col::VALUE), new_value)
                .to_owned(),
        );
    dialect.backend().build(&insert)
}

/// One statement adding to many slot rows. The caller folds duplicates and
/// sorts by primary key first: PostgreSQL refuses to touch a row twice in one
/// statement, and a fixed order keeps concurrent batches from deadlocking.
pub(crate) fn add_rows(dialect: Dialect, table: &str, rows: Vec<UpsertRow>) -> Statement {
    match dialect {
        Dialect::MySql => mysql_add_rows(table, rows),
        Dialect::Sqlite | Dialect::Postgres => {
            let excluded = format!(
                "{}.{}",
                quote(dialect, NEW_ROWS),
                quote(dialect, col::VALUE)
            );
            let new_value = if dialect == Dialect::Sqlite {
                Expr::cust(sqlite_checked_add(table, &excluded))
            } else {
                old_value(table).add(Expr::cust(excluded))
            };
            let mut insert = Query::insert();
            insert.into_table(Alias::new(table)).columns(columns());
            for row in rows {
                insert.values_panic(row_exprs(row));
            }
            insert.on_conflict(
                OnConflict::columns(key_columns())
                    .value(Alias::new(col::VALUE), new_value)
                    .to_owned(),
            );
            dialect.backend().build(&insert)
        }
    }
}

/// MySQL/MariaDB: the new rows come from a derived table, so the update can
/// name them (`excluded.value`, as on the other backends) without the deprecated `VALUES()` function; MariaDB
/// rejects MySQL 8's `AS new` row alias, and this form works on both.
fn mysql_add_rows(table: &str, rows: Vec<UpsertRow>) -> Statement {
    let t = quote(Dialect::MySql, table);
    let new = quote(Dialect::MySql, NEW_ROWS);
    let [o, k, s, v] =
        [col::OWNER_ID, col::COUNT_KEY, col::SLOT, col::VALUE].map(|c| quote(Dialect::MySql, c));
    let mut sql = format!("INSERT INTO {t} ({o}, {k}, {s}, {v}) SELECT * FROM (");
    let mut values = Vec::with_capacity(rows.len() * 4);
    for (i, row) in rows.into_iter().enumerate() {
        if i == 0 {
            sql.push_str(&format!("SELECT ? AS {o}, ? AS {k}, ? AS {s}, ? AS {v}"));
        } else {
            sql.push_str(" UNION ALL SELECT ?, ?, ?, ?");
        }
        values.extend(row_values(row));
    }
    sql.push_str(&format!(
        ") AS {new} ON DUPLICATE KEY UPDATE {v} = {t}.{v} + {new}.{v}"
    ));
    Statement::from_sql_and_values(Dialect::MySql.backend(), sql, values)
}

/// SQLite turns an overflowing integer `+` into a REAL, silently. `sum()`
/// raises "integer overflow" instead, so the new value is summed with it.
fn sqlite_checked_add(table: &str, addend: &str) -> String {
    let old = format!(
        "{}.{}",
        quote(Dialect::Sqlite, table),
        quote(Dialect::Sqlite, col::VALUE)
    );
    format!("(SELECT sum(v) FROM (SELECT {old} AS v UNION ALL SELECT {addend}))")
}

fn old_value(table: &str) -> Expr {
    // Table-qualified: PostgreSQL rejects a bare `value` as ambiguous.
    Expr::col((Alias::new(table), Alias::new(col::VALUE)))
}

fn columns() -> [Alias; 4] {
    [col::OWNER_ID, col::COUNT_KEY, col::SLOT, col::VALUE].map(Alias::new)
}

fn key_columns() -> [Alias; 3] {
    [col::OWNER_ID, col::COUNT_KEY, col::SLOT].map(Alias::new)
}

fn row_values(row: UpsertRow) -> [Value; 4] {
    [row.owner, row.key.into(), row.slot.into(), row.delta.into()]
}

/// Four values for the four `columns()`: both are arrays of length 4, so
/// sea-query's `values_panic` arity check cannot fail.
fn row_exprs(row: UpsertRow) -> [Expr; 4] {
    row_values(row).map(Expr::val)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(owner: i64, delta: i64) -> UpsertRow {
        UpsertRow {
            owner: owner.into(),
            key: "likes".into(),
            slot: 3,
            delta,
        }
    }

    #[test]
    fn single_upsert_per_backend() {
        let pg = add_one(Dialect::Postgres, "post_counters", row(1, 5));
        assert_eq!(
            pg.sql,
            r#"INSERT INTO "post_counters" ("owner_id", "count_key", "slot", "value") VALUES ($1, $2, $3, $4) ON CONFLICT ("owner_id", "count_key", "slot") DO UPDATE SET "value" = "post_counters"."value" + $5"#
        );
        let my = add_one(Dialect::MySql, "post_counters", row(1, 5));
        assert_eq!(
            my.sql,
            "INSERT INTO `post_counters` (`owner_id`, `count_key`, `slot`, `value`) VALUES (?, ?, ?, ?) ON DUPLICATE KEY UPDATE `value` = `post_counters`.`value` + ?"
        );
        let lite = add_one(Dialect::Sqlite, "post_counters", row(1, 5));
        assert!(lite.sql.ends_with(r#"DO UPDATE SET "value" = (SELECT sum(v) FROM (SELECT "post_counters"."value" AS v UNION ALL SELECT ?))"#), "{}", lite.sql);
        assert_eq!(lite.values.unwrap().0.len(), 5);
    }

    #[test]
    fn multi_row_upsert_per_backend() {
        let pg = add_rows(Dialect::Postgres, "c", vec![row(1, 1), row(2, 2)]);
        assert!(
            pg.sql
                .ends_with(r#"DO UPDATE SET "value" = "c"."value" + ("excluded"."value")"#),
            "{}",
            pg.sql
        );
        assert_eq!(pg.values.unwrap().0.len(), 8);
        let my = add_rows(Dialect::MySql, "c", vec![row(1, 1), row(2, 2)]);
        assert_eq!(
            my.sql,
            "INSERT INTO `c` (`owner_id`, `count_key`, `slot`, `value`) SELECT * FROM (SELECT ? AS `owner_id`, ? AS `count_key`, ? AS `slot`, ? AS `value` UNION ALL SELECT ?, ?, ?, ?) AS `excluded` ON DUPLICATE KEY UPDATE `value` = `c`.`value` + `excluded`.`value`"
        );
        let lite = add_rows(Dialect::Sqlite, "c", vec![row(1, 1)]);
        assert!(
            lite.sql.contains(r#"UNION ALL SELECT "excluded"."value""#),
            "{}",
            lite.sql
        );
    }
}
