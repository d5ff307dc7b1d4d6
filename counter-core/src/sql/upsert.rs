//! The increment: an upsert of one slot row, or of many in one statement.

use sea_orm::{
    Statement, Value,
    sea_query::{Alias, Expr, ExprTrait, OnConflict, Query},
};

use super::{Dialect, Layout, NEW_ROWS, col, quote};

/// One slot row to add to: `(owner_id, count_key, [bucket,] slot) += delta`.
/// Rows of one statement are all of one table, so all have a bucket or none.
#[derive(Debug, Clone)]
pub(crate) struct UpsertRow {
    pub owner: Value,
    pub key: String,
    /// The bucket start, for a row of a bucket table.
    pub bucket: Option<i64>,
    pub slot: i16,
    pub delta: i64,
}

impl UpsertRow {
    fn layout(&self) -> Layout {
        match self.bucket {
            Some(_) => Layout::Buckets,
            None => Layout::Totals,
        }
    }
}

/// `INSERT .. VALUES (o, k, s, d) ON CONFLICT .. DO UPDATE SET value = t.value + d`,
/// with `d` bound twice so one builder serves all three backends (MySQL's
/// `VALUES()` is deprecated and there is no portable `excluded`).
pub(crate) fn add_one(dialect: Dialect, table: &str, row: UpsertRow) -> Statement {
    let delta = row.delta;
    let layout = row.layout();
    let new_value = match dialect {
        Dialect::Sqlite => Expr::cust_with_values(sqlite_checked_add(table, "?"), [delta]),
        Dialect::Postgres | Dialect::MySql => old_value(table).add(delta),
    };
    let mut insert = Query::insert();
    insert
        .into_table(Alias::new(table))
        .columns(columns(layout))
        .values_panic(row_exprs(row))
        .on_conflict(
            OnConflict::columns(key_columns(layout))
                .value(Alias::new(col::VALUE), new_value)
                .to_owned(),
        );
    dialect.backend().build(&insert)
}

/// One statement adding to many slot rows. The caller folds duplicates and
/// sorts by primary key first: PostgreSQL refuses to touch a row twice in one
/// statement, and a fixed order keeps concurrent batches from deadlocking.
pub(crate) fn add_rows(dialect: Dialect, table: &str, rows: Vec<UpsertRow>) -> Statement {
    let layout = rows.first().map_or(Layout::Totals, UpsertRow::layout);
    debug_assert!(rows.iter().all(|r| r.layout() == layout));
    if dialect == Dialect::Postgres
        && let Some(statement) = postgres_unnest_rows(table, layout, &rows)
    {
        return statement;
    }
    match dialect {
        Dialect::MySql => mysql_add_rows(table, layout, rows),
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
            insert
                .into_table(Alias::new(table))
                .columns(columns(layout));
            for row in rows {
                insert.values_panic(row_exprs(row));
            }
            insert.on_conflict(
                OnConflict::columns(key_columns(layout))
                    .value(Alias::new(col::VALUE), new_value)
                    .to_owned(),
            );
            dialect.backend().build(&insert)
        }
    }
}

/// PostgreSQL, owners that are numbers or UUIDs: the rows as one
/// comma-separated text per column, unnested in order. The statement's
/// text depends only on the table, so sqlx prepares it once per connection
/// and each batch sends one small `Bind`: a multi-row `VALUES` changes text
/// with every row count and is parsed again each time, and (sqlx 0.9 leaves
/// Nagle's algorithm on) a large statement can wait out a delayed ACK, 40 ms
/// on loopback (measured by mq-bench: 7,600 vs 30,000+ messages a second).
/// `None` for string owners, which may contain commas: they take `VALUES`.
/// Keys never contain a comma (`validate_key`).
fn postgres_unnest_rows(table: &str, layout: Layout, rows: &[UpsertRow]) -> Option<Statement> {
    let owner_type = match rows.first()?.owner {
        Value::Int(_) => "integer",
        Value::BigInt(_) => "bigint",
        Value::Uuid(_) => "uuid",
        _ => return None,
    };
    let mut owners = String::with_capacity(rows.len() * 8);
    let mut keys = String::with_capacity(rows.len() * 8);
    let mut buckets = String::new();
    let mut slots = String::with_capacity(rows.len() * 3);
    let mut deltas = String::with_capacity(rows.len() * 3);
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            for column in [&mut owners, &mut keys, &mut slots, &mut deltas] {
                column.push(',');
            }
            if layout == Layout::Buckets {
                buckets.push(',');
            }
        }
        match &row.owner {
            Value::Int(Some(v)) => owners.push_str(&v.to_string()),
            Value::BigInt(Some(v)) => owners.push_str(&v.to_string()),
            Value::Uuid(Some(v)) => owners.push_str(&v.to_string()),
            _ => return None,
        }
        keys.push_str(&row.key);
        if let Some(bucket) = row.bucket {
            buckets.push_str(&bucket.to_string());
        }
        slots.push_str(&row.slot.to_string());
        deltas.push_str(&row.delta.to_string());
    }
    let q = |name: &str| quote(Dialect::Postgres, name);
    let names: Vec<String> = column_names(layout).map(q).collect();
    let mut arrays = vec![
        format!("string_to_array($1, ',')::{owner_type}[]"),
        "string_to_array($2, ',')".to_owned(),
    ];
    let mut values: Vec<Value> = vec![owners.into(), keys.into()];
    if layout == Layout::Buckets {
        arrays.push("string_to_array($3, ',')::bigint[]".to_owned());
        values.push(buckets.into());
    }
    let n = values.len();
    arrays.push(format!("string_to_array(${}, ',')::smallint[]", n + 1));
    arrays.push(format!("string_to_array(${}, ',')::bigint[]", n + 2));
    values.extend([slots.into(), deltas.into()]);
    let keys: Vec<String> = layout.primary_key().iter().map(|c| q(c)).collect();
    let (t, v) = (q(table), q(col::VALUE));
    let sql = format!(
        "INSERT INTO {t} ({names}) SELECT {names} FROM unnest({arrays}) WITH ORDINALITY \
         AS {new} ({names}, row_order) ORDER BY row_order \
         ON CONFLICT ({keys}) DO UPDATE SET {v} = {t}.{v} + {excluded}.{v}",
        names = names.join(", "),
        arrays = arrays.join(", "),
        new = q("new_rows"),
        keys = keys.join(", "),
        excluded = q(NEW_ROWS),
    );
    Some(Statement::from_sql_and_values(
        Dialect::Postgres.backend(),
        sql,
        values,
    ))
}

/// MySQL/MariaDB: the new rows come from a derived table, so the update can
/// name them (`excluded.value`, as on the other backends) without the deprecated `VALUES()` function; MariaDB
/// rejects MySQL 8's `AS new` row alias, and this form works on both.
fn mysql_add_rows(table: &str, layout: Layout, rows: Vec<UpsertRow>) -> Statement {
    let t = quote(Dialect::MySql, table);
    let new = quote(Dialect::MySql, NEW_ROWS);
    let names: Vec<String> = column_names(layout)
        .map(|c| quote(Dialect::MySql, c))
        .collect();
    let v = quote(Dialect::MySql, col::VALUE);
    let mut sql = format!("INSERT INTO {t} ({}) SELECT * FROM (", names.join(", "));
    let first: Vec<String> = names.iter().map(|n| format!("? AS {n}")).collect();
    let rest = vec!["?"; names.len()].join(", ");
    let mut values = Vec::with_capacity(rows.len() * names.len());
    for (i, row) in rows.into_iter().enumerate() {
        if i == 0 {
            sql.push_str(&format!("SELECT {}", first.join(", ")));
        } else {
            sql.push_str(&format!(" UNION ALL SELECT {rest}"));
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

/// The inserted columns: the primary key, then `value`.
fn column_names(layout: Layout) -> impl Iterator<Item = &'static str> {
    layout.primary_key().iter().copied().chain([col::VALUE])
}

fn columns(layout: Layout) -> Vec<Alias> {
    column_names(layout).map(Alias::new).collect()
}

fn key_columns(layout: Layout) -> Vec<Alias> {
    layout
        .primary_key()
        .iter()
        .map(|c| Alias::new(*c))
        .collect()
}

/// The values of `column_names(row.layout())`, in that order.
fn row_values(row: UpsertRow) -> Vec<Value> {
    let mut values = vec![row.owner, row.key.into()];
    if let Some(bucket) = row.bucket {
        values.push(bucket.into());
    }
    values.extend([row.slot.into(), row.delta.into()]);
    values
}

/// One value per column of `columns(row.layout())`, so sea-query's
/// `values_panic` arity check cannot fail.
fn row_exprs(row: UpsertRow) -> Vec<Expr> {
    row_values(row).into_iter().map(Expr::val).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(owner: i64, delta: i64) -> UpsertRow {
        UpsertRow {
            owner: owner.into(),
            key: "likes".into(),
            bucket: None,
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
        assert_eq!(
            pg.sql,
            r#"INSERT INTO "c" ("owner_id", "count_key", "slot", "value") SELECT "owner_id", "count_key", "slot", "value" FROM unnest(string_to_array($1, ',')::bigint[], string_to_array($2, ','), string_to_array($3, ',')::smallint[], string_to_array($4, ',')::bigint[]) WITH ORDINALITY AS "new_rows" ("owner_id", "count_key", "slot", "value", row_order) ORDER BY row_order ON CONFLICT ("owner_id", "count_key", "slot") DO UPDATE SET "value" = "c"."value" + "excluded"."value""#
        );
        assert_eq!(pg.values.unwrap().0.len(), 4);
        let strings = UpsertRow {
            owner: Value::from("a,b"),
            ..row(1, 1)
        };
        let pg = add_rows(Dialect::Postgres, "c", vec![strings]);
        assert!(
            pg.sql
                .ends_with(r#"DO UPDATE SET "value" = "c"."value" + ("excluded"."value")"#),
            "{}",
            pg.sql
        );
        assert_eq!(pg.values.unwrap().0.len(), 4);
        let my = add_rows(Dialect::MySql, "c", vec![row(1, 1), row(2, 2)]);
        assert_eq!(
            my.sql,
            "INSERT INTO `c` (`owner_id`, `count_key`, `slot`, `value`) SELECT * FROM (SELECT ? AS `owner_id`, ? AS `count_key`, ? AS `slot`, ? AS `value` UNION ALL SELECT ?, ?, ?, ?) AS `excluded` ON DUPLICATE KEY UPDATE `value` = `c`.`value` + `excluded`.`value`"
        );
        let bucketed = UpsertRow {
            bucket: Some(86_400),
            ..row(1, 1)
        };
        let my = add_rows(
            Dialect::MySql,
            "c_buckets",
            vec![bucketed.clone(), bucketed],
        );
        assert_eq!(
            my.sql,
            "INSERT INTO `c_buckets` (`owner_id`, `count_key`, `bucket`, `slot`, `value`) SELECT * FROM (SELECT ? AS `owner_id`, ? AS `count_key`, ? AS `bucket`, ? AS `slot`, ? AS `value` UNION ALL SELECT ?, ?, ?, ?, ?) AS `excluded` ON DUPLICATE KEY UPDATE `value` = `c_buckets`.`value` + `excluded`.`value`"
        );
        let lite = add_rows(Dialect::Sqlite, "c", vec![row(1, 1)]);
        assert!(
            lite.sql.contains(r#"UNION ALL SELECT "excluded"."value""#),
            "{}",
            lite.sql
        );
    }
}
