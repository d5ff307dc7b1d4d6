//! A `CounterBuffer` flushing to a broker (`BufferSink`): many adds become a
//! few messages, each flush applied once even when the broker dies in the
//! middle and flushes are sent again.

use std::{collections::HashMap, sync::Arc, time::Duration};

use counter_core::{CounterBuffer, CounterTable, Counters, Window};
use counter_mq::{BufferSink, Consumer, Tables, nats::JetStreamPublisher};
use counter_tests::{
    TestDb, backend_test,
    mq::{
        self, AmqpQueue, AnyPublisher, Broker, PrivateNats, Tally, jetstream, nats_source,
        stream_ready, test_stream,
    },
};
use sea_orm::DatabaseConnection;

use super::{consumer, report};

const TASKS: i64 = 8;
const ADDS_PER_TASK: i64 = 2_500;
const OWNERS: i64 = 50;

backend_test! {
    /// 20,000 adds from 8 tasks to a buffer flushing every 20 ms through
    /// each broker (JetStream killed and restarted half way); the consumer
    /// applies every flush once: totals and the windowed key's hourly bucket
    /// are exact, and the messages number about the flushes, not the adds.
    async fn buffer_flushes_through_each_broker(t: TestDb) {
        for broker in mq::BROKERS {
            let table = format!("buffered_{broker}");
            let posts = Counters::<i64>::new(
                CounterTable::new(table.clone())
                    .and_then(|t| t.with_slots(4))
                    .and_then(|t| t.with_key_window("views", Window::Hour))
                    .expect("a table"),
            );
            posts.create_table(&t.db).await.expect("create the table");
            counter_mq::create_table(&t.db)
                .await
                .expect("create the dedup table");
            let (stats, flushes, failed_flushes) = match broker {
                Broker::Nats => {
                    let Some(bin) = mq::nats_server(t.backend, "buffer_flushes") else {
                        continue;
                    };
                    let server = Arc::new(PrivateNats::start(&bin));
                    let js = jetstream(&[server.url()]).await;
                    stream_ready(&js, &test_stream(1)).await;
                    // A publisher that gives up quickly, so the outage fails
                    // whole flushes, which the buffer sends again.
                    let publisher = AnyPublisher::Nats(
                        JetStreamPublisher::new(js.clone()).retry_for(Duration::from_millis(100)),
                    );
                    let (flushes, failed) =
                        add_through(&t.db, &posts, publisher, Some(server.clone())).await;
                    assert!(failed > 0, "the broker's outage failed no flush");
                    let source = nats_source(&js, "COUNTERS").await;
                    (
                        consume_until_exact(
                            &t.db,
                            &posts,
                            consumer(&t.db, &posts)
                                .build(source)
                                .await
                                .expect("a consumer"),
                        )
                        .await,
                        flushes,
                        failed,
                    )
                }
                Broker::Amqp => {
                    let Some(url) = mq::amqp_url(t.backend, "buffer_flushes") else {
                        continue;
                    };
                    let queue = AmqpQueue::new(&url, "buffered").await;
                    // Every flush sent twice (RabbitMQ stores both): the
                    // consumer must skip each second copy by its id.
                    let (flushes, failed) = add_through(
                        &t.db,
                        &posts,
                        Twice(AnyPublisher::Amqp(queue.publisher().await)),
                        None,
                    )
                    .await;
                    let source = queue.source(&url).await;
                    let stats = consume_until_exact(
                        &t.db,
                        &posts,
                        consumer(&t.db, &posts)
                            .build(source)
                            .await
                            .expect("a consumer"),
                    )
                    .await;
                    queue.delete().await;
                    (stats, flushes, failed)
                }
            };
            let (likes, views) = totals(&t.db, &posts).await;
            let expected = TASKS * ADDS_PER_TASK / 2;
            let now = chrono::Utc::now();
            let series = posts
                .series_many(
                    &t.db,
                    &(1..=OWNERS).collect::<Vec<_>>(),
                    "views",
                    now - chrono::Duration::hours(2),
                    now + chrono::Duration::hours(1),
                )
                .await
                .expect("a series");
            let in_buckets: i64 = series
                .values()
                .flat_map(|s| s.iter().map(|(_, n)| *n))
                .sum();
            // Per counter: adds short of (lost) or over (doubled) what was
            // added to it, summed.
            let tally = per_counter(&t.db, &posts).await;
            report(
                &format!("mq_buffer_sink_{broker}"),
                t.backend,
                tally,
                &[
                    ("adds", (TASKS * ADDS_PER_TASK) as u64),
                    ("flushes", flushes),
                    ("failed_flush_attempts", failed_flushes),
                    ("messages", stats.messages),
                    ("redeliveries", stats.redeliveries),
                    ("duplicates_skipped", stats.duplicates_skipped),
                ],
            );
            assert_eq!(
                (likes, views, in_buckets),
                (expected, expected, expected),
                "{broker}: {stats:?}"
            );
            assert_eq!(stats.rejected, 0);
            if broker == Broker::Amqp {
                assert_eq!(
                    (stats.messages, stats.duplicates_skipped),
                    (2 * flushes, flushes),
                    "one message per flush, each sent twice, the copy skipped"
                );
            } else {
                assert!(
                    stats.messages <= flushes + 10,
                    "one message per flush: {stats:?}, {flushes} flushes"
                );
            }
        }
        t.finish().await;
    }
}

/// A publisher that sends every message twice, as a sink retrying a flush
/// whose confirmation was lost would.
struct Twice(AnyPublisher);

impl counter_mq::Publish for Twice {
    async fn send(
        &self,
        message: &counter_mq::CounterMessage,
    ) -> Result<counter_mq::Sent, counter_mq::MqError> {
        self.0.send(message).await?;
        self.0.send(message).await
    }
}

/// Adds from [`TASKS`] tasks to a buffer that flushes through `publisher`,
/// killing and restarting `server` half way; returns (flushes, failed).
async fn add_through<P: counter_mq::Publish + 'static>(
    db: &DatabaseConnection,
    posts: &Counters<i64>,
    publisher: P,
    server: Option<Arc<PrivateNats>>,
) -> (u64, u64) {
    let buffer = CounterBuffer::builder(db)
        .interval(Duration::from_millis(20))
        .sink(Arc::new(BufferSink::new(publisher)))
        .start()
        .await
        .expect("a buffer");
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (buffer, posts) = (buffer.clone(), posts.clone());
            tokio::spawn(async move {
                for i in 0..ADDS_PER_TASK {
                    let key = if i % 2 == 0 { "likes" } else { "views" };
                    buffer
                        .add(&posts, (task * ADDS_PER_TASK + i) % OWNERS + 1, key, 1)
                        .expect("an add");
                    // About a second of adds, so the broker dies mid-way.
                    if i % 25 == 0 {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            })
        })
        .collect();
    if let Some(server) = server {
        tokio::time::sleep(Duration::from_millis(300)).await;
        tokio::task::spawn_blocking(move || {
            server.kill();
            std::thread::sleep(Duration::from_millis(600));
            server.restart();
        })
        .await
        .expect("kill and restart");
    }
    for task in tasks {
        task.await.expect("an adding task");
    }
    let stats = buffer.shutdown().await.expect("a clean shutdown");
    assert_eq!(
        (stats.adds, stats.pending_adds),
        ((TASKS * ADDS_PER_TASK) as u64, 0)
    );
    (stats.flushes, stats.failed_attempts)
}

/// Lost (short of the expected total), doubled (over it) and wrong totals
/// over `(expected, got)` pairs, one per counter, summed.
fn compare(pairs: impl IntoIterator<Item = (i64, i64)>) -> Tally {
    let mut tally = Tally::default();
    for (want, have) in pairs {
        tally.lost += (want - have).max(0) as u64;
        tally.doubled += (have - want).max(0) as u64;
        tally.wrong_totals += u64::from(want != have);
    }
    tally
}

/// [`add_through`]'s adds against what each counter holds.
async fn per_counter(db: &DatabaseConnection, posts: &Counters<i64>) -> Tally {
    let mut expected: HashMap<(i64, &str), i64> = HashMap::new();
    for task in 0..TASKS {
        for i in 0..ADDS_PER_TASK {
            let key = if i % 2 == 0 { "likes" } else { "views" };
            *expected
                .entry(((task * ADDS_PER_TASK + i) % OWNERS + 1, key))
                .or_default() += 1;
        }
    }
    let owners: Vec<i64> = (1..=OWNERS).collect();
    let got = posts
        .get_many(db, &owners, &["likes", "views"])
        .await
        .expect("totals");
    compare(
        expected
            .iter()
            .map(|((owner, key), want)| (*want, got[owner].get(*key).copied().unwrap_or(0))),
    )
}

async fn totals(db: &DatabaseConnection, posts: &Counters<i64>) -> (i64, i64) {
    let owners: Vec<i64> = (1..=OWNERS).collect();
    let all = posts
        .get_many(db, &owners, &["likes", "views"])
        .await
        .expect("totals");
    let sum = |key: &str| {
        all.values()
            .map(|m| m.get(key).copied().unwrap_or(0))
            .sum::<i64>()
    };
    (sum("likes"), sum("views"))
}

/// Runs `consumer` until the totals reach the adds (or a minute), then
/// shuts it down.
async fn consume_until_exact<S: counter_mq::Source + 'static>(
    db: &DatabaseConnection,
    posts: &Counters<i64>,
    consumer: counter_mq::Consumer<S>,
) -> counter_mq::ConsumerStats {
    let expected = TASKS * ADDS_PER_TASK / 2;
    // 300 ms more for late duplicates, then a graceful stop.
    mq::run_until(
        consumer,
        Duration::from_secs(60),
        Duration::from_millis(300),
        |_| async move { totals(db, posts).await == (expected, expected) },
    )
    .await
}

backend_test! {
    /// One flush of 3,000 counters whose owners are 250-character strings
    /// (about a megabyte of changes): it goes out as several messages under
    /// the size limit (a single one would be rejected), each applied once.
    async fn a_large_flush_goes_out_in_parts(t: TestDb) {
        for broker in mq::BROKERS {
            let table = format!("large_{broker}");
            let posts = counter_tests::counters::<String>(&table, 2);
            posts.create_table(&t.db).await.expect("create the table");
            counter_mq::create_table(&t.db)
                .await
                .expect("create the dedup table");
            let owners: Vec<String> = (0..3_000).map(|i| format!("{i:0>250}")).collect();
            let (publisher, server, queue) = match broker {
                Broker::Nats => {
                    let Some(bin) = mq::nats_server(t.backend, "large_flush") else {
                        continue;
                    };
                    let server = PrivateNats::start(&bin);
                    let js = jetstream(&[server.url()]).await;
                    stream_ready(&js, &test_stream(1)).await;
                    (
                        AnyPublisher::Nats(JetStreamPublisher::new(js)),
                        Some(server),
                        None,
                    )
                }
                Broker::Amqp => {
                    let Some(url) = mq::amqp_url(t.backend, "large_flush") else {
                        continue;
                    };
                    let queue = AmqpQueue::new(&url, "large").await;
                    (
                        AnyPublisher::Amqp(queue.publisher().await),
                        None,
                        Some(queue),
                    )
                }
            };
            let buffer = CounterBuffer::builder(&t.db)
                .interval(Duration::from_secs(3_600))
                .flush_at(10_000)
                .sink(Arc::new(BufferSink::new(publisher)))
                .start()
                .await
                .expect("a buffer");
            for owner in &owners {
                buffer
                    .add(&posts, owner.clone(), "views", 1)
                    .expect("an add");
            }
            let flushed = buffer.shutdown().await.expect("a clean shutdown");
            assert_eq!(
                (flushed.flushes, flushed.failed_attempts),
                (1, 0),
                "{flushed:?}"
            );
            let stats = match (&server, &queue) {
                (Some(server), _) => {
                    let js = jetstream(&[server.url()]).await;
                    let source = nats_source(&js, "COUNTERS").await;
                    consume_parts(
                        &t.db,
                        Consumer::builder(t.db.clone(), Tables::new().with(&posts))
                            .build(source)
                            .await
                            .expect("a consumer"),
                    )
                    .await
                }
                (_, Some(queue)) => {
                    let source = queue.source(&queue.url).await;
                    consume_parts(
                        &t.db,
                        Consumer::builder(t.db.clone(), Tables::new().with(&posts))
                            .build(source)
                            .await
                            .expect("a consumer"),
                    )
                    .await
                }
                _ => unreachable!("a broker"),
            };
            if let Some(queue) = queue {
                queue.delete().await;
            }
            let totals = posts
                .get_many(&t.db, &owners, &["views"])
                .await
                .expect("totals");
            // One add per owner: a view short of it is lost, one over it
            // doubled.
            let tally = compare(
                owners
                    .iter()
                    .map(|o| (1, totals[o].get("views").copied().unwrap_or(0))),
            );
            report(
                &format!("mq_buffer_parts_{broker}"),
                t.backend,
                tally,
                &[
                    ("counters", owners.len() as u64),
                    ("messages", stats.messages),
                    ("redeliveries", stats.redeliveries),
                    ("duplicates_skipped", stats.duplicates_skipped),
                ],
            );
            assert!(stats.messages >= 2, "one flush, several parts: {stats:?}");
            assert_eq!(
                (stats.applied, stats.rejected),
                (stats.messages, 0),
                "{stats:?}"
            );
        }
        t.finish().await;
    }
}

/// Runs `consumer` until the dedup table holds a row per message it saw and
/// it has been idle for a moment.
async fn consume_parts<S: counter_mq::Source + 'static>(
    db: &DatabaseConnection,
    consumer: Consumer<S>,
) -> counter_mq::ConsumerStats {
    let source = consumer.source_name().to_owned();
    let source = source.as_str();
    mq::run_until(
        consumer,
        Duration::from_secs(60),
        Duration::from_millis(300),
        |stats| async move {
            let applied = counter_mq::applied_count(db, source).await.unwrap_or(0);
            stats.messages >= 2 && applied == stats.messages
        },
    )
    .await
}
