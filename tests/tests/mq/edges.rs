//! The edges between a publisher and its broker, in the order people
//! deploy: a publisher that starts before any consumer ever ran, the queue
//! deleted under a running publisher, and a caller that retries after a
//! timeout whose first attempt did reach the broker. Nothing the broker
//! confirmed may be lost, and no retry may count an event twice.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use counter_core::Counters;
use counter_mq::{
    Consumer, ConsumerStats, MqError, Publish, Source, Tables, amqp::AmqpPublisher,
    nats::JetStreamPublisher,
};
use counter_tests::{
    TestDb, backend_test,
    mq::{
        self, AmqpQueue, AnyPublisher, Broker, Bus, PrivateNats, Workload, jetstream, nats_source,
        stream_ready, tally, test_stream,
    },
    proxy::Proxy,
};
use sea_orm::DatabaseConnection;

use super::{consumer, report, tables};

/// Runs `consumer` until it is idle (or 60 s), as a deploy's drain would.
async fn drain<S: Source + 'static>(consumer: Consumer<S>) -> ConsumerStats {
    consumer
        .run_until_idle(tokio::time::sleep(Duration::from_secs(60)))
        .await
        .expect("the consumer ran")
}

backend_test! {
    /// A publisher that starts before any consumer ever ran: it publishes
    /// 600 events into a queue nobody declared (RabbitMQ: the publisher
    /// declares it; JetStream: the stream the publisher ensures, as the
    /// guide's publisher does), every publish confirmed; a consumer started
    /// afterwards finds every one in one `run_until_idle`, the guide's
    /// drain (which once ended early when a fetch came back empty on a
    /// loaded machine). Its lag reads 0 once it is idle, also on RabbitMQ,
    /// whose figure once stayed at the last batch's.
    #[label = "mq_publish_first"]
    async fn a_publisher_before_any_consumer_loses_nothing(t: TestDb) {
        for broker in mq::BROKERS {
            let table = format!("first_{broker}");
            let posts = tables(&t.db, &table).await;
            let workload = Workload::random(&table, 600, 40, 31, &format!("pf-{broker}"));
            let (stats, returned) = match broker {
                Broker::Nats => {
                    let Some(bus) = Bus::open(broker, t.backend, "publish_first").await else {
                        continue;
                    };
                    workload.publish(&bus.publisher().await, 16).await;
                    let Bus::Nats { js, .. } = &bus else { unreachable!() };
                    // One drain: it ends only once the stream has nothing
                    // pending for it.
                    let source = nats_source(js, "COUNTERS").await;
                    let consumer = consumer(&t.db, &posts).build(source).await;
                    let stats = drain(consumer.expect("a consumer")).await;
                    bus.finish().await;
                    (stats, 0)
                }
                Broker::Amqp => {
                    let Some(url) = mq::amqp_url(t.backend, "publish_first") else {
                        continue;
                    };
                    let queue = AmqpQueue::named(&url, "publish_first").await;
                    assert!(!queue.exists(&queue.settings.name).await, "the queue is new");
                    let publisher = queue.publisher().await;
                    assert!(
                        queue.exists(&queue.settings.name).await,
                        "the publisher declared its queue"
                    );
                    workload
                        .publish(&AnyPublisher::Amqp(publisher.clone()), 16)
                        .await;
                    assert_eq!(queue.depth(&queue.settings.name).await, 600);
                    let source = queue.source(&queue.url).await;
                    let consumer = consumer(&t.db, &posts).build(source).await;
                    let stats = drain(consumer.expect("a consumer")).await;
                    let returned = publisher.returned();
                    queue.delete().await;
                    (stats, returned)
                }
            };
            assert_eq!(stats.lag, Some(0), "{broker}: idle, nothing waits: {stats:?}");
            let tally = tally(&t.db, &posts, &workload).await;
            report(
                &format!("mq_publish_first_{broker}"),
                t.backend,
                tally,
                &[
                    ("published", 600),
                    ("messages", stats.messages),
                    ("redeliveries", stats.redeliveries),
                    ("duplicates_skipped", stats.duplicates_skipped),
                    ("returned", returned),
                    ("lag_when_idle", stats.lag.unwrap_or(u64::MAX)),
                ],
            );
        }
        t.finish().await;
    }
}

backend_test! {
    /// A RabbitMQ queue deleted twice under its publishers, with no consumer
    /// running: once while a publisher publishes (RabbitMQ 3.10 closes that
    /// connection with an internal error), once while a second publisher,
    /// connected before, sits idle (its next publish is returned unrouted:
    /// not a success). Each publisher declares the queue again and sends
    /// again; every event published after a deletion returned is counted
    /// (what the queue held when it was deleted went with it: the
    /// deletion's doing).
    #[label = "mq_queue_deleted"]
    async fn a_queue_deleted_under_a_publisher_loses_no_later_event(t: TestDb) {
        let Some(url) = mq::amqp_url(t.backend, "queue_deleted") else {
            return t.finish().await;
        };
        let before = tables(&t.db, "deleted_before").await;
        let busy = tables(&t.db, "deleted_busy").await;
        let idle = tables(&t.db, "deleted_idle").await;
        let queue = AmqpQueue::named(&url, "queue_deleted").await;
        let publisher = queue.publisher().await;
        let idle_publisher = queue.publisher().await;
        let early = Workload::random("deleted_before", 300, 20, 41, "qd-early");
        let after_busy = Workload::random("deleted_busy", 450, 20, 43, "qd-busy");
        let after_idle = Workload::random("deleted_idle", 450, 20, 47, "qd-idle");
        let any = AnyPublisher::Amqp(publisher.clone());
        early.publish(&any, 8).await;
        // Deleted while the publisher keeps publishing, one at a time.
        let deleted = Arc::new(AtomicBool::new(false));
        let deleter = tokio::spawn(delete_queue(
            url.clone(),
            queue.settings.name.clone(),
            Duration::from_millis(150),
            deleted.clone(),
        ));
        let mut while_deleting = 0u64;
        while !deleted.load(Ordering::SeqCst) {
            let message = &early.messages[(while_deleting % 300) as usize];
            any.send(message).await.expect("published");
            while_deleting += 1;
            assert!(while_deleting < 100_000, "the deletion never returned");
        }
        deleter.await.expect("the deleter");
        after_busy.publish(&any, 8).await;
        assert!(queue.exists(&queue.settings.name).await, "declared again");
        let tables = Tables::new().with(&before).with(&busy).with(&idle);
        let builder = || {
            Consumer::builder(t.db.clone(), tables.clone())
                .batch_size(200)
                .max_wait(Duration::from_millis(50))
        };
        let name = queue.settings.name.clone();
        let source = queue.source(&queue.url).await;
        let mut stats = drain(builder().build(source).await.expect("a consumer")).await;
        let busy_tally = tally(&t.db, &busy, &after_busy).await;
        // Deleted again, drained and idle; the idle publisher's next publish
        // finds no queue.
        let again = Arc::new(AtomicBool::new(false));
        delete_queue(url.clone(), name.clone(), Duration::ZERO, again).await;
        assert!(!queue.exists(&name).await, "deleted");
        after_idle
            .publish(&AnyPublisher::Amqp(idle_publisher.clone()), 1)
            .await;
        let returned = idle_publisher.returned() + publisher.returned();
        assert!(returned >= 1, "the idle publisher's publish was not returned");
        let source = queue.source(&queue.url).await;
        let more = drain(builder().build(source).await.expect("a consumer")).await;
        stats.messages += more.messages;
        stats.redeliveries += more.redeliveries;
        stats.duplicates_skipped += more.duplicates_skipped;
        queue.delete().await;
        let idle_tally = tally(&t.db, &idle, &after_idle).await;
        let both = counter_tests::mq::Tally {
            lost: busy_tally.lost + idle_tally.lost,
            doubled: busy_tally.doubled + idle_tally.doubled,
            wrong_totals: busy_tally.wrong_totals + idle_tally.wrong_totals,
        };
        report(
            "mq_queue_deleted_amqp",
            t.backend,
            both,
            &[
                ("published_after_deletions", 900),
                ("published_while_deleting", while_deleting),
                ("returned", returned),
                ("messages", stats.messages),
                ("redeliveries", stats.redeliveries),
                ("duplicates_skipped", stats.duplicates_skipped),
            ],
        );
        t.finish().await;
    }
}

/// Deletes the queue `name` after `after`, then sets `deleted`.
async fn delete_queue(url: String, name: String, after: Duration, deleted: Arc<AtomicBool>) {
    tokio::time::sleep(after).await;
    let connection = counter_mq::lapin::Connection::connect(&url, Default::default())
        .await
        .expect("connect");
    let channel = connection.create_channel().await.expect("a channel");
    channel
        .queue_delete(name.as_str().into(), Default::default())
        .await
        .expect("delete the queue");
    deleted.store(true, Ordering::SeqCst);
    let _ = connection.close(0, "done".into()).await;
}

/// What a caller's retries of three events left in the counters.
struct Retried {
    /// The message of an `Unconfirmed` error, sent again.
    resent: i64,
    /// `publish_with_id` called again with its id.
    keyed: i64,
    /// `publish` called again: a second event.
    anew: i64,
}

backend_test! {
    /// A caller that retries after a timeout whose first attempt reached
    /// the broker (the broker's answer held by a proxy until the publisher
    /// gave up): `publish`'s `Unconfirmed` error carries the message, and
    /// sending that again counts once; `publish_with_id` called again with
    /// its id counts once; `publish` called again makes a second event,
    /// counted twice, which is why the safe ways exist.
    #[label = "mq_publish_retry"]
    async fn a_retry_after_a_timeout_counts_once(t: TestDb) {
        for broker in mq::BROKERS {
            let table = format!("retry_{broker}");
            let posts = tables(&t.db, &table).await;
            let retried = match broker {
                Broker::Nats => {
                    let Some(bin) = mq::nats_server(t.backend, "publish_retry") else {
                        continue;
                    };
                    let server = PrivateNats::start(&bin);
                    let js = jetstream(&[server.url()]).await;
                    stream_ready(&js, &test_stream(1)).await;
                    let proxy = Proxy::start(server.url().trim_start_matches("nats://"))
                        .await
                        .expect("a proxy");
                    let through = jetstream(&[format!("nats://{}", proxy.addr())]).await;
                    let patient = JetStreamPublisher::new(through);
                    let impatient = patient.clone().retry_for(Duration::from_millis(1_500));
                    retry_through(&proxy, &impatient, &patient, &posts).await;
                    let builder = consumer(&t.db, &posts);
                    drain(builder.build(nats_source(&js, "COUNTERS").await).await.expect("a consumer")).await;
                    retried_totals(&t.db, &posts).await
                }
                Broker::Amqp => {
                    let Some(url) = mq::amqp_url(t.backend, "publish_retry") else {
                        continue;
                    };
                    let queue = AmqpQueue::named(&url, "publish_retry").await;
                    let proxy = Proxy::start("127.0.0.1:5672").await.expect("a proxy");
                    let through = url.replace("127.0.0.1:5672", &proxy.addr().to_string());
                    assert_ne!(through, url, "the AMQP URL names 127.0.0.1:5672");
                    let patient = AmqpPublisher::connect(&through, queue.settings.clone())
                        .await
                        .expect("a publisher");
                    let impatient = patient.clone().retry_for(Duration::from_millis(1_500));
                    retry_through(&proxy, &impatient, &patient, &posts).await;
                    let builder = consumer(&t.db, &posts);
                    drain(builder.build(queue.source(&url).await).await.expect("a consumer")).await;
                    let totals = retried_totals(&t.db, &posts).await;
                    queue.delete().await;
                    totals
                }
            };
            let doubled = (retried.resent - 1).max(0) + (retried.keyed - 1).max(0);
            let lost = (1 - retried.resent).max(0) + (1 - retried.keyed).max(0);
            counter_tests::figures(
                &format!("mq_publish_retry_{broker}"),
                t.backend,
                &[
                    ("resent_total", retried.resent as u64),
                    ("keyed_total", retried.keyed as u64),
                    ("published_anew_total", retried.anew as u64),
                    ("lost", lost as u64),
                    ("doubled", doubled as u64),
                ],
            );
            assert_eq!(retried.resent, 1, "{broker}: the Unconfirmed message sent again");
            assert_eq!(retried.keyed, 1, "{broker}: publish_with_id called again");
            // The first attempt was stored: publishing anew counts twice.
            assert_eq!(retried.anew, 2, "{broker}: publish called again");
        }
        t.finish().await;
    }
}

/// With the broker's answers held, each way of publishing fails after the
/// publisher's `retry_for` although the broker stored the message; then,
/// released, each is retried its way.
/// `impatient` gives up after 1.5 s (while the answers are held); `patient`,
/// the same publisher with the default minute, retries (once released).
async fn retry_through<P: Publish>(
    proxy: &Proxy,
    impatient: &P,
    patient: &P,
    posts: &Counters<i64>,
) {
    let publisher = impatient;
    proxy.hold_replies(true);
    let unconfirmed = publisher.publish(posts, 1, "resent", 1).await;
    let Err(MqError::Unconfirmed { message, source }) = unconfirmed else {
        panic!("publish with the answer held: {unconfirmed:?}");
    };
    assert!(source.is_timeout(), "{source}");
    let keyed_id = format!("keyed-{}", message.id());
    let keyed = publisher
        .publish_with_id(&keyed_id, posts, 1, "keyed", 1)
        .await;
    assert!(
        matches!(keyed, Err(MqError::Unconfirmed { .. })),
        "{keyed:?}"
    );
    let anew = publisher.publish(posts, 1, "anew", 1).await;
    assert!(anew.is_err(), "{anew:?}");
    proxy.hold_replies(false);
    let publisher = patient;
    publisher
        .send(&message)
        .await
        .expect("the same message, sent again");
    publisher
        .publish_with_id(&keyed_id, posts, 1, "keyed", 1)
        .await
        .expect("the same id, published again");
    publisher
        .publish(posts, 1, "anew", 1)
        .await
        .expect("a new event");
}

async fn retried_totals(db: &DatabaseConnection, posts: &Counters<i64>) -> Retried {
    let got = posts
        .get_many(db, &[1], &["resent", "keyed", "anew"])
        .await
        .expect("read the totals");
    let of = |key: &str| got[&1][key];
    Retried {
        resent: of("resent"),
        keyed: of("keyed"),
        anew: of("anew"),
    }
}
