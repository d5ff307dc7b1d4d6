//! A consumer's counters, readable from any task while it runs.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

/// What a consumer did since it started; from [`Consumer::stats`](crate::Consumer::stats)
/// or a [`StatsHandle`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerStats {
    /// Transactions committed.
    pub batches: u64,
    /// Deliveries received (redeliveries included).
    pub messages: u64,
    /// Messages whose deltas were applied.
    pub applied: u64,
    /// Messages skipped because their id was applied before (redeliveries,
    /// duplicate publishes, replays).
    pub duplicates_skipped: u64,
    /// Messages refused for good (malformed, unknown table, key or owner,
    /// overflow): terminated or dead-lettered, never retried.
    pub rejected: u64,
    /// Deliveries the broker marked as delivered before.
    pub redeliveries: u64,
    /// Batch attempts that failed and were retried (database or broker
    /// trouble).
    pub failed_attempts: u64,
    /// SQL statements of committed batches, `BEGIN` and `COMMIT` included.
    pub statements: u64,
    /// Acknowledgements that failed after a commit (the broker redelivers;
    /// the dedup table skips).
    pub ack_failures: u64,
    /// Dedup rows pruned.
    pub pruned: u64,
    /// Messages waiting in the broker after the last fetch: JetStream's
    /// pending count, sent with every delivery (0 after a fetch that
    /// brought nothing); RabbitMQ's ready messages in the queue, asked at
    /// most once a second, while idle too. `None` until the first fetch
    /// ended, or when the broker would not say.
    pub lag: Option<u64>,
}

/// A clonable view of a running consumer's [`ConsumerStats`].
#[derive(Debug, Clone, Default)]
pub struct StatsHandle(pub(crate) Arc<Meter>);

impl StatsHandle {
    /// The counters now.
    pub fn get(&self) -> ConsumerStats {
        self.0.snapshot()
    }
}

#[derive(Debug, Default)]
pub(crate) struct Meter {
    pub batches: AtomicU64,
    pub messages: AtomicU64,
    pub applied: AtomicU64,
    pub duplicates_skipped: AtomicU64,
    pub rejected: AtomicU64,
    pub redeliveries: AtomicU64,
    pub failed_attempts: AtomicU64,
    pub statements: AtomicU64,
    pub ack_failures: AtomicU64,
    pub pruned: AtomicU64,
    /// [`ConsumerStats::lag`] + 1; 0 for `None`.
    pub lag: AtomicU64,
}

impl Meter {
    pub fn bump(counter: &AtomicU64, by: u64) {
        counter.fetch_add(by, Ordering::Relaxed);
    }

    /// Records the lag (`None`: unknown).
    pub fn set_lag(&self, lag: Option<u64>) {
        let stored = lag.map_or(0, |lag| lag.saturating_add(1));
        self.lag.store(stored, Ordering::Relaxed);
    }

    fn snapshot(&self) -> ConsumerStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ConsumerStats {
            batches: get(&self.batches),
            messages: get(&self.messages),
            applied: get(&self.applied),
            duplicates_skipped: get(&self.duplicates_skipped),
            rejected: get(&self.rejected),
            redeliveries: get(&self.redeliveries),
            failed_attempts: get(&self.failed_attempts),
            statements: get(&self.statements),
            ack_failures: get(&self.ack_failures),
            pruned: get(&self.pruned),
            lag: get(&self.lag).checked_sub(1),
        }
    }
}
