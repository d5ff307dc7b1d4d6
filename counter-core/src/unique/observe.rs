//! Writes of unique counts: members merged into one slot's sketch row.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, TransactionTrait, Value};

use super::{Member, Sketch, merge::Merges};
use crate::{
    CounterTable, Counters,
    error::Result,
    key::validate_key,
    owner::{OwnerId, SortOwner},
    sql::{
        Dialect,
        sketches::{ALL_TIME, SketchCell},
    },
    typed::{KeySpace, UniqueKeyOf},
};

impl<I: OwnerId, S: KeySpace> Counters<I, S> {
    /// Counts `member` (a user id, an IP address, a session id: any
    /// [`Member`]) among the distinct members of a unique key
    /// ([`CounterTable::with_unique_key`](crate::CounterTable::with_unique_key)).
    /// Observing a member twice, or from two processes, counts it once.
    ///
    /// One transaction that locks one slot's sketch row, merges and writes
    /// it back only if a register changed (a member seen before changes
    /// none, so a popular page's repeat viewers cost a read); a windowed key
    /// merges into the bucket of now too, in the same transaction. Hot
    /// owners are better served by [`Counters::observe_many`] or by merging
    /// in memory and writing with [`Counters::observe_sketch`]: one write
    /// per sketch, not per member.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use counter_core::{CounterTable, Counters};
    ///
    /// let db = sea_orm::Database::connect("sqlite::memory:").await?;
    /// let posts = Counters::<i64>::new(CounterTable::new("post_counters")?.with_unique_key("viewers")?);
    /// posts.create_table(&db).await?;
    /// for viewer in ["ann", "bob", "ann", "cy", "bob"] {
    ///     posts.observe(&db, 7, "viewers", viewer).await?;
    /// }
    /// assert_eq!(posts.unique(&db, 7, "viewers").await?, 3);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn observe<C, K, M>(&self, db: &C, owner: I, key: K, member: &M) -> Result<()>
    where
        C: ConnectionTrait + TransactionTrait,
        K: UniqueKeyOf<S>,
        M: Member + ?Sized,
    {
        self.observe_at(db, owner, key, member, Utc::now()).await
    }

    /// [`Counters::observe`] of a visit that happened `at`: a windowed key
    /// counts it in the bucket of `at` instead of now.
    pub async fn observe_at<C, K, M>(
        &self,
        db: &C,
        owner: I,
        key: K,
        member: &M,
        at: DateTime<Utc>,
    ) -> Result<()>
    where
        C: ConnectionTrait + TransactionTrait,
        K: UniqueKeyOf<S>,
        M: Member + ?Sized,
    {
        let mut sketch = Sketch::new();
        sketch.insert(member);
        self.observe_sketch_at(db, owner, key, &sketch, at).await
    }

    /// Counts many members at once: `(owner, key, member)` items are merged
    /// in memory into one sketch per counter first, then written in one
    /// transaction, one slot row per counter (per bucket too, for a
    /// windowed key), rows in primary-key order.
    pub async fn observe_many<C, K, M, It>(&self, db: &C, items: It) -> Result<()>
    where
        C: ConnectionTrait + TransactionTrait,
        K: UniqueKeyOf<S>,
        M: Member,
        It: IntoIterator<Item = (I, K, M)>,
    {
        let now = Utc::now();
        let mut sketches: BTreeMap<(I, String), Sketch> = BTreeMap::new();
        for (owner, key, member) in items {
            let key = key.as_key_str();
            self.check_unique(&owner, key, "observe_many")?;
            sketches
                .entry((owner, key.to_owned()))
                .or_default()
                .insert(&member);
        }
        let dialect = Dialect::of(db)?;
        let cells = sketches
            .into_iter()
            .flat_map(|((owner, key), sketch)| self.cells(dialect, owner, key, sketch, now))
            .collect();
        self.write_sketches(db, cells).await
    }

    /// Merges a whole sketch (members counted in memory: a buffer's flush,
    /// a queue consumer's batch, another database's export) into a unique
    /// key. Merging is idempotent: a sketch written twice, or a
    /// redelivered message's, changes nothing the second time.
    pub async fn observe_sketch<C, K>(
        &self,
        db: &C,
        owner: I,
        key: K,
        sketch: &Sketch,
    ) -> Result<()>
    where
        C: ConnectionTrait + TransactionTrait,
        K: UniqueKeyOf<S>,
    {
        self.observe_sketch_at(db, owner, key, sketch, Utc::now())
            .await
    }

    /// [`Counters::observe_sketch`] of members seen `at` (the bucket of a
    /// windowed key).
    pub async fn observe_sketch_at<C, K>(
        &self,
        db: &C,
        owner: I,
        key: K,
        sketch: &Sketch,
        at: DateTime<Utc>,
    ) -> Result<()>
    where
        C: ConnectionTrait + TransactionTrait,
        K: UniqueKeyOf<S>,
    {
        let key = key.as_key_str();
        self.check_unique(&owner, key, "observe")?;
        let dialect = Dialect::of(db)?;
        let cells = self.cells(dialect, owner, key.to_owned(), sketch.clone(), at);
        self.write_sketches(db, cells).await
    }

    /// `Ok` if `key` is a valid unique key of this table and `owner` fits.
    pub(crate) fn check_unique(&self, owner: &I, key: &str, operation: &'static str) -> Result<()> {
        self.check_unique_key(key, operation)?;
        owner.check()
    }

    /// `Ok` if `key` is a valid unique key of this table.
    pub(crate) fn check_unique_key(&self, key: &str, operation: &'static str) -> Result<()> {
        validate_key(key)?;
        self.table().check_kind(key, true, operation)
    }

    /// The rows one counter's sketch merges into: its all-time sketch and,
    /// for a windowed key, the bucket of `at`; each in the slot the table's
    /// strategy picks.
    fn cells(
        &self,
        dialect: Dialect,
        owner: I,
        key: String,
        sketch: Sketch,
        at: DateTime<Utc>,
    ) -> Vec<(SketchCell, Sketch)> {
        let owner: Value = owner.into();
        let table = self.table();
        table
            .sketch_buckets(&key, at)
            .map(|bucket| {
                (
                    cell(table, dialect, owner.clone(), &key, bucket),
                    sketch.clone(),
                )
            })
            .collect()
    }

    /// Merges each sketch into its row, in one transaction (a savepoint in
    /// the caller's), rows in primary-key order so that two writers never
    /// wait on each other's rows in opposite orders. On a pool the
    /// transaction runs in a task of its own (see `detach`) and is retried
    /// whole after a conflict: a merge applied twice is the same merge.
    async fn write_sketches<C>(&self, db: &C, cells: Vec<(SketchCell, Sketch)>) -> Result<()>
    where
        C: ConnectionTrait + TransactionTrait,
    {
        let table = self.table();
        let cells = cells
            .into_iter()
            .map(|(cell, sketch)| (table, cell, sketch))
            .collect();
        Merges::new(Dialect::of(db)?, cells).write(db).await
    }
}

/// The row of `table`'s sketch table a sketch of `(owner, key)` in `bucket`
/// merges into: in the slot the table's strategy picks (the all-time
/// sketch and the buckets each turn a rotor of their own).
pub(crate) fn cell(
    table: &CounterTable,
    dialect: Dialect,
    owner: Value,
    key: &str,
    bucket: i64,
) -> SketchCell {
    let counter = SortOwner::of(&owner);
    let slot = if bucket == ALL_TIME {
        table.next_slot_on(Some(dialect), &counter, key)
    } else {
        table.next_bucket_slot(Some(dialect), &counter, key)
    };
    SketchCell {
        owner,
        key: key.to_owned(),
        bucket,
        slot,
    }
}
