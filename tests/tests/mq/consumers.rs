//! Several consumers on one queue (one JetStream durable, one RabbitMQ
//! queue), as the guide deploys them: their batches write overlapping
//! counters at once, one of them stops part-way and what it held goes to
//! the others, and every message is applied once, by one of them.

use std::time::{Duration, Instant};

use counter_mq::{
    Consumer, ConsumerStats, CounterMessage, Source, StatsHandle, nats::JetStreamSource,
};
use counter_tests::{
    TestDb, backend_test,
    mq::{
        self, AnyPublisher, Broker, Bus, EVENTS, KEYS, Workload, change, jetstream, tally,
        test_consumer,
    },
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::DatabaseConnection;

use super::{consumer, report, tables};

const CONSUMERS: usize = 3;
/// Few owners, so that every batch writes nearly every counter row.
const OWNERS: i64 = 6;
/// Published before the consumers start: more than two consumers' RabbitMQ
/// prefetch windows (1,000 each), so the third gets messages too, and more
/// than two consumers drain while the first commits a batch and stops (on a
/// fast machine they drained 3,600 in 0.2 s, before its stop returned).
const BACKLOG: usize = 12_000;
/// Messages published again and again (at most [`EXTRA_WAVES`] times) while
/// a consumer that must have committed a batch has none.
const WAVE: usize = 400;
const EXTRA_WAVES: usize = 8;

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    /// Three consumers of one JetStream durable / one RabbitMQ queue, each on
    /// a connection of its own, started together on a backlog of 12,000
    /// messages whose changes hit six owners' counters in ascending order in
    /// half of the messages and descending in the other half, by random
    /// deltas: the batches conflict on the same rows at once (on PostgreSQL
    /// and MariaDB). Consumer 0 is stopped gracefully after its first batch;
    /// what it held (RabbitMQ: its prefetch window; JetStream: a fetch cut
    /// short) goes to the others. Every consumer commits batches, every id
    /// is applied by exactly one of them, every total is exact.
    async fn consumers_share_one_queue(t: TestDb) {
        for broker in mq::BROKERS {
            let Some(bus) = Bus::open(broker, t.backend, "consumers").await else {
                continue;
            };
            let table = format!("shared_{broker}");
            let posts = tables(&t.db, &table).await;
            let source = bus.source_name();
            let publisher = bus.publisher().await;
            let mut workload = Workload {
                table: table.clone(),
                messages: Vec::new(),
            };
            let mut waves = 0;
            publish_wave(&publisher, &mut workload, BACKLOG, &mut waves).await;
            let mut built = Vec::new();
            for _ in 0..CONSUMERS {
                let builder = consumer(&t.db, &posts);
                built.push(match &bus {
                    Bus::Nats { server, .. } => {
                        // Redelivery 3 s after a missed acknowledgement: what
                        // a stopped fetch left behind comes back soon.
                        let js = jetstream(&[server.url()]).await;
                        let source = JetStreamSource::new(
                            js,
                            &source,
                            test_consumer(Duration::from_secs(3)),
                        )
                        .await
                        .expect("bind the shared durable");
                        Started::Nats(Box::new(builder.build(source).await.expect("a consumer")))
                    }
                    Bus::Amqp { queue } => Started::Amqp(Box::new(
                        builder
                            .build(queue.source(&queue.url).await)
                            .await
                            .expect("a consumer"),
                    )),
                });
            }
            let started = Instant::now();
            let mut running: Vec<Running> = built.into_iter().map(Started::run).collect();

            // Consumer 0 stops part-way, once it has committed a batch.
            let mut extra = 0;
            each_commits(
                &t.db,
                &source,
                &running[..1],
                &publisher,
                &mut workload,
                &mut waves,
                &mut extra,
            )
            .await;
            let first = running[0].stop().await;
            let applied_at_stop = counter_mq::applied_count(&t.db, &source)
                .await
                .expect("a count");
            // The others finish the queue, and each commits a batch.
            each_commits(
                &t.db,
                &source,
                &running[1..],
                &publisher,
                &mut workload,
                &mut waves,
                &mut extra,
            )
            .await;
            let distinct = workload.distinct();
            let deadline = Instant::now() + Duration::from_secs(120);
            while (counter_mq::applied_count(&t.db, &source).await.unwrap_or(0) as usize) < distinct
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let mut stats = vec![first];
            for consumer in &mut running[1..] {
                stats.push(consumer.stop().await);
            }
            let elapsed = started.elapsed();
            bus.finish().await;

            let sum = |f: fn(&ConsumerStats) -> u64| stats.iter().map(f).sum::<u64>();
            let batches: Vec<u64> = stats.iter().map(|s| s.batches).collect();
            eprintln!(
                "[{}] {broker}: {} messages, {waves} waves, consumer 0 stopped at {applied_at_stop} applied, {:.1} s: {stats:?}",
                t.backend,
                workload.messages.len(),
                elapsed.as_secs_f64()
            );
            assert!(
                (applied_at_stop as usize) < distinct,
                "{broker}: consumer 0 stopped after everything was applied"
            );
            assert!(
                batches.iter().all(|b| *b >= 1),
                "{broker}: a consumer committed no batch: {stats:?}"
            );
            assert_eq!(
                sum(|s| s.applied),
                distinct as u64,
                "{broker}: every id applied by exactly one consumer: {stats:?}"
            );
            assert_eq!(
                counter_mq::applied_count(&t.db, &source)
                    .await
                    .expect("a count"),
                distinct as u64
            );
            assert_eq!(sum(|s| s.rejected), 0, "{broker}: {stats:?}");
            // Conflicting batches wait for each other's row locks; a
            // deadlock the database still reports costs one retry, not a
            // storm of them.
            assert!(
                sum(|s| s.failed_attempts) <= sum(|s| s.batches),
                "{broker}: more failed attempts than batches: {stats:?}"
            );
            if broker == Broker::Amqp {
                // Consumer 0's prefetch window was full (the backlog is
                // larger than all three windows): closing its channel
                // handed the rest of it to the others, marked redelivered.
                assert!(
                    sum(|s| s.redeliveries) >= 1,
                    "{broker}: consumer 0's prefetched messages never reached the others: {stats:?}"
                );
            }
            let tally = tally(&t.db, &posts, &workload).await;
            report(
                &format!("mq_consumers_{broker}"),
                t.backend,
                tally,
                &[
                    ("messages", sum(|s| s.messages)),
                    ("redeliveries", sum(|s| s.redeliveries)),
                    ("duplicates_skipped", sum(|s| s.duplicates_skipped)),
                    ("consumers", CONSUMERS as u64),
                    ("published", workload.messages.len() as u64),
                    ("batches_0", batches[0]),
                    ("batches_1", batches[1]),
                    ("batches_2", batches[2]),
                    ("failed_attempts", sum(|s| s.failed_attempts)),
                ],
            );
        }
        t.finish().await;
    }
}

/// A consumer built on either broker, not yet running.
enum Started {
    Nats(Box<Consumer<JetStreamSource>>),
    Amqp(Box<Consumer<counter_mq::amqp::AmqpSource>>),
}

impl Started {
    fn run(self) -> Running {
        match self {
            Started::Nats(consumer) => Running::spawn(*consumer),
            Started::Amqp(consumer) => Running::spawn(*consumer),
        }
    }
}

/// A consumer running in a task of its own until [`Running::stop`].
struct Running {
    stats: StatsHandle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<ConsumerStats>>,
}

impl Running {
    fn spawn<S: Source + 'static>(consumer: Consumer<S>) -> Self {
        let stats = consumer.stats_handle();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            consumer
                .run(async move {
                    let _ = stopped.await;
                })
                .await
                .expect("the consumer ran")
        });
        Self {
            stats,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Shuts it down gracefully (the batch in hand commits and is
    /// acknowledged) and returns its final counters.
    async fn stop(&mut self) -> ConsumerStats {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = self.task.take().expect("a running consumer");
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("the consumer stops within a minute")
            .expect("the consumer task")
    }
}

/// Waits until every consumer of `running` has committed a batch (and the
/// ones that are done have applied all that was published): while one has
/// none after a quiet moment, another wave of [`WAVE`] messages is
/// published, at most [`EXTRA_WAVES`] in all (`extra` counts them).
async fn each_commits(
    db: &DatabaseConnection,
    source: &str,
    running: &[Running],
    publisher: &AnyPublisher,
    workload: &mut Workload,
    waves: &mut usize,
    extra: &mut usize,
) {
    loop {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut drained_since: Option<Instant> = None;
        while running.iter().any(|r| r.stats.get().batches == 0) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let applied = counter_mq::applied_count(db, source).await.unwrap_or(0);
            // The queue is drained and one still has no batch: more
            // volume, rather than waiting out the deadline, once it has had
            // a moment to ask for messages (on a loaded machine a
            // consumer's first fetch came after the others had drained the
            // backlog and every wave at once).
            if applied as usize >= workload.distinct() {
                let since = *drained_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= Duration::from_millis(500) {
                    break;
                }
            } else {
                drained_since = None;
            }
        }
        if running.iter().all(|r| r.stats.get().batches >= 1) || *extra == EXTRA_WAVES {
            return;
        }
        *extra += 1;
        publish_wave(publisher, workload, WAVE, waves).await;
    }
}

/// Publishes `n` more [`contended`] messages and adds them to `workload`.
async fn publish_wave(
    publisher: &AnyPublisher,
    workload: &mut Workload,
    n: usize,
    waves: &mut usize,
) {
    let wave = Workload {
        table: workload.table.clone(),
        messages: contended(
            &workload.table,
            n,
            300 + *waves as u64,
            &format!("w{waves}"),
        ),
    };
    wave.publish(publisher, 32).await;
    workload.messages.extend(wave.messages);
    *waves += 1;
}

/// `n` messages over [`OWNERS`] owners: each adds 1 to one owner's
/// `events` and changes 3 to 6 counters of the same few owners by random
/// deltas, in ascending (owner, key) order in even messages and descending
/// in odd ones: the orders two writers that did not sort their rows would
/// deadlock on.
fn contended(table: &str, n: usize, seed: u64, prefix: &str) -> Vec<CounterMessage> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let mut changes: Vec<(i64, &str)> = (0..rng.random_range(3..=6))
                .map(|_| {
                    (
                        rng.random_range(1..=OWNERS),
                        KEYS[rng.random_range(0..KEYS.len())],
                    )
                })
                .collect();
            changes.push((rng.random_range(1..=OWNERS), EVENTS));
            changes.sort_unstable();
            if i % 2 == 1 {
                changes.reverse();
            }
            let mut message = CounterMessage::with_id(format!("{prefix}-{i}"), table);
            for (owner, key) in changes {
                let delta = if key == EVENTS {
                    1
                } else {
                    rng.random_range(-5..=20)
                };
                message.push(change(owner, key, delta));
            }
            message
        })
        .collect()
}
