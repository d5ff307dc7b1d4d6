//! What a buffer has done, for dashboards and alerts.

use std::{
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

/// A snapshot of a [`CounterBuffer`](super::CounterBuffer)'s work, from
/// [`CounterBuffer::stats`](super::CounterBuffer::stats).
///
/// `pending_adds` is what a crash would lose right now (see the durability
/// contract on [`CounterBuffer`](super::CounterBuffer)); `last_error` and a
/// growing `failed_attempts` mean flushes are failing and being retried.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BufferStats {
    /// `add` calls accepted since the buffer started.
    pub adds: u64,
    /// Accepted `add` calls not yet committed to the database (pending or
    /// in a flush under way). Read while a flush takes them, it may for a
    /// moment miss some: a snapshot is not taken under one lock.
    pub pending_adds: u64,
    /// Distinct counters waiting for the next flush.
    pub pending_counters: usize,
    /// Distinct counters in the flush under way (0 between flushes).
    pub in_flight_counters: usize,
    /// The most distinct counters that were ever pending at once.
    pub peak_pending_counters: usize,
    /// Flushes committed.
    pub flushes: u64,
    /// Counter rows (totals and buckets) those flushes upserted.
    pub rows_written: u64,
    /// Statements those flushes sent, `BEGIN` and `COMMIT` included, failed
    /// attempts too.
    pub statements: u64,
    /// Flush attempts that failed and were retried.
    pub failed_attempts: u64,
    /// Retried flushes that the ledger showed had committed already (their
    /// `COMMIT` reply was lost), so they were not applied again.
    pub replays_skipped: u64,
    /// Deltas the database refused for good (a slot value would leave
    /// `i64`): set aside after the rest of their flush was applied, each
    /// logged at `error` with its counter. Never applied, never retried.
    pub rejected_deltas: u64,
    /// `add` calls that found the buffer full of distinct counters and
    /// waited (or failed, with [`WhenFull::Fail`](super::WhenFull::Fail)).
    pub full_waits: u64,
    /// The last flush's time from the start of its first attempt to its
    /// commit.
    pub last_flush_time: Option<Duration>,
    /// The last failed attempt's error, cleared by the next success.
    pub last_error: Option<String>,
    /// Members observed into unique keys ([`CounterBuffer::observe`](super::CounterBuffer::observe))
    /// and committed in a flush of their sketches.
    pub committed_members: u64,
    /// Sketches (one per unique counter and bucket) waiting for a flush.
    pub pending_sketches: usize,
    /// Sketches merged into the sketch tables by flushes.
    pub flushed_sketches: u64,
    /// Sketches set aside: their stored row could not be read
    /// ([`CounterError::BadSketch`](crate::CounterError::BadSketch)), or
    /// they could not be flushed at shutdown. Each is logged at `error`.
    pub rejected_sketches: u64,
}

/// The counters behind [`BufferStats`], updated by the flusher and by `add`.
#[derive(Debug, Default)]
pub(super) struct Meter {
    pub in_flight_counters: AtomicUsize,
    pub peak_pending: AtomicUsize,
    pub flushes: AtomicU64,
    pub rows_written: AtomicU64,
    pub statements: AtomicU64,
    pub failed_attempts: AtomicU64,
    pub replays_skipped: AtomicU64,
    pub rejected_deltas: AtomicU64,
    pub full_waits: AtomicU64,
    pub committed_members: AtomicU64,
    pub flushed_sketches: AtomicU64,
    pub rejected_sketches: AtomicU64,
    pub last_flush_micros: AtomicU64,
    pub last_error: Mutex<Option<String>>,
}

impl Meter {
    pub fn bump(counter: &AtomicU64, by: u64) {
        counter.fetch_add(by, Ordering::Relaxed);
    }

    /// Records a failed attempt: the error first, then the count, so that a
    /// reader who sees `failed_attempts` grow also sees `last_error` name it.
    pub fn failed(&self, error: String) {
        self.set_error(Some(error));
        self.failed_attempts.fetch_add(1, Ordering::Release);
    }

    pub fn set_error(&self, error: Option<String>) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = error;
    }

    /// The snapshot, given the adds taken since the start and those the
    /// shards and the flush under way hold.
    pub fn snapshot(
        &self,
        accepted_adds: u64,
        waiting_adds: u64,
        in_flight_adds: u64,
        pending: usize,
        pending_sketches: usize,
    ) -> BufferStats {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let pending_adds = waiting_adds + in_flight_adds;
        let micros = load(&self.last_flush_micros);
        BufferStats {
            adds: accepted_adds,
            pending_adds,
            pending_counters: pending,
            in_flight_counters: self.in_flight_counters.load(Ordering::Relaxed),
            peak_pending_counters: self.peak_pending.load(Ordering::Relaxed),
            flushes: load(&self.flushes),
            rows_written: load(&self.rows_written),
            statements: load(&self.statements),
            failed_attempts: self.failed_attempts.load(Ordering::Acquire),
            replays_skipped: load(&self.replays_skipped),
            rejected_deltas: load(&self.rejected_deltas),
            full_waits: load(&self.full_waits),
            last_flush_time: (micros > 0).then(|| Duration::from_micros(micros)),
            last_error: self
                .last_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            committed_members: load(&self.committed_members),
            pending_sketches,
            flushed_sketches: load(&self.flushed_sketches),
            rejected_sketches: load(&self.rejected_sketches),
        }
    }
}
