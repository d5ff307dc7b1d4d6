//! The MQ tier's test harness: private nats-server processes (one, or a
//! 3-node JetStream cluster), the shared RabbitMQ with a queue per test, a
//! workload of messages with known totals, and the check that counts what
//! was lost or doubled.
//!
//! NATS tests run when `COUNTER_TEST_NATS_SERVER` names the nats-server
//! binary (each starts servers of its own on loopback ports below the
//! ephemeral range, with JetStream's store in a temporary directory, and
//! kills them when done); RabbitMQ tests when `COUNTER_TEST_AMQP_URL` is
//! set (each declares queues of its own and deletes them).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use counter_core::Counters;
use counter_mq::{
    Change, ConsumerStats, CounterMessage, MqError, Publish, Sent, Source,
    amqp::{self, AmqpPublisher, AmqpSource, QueueSettings},
    nats::{self, ConsumerSettings, JetStreamPublisher, JetStreamSource, StreamSettings},
};
use counter_mq::{
    async_nats::{
        self,
        jetstream::{self, Context},
    },
    lapin,
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::DatabaseConnection;

use crate::{Backend, servers::free_port};

/// The nats-server binary the NATS tests start private servers of.
pub const NATS_SERVER_VAR: &str = "COUNTER_TEST_NATS_SERVER";
/// The shared RabbitMQ (`amqp://guest:guest@127.0.0.1:5672/%2f`).
pub const AMQP_URL_VAR: &str = "COUNTER_TEST_AMQP_URL";

/// A broker a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broker {
    Nats,
    Amqp,
}

impl std::fmt::Display for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Broker::Nats => "nats",
            Broker::Amqp => "amqp",
        })
    }
}

/// Both brokers, in the order tests run them.
pub const BROKERS: [Broker; 2] = [Broker::Nats, Broker::Amqp];

/// The nats-server binary, or `None` (the test says it is skipped).
pub fn nats_server(backend: Backend, label: &str) -> Option<PathBuf> {
    match std::env::var(NATS_SERVER_VAR) {
        Ok(path) if !path.trim().is_empty() => Some(PathBuf::from(path)),
        _ => {
            eprintln!("[{backend}] {label}: NATS skipped, {NATS_SERVER_VAR} is not set");
            None
        }
    }
}

/// The shared RabbitMQ's URL, or `None` (the test says it is skipped).
pub fn amqp_url(backend: Backend, label: &str) -> Option<String> {
    match std::env::var(AMQP_URL_VAR) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            eprintln!("[{backend}] {label}: RabbitMQ skipped, {AMQP_URL_VAR} is not set");
            None
        }
    }
}

/// A nats-server process of a test's own, with JetStream, its store in a
/// temporary directory that survives restarts.
pub struct PrivateNats {
    bin: PathBuf,
    port: u16,
    dir: PathBuf,
    /// Cluster arguments (`--cluster`, `--routes`, names), if a node.
    cluster: Vec<String>,
    child: Mutex<Option<Child>>,
}

impl PrivateNats {
    /// Starts a standalone server and waits until it accepts connections
    /// (on another port if the one picked was taken meanwhile).
    pub fn start(bin: &std::path::Path) -> Self {
        for _ in 0..5 {
            let server = Self::new(bin, free_port(), Vec::new());
            if server.try_start() {
                return server;
            }
        }
        panic!("no private nats-server could start on a free port");
    }

    fn new(bin: &std::path::Path, port: u16, cluster: Vec<String>) -> Self {
        let dir = std::env::temp_dir().join(format!("counter-nats-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory for nats-server");
        Self {
            bin: bin.to_owned(),
            port,
            dir,
            cluster,
            child: Mutex::new(None),
        }
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// SIGKILL: what the server had not written to its store is lost.
    pub fn kill(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and store, and waits until it
    /// accepts connections.
    pub fn restart(&self) {
        assert!(
            self.try_start(),
            "the private nats-server on {} exited at start; log:\n{}",
            self.port,
            std::fs::read_to_string(self.dir.join("nats.log")).unwrap_or_default()
        );
    }

    /// Starts the process; whether it is running and answering (not another
    /// process on its port: a server that cannot bind exits at once).
    fn try_start(&self) -> bool {
        self.kill();
        let child = Command::new(&self.bin)
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(self.dir.join("store"))
            .arg("-l")
            .arg(self.dir.join("nats.log"))
            .args(&self.cluster)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {} ({NATS_SERVER_VAR}): {e}", self.bin.display()));
        *self.child.lock().unwrap() = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the private nats-server on {} does not answer; log:\n{}",
                self.port,
                std::fs::read_to_string(self.dir.join("nats.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(50));
        let mut child = self.child.lock().unwrap();
        let running = child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)));
        if !running {
            child.take();
        }
        running
    }
}

impl Drop for PrivateNats {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Three nats-servers on loopback forming one JetStream cluster.
pub struct NatsCluster {
    pub nodes: Vec<PrivateNats>,
}

impl NatsCluster {
    /// Starts three nodes and waits until JetStream answers on every one.
    pub async fn start(bin: &std::path::Path) -> Self {
        let bin = bin.to_owned();
        tokio::task::spawn_blocking(move || {
            let client_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
            let route_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
            let routes = route_ports
                .iter()
                .map(|p| format!("nats://127.0.0.1:{p}"))
                .collect::<Vec<_>>()
                .join(",");
            let nodes: Vec<PrivateNats> = (0..3)
                .map(|i| {
                    let cluster = vec![
                        "--server_name".into(),
                        format!("n{i}-{}", client_ports[i]),
                        "--cluster_name".into(),
                        format!("counters-{}", client_ports[0]),
                        "--cluster".into(),
                        format!("nats://127.0.0.1:{}", route_ports[i]),
                        "--routes".into(),
                        routes.clone(),
                    ];
                    PrivateNats::new(&bin, client_ports[i], cluster)
                })
                .collect();
            for node in &nodes {
                node.restart();
            }
            NatsCluster { nodes }
        })
        .await
        .expect("start the NATS cluster")
    }

    /// Every node's URL, for a client that fails over between them.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(PrivateNats::url).collect()
    }
}

/// A JetStream context on `urls` (any node of a cluster), with requests
/// that wait long enough for a loaded CI box.
pub async fn jetstream(urls: &[String]) -> Context {
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connection_timeout(Duration::from_secs(5))
        .request_timeout(Some(Duration::from_secs(10)))
        .connect(urls.to_vec())
        .await
        .expect("connect to NATS");
    jetstream::new(client)
}

/// Creates `settings`' stream, retrying while a new cluster elects its
/// JetStream leader.
pub async fn stream_ready(js: &Context, settings: &StreamSettings) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match nats::ensure_stream(js, settings).await {
            Ok(()) => return,
            Err(e) if Instant::now() < deadline => {
                eprintln!("stream not ready yet: {e}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => panic!("the JetStream stream cannot be created: {e}"),
        }
    }
}

/// Stream settings for tests: a short duplicate window.
pub fn test_stream(replicas: usize) -> StreamSettings {
    StreamSettings {
        duplicate_window: Duration::from_secs(1),
        max_age: Duration::from_secs(600),
        replicas,
        ..StreamSettings::default()
    }
}

/// Consumer settings for tests: redelivery `ack_wait` after a missed
/// acknowledgement.
pub fn test_consumer(ack_wait: Duration) -> ConsumerSettings {
    ConsumerSettings {
        ack_wait,
        ..ConsumerSettings::default()
    }
}

/// A queue of the shared RabbitMQ for one test: a unique name, deleted
/// (with its dead-letter queue) by [`AmqpQueue::delete`].
pub struct AmqpQueue {
    pub url: String,
    pub connection: lapin::Connection,
    pub settings: QueueSettings,
}

impl AmqpQueue {
    /// Connects and declares a new queue named after `label`.
    pub async fn new(url: &str, label: &str) -> Self {
        let queue = Self::named(url, label).await;
        let channel = queue.connection.create_channel().await.expect("a channel");
        amqp::declare_queue(&channel, &queue.settings)
            .await
            .expect("declare the test queue");
        queue
    }

    /// Connects and names a new queue after `label`, declaring nothing: a
    /// queue that exists only once a publisher or consumer declares it.
    pub async fn named(url: &str, label: &str) -> Self {
        let connection = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| panic!("{AMQP_URL_VAR} is set but RabbitMQ is unreachable: {e}"));
        let nonce: u32 = rand::random();
        let settings = QueueSettings::named(format!("ct.{label}.{nonce:08x}"));
        Self {
            url: url.to_owned(),
            connection,
            settings,
        }
    }

    /// A consumer source on a connection of its own to `url` (as another
    /// process would have; a test proxy's address to cut it).
    pub async fn source(&self, url: &str) -> AmqpSource {
        AmqpSource::connect(url, self.settings.clone(), 1_000)
            .await
            .expect("consume the test queue")
    }

    pub async fn publisher(&self) -> AmqpPublisher {
        AmqpPublisher::connect(&self.url, self.settings.clone())
            .await
            .expect("a confirming publisher")
    }

    /// Whether `queue` exists now.
    pub async fn exists(&self, queue: &str) -> bool {
        let channel = self.connection.create_channel().await.expect("a channel");
        let options = lapin::options::QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        channel
            .queue_declare(queue.into(), options, Default::default())
            .await
            .is_ok()
    }

    /// Messages in `queue` now.
    pub async fn depth(&self, queue: &str) -> u32 {
        let channel = self.connection.create_channel().await.expect("a channel");
        let options = lapin::options::QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let queue = channel
            .queue_declare(queue.into(), options, Default::default())
            .await
            .expect("the queue exists");
        queue.message_count()
    }

    pub async fn delete(self) {
        let channel = self.connection.create_channel().await.expect("a channel");
        let mut names = vec![self.settings.name.clone()];
        names.extend(self.settings.dead_letter_queue.clone());
        for name in names {
            // Deleting a queue that is not there is not an error in AMQP.
            channel
                .queue_delete(name.as_str().into(), Default::default())
                .await
                .expect("delete the test queue");
        }
        let _ = self.connection.close(0, "done".into()).await;
    }
}

/// Either broker's publisher, for tests written once for both.
#[derive(Clone)]
pub enum AnyPublisher {
    Nats(JetStreamPublisher),
    Amqp(AmqpPublisher),
}

impl Publish for AnyPublisher {
    async fn send(&self, message: &CounterMessage) -> Result<Sent, MqError> {
        match self {
            AnyPublisher::Nats(p) => p.send(message).await,
            AnyPublisher::Amqp(p) => p.send(message).await,
        }
    }
}

/// Messages with known totals: each changes one to three counters of a few
/// owners by random deltas, and adds 1 to its owner's `events` key, whose
/// sum over owners counts how many messages were applied (so a lost or a
/// doubled message shows as such, not only as a wrong total).
pub struct Workload {
    pub table: String,
    pub messages: Vec<CounterMessage>,
}

/// The keys a workload writes.
pub const KEYS: [&str; 3] = ["likes", "views", "shares"];
/// The key that counts applied messages.
pub const EVENTS: &str = "events";

impl Workload {
    /// `n` messages over `owners` owners, reproducible from `seed`, with
    /// unique ids prefixed `prefix`.
    pub fn random(table: &str, n: usize, owners: i64, seed: u64, prefix: &str) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let messages = (0..n)
            .map(|i| {
                let mut message = CounterMessage::with_id(format!("{prefix}-{i}"), table);
                let owner: i64 = rng.random_range(1..=owners);
                message.push(change(owner, EVENTS, 1));
                for _ in 0..rng.random_range(1..=3) {
                    let key = KEYS[rng.random_range(0..KEYS.len())];
                    let other: i64 = rng.random_range(1..=owners);
                    message.push(change(other, key, rng.random_range(-5..=20)));
                }
                message
            })
            .collect();
        Self {
            table: table.to_owned(),
            messages,
        }
    }

    /// Distinct ids.
    pub fn distinct(&self) -> usize {
        self.messages
            .iter()
            .map(CounterMessage::id)
            .collect::<HashSet<_>>()
            .len()
    }

    /// The totals if each distinct id is applied once.
    pub fn expected(&self) -> BTreeMap<(i64, String), i64> {
        let mut seen = HashSet::new();
        let mut totals = BTreeMap::new();
        for message in &self.messages {
            if !seen.insert(message.id()) {
                continue;
            }
            for c in message.changes() {
                let owner = c.owner.as_i64().expect("an integer owner");
                *totals.entry((owner, c.key.clone())).or_insert(0) += c.delta;
            }
        }
        totals
    }

    /// Publishes every message, `concurrency` at a time, each retried until
    /// confirmed.
    pub async fn publish(&self, publisher: &AnyPublisher, concurrency: usize) -> Vec<Sent> {
        use futures_util::{StreamExt, stream};
        stream::iter(&self.messages)
            .map(|m| async move { publisher.send(m).await.expect("published") })
            .buffered(concurrency)
            .collect()
            .await
    }
}

pub fn change(owner: i64, key: &str, delta: i64) -> Change {
    Change {
        owner: owner.into(),
        key: key.into(),
        delta,
        at: None,
    }
}

/// What the database holds against what the workload should have left.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// Distinct messages never applied.
    pub lost: u64,
    /// Applications beyond one per distinct message.
    pub doubled: u64,
    /// Counters whose total differs from the sum over distinct ids.
    pub wrong_totals: u64,
}

/// Compares `counters`' totals with `workload`'s.
pub async fn tally(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    workload: &Workload,
) -> Tally {
    let expected = workload.expected();
    let owners: Vec<i64> = expected
        .keys()
        .map(|(o, _)| *o)
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let mut keys: Vec<&str> = KEYS.to_vec();
    keys.push(EVENTS);
    let got = counters
        .get_many(db, &owners, &keys)
        .await
        .expect("read the totals");
    let mut wrong = 0;
    let mut events = 0i64;
    for ((owner, key), want) in &expected {
        let have = got
            .get(owner)
            .and_then(|m: &HashMap<String, i64>| m.get(key))
            .copied()
            .unwrap_or(0);
        if key == EVENTS {
            events += have;
        }
        if have != *want {
            wrong += 1;
        }
    }
    let distinct = workload.distinct() as i64;
    Tally {
        lost: (distinct - events).max(0) as u64,
        doubled: (events - distinct).max(0) as u64,
        wrong_totals: wrong,
    }
}

/// Runs `consumer` until `source`'s dedup table holds `ids` rows (every
/// distinct message applied) or `limit` passes, then shuts it down
/// gracefully and returns its counters.
pub async fn consume_until_applied<S: Source + 'static>(
    consumer: counter_mq::Consumer<S>,
    db: &DatabaseConnection,
    source: &str,
    ids: usize,
    limit: Duration,
) -> ConsumerStats {
    consume_until(consumer, db, source, ids, 0, limit).await
}

/// [`consume_until_applied`], and until the consumer has also received
/// `deliveries` messages (redeliveries of applied ones included).
pub async fn consume_until<S: Source + 'static>(
    consumer: counter_mq::Consumer<S>,
    db: &DatabaseConnection,
    source: &str,
    ids: usize,
    deliveries: usize,
    limit: Duration,
) -> ConsumerStats {
    run_until(consumer, limit, Duration::ZERO, |stats| async move {
        let applied = counter_mq::applied_count(db, source).await.unwrap_or(0);
        applied as usize >= ids && stats.messages as usize >= deliveries
    })
    .await
}

/// Runs `consumer` until `done` (given its counters, asked every 50 ms)
/// holds, it stops on its own, or `limit` passes; then lets it run `linger`
/// more (for late duplicates) and stops it gracefully.
pub async fn run_until<S, F, Fut>(
    consumer: counter_mq::Consumer<S>,
    limit: Duration,
    linger: Duration,
    mut done: F,
) -> ConsumerStats
where
    S: Source + 'static,
    F: FnMut(ConsumerStats) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let stats = consumer.stats_handle();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    let deadline = Instant::now() + limit;
    while !done(stats.get()).await && Instant::now() < deadline && !handle.is_finished() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(linger).await;
    let _ = stop.send(());
    handle
        .await
        .expect("the consumer task")
        .expect("the consumer ran")
}

/// A JetStream source on `js` whose durable consumer (if this call
/// creates it) redelivers after 10 s: longer than any batch takes on a
/// loaded CI machine, so tests that count redeliveries exactly see none
/// they did not cause.
pub async fn nats_source(js: &Context, stream: &str) -> JetStreamSource {
    JetStreamSource::new(js.clone(), stream, test_consumer(Duration::from_secs(10)))
        .await
        .expect("bind the durable consumer")
}

/// A JetStream source whose durable consumer (if this call creates it)
/// redelivers one second after a missed acknowledgement: for tests that
/// wait for redeliveries (and assert only bounds on them).
pub async fn nats_source_redelivering(js: &Context, stream: &str) -> JetStreamSource {
    JetStreamSource::new(js.clone(), stream, test_consumer(Duration::from_secs(1)))
        .await
        .expect("bind the durable consumer")
}

/// One broker set up for a test: a private nats-server with the test
/// stream `COUNTERS`, or a queue of its own on the shared RabbitMQ. Tests
/// written once for both brokers open one of each.
pub enum Bus {
    Nats { server: PrivateNats, js: Context },
    Amqp { queue: AmqpQueue },
}

impl Bus {
    /// `broker` for the test `label`, or `None` (the test says it skipped)
    /// when that broker is not configured.
    pub async fn open(broker: Broker, backend: Backend, label: &str) -> Option<Bus> {
        Some(match broker {
            Broker::Nats => {
                let server = PrivateNats::start(&nats_server(backend, label)?);
                let js = jetstream(&[server.url()]).await;
                stream_ready(&js, &test_stream(1)).await;
                Bus::Nats { server, js }
            }
            Broker::Amqp => Bus::Amqp {
                queue: AmqpQueue::new(&amqp_url(backend, label)?, label).await,
            },
        })
    }

    /// A publisher (retrying for a minute).
    pub async fn publisher(&self) -> AnyPublisher {
        match self {
            Bus::Nats { js, .. } => AnyPublisher::Nats(JetStreamPublisher::new(js.clone())),
            Bus::Amqp { queue } => AnyPublisher::Amqp(queue.publisher().await),
        }
    }

    /// Publishes `bytes` as they are, bypassing the message checks (poison).
    pub async fn publish_raw(&self, table: &str, bytes: &[u8]) {
        match self {
            Bus::Nats { js, .. } => {
                js.publish(format!("counters.{table}"), bytes.to_vec().into())
                    .await
                    .expect("publish")
                    .await
                    .expect("stored");
            }
            Bus::Amqp { queue } => {
                let channel = queue.connection.create_channel().await.expect("a channel");
                channel
                    .basic_publish(
                        "".into(),
                        queue.settings.name.as_str().into(),
                        Default::default(),
                        bytes,
                        Default::default(),
                    )
                    .await
                    .expect("publish")
                    .await
                    .expect("published");
            }
        }
    }

    /// The dedup scope of its consumers.
    pub fn source_name(&self) -> String {
        match self {
            Bus::Nats { .. } => "COUNTERS".to_owned(),
            Bus::Amqp { queue } => queue.settings.name.clone(),
        }
    }

    /// Runs a consumer built by `builder` on this broker until `ids` rows are
    /// in the dedup table and `deliveries` messages were received (or
    /// `limit`), then stops it gracefully.
    pub async fn consume(
        &self,
        builder: counter_mq::ConsumerBuilder,
        db: &DatabaseConnection,
        ids: usize,
        deliveries: usize,
        limit: Duration,
    ) -> ConsumerStats {
        let source = self.source_name();
        match self {
            Bus::Nats { js, .. } => {
                let consumer = builder.build(nats_source(js, &source).await).await;
                consume_until(
                    consumer.expect("a consumer"),
                    db,
                    &source,
                    ids,
                    deliveries,
                    limit,
                )
                .await
            }
            Bus::Amqp { queue } => {
                let consumer = builder.build(queue.source(&queue.url).await).await;
                consume_until(
                    consumer.expect("a consumer"),
                    db,
                    &source,
                    ids,
                    deliveries,
                    limit,
                )
                .await
            }
        }
    }

    /// Deletes what the test made on a shared broker; stops a private one.
    pub async fn finish(self) {
        match self {
            Bus::Nats { server, .. } => drop(server),
            Bus::Amqp { queue } => queue.delete().await,
        }
    }
}
