//! Upkeep of unique counts: compaction merges a counter's slot rows into
//! one, prune drops old buckets' sketches.
//!
//! Both are simpler than their counterparts for deltas because a merge is
//! idempotent: a compaction that locks a counter's rows, merges them into
//! the first and deletes the rest loses nothing to a writer racing it (the
//! writer either waits for the lock and merges into the merged row, or
//! finds its row gone and creates it again with its own members).

use std::{collections::HashSet, sync::Arc};

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, TransactionTrait, Value};

use super::Sketch;
use crate::{
    CompactStats, CounterError, Counters, detach,
    error::Result,
    owner::OwnerId,
    retry,
    sql::{
        self, Dialect,
        sketches::{self, SplitCounter},
    },
    typed::KeySpace,
};

/// Counters a compaction of sketches looks up per query.
const SPLIT_COUNTERS_PER_QUERY: u64 = 500;
/// Counters folded per transaction: one commit for many small folds (a
/// commit per counter made 130,000 rows a matter of minutes), while no
/// writer waits long on the rows a transaction holds.
const FOLDS_PER_TRANSACTION: usize = 32;

impl<I: OwnerId, S: KeySpace> Counters<I, S> {
    /// Merges each unique counter kept in more than one slot row (and each
    /// bucket of one) into one row, [`FOLDS_PER_TRANSACTION`] counters per
    /// short transaction, in primary-key order (the order writers lock
    /// rows in); the part of [`Counters::compact`] for the sketch table. `keys` and
    /// `owners`, if given, limit it to those.
    pub(crate) async fn compact_sketches(
        &self,
        db: &DatabaseConnection,
        keys: Option<&[String]>,
        owners: Option<&[I]>,
    ) -> Result<CompactStats> {
        let mut stats = CompactStats::default();
        let Some(table) = self.table().sketch_table() else {
            return Ok(stats);
        };
        let dialect = Dialect::of(db)?;
        // In a region, its own slots only: merged into its first own slot.
        let slots = sql::FoldSlots::of_region(self.table().region().as_ref());
        // What is there, folded or not: a second compaction reports the
        // rows it found, not 0.
        let in_scope = self
            .count_sketch_rows(db, dialect, &table, keys, owners, slots)
            .await?;
        let keys: Option<HashSet<&str>> = keys.map(|k| k.iter().map(String::as_str).collect());
        let owners: Option<HashSet<&I>> = owners.map(|o| o.iter().collect());
        let mut removed = 0;
        let pool = detach::Detached::pool(db);
        let mut after = None;
        loop {
            let next = sketches::split_counters(
                dialect,
                &table,
                after.take(),
                SPLIT_COUNTERS_PER_QUERY,
                slots,
            );
            let rows = retry::run(db, &table, || detach::query_all(db, next.clone())).await?;
            let Some(last) = rows.last() else {
                break;
            };
            let last = SplitCounter::<I>::decode(last)?;
            let mut folds = Vec::with_capacity(rows.len());
            for row in &rows {
                let counter = SplitCounter::<I>::decode(row)?;
                let in_scope = keys
                    .as_ref()
                    .is_none_or(|k| k.contains(counter.key.as_str()))
                    && owners.as_ref().is_none_or(|o| o.contains(&counter.owner));
                if in_scope {
                    folds.push(Fold {
                        dialect,
                        table: table.clone(),
                        owner: counter.owner.into(),
                        key: counter.key,
                        bucket: counter.bucket,
                        slots,
                    });
                }
            }
            for group in folds.chunks(FOLDS_PER_TRANSACTION) {
                let group = Arc::new(group.to_vec());
                let found = retry::run(db, &table, || {
                    let group = group.clone();
                    let options = dialect.batch_transaction();
                    pool.run(move |pool| async move {
                        let txn = pool.begin_with_options(options).await?;
                        sql::bound_lock_waits(&txn).await?;
                        let mut found = Vec::with_capacity(group.len());
                        for fold in group.iter() {
                            found.push(fold.run(&txn).await?);
                        }
                        txn.commit().await?;
                        Ok(found)
                    })
                })
                .await?;
                for rows in found {
                    if rows > 1 {
                        removed += rows - 1;
                        stats.counters_folded += 1;
                    }
                }
                stats.batches += 1;
            }
            let done = (rows.len() as u64) < SPLIT_COUNTERS_PER_QUERY;
            after = Some((last.owner.into(), last.key, last.bucket));
            if done {
                break;
            }
        }
        stats.rows_before = in_scope.max(removed);
        stats.rows_after = stats.rows_before - removed;
        Ok(stats)
    }

    /// The sketch rows in scope now, in chunks of owners.
    async fn count_sketch_rows(
        &self,
        db: &DatabaseConnection,
        dialect: Dialect,
        table: &str,
        keys: Option<&[String]>,
        owners: Option<&[I]>,
        slots: sql::FoldSlots,
    ) -> Result<u64> {
        let keys = keys.map(<[String]>::to_vec);
        let chunks: Vec<Option<Vec<Value>>> = match owners {
            None => vec![None],
            Some(owners) => owners
                .chunks(1_000)
                .map(|chunk| Some(chunk.iter().cloned().map(Into::into).collect()))
                .collect(),
        };
        let mut rows = 0;
        for owners in chunks {
            let count = sketches::count_rows(dialect, table, keys.clone(), owners, slots);
            let row = retry::run(db, table, || detach::query_one(db, count.clone())).await?;
            let n: i64 = match row {
                Some(row) => row.try_get("", "n").map_err(CounterError::from)?,
                None => 0,
            };
            rows += u64::try_from(n).unwrap_or(0);
        }
        Ok(rows)
    }
}

/// The merge of one counter's slot rows into its first.
#[derive(Clone)]
struct Fold {
    dialect: Dialect,
    table: String,
    owner: Value,
    key: String,
    bucket: i64,
    /// The slots it merges: a region's, or all.
    slots: sql::FoldSlots,
}

impl Fold {
    /// Locks the counter's rows, merges them into the first and deletes
    /// the others; the rows it found.
    async fn run<C: ConnectionTrait>(&self, txn: &C) -> std::result::Result<u64, DbErr> {
        let (dialect, table) = (self.dialect, self.table.as_str());
        let lock = sketches::lock_counter(
            dialect,
            table,
            &self.owner,
            &self.key,
            self.bucket,
            self.slots,
        );
        let rows = txn.query_all_raw(lock).await?;
        let mut slots = Vec::with_capacity(rows.len());
        let mut merged = Sketch::new();
        let mut first = None;
        for row in &rows {
            let slot: i16 = row.try_get("", sql::col::SLOT)?;
            let bytes: Vec<u8> = row.try_get("", sketches::SKETCH)?;
            let sketch = Sketch::from_bytes(&bytes).map_err(|source| {
                CounterError::BadSketch {
                    table: table.to_owned(),
                    source,
                }
                .carry()
            })?;
            merged.merge(&sketch);
            match first {
                None => first = Some((slot, sketch)),
                Some(_) => slots.push(slot),
            }
        }
        let Some((target, mut kept)) = first else {
            return Ok(0);
        };
        if slots.is_empty() {
            return Ok(1);
        }
        if kept.merge(&merged) {
            let cell = sketches::SketchCell {
                owner: self.owner.clone(),
                key: self.key.clone(),
                bucket: self.bucket,
                slot: target,
            };
            txn.execute_raw(sketches::update_cell(
                dialect,
                table,
                &cell,
                kept.to_bytes(),
            ))
            .await?;
        }
        let delete =
            sketches::delete_slots(dialect, table, &self.owner, &self.key, self.bucket, slots);
        txn.execute_raw(delete).await?;
        Ok(rows.len() as u64)
    }
}
