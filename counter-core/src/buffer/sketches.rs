//! Members observed through the buffer: hashed by the caller, merged in
//! memory into one sketch per counter (and bucket), and flushed by merging
//! each into its row of the sketch table.
//!
//! Unlike deltas, sketches need no ledger: merging is idempotent, so a
//! flush retried after a lost `COMMIT` reply, or sent twice, changes
//! nothing the second time. That also makes reads simple: a read merges the
//! stored sketch with what is pending and in flight, and a member counted
//! in two of them still counts once.

use std::{
    collections::HashMap,
    sync::{
        Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
};

use sea_orm::DatabaseConnection;

use crate::{
    CounterTable,
    error::Result,
    owner::{OwnerColumn, SortOwner},
    sql::Dialect,
    unique::{self, Merges, Sketch},
};

/// One pending sketch: a counter of a table, in a bucket
/// ([`ALL_TIME`](crate::sql::sketches::ALL_TIME) for its all-time sketch).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct SketchId {
    pub table: String,
    pub owner: SortOwner,
    pub key: String,
    pub bucket: i64,
}

/// Sketches waiting for a flush, or being flushed.
#[derive(Debug, Default)]
pub(super) struct Sketches {
    pub sketches: HashMap<SketchId, Sketch>,
    /// Each table's configuration (slots, sketch table) and owner column.
    tables: HashMap<String, (CounterTable, OwnerColumn)>,
    /// Members observed into these sketches.
    pub members: u64,
}

impl Sketches {
    /// The sketch pending for `id`, if any.
    pub fn get(&self, id: &SketchId) -> Option<&Sketch> {
        self.sketches.get(id)
    }

    /// Merges every sketch into its row, in one transaction.
    pub async fn write(&self, db: &DatabaseConnection, dialect: Dialect) -> Result<()> {
        let mut cells = Vec::with_capacity(self.sketches.len());
        for (id, sketch) in &self.sketches {
            let Some((table, column)) = self.tables.get(&id.table) else {
                continue;
            };
            let owner = id.owner.to_value(*column);
            let cell = unique::cell(table, dialect, owner, &id.key, id.bucket);
            cells.push((table, cell, sketch.clone()));
        }
        Merges::new(dialect, cells).write(db).await
    }
}

/// The buffer's pending sketches, behind one lock: an observe holds it
/// for a register update (the member is hashed before), so 64 writers of
/// one hot owner wait on each other for nanoseconds, not for a row lock.
#[derive(Debug)]
pub(super) struct PendingSketches {
    held: Mutex<Sketches>,
    capacity: usize,
}

/// Why an observe was not taken.
pub(super) enum SketchRefused {
    Full,
    /// The buffer is shutting down: its last drain may have run.
    Closed,
}

impl PendingSketches {
    pub fn new(capacity: usize) -> Self {
        Self {
            held: Mutex::default(),
            capacity,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Sketches> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Merges a member's `hash` into each of `ids`' sketches; refused when
    /// they are new and `capacity` sketches are pending, or once `closing`
    /// (checked under the lock the last drain takes, so no observe is left
    /// behind it). The sketches pending after it.
    pub fn observe(
        &self,
        table: &CounterTable,
        column: OwnerColumn,
        ids: Vec<SketchId>,
        hash: u64,
        closing: &AtomicBool,
    ) -> Result<usize, SketchRefused> {
        let mut held = self.lock();
        if closing.load(Ordering::SeqCst) {
            return Err(SketchRefused::Closed);
        }
        let new = ids
            .iter()
            .filter(|id| !held.sketches.contains_key(*id))
            .count();
        if new > 0 && held.sketches.len() + new > self.capacity {
            return Err(SketchRefused::Full);
        }
        if !held.tables.contains_key(table.name()) {
            held.tables
                .insert(table.name().to_owned(), (table.clone(), column));
        }
        for id in ids {
            held.sketches.entry(id).or_default().insert_hash(hash);
        }
        held.members += 1;
        Ok(held.sketches.len())
    }

    /// Everything pending, taken for a flush.
    pub fn drain(&self) -> Sketches {
        std::mem::take(&mut *self.lock())
    }

    /// Distinct sketches pending.
    pub fn len(&self) -> usize {
        self.lock().sketches.len()
    }

    /// The sketch pending for `id`, merged into `into`.
    pub fn merge_into(&self, id: &SketchId, into: &mut Sketch) {
        if let Some(sketch) = self.lock().get(id) {
            into.merge(sketch);
        }
    }
}
