//! The background task: drains the pending deltas every interval (or when
//! woken), and applies each drain exactly once, retrying until it commits.

use std::{
    sync::{
        Arc, Condvar, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, TransactionTrait};
use tokio::sync::{Notify, watch};

use super::{
    Config,
    pending::{CounterId, Delta, Drained, Pending},
    sink::{Flush, FlushSink, FlushedDelta},
    sketches::PendingSketches,
    stats::Meter,
};
use crate::{
    BatchReport, CounterError, DeltaBatch,
    chunks::{self, Chunk, Mode},
    error::Result,
    observe::Touched,
    owner::SortOwner,
    sql::{self, Classified, Dialect, classify},
};

/// The first pause after a failed flush; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The longest one flush attempt may take before it is abandoned (and its
/// outcome left to the ledger).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the ledger is pruned of writers that stopped flushing.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// State shared by the buffer's handles and its flusher.
pub(super) struct Shared {
    pub db: DatabaseConnection,
    pub dialect: Dialect,
    pub config: Config,
    /// This buffer's row in the ledger.
    pub writer: String,
    pub pending: Pending,
    /// The drain being flushed, still counted by reads until it commits.
    pub in_flight: Mutex<Option<Arc<Drained>>>,
    /// Sketches of unique keys waiting for a flush, and being flushed.
    pub sketches: PendingSketches,
    /// Odd while a drain moves deltas from `pending` to `in_flight`: an
    /// [`unflushed`](super::CounterBuffer::unflushed) sum that spans one
    /// could count a delta twice or not at all. A drain is in memory and
    /// short, so a sum that meets one just waits it out.
    pub drain_epoch: AtomicU64,
    /// Odd from a `COMMIT` being sent until `in_flight` is cleared: a
    /// stored total read meanwhile may or may not hold what is in flight.
    /// A read that saw the same even value before and after is exact. Kept
    /// apart from `drain_epoch` because drains come often under load, and
    /// a read that had to start over at every drain could be starved by a
    /// busy flusher (on one SQLite connection it always waits behind one).
    pub commit_epoch: AtomicU64,
    /// Wakes the flusher before its interval ends.
    pub wake: Notify,
    /// Where a blocked `add` waits for a drain.
    pub room: (Mutex<()>, Condvar),
    /// `flush()` calls made; a cycle that starts after one covers it.
    pub requests: AtomicU64,
    /// The last request a finished cycle covered (`u64::MAX` once stopped).
    pub flushed: watch::Sender<u64>,
    pub closing: AtomicBool,
    /// Set once the flusher has flushed everything and stopped; a stop
    /// without it (a panic, a dropped runtime) may have left deltas behind.
    pub stopped_cleanly: AtomicBool,
    pub meter: Meter,
}

impl Shared {
    /// Asks the flusher to drain everything and stop.
    pub fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        self.wake.notify_one();
        self.room_freed();
    }

    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    fn room_freed(&self) {
        let _guard = self.room.0.lock().unwrap_or_else(PoisonError::into_inner);
        self.room.1.notify_all();
    }

    /// Moves deltas from `pending` to `in_flight` under `drain_epoch`.
    /// The epoch is made even again even if the drain panics, so that no
    /// sum waits for it forever.
    fn drain(&self) -> Option<Arc<Drained>> {
        struct Settle<'a>(&'a AtomicU64);
        impl Drop for Settle<'_> {
            fn drop(&mut self) {
                settle(self.0);
            }
        }
        unsettle(&self.drain_epoch);
        let _settle = Settle(&self.drain_epoch);
        let drained = self.pending.drain();
        let drained = (!drained.is_empty()).then(|| Arc::new(drained));
        self.set_in_flight(drained.clone());
        drained
    }

    /// The drain being flushed, if any.
    pub fn in_flight(&self) -> Option<Arc<Drained>> {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_in_flight(&self, drained: Option<Arc<Drained>>) {
        let counters = drained.as_ref().map_or(0, |d| d.counters());
        *self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = drained;
        self.meter
            .in_flight_counters
            .store(counters, Ordering::Relaxed);
    }
}

/// Makes a seqlock epoch odd if it is even: a read started now must wait.
fn unsettle(epoch: &AtomicU64) {
    let _ = epoch.fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| {
        e.is_multiple_of(2).then_some(e + 1)
    });
}

/// Makes a seqlock epoch even (and new) if it is odd.
fn settle(epoch: &AtomicU64) {
    let _ = epoch.fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| {
        (!e.is_multiple_of(2)).then_some(e + 1)
    });
}

/// Spawns the flusher on `runtime`. However its task ends (done, panicked,
/// or dropped with its runtime, even before it first ran), waiters hear of
/// it: the guard is part of the task from the start.
pub(super) fn spawn(runtime: &tokio::runtime::Handle, shared: Arc<Shared>) {
    let stopped = Stopped(shared.clone());
    runtime.spawn(async move {
        let _stopped = stopped;
        run(shared).await;
    });
}

/// The flusher task: runs until the buffer is closed and nothing is left.
async fn run(shared: Arc<Shared>) {
    let mut seq = 0u64;
    let mut next_prune = Instant::now();
    loop {
        if !shared.is_closing() {
            tokio::select! {
                () = tokio::time::sleep(shared.config.interval) => {}
                () = shared.wake.notified() => {}
            }
        }
        let closing = shared.is_closing();
        let request = shared.requests.load(Ordering::SeqCst);
        // Adds check `closing` under the shard locks, so a closing drain
        // must run even when nothing was counted pending a moment ago.
        if closing || shared.pending.counters() > 0 {
            let drained = shared.drain();
            shared.room_freed();
            if let Some(drained) = drained {
                flush(&shared, &mut seq, &drained).await;
                if let Ok(drained) = Arc::try_unwrap(drained) {
                    shared.pending.recycle(drained);
                }
            }
        }
        if closing || shared.sketches.len() > 0 {
            flush_sketches(&shared, closing).await;
        }
        shared.flushed.send_replace(request);
        // The drain started after `closing` was set, and adds check it
        // under the shard locks the drain took: nothing is left behind.
        if closing {
            break;
        }
        if seq > 0 && shared.config.sink.is_none() && Instant::now() >= next_prune {
            prune(&shared).await;
            next_prune = Instant::now() + PRUNE_EVERY;
        }
    }
    if shared.config.sink.is_none() {
        forget(&shared).await;
    }
    shared.stopped_cleanly.store(true, Ordering::SeqCst);
}

/// Attempts of a sketch flush before its sketches go back to the pending
/// ones (to be retried by the next cycle, so that a sketch table that is
/// missing does not hold the deltas' flushes back); at shutdown, before
/// they are given up (counted in `rejected_sketches`, logged at `error`).
const SKETCH_ATTEMPTS: u32 = 3;
const SKETCH_ATTEMPTS_AT_SHUTDOWN: u32 = 10;

/// Merges every pending sketch into the sketch tables: a merge applied
/// twice is the same merge, so a retry after an unknown outcome is safe.
/// Reads merge the sketches from the in-flight set meanwhile. A stored
/// sketch that cannot be read sets aside this flush's sketch of it, not
/// the others'.
async fn flush_sketches(shared: &Shared, closing: bool) {
    let Some(drained) = shared.sketches.drain() else {
        return;
    };
    shared.room_freed();
    let meter = &shared.meter;
    let attempts = if closing {
        SKETCH_ATTEMPTS_AT_SHUTDOWN
    } else {
        SKETCH_ATTEMPTS
    };
    for attempt in 1..=attempts {
        let write = drained.write(&shared.db, shared.dialect);
        let mut result = tokio::time::timeout(ATTEMPT_TIMEOUT, write)
            .await
            .unwrap_or_else(|_| {
                Err(crate::CounterError::Database(DbErr::Custom(format!(
                    "sketch flush attempt timed out after {ATTEMPT_TIMEOUT:?}"
                ))))
            });
        if let Err(crate::CounterError::BadSketch { .. }) = &result {
            result = drained
                .write_each(&shared.db, shared.dialect)
                .await
                .map(|rejected| Meter::bump(&meter.rejected_sketches, rejected));
        }
        match result {
            Ok(()) => {
                Meter::bump(&meter.flushed_sketches, drained.len() as u64);
                Meter::bump(&meter.committed_members, drained.members);
                meter.set_error(None);
                shared.sketches.committed();
                return;
            }
            Err(error) => {
                meter.failed(error.to_string());
                let pause = backoff(attempt);
                tracing::warn!(
                    attempt,
                    sketches = drained.len(),
                    retry_in_ms = pause.as_millis() as u64,
                    %error,
                    "counter buffer: sketch flush failed; its sketches are kept and it will be retried"
                );
                if attempt < attempts {
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }
    if closing {
        Meter::bump(&meter.rejected_sketches, drained.len() as u64);
        tracing::error!(
            sketches = drained.len(),
            members = drained.members,
            "counter buffer: shutting down with sketches that could not be flushed; their members are not counted"
        );
        shared.sketches.committed();
    } else {
        shared.sketches.restore();
    }
}

/// Tells every waiter that the flusher has stopped, however it stopped:
/// done, panicked, or dropped with its runtime. Whether it stopped cleanly
/// is in `stopped_cleanly`.
struct Stopped(Arc<Shared>);

impl Drop for Stopped {
    fn drop(&mut self) {
        self.0.closing.store(true, Ordering::SeqCst);
        self.0.flushed.send_replace(u64::MAX);
        self.0.room_freed();
    }
}

/// Applies `drained` exactly once and clears it from the reads. A counter
/// the database refuses for good (its slot value would leave `i64`) cannot
/// hold the others back: the flush then goes counter by counter, and each
/// refused delta is set aside, counted in [`BufferStats::rejected_deltas`]
/// and logged at `error` with its counter.
///
/// [`BufferStats::rejected_deltas`]: super::BufferStats::rejected_deltas
async fn flush(shared: &Shared, seq: &mut u64, drained: &Drained) {
    let started = Instant::now();
    *seq += 1;
    if let Some(sink) = &shared.config.sink {
        send_to_sink(shared, &*sink.0, *seq, drained).await;
        finish_flush(shared, *seq, drained, started);
        return;
    }
    let everything = statements(shared, drained.iter());
    // The owners flushed, told to cache observers once committed (see
    // `crate::observe`).
    let mut touched = Touched::new();
    if let Ok((_, _, flushed)) = &everything {
        touched.merge(flushed.clone());
    }
    if let Err(refused) = apply(shared, *seq, everything, drained).await {
        tracing::warn!(
            seq = *seq,
            %refused,
            "counter buffer: the database refused the flush for good; flushing its counters one by one"
        );
        let mut rejected = None;
        for (id, delta) in drained.iter() {
            *seq += 1;
            let one = statements(shared, std::iter::once((id, delta)));
            if let Ok((_, _, flushed)) = &one {
                touched.merge(flushed.clone());
            }
            if let Err(refused) = apply(shared, *seq, one, drained).await {
                Meter::bump(&shared.meter.rejected_deltas, 1);
                rejected = Some(format!(
                    "delta {} to `{}` of {:?} in `{}` rejected: {refused}",
                    delta.total, id.key, id.owner, id.table
                ));
                tracing::error!(
                    table = &*id.table,
                    owner = ?id.owner,
                    key = &*id.key,
                    delta = delta.total,
                    %refused,
                    "counter buffer: delta rejected by the database and set aside"
                );
            }
        }
        // The last rejection stays visible until a later flush succeeds.
        if rejected.is_some() {
            shared.meter.set_error(rejected);
        }
    }
    touched.committed().await;
    finish_flush(shared, *seq, drained, started);
}

/// Clears a flushed drain from the reads and counts it.
fn finish_flush(shared: &Shared, seq: u64, drained: &Drained, started: Instant) {
    shared.set_in_flight(None);
    settle(&shared.commit_epoch);
    let meter = &shared.meter;
    let elapsed = started.elapsed();
    meter.last_flush_micros.store(
        u64::try_from(elapsed.as_micros())
            .unwrap_or(u64::MAX)
            .max(1),
        Ordering::Relaxed,
    );
    tracing::debug!(
        seq,
        counters = drained.counters(),
        adds = drained.adds,
        elapsed_ms = elapsed.as_secs_f64() * 1e3,
        "counter buffer: flush committed"
    );
}

/// Sends `drained` as flush `seq` to `sink`, retrying with backoff (the same
/// flush, the same id) until the sink takes it: a delta is never dropped.
async fn send_to_sink(shared: &Shared, sink: &dyn FlushSink, seq: u64, drained: &Drained) {
    let tables = shared.pending.tables();
    let mut deltas: Vec<FlushedDelta> = drained
        .iter()
        .filter(|(_, delta)| delta.total != 0 || delta.buckets.iter().any(|(_, d)| *d != 0))
        .filter_map(|(id, delta)| {
            let known = tables.iter().find(|t| t.name == id.table)?;
            Some(FlushedDelta {
                table: id.table.to_string(),
                owner: id.owner.to_value(known.column),
                key: id.key.to_string(),
                delta: delta.total,
                buckets: delta.buckets.clone(),
            })
        })
        .collect();
    // One order for every attempt, so a sink that splits a flush into
    // messages splits it the same way each time.
    deltas.sort_by(|a, b| {
        (&a.table, SortOwner::of(&a.owner), &a.key).cmp(&(
            &b.table,
            SortOwner::of(&b.owner),
            &b.key,
        ))
    });
    if deltas.is_empty() {
        return;
    }
    let flush = Flush {
        writer: shared.writer.clone(),
        seq,
        deltas,
    };
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let sent = tokio::time::timeout(ATTEMPT_TIMEOUT, sink.send(&flush))
            .await
            .unwrap_or_else(|_| Err(format!("sink timed out after {ATTEMPT_TIMEOUT:?}").into()));
        match sent {
            Ok(()) => {
                Meter::bump(&shared.meter.flushes, 1);
                shared.meter.set_error(None);
                return;
            }
            Err(error) => {
                shared.meter.failed(error.to_string());
                let pause = backoff(attempt);
                tracing::warn!(
                    seq,
                    attempt,
                    counters = drained.counters(),
                    retry_in_ms = pause.as_millis() as u64,
                    %error,
                    "counter buffer: the sink did not take the flush; it is kept and retried"
                );
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// Applies `built` as flush number `seq`, retrying with backoff until it
/// has committed once: its deltas are never dropped, and the ledger keeps a
/// retry of a flush whose `COMMIT` reply was lost from applying it again.
/// The one error returned is a refusal that no retry can change (an
/// overflow, raised before `COMMIT`, so nothing was applied).
async fn apply(
    shared: &Shared,
    seq: u64,
    built: Result<Built>,
    drained: &Drained,
) -> Result<(), DbErr> {
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let mut sent = 0u64;
        let result = match &built {
            Ok((_, chunks, _)) if chunks.is_empty() => Ok(Applied::Nothing),
            Ok((_, chunks, _)) => {
                let attempt = apply_once(shared, seq, chunks, &mut sent);
                // A connection that hangs is an attempt whose outcome is
                // unknown: the ledger settles it on the next one.
                tokio::time::timeout(ATTEMPT_TIMEOUT, attempt)
                    .await
                    .unwrap_or_else(|_| {
                        Err(DbErr::Custom(format!(
                            "flush attempt timed out after {ATTEMPT_TIMEOUT:?}"
                        )))
                    })
            }
            // No retry can build what could not be built (a fold that
            // leaves `i64`): a refusal.
            Err(e) => return Err(DbErr::Custom(e.to_string())),
        };
        Meter::bump(&shared.meter.statements, sent);
        let meter = &shared.meter;
        match result {
            Ok(applied) => {
                if let (Applied::Now, Ok((outcome, _, _))) = (&applied, &built) {
                    Meter::bump(&meter.rows_written, outcome.rows as u64);
                }
                if applied != Applied::Nothing {
                    Meter::bump(&meter.flushes, 1);
                }
                if applied == Applied::Before {
                    Meter::bump(&meter.replays_skipped, 1);
                    tracing::info!(
                        seq,
                        attempt,
                        "counter buffer: the ledger shows this flush committed already; not applied again"
                    );
                }
                meter.set_error(None);
                return Ok(());
            }
            Err(error) => {
                meter.failed(error.to_string());
                // Refusals a retry would meet again: an overflow, or an add
                // at the slot cap in a region (`CrossRegion`).
                let refused = CounterError::from_hook_error(&error).is_some_and(|e| {
                    e.kind() == crate::ErrorKind::Overflow
                        || matches!(e, CounterError::CrossRegion { .. })
                });
                if refused || classify(&error) == Classified::Overflow {
                    return Err(error);
                }
                let pause = backoff(attempt);
                tracing::warn!(
                    seq,
                    attempt,
                    counters = drained.counters(),
                    adds = drained.adds,
                    retry_in_ms = pause.as_millis() as u64,
                    %error,
                    "counter buffer: flush failed; its deltas are kept and it will be retried"
                );
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// The upserts that apply `counters`: one sorted multi-row upsert per table
/// and chunk, through [`DeltaBatch`].
/// A flush ready to send: what it writes, its statements, the owners it
/// touches.
type Built = (BatchReport, Vec<Chunk>, Touched);

fn statements<'a>(
    shared: &Shared,
    counters: impl Iterator<Item = (&'a CounterId, &'a Delta)>,
) -> Result<Built> {
    let tables = shared.pending.tables();
    let mut batch = DeltaBatch::new();
    for (id, delta) in counters {
        // Every pending counter's table was registered by its first add.
        let Some(known) = tables.iter().find(|t| t.name == id.table) else {
            continue;
        };
        batch.fold_checked(
            &known.table,
            id.owner.to_value(known.column),
            &id.key,
            delta.total,
            &delta.buckets,
        )?;
    }
    let touched = batch.touched();
    let (report, chunks) = batch.into_chunks(shared.dialect);
    Ok((report, chunks, touched))
}

#[derive(Debug, PartialEq, Eq)]
enum Applied {
    /// Committed by this attempt.
    Now,
    /// Committed by an earlier attempt whose reply was lost.
    Before,
    /// Every delta netted to zero: nothing to write.
    Nothing,
}

/// One attempt at flush `seq`, in one transaction: claim `seq` in the
/// ledger, upsert, commit. If the claim finds `seq` taken, an earlier
/// attempt committed and this one rolls back.
async fn apply_once(
    shared: &Shared,
    seq: u64,
    chunks: &[Chunk],
    sent: &mut u64,
) -> Result<Applied, DbErr> {
    let (dialect, ledger, writer) = (shared.dialect, shared.config.ledger.name(), &shared.writer);
    let seq = i64::try_from(seq).unwrap_or(i64::MAX);
    *sent += 1;
    let txn = shared.db.begin().await?;
    *sent += 1;
    let claim = txn
        .execute_raw(sql::ledger::claim(dialect, ledger, writer, seq))
        .await?;
    if claim.rows_affected() == 0 {
        *sent += 1;
        let row = txn
            .query_one_raw(sql::ledger::last_flush(dialect, ledger, writer))
            .await?;
        match row {
            Some(row) => {
                let last: i64 = row.try_get("", sql::ledger::LAST_FLUSH_COLUMN)?;
                *sent += 1;
                txn.rollback().await?;
                if last >= seq {
                    return Ok(Applied::Before);
                }
                return Err(DbErr::Custom(format!(
                    "flush ledger `{ledger}`: writer {writer} is at flush {last}, \
                     yet flush {seq} could not be claimed"
                )));
            }
            None => {
                *sent += 1;
                txn.execute_raw(sql::ledger::register(dialect, ledger, writer, seq))
                    .await?;
            }
        }
    }
    *sent += chunks.len() as u64;
    // A slot that meets its cap is settled in the same transaction.
    chunks::write(&txn, dialect, chunks, Mode::Fast).await?;
    // From here until `in_flight` is cleared, a read may see the rows both
    // in the table and in flight.
    unsettle(&shared.commit_epoch);
    *sent += 1;
    txn.commit().await?;
    Ok(Applied::Now)
}

/// Deletes the ledger rows of writers idle longer than the retention.
/// Failures are only logged: pruning is housekeeping.
async fn prune(shared: &Shared) {
    let retention = i64::try_from(shared.config.retention.as_secs()).unwrap_or(i64::MAX);
    let stmt = sql::ledger::prune(
        shared.dialect,
        shared.config.ledger.name(),
        retention,
        &shared.writer,
    );
    match crate::detach::execute(&shared.db, stmt).await {
        Ok(done) => tracing::debug!(
            pruned = done.rows_affected(),
            "counter buffer: ledger rows of idle writers pruned"
        ),
        Err(error) => tracing::warn!(%error, "counter buffer: pruning the flush ledger failed"),
    }
}

/// Removes this writer's ledger row once it has stopped with nothing left
/// to flush: no retry of it can happen any more.
async fn forget(shared: &Shared) {
    let stmt = sql::ledger::forget(shared.dialect, shared.config.ledger.name(), &shared.writer);
    if let Err(error) = crate::detach::execute(&shared.db, stmt).await {
        tracing::warn!(%error, "counter buffer: removing this writer's ledger row failed");
    }
}

/// Half the doubling ceiling, plus a random share of the other half: every
/// retry waits, and many buffers do not retry in step.
fn backoff(attempt: u32) -> Duration {
    use rand::Rng;
    let ceiling = FIRST_BACKOFF
        .saturating_mul(1 << attempt.saturating_sub(1).min(16))
        .min(MAX_BACKOFF);
    ceiling / 2 + rand::rng().random_range(Duration::ZERO..=ceiling / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_bounded() {
        assert!(backoff(1) <= FIRST_BACKOFF && backoff(1) >= FIRST_BACKOFF / 2);
        for attempt in 1..200 {
            assert!(backoff(attempt) <= MAX_BACKOFF);
        }
        assert!(backoff(30) >= MAX_BACKOFF / 2);
    }
}
