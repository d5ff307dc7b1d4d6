//! Hostile input and the dedup table's bounds: poison messages rejected for
//! good (terminated or dead-lettered) without stopping the consumer, a
//! retention shorter than the broker's redelivery horizon refused at start,
//! and expired dedup rows pruned.

use std::time::Duration;

use counter_mq::{MqError, Retention, Source};
use counter_tests::{
    TestDb, backend_test,
    mq::{
        self, AmqpQueue, AnyPublisher, Broker, Bus, PrivateNats, Workload, jetstream, nats_source,
        stream_ready, tally, test_stream,
    },
    raw, sql,
};
use sea_orm::{ConnectionTrait, DatabaseConnection};

use super::{consumer, report, tables};

/// The owner whose every slot is pre-filled, so `i64::MAX` more overflows
/// whichever slot it lands in: the database refuses that message alone.
const FULL_OWNER: i64 = 1_000_000;

/// Messages the consumer must reject, each for its own reason.
fn poison(table: &str, with_huge: bool) -> Vec<Vec<u8>> {
    let mut bad: Vec<Vec<u8>> = vec![
        b"not json at all".to_vec(),
        br#"{"v":2,"id":"p-version","t":"x","d":[[1,"likes",1]]}"#.to_vec(),
        br#"{"v":1,"id":"p-table","t":"no_such_table","d":[[1,"likes",1]]}"#.to_vec(),
        format!(r#"{{"v":1,"id":"p-key","t":"{table}","d":[[1,"not a key!",1]]}}"#).into_bytes(),
        format!(r#"{{"v":1,"id":"p-owner","t":"{table}","d":[["seven","likes",1]]}}"#).into_bytes(),
        format!(r#"{{"v":1,"id":"p-fold","t":"{table}","d":[[1,"likes",9223372036854775807],[1,"likes",1]]}}"#).into_bytes(),
        format!(r#"{{"v":1,"id":"p-slot","t":"{table}","d":[[{FULL_OWNER},"likes",9223372036854775807]]}}"#).into_bytes(),
        format!(r#"{{"v":1,"id":"p delta","t":"{table}","d":[[1,"likes",1]]}}"#).into_bytes(),
        format!(r#"{{"v":1,"id":"p-deep","t":"{table}","d":{}1{}}}"#, "[".repeat(5_000), "]".repeat(5_000)).into_bytes(),
    ];
    if with_huge {
        // Larger than the consumer's limit (JetStream's own limit, 1 MB by
        // default, refuses it at publish).
        bad.push(
            format!(
                r#"{{"v":1,"id":"p-huge","t":"{table}","d":[[1,"{}",1]]}}"#,
                "k".repeat(1 << 20)
            )
            .into_bytes(),
        );
    }
    bad
}

async fn fill_slots(db: &DatabaseConnection, table: &str) {
    for slot in 0..4 {
        raw::insert_slot(db, table, FULL_OWNER, "likes", slot, 1).await;
    }
}

backend_test! {
    /// Poison messages among 500 good ones on each broker: each is rejected
    /// once (JetStream: terminated, nothing left pending; RabbitMQ: in the
    /// dead-letter queue), the good ones all apply, and the counter whose
    /// slot would overflow keeps its value.
    async fn poison_messages_are_rejected(t: TestDb) {
        for broker in mq::BROKERS {
            let table = format!("poison_{broker}");
            let posts = tables(&t.db, &table).await;
            fill_slots(&t.db, &table).await;
            let workload = Workload::random(&table, 500, 30, 51, &format!("ok-{broker}"));
            let bad = poison(&table, broker == Broker::Amqp);
            let Some(bus) = Bus::open(broker, t.backend, "poison").await else {
                continue;
            };
            let publisher = bus.publisher().await;
            let (first, rest) = workload.messages.split_at(250);
            publish_all(&publisher, first).await;
            for bytes in &bad {
                bus.publish_raw(&table, bytes).await;
            }
            publish_all(&publisher, rest).await;
            let deliveries = workload.messages.len() + bad.len();
            let stats = bus
                .consume(
                    consumer(&t.db, &posts),
                    &t.db,
                    workload.distinct(),
                    deliveries,
                    Duration::from_secs(60),
                )
                .await;
            match &bus {
                Bus::Nats { js, .. } => {
                    let stream = js.get_stream("COUNTERS").await.unwrap();
                    let mut durable = stream
                        .get_consumer::<counter_mq::async_nats::jetstream::consumer::pull::Config>(
                            "counter-writer",
                        )
                        .await
                        .unwrap();
                    let info = durable.info().await.unwrap();
                    assert_eq!(
                        (info.num_pending, info.num_ack_pending),
                        (0, 0),
                        "nothing left to redeliver"
                    );
                }
                Bus::Amqp { queue } => {
                    let dead = queue.settings.dead_letter_queue.clone().unwrap();
                    let mut in_dead = 0;
                    for _ in 0..100 {
                        in_dead = queue.depth(&dead).await;
                        if in_dead as usize >= bad.len() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    assert_eq!(
                        in_dead as usize,
                        bad.len(),
                        "every poison message dead-lettered"
                    );
                    assert_eq!(queue.depth(&queue.settings.name).await, 0);
                }
            }
            bus.finish().await;
            assert_eq!(stats.rejected as usize, bad.len(), "{broker}: {stats:?}");
            assert_eq!(
                posts.get(&t.db, FULL_OWNER, "likes").await.unwrap(),
                4,
                "the refused delta left no trace"
            );
            let tally = tally(&t.db, &posts, &workload).await;
            report(
                &format!("mq_poison_{broker}"),
                t.backend,
                tally,
                &[
                    ("messages", stats.messages),
                    ("redeliveries", stats.redeliveries),
                    ("duplicates_skipped", stats.duplicates_skipped),
                    ("poison", bad.len() as u64),
                    ("rejected", stats.rejected),
                ],
            );
        }
        t.finish().await;
    }
}

async fn publish_all(publisher: &AnyPublisher, messages: &[counter_mq::CounterMessage]) {
    use counter_mq::Publish;
    for m in messages {
        publisher.send(m).await.expect("published");
    }
}

backend_test! {
    /// A dedup retention shorter than the broker's redelivery horizon is
    /// refused at start (JetStream's `max_age` + 1 h; RabbitMQ's message TTL
    /// + 1 h); `Retention::forever` is accepted; rows older than the
    /// retention are pruned in bounded statements, newer ones kept.
    async fn retention_is_checked_and_pruned(t: TestDb) {
        let posts = tables(&t.db, "retained").await;
        if let Some(bin) = mq::nats_server(t.backend, "retention") {
            let server = PrivateNats::start(&bin);
            let js = jetstream(&[server.url()]).await;
            stream_ready(&js, &test_stream(1)).await; // max_age 10 min
            let short = consumer(&t.db, &posts)
                .retention(Retention::keep_for(Duration::from_secs(3600)))
                .build(nats_source(&js, "COUNTERS").await)
                .await;
            assert!(
                matches!(short, Err(MqError::RetentionTooShort { horizon: Some(h), .. }) if h == Duration::from_secs(600 + 3600)),
                "{short:?}"
            );
            // The rows must outlive the horizon: equal is not enough.
            let equal = consumer(&t.db, &posts)
                .retention(Retention::keep_for(Duration::from_secs(600 + 3600)))
                .build(nats_source(&js, "COUNTERS").await)
                .await;
            assert!(
                matches!(equal, Err(MqError::RetentionTooShort { .. })),
                "{equal:?}"
            );
            consumer(&t.db, &posts)
                .retention(Retention::keep_for(Duration::from_secs(600 + 3600 + 1)))
                .build(nats_source(&js, "COUNTERS").await)
                .await
                .expect("a retention that exceeds the horizon");
        }
        if let Some(url) = mq::amqp_url(t.backend, "retention") {
            let queue = AmqpQueue::new(&url, "retention").await; // TTL 24 h
            let short = consumer(&t.db, &posts)
                .retention(Retention::keep_for(Duration::from_secs(24 * 3600)))
                .build(queue.source(&url).await)
                .await;
            assert!(
                matches!(short, Err(MqError::RetentionTooShort { .. })),
                "{short:?}"
            );
            let mut forever = queue.settings.clone();
            forever.name = format!("{}.forever", forever.name);
            forever.message_ttl = None;
            forever.dead_letter_queue = None;
            let unbounded = counter_mq::amqp::AmqpSource::connect(&url, forever.clone(), 500)
                .await
                .unwrap();
            let refused = consumer(&t.db, &posts).build(unbounded).await;
            assert!(
                matches!(
                    refused,
                    Err(MqError::RetentionTooShort { horizon: None, .. })
                ),
                "{refused:?}"
            );
            let unbounded = counter_mq::amqp::AmqpSource::connect(&url, forever.clone(), 500)
                .await
                .unwrap();
            consumer(&t.db, &posts)
                .retention(Retention::forever())
                .build(unbounded)
                .await
                .expect("forever covers any horizon");
            let channel = queue.connection.create_channel().await.unwrap();
            channel
                .queue_delete(forever.name.as_str().into(), Default::default())
                .await
                .unwrap();
            queue.delete().await;
        }
        // Pruning, through a source that never delivers.
        let old = 12_500;
        insert_rows(&t.db, "idle", old, 0).await;
        insert_rows(&t.db, "idle", 100, now()).await;
        insert_rows(&t.db, "other", 50, 0).await;
        let consumer = consumer(&t.db, &posts)
            .prune_every(Duration::from_secs(1))
            .build(Idle)
            .await
            .expect("a consumer");
        let stats = consume_until_pruned(consumer, old).await;
        assert_eq!(stats.pruned, old as u64);
        assert_eq!(
            counter_mq::applied_count(&t.db, "idle").await.unwrap(),
            100,
            "recent rows stay"
        );
        assert_eq!(
            counter_mq::applied_count(&t.db, "other").await.unwrap(),
            50,
            "other sources' rows stay"
        );
        // The idle source delivers nothing: nothing to lose or double.
        assert_eq!((stats.messages, stats.applied), (0, 0), "{stats:?}");
        report(
            "mq_retention",
            t.backend,
            mq::Tally::default(),
            &[
                ("messages", stats.messages),
                ("redeliveries", stats.redeliveries),
                ("duplicates_skipped", stats.duplicates_skipped),
                ("pruned", stats.pruned),
                ("kept", 100),
            ],
        );
        t.finish().await;
    }
}

async fn consume_until_pruned(
    consumer: counter_mq::Consumer<Idle>,
    rows: usize,
) -> counter_mq::ConsumerStats {
    mq::run_until(
        consumer,
        Duration::from_secs(30),
        Duration::ZERO,
        |stats| async move { stats.pruned as usize >= rows },
    )
    .await
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// `n` dedup rows of `source` applied at Unix second `at`, in statements of
/// 1,000 rows.
async fn insert_rows(db: &DatabaseConnection, source: &str, n: usize, at: i64) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(1_000) {
        let values: Vec<String> = chunk
            .iter()
            .map(|i| format!("('{source}', 'id-{at}-{i}', {at})"))
            .collect();
        db.execute_unprepared(&format!(
            "INSERT INTO {} (source, msg_id, applied_at) VALUES {}",
            counter_mq::APPLIED_MESSAGES,
            values.join(",")
        ))
        .await
        .expect("insert dedup rows");
    }
}

/// A source that never delivers and never redelivers.
struct Idle;

impl Source for Idle {
    type Delivery = ();

    fn name(&self) -> &str {
        "idle"
    }

    async fn fetch(&mut self, _: usize, wait: Duration) -> Result<Vec<()>, MqError> {
        tokio::time::sleep(wait).await;
        Ok(Vec::new())
    }

    fn payload<'a>(&self, _: &'a ()) -> &'a [u8] {
        &[]
    }

    fn is_redelivery(&self, _: &()) -> bool {
        false
    }

    async fn lag(&mut self, _: &()) -> Option<u64> {
        None
    }

    async fn ack(&mut self, _: &[()]) -> Result<(), MqError> {
        Ok(())
    }

    async fn reject(&mut self, _: &()) -> Result<(), MqError> {
        Ok(())
    }

    async fn release(&mut self, _: &[()]) -> Result<(), MqError> {
        Ok(())
    }

    async fn redelivery_horizon(&mut self) -> Result<Option<Duration>, MqError> {
        Ok(Some(Duration::from_secs(60)))
    }
}

backend_test! {
    /// The dedup table's migration through a sea-orm-migration `Migrator`
    /// (on PostgreSQL inside the transaction the migrator opens): up, down,
    /// up again; a consumer then starts, and one whose counter table was
    /// never migrated is refused at start, naming it.
    async fn the_migration_runs_through_a_migrator(t: TestDb) {
        use sea_orm_migration::{MigrationTrait, MigratorTrait};

        struct Migrator;

        #[sea_orm_migration::async_trait::async_trait]
        impl MigratorTrait for Migrator {
            fn migrations() -> Vec<Box<dyn MigrationTrait>> {
                vec![Box::new(counter_mq::AppliedMessagesMigration)]
            }
        }

        sql::migrate_up::<Migrator>(&t.db).await.expect("up");
        sql::migrate_down::<Migrator>(&t.db).await.expect("down");
        sql::migrate_up::<Migrator>(&t.db).await.expect("up again");
        assert_eq!(counter_mq::applied_count(&t.db, "idle").await.unwrap(), 0);
        let posts = counter_tests::counters::<i64>("migrated", 4);
        let missing = consumer(&t.db, &posts).build(Idle).await;
        // By the table's name, classified as a migration not run.
        assert!(
            matches!(&missing, Err(MqError::SchemaMissing { table, .. }) if table == "migrated"),
            "{missing:?}"
        );
        assert_eq!(
            missing.as_ref().err().map(MqError::kind),
            Some(counter_core::ErrorKind::SchemaMissing)
        );
        posts
            .create_table(&t.db)
            .await
            .expect("create the counter table");
        consumer(&t.db, &posts)
            .build(Idle)
            .await
            .expect("a consumer once migrated");
        t.finish().await;
    }
}
