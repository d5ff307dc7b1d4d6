//! Merging sketches into their rows: the one write path of unique counts
//! (`observe`, batches, the buffer's flush, queue consumers).

use std::{collections::HashMap, sync::Arc};

use sea_orm::{ConnectionTrait, DbErr, TransactionSession, TransactionTrait};

use super::Sketch;
use crate::{
    CounterError, CounterTable, detach,
    error::Result,
    observe::{self, Touched},
    owner::SortOwner,
    retry,
    sql::{
        Dialect,
        sketches::{self, LockedCell, SketchCell},
    },
};

/// Sketches to merge into their rows, in the order the rows are locked:
/// by sketch table, then primary key, so two writers never wait on each
/// other's rows in opposite orders.
#[derive(Debug, Clone)]
pub(crate) struct Merges {
    dialect: Dialect,
    cells: Vec<(String, SketchCell, Sketch)>,
    /// The owners merged into, by counter table: what a cache in front of
    /// the table forgets once the merges commit.
    touched: Touched,
}

impl Merges {
    /// The merges of `cells` (counter table, row of its sketch table,
    /// sketch); empty sketches are dropped, the rest sorted.
    pub(crate) fn new(dialect: Dialect, cells: Vec<(&CounterTable, SketchCell, Sketch)>) -> Self {
        let mut touched = Touched::new();
        if observe::active() {
            for (table, cell, sketch) in &cells {
                if !sketch.is_empty() {
                    touched.touch(table.name(), [cell.owner.clone()]);
                }
            }
        }
        let mut cells: Vec<(String, SketchCell, Sketch)> = cells
            .into_iter()
            .filter(|(_, _, sketch)| !sketch.is_empty())
            .filter_map(|(table, cell, sketch)| Some((table.sketch_table()?, cell, sketch)))
            .collect();
        cells.sort_by(|(ta, a, _), (tb, b, _)| {
            (ta, SortOwner::of(&a.owner), &a.key, a.bucket, a.slot).cmp(&(
                tb,
                SortOwner::of(&b.owner),
                &b.key,
                b.bucket,
                b.slot,
            ))
        });
        // One cell per row: the same row twice in one upsert is refused.
        cells.dedup_by(|(tb, b, later), (ta, a, kept)| {
            let same = ta == tb && a.key() == b.key();
            if same {
                kept.merge(later);
            }
            same
        });
        Self {
            dialect,
            cells,
            touched,
        }
    }

    /// The owners merged into (see the field).
    pub(crate) fn touched(&self) -> &Touched {
        &self.touched
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    /// Rows merged into.
    pub(crate) fn len(&self) -> usize {
        self.cells.len()
    }

    /// The sketch tables written, for errors naming a missing one.
    pub(crate) fn tables(&self) -> Vec<&str> {
        let mut tables: Vec<&str> = self.cells.iter().map(|(t, _, _)| t.as_str()).collect();
        tables.dedup();
        tables
    }

    /// Runs the merges on `db` in a transaction of their own (retried
    /// whole after a conflict on a pool, where it runs in a task of its
    /// own: see `detach`), or in a savepoint of the caller's transaction.
    pub(crate) async fn write<C>(self, db: &C) -> Result<()>
    where
        C: ConnectionTrait + TransactionTrait,
    {
        if self.is_empty() {
            return Ok(());
        }
        let work = Arc::new(self);
        let tables: Vec<String> = work.tables().into_iter().map(str::to_owned).collect();
        let names: Vec<&str> = tables.iter().map(String::as_str).collect();
        retry::run_on(db, names[0], &names, || {
            let work = work.clone();
            async move {
                match detach::detached(db) {
                    Some(pool) => {
                        let options = work.dialect.batch_transaction();
                        pool.run(move |pool| async move {
                            let txn = pool.begin_with_options(options).await?;
                            work.apply(&txn).await?;
                            // Told whatever the outcome: a commit whose
                            // reply was lost may have applied.
                            let done = txn.commit().await;
                            work.touched.clone().committed().await;
                            done
                        })
                        .await
                    }
                    None => {
                        let txn = db.begin().await?;
                        work.apply(&txn).await?;
                        let done = txn.commit().await;
                        work.touched.clone().wrote(retry::is_pool::<C>()).await;
                        done
                    }
                }
            }
        })
        .await
    }

    /// Runs the merges on `txn`, a connection inside a transaction: each
    /// sketch table's cells in chunks of [`CHUNK_CELLS`], each chunk a few
    /// statements whatever its size (see [`merge_chunk`]).
    pub(crate) async fn apply<C: ConnectionTrait>(&self, txn: &C) -> Result<(), DbErr> {
        for table in self.cells.chunk_by(|(a, _, _), (b, _, _)| a == b) {
            for chunk in table.chunks(CHUNK_CELLS) {
                merge_chunk(txn, self.dialect, &chunk[0].0, chunk).await?;
            }
        }
        Ok(())
    }
}

/// Cells merged by one round of set statements: 5 parameters each, and
/// up to 12 kB of sketch each, so a chunk's statements stay far below
/// every backend's parameter limit and MySQL's default packet size.
const CHUNK_CELLS: usize = 256;

/// Merges the sketches of `cells` (one sketch table's, sorted, no cell
/// twice) into their rows in a few statements: every row that exists read
/// and locked at once, in primary-key order; the missing ones inserted at
/// once with their sketch ("do nothing" on conflict) and read locked
/// again; the merged rows that changed written back in one upsert. A cell
/// whose row the second read still does not return byte for byte (a
/// case-insensitive collation matched another spelling, or a compaction
/// deleted it meanwhile) is merged alone by [`merge_into`], where the
/// database decides which row is its.
async fn merge_chunk<C: ConnectionTrait>(
    txn: &C,
    dialect: Dialect,
    table: &str,
    cells: &[(String, SketchCell, Sketch)],
) -> Result<(), DbErr> {
    let like = &cells[0].1.owner;
    let lock = |cells: &mut dyn Iterator<Item = &SketchCell>| {
        let statement = sketches::lock_cells(dialect, table, cells);
        async move {
            let mut locked = HashMap::new();
            for row in txn.query_all_raw(statement).await? {
                let row = LockedCell::decode(&row, like).map_err(CounterError::carry)?;
                locked.insert(row.key, row.sketch);
            }
            Ok::<_, DbErr>(locked)
        }
    };
    let mut changed: Vec<(&SketchCell, Vec<u8>)> = Vec::new();
    let mut locked = lock(&mut cells.iter().map(|(_, cell, _)| cell)).await?;
    let mut missing = Vec::new();
    for (_, cell, sketch) in cells {
        match locked.remove(&cell.key()) {
            Some(bytes) => changed.extend(merged(table, &bytes, sketch)?.map(|b| (cell, b))),
            None => missing.push((cell, sketch)),
        }
    }
    let mut alone = Vec::new();
    if !missing.is_empty() {
        let insert = missing
            .iter()
            .map(|(cell, sketch)| (*cell, sketch.to_bytes()));
        txn.execute_raw(sketches::insert_cells(dialect, table, insert))
            .await?;
        let mut locked = lock(&mut missing.iter().map(|(cell, _)| *cell)).await?;
        for (cell, sketch) in missing {
            // Inserted with its sketch by this transaction, or by a
            // concurrent writer first: merged either way (a merge that
            // changes nothing writes nothing).
            match locked.remove(&cell.key()) {
                Some(bytes) => changed.extend(merged(table, &bytes, sketch)?.map(|b| (cell, b))),
                None => alone.push((cell, sketch)),
            }
        }
    }
    if !changed.is_empty() {
        txn.execute_raw(sketches::write_cells(dialect, table, changed))
            .await?;
    }
    for (cell, sketch) in alone {
        merge_into(txn, dialect, table, cell, sketch).await?;
    }
    Ok(())
}

/// The stored sketch `bytes` (of `table`) merged with `sketch`, if that
/// changed a register: what is written back.
fn merged(table: &str, bytes: &[u8], sketch: &Sketch) -> Result<Option<Vec<u8>>, DbErr> {
    let mut stored = Sketch::from_bytes(bytes).map_err(|source| {
        CounterError::BadSketch {
            table: table.to_owned(),
            source,
        }
        .carry()
    })?;
    Ok(stored.merge(sketch).then(|| stored.to_bytes()))
}

/// Merges `sketch` into the row `cell` of `table`, creating it if needed:
/// the row locked (`FOR UPDATE`), merged, written back only if a register
/// changed.
async fn merge_into<C: ConnectionTrait>(
    txn: &C,
    dialect: Dialect,
    table: &str,
    cell: &SketchCell,
    sketch: &Sketch,
) -> Result<(), DbErr> {
    let lock = sketches::lock_cell(dialect, table, cell);
    let mut found = txn.query_one_raw(lock.clone()).await?;
    // A missing row is inserted, then read locked. A concurrent writer may
    // create it first: then the insert does nothing and the read finds
    // theirs. A compaction may delete it between the insert (which takes
    // no lock on a row that exists, on PostgreSQL) and the read: then once
    // more. Three rounds: a compaction deletes a counter's rows once.
    for _ in 0..3 {
        if found.is_some() {
            break;
        }
        let insert = sketches::insert_cell(dialect, table, cell, sketch.to_bytes());
        txn.execute_raw(insert).await?;
        found = txn.query_one_raw(lock.clone()).await?;
    }
    let Some(row) = found else {
        return Err(DbErr::RecordNotFound(format!(
            "a sketch row of `{table}`, deleted three times while it was written"
        )));
    };
    let bytes: Vec<u8> = row.try_get("", sketches::SKETCH)?;
    if let Some(bytes) = merged(table, &bytes, sketch)? {
        let update = sketches::update_cell(dialect, table, cell, bytes);
        txn.execute_raw(update).await?;
    }
    Ok(())
}
