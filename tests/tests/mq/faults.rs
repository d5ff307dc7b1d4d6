//! Faults: the consumer's process aborted at three points of a batch (a
//! child process, the test binary run again), the database connection cut
//! mid-batch and its `COMMIT` reply lost, a nats-server killed and
//! restarted, and a 3-node JetStream cluster losing a node.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use counter_core::Counters;
use counter_mq::{
    FaultPoint,
    async_nats::{self, jetstream::Context},
    nats::JetStreamPublisher,
};
use counter_tests::{
    Backend, TestDb, backend_test,
    child::{self, SharedDb},
    mq::{
        self, AmqpQueue, AnyPublisher, Broker, Bus, NatsCluster, PrivateNats, Workload,
        consume_until, consume_until_applied, jetstream, nats_source_redelivering, stream_ready,
        tally, test_stream,
    },
    proxy::{Fault, Proxy},
};

use super::{consumer, report, tables};

/// The environment a child consumer process reads.
const CHILD: &str = "COUNTER_MQ_CHILD";
const ABORT_BATCH: u32 = 3;
const MESSAGES: usize = 600;

/// Where a child consumer finds its database, broker and queue.
struct ChildSpec {
    point: &'static str,
    db_url: String,
    schema: Option<String>,
    broker: Broker,
    broker_url: String,
    queue: String,
    table: String,
}

impl ChildSpec {
    fn encode(&self) -> String {
        [
            self.point,
            &self.db_url,
            self.schema.as_deref().unwrap_or(""),
            &self.broker.to_string(),
            &self.broker_url,
            &self.queue,
            &self.table,
        ]
        .join("\u{1f}")
    }

    fn decode(text: &str) -> Self {
        let p: Vec<&str> = text.split('\u{1f}').collect();
        Self {
            point: match p[0] {
                "before-commit" => "before-commit",
                "after-commit" => "after-commit",
                _ => "between-acks",
            },
            db_url: p[1].into(),
            schema: (!p[2].is_empty()).then(|| p[2].to_owned()),
            broker: if p[3] == "nats" {
                Broker::Nats
            } else {
                Broker::Amqp
            },
            broker_url: p[4].into(),
            queue: p[5].into(),
            table: p[6].into(),
        }
    }
}

/// The child consumer: runs only in a process started by
/// `consumer_aborted_at_each_point` (with `COUNTER_MQ_CHILD` set), and
/// aborts the process at its named point of the third batch. In an ordinary
/// test run it has nothing to do.
#[tokio::test]
async fn child_consumer_process() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let spec = ChildSpec::decode(&spec);
    let db = child::connect(&spec.db_url, spec.schema.as_deref()).await;
    let posts = counter_tests::counters::<i64>(&spec.table, 4);
    let point = FaultPoint::named(spec.point).expect("a fault point");
    let seen = Arc::new(AtomicU32::new(0));
    let hook = Arc::new(move |at: FaultPoint| {
        if at == point && seen.fetch_add(1, Ordering::SeqCst) + 1 == ABORT_BATCH {
            eprintln!("child: aborting at {at:?} of batch {ABORT_BATCH}");
            std::process::abort();
        }
    });
    // A long wait, so that each batch fills to 100 and the points fall
    // where the parent expects them.
    let builder = consumer(&db, &posts)
        .batch_size(100)
        .max_wait(Duration::from_secs(5))
        .fault_hook(hook);
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    match spec.broker {
        Broker::Nats => {
            let js = jetstream(std::slice::from_ref(&spec.broker_url)).await;
            let source = nats_source_redelivering(&js, &spec.queue).await;
            let consumer = builder.build(source).await.expect("the child's consumer");
            let _ = tokio::time::timeout(Duration::from_secs(60), consumer.run(shutdown)).await;
        }
        Broker::Amqp => {
            let settings = counter_mq::amqp::QueueSettings::named(spec.queue.clone());
            let source = counter_mq::amqp::AmqpSource::connect(&spec.broker_url, settings, 1_000)
                .await
                .expect("consume");
            let consumer = builder.build(source).await.expect("the child's consumer");
            let _ = tokio::time::timeout(Duration::from_secs(60), consumer.run(shutdown)).await;
        }
    }
    panic!("the child consumer was meant to abort at {:?}", spec.point);
}

/// Runs the child consumer and checks that it died by `SIGABRT`.
async fn run_child(spec: &ChildSpec) {
    let status = child::run("faults::child_consumer_process", CHILD, spec.encode()).await;
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(6),
        "the child must die by abort(): {status:?}"
    );
}

backend_test! {
    /// The consumer's process aborted before a batch's `COMMIT`, after it
    /// (nothing acknowledged) and between its acknowledgements, on each
    /// broker: a second consumer finishes the queue, the redelivered
    /// messages of a committed batch are skipped, and every total is exact.
    async fn consumer_aborted_at_each_point(b: Backend) {
        let Some(shared) = SharedDb::open(b, "consumer_aborted_at_each_point").await else {
            return;
        };
        let nats_bin = mq::nats_server(b, "consumer_aborted_at_each_point");
        let nats = nats_bin.as_ref().map(|bin| PrivateNats::start(bin));
        let amqp_url = mq::amqp_url(b, "consumer_aborted_at_each_point");
        for broker in mq::BROKERS {
            for (i, point) in ["before-commit", "after-commit", "between-acks"]
                .into_iter()
                .enumerate()
            {
                let table = format!("abort_{broker}_{i}");
                let posts = tables(&shared.db, &table).await;
                let workload = Workload::random(
                    &table,
                    MESSAGES,
                    40,
                    20 + i as u64,
                    &format!("ab-{broker}-{i}"),
                );
                // Ids the child's committed batches recorded: two or three
                // batches of 100, less any message the broker delivered
                // again within them (an acknowledgement later than
                // `ack_wait` on a loaded machine).
                let committed_before = match point {
                    "before-commit" => 101..=200,
                    _ => 201..=300,
                };
                // What the second consumer must receive: all but the
                // batches the child acknowledged.
                let deliveries = match point {
                    "between-acks" => MESSAGES - 250,
                    _ => MESSAGES - 200,
                };
                let (stats, applied_by_child) = match broker {
                    Broker::Nats => {
                        let Some(server) = &nats else { continue };
                        let js = jetstream(&[server.url()]).await;
                        let stream = format!("ABORT{i}");
                        let mut settings = test_stream(1);
                        settings.name = stream.clone();
                        settings.subjects = vec![format!("abort{i}.>")];
                        stream_ready(&js, &settings).await;
                        let publisher =
                            JetStreamPublisher::new(js.clone()).subject_prefix(format!("abort{i}"));
                        workload.publish(&AnyPublisher::Nats(publisher), 32).await;
                        // Bind the durable consumer before the child does.
                        drop(nats_source_redelivering(&js, &stream).await);
                        run_child(&ChildSpec {
                            point,
                            db_url: shared.url.clone(),
                            schema: shared.schema.clone(),
                            broker,
                            broker_url: server.url(),
                            queue: stream.clone(),
                            table: table.clone(),
                        })
                        .await;
                        let by_child = counter_mq::applied_count(&shared.db, &stream)
                            .await
                            .expect("a count");
                        let source = nats_source_redelivering(&js, &stream).await;
                        (
                            consume_until(
                                consumer(&shared.db, &posts)
                                    .build(source)
                                    .await
                                    .expect("a consumer"),
                                &shared.db,
                                &stream,
                                workload.distinct(),
                                deliveries,
                                Duration::from_secs(60),
                            )
                            .await,
                            by_child,
                        )
                    }
                    Broker::Amqp => {
                        let Some(url) = &amqp_url else { continue };
                        let queue = AmqpQueue::new(url, &format!("abort{i}")).await;
                        workload
                            .publish(&AnyPublisher::Amqp(queue.publisher().await), 32)
                            .await;
                        let name = queue.settings.name.clone();
                        run_child(&ChildSpec {
                            point,
                            db_url: shared.url.clone(),
                            schema: shared.schema.clone(),
                            broker,
                            broker_url: url.clone(),
                            queue: name.clone(),
                            table: table.clone(),
                        })
                        .await;
                        let by_child = counter_mq::applied_count(&shared.db, &name)
                            .await
                            .expect("a count");
                        let source = queue.source(url).await;
                        let stats = consume_until(
                            consumer(&shared.db, &posts)
                                .build(source)
                                .await
                                .expect("a consumer"),
                            &shared.db,
                            &name,
                            workload.distinct(),
                            deliveries,
                            Duration::from_secs(60),
                        )
                        .await;
                        queue.delete().await;
                        (stats, by_child)
                    }
                };
                assert!(
                    committed_before.contains(&applied_by_child),
                    "{broker} {point}: the child committed {applied_by_child} ids"
                );
                // The committed batch the child did not (fully) acknowledge
                // comes back and is skipped whole: 100 messages after the
                // commit, at least the unacknowledged half between the
                // acknowledgements (acknowledgements are not confirmed by
                // either broker, so some of the first half may come back
                // too, as may late-acknowledged ones on a loaded machine).
                let expected_duplicates = match point {
                    "before-commit" => 0..=u64::MAX,
                    "after-commit" => 100..=u64::MAX,
                    _ => 50..=u64::MAX,
                };
                assert!(
                    expected_duplicates.contains(&stats.duplicates_skipped),
                    "{broker} {point}: {stats:?}"
                );
                let tally = tally(&shared.db, &posts, &workload).await;
                report(
                    &format!("mq_abort_{}_{broker}", point.replace('-', "_")),
                    b,
                    tally,
                    &[
                        ("messages", MESSAGES as u64),
                        ("applied_by_child", applied_by_child),
                        ("redeliveries", stats.redeliveries),
                        ("duplicates_skipped", stats.duplicates_skipped),
                    ],
                );
            }
        }
        shared.finish().await;
    }
}

backend_test! {
    #[backends(postgres, mysql)]
    /// The consumer's database connection cut in the middle of a batch
    /// (after its dedup insert) three times, and three `COMMIT` replies
    /// lost: each batch is retried, the lost-reply ones find their ids
    /// recorded and skip them all.
    async fn database_cut_mid_batch(t: TestDb) {
        let addr = t.server_addr().expect("a server");
        for broker in mq::BROKERS {
            let table = format!("cut_{broker}");
            let posts = tables(&t.db, &table).await;
            let workload = Workload::random(&table, 3_000, 60, 31, &format!("cut-{broker}"));
            let proxy = Proxy::start(&addr).await.expect("a proxy");
            let via = t
                .connect_via(&proxy.addr().to_string(), 2)
                .await
                .expect("connect through the proxy");
            let Some(bus) = Bus::open(broker, t.backend, "database_cut").await else {
                continue;
            };
            workload.publish(&bus.publisher().await, 32).await;
            let name = bus.source_name();
            // Armed once the consumer runs (a cut during its start-up probe
            // would only stop it from starting).
            let faults = async {
                wait_until_async(|| async {
                    counter_mq::applied_count(&t.db, &name).await.unwrap_or(0) > 0
                })
                .await;
                for _ in 0..3 {
                    let cuts = proxy.cuts();
                    proxy.arm_cut_in_transaction(1);
                    wait_until(|| proxy.cuts() > cuts).await;
                    let fired = proxy.fired();
                    proxy.arm(Fault::CutAfterCommit);
                    wait_until(|| proxy.fired() > fired).await;
                }
            };
            let run = bus.consume(
                consumer(&via, &posts).batch_size(100),
                &t.db,
                workload.distinct(),
                0,
                Duration::from_secs(90),
            );
            let (stats, ()) = tokio::join!(run, faults);
            bus.finish().await;
            assert_eq!(proxy.cuts(), 3, "{broker}: cuts mid-batch");
            assert_eq!(proxy.fired(), 3, "{broker}: lost COMMIT replies");
            assert!(stats.failed_attempts >= 6, "{broker}: {stats:?}");
            assert!(
                stats.duplicates_skipped >= 3,
                "{broker}: a retried committed batch skips its ids: {stats:?}"
            );
            assert_eq!(
                counter_mq::applied_count(&t.db, &name).await.unwrap() as usize,
                workload.distinct()
            );
            let tally = tally(&t.db, &posts, &workload).await;
            report(
                &format!("mq_database_cut_{broker}"),
                t.backend,
                tally,
                &[
                    ("messages", stats.messages),
                    ("redeliveries", stats.redeliveries),
                    ("cuts_mid_batch", proxy.cuts()),
                    ("lost_commit_replies", proxy.fired()),
                    ("failed_attempts", stats.failed_attempts),
                    ("duplicates_skipped", stats.duplicates_skipped),
                ],
            );
            via.close().await.ok();
        }
        t.finish().await;
    }
}

async fn wait_until(done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "a fault never fired");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Publishes `workload` (through a client of its own to `publisher_urls`)
/// while a consumer on `consumer_js` runs, and runs `fault` once a third of
/// it is applied; returns the consumer's counters.
async fn publish_and_consume_through<F>(
    t: &TestDb,
    posts: &Counters<i64>,
    consumer_js: &Context,
    publisher_urls: &[String],
    workload: &Workload,
    fault: F,
) -> counter_mq::ConsumerStats
where
    F: std::future::Future<Output = ()>,
{
    let publisher = AnyPublisher::Nats(
        JetStreamPublisher::new(jetstream(publisher_urls).await).retry_for(Duration::from_secs(60)),
    );
    let source = nats_source_redelivering(consumer_js, "COUNTERS").await;
    let run = consume_until_applied(
        consumer(&t.db, posts)
            .build(source)
            .await
            .expect("a consumer"),
        &t.db,
        "COUNTERS",
        workload.distinct(),
        Duration::from_secs(120),
    );
    let publish = workload.publish(&publisher, 16);
    let third = workload.distinct() as u64 / 3;
    let injected = async {
        wait_until_async(|| async {
            counter_mq::applied_count(&t.db, "COUNTERS")
                .await
                .unwrap_or(0)
                >= third
        })
        .await;
        fault.await;
    };
    let (stats, _, ()) = tokio::join!(run, publish, injected);
    stats
}

async fn wait_until_async<F, Fut>(done: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done().await {
        assert!(
            Instant::now() < deadline,
            "the workload never got a third of the way"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

backend_test! {
    /// A private nats-server SIGKILLed a third of the way through and
    /// restarted half a second later, while publishers and the consumer
    /// run: both reconnect, and every message is applied once.
    async fn nats_server_killed_and_restarted(t: TestDb) {
        let Some(bin) = mq::nats_server(t.backend, "nats_server_killed_and_restarted") else {
            return t.finish().await;
        };
        let posts = tables(&t.db, "killed").await;
        let workload = Workload::random("killed", 3_000, 80, 41, "kill");
        let server = Arc::new(PrivateNats::start(&bin));
        {
            let js = jetstream(&[server.url()]).await;
            stream_ready(&js, &test_stream(1)).await;
        }
        let killer = server.clone();
        let fault = async move {
            tokio::task::spawn_blocking(move || {
                killer.kill();
                std::thread::sleep(Duration::from_millis(500));
                killer.restart();
            })
            .await
            .expect("kill and restart");
        };
        let urls = [server.url()];
        let consumer_js = jetstream(&urls).await;
        let stats =
            publish_and_consume_through(&t, &posts, &consumer_js, &urls, &workload, fault).await;
        let tally = tally(&t.db, &posts, &workload).await;
        report(
            "mq_nats_restart",
            t.backend,
            tally,
            &[
                ("messages", stats.messages),
                ("server_kills", 1),
                ("redeliveries", stats.redeliveries),
                ("duplicates_skipped", stats.duplicates_skipped),
                ("failed_attempts", stats.failed_attempts),
            ],
        );
        t.finish().await;
    }
}

backend_test! {
    /// A private 3-node JetStream cluster, the stream (and so its durable
    /// consumer) replicated 3 times. A third of the way through, the node
    /// that leads the durable consumer, which is also the node the
    /// consumer's client is connected to, is SIGKILLed: the client
    /// reconnects to another node, the durable elects a new leader, the
    /// publishers fail over, and every message is applied once.
    async fn jetstream_cluster_loses_a_node(t: TestDb) {
        let Some(bin) = mq::nats_server(t.backend, "jetstream_cluster_loses_a_node") else {
            return t.finish().await;
        };
        let posts = tables(&t.db, "cluster").await;
        let workload = Workload::random("cluster", 2_000, 80, 43, "cl");
        let cluster = Arc::new(NatsCluster::start(&bin).await);
        let admin = jetstream(&cluster.urls()).await;
        stream_ready(&admin, &test_stream(3)).await;
        // The durable (redelivering after 1 s), bound before anything reads
        // it, and the node leading it.
        drop(nats_source_redelivering(&admin, "COUNTERS").await);
        let names = server_names(&cluster).await;
        let leader = leader_of(&admin, Led::Durable, None)
            .await
            .expect("the durable consumer has a leader");
        let stream_leader = leader_of(&admin, Led::Stream, None).await;
        let victim = names
            .iter()
            .position(|name| *name == leader)
            .unwrap_or_else(|| panic!("the leader {leader} is none of {names:?}"));
        // The consumer's client: connected to the victim, the others next.
        let first = cluster.nodes[victim].url();
        let mut urls = vec![first.clone()];
        urls.extend(cluster.urls().into_iter().filter(|u| *u != first));
        let client = async_nats::ConnectOptions::new()
            .retain_servers_order()
            .connection_timeout(Duration::from_secs(5))
            .request_timeout(Some(Duration::from_secs(10)))
            .connect(urls)
            .await
            .expect("connect the consumer's client");
        assert_eq!(
            client.server_info().server_name,
            leader,
            "the consumer's client is connected to the durable's leader"
        );
        let killer = cluster.clone();
        let fault = async move {
            tokio::task::spawn_blocking(move || killer.nodes[victim].kill())
                .await
                .expect("kill a node");
        };
        let stats = publish_and_consume_through(
            &t,
            &posts,
            &async_nats::jetstream::new(client.clone()),
            &cluster.urls(),
            &workload,
            fault,
        )
        .await;
        // The kill mattered: the client connected again, elsewhere, and
        // the durable is led by another node.
        let connects = client.statistics().connects.load(Ordering::Relaxed);
        let now_on = client.server_info().server_name;
        assert!(
            connects >= 2 && now_on != leader,
            "the consumer's client stayed on {now_on} ({connects} connects); the victim was {leader}"
        );
        let new_leader = leader_of(&admin, Led::Durable, Some(&leader)).await;
        assert!(
            new_leader.as_ref().is_some_and(|l| *l != leader),
            "the durable's leader was {leader}, now {new_leader:?}"
        );
        let tally = tally(&t.db, &posts, &workload).await;
        report(
            "mq_jetstream_cluster",
            t.backend,
            tally,
            &[
                ("messages", stats.messages),
                ("replicas", 3),
                ("nodes_killed", 1),
                ("consumer_leader_killed", 1),
                (
                    "stream_leader_killed",
                    u64::from(stream_leader.as_deref() == Some(leader.as_str())),
                ),
                ("client_connects", connects),
                ("redeliveries", stats.redeliveries),
                ("duplicates_skipped", stats.duplicates_skipped),
                ("failed_attempts", stats.failed_attempts),
            ],
        );
        t.finish().await;
    }
}

/// Each node's server name, by its index in the cluster.
async fn server_names(cluster: &NatsCluster) -> Vec<String> {
    let mut names = Vec::new();
    for url in cluster.urls() {
        let client = async_nats::connect(url.as_str())
            .await
            .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
        names.push(client.server_info().server_name);
        drop(client);
    }
    names
}

/// What a JetStream RAFT leader leads.
#[derive(Debug, Clone, Copy)]
enum Led {
    Stream,
    Durable,
}

/// The server name of the node leading the `COUNTERS` stream or its
/// durable consumer, once one is elected (and, with `not`, once it is
/// another node than that one); `None` if none is within 30 s.
async fn leader_of(js: &Context, led: Led, not: Option<&str>) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = None;
    while Instant::now() < deadline {
        let cluster = match js.get_stream("COUNTERS").await {
            Ok(mut stream) => match led {
                Led::Stream => stream.info().await.ok().and_then(|i| i.cluster.clone()),
                Led::Durable => stream
                    .consumer_info("counter-writer")
                    .await
                    .ok()
                    .and_then(|i| i.cluster),
            },
            Err(_) => None,
        };
        last = cluster.and_then(|c| c.leader);
        if last.as_deref().is_some_and(|leader| not != Some(leader)) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    last
}

backend_test! {
    /// Every RabbitMQ connection, the consumer's and the publisher's, cut
    /// twice while 3,000 messages are published and consumed (through the
    /// test proxy): both connect again, the deliveries the dead channels
    /// held come back and are skipped or applied, every total is exact.
    async fn amqp_connections_cut(t: TestDb) {
        let Some(url) = mq::amqp_url(t.backend, "amqp_connections_cut") else {
            return t.finish().await;
        };
        let posts = tables(&t.db, "amqp_cut").await;
        let workload = Workload::random("amqp_cut", 3_000, 60, 61, "ac");
        let queue = AmqpQueue::new(&url, "cut").await;
        let proxy = Proxy::start("127.0.0.1:5672").await.expect("a proxy");
        let via = format!("amqp://guest:guest@{}/%2f", proxy.addr());
        let publisher = AnyPublisher::Amqp(
            counter_mq::amqp::AmqpPublisher::connect(&via, queue.settings.clone())
                .await
                .expect("a publisher through the proxy"),
        );
        let source = queue.source(&via).await;
        let name = queue.settings.name.clone();
        let run = consume_until_applied(
            consumer(&t.db, &posts)
                .build(source)
                .await
                .expect("a consumer"),
            &t.db,
            &name,
            workload.distinct(),
            Duration::from_secs(120),
        );
        let publish = workload.publish(&publisher, 16);
        let cuts = async {
            for third in [1, 2] {
                let target = workload.distinct() as u64 * third / 3;
                wait_until_async(|| async {
                    counter_mq::applied_count(&t.db, &name).await.unwrap_or(0) >= target
                })
                .await;
                proxy.cut_all();
            }
        };
        let (stats, _, ()) = tokio::join!(run, publish, cuts);
        queue.delete().await;
        assert!(
            proxy.connections() >= 4,
            "both connections made again after each cut"
        );
        let tally = tally(&t.db, &posts, &workload).await;
        report(
            "mq_amqp_cut",
            t.backend,
            tally,
            &[
                ("messages", stats.messages),
                ("connection_cuts", 2),
                ("connections", proxy.connections()),
                ("redeliveries", stats.redeliveries),
                ("duplicates_skipped", stats.duplicates_skipped),
                ("failed_attempts", stats.failed_attempts),
            ],
        );
        t.finish().await;
    }
}
