//! Redis for the cache tests (`counter-redis`).
//!
//! * Ordinary tests use the shared server named by `COUNTER_TEST_REDIS_URL`
//!   (the machine's, `redis://127.0.0.1:6379` in CI), each in a namespace
//!   of its own, and never flush or kill it. Unset, they skip and say so.
//! * Fault tests start a [`PrivateRedis`] (one `redis-server`) or a
//!   [`RedisCluster`] (three masters) on free loopback ports below the
//!   ephemeral range, in a temporary directory, and kill them on drop.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use counter_redis::{CountCache, RedisTarget};

use crate::{Backend, servers::free_port};

/// The environment variable with the shared Redis to test against.
pub const REDIS_URL_VAR: &str = "COUNTER_TEST_REDIS_URL";

/// The shared Redis's URL, or `None` (after saying so) when unset.
pub fn shared_url(backend: Backend, label: &str) -> Option<String> {
    match std::env::var(REDIS_URL_VAR) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            eprintln!("[{backend}] {label}: skipped, {REDIS_URL_VAR} is not set");
            None
        }
    }
}

/// A namespace no other test (or run) uses: short, as an application's
/// would be, so that measured memory per owner is realistic.
pub fn namespace(backend: Backend, label: &str) -> String {
    let nonce: u32 = rand::random();
    let namespace = format!("t{nonce:08x}");
    eprintln!("[{backend}] {label}: Redis namespace {namespace}");
    namespace
}

/// Settings for tests: timeouts wide enough for a loaded 2-core CI box, a
/// breaker that recovers fast.
pub fn test_cache(target: RedisTarget, namespace: &str) -> counter_redis::CacheBuilder {
    CountCache::builder(target)
        .namespace(namespace)
        .timeout(Duration::from_millis(500))
        .breaker(5, Duration::from_millis(200))
        .unscoped_delay(Duration::from_millis(300))
}

/// A cache on the shared Redis for one test, or `None` when none is set.
pub async fn shared_cache(backend: Backend, label: &str) -> Option<CountCache> {
    let url = shared_url(backend, label)?;
    let cache = test_cache(RedisTarget::standalone(url), &namespace(backend, label))
        .build()
        .await
        .expect("build the cache");
    Some(cache)
}

/// Waits (at most 10 s) until `cache` has no fill storing in the background
/// and no deletion owed: before asserting exact stats.
pub async fn settled(cache: &CountCache) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = cache.stats();
        if stats.fills_in_flight == 0 && stats.invalidations_pending == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the cache did not settle: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A redis-server process of a test's own.
pub struct PrivateRedis {
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    child: Mutex<Option<Child>>,
}

impl PrivateRedis {
    /// Starts a standalone server and waits until it answers.
    pub fn start() -> Self {
        Self::start_with(free_port(), Vec::new())
    }

    fn start_with(port: u16, extra: Vec<String>) -> Self {
        let dir = std::env::temp_dir().join(format!("counter-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory for redis-server");
        let server = Self {
            port,
            dir,
            extra,
            child: Mutex::new(None),
        };
        server.restart();
        server
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// SIGKILL: the server dies with everything in memory.
    pub fn kill(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (empty: nothing is on disk), and
    /// waits until it answers.
    pub fn restart(&self) {
        self.kill();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(&self.dir)
            .args(["--logfile", "redis.log"])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server (is it installed?)");
        *self.child.lock().unwrap() = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.cli(&["PING"]).as_deref() != Some("PONG") {
            assert!(
                Instant::now() < deadline,
                "the private redis-server on {} does not answer",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// One redis-cli command; its output, trimmed, if it ran.
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        redis_cli(self.port, args)
    }

    /// Cuts every client connection (`CLIENT KILL TYPE normal`).
    pub fn cut_connections(&self) {
        self.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    }

    /// A replica of the server on `master_port`, started and answering.
    pub fn start_replica_of(master_port: u16) -> Self {
        Self::start_with(
            free_port(),
            vec![
                "--replicaof".into(),
                "127.0.0.1".into(),
                master_port.to_string(),
            ],
        )
    }

    /// SIGSTOP (`false`) or SIGCONT (`true`): a stopped server takes
    /// nothing, replication included, and its peers see it alive.
    pub fn run(&self, running: bool) {
        if let Some(child) = &*self.child.lock().unwrap() {
            let signal = if running { "-CONT" } else { "-STOP" };
            let _ = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status();
        }
    }
}

/// A master, two replicas and three Sentinels monitoring them as
/// [`RedisSentinels::MASTER`] (quorum 2, a master down after 1 s), each a
/// process of the test's own on a free loopback port, all killed on drop.
pub struct RedisSentinels {
    /// The first master, then its replicas; after a failover any may lead.
    pub servers: Vec<PrivateRedis>,
    sentinels: Vec<(u16, Child)>,
    dir: PathBuf,
}

impl RedisSentinels {
    /// The monitored master's name.
    pub const MASTER: &'static str = "counter";

    /// Starts them and waits until every Sentinel knows both replicas and
    /// the other two Sentinels (a failover needs both).
    pub fn start() -> Self {
        let master = PrivateRedis::start();
        let port = master.port();
        let servers = vec![
            master,
            PrivateRedis::start_replica_of(port),
            PrivateRedis::start_replica_of(port),
        ];
        let dir =
            std::env::temp_dir().join(format!("counter-sentinels-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for the Sentinels");
        let mut set = Self {
            servers,
            sentinels: Vec::new(),
            dir,
        };
        for i in 0..3 {
            let sentinel_port = free_port();
            let conf = set.dir.join(format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {sentinel_port}\nbind 127.0.0.1\ndir {dir}\nlogfile sentinel-{i}.log\n\
                     sentinel monitor {name} 127.0.0.1 {port} 2\n\
                     sentinel down-after-milliseconds {name} 1000\n\
                     sentinel failover-timeout {name} 5000\n\
                     sentinel parallel-syncs {name} 1\n",
                    dir = set.dir.display(),
                    name = Self::MASTER,
                ),
            )
            .expect("a Sentinel's configuration");
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server --sentinel");
            set.sentinels.push((sentinel_port, child));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = set.sentinels.iter().all(|(p, _)| {
                let count = |what: &str| {
                    redis_cli(*p, &["SENTINEL", what, Self::MASTER])
                        .map(|out| out.lines().filter(|l| *l == "name").count())
                        .unwrap_or(0)
                };
                count("replicas") == 2 && count("sentinels") == 2
            });
            if ready {
                return set;
            }
            assert!(
                Instant::now() < deadline,
                "the Sentinels did not find the replicas and each other within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The Sentinels' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|(port, _)| format!("redis://127.0.0.1:{port}"))
            .collect()
    }

    /// The master's port as the first Sentinel that answers names it.
    pub fn master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|(port, _)| {
            let out = redis_cli(
                *port,
                &["SENTINEL", "get-master-addr-by-name", Self::MASTER],
            )?;
            out.lines().nth(1)?.trim().parse().ok()
        })
    }

    /// The server on `port`.
    pub fn server(&self, port: u16) -> &PrivateRedis {
        self.servers
            .iter()
            .find(|s| s.port() == port)
            .expect("one of the set's servers")
    }
}

/// One redis-cli command to the server or Sentinel on `port`; its output,
/// trimmed, if it ran.
fn redis_cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

impl Drop for RedisSentinels {
    fn drop(&mut self) {
        for server in &self.servers {
            server.run(true);
        }
        for (_, child) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Three redis-server masters joined into a cluster, each on a free port
/// whose cluster bus port (+10000) is free too and below the ephemeral
/// range.
pub struct RedisCluster {
    pub nodes: Vec<PrivateRedis>,
}

impl RedisCluster {
    /// Starts the nodes, creates the cluster, waits for `cluster_state:ok`.
    /// `full_coverage`: whether the cluster stops serving every slot when
    /// one master is down (Redis's default) or keeps serving the others.
    pub fn start(full_coverage: bool) -> Self {
        // `redis-cli --cluster create` waits for the nodes to meet without
        // end when they cannot: bounded, and tried again on fresh ports.
        for attempt in 1..=3 {
            if let Some(cluster) = Self::try_start(full_coverage) {
                return cluster;
            }
            eprintln!("a private Redis Cluster did not form (attempt {attempt} of 3); new ports");
        }
        panic!("a private Redis Cluster did not form in 3 attempts");
    }

    fn try_start(full_coverage: bool) -> Option<Self> {
        let mut nodes = Vec::new();
        while nodes.len() < 3 {
            let port = free_cluster_port();
            let extra = vec![
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-config-file".into(),
                format!("nodes-{port}.conf"),
                "--cluster-node-timeout".into(),
                "1000".into(),
                "--cluster-require-full-coverage".into(),
                if full_coverage { "yes" } else { "no" }.into(),
            ];
            nodes.push(PrivateRedis::start_with(port, extra));
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let mut create = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run redis-cli --cluster create");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let created = loop {
            match create.try_wait().expect("wait for redis-cli") {
                Some(status) => break status.success(),
                None if std::time::Instant::now() > deadline => {
                    let _ = create.kill();
                    let _ = create.wait();
                    break false;
                }
                None => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        if !created {
            // Dropping the nodes stops them.
            return None;
        }
        let cluster = Self { nodes };
        cluster.wait_ok(Duration::from_secs(20));
        Some(cluster)
    }

    /// The nodes' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(PrivateRedis::url).collect()
    }

    /// Waits until every node reports `cluster_state:ok`.
    pub fn wait_ok(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let ok = self.nodes.iter().all(|n| {
                n.cli(&["CLUSTER", "INFO"])
                    .is_some_and(|info| info.contains("cluster_state:ok"))
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the private Redis Cluster is not ok after {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn free_cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port < 22_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}
