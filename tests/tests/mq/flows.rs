//! Events through each broker: known totals, duplicate publishes inside and
//! beyond the duplicate window, messages redelivered after a consumer took
//! them and never acknowledged, and events published through the typed API.

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use counter_core::{EntityCounters, SlottedCounter};
use counter_mq::{Consumer, Publish, Retention, Sent, Source, Tables, nats::JetStreamPublisher};
use counter_tests::{
    TestDb, backend_test,
    mq::{
        self, AmqpQueue, AnyPublisher, Broker, Bus, PrivateNats, Tally, Workload,
        consume_until_applied, jetstream, nats_source_redelivering, stream_ready, tally,
        test_stream,
    },
};
use entity::post::{self, counters::Key};
use rand::{Rng, SeedableRng, rngs::StdRng};

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
            // Both brokers say how many messages wait (JetStream with each
            // delivery, RabbitMQ when asked).
            assert!(stats.lag.is_some(), "{broker}: {stats:?}");
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
                    ("redeliveries", stats.redeliveries),
                    ("duplicates_skipped", stats.duplicates_skipped),
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

/// Typed events per broker, over [`TYPED_OWNERS`] posts.
const TYPED_EVENTS: usize = 600;
const TYPED_OWNERS: i64 = 40;
/// The blog post's keys, in the order of [`post_totals`]' arrays.
const POST_KEYS: [Key; 3] = [Key::Likes, Key::Comments, Key::Views];

backend_test! {
    /// 600 events per broker published through the typed API,
    /// `Publish::publish` with the blog's `post` entity handle and its `Key`
    /// enum (`views` is counted per day too), on each broker's own
    /// publisher: every send is confirmed under a new UUIDv7 id, the
    /// consumer (its tables registered with the typed handle) applies each
    /// once, and the totals and daily `views` buckets are the sums
    /// published. A key that is no key, through the untyped handle of the
    /// same table, is refused by the publisher and never sent.
    async fn typed_publish_through_each_broker(t: TestDb) {
        let posts = post::Entity::counters();
        posts
            .create_table(&t.db)
            .await
            .expect("create post_counters");
        counter_mq::create_table(&t.db)
            .await
            .expect("create the dedup table");
        for (n, broker) in mq::BROKERS.into_iter().enumerate() {
            let Some(bus) = Bus::open(broker, t.backend, "typed_publish").await else {
                continue;
            };
            // Posts of each broker's own: both write `post_counters`.
            let owners: Vec<i64> = (1..=TYPED_OWNERS)
                .map(|o| 1_000 * (n as i64 + 1) + o)
                .collect();
            let mut rng = StdRng::seed_from_u64(90 + n as u64);
            let events: Vec<(i64, usize, i64)> = (0..TYPED_EVENTS)
                .map(|_| {
                    (
                        owners[rng.random_range(0..owners.len())],
                        rng.random_range(0..POST_KEYS.len()),
                        rng.random_range(-3..=12),
                    )
                })
                .collect();
            let refused = match &bus {
                Bus::Nats { js, .. } => {
                    let publisher = JetStreamPublisher::new(js.clone());
                    publisher
                        .publish(&posts.untyped(), owners[0], "not a key!", 1)
                        .await
                }
                Bus::Amqp { queue } => {
                    queue
                        .publisher()
                        .await
                        .publish(&posts.untyped(), owners[0], "not a key!", 1)
                        .await
                }
            };
            assert!(
                refused.is_err(),
                "{broker}: a bad key was sent: {refused:?}"
            );
            let sent = match &bus {
                Bus::Nats { js, .. } => {
                    publish_typed(&JetStreamPublisher::new(js.clone()), posts, &events).await
                }
                Bus::Amqp { queue } => {
                    publish_typed(&queue.publisher().await, posts, &events).await
                }
            };
            let ids: HashSet<&str> = sent.iter().map(|s| s.id.as_str()).collect();
            assert_eq!(ids.len(), TYPED_EVENTS, "{broker}: one new id per event");
            for s in &sent {
                assert!(!s.duplicate, "{broker}: {s:?}");
                let id = uuid::Uuid::parse_str(&s.id).expect("a UUID id");
                assert_eq!(id.get_version_num(), 7, "{broker}: {s:?}");
            }
            let builder = Consumer::builder(t.db.clone(), Tables::new().with(posts))
                .batch_size(200)
                .max_wait(Duration::from_millis(50))
                .retention(Retention::keep_for(Duration::from_secs(48 * 3600)));
            // Until every event is applied; a message more (the refused one,
            // had it been sent) fails the count below.
            let stats = bus
                .consume(
                    builder,
                    &t.db,
                    TYPED_EVENTS,
                    TYPED_EVENTS,
                    Duration::from_secs(60),
                )
                .await;
            let source = bus.source_name();
            bus.finish().await;
            assert_eq!(
                (stats.messages, stats.applied, stats.rejected),
                (TYPED_EVENTS as u64, TYPED_EVENTS as u64, 0),
                "{broker}: {stats:?}"
            );
            let expected = post_totals(&events);
            let counts = posts
                .counts_many(&t.db, &owners)
                .await
                .expect("read the totals");
            let now = chrono::Utc::now();
            let days = posts
                .series_many(
                    &t.db,
                    &owners,
                    Key::Views,
                    now - chrono::Duration::days(2),
                    now + chrono::Duration::days(1),
                )
                .await
                .expect("the daily views");
            let mut wrong_totals = 0;
            for owner in &owners {
                let want = expected.get(owner).copied().unwrap_or_default();
                let c = &counts[owner];
                let in_days: i64 = days[owner].iter().map(|(_, v)| *v).sum();
                wrong_totals += [c.likes, c.comments, c.views, in_days]
                    .iter()
                    .zip([want[0], want[1], want[2], want[2]])
                    .filter(|(have, want)| **have != *want)
                    .count() as u64;
            }
            // Each event is one message: ids never recorded are lost,
            // applications beyond one per id doubled.
            let recorded = counter_mq::applied_count(&t.db, &source)
                .await
                .expect("a count");
            let tally = Tally {
                lost: (TYPED_EVENTS as u64).saturating_sub(recorded),
                doubled: stats.applied.saturating_sub(recorded),
                wrong_totals,
            };
            report(
                &format!("mq_typed_publish_{broker}"),
                t.backend,
                tally,
                &[
                    ("messages", stats.messages),
                    ("redeliveries", stats.redeliveries),
                    ("duplicates_skipped", stats.duplicates_skipped),
                    ("owners", owners.len() as u64),
                    ("refused_at_publish", 1),
                ],
            );
        }
        t.finish().await;
    }
}

/// Publishes each `(owner, key index, delta)` event through the typed API,
/// 16 at a time.
async fn publish_typed<P: Publish>(
    publisher: &P,
    posts: &EntityCounters<post::Entity>,
    events: &[(i64, usize, i64)],
) -> Vec<Sent> {
    use futures_util::{StreamExt, stream};
    stream::iter(events)
        .map(|&(owner, key, delta)| async move {
            publisher
                .publish(posts, owner, POST_KEYS[key], delta)
                .await
                .expect("published")
        })
        .buffered(16)
        .collect()
        .await
}

/// Each owner's expected likes, comments and views.
fn post_totals(events: &[(i64, usize, i64)]) -> HashMap<i64, [i64; 3]> {
    let mut totals: HashMap<i64, [i64; 3]> = HashMap::new();
    for &(owner, key, delta) in events {
        totals.entry(owner).or_default()[key] += delta;
    }
    totals
}
