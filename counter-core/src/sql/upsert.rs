//! The increment: an upsert of one slot row, or of many in one statement.

use sea_orm::{
    Statement, Value,
    sea_query::{Alias, Expr, OnConflict, Query},
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
/// with `d` read from `excluded` (PostgreSQL, SQLite) or bound again
/// (MySQL, whose `VALUES()` is deprecated), and the new value kept within
/// ±[`SLOT_CAP`] by `guard`: under [`Guard::Skip`], a row it would take
/// past the cap is left as it is, and the statement affects no row.
pub(crate) fn add_one(dialect: Dialect, table: &str, row: UpsertRow, guard: Guard) -> Statement {
    let guard = guard.on(dialect);
    let delta = row.delta;
    let layout = row.layout();
    let old = old_value_sql(dialect, table);
    let mut update = OnConflict::columns(key_columns(layout));
    match dialect {
        // The conflicting row's proposed value, as the multi-row form names it.
        Dialect::Postgres | Dialect::Sqlite => {
            let excluded = format!(
                "{}.{}",
                quote(dialect, NEW_ROWS),
                quote(dialect, col::VALUE)
            );
            update.value(
                Alias::new(col::VALUE),
                Expr::cust(new_value_sql(dialect, &old, &excluded, guard)),
            );
            if guard == Guard::Skip {
                update.action_and_where(Expr::cust(within_cap(&old, &excluded)));
            }
        }
        // No `excluded` (and `VALUES()` is deprecated): `d` bound again.
        Dialect::MySql => {
            let new_value = match guard {
                Guard::Unguarded => Expr::cust_with_values(format!("{old} + ?"), [delta]),
                Guard::Raise | Guard::Skip => {
                    Expr::cust_with_values(guarded_sum(dialect, &old, "?"), [delta, delta, delta])
                }
            };
            update.value(Alias::new(col::VALUE), new_value);
        }
    }
    let mut insert = Query::insert();
    insert
        .into_table(Alias::new(table))
        .columns(columns(layout))
        .values_panic(row_exprs(row))
        .on_conflict(update.to_owned());
    dialect.backend().build(&insert)
}

/// One statement adding to many slot rows, each new value kept within
/// ±[`SLOT_CAP`] like [`add_one`]'s. The caller folds duplicates and sorts
/// by primary key first: PostgreSQL refuses to touch a row twice in one
/// statement, and a fixed order keeps concurrent batches from deadlocking.
pub(crate) fn add_rows(dialect: Dialect, table: &str, rows: Vec<UpsertRow>) -> Statement {
    add_rows_with(dialect, table, rows, Guard::Raise)
}

/// How an upsert treats a slot row it would take past ±[`SLOT_CAP`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Guard {
    /// The statement fails with the backend's overflow error and writes
    /// nothing ([`guarded_sum`]). For a statement whose failure aborts
    /// nothing else: one in autocommit on every backend, and any statement
    /// on MySQL and SQLite, which undo the failed statement alone and keep
    /// the transaction going.
    Raise,
    /// PostgreSQL inside a transaction, which a failed statement would
    /// abort whole: the row is left as it is (`DO UPDATE .. WHERE`) and the
    /// statement says so. [`add_one`] then affects no row; [`add_rows_with`]
    /// returns the 1-based position of each row it left (one column, a
    /// `bigint`), and nothing when it wrote them all. Nothing raises, so no
    /// savepoint is needed for the rare add that meets the cap. On the
    /// other backends it is [`Guard::Raise`].
    Skip,
    /// A settlement's writes to rows it has locked and summed, whose layout
    /// it computed itself (one slot may hold a little more than the cap).
    Unguarded,
}

impl Guard {
    /// The guard of an add on `dialect`, in a transaction or alone: a
    /// refusal that raises only where a failed statement aborts nothing
    /// but itself.
    pub(crate) fn for_add(dialect: Dialect, in_transaction: bool) -> Self {
        match (dialect, in_transaction) {
            (Dialect::Postgres, true) => Self::Skip,
            _ => Self::Raise,
        }
    }

    /// The guard as `dialect` runs it: only PostgreSQL skips.
    fn on(self, dialect: Dialect) -> Self {
        match (self, dialect) {
            (Self::Skip, Dialect::Sqlite | Dialect::MySql) => Self::Raise,
            (guard, _) => guard,
        }
    }
}

/// [`add_rows`] with the guard chosen.
pub(crate) fn add_rows_with(
    dialect: Dialect,
    table: &str,
    rows: Vec<UpsertRow>,
    guard: Guard,
) -> Statement {
    let guard = guard.on(dialect);
    let layout = rows.first().map_or(Layout::Totals, UpsertRow::layout);
    debug_assert!(rows.iter().all(|r| r.layout() == layout));
    if dialect == Dialect::Postgres
        && let Some(statement) = postgres_unnest_rows(table, layout, &rows, guard)
    {
        return statement;
    }
    match dialect {
        Dialect::MySql => mysql_add_rows(table, layout, rows, guard),
        Dialect::Sqlite | Dialect::Postgres => {
            let excluded = format!(
                "{}.{}",
                quote(dialect, NEW_ROWS),
                quote(dialect, col::VALUE)
            );
            // `Skip` comes here only with an owner no `OwnerId` makes (see
            // `postgres_unnest_rows`): this form returns no positions, so it
            // must not skip silently, and raises instead.
            let guard = match guard {
                Guard::Skip => Guard::Raise,
                guard => guard,
            };
            let old = old_value_sql(dialect, table);
            let new_value = Expr::cust(new_value_sql(dialect, &old, &excluded, guard));
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

/// PostgreSQL: the rows as one text per column, unnested in order. The
/// statement's text depends only on the table and the guard, so sqlx
/// prepares it once per connection and each batch sends one small `Bind`: a
/// multi-row `VALUES` changes text with every row count and is parsed again
/// each time (and under sqlx 0.9.0, which left Nagle's algorithm on, a
/// large statement waited out a delayed ACK, 40 ms on loopback: mq-bench
/// measured 7,600 vs 30,000+ messages a second; 0.9.1, the least this crate
/// takes, sets `TCP_NODELAY`). Numbers, UUIDs and keys (which
/// never contain a comma: `validate_key`) are comma-separated; string owners,
/// which may contain anything, are an array literal of quoted elements.
/// `None` for an owner no `OwnerId` makes: it takes `VALUES`.
///
/// Under [`Guard::Skip`] the upsert is a CTE whose `RETURNING` names the
/// rows it wrote, and the statement returns the positions of those it did
/// not: almost always none.
fn postgres_unnest_rows(
    table: &str,
    layout: Layout,
    rows: &[UpsertRow],
    guard: Guard,
) -> Option<Statement> {
    let owner_type = match rows.first()?.owner {
        Value::Int(_) => "integer",
        Value::BigInt(_) => "bigint",
        Value::Uuid(_) => "uuid",
        Value::String(_) => "text",
        _ => return None,
    };
    let mut owners = String::with_capacity(rows.len() * 8 + 2);
    let mut keys = String::with_capacity(rows.len() * 8);
    let mut buckets = String::new();
    let mut slots = String::with_capacity(rows.len() * 3);
    let mut deltas = String::with_capacity(rows.len() * 3);
    if owner_type == "text" {
        owners.push('{');
    }
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            for column in [&mut owners, &mut keys, &mut slots, &mut deltas] {
                column.push(',');
            }
            if layout == Layout::Buckets {
                buckets.push(',');
            }
        }
        match (&row.owner, owner_type) {
            (Value::Int(Some(v)), "integer") => owners.push_str(&v.to_string()),
            (Value::BigInt(Some(v)), "bigint") => owners.push_str(&v.to_string()),
            (Value::Uuid(Some(v)), "uuid") => owners.push_str(&v.to_string()),
            (Value::String(Some(v)), "text") => push_array_element(&mut owners, v),
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
        match owner_type {
            "text" => {
                owners.push('}');
                "$1::text[]".to_owned()
            }
            _ => format!("string_to_array($1, ',')::{owner_type}[]"),
        },
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
    let (old, excluded) = (format!("{t}.{v}"), format!("{}.{v}", q(NEW_ROWS)));
    let new_value = new_value_sql(Dialect::Postgres, &old, &excluded, guard);
    let (names, arrays, keys) = (names.join(", "), arrays.join(", "), keys.join(", "));
    let insert = format!(
        "INSERT INTO {t} ({names}) SELECT {names} FROM unnest({arrays}) WITH ORDINALITY \
         AS {new} ({names}, row_order) ORDER BY row_order \
         ON CONFLICT ({keys}) DO UPDATE SET {v} = {new_value}",
        new = q("new_rows"),
    );
    let sql = match guard {
        Guard::Raise | Guard::Unguarded => insert,
        // The rows written are counted first: only when some are missing
        // (a refusal, rare) is the anti-join run, so an add far from the cap
        // pays for a count of its rows, not for a join. The CTE's name holds
        // a space, which no counter table's can (`validate_table_name`).
        // Text is compared byte for byte (`COLLATE "C"`): a column of
        // another collation than the database's would otherwise make the
        // comparison ambiguous, an error.
        Guard::Skip => {
            let same: Vec<String> = layout
                .primary_key()
                .iter()
                .map(|&c| {
                    let text = c == col::COUNT_KEY || (c == col::OWNER_ID && owner_type == "text");
                    let collate = if text { " COLLATE \"C\"" } else { "" };
                    format!("w.{c}{collate} = n.{c}{collate}", c = q(c))
                })
                .collect();
            values.push(Value::BigInt(Some(rows.len() as i64)));
            format!(
                "WITH \"rows written\" AS ({insert} WHERE {within} RETURNING {keys}) \
                 SELECT n.row_order FROM unnest({arrays}) WITH ORDINALITY AS n ({names}, row_order) \
                 WHERE (SELECT count(*) FROM \"rows written\") < ${count} AND NOT EXISTS \
                 (SELECT 1 FROM \"rows written\" AS w WHERE {same})",
                within = within_cap(&old, &excluded),
                count = values.len(),
                same = same.join(" AND "),
            )
        }
    };
    Some(Statement::from_sql_and_values(
        Dialect::Postgres.backend(),
        sql,
        values,
    ))
}

/// Appends `text` to a PostgreSQL array literal as one quoted element:
/// inside double quotes a backslash escapes the next character, so commas,
/// braces, spaces and the word NULL are all just text.
fn push_array_element(literal: &mut String, text: &str) {
    literal.push('"');
    for c in text.chars() {
        if c == '"' || c == '\\' {
            literal.push('\\');
        }
        literal.push(c);
    }
    literal.push('"');
}

/// MySQL/MariaDB: the new rows come from a derived table, so the update can
/// name them (`excluded.value`, as on the other backends) without the deprecated `VALUES()` function; MariaDB
/// rejects MySQL 8's `AS new` row alias, and this form works on both.
fn mysql_add_rows(table: &str, layout: Layout, rows: Vec<UpsertRow>, guard: Guard) -> Statement {
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
    let new_value = new_value_sql(
        Dialect::MySql,
        &format!("{t}.{v}"),
        &format!("{new}.{v}"),
        guard,
    );
    sql.push_str(&format!(
        ") AS {new} ON DUPLICATE KEY UPDATE {v} = {new_value}"
    ));
    Statement::from_sql_and_values(Dialect::MySql.backend(), sql, values)
}

/// The largest magnitude a slot row reaches through an ordinary add:
/// `i64::MAX / Slots::MAX` (2^53 - 1). A counter has at most
/// [`Slots::MAX`](crate::Slots::MAX) slot rows, so while every slot stays
/// within it, no sum of them can leave `i64`, and an add needs to know only
/// its own slot's new value, which its upsert computes anyway. An add that
/// would take a slot past it is settled instead ([`crate::settle`]): the
/// counter's rows locked and summed, the add refused if the total would
/// leave `i64`, else spread over slots that stay within bounds.
pub(crate) const SLOT_CAP: i64 = i64::MAX / crate::Slots::MAX as i64;

/// `old + addend`, or a statement that fails with the backend's overflow
/// error when the sum would leave ±[`SLOT_CAP`] ([`Guard::Raise`]).
///
/// The failure is an integer overflow forced in the `ELSE` branch
/// (`|old| + |addend| + i64::MAX`, which overflows because the sum that
/// passed the cap is not zero; on SQLite `sum()` of i64::MAX and 1):
/// PostgreSQL (22003), MySQL (1690) and SQLite ("integer overflow") each
/// raise it only for a row that takes the branch, and each classifies as
/// [`Classified::Overflow`]. It
/// needs no `RETURNING` and no second statement, so an add far from the cap
/// costs what it did. SQLite's `+` turns an overflow into a REAL silently,
/// which is why its sums go through `sum()`, which raises instead.
///
/// [`Classified::Overflow`]: super::Classified::Overflow
fn guarded_sum(dialect: Dialect, old: &str, addend: &str) -> String {
    let within = within_cap(old, addend);
    let max = i64::MAX;
    match dialect {
        // `{old} % 1 + max` is i64::MAX as an integer whatever `old` holds
        // (`+` of two large integers would give a REAL, which `sum()` adds
        // without complaint), and ties the branch to the row, so SQLite
        // cannot evaluate it once up front.
        Dialect::Sqlite => format!(
            "CASE WHEN {within} THEN {old} + {addend} \
             ELSE (SELECT sum(v) FROM (SELECT {old} % 1 + {max} AS v UNION ALL SELECT 1)) END"
        ),
        Dialect::Postgres | Dialect::MySql => format!(
            "CASE WHEN {within} THEN {old} + {addend} \
             ELSE abs({old}) + abs({addend}) + {max} END"
        ),
    }
}

/// Whether `old + addend` stays within ±[`SLOT_CAP`]. Neither can overflow
/// the sum: a slot holds at most a little more than the cap, and a delta
/// beyond it is settled without an upsert (`settle::beyond_cap`).
fn within_cap(old: &str, addend: &str) -> String {
    format!("abs({old} + {addend}) <= {SLOT_CAP}")
}

/// The new value of a conflicting row: guarded, or a plain checked sum
/// (unguarded, or skipped by the upsert's `WHERE` when past the cap).
fn new_value_sql(dialect: Dialect, old: &str, addend: &str, guard: Guard) -> String {
    match (guard.on(dialect), dialect) {
        (Guard::Raise, _) => guarded_sum(dialect, old, addend),
        (Guard::Unguarded | Guard::Skip, Dialect::Sqlite) => {
            format!("(SELECT sum(v) FROM (SELECT {old} AS v UNION ALL SELECT {addend}))")
        }
        (Guard::Unguarded | Guard::Skip, Dialect::Postgres | Dialect::MySql) => {
            format!("{old} + {addend}")
        }
    }
}

/// The old value, table-qualified: PostgreSQL rejects a bare `value` as
/// ambiguous.
fn old_value_sql(dialect: Dialect, table: &str) -> String {
    format!("{}.{}", quote(dialect, table), quote(dialect, col::VALUE))
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
        let pg = add_one(Dialect::Postgres, "post_counters", row(1, 5), Guard::Raise);
        assert_eq!(
            pg.sql,
            r#"INSERT INTO "post_counters" ("owner_id", "count_key", "slot", "value") VALUES ($1, $2, $3, $4) ON CONFLICT ("owner_id", "count_key", "slot") DO UPDATE SET "value" = CASE WHEN abs("post_counters"."value" + "excluded"."value") <= 9007199254740991 THEN "post_counters"."value" + "excluded"."value" ELSE abs("post_counters"."value") + abs("excluded"."value") + 9223372036854775807 END"#
        );
        assert_eq!(pg.values.unwrap().0.len(), 4);
        let my = add_one(Dialect::MySql, "post_counters", row(1, 5), Guard::Raise);
        assert_eq!(
            my.sql,
            "INSERT INTO `post_counters` (`owner_id`, `count_key`, `slot`, `value`) VALUES (?, ?, ?, ?) ON DUPLICATE KEY UPDATE `value` = CASE WHEN abs(`post_counters`.`value` + ?) <= 9007199254740991 THEN `post_counters`.`value` + ? ELSE abs(`post_counters`.`value`) + abs(?) + 9223372036854775807 END"
        );
        assert_eq!(my.values.unwrap().0.len(), 7);
        let lite = add_one(Dialect::Sqlite, "post_counters", row(1, 5), Guard::Raise);
        assert!(lite.sql.ends_with(r#"ELSE (SELECT sum(v) FROM (SELECT "post_counters"."value" % 1 + 9223372036854775807 AS v UNION ALL SELECT 1)) END"#), "{}", lite.sql);
        assert_eq!(lite.values.unwrap().0.len(), 4);
    }

    #[test]
    fn multi_row_upsert_per_backend() {
        let pg = add_rows(Dialect::Postgres, "c", vec![row(1, 1), row(2, 2)]);
        assert_eq!(
            pg.sql,
            r#"INSERT INTO "c" ("owner_id", "count_key", "slot", "value") SELECT "owner_id", "count_key", "slot", "value" FROM unnest(string_to_array($1, ',')::bigint[], string_to_array($2, ','), string_to_array($3, ',')::smallint[], string_to_array($4, ',')::bigint[]) WITH ORDINALITY AS "new_rows" ("owner_id", "count_key", "slot", "value", row_order) ORDER BY row_order ON CONFLICT ("owner_id", "count_key", "slot") DO UPDATE SET "value" = CASE WHEN abs("c"."value" + "excluded"."value") <= 9007199254740991 THEN "c"."value" + "excluded"."value" ELSE abs("c"."value") + abs("excluded"."value") + 9223372036854775807 END"#
        );
        assert_eq!(pg.values.unwrap().0.len(), 4);
        let settled = add_rows_with(Dialect::Postgres, "c", vec![row(1, 1)], Guard::Unguarded);
        assert!(
            settled
                .sql
                .ends_with(r#"DO UPDATE SET "value" = "c"."value" + "excluded"."value""#),
            "{}",
            settled.sql
        );
        let strings = |owners: [&str; 2]| {
            owners
                .map(|owner| UpsertRow {
                    owner: Value::from(owner),
                    ..row(1, 1)
                })
                .to_vec()
        };
        let pg = add_rows(
            Dialect::Postgres,
            "c",
            strings(["a,b", r#"q"u\o{te} NULL"#]),
        );
        assert!(
            pg.sql.starts_with(r#"INSERT INTO "c" ("owner_id", "count_key", "slot", "value") SELECT "owner_id", "count_key", "slot", "value" FROM unnest($1::text[], string_to_array($2, ','), "#),
            "{}",
            pg.sql
        );
        assert!(
            pg.sql.ends_with(r#"DO UPDATE SET "value" = CASE WHEN abs("c"."value" + "excluded"."value") <= 9007199254740991 THEN "c"."value" + "excluded"."value" ELSE abs("c"."value") + abs("excluded"."value") + 9223372036854775807 END"#),
            "{}",
            pg.sql
        );
        let values = pg.values.unwrap().0;
        assert_eq!(values.len(), 4);
        assert_eq!(
            values[0],
            Value::from(r#"{"a,b","q\"u\\o{te} NULL"}"#),
            "each owner one quoted element"
        );
        let my = add_rows(Dialect::MySql, "c", vec![row(1, 1), row(2, 2)]);
        assert_eq!(
            my.sql,
            "INSERT INTO `c` (`owner_id`, `count_key`, `slot`, `value`) SELECT * FROM (SELECT ? AS `owner_id`, ? AS `count_key`, ? AS `slot`, ? AS `value` UNION ALL SELECT ?, ?, ?, ?) AS `excluded` ON DUPLICATE KEY UPDATE `value` = CASE WHEN abs(`c`.`value` + `excluded`.`value`) <= 9007199254740991 THEN `c`.`value` + `excluded`.`value` ELSE abs(`c`.`value`) + abs(`excluded`.`value`) + 9223372036854775807 END"
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
            "INSERT INTO `c_buckets` (`owner_id`, `count_key`, `bucket`, `slot`, `value`) SELECT * FROM (SELECT ? AS `owner_id`, ? AS `count_key`, ? AS `bucket`, ? AS `slot`, ? AS `value` UNION ALL SELECT ?, ?, ?, ?, ?) AS `excluded` ON DUPLICATE KEY UPDATE `value` = CASE WHEN abs(`c_buckets`.`value` + `excluded`.`value`) <= 9007199254740991 THEN `c_buckets`.`value` + `excluded`.`value` ELSE abs(`c_buckets`.`value`) + abs(`excluded`.`value`) + 9223372036854775807 END"
        );
        let lite = add_rows(Dialect::Sqlite, "c", vec![row(1, 1)]);
        assert!(
            lite.sql.contains(r#"ELSE (SELECT sum(v) FROM (SELECT "c"."value" % 1 + 9223372036854775807 AS v UNION ALL SELECT 1)) END"#),
            "{}",
            lite.sql
        );
    }

    #[test]
    fn skip_leaves_a_row_past_the_cap_and_says_so() {
        // PostgreSQL in a transaction: nothing raises.
        let one = add_one(Dialect::Postgres, "c", row(1, 5), Guard::Skip);
        assert!(
            one.sql.ends_with(r#"DO UPDATE SET "value" = "c"."value" + "excluded"."value" WHERE abs("c"."value" + "excluded"."value") <= 9007199254740991"#),
            "{}",
            one.sql
        );
        let many = add_rows_with(
            Dialect::Postgres,
            "c",
            vec![row(1, 1), row(2, 2)],
            Guard::Skip,
        );
        assert_eq!(
            many.sql,
            r#"WITH "rows written" AS (INSERT INTO "c" ("owner_id", "count_key", "slot", "value") SELECT "owner_id", "count_key", "slot", "value" FROM unnest(string_to_array($1, ',')::bigint[], string_to_array($2, ','), string_to_array($3, ',')::smallint[], string_to_array($4, ',')::bigint[]) WITH ORDINALITY AS "new_rows" ("owner_id", "count_key", "slot", "value", row_order) ORDER BY row_order ON CONFLICT ("owner_id", "count_key", "slot") DO UPDATE SET "value" = "c"."value" + "excluded"."value" WHERE abs("c"."value" + "excluded"."value") <= 9007199254740991 RETURNING "owner_id", "count_key", "slot") SELECT n.row_order FROM unnest(string_to_array($1, ',')::bigint[], string_to_array($2, ','), string_to_array($3, ',')::smallint[], string_to_array($4, ',')::bigint[]) WITH ORDINALITY AS n ("owner_id", "count_key", "slot", "value", row_order) WHERE (SELECT count(*) FROM "rows written") < $5 AND NOT EXISTS (SELECT 1 FROM "rows written" AS w WHERE w."owner_id" = n."owner_id" AND w."count_key" COLLATE "C" = n."count_key" COLLATE "C" AND w."slot" = n."slot")"#
        );
        assert_eq!(
            many.values.unwrap().0[4],
            Value::BigInt(Some(2)),
            "the rows sent"
        );
        // MySQL and SQLite undo a failed statement alone: they raise.
        for dialect in [Dialect::MySql, Dialect::Sqlite] {
            for guard in [Guard::Raise, Guard::Skip] {
                assert_eq!(
                    add_rows_with(dialect, "c", vec![row(1, 1)], guard).sql,
                    add_rows(dialect, "c", vec![row(1, 1)]).sql,
                    "{dialect:?}"
                );
                assert_eq!(
                    add_one(dialect, "c", row(1, 1), guard).sql,
                    add_one(dialect, "c", row(1, 1), Guard::Raise).sql,
                    "{dialect:?}"
                );
            }
        }
        assert_eq!(Guard::for_add(Dialect::Postgres, true), Guard::Skip);
        assert_eq!(Guard::for_add(Dialect::Postgres, false), Guard::Raise);
        assert_eq!(Guard::for_add(Dialect::MySql, true), Guard::Raise);
    }
}
