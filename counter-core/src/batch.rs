//! Deltas of many tables, owners and keys, applied together.

use std::collections::BTreeMap;

use sea_orm::{ConnectionTrait, Value};

use crate::{
    BatchOutcome, CounterTable, Counters, SlottedCounter,
    error::{CounterError, Result},
    key::{CounterKey, validate_key},
    owner::OwnerId,
    retry,
    sql::{self, Dialect, UpsertRow},
};

/// Counter deltas collected across tables, owners and keys, then applied in
/// the caller's connection or transaction with one sorted multi-row upsert
/// per table and chunk.
///
/// Counter caches use it so that one child write (a comment moved from one
/// post to another: `-1` and `+1`) touches its counters in one statement, in
/// primary-key order: two such writes lock slot rows in the same order and
/// cannot deadlock on each other. Deltas of the same counter are folded
/// (checked, never wrapped), and counters that net to zero send nothing.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use counter_core::{CounterTable, Counters, DeltaBatch};
///
/// let db = sea_orm::Database::connect("sqlite::memory:").await?;
/// let posts = Counters::<i64>::new(CounterTable::new("post_counters")?);
/// let users = Counters::<i64>::new(CounterTable::new("user_counters")?);
/// posts.create_table(&db).await?;
/// users.create_table(&db).await?;
///
/// let mut batch = DeltaBatch::new();
/// batch.add(&posts, 1, "comments", -1)?;
/// batch.add(&posts, 2, "comments", 1)?;
/// batch.add(&users, 9, "comments", 1)?;
/// batch.add(&users, 9, "comments", -1)?; // folds to zero: not sent
/// let outcome = batch.apply(&db).await?;
/// assert_eq!((outcome.rows, outcome.statements), (2, 1));
/// assert_eq!(posts.get(&db, &2, "comments").await?, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Default)]
pub struct DeltaBatch {
    /// Folded deltas by (table, owner, key): the map's order is the order
    /// rows are locked in.
    deltas: BTreeMap<(String, SortOwner, String), Pending>,
    tables: BTreeMap<String, CounterTable>,
}

#[derive(Debug)]
struct Pending {
    owner: Value,
    delta: i64,
}

impl DeltaBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `delta` to `key` of `owner` in `counters`' table.
    ///
    /// Keys and owners are checked here, so a bad one fails before any SQL
    /// is sent; a fold that leaves `i64` is [`CounterError::Overflow`].
    pub fn add<I: OwnerId, K: CounterKey>(
        &mut self,
        counters: &Counters<I>,
        owner: I,
        key: K,
        delta: i64,
    ) -> Result<()> {
        let key = key.as_key_str();
        validate_key(key)?;
        owner.check()?;
        let table = counters.table();
        let value: Value = owner.into();
        let sort = SortOwner::of(&value);
        self.tables
            .entry(table.name().to_owned())
            .or_insert_with(|| table.clone());
        let pending = self
            .deltas
            .entry((table.name().to_owned(), sort, key.to_owned()))
            .or_insert(Pending {
                owner: value,
                delta: 0,
            });
        pending.delta = pending
            .delta
            .checked_add(delta)
            .ok_or_else(|| CounterError::Overflow {
                context: format!("the folded batch delta of `{key}`"),
            })?;
        Ok(())
    }

    /// [`DeltaBatch::add`] with an entity's typed key.
    pub fn add_to<P: SlottedCounter>(
        &mut self,
        owner: P::OwnerId,
        key: P::Key,
        delta: i64,
    ) -> Result<()> {
        self.add(P::counters(), owner, key, delta)
    }

    /// Whether no counter would change.
    pub fn is_empty(&self) -> bool {
        self.deltas.values().all(|p| p.delta == 0)
    }

    /// Sends the batch on `db`: one multi-row upsert per table and chunk of
    /// [`UPSERT_ROWS_PER_STATEMENT`](crate::UPSERT_ROWS_PER_STATEMENT) rows,
    /// tables in name order and rows in primary-key order.
    ///
    /// Give it a transaction when the deltas must be all or nothing: each
    /// statement is atomic by itself, but on a pool a batch of several
    /// statements is not (conflicts are retried per statement there).
    pub async fn apply<C: ConnectionTrait>(self, db: &C) -> Result<BatchOutcome> {
        let mut outcome = BatchOutcome::default();
        if self.is_empty() {
            return Ok(outcome);
        }
        let dialect = Dialect::of(db)?;
        let mut by_table: BTreeMap<String, Vec<UpsertRow>> = BTreeMap::new();
        for ((table, sort, key), pending) in self.deltas {
            if pending.delta == 0 {
                continue;
            }
            let slot = self.tables[&table].next_slot(&sort, &key);
            by_table.entry(table).or_default().push(UpsertRow {
                owner: pending.owner,
                key,
                slot,
                delta: pending.delta,
            });
        }
        for (table, rows) in by_table {
            outcome.rows += rows.len();
            let mut rows = rows.into_iter().peekable();
            while rows.peek().is_some() {
                let chunk = rows.by_ref().take(sql::UPSERT_ROWS_PER_STATEMENT).collect();
                let stmt = sql::add_rows(dialect, &table, chunk);
                retry::run(db, &table, || db.execute_raw(stmt.clone())).await?;
                outcome.statements += 1;
            }
        }
        Ok(outcome)
    }
}

/// An owner id in the order its typed form sorts in (integers numerically,
/// UUIDs by bytes, strings by bytes), so a batch locks rows in the same
/// order as [`Counters::add_many`] does.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum SortOwner {
    Int(i64),
    Uuid(uuid::Uuid),
    Str(String),
}

impl SortOwner {
    fn of(value: &Value) -> Self {
        match value {
            Value::Int(Some(v)) => Self::Int(i64::from(*v)),
            Value::BigInt(Some(v)) => Self::Int(*v),
            Value::Uuid(Some(v)) => Self::Uuid(*v),
            Value::String(Some(v)) => Self::Str(v.clone()),
            // OwnerId is only implemented for the four types above.
            other => Self::Str(format!("{other:?}")),
        }
    }
}
