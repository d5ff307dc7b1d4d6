//! The consumer loop: fetch a batch, check it, apply it in one transaction,
//! acknowledge it; until shut down.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant},
};

use futures_util::FutureExt;
use sea_orm::DatabaseConnection;

use crate::{
    apply::{self, Failed},
    dedup,
    error::{MqError, Rejection},
    fault::{Fault, FaultPoint},
    message::CounterMessage,
    source::Source,
    stats::{ConsumerStats, Meter, StatsHandle},
    tables::{Checked, Tables},
};

/// How long dedup rows are kept: longer than the broker may redeliver a
/// message, or a late redelivery would count twice. A consumer checks it
/// against its [`Source::redelivery_horizon`] at start and refuses to start
/// with less ([`MqError::RetentionTooShort`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention(Option<Duration>);

impl Retention {
    /// Rows older than `period` (by the database's clock) are pruned.
    pub fn keep_for(period: Duration) -> Self {
        Self(Some(period))
    }

    /// Rows are never pruned: for streams and queues that keep messages
    /// forever. The table grows with every message; publish pre-aggregated
    /// flushes (see the crate documentation).
    pub fn forever() -> Self {
        Self(None)
    }

    fn covers(self, horizon: Option<Duration>) -> bool {
        match (self.0, horizon) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(kept), Some(horizon)) => kept > horizon,
        }
    }
}

impl Default for Retention {
    /// 48 hours: a day's stream (`max_age` 24 h) with room to spare.
    fn default() -> Self {
        Self::keep_for(Duration::from_secs(48 * 3600))
    }
}

/// Settings of a [`Consumer`]; from [`Consumer::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct ConsumerBuilder {
    db: DatabaseConnection,
    tables: Tables,
    batch_size: usize,
    max_wait: Duration,
    retention: Retention,
    prune_every: Duration,
    fault: Fault,
}

impl ConsumerBuilder {
    /// Messages per transaction, 1 to 5,000 (default 500). Larger batches
    /// amortise the transaction; each costs about four statements however
    /// large it is (one upsert per table and 1,000 distinct counters).
    pub fn batch_size(mut self, messages: usize) -> Self {
        self.batch_size = messages;
        self
    }

    /// How long a batch may wait to fill (default 50 ms): the bound on the
    /// delay a quiet queue adds between publish and commit.
    pub fn max_wait(mut self, wait: Duration) -> Self {
        self.max_wait = wait;
        self
    }

    /// How long dedup rows are kept (default 48 h); see [`Retention`].
    pub fn retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// How often expired dedup rows are pruned (default 10 min), in
    /// statements of 10,000 rows.
    pub fn prune_every(mut self, every: Duration) -> Self {
        self.prune_every = every;
        self
    }

    /// Calls `hook` at each [`FaultPoint`] of every batch (crash tests).
    #[doc(hidden)]
    pub fn fault_hook(mut self, hook: Arc<dyn Fn(FaultPoint) + Send + Sync>) -> Self {
        self.fault = Fault::new(hook);
        self
    }

    /// Checks the settings, the dedup table and the retention against
    /// `source`'s redelivery horizon, and returns the consumer (not yet
    /// running: see [`Consumer::run`]).
    pub async fn build<S: Source>(self, mut source: S) -> Result<Consumer<S>, MqError> {
        if !(1..=5_000).contains(&self.batch_size) {
            return Err(MqError::InvalidSetting(format!(
                "batch_size {} is not in 1..=5000",
                self.batch_size
            )));
        }
        if self.max_wait.is_zero() || self.max_wait > Duration::from_secs(10) {
            return Err(MqError::InvalidSetting(format!(
                "max_wait {:?} is not in (0, 10 s]",
                self.max_wait
            )));
        }
        if self.prune_every < Duration::from_secs(1) {
            return Err(MqError::InvalidSetting(
                "prune_every is shorter than a second".into(),
            ));
        }
        check_source_name(source.name())?;
        if self.tables.is_empty() {
            return Err(MqError::InvalidSetting(
                "no counter table registered: add them with Tables::with".into(),
            ));
        }
        let horizon = source.redelivery_horizon().await?;
        if !self.retention.covers(horizon) {
            return Err(MqError::RetentionTooShort {
                retention: self.retention.0.unwrap_or(Duration::MAX),
                horizon,
            });
        }
        // Fails early, and by name, when a migration has not run or the
        // database cannot do what a batch needs.
        dedup::probe(&self.db, source.name()).await?;
        self.tables.probe(&self.db).await?;
        Ok(Consumer {
            db: self.db,
            tables: self.tables,
            batch_size: self.batch_size,
            max_wait: self.max_wait,
            retention: self.retention,
            prune_every: self.prune_every,
            next_prune: Instant::now(),
            fault: self.fault,
            meter: StatsHandle::default(),
            source,
        })
    }
}

fn check_source_name(name: &str) -> Result<(), MqError> {
    if !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(MqError::InvalidSetting(format!(
            "source name {name:?} is not 1 to 64 printable ASCII characters"
        )))
    }
}

/// Applies counter messages from a [`Source`] exactly once: per batch one
/// transaction records the new message ids and applies only their deltas;
/// the batch is acknowledged after the commit. A redelivered, duplicated or
/// replayed id finds its row and is skipped, so a crash at any point (before
/// the commit, between commit and acknowledgement, between acknowledgements)
/// neither loses nor doubles a message.
///
/// Several consumers may share one queue: each batch writes its rows in
/// primary-key order, so concurrent batches do not deadlock on each other.
pub struct Consumer<S> {
    db: DatabaseConnection,
    tables: Tables,
    batch_size: usize,
    max_wait: Duration,
    retention: Retention,
    prune_every: Duration,
    next_prune: Instant,
    fault: Fault,
    meter: StatsHandle,
    source: S,
}

impl<S: Source> std::fmt::Debug for Consumer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("source", &self.source.name())
            .field("tables", &self.tables)
            .field("batch_size", &self.batch_size)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// The first pause after a failed attempt; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Rounds of pruning per pass, so a huge backlog of expired rows is pruned
/// over several passes instead of holding up the batches.
const PRUNE_ROUNDS: u32 = 20;

/// How much longer than `max_wait` a fetch under way at shutdown may take
/// to end (a JetStream fetch whose expiry notice is late).
const FETCH_GRACE: Duration = Duration::from_secs(1);

/// When a consumer stops on its own accord.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Until {
    /// Only at shutdown ([`Consumer::run`]).
    Shutdown,
    /// At the first fetch that brings nothing ([`Consumer::run_until_idle`]).
    Idle,
}

/// A shutdown signal that can be checked without being consumed.
struct Shutdown {
    signal: Pin<Box<dyn Future<Output = ()> + Send>>,
    done: bool,
}

impl Shutdown {
    fn requested(&mut self) -> bool {
        if !self.done && self.signal.as_mut().now_or_never().is_some() {
            self.done = true;
        }
        self.done
    }

    async fn wait(&mut self) {
        if !self.done {
            self.signal.as_mut().await;
            self.done = true;
        }
    }

    /// Sleeps `pause`, or less if shutdown comes first.
    async fn sleep(&mut self, pause: Duration) {
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = self.wait() => {}
        }
    }
}

impl Consumer<()> {
    /// A consumer of messages for `tables`, applied on `db`.
    pub fn builder(db: DatabaseConnection, tables: Tables) -> ConsumerBuilder {
        ConsumerBuilder {
            db,
            tables,
            batch_size: 500,
            max_wait: Duration::from_millis(50),
            retention: Retention::default(),
            prune_every: Duration::from_secs(600),
            fault: Fault::default(),
        }
    }
}

impl<S: Source> Consumer<S> {
    /// The counters now.
    pub fn stats(&self) -> ConsumerStats {
        self.meter.get()
    }

    /// The dedup scope of its source (see [`Source::name`]).
    pub fn source_name(&self) -> &str {
        self.source.name()
    }

    /// A handle to read the counters while [`Consumer::run`] runs.
    pub fn stats_handle(&self) -> StatsHandle {
        self.meter.clone()
    }

    /// Runs until `shutdown` completes, then finishes the batch in hand
    /// (commit and acknowledgement) and returns the final counters. Broker
    /// and database failures do not end it: the batch is retried with
    /// backoff, its messages held (a broker may redeliver them to another
    /// consumer meanwhile; the dedup rows keep that exact).
    ///
    /// Stop it through `shutdown`, not by dropping the future: a future
    /// dropped inside a transaction leaves its connection to the pool's
    /// mercy (on MySQL, sqlx may strand it), and its batch to a redelivery.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<ConsumerStats, MqError> {
        self.run_while(shutdown, Until::Shutdown).await
    }

    /// Drains the queue: runs until a fetch brings nothing and the broker
    /// then reports nothing ready for this consumer (a fetch can come back
    /// empty on a loaded machine while messages wait: the drain goes on;
    /// a broker that cannot say ends it, with `lag: None`), or until
    /// `shutdown` completes, whichever comes first; every batch it took is
    /// committed and acknowledged before it returns. For the end of a
    /// deployment's life (stop the publishers, then drain) and for jobs and
    /// tests that count a backlog; a queue that keeps receiving is drained
    /// only once the publishers pause, so bound the wait with `shutdown`.
    ///
    /// Idle means nothing was *ready*: a message another consumer holds
    /// unacknowledged, or (JetStream) one this consumer's earlier process
    /// took and never acknowledged, comes back only after `ack_wait`, to
    /// whichever consumer runs then.
    ///
    /// ```no_run
    /// # async fn f(consumer: counter_mq::Consumer<counter_mq::nats::JetStreamSource>) -> Result<(), counter_mq::MqError> {
    /// use std::time::Duration;
    /// // Stop the publishers first; at most a minute.
    /// let stats = consumer.run_until_idle(tokio::time::sleep(Duration::from_secs(60))).await?;
    /// println!("applied {}, waiting {:?}", stats.applied, stats.lag); // `Some(0)` once drained
    /// # Ok(()) }
    /// ```
    pub async fn run_until_idle(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<ConsumerStats, MqError> {
        self.run_while(shutdown, Until::Idle).await
    }

    async fn run_while(
        mut self,
        shutdown: impl Future<Output = ()> + Send + 'static,
        until: Until,
    ) -> Result<ConsumerStats, MqError> {
        let mut shutdown = Shutdown {
            signal: Box::pin(shutdown),
            done: false,
        };
        let mut failures = 0u32;
        tracing::info!(source = self.source.name(), tables = ?self.tables, ?until, "counter consumer started");
        while !shutdown.requested() {
            if self.retention.0.is_some() && Instant::now() >= self.next_prune {
                self.prune().await;
                self.next_prune = Instant::now() + self.prune_every;
            }
            let mut fetch = Box::pin(self.source.fetch(self.batch_size, self.max_wait));
            let fetched = tokio::select! {
                fetched = &mut fetch => Some(fetched),
                () = shutdown.wait() => None,
            };
            let Some(fetched) = fetched else {
                // A fetch dropped half-way strands what the broker already
                // sent it (JetStream redelivers that only after `ack_wait`):
                // let it end, within `max_wait` and a grace, and give back
                // what it got.
                let rest = tokio::time::timeout(self.max_wait + FETCH_GRACE, fetch).await;
                if let Ok(Ok(deliveries)) = rest
                    && !deliveries.is_empty()
                {
                    self.release(&deliveries).await;
                }
                break;
            };
            drop(fetch);
            match fetched {
                Ok(deliveries) if deliveries.is_empty() => {
                    failures = 0;
                    // The last batch's figure would stay on a dashboard
                    // forever: what waits now, or unknown.
                    let lag = self.source.idle_lag().await;
                    self.meter.0.set_lag(lag);
                    if until == Until::Idle && matches!(lag, Some(0) | None) {
                        break;
                    }
                }
                Ok(deliveries) => {
                    failures = 0;
                    self.process(deliveries, &mut shutdown).await;
                }
                Err(error) => {
                    failures += 1;
                    Meter::bump(&self.meter.0.failed_attempts, 1);
                    let pause = backoff(failures);
                    tracing::warn!(%error, retry_in_ms = pause.as_millis() as u64, "counter consumer: fetch failed");
                    shutdown.sleep(pause).await;
                }
            }
        }
        self.source.close().await;
        let stats = self.stats();
        tracing::info!(
            ?stats,
            source = self.source.name(),
            "counter consumer stopped"
        );
        Ok(stats)
    }

    /// Checks, applies and acknowledges one fetched batch.
    async fn process(&mut self, deliveries: Vec<S::Delivery>, shutdown: &mut Shutdown) {
        let meter = self.meter.0.clone();
        Meter::bump(&meter.messages, deliveries.len() as u64);
        if let Some(last) = deliveries.last() {
            let lag = self.source.lag(last).await;
            meter.set_lag(lag);
        }
        let mut good = Vec::with_capacity(deliveries.len());
        let mut checked = Vec::with_capacity(deliveries.len());
        for delivery in deliveries {
            if self.source.is_redelivery(&delivery) {
                Meter::bump(&meter.redeliveries, 1);
            }
            let payload = self.source.payload(&delivery);
            match CounterMessage::decode(payload).and_then(|m| self.tables.check(m)) {
                Ok(message) => {
                    good.push(delivery);
                    checked.push(message);
                }
                Err(rejection) => self.reject(&delivery, &rejection).await,
            }
        }
        if good.is_empty() {
            return;
        }
        match self.apply(&checked, shutdown).await {
            Some(Ok(())) => self.ack(&good).await,
            Some(Err(_refused)) => {
                // One message the database refuses (a slot would overflow)
                // must not hold back the others: one by one.
                for (delivery, message) in good.iter().zip(&checked) {
                    match self.apply(std::slice::from_ref(message), shutdown).await {
                        Some(Ok(())) => self.ack(std::slice::from_ref(delivery)).await,
                        Some(Err(rejection)) => self.reject(delivery, &rejection).await,
                        None => {
                            self.release(std::slice::from_ref(delivery)).await;
                        }
                    }
                }
            }
            None => self.release(&good).await,
        }
    }

    /// Applies `checked` in one transaction, retried until it commits, is
    /// refused for good (`Some(Err)`), or shutdown comes (`None`).
    async fn apply(
        &mut self,
        checked: &[Checked],
        shutdown: &mut Shutdown,
    ) -> Option<Result<(), Rejection>> {
        let meter = self.meter.0.clone();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let started = Instant::now();
            match apply::apply_batch(&self.db, self.source.name(), checked, &self.fault).await {
                Ok(applied) => {
                    Meter::bump(&meter.batches, 1);
                    Meter::bump(&meter.applied, applied.applied);
                    Meter::bump(&meter.duplicates_skipped, applied.duplicates);
                    Meter::bump(&meter.statements, applied.statements);
                    tracing::debug!(
                        messages = checked.len(),
                        applied = applied.applied,
                        duplicates = applied.duplicates,
                        statements = applied.statements,
                        lag = ?meter.lag.load(std::sync::atomic::Ordering::Relaxed).checked_sub(1),
                        elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                        "counter consumer: batch committed"
                    );
                    return Some(Ok(()));
                }
                Err(Failed::Refused(rejection)) => return Some(Err(rejection)),
                Err(Failed::Retry(error)) => {
                    Meter::bump(&meter.failed_attempts, 1);
                    if shutdown.requested() {
                        tracing::warn!(%error, "counter consumer: batch failed during shutdown; released for redelivery");
                        return None;
                    }
                    let pause = backoff(attempt);
                    tracing::warn!(
                        %error,
                        attempt,
                        messages = checked.len(),
                        retry_in_ms = pause.as_millis() as u64,
                        "counter consumer: batch failed; nothing of it is applied, retrying"
                    );
                    shutdown.sleep(pause).await;
                }
            }
        }
    }

    /// Acknowledges a committed batch: in two halves, so a crash between
    /// them (a test's [`FaultPoint::BetweenAcks`]) leaves part acknowledged.
    async fn ack(&mut self, deliveries: &[S::Delivery]) {
        let half = deliveries.len().div_ceil(2);
        let (first, second) = deliveries.split_at(half);
        for (i, part) in [first, second].into_iter().enumerate() {
            if i == 1 {
                if part.is_empty() {
                    break;
                }
                self.fault.at(FaultPoint::BetweenAcks);
            }
            if let Err(error) = self.source.ack(part).await {
                Meter::bump(&self.meter.0.ack_failures, part.len() as u64);
                tracing::warn!(%error, messages = part.len(), "counter consumer: acknowledgement failed after the commit; the broker will redeliver and the dedup table skip them");
            }
        }
    }

    async fn reject(&mut self, delivery: &S::Delivery, rejection: &Rejection) {
        match self.source.reject(delivery).await {
            Ok(()) => {
                // Counted once it is settled: one whose rejection failed
                // comes back and is counted then.
                Meter::bump(&self.meter.0.rejected, 1);
                tracing::warn!(%rejection, "counter consumer: message rejected for good");
            }
            Err(error) => {
                tracing::warn!(%rejection, %error, "counter consumer: could not reject a message; it will be redelivered and rejected again");
            }
        }
    }

    async fn release(&mut self, deliveries: &[S::Delivery]) {
        if let Err(error) = self.source.release(deliveries).await {
            tracing::warn!(%error, "counter consumer: could not release messages; the broker redelivers them after its timeout");
        }
    }

    /// Deletes expired dedup rows, a bounded number of rounds.
    async fn prune(&mut self) {
        let Some(retention) = self.retention.0 else {
            return;
        };
        for _ in 0..PRUNE_ROUNDS {
            match dedup::prune_once(&self.db, self.source.name(), retention).await {
                Ok(deleted) => {
                    Meter::bump(&self.meter.0.pruned, deleted);
                    if deleted < dedup::PRUNE_BATCH {
                        return;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "counter consumer: pruning dedup rows failed; tried again later");
                    return;
                }
            }
        }
    }
}

fn backoff(attempt: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(1 << attempt.saturating_sub(1).min(10))
        .min(MAX_BACKOFF)
}
