//! Lossless online compaction: folding a counter's slot rows into slot 0
//! while increments keep arriving.

use std::{collections::BTreeSet, marker::PhantomData, sync::Arc};

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, TransactionTrait};

use crate::{
    Counters, detach,
    error::{CounterError, Result},
    key::CounterKey,
    key::validate_key,
    owner::{self, OwnerId},
    retry,
    sql::{self, Dialect, FoldScope, FoldSlots, Layout, OwnerRange, SlotRow, UpsertRow},
    strategy::Writer,
    typed::KeySpace,
    walk,
};

use crate::limits::MAX_COMPACT_BATCH;

/// What [`Counters::compact`] folds, and in what steps.
///
/// The scope is every owner (walked in primary-key order), or the owners
/// given, optionally narrowed to some keys; within it, a counter (or one
/// bucket of a windowed key) is folded when it has at least
/// [`Compact::min_rows`] slot rows. There is no age threshold: the table
/// keeps no write times (a timestamp would be one more column to write on
/// every increment), and the row count is what a read pays for, so it is
/// what selects a counter.
///
/// ```
/// use counter_core::Compact;
///
/// let options = Compact::<i64>::new().owners([7, 8]).keys(["views"]).min_rows(4);
/// # let _ = options;
/// ```
#[derive(Debug, Clone)]
pub struct Compact<I> {
    owners: Option<Vec<I>>,
    keys: Option<Vec<String>>,
    min_rows: usize,
    batch_rows: usize,
    buckets: bool,
    slots: SlotsToFold,
}

/// Which of a counter's slots a compaction folds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotsToFold {
    /// A Galera node's share of them, every slot elsewhere.
    Auto,
    /// One writer's share.
    Share(Writer),
    /// Every slot, on any backend.
    All,
}

impl<I> Default for Compact<I> {
    fn default() -> Self {
        Self {
            owners: None,
            keys: None,
            min_rows: 2,
            batch_rows: 1_000,
            buckets: true,
            slots: SlotsToFold::Auto,
        }
    }
}

impl<I: OwnerId> Compact<I> {
    /// Every owner and key; counters with 2 or more slot rows; 1,000 rows
    /// per batch; bucket tables included.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only these owners.
    pub fn owners(mut self, owners: impl IntoIterator<Item = I>) -> Self {
        self.owners = Some(owners.into_iter().collect());
        self
    }

    /// Only these keys.
    pub fn keys<K: CounterKey>(mut self, keys: impl IntoIterator<Item = K>) -> Self {
        let mut keys: Vec<String> = keys
            .into_iter()
            .map(|k| k.as_key_str().to_owned())
            .collect();
        // Each key once (keys compare byte for byte, as the key column
        // does): a statement's `count_key IN (..)` then never holds one key
        // twice, a list MariaDB turns into an equality, and a prepared
        // statement executed first with such a list drops `count_key` from
        // its `ORDER BY` for every later execution (see `Batch::fold`).
        keys.sort_unstable();
        keys.dedup();
        self.keys = Some(keys);
        self
    }

    /// Folds a counter only when it has at least this many slot rows,
    /// `2..=65,536` (default 2).
    pub fn min_rows(mut self, rows: usize) -> Self {
        self.min_rows = rows;
        self
    }

    /// The size of a batch transaction, `1..=`[`MAX_COMPACT_BATCH`]
    /// (default 1,000). Walking the whole table, a batch is a stretch of
    /// owners holding at least this many slot rows plus the rest of its last
    /// owner's (the last stretch, whatever is left); with
    /// [`Compact::owners`], it is this many owners. A batch holds its rows'
    /// locks until it commits, so writers of those counters wait at most
    /// one batch.
    pub fn batch_rows(mut self, rows: usize) -> Self {
        self.batch_rows = rows;
        self
    }

    /// Whether the bucket table of windowed keys is compacted too (default
    /// yes: a past bucket is never written again, and folds to one row).
    pub fn buckets(mut self, yes: bool) -> Self {
        self.buckets = yes;
        self
    }

    /// Folds only `writer`'s share of each counter's slots (the slots `s`
    /// with `s % count == index`, see [`Writer`]) into the share's first
    /// slot, `index`; [`Compact::min_rows`] counts the share's rows. Rows
    /// of other writers' shares are neither locked nor written, so the
    /// compaction never meets those writers.
    ///
    /// This is the default on a MariaDB Galera node, with the node's share
    /// ([`Writer::of_galera_node`]): there a compaction that folds another
    /// node's rows loses certification to that node's writers again and
    /// again (measured with 24 writers on one 48-slot counter, 8 per node:
    /// 0 of 35 whole-counter compactions committed while they wrote; with
    /// node shares, see RELIABILITY.md). Run it on every node, each
    /// folding its own share: a counter then keeps at most one row per node.
    pub fn share(mut self, writer: Writer) -> Self {
        self.slots = SlotsToFold::Share(writer);
        self
    }

    /// Folds every slot of each counter into slot 0, on a Galera node too
    /// (where it succeeds only while no other node writes the counters it
    /// folds: a quiet cluster, or a maintenance window).
    pub fn all_slots(mut self) -> Self {
        self.slots = SlotsToFold::All;
        self
    }
}

/// What one table's compaction saw and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactStats {
    /// Slot rows in scope when their batch locked them.
    pub rows_before: u64,
    /// Slot rows in scope when their batch committed.
    pub rows_after: u64,
    /// Counters (or buckets) folded into slot 0.
    pub counters_folded: u64,
    /// Batch transactions committed.
    pub batches: u64,
}

/// What [`Counters::compact`] did, per table. Rows written by concurrent
/// increments after a batch committed are not in its figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactReport {
    /// The counter table.
    pub totals: CompactStats,
    /// The bucket table (all zero without windowed keys).
    pub buckets: CompactStats,
    /// The sketch table of unique keys (all zero without them): each
    /// counter's slot rows merged into one, a few dozen counters per
    /// transaction, whatever the writer share. `rows_before` counts every sketch row in
    /// scope when the compaction began (merged before or not), and
    /// `rows_after` that less the rows it merged away.
    pub sketches: CompactStats,
    /// The writer share whose slots were folded ([`Compact::share`], or a
    /// Galera node's own); `None` when every slot was.
    pub share: Option<Writer>,
}

impl<I: OwnerId, S: KeySpace> Counters<I, S> {
    /// Folds the slot rows of each counter in scope into its slot 0, so a
    /// read sums one row where it summed up to a slot count's worth, while
    /// increments keep arriving. Totals never change, not even for an
    /// instant. (With a writer share, [`Compact::share`] and the default on
    /// a Galera node, the share's slots into its first slot instead.)
    ///
    /// Each batch is one transaction that:
    /// 1. reads a stretch of slot rows in primary-key order, locking them
    ///    (`SELECT ... FOR UPDATE`; `BEGIN IMMEDIATE` on SQLite);
    /// 2. deletes the rows outside slot 0 of the counters with
    ///    [`Compact::min_rows`] rows or more: on PostgreSQL and SQLite with
    ///    `DELETE ... RETURNING`, and what comes back, as deleted, is what is
    ///    folded; on MySQL, whose `DELETE` returns nothing, exactly the rows
    ///    read and locked in step 1, by primary key, checked to be all gone;
    /// 3. adds each counter's sum to its slot 0 with the upsert an increment
    ///    uses.
    ///
    /// An increment that arrives meanwhile either waits for the batch's lock
    /// and then lands on top of the folded rows, or writes a row the batch
    /// leaves alone, or (on PostgreSQL and SQLite, if it committed before the
    /// `DELETE`) a row the batch deletes and therefore also folds: it is
    /// counted once in every case. A batch that fails (a killed connection, a
    /// deadlock) rolls back whole and changes nothing; on a pool, a deadlock
    /// runs it again.
    ///
    /// Lock order: a transaction of your own that writes several counters
    /// should write them in primary-key order (owner, then key), as
    /// [`DeltaBatch`](crate::DeltaBatch) and typed handles do. Out of
    /// order, it can deadlock with a batch that holds a stretch of slot rows
    /// and waits for the next: the database aborts one of the two, your
    /// transaction with [`CounterError::Conflict`], or the batch, which is
    /// retried (on PostgreSQL each such deadlock stalls both for
    /// `deadlock_timeout`, and a batch that keeps losing returns `Conflict`
    /// once its retries run out, having changed nothing).
    pub async fn compact(
        &self,
        db: &DatabaseConnection,
        options: &Compact<I>,
    ) -> Result<CompactReport> {
        CounterError::check_size(
            "compaction batch_rows",
            options.batch_rows,
            1,
            MAX_COMPACT_BATCH,
        )?;
        // A counter of one row has nothing to fold, and none has more rows
        // than a SMALLINT has slot numbers.
        CounterError::check_size("compaction min_rows", options.min_rows, 2, 65_536)?;
        for key in options.keys.iter().flatten() {
            validate_key(key)?;
        }
        let share = match (options.slots, self.table().region()) {
            // A region folds its own rows and no other's: replication
            // carries only each region's own.
            (SlotsToFold::Auto, Some(region)) => Some(Writer::new(region.index(), region.count())?),
            (_, Some(_)) => {
                self.table()
                    .refuse_in_region("compacting other slots than the region's own")?;
                None
            }
            (SlotsToFold::All, None) => None,
            (SlotsToFold::Share(writer), None) => Some(writer),
            (SlotsToFold::Auto, None) => Writer::of_galera_node(db).await?,
        };
        let slots = share.map_or(FoldSlots::ALL, |w| FoldSlots::share(w.index(), w.count()));
        let mut report = CompactReport {
            share,
            ..CompactReport::default()
        };
        let table = self.table().name().to_owned();
        report.totals = self
            .compact_table(db, &table, Layout::Totals, options, slots)
            .await?;
        // Only when a key in scope is windowed: else there is nothing to fold.
        let windowed = |key: &String| self.table().window_for(key).is_some();
        let any_windowed = match &options.keys {
            Some(keys) => keys.iter().any(windowed),
            None => true,
        };
        if let (true, true, Some(buckets)) =
            (options.buckets, any_windowed, self.table().bucket_table())
        {
            report.buckets = self
                .compact_table(db, &buckets, Layout::Buckets, options, slots)
                .await?;
        }
        report.sketches = self
            .compact_sketches(db, options.keys.as_deref(), options.owners.as_deref())
            .await?;
        Ok(report)
    }

    async fn compact_table(
        &self,
        db: &DatabaseConnection,
        table: &str,
        layout: Layout,
        options: &Compact<I>,
        slots: FoldSlots,
    ) -> Result<CompactStats> {
        let mut stats = CompactStats::default();
        match &options.owners {
            Some(owners) => {
                let owners = owner::sorted_unique(owners)?;
                // Owners are not rows: a chunk's rows are bounded by the
                // owners' keys and slots, as with an explicit owner list anywhere.
                for chunk in owners.chunks(options.batch_rows) {
                    let range = OwnerRange::In(chunk.iter().cloned().map(Into::into).collect());
                    stats.add(
                        self.compact_batch(db, table, layout, &range, options, slots)
                            .await?,
                    );
                }
            }
            None => {
                let mut stretches =
                    walk::Stretches::<I>::new("compaction", table, options.batch_rows as u64);
                while let Some(range) = stretches.next(db).await? {
                    stats.add(
                        self.compact_batch(db, table, layout, &range, options, slots)
                            .await?,
                    );
                }
            }
        }
        Ok(stats)
    }

    /// One batch transaction (see [`Counters::compact`]).
    async fn compact_batch(
        &self,
        db: &DatabaseConnection,
        table: &str,
        layout: Layout,
        range: &OwnerRange,
        options: &Compact<I>,
        slots: FoldSlots,
    ) -> Result<CompactStats> {
        let dialect = Dialect::of(db)?;
        let txn_options = dialect.batch_transaction();
        let batch = Arc::new(Batch::<I> {
            dialect,
            table: table.to_owned(),
            layout,
            range: range.clone(),
            keys: options.keys.clone(),
            min_rows: options.min_rows,
            slots,
            owner: PhantomData,
        });
        // In a task of its own (see `detach`): a compaction dropped midway
        // leaves its batch committed or rolled back, never half sent.
        let pool = detach::Detached::pool(db);
        retry::run(db, table, || {
            let batch = batch.clone();
            pool.run(move |db| async move {
                let txn = db.begin_with_options(txn_options).await?;
                sql::bound_lock_waits(&txn).await?;
                let stats = batch.fold(&txn).await?;
                txn.commit().await?;
                Ok(stats)
            })
        })
        .await
    }
}

/// One batch of a compaction: a stretch of one table's owners.
struct Batch<I> {
    dialect: Dialect,
    table: String,
    layout: Layout,
    range: OwnerRange,
    keys: Option<Vec<String>>,
    min_rows: usize,
    slots: FoldSlots,
    owner: PhantomData<fn() -> I>,
}

impl<I: OwnerId> Batch<I> {
    /// What this batch folds, for its statements.
    fn scope(&self) -> FoldScope<'_> {
        FoldScope {
            range: &self.range,
            keys: self.keys.as_deref(),
            min_rows: self.min_rows,
            slots: self.slots,
        }
    }

    /// Inside the batch transaction: lock, delete what may be folded, add
    /// what was deleted to its target slot.
    async fn fold<C: ConnectionTrait>(&self, txn: &C) -> Result<CompactStats, DbErr> {
        let (table, layout) = (self.table.as_str(), self.layout);
        let lock = sql::lock_slots(self.dialect, table, layout, &self.scope());
        let mut locked = txn
            .query_all_raw(lock)
            .await?
            .iter()
            .map(|row| SlotRow::<I>::decode(row, layout))
            .collect::<Result<Vec<_>>>()
            .map_err(CounterError::into_db_err)?;
        // Grouped by counter here, not trusting the server's row order: the
        // lock asks for primary-key order, but MariaDB 10.11 does not always
        // return it. A prepared statement (sqlx caches one per connection)
        // whose first execution had a key list of one key repeated, `IN
        // ('a', 'a')`, keeps `count_key` out of its `ORDER BY` in every
        // later execution, so rows come back by owner and slot, the keys
        // interleaved: a counter read as several short runs was left
        // unfolded, or folded short, below `min_rows` (and misreported).
        // A stable sort of rows already in order is one linear pass.
        locked.sort_by(|a, b| group_key(a).cmp(&group_key(b)).then(a.slot.cmp(&b.slot)));
        let mut stats = CompactStats {
            rows_before: locked.len() as u64,
            rows_after: locked.len() as u64,
            batches: 1,
            ..CompactStats::default()
        };
        // Sorted, a counter's rows are adjacent (the lock read only the
        // slots folded).
        let target = self.slots.target();
        let mut victims: Vec<SlotRow<I>> = Vec::new();
        // Folded counters that have no target row yet: folding creates one.
        let mut without_target = BTreeSet::new();
        for group in locked.chunk_by(same_counter) {
            // A total beyond half the slot cap stays spread: one slot holding
            // it would pass the cap that keeps every sum within `i64` (see
            // `crate::settle`). The deletion on PostgreSQL and SQLite leaves
            // it by the same rule.
            let total: i128 = group.iter().map(|r| i128::from(r.value)).sum();
            let foldable = total.unsigned_abs() <= (sql::SLOT_CAP / 2).unsigned_abs() as u128;
            if group.len() >= self.min_rows && foldable {
                victims.extend(group.iter().filter(|r| r.slot != target).cloned());
                if group.iter().all(|r| r.slot != target) {
                    without_target.insert(owned_group(&group[0]));
                }
            }
        }
        if victims.is_empty() {
            return Ok(stats);
        }
        let mut deleted = self.delete(txn, &victims).await?;
        deleted.sort_by(|a, b| group_key(a).cmp(&group_key(b)));
        let mut rows = Vec::new();
        for group in deleted.chunk_by(same_counter) {
            let sum = group
                .iter()
                .try_fold(0i64, |sum, r| sum.checked_add(r.value))
                .ok_or_else(|| {
                    CounterError::Overflow {
                        context: format!("the folded slots of `{}` in `{table}`", group[0].key),
                    }
                    .into_db_err()
                })?;
            stats.counters_folded += 1;
            // A row written after the lock read can be deleted (and
            // folded) too, so the figure is kept from going below zero.
            stats.rows_after = stats.rows_after.saturating_sub(group.len() as u64);
            if sum != 0 {
                if without_target.contains(&owned_group(&group[0])) {
                    stats.rows_after += 1;
                }
                rows.push(UpsertRow {
                    owner: group[0].owner.clone().into(),
                    key: group[0].key.clone(),
                    bucket: group[0].bucket,
                    slot: target,
                    delta: sum,
                });
            }
        }
        for chunk in rows.chunks(sql::UPSERT_ROWS_PER_STATEMENT) {
            txn.execute_raw(sql::add_rows(self.dialect, table, chunk.to_vec()))
                .await?;
        }
        Ok(stats)
    }

    /// Deletes the rows to fold and returns them with their values as
    /// deleted: `DELETE .. RETURNING` of every foldable row on PostgreSQL
    /// and SQLite; on MySQL, exactly the locked `victims`, checked.
    async fn delete<C: ConnectionTrait>(
        &self,
        txn: &C,
        victims: &[SlotRow<I>],
    ) -> Result<Vec<SlotRow<I>>, DbErr> {
        let (table, layout) = (self.table.as_str(), self.layout);
        let deletion = sql::fold_deletion(self.dialect, table, layout, &self.scope(), victims);
        match deletion {
            sql::FoldDeletion::Returning(stmt) => txn
                .query_all_raw(stmt)
                .await?
                .iter()
                .map(|row| SlotRow::decode(row, layout).map_err(CounterError::into_db_err))
                .collect(),
            sql::FoldDeletion::Exactly(chunks) => {
                for (stmt, rows) in chunks {
                    let done = txn.execute_raw(stmt).await?;
                    if done.rows_affected() != rows {
                        // Locked rows cannot vanish; if they did, fold nothing.
                        return Err(DbErr::Custom(format!(
                            "compaction of `{table}` deleted {} of the {rows} rows it had locked; rolled back",
                            done.rows_affected(),
                        )));
                    }
                }
                Ok(victims.to_vec())
            }
        }
    }
}

impl CompactStats {
    fn add(&mut self, batch: CompactStats) {
        self.rows_before += batch.rows_before;
        self.rows_after += batch.rows_after;
        self.counters_folded += batch.counters_folded;
        self.batches += batch.batches;
    }
}

fn same_counter<I: Eq>(a: &SlotRow<I>, b: &SlotRow<I>) -> bool {
    a.owner == b.owner && a.key == b.key && a.bucket == b.bucket
}

fn group_key<I: Ord>(row: &SlotRow<I>) -> (&I, &str, Option<i64>) {
    (&row.owner, &row.key, row.bucket)
}

fn owned_group<I: Clone>(row: &SlotRow<I>) -> (I, String, Option<i64>) {
    (row.owner.clone(), row.key.clone(), row.bucket)
}
