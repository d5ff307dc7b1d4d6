//! Events through each broker: known totals, duplicate publishes inside and
//! beyond the duplicate window, and messages redelivered after a consumer
//! took them and never acknowledged.

use std::time::Duration;

use counter_mq::{Publish, Source};
use counter_tests::{
    TestDb, backend_test,
    mq::{
        self, AmqpQueue, AnyPublisher, Broker, Bus, PrivateNats, Workload, consume_until_applied,
        jetstream, nats_source_redelivering, stream_ready, tally, test_stream,
    },
};

use super::{consumer, report, tables};

const EVENTS: usize = 2_000;

backend_test! {
    /// 2,000 messages of random deltas through each broker; 200 published
    /// again at once (JetStream stores them once: `duplicate` in its
    /// acknowledgement) and 100 more after the duplicate window (stored
    /// twice, skipped by the dedup table); RabbitMQ stores every copy.
    async fn events_through_each_broker(t: TestDb) {
        for broker in mq::BROKERS {
            let Some(bus) = Bus::open(broker, t.backend, "events").await else {
                continue;
            };
            let table = format!("events_{broker}");
            let posts = tables(&t.db, &table).await;
            let mut workload = Workload::random(&table, EVENTS, 100, 7, &format!("ev-{broker}"));
            let again: Vec<_> = workload.messages[..200].to_vec();
            let later: Vec<_> = workload.messages[200..300].to_vec();
            let in_window =
                publish_with_repeats(bus.publisher().await, &workload, &again, &later).await;
            // JetStream stores a repeat within its window once; RabbitMQ
            // stores every copy.
            let (expected_in_window, stored_duplicates) = match broker {
                Broker::Nats => (200, 100),
                Broker::Amqp => (0, 300),
            };
            assert_eq!(
                in_window, expected_in_window,
                "{broker}: repeats the broker called duplicates"
            );
            let stats = bus
                .consume(
                    consumer(&t.db, &posts),
                    &t.db,
                    workload.distinct(),
                    EVENTS + stored_duplicates as usize,
                    Duration::from_secs(120),
                )
                .await;
            bus.finish().await;
            assert_eq!(
                stats.duplicates_skipped, stored_duplicates,
                "{broker}: {stats:?}"
            );
            assert_eq!(stats.rejected, 0);
            // 4 statements a batch, a fifth where it refreshed duplicates.
            assert!(
                (4 * stats.batches..=5 * stats.batches).contains(&stats.statements),
                "{broker}: {stats:?}"
            );
            workload.messages.extend(again);
            let tally = tally(&t.db, &posts, &workload).await;
            report(
                &format!("mq_events_{broker}"),
                t.backend,
                tally,
                &[
                    ("messages", stats.messages),
                    ("batches", stats.batches),
                    ("duplicates_skipped", stats.duplicates_skipped),
                    ("redeliveries", stats.redeliveries),
                ],
            );
        }
        t.finish().await;
    }
}

/// Publishes `workload` (whose first messages are `again`), `again` twice
/// each, and `later` again after the duplicate window; returns how many
/// repeats of `again` the broker called duplicates.
async fn publish_with_repeats(
    publisher: AnyPublisher,
    workload: &Workload,
    again: &[counter_mq::CounterMessage],
    later: &[counter_mq::CounterMessage],
) -> u64 {
    // Each of `again` twice in a row: the repeat is milliseconds after its
    // original, well inside the 1 s window however loaded the machine is.
    let mut in_window = 0u64;
    for m in again {
        assert!(!publisher.send(m).await.expect("published").duplicate);
        in_window += u64::from(publisher.send(m).await.expect("republished").duplicate);
    }
    let rest = Workload {
        table: workload.table.clone(),
        messages: workload.messages[again.len()..].to_vec(),
    };
    rest.publish(&publisher, 32).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    for m in later {
        assert!(!publisher.send(m).await.expect("republished").duplicate);
    }
    in_window
}

backend_test! {
    /// A consumer that takes 300 messages and dies without acknowledging
    /// them: the broker delivers them again (JetStream after `ack_wait`,
    /// RabbitMQ when the connection closes), and each is applied once.
    async fn never_acked_messages_are_redelivered(t: TestDb) {
        for broker in mq::BROKERS {
            let table = format!("unacked_{broker}");
            let posts = tables(&t.db, &table).await;
            let workload = Workload::random(&table, 900, 50, 11, &format!("na-{broker}"));
            let stats = match broker {
                Broker::Nats => {
                    let Some(bin) = mq::nats_server(t.backend, "never_acked") else {
                        continue;
                    };
                    let server = PrivateNats::start(&bin);
                    let js = jetstream(&[server.url()]).await;
                    stream_ready(&js, &test_stream(1)).await;
                    workload
                        .publish(
                            &AnyPublisher::Nats(counter_mq::nats::JetStreamPublisher::new(
                                js.clone(),
                            )),
                            32,
                        )
                        .await;
                    let mut rogue = nats_source_redelivering(&js, "COUNTERS").await;
                    let taken = rogue
                        .fetch(300, Duration::from_secs(2))
                        .await
                        .expect("a fetch");
                    assert_eq!(taken.len(), 300);
                    drop(taken);
                    let source = nats_source_redelivering(&js, "COUNTERS").await;
                    consume_until_applied(
                        consumer(&t.db, &posts)
                            .build(source)
                            .await
                            .expect("a consumer"),
                        &t.db,
                        "COUNTERS",
                        workload.distinct(),
                        Duration::from_secs(60),
                    )
                    .await
                }
                Broker::Amqp => {
                    let Some(url) = mq::amqp_url(t.backend, "never_acked") else {
                        continue;
                    };
                    let queue = AmqpQueue::new(&url, "unacked").await;
                    workload
                        .publish(&AnyPublisher::Amqp(queue.publisher().await), 32)
                        .await;
                    {
                        let mut rogue = counter_mq::amqp::AmqpSource::connect(
                            &url,
                            queue.settings.clone(),
                            300,
                        )
                        .await
                        .expect("a rogue consumer");
                        let taken = rogue
                            .fetch(300, Duration::from_secs(2))
                            .await
                            .expect("a fetch");
                        assert_eq!(taken.len(), 300);
                        // Its connection closes without acknowledging.
                        rogue.close().await;
                    }
                    let source = queue.source(&url).await;
                    let name = queue.settings.name.clone();
                    let stats = consume_until_applied(
                        consumer(&t.db, &posts)
                            .build(source)
                            .await
                            .expect("a consumer"),
                        &t.db,
                        &name,
                        workload.distinct(),
                        Duration::from_secs(60),
                    )
                    .await;
                    queue.delete().await;
                    stats
                }
            };
            assert!(stats.redeliveries >= 300, "{broker}: {stats:?}");
            let tally = tally(&t.db, &posts, &workload).await;
            report(
                &format!("mq_redelivery_{broker}"),
                t.backend,
                tally,
                &[
                    ("messages", stats.messages),
                    ("redeliveries", stats.redeliveries),
                    ("duplicates_skipped", stats.duplicates_skipped),
                ],
            );
        }
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    /// A `counter-redis` cache in the consumer's process: owners read (and
    /// cached) before their messages are applied read the new totals right
    /// after, with no `invalidate` of the test's: every batch deletes its
    /// owners after its commit.
    async fn the_consumer_invalidates_cached_owners(t: TestDb) {
        let Some(cache) = counter_tests::redis::shared_cache(t.backend, "mq_cache").await else {
            return t.finish().await;
        };
        for broker in mq::BROKERS {
            let table = format!("cached_{broker}");
            let posts = tables(&t.db, &table).await;
            let cached = cache.table(&posts);
            let workload = Workload::random(&table, 300, 20, 71, &format!("c-{broker}"));
            let owners: Vec<i64> = (1..=20).collect();
            let mut keys: Vec<&str> = mq::KEYS.to_vec();
            keys.push(mq::EVENTS);
            cached
                .get_many(&t.db, &owners, &keys)
                .await
                .expect("warm the cache");
            let Some(bus) = Bus::open(broker, t.backend, "mq_cache").await else {
                continue;
            };
            workload.publish(&bus.publisher().await, 32).await;
            let stats = bus
                .consume(
                    consumer(&t.db, &posts),
                    &t.db,
                    workload.distinct(),
                    0,
                    Duration::from_secs(60),
                )
                .await;
            bus.finish().await;
            let through_cache = cached
                .get_many(&t.db, &owners, &keys)
                .await
                .expect("a cached read");
            let truth = posts
                .get_many(&t.db, &owners, &keys)
                .await
                .expect("a database read");
            let stale = owners
                .iter()
                .filter(|o| through_cache[*o] != truth[*o])
                .count() as u64;
            let tally = tally(&t.db, &posts, &workload).await;
            report(
                &format!("mq_cache_{broker}"),
                t.backend,
                tally,
                &[
                    ("messages", stats.messages),
                    ("owners", owners.len() as u64),
                    ("stale_reads", stale),
                    ("invalidations", cache.stats().invalidations),
                ],
            );
            assert_eq!(stale, 0, "{broker}: a cached read missed a committed batch");
        }
        t.finish().await;
    }
}

backend_test! {
    /// Ids that differ only in case are two messages (MariaDB's default
    /// collations would make them one and skip the second as a replay: the
    /// dedup table compares ids byte for byte).
    async fn ids_differing_in_case_are_two_messages(t: TestDb) {
        for broker in mq::BROKERS {
            let Some(bus) = Bus::open(broker, t.backend, "id_case").await else {
                continue;
            };
            let table = format!("case_{broker}");
            let posts = tables(&t.db, &table).await;
            let mut workload = Workload {
                table: table.clone(),
                messages: Vec::new(),
            };
            for id in ["Event-A", "event-a", "EVENT-A"] {
                let mut message = counter_mq::CounterMessage::with_id(id, &table);
                message.push(mq::change(1, mq::EVENTS, 1));
                workload.messages.push(message);
            }
            workload.publish(&bus.publisher().await, 1).await;
            let stats = bus
                .consume(
                    consumer(&t.db, &posts),
                    &t.db,
                    3,
                    3,
                    Duration::from_secs(30),
                )
                .await;
            bus.finish().await;
            assert_eq!(
                (stats.applied, stats.duplicates_skipped),
                (3, 0),
                "{broker}: {stats:?}"
            );
            let tally = tally(&t.db, &posts, &workload).await;
            report(
                &format!("mq_id_case_{broker}"),
                t.backend,
                tally,
                &[("messages", stats.messages)],
            );
        }
        t.finish().await;
    }
}
