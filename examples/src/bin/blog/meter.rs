//! How many SQL statements each phase of the run used, counted through
//! sea-orm's metric callback: the number the slotted design is judged by.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use sea_orm::DatabaseConnection;

/// Counts the statements sea-orm reports through its metric callback.
///
/// Every statement sea-orm runs is reported, on the pool and in
/// transactions, failed ones included; BEGIN/COMMIT/ROLLBACK and
/// `execute_unprepared` are not. The counters are shared so that the
/// callback, which outlives any borrow, and the phases read the same ones.
#[derive(Clone, Default)]
pub struct Meter {
    statements: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

impl Meter {
    /// Must run before the connection is cloned: clones share the pool and
    /// its callback.
    pub fn install(&self, db: &mut DatabaseConnection) {
        let meter = self.clone();
        db.set_metric_callback(move |info| {
            meter.statements.fetch_add(1, Ordering::Relaxed);
            if info.failed {
                meter.failed.fetch_add(1, Ordering::Relaxed);
            }
        });
    }

    /// Statements so far, to count those of a step finer than a phase by
    /// difference.
    pub fn statements(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }

    /// (statements, failed) so far. Relaxed loads are enough: a phase ends
    /// after its tasks have been awaited, which orders their increments
    /// before the read.
    fn read(&self) -> (u64, u64) {
        (self.statements(), self.failed.load(Ordering::Relaxed))
    }
}

/// One row of the phase table.
#[derive(Clone)]
pub struct Phase {
    pub name: &'static str,
    pub statements: u64,
    /// Failed statements: conflicts the library retried show up here, so
    /// contention is visible even when every write finally succeeds.
    pub failed: u64,
    pub elapsed: Duration,
}

/// Snapshots of the meter and the clock, one per phase, so each phase is
/// charged only its own statements and time.
pub struct Phases<'a> {
    meter: &'a Meter,
    last: (u64, u64),
    started: Instant,
    done: Vec<Phase>,
}

impl<'a> Phases<'a> {
    pub fn new(meter: &'a Meter) -> Self {
        Self {
            meter,
            last: meter.read(),
            started: Instant::now(),
            done: Vec::new(),
        }
    }

    /// Ends the current phase and starts the next. Returns the phase so the
    /// caller can derive rates from it (actions per second, statements per
    /// action).
    pub fn end(&mut self, name: &'static str) -> Phase {
        let now = self.meter.read();
        let phase = Phase {
            name,
            statements: now.0 - self.last.0,
            failed: now.1 - self.last.1,
            elapsed: self.started.elapsed(),
        };
        self.last = now;
        self.started = Instant::now();
        self.done.push(phase.clone());
        phase
    }

    /// The phases ended so far, in order.
    pub fn done(&self) -> &[Phase] {
        &self.done
    }
}
