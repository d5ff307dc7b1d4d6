//! Members observed through the buffer: hashed by the caller, merged in
//! memory into one sketch per counter (and bucket), and flushed by merging
//! each into its row of the sketch table.
//!
//! Unlike deltas, sketches need no ledger: merging is idempotent, so a
//! flush retried after a lost `COMMIT` reply, or sent twice, changes
//! nothing the second time, and a failed flush's sketches simply go back
//! into the pending ones. That also makes reads simple: a read merges the
//! stored sketch with what is pending and in flight (both under one lock,
//! so a sketch is never between the two), and a member counted in two of
//! them still counts once.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
};

use sea_orm::DatabaseConnection;

use crate::{
    CounterError, CounterTable,
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
    sketches: HashMap<SketchId, Sketch>,
    /// Each table's configuration (slots, sketch table) and owner column.
    tables: HashMap<String, (CounterTable, OwnerColumn)>,
    /// Members observed into these sketches.
    pub members: u64,
}

impl Sketches {
    /// Distinct sketches.
    pub fn len(&self) -> usize {
        self.sketches.len()
    }

    /// Merges `other` in: a failed flush's sketches back into the pending.
    fn absorb(&mut self, other: &Sketches) {
        for (id, sketch) in &other.sketches {
            self.sketches.entry(id.clone()).or_default().merge(sketch);
        }
        for (name, table) in &other.tables {
            self.tables
                .entry(name.clone())
                .or_insert_with(|| table.clone());
        }
        self.members += other.members;
    }

    /// The merges that write `ids` (every sketch when `None`).
    fn merges(&self, dialect: Dialect, only: Option<&SketchId>) -> Merges {
        let mut cells = Vec::with_capacity(self.sketches.len());
        for (id, sketch) in &self.sketches {
            if only.is_some_and(|only| only != id) {
                continue;
            }
            let Some((table, column)) = self.tables.get(&id.table) else {
                continue;
            };
            let owner = id.owner.to_value(*column);
            let cell = unique::cell(table, dialect, owner, &id.key, id.bucket);
            cells.push((table, cell, sketch.clone()));
        }
        Merges::new(dialect, cells)
    }

    /// Merges every sketch into its row, in one transaction.
    pub async fn write(&self, db: &DatabaseConnection, dialect: Dialect) -> Result<()> {
        self.merges(dialect, None).write(db).await
    }

    /// Writes the sketches one by one, setting aside those whose stored
    /// row cannot be read ([`CounterError::BadSketch`]: a row written by
    /// hand or by a newer format), which no retry can merge into; each is
    /// logged at `error`. Returns how many were set aside, or the first
    /// other error.
    pub async fn write_each(&self, db: &DatabaseConnection, dialect: Dialect) -> Result<u64> {
        let mut rejected = 0;
        for id in self.sketches.keys() {
            match self.merges(dialect, Some(id)).write(db).await {
                Ok(()) => {}
                Err(error @ CounterError::BadSketch { .. }) => {
                    rejected += 1;
                    tracing::error!(
                        table = %id.table,
                        owner = ?id.owner,
                        key = %id.key,
                        bucket = id.bucket,
                        %error,
                        "counter buffer: a stored sketch cannot be read; this flush's members of it are set aside"
                    );
                }
                Err(other) => return Err(other),
            }
        }
        Ok(rejected)
    }
}

/// What the lock holds: the pending sketches and the flush under way.
#[derive(Debug, Default)]
struct Held {
    pending: Sketches,
    in_flight: Option<Arc<Sketches>>,
}

/// The buffer's pending sketches, behind one lock: an observe holds it
/// for a register update (the member is hashed before), so 64 writers of
/// one hot owner wait on each other for nanoseconds, not for a row lock.
#[derive(Debug)]
pub(super) struct PendingSketches {
    held: Mutex<Held>,
    capacity: usize,
}

/// Why an observe was not taken.
pub(super) enum SketchRefused {
    Full,
    /// The buffer holds the table in another region (or none).
    Mismatch,
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

    fn lock(&self) -> MutexGuard<'_, Held> {
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
        let pending = &mut held.pending;
        let new = ids
            .iter()
            .filter(|id| !pending.sketches.contains_key(*id))
            .count();
        if new > 0 && pending.sketches.len() + new > self.capacity {
            return Err(SketchRefused::Full);
        }
        match pending.tables.get(table.name()) {
            // Its members would go to the slots of the first one's region.
            Some((known, _)) if known.region() != table.region() => {
                return Err(SketchRefused::Mismatch);
            }
            Some(_) => {}
            None => {
                pending
                    .tables
                    .insert(table.name().to_owned(), (table.clone(), column));
            }
        }
        for id in ids {
            pending.sketches.entry(id).or_default().insert_hash(hash);
        }
        pending.members += 1;
        Ok(pending.sketches.len())
    }

    /// Everything pending, taken for a flush and kept readable as in
    /// flight, in one step; `None` when nothing is pending.
    pub fn drain(&self) -> Option<Arc<Sketches>> {
        let mut held = self.lock();
        if held.pending.sketches.is_empty() {
            return None;
        }
        let drained = Arc::new(std::mem::take(&mut held.pending));
        held.in_flight = Some(drained.clone());
        Some(drained)
    }

    /// The flush under way committed: no longer in flight.
    pub fn committed(&self) {
        self.lock().in_flight = None;
    }

    /// The flush under way failed: its sketches pending again, in one step.
    pub fn restore(&self) {
        let mut held = self.lock();
        if let Some(failed) = held.in_flight.take() {
            held.pending.absorb(&failed);
        }
    }

    /// Distinct sketches pending.
    pub fn len(&self) -> usize {
        self.lock().pending.len()
    }

    /// Whether `capacity` sketches are pending.
    pub fn is_full(&self) -> bool {
        self.len() >= self.capacity
    }

    /// The most sketches pending at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// What is pending and in flight for `id`, merged into `into`.
    pub fn merge_into(&self, id: &SketchId, into: &mut Sketch) {
        let held = self.lock();
        if let Some(sketch) = held.pending.sketches.get(id) {
            into.merge(sketch);
        }
        if let Some(sketch) = held.in_flight.as_ref().and_then(|f| f.sketches.get(id)) {
            into.merge(sketch);
        }
    }
}
