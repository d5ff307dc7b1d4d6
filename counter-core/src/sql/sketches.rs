//! The statements of unique counts: a sketch table
//! `(owner_id, count_key, bucket, slot, sketch)` whose rows are read,
//! merged in Rust and written back, since no backend can take the
//! register-wise maximum of two blobs in SQL.
//!
//! A write locks one row (`SELECT ... FOR UPDATE`, `BEGIN IMMEDIATE` on
//! SQLite), merges, and updates it; a row that does not exist yet is
//! inserted with "do nothing" on conflict and then read again locked, so two
//! writers creating the same row both end merged into it. No statement's
//! row count decides anything (MySQL's "found rows" makes it ambiguous).

use sea_orm::{
    QueryResult, Statement, TryGetable, Value,
    sea_query::{
        Alias, Condition, Expr, ExprTrait, LockType, OnConflict, Order, Query, SimpleExpr,
    },
};

use super::{Dialect, col};
use crate::{error::Result, owner::SortOwner};

/// The `bucket` of a counter's all-time sketch: below every bucket start,
/// so a range `bucket >= from` never includes it.
pub(crate) const ALL_TIME: i64 = i64::MIN;

/// The column holding a serialized sketch.
pub(crate) const SKETCH: &str = "sketch";

/// One sketch row: a counter (or one bucket of it) and a slot.
#[derive(Debug, Clone)]
pub(crate) struct SketchCell {
    pub owner: Value,
    pub key: String,
    pub bucket: i64,
    pub slot: i16,
}

impl SketchCell {
    fn condition(&self) -> SimpleExpr {
        counter_condition(&self.owner, &self.key, self.bucket)
            .and(Expr::col(Alias::new(col::SLOT)).eq(self.slot))
    }
}

fn counter_condition(owner: &Value, key: &str, bucket: i64) -> SimpleExpr {
    Expr::col(Alias::new(col::OWNER_ID))
        .eq(owner.clone())
        .and(Expr::col(Alias::new(col::COUNT_KEY)).eq(key))
        .and(Expr::col(Alias::new(col::BUCKET)).eq(bucket))
}

/// `SELECT sketch FROM t WHERE <cell> FOR UPDATE` (no lock clause on
/// SQLite, whose `BEGIN IMMEDIATE` holds the write lock already).
pub(crate) fn lock_cell(dialect: Dialect, table: &str, cell: &SketchCell) -> Statement {
    let mut select = Query::select();
    select
        .column(Alias::new(SKETCH))
        .from(Alias::new(table))
        .and_where(cell.condition());
    if dialect != Dialect::Sqlite {
        select.lock(LockType::Update);
    }
    dialect.backend().build(&select)
}

/// `UPDATE t SET sketch = ? WHERE <cell>`.
pub(crate) fn update_cell(
    dialect: Dialect,
    table: &str,
    cell: &SketchCell,
    sketch: Vec<u8>,
) -> Statement {
    let update = Query::update()
        .table(Alias::new(table))
        .value(Alias::new(SKETCH), sketch)
        .and_where(cell.condition())
        .to_owned();
    dialect.backend().build(&update)
}

/// `SELECT owner_id, count_key, bucket, slot, sketch FROM t WHERE <cell>
/// OR <cell> .. ORDER BY <primary key> FOR UPDATE`: many rows read and
/// locked in one round trip, in primary-key order (no lock clause on
/// SQLite, as in [`lock_cell`]).
pub(crate) fn lock_cells<'a>(
    dialect: Dialect,
    table: &str,
    cells: impl IntoIterator<Item = &'a SketchCell>,
) -> Statement {
    let any = cells
        .into_iter()
        .fold(Condition::any(), |any, cell| any.add(cell.condition()));
    let mut select = Query::select();
    select
        .columns(PRIMARY_KEY.map(Alias::new))
        .column(Alias::new(SKETCH))
        .from(Alias::new(table))
        .cond_where(any)
        .order_by_columns(PRIMARY_KEY.map(|c| (Alias::new(c), Order::Asc)));
    if dialect != Dialect::Sqlite {
        select.lock(LockType::Update);
    }
    dialect.backend().build(&select)
}

/// The primary key of a sketch table, in its order.
const PRIMARY_KEY: [&str; 4] = [col::OWNER_ID, col::COUNT_KEY, col::BUCKET, col::SLOT];

/// One row of [`lock_cells`]: its primary key in the form a
/// [`SketchCell`] compares in ([`CellKey`]), and its sketch.
pub(crate) struct LockedCell {
    pub key: CellKey,
    pub sketch: Vec<u8>,
}

/// A sketch row's primary key as compared in Rust: byte for byte, so a
/// row that a case-insensitive collation matches to a cell is not taken
/// for that cell's row (such cells are merged one by one, where the
/// database decides which row is theirs).
pub(crate) type CellKey = (SortOwner, String, i64, i16);

impl SketchCell {
    /// The cell's [`CellKey`].
    pub(crate) fn key(&self) -> CellKey {
        (
            SortOwner::of(&self.owner),
            self.key.clone(),
            self.bucket,
            self.slot,
        )
    }
}

impl LockedCell {
    /// Decodes a row of [`lock_cells`] whose owner column holds values of
    /// `like`'s type.
    pub(crate) fn decode(row: &QueryResult, like: &Value) -> Result<Self> {
        let owner = match like {
            Value::Int(_) => Value::from(row.try_get::<i32>("", col::OWNER_ID)?),
            Value::Uuid(_) => Value::from(row.try_get::<uuid::Uuid>("", col::OWNER_ID)?),
            Value::String(_) => Value::from(row.try_get::<String>("", col::OWNER_ID)?),
            _ => Value::from(row.try_get::<i64>("", col::OWNER_ID)?),
        };
        Ok(Self {
            key: (
                SortOwner::of(&owner),
                row.try_get::<String>("", col::COUNT_KEY)?,
                row.try_get::<i64>("", col::BUCKET)?,
                row.try_get::<i16>("", col::SLOT)?,
            ),
            sketch: row.try_get::<Vec<u8>>("", SKETCH)?,
        })
    }
}

/// `INSERT INTO t VALUES (<cell>, sketch)`, doing nothing if the row
/// exists (see [`insert_cells`]).
pub(crate) fn insert_cell(
    dialect: Dialect,
    table: &str,
    cell: &SketchCell,
    sketch: Vec<u8>,
) -> Statement {
    insert_cells(dialect, table, [(cell, sketch)])
}

/// `INSERT INTO t VALUES (<cell>, sketch), ..`, doing nothing for a row
/// that exists (MySQL: `ON DUPLICATE KEY UPDATE slot = slot`, not `INSERT
/// IGNORE`, which would turn other errors into warnings).
pub(crate) fn insert_cells<'a>(
    dialect: Dialect,
    table: &str,
    rows: impl IntoIterator<Item = (&'a SketchCell, Vec<u8>)>,
) -> Statement {
    let mut on_conflict = OnConflict::columns(PRIMARY_KEY.map(Alias::new));
    match dialect {
        Dialect::MySql => {
            on_conflict.value(Alias::new(col::SLOT), Expr::col(Alias::new(col::SLOT)))
        }
        Dialect::Sqlite | Dialect::Postgres => on_conflict.do_nothing(),
    };
    let insert = cell_rows(table, rows).on_conflict(on_conflict).to_owned();
    dialect.backend().build(&insert)
}

/// `INSERT INTO t VALUES (<cell>, sketch), .. ON CONFLICT (<primary key>)
/// DO UPDATE SET sketch = excluded.sketch` (MySQL: `ON DUPLICATE KEY
/// UPDATE sketch = VALUES(sketch)`): rows the transaction has locked,
/// written back in one statement. Each cell once: PostgreSQL refuses a
/// statement that updates a row twice.
pub(crate) fn write_cells<'a>(
    dialect: Dialect,
    table: &str,
    rows: impl IntoIterator<Item = (&'a SketchCell, Vec<u8>)>,
) -> Statement {
    let on_conflict = OnConflict::columns(PRIMARY_KEY.map(Alias::new))
        .update_column(Alias::new(SKETCH))
        .to_owned();
    let insert = cell_rows(table, rows).on_conflict(on_conflict).to_owned();
    dialect.backend().build(&insert)
}

/// `INSERT INTO t (<primary key>, sketch) VALUES ..` of `rows`.
fn cell_rows<'a>(
    table: &str,
    rows: impl IntoIterator<Item = (&'a SketchCell, Vec<u8>)>,
) -> sea_orm::sea_query::InsertStatement {
    let mut insert = Query::insert();
    insert.into_table(Alias::new(table)).columns(
        PRIMARY_KEY
            .map(Alias::new)
            .into_iter()
            .chain([Alias::new(SKETCH)]),
    );
    for (cell, sketch) in rows {
        insert.values_panic([
            cell.owner.clone().into(),
            cell.key.clone().into(),
            cell.bucket.into(),
            cell.slot.into(),
            sketch.into(),
        ]);
    }
    insert
}

/// Which buckets a read merges: a counter's all-time sketch, or the
/// buckets starting in `[from, to)`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Buckets {
    AllTime,
    Range { from: i64, to: i64 },
}

/// `SELECT owner_id, count_key, sketch FROM t WHERE owner_id IN (..) AND
/// count_key IN (..) AND <buckets>`: every slot row, merged by the caller.
pub(crate) fn read_sketches(
    dialect: Dialect,
    table: &str,
    owners: Vec<Value>,
    keys: Vec<String>,
    buckets: Buckets,
) -> Statement {
    let bucket = Expr::col(Alias::new(col::BUCKET));
    let buckets = match buckets {
        Buckets::AllTime => bucket.eq(ALL_TIME),
        Buckets::Range { from, to } => bucket
            .clone()
            .gte(Ord::max(from, ALL_TIME + 1))
            .and(bucket.lt(to)),
    };
    let select = Query::select()
        .columns([col::OWNER_ID, col::COUNT_KEY, SKETCH].map(Alias::new))
        .from(Alias::new(table))
        .and_where(Expr::col(Alias::new(col::OWNER_ID)).is_in(owners))
        .and_where(Expr::col(Alias::new(col::COUNT_KEY)).is_in(keys))
        .and_where(buckets)
        .to_owned();
    dialect.backend().build(&select)
}

/// One row of [`read_sketches`].
pub(crate) struct SketchRow<I> {
    pub owner: I,
    pub key: String,
    pub sketch: Vec<u8>,
}

impl<I: TryGetable> SketchRow<I> {
    pub(crate) fn decode(row: &QueryResult) -> Result<Self> {
        Ok(Self {
            owner: row.try_get::<I>("", col::OWNER_ID)?,
            key: row.try_get::<String>("", col::COUNT_KEY)?,
            sketch: row.try_get::<Vec<u8>>("", SKETCH)?,
        })
    }
}

/// A counter (or a bucket of one) stored in more than one slot row.
#[derive(Debug, Clone)]
pub(crate) struct SplitCounter<I> {
    pub owner: I,
    pub key: String,
    pub bucket: i64,
}

/// `SELECT owner_id, count_key, bucket FROM t [WHERE (owner_id, count_key,
/// bucket) > (..)] GROUP BY .. HAVING COUNT(*) > 1 ORDER BY .. LIMIT n`:
/// the next counters a compaction merges, in primary-key order.
pub(crate) fn split_counters(
    dialect: Dialect,
    table: &str,
    after: Option<(Value, String, i64)>,
    limit: u64,
    slots: super::FoldSlots,
) -> Statement {
    let group = [col::OWNER_ID, col::COUNT_KEY, col::BUCKET].map(Alias::new);
    let mut select = Query::select();
    select.columns(group.clone()).from(Alias::new(table));
    if let Some(share) = slots.condition() {
        select.and_where(share);
    }
    if let Some((owner, key, bucket)) = after {
        let columns = Expr::tuple(group.clone().map(Expr::col));
        let values = Expr::tuple([Expr::val(owner), Expr::val(key), Expr::val(bucket)]);
        select.and_where(columns.gt(values));
    }
    select
        .group_by_columns(group.clone())
        .and_having(Expr::col(Alias::new(col::SLOT)).count().gt(1))
        .order_by_columns(group.map(|c| (c, Order::Asc)))
        .limit(limit);
    dialect.backend().build(&select)
}

/// The slot rows of `table` with a key of `keys` and an owner of `owners`
/// (each `None`: any), as column `n`.
pub(crate) fn count_rows(
    dialect: Dialect,
    table: &str,
    keys: Option<Vec<String>>,
    owners: Option<Vec<Value>>,
    slots: super::FoldSlots,
) -> Statement {
    let mut select = Query::select();
    select
        .expr_as(Expr::col(Alias::new(col::SLOT)).count(), Alias::new("n"))
        .from(Alias::new(table));
    if let Some(share) = slots.condition() {
        select.and_where(share);
    }
    if let Some(keys) = keys {
        select.and_where(Expr::col(Alias::new(col::COUNT_KEY)).is_in(keys));
    }
    if let Some(owners) = owners {
        select.and_where(Expr::col(Alias::new(col::OWNER_ID)).is_in(owners));
    }
    dialect.backend().build(&select)
}

impl<I: TryGetable> SplitCounter<I> {
    pub(crate) fn decode(row: &QueryResult) -> Result<Self> {
        Ok(Self {
            owner: row.try_get::<I>("", col::OWNER_ID)?,
            key: row.try_get::<String>("", col::COUNT_KEY)?,
            bucket: row.try_get::<i64>("", col::BUCKET)?,
        })
    }
}

/// `SELECT slot, sketch FROM t WHERE <counter> [AND slot % n = i] ORDER BY slot FOR UPDATE`.
pub(crate) fn lock_counter(
    dialect: Dialect,
    table: &str,
    owner: &Value,
    key: &str,
    bucket: i64,
    slots: super::FoldSlots,
) -> Statement {
    let mut select = Query::select();
    select
        .columns([col::SLOT, SKETCH].map(Alias::new))
        .from(Alias::new(table))
        .and_where(counter_condition(owner, key, bucket))
        .order_by(Alias::new(col::SLOT), Order::Asc);
    if let Some(share) = slots.condition() {
        select.and_where(share);
    }
    if dialect != Dialect::Sqlite {
        select.lock(LockType::Update);
    }
    dialect.backend().build(&select)
}

/// `DELETE FROM t WHERE <counter> AND slot IN (..)`.
pub(crate) fn delete_slots(
    dialect: Dialect,
    table: &str,
    owner: &Value,
    key: &str,
    bucket: i64,
    slots: Vec<i16>,
) -> Statement {
    let delete = Query::delete()
        .from_table(Alias::new(table))
        .and_where(counter_condition(owner, key, bucket))
        .and_where(Expr::col(Alias::new(col::SLOT)).is_in(slots))
        .to_owned();
    dialect.backend().build(&delete)
}

/// `SELECT DISTINCT <owner> AS owner_id FROM <table> [WHERE <owner> > ?]
/// ORDER BY 1 LIMIT n`: the next owners of a members table, for a rebuild.
pub(crate) fn member_owners(
    dialect: Dialect,
    table: &str,
    owner: &str,
    after: Option<Value>,
    limit: u64,
) -> Statement {
    let mut select = Query::select();
    select
        .distinct()
        .expr_as(Expr::col(Alias::new(owner)), Alias::new(col::OWNER_ID))
        .from(Alias::new(table));
    if let Some(after) = after {
        select.and_where(Expr::col(Alias::new(owner)).gt(after));
    }
    select.order_by(Alias::new(owner), Order::Asc).limit(limit);
    dialect.backend().build(&select)
}

/// `SELECT <owner> AS owner_id, CAST(<member> AS <text>) AS member
/// [, <at> AS seen_at] FROM <table> WHERE <owner> IN (..)`: the members of
/// some owners, as the text a rebuild hashes, with the time of each row
/// when the rebuild fills buckets.
pub(crate) fn members_of(
    dialect: Dialect,
    table: &str,
    owner: &str,
    member: &str,
    at: Option<&str>,
    owners: Vec<Value>,
) -> Statement {
    let text = super::text_type(dialect);
    let mut select = Query::select();
    select
        .expr_as(Expr::col(Alias::new(owner)), Alias::new(col::OWNER_ID))
        .expr_as(
            Expr::col(Alias::new(member)).cast_as(Alias::new(text)),
            Alias::new(MEMBER),
        );
    if let Some(at) = at {
        select.expr_as(Expr::col(Alias::new(at)), Alias::new(SEEN_AT));
    }
    select
        .from(Alias::new(table))
        .and_where(Expr::col(Alias::new(owner)).is_in(owners));
    dialect.backend().build(&select)
}

/// The alias of a member in [`members_of`].
pub(crate) const MEMBER: &str = "member";
/// The alias of a member row's time in [`members_of`].
pub(crate) const SEEN_AT: &str = "seen_at";

#[cfg(test)]
mod tests {
    use super::*;

    fn cell() -> SketchCell {
        SketchCell {
            owner: 7_i64.into(),
            key: "viewers".into(),
            bucket: ALL_TIME,
            slot: 3,
        }
    }

    #[test]
    fn a_cell_is_locked_where_the_backend_locks_rows() {
        let pg = lock_cell(Dialect::Postgres, "c_sketches", &cell()).to_string();
        assert!(pg.ends_with("FOR UPDATE"), "{pg}");
        let lite = lock_cell(Dialect::Sqlite, "c_sketches", &cell()).to_string();
        assert!(!lite.contains("FOR UPDATE"), "{lite}");
    }

    #[test]
    fn an_insert_never_overwrites_and_never_ignores_errors() {
        let my = insert_cell(Dialect::MySql, "c_sketches", &cell(), vec![1]).to_string();
        assert!(
            my.contains("ON DUPLICATE KEY UPDATE `slot` = `slot`"),
            "{my}"
        );
        assert!(!my.contains("IGNORE"), "{my}");
        let pg = insert_cell(Dialect::Postgres, "c_sketches", &cell(), vec![1]).to_string();
        assert!(pg.contains("DO NOTHING"), "{pg}");
    }

    #[test]
    fn a_range_never_reads_the_all_time_sketch() {
        let from_min = Buckets::Range {
            from: i64::MIN,
            to: 10,
        };
        let sql = read_sketches(
            Dialect::Postgres,
            "t",
            vec![1_i64.into()],
            vec!["v".into()],
            from_min,
        )
        .to_string();
        assert!(sql.contains(&format!("{}", ALL_TIME + 1)), "{sql}");
    }
}
