//! The statements of a compaction: lock a stretch of slot rows, delete
//! exactly the ones read.

use sea_orm::{
    QueryResult, Statement, TryGetable, Value,
    sea_query::{
        Alias, Expr, ExprTrait, LockType, Order, Query, ReturningClause,
        extension::mysql::{IndexHintScope, MySqlSelectStatementExt},
    },
};

use super::{Dialect, Layout, OwnerRange, col, quote, range::condition};
use crate::error::Result;

/// The slots a compaction folds: every slot into slot 0, or one writer's
/// share of them ([`Writer`](crate::Writer) `index` of `count`: the slots
/// `s` with `s % count == index`) into the share's first slot, `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FoldSlots {
    share: Option<(i16, i16)>,
}

impl FoldSlots {
    /// Every slot, into slot 0.
    pub(crate) const ALL: Self = Self { share: None };

    /// The share of writer `index` of `count`.
    pub(crate) fn share(index: u16, count: u16) -> Self {
        // Both are at most `Slots::MAX` (1024), so they fit an i16.
        Self {
            share: Some((index as i16, count as i16)),
        }
    }

    /// The slot folded rows go to.
    pub(crate) fn target(self) -> i16 {
        self.share.map_or(0, |(index, _)| index)
    }

    /// A region's slots ([`Region`](crate::Region): the same arithmetic as
    /// a writer share), or every slot without a region: what a delete of a
    /// table placed in a region may touch.
    pub(crate) fn of_region(region: Option<&crate::Region>) -> Self {
        region.map_or(Self::ALL, |r| Self::share(r.index(), r.count()))
    }

    /// `slot % count = index`, for a share.
    pub(crate) fn condition(self) -> Option<sea_orm::sea_query::SimpleExpr> {
        self.share
            .map(|(index, count)| Expr::col(Alias::new(col::SLOT)).modulo(count).eq(index))
    }
}

/// What one compaction batch folds: a stretch of owners, optionally some
/// keys only, counters of at least `min_rows` rows, and which slots.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FoldScope<'a> {
    pub range: &'a OwnerRange,
    pub keys: Option<&'a [String]>,
    pub min_rows: usize,
    pub slots: FoldSlots,
}

/// One slot row of a counter table or of its bucket table.
#[derive(Debug, Clone)]
pub(crate) struct SlotRow<I> {
    pub owner: I,
    pub key: String,
    /// The bucket start, in a bucket table.
    pub bucket: Option<i64>,
    pub slot: i16,
    pub value: i64,
}

impl<I: TryGetable> SlotRow<I> {
    /// A row of [`lock_slots`] (every column) or of [`delete_foldable`]'s
    /// `RETURNING` (no slot: the slot is not needed to fold it).
    pub(crate) fn decode(row: &QueryResult, layout: Layout) -> Result<Self> {
        Ok(Self {
            owner: row.try_get::<I>("", col::OWNER_ID)?,
            key: row.try_get::<String>("", col::COUNT_KEY)?,
            bucket: match layout {
                Layout::Buckets | Layout::Sketches => Some(row.try_get::<i64>("", col::BUCKET)?),
                Layout::Totals => None,
            },
            slot: row.try_get::<i16>("", col::SLOT).unwrap_or(0),
            value: row.try_get::<i64>("", col::VALUE)?,
        })
    }
}

impl<I: Clone + Into<Value>> SlotRow<I> {
    /// The primary key's values, in the order of `Layout::primary_key`.
    fn primary_key(&self) -> Vec<Value> {
        let mut values = vec![self.owner.clone().into(), self.key.clone().into()];
        if let Some(bucket) = self.bucket {
            values.push(bucket.into());
        }
        values.push(self.slot.into());
        values
    }
}

/// Reads and locks the slot rows of a stretch of owners, in primary-key
/// order (the order every batch write locks in):
///
/// ```sql
/// SELECT owner_id, count_key, [bucket,] slot, value FROM t
/// WHERE <owners> [AND count_key IN (..)] ORDER BY <primary key> FOR UPDATE
/// ```
///
/// SQLite has no row locks; a compaction there runs under `BEGIN
/// IMMEDIATE`, which keeps every other writer out until it commits.
pub(crate) fn lock_slots(
    dialect: Dialect,
    table: &str,
    layout: Layout,
    scope: &FoldScope<'_>,
) -> Statement {
    let FoldScope {
        range, keys, slots, ..
    } = *scope;
    let mut select = Query::select();
    for column in layout.primary_key().iter().chain(&[col::VALUE]) {
        select.column(Alias::new(*column));
    }
    select.from(Alias::new(table));
    if dialect == Dialect::MySql {
        // Through the primary key, never the key index `(count_key,
        // owner_id)` that a `count_key IN (..)` tempts the optimizer into:
        // rows are then locked in the order writers lock them. (A counter
        // once seen "short of a row" here, always with a key filter, was
        // most likely the result-order defect `Batch::fold` now guards
        // against by sorting: MariaDB can return these rows out of
        // primary-key order, whatever the index, after a prepared
        // execution with a repeated key.)
        select.force_index(Alias::new("PRIMARY"), IndexHintScope::All);
    }
    if let Some(owners) = condition(Expr::col(Alias::new(col::OWNER_ID)), range) {
        select.and_where(owners);
    }
    if let Some(keys) = keys {
        select.and_where(Expr::col(Alias::new(col::COUNT_KEY)).is_in(keys.iter().cloned()));
    }
    if let Some(share) = slots.condition() {
        select.and_where(share);
    }
    for column in layout.primary_key() {
        select.order_by(Alias::new(*column), Order::Asc);
    }
    if dialect != Dialect::Sqlite {
        select.lock(LockType::Update);
    }
    dialect.backend().build(&select)
}

/// Deletes every row outside slot 0 of the counters (or buckets) within the
/// stretch `range` (which keeps the plan on the primary key's range) that
/// have at least `min_rows` rows, and returns what it deleted (PostgreSQL
/// and SQLite; MySQL has no `RETURNING`: see [`delete_exactly`]):
///
/// ```sql
/// How a compaction batch deletes the slot rows it folds, by dialect.
pub(crate) enum FoldDeletion {
    /// One `DELETE .. RETURNING` of every foldable row in the stretch
    /// ([`delete_foldable`]): PostgreSQL and SQLite. Fold what it returns.
    Returning(Statement),
    /// Deletes of exactly the rows the batch locked, in chunks
    /// ([`delete_exactly`]), each of which must affect all its rows:
    /// MySQL/MariaDB, which has no `DELETE .. RETURNING`. Fold the locked rows.
    Exactly(Vec<(Statement, u64)>),
}

/// Rows per MySQL delete of exactly the locked rows: three or four binds a
/// row, under every bind limit.
const DELETE_ROWS_PER_STATEMENT: usize = 1_000;

/// The deletion of a compaction batch over `range` that locked `locked`.
pub(crate) fn fold_deletion<I: Clone + Into<Value>>(
    dialect: Dialect,
    table: &str,
    layout: Layout,
    scope: &FoldScope<'_>,
    locked: &[SlotRow<I>],
) -> FoldDeletion {
    match dialect {
        Dialect::MySql => FoldDeletion::Exactly(
            locked
                .chunks(DELETE_ROWS_PER_STATEMENT)
                .map(|chunk| (delete_exactly(table, layout, chunk), chunk.len() as u64))
                .collect(),
        ),
        Dialect::Postgres | Dialect::Sqlite => {
            FoldDeletion::Returning(delete_foldable(dialect, table, layout, scope))
        }
    }
}

/// ```sql
/// DELETE FROM t WHERE <owners> [AND count_key IN (..)] AND slot <> <target> [AND slot % n = i]
///   AND (owner_id, count_key[, bucket]) IN (SELECT .. FROM t WHERE <owners> [AND count_key IN (..)]
///                                           [AND slot % n = i] GROUP BY .. HAVING COUNT(*) >= ?)
/// RETURNING owner_id, count_key, [bucket,] value
/// ```
///
/// The values come back as deleted, and those are what the compaction
/// folds, so the predicate need not name rows: a grouped subquery plans in
/// microseconds where a list of a thousand primary keys takes PostgreSQL
/// milliseconds to plan.
pub(crate) fn delete_foldable(
    dialect: Dialect,
    table: &str,
    layout: Layout,
    scope: &FoldScope<'_>,
) -> Statement {
    let FoldScope {
        range,
        keys,
        min_rows,
        slots,
    } = *scope;
    let owners = || condition(Expr::col(Alias::new(col::OWNER_ID)), range);
    let columns = |columns: &[&str]| Expr::tuple(columns.iter().map(|c| Expr::col(Alias::new(*c))));
    let mut delete = Query::delete();
    delete.from_table(Alias::new(table));
    if let Some(owners) = owners() {
        delete.and_where(owners);
    }
    let group: Vec<Alias> = layout.group().iter().map(|c| Alias::new(*c)).collect();
    let mut foldable = Query::select();
    foldable.columns(group.clone()).from(Alias::new(table));
    if let Some(owners) = owners() {
        foldable.and_where(owners);
    }
    if let Some(keys) = keys {
        let keys = Expr::col(Alias::new(col::COUNT_KEY)).is_in(keys.iter().cloned());
        foldable.and_where(keys.clone());
        delete.and_where(keys);
    }
    if let Some(share) = slots.condition() {
        foldable.and_where(share.clone());
        delete.and_where(share);
    }
    // A sum beyond half the slot cap stays spread (see `Batch::fold`);
    // SQLite's `total()`, a float, because its `sum()` raises on a total
    // that only direct SQL could have put out of range.
    let sum = match dialect {
        Dialect::Sqlite => "abs(total(value))",
        Dialect::Postgres | Dialect::MySql => "abs(SUM(value))",
    };
    foldable
        .group_by_columns(group)
        .and_having(Expr::cust("COUNT(*)").gte(min_rows as i64))
        .and_having(Expr::cust(sum).lte(super::SLOT_CAP / 2));
    delete
        .and_where(Expr::col(Alias::new(col::SLOT)).ne(slots.target()))
        .and_where(columns(layout.group()).in_subquery(foldable));
    let mut returned: Vec<Alias> = layout.group().iter().map(|c| Alias::new(*c)).collect();
    returned.push(Alias::new(col::VALUE));
    delete.returning(ReturningClause::Columns(
        returned.into_iter().map(Into::into).collect(),
    ));
    dialect.backend().build(&delete)
}

/// Deletes exactly `rows`, one primary-key lookup each, through a join
/// with a derived table of their keys (MySQL/MariaDB's multi-table form):
///
/// ```sql
/// DELETE FROM c USING (SELECT ? AS owner_id, ? AS count_key, [? AS bucket,] ? AS slot
///                      UNION ALL SELECT ?, ?, ?, ..) AS v
/// STRAIGHT_JOIN c ON c.owner_id = v.owner_id AND c.count_key = v.count_key
///   [AND c.bucket = v.bucket] AND c.slot = v.slot
/// ```
///
/// Not `WHERE (owner_id, count_key, slot) IN (..)`: for a list of a few
/// dozen keys MySQL/MariaDB may plan that as a scan of the stretch or of
/// the whole table (on a small, hot table they do), and a locking scan
/// waits for every row on its way that a writer holds, rows the compaction
/// never read among them, while the compaction holds its own: it
/// deadlocked with concurrent upserts of the same counters, pass after
/// pass. `STRAIGHT_JOIN` reads the derived table first, so each row is
/// found by its primary key (`eq_ref`) and only the rows named are locked.
pub(crate) fn delete_exactly<I: Clone + Into<Value>>(
    table: &str,
    layout: Layout,
    rows: &[SlotRow<I>],
) -> Statement {
    debug_assert!(!rows.is_empty(), "a derived table needs a row");
    let dialect = Dialect::MySql;
    let q = |ident: &str| quote(dialect, ident);
    let t = q(table);
    let key = layout.primary_key();
    let first: Vec<String> = key.iter().map(|c| format!("? AS {}", q(c))).collect();
    let rest = vec!["?"; key.len()].join(", ");
    let mut sql = format!("DELETE FROM {t} USING (");
    let mut values = Vec::with_capacity(rows.len() * key.len());
    for (i, row) in rows.iter().enumerate() {
        if i == 0 {
            sql.push_str(&format!("SELECT {}", first.join(", ")));
        } else {
            sql.push_str(&format!(" UNION ALL SELECT {rest}"));
        }
        values.extend(row.primary_key());
    }
    let on: Vec<String> = key
        .iter()
        .map(|&c| match c {
            // Compared as the key column's ASCII (`ascii_bin` wins over the
            // derived `ascii` column's default collation: `likes` and
            // `Likes` stay two keys), not converted row by row to the
            // connection's character set.
            col::COUNT_KEY => format!("{t}.{0} = CONVERT(v.{0} USING ascii)", q(c)),
            _ => format!("{t}.{0} = v.{0}", q(c)),
        })
        .collect();
    sql.push_str(&format!(") AS v STRAIGHT_JOIN {t} ON {}", on.join(" AND ")));
    Statement::from_sql_and_values(dialect.backend(), sql, values)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(owner: i64, slot: i16) -> SlotRow<i64> {
        SlotRow {
            owner,
            key: "likes".into(),
            bucket: None,
            slot,
            value: 7,
        }
    }

    #[test]
    fn lock_then_delete_what_was_read() {
        let range = OwnerRange::Keyset {
            after: Some(0i64.into()),
            upto: Some(10i64.into()),
            limit: 0,
        };
        let views = ["views".to_owned()];
        let scope = |range, keys, slots| FoldScope {
            range,
            keys,
            min_rows: 2,
            slots,
        };
        let pg = lock_slots(
            Dialect::Postgres,
            "c",
            Layout::Totals,
            &scope(&range, None, FoldSlots::ALL),
        );
        assert_eq!(
            pg.sql,
            r#"SELECT "owner_id", "count_key", "slot", "value" FROM "c" WHERE "owner_id" > $1 AND "owner_id" <= $2 ORDER BY "owner_id" ASC, "count_key" ASC, "slot" ASC FOR UPDATE"#
        );
        let lite = lock_slots(
            Dialect::Sqlite,
            "c",
            Layout::Buckets,
            &scope(&range, Some(&views), FoldSlots::ALL),
        );
        assert!(!lite.sql.contains("FOR UPDATE"), "{}", lite.sql);
        assert!(
            lite.sql.contains(r#""bucket" ASC, "slot" ASC"#),
            "{}",
            lite.sql
        );

        let unbounded = OwnerRange::Keyset {
            after: None,
            upto: None,
            limit: 0,
        };
        let my = lock_slots(
            Dialect::MySql,
            "c",
            Layout::Totals,
            &scope(&unbounded, Some(&views), FoldSlots::ALL),
        );
        assert_eq!(
            my.sql,
            "SELECT `owner_id`, `count_key`, `slot`, `value` FROM `c` FORCE INDEX (`PRIMARY`) WHERE `count_key` IN (?) ORDER BY `owner_id` ASC, `count_key` ASC, `slot` ASC FOR UPDATE"
        );

        let rows = [row(1, 3), row(2, 5)];
        let my = delete_exactly("c", Layout::Totals, &rows);
        assert_eq!(
            my.sql,
            "DELETE FROM `c` USING (SELECT ? AS `owner_id`, ? AS `count_key`, ? AS `slot` UNION ALL SELECT ?, ?, ?) AS v STRAIGHT_JOIN `c` ON `c`.`owner_id` = v.`owner_id` AND `c`.`count_key` = CONVERT(v.`count_key` USING ascii) AND `c`.`slot` = v.`slot`"
        );
        assert_eq!(my.values.unwrap().0.len(), 6);
        let pg = delete_foldable(
            Dialect::Postgres,
            "c",
            Layout::Totals,
            &scope(&range, None, FoldSlots::ALL),
        );
        assert_eq!(
            pg.sql,
            r#"DELETE FROM "c" WHERE "owner_id" > $1 AND "owner_id" <= $2 AND "slot" <> $3 AND ("owner_id", "count_key") IN (SELECT "owner_id", "count_key" FROM "c" WHERE "owner_id" > $4 AND "owner_id" <= $5 GROUP BY "owner_id", "count_key" HAVING (COUNT(*)) >= $6 AND (abs(SUM(value))) <= $7) RETURNING "owner_id", "count_key", "value""#
        );
        // Writer 1 of 3: its slots (1, 4, 7, ..) into slot 1, locked and
        // counted alone.
        let share = FoldSlots::share(1, 3);
        assert_eq!(share.target(), 1);
        let my = lock_slots(
            Dialect::MySql,
            "c",
            Layout::Totals,
            &scope(&range, None, share),
        );
        assert!(
            my.sql
                .contains("WHERE `owner_id` > ? AND `owner_id` <= ? AND `slot` % ? = ? ORDER BY"),
            "{}",
            my.sql
        );
        let pg = delete_foldable(
            Dialect::Postgres,
            "c",
            Layout::Totals,
            &scope(&range, None, share),
        );
        assert_eq!(
            pg.sql,
            r#"DELETE FROM "c" WHERE "owner_id" > $1 AND "owner_id" <= $2 AND "slot" % $3 = $4 AND "slot" <> $5 AND ("owner_id", "count_key") IN (SELECT "owner_id", "count_key" FROM "c" WHERE "owner_id" > $6 AND "owner_id" <= $7 AND "slot" % $8 = $9 GROUP BY "owner_id", "count_key" HAVING (COUNT(*)) >= $10 AND (abs(SUM(value))) <= $11) RETURNING "owner_id", "count_key", "value""#
        );
    }
}
