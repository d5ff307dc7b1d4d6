//! Overload: the real binary, with its default bounds, offered five times
//! the keyed adds it can commit, for 60 s. It sheds what it cannot take at
//! once (503 `overloaded` with `Retry-After`), by the queue's expected
//! wait (`max_queue_wait_ms`) before its item bound, its memory stays bounded,
//! nothing is 500, the totals right after hold every add it acknowledged
//! and none it refused (a 503 `timeout` is an unknown outcome, either
//! way), and once every add not acknowledged is retried with its key they
//! equal every add sent, exactly. And the
//! concurrency bound, met for certain: requests whose bodies are still
//! arriving hold it, the next is refused before its body is read.
//! RELIABILITY.md 50.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use counter_tests::{TestDb, backend_test, figures, servers::free_port};
use hyper::Method;
use serde_json::{Value, json};

use crate::support::{Api, NAMESPACES, Scratch, config_text, spawn_binary};

/// Items per keyed `counters:batchAdd`: admission counts items, and a
/// client on two shared cores can offer five times the capacity in items
/// only with batches.
const ITEMS: u64 = 100;
/// Owners the items spread over (one hot counter among them: owner 1).
const OWNERS: u64 = 50;
/// How long the capacity is measured, and by how many closed-loop clients.
const MEASURE: Duration = Duration::from_secs(5);
const MEASURE_CLIENTS: u64 = 32;
/// The offered load, as a multiple of the capacity, and for how long.
const OVERLOAD: u64 = 5;
/// 60 s unless `COUNTER_TEST_OVERLOAD_SECS` says otherwise: every add
/// refused in that time is retried afterwards, about four times as long
/// at capacity, so CI runs 6 s (`.ci/run`) and RELIABILITY.md reports 60.
fn offered_for() -> Duration {
    let secs = std::env::var("COUNTER_TEST_OVERLOAD_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    Duration::from_secs(secs)
}
/// Requests the test keeps in flight at most (its own sockets).
const CLIENT_IN_FLIGHT: u64 = 768;
/// The resident memory the service may reach: its baseline (about 30 MiB),
/// the admitted items (`max_queued_items`, 20,000, of a few hundred bytes
/// each) and `max_concurrent_requests` (512) bodies of 5 kB being read,
/// with room to spare; a queue bounded by requests, not work, would pass
/// it.
const MEMORY_BOUND_MIB: u64 = 256;
/// Clients sending the refused adds again.
const RETRIERS: usize = 64;
/// Asserted of a release build (`COUNTER_TEST_SERVICE_BIN`, what
/// production runs) loaded by a release-built client (`cargo test
/// --release`): the admitted's wait at the 99th percentile as the client
/// sees it, in ms, and their share of the capacity, in %. A debug build
/// (the suite's own, and CI's 6 s run beside the rest of the suite) spends
/// the cores on its own code, and a debug client on its: at 3.7 times a
/// release service's capacity the debug client took 52 % of the two cores
/// and left the service 37 %. Either reports the figures only.
const RELEASE_ADMITTED_P99_MS: u64 = 650;
const RELEASE_GOODPUT_PCT: u64 = 70;

/// Request `n`'s items: `(owner, delta)`.
fn items_of(n: u64) -> impl Iterator<Item = (u64, i64)> {
    (0..ITEMS).map(move |j| {
        // Every fourth item on the hot owner 1, the rest spread.
        let owner = if j % 4 == 0 {
            1
        } else {
            (n * 7 + j) % OWNERS + 1
        };
        (owner, 1 + ((n + j) % 3) as i64)
    })
}

/// Request `n`'s body, written out by hand: the client shares the two
/// cores with the service, and building 100 `serde_json::Value`s per
/// request at five times the capacity took a core's share from it.
fn body_of(n: u64) -> String {
    use std::fmt::Write;
    let mut body = String::with_capacity(ITEMS as usize * 44 + 16);
    body.push_str("{\"items\":[");
    for (i, (owner, delta)) in items_of(n).enumerate() {
        if i > 0 {
            body.push(',');
        }
        let _ = write!(
            body,
            "{{\"owner\":{owner},\"key\":\"likes\",\"delta\":{delta}}}"
        );
    }
    body.push_str("]}");
    body
}

/// What one request met.
#[derive(Default)]
struct Tally {
    admitted: AtomicU64,
    shed_503: AtomicU64,
    limited_429: AtomicU64,
    transport: AtomicU64,
    /// Any other answer: a 500, a 503 without `Retry-After`, a 4xx.
    wrong: Mutex<Vec<String>>,
    /// Latencies of the admitted, in microseconds.
    admitted_us: Mutex<Vec<u64>>,
    /// Requests refused (503 `overloaded`, 429): nothing of them applied.
    refused: Mutex<Vec<u64>>,
    /// Requests whose outcome is unknown (503 `timeout` or `transient`,
    /// no answer): applied or not, their retry says.
    unknown: Mutex<Vec<u64>>,
    timed_out: AtomicU64,
}

/// What became of one request.
#[derive(PartialEq)]
enum Fate {
    Applied,
    Refused,
    Unknown,
}

impl Tally {
    async fn send(&self, api: &Api, n: u64) -> Fate {
        let key = format!("overload-{n}");
        let t0 = Instant::now();
        let reply = api
            .try_call(
                Method::POST,
                "/v1/posts/counters:batchAdd",
                None,
                &[("idempotency-key", &key)],
                Some(body_of(n)),
            )
            .await;
        let took = t0.elapsed();
        match reply {
            Ok(reply) if reply.status == 200 => {
                self.admitted.fetch_add(1, Ordering::Relaxed);
                self.admitted_us
                    .lock()
                    .unwrap()
                    .push(took.as_micros() as u64);
                return Fate::Applied;
            }
            Ok(reply)
                if matches!(reply.status, 503 | 429)
                    && reply.header("retry-after").is_some()
                    && reply.header("content-type") == Some("application/problem+json") =>
            {
                match (reply.status, reply.json["kind"].as_str()) {
                    (429, _) => self.limited_429.fetch_add(1, Ordering::Relaxed),
                    (_, Some("overloaded")) => self.shed_503.fetch_add(1, Ordering::Relaxed),
                    _ => {
                        self.timed_out.fetch_add(1, Ordering::Relaxed);
                        return Fate::Unknown;
                    }
                };
                return Fate::Refused;
            }
            Ok(reply) => {
                let mut wrong = self.wrong.lock().unwrap();
                if wrong.len() < 5 {
                    wrong.push(format!(
                        "{} {:?} {}",
                        reply.status, reply.headers, reply.text
                    ));
                } else {
                    wrong.push(String::new());
                }
            }
            // A connection refused or reset: unknown, sent again.
            Err(_) => {
                self.transport.fetch_add(1, Ordering::Relaxed);
            }
        }
        Fate::Unknown
    }

    /// [`Tally::send`], and a request not applied kept to send again.
    async fn offer(&self, api: &Api, n: u64) {
        match self.send(api, n).await {
            Fate::Applied => {}
            Fate::Refused => self.refused.lock().unwrap().push(n),
            Fate::Unknown => self.unknown.lock().unwrap().push(n),
        }
    }
}

/// The likes the requests `ns` add up to, by owner, against the service's
/// totals: `(lost, extra)`, summed over the owners.
async fn compare(api: &Api, ns: impl Iterator<Item = u64>) -> (u64, u64) {
    let mut expected: BTreeMap<u64, i64> = (1..=OWNERS).map(|o| (o, 0)).collect();
    for n in ns {
        for (owner, delta) in items_of(n) {
            *expected.entry(owner).or_default() += delta;
        }
    }
    let owners: Vec<u64> = expected.keys().copied().collect();
    let counts = api
        .totals("posts", None, json!(owners), json!(["likes"]))
        .await;
    let (mut lost, mut extra) = (0, 0);
    for (owner, want) in &expected {
        let got = counts[owner.to_string()]["likes"].as_i64().unwrap();
        lost += (want - got).max(0) as u64;
        extra += (got - want).max(0) as u64;
    }
    (lost, extra)
}

/// The peak resident memory of process `pid`, in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .expect("VmHWM in /proc/PID/status")
        / 1024
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[backends(postgres, mysql)]
    async fn five_times_capacity_is_shed_and_nothing_is_lost(t: TestDb) {
        raise_own_file_limit();
        let written: Value = serde_json::from_str(&body_of(7)).unwrap();
        let items: Vec<Value> = items_of(7)
            .map(|(owner, delta)| json!({"owner": owner, "key": "likes", "delta": delta}))
            .collect();
        assert_eq!(written, json!({ "items": items }), "the request body written by hand");
        let scratch = Scratch::of(&t).await;
        let file = std::env::temp_dir().join(format!("counter-service-overload-{}-{}.toml", t.backend, std::process::id()));
        std::fs::write(&file, config_text("open = true", &scratch, NAMESPACES)).unwrap();
        let port = free_port();
        let mut child = spawn_binary(&file, port).await;
        let pid = child.id().expect("the service's pid");
        let api = Api::new(format!("http://127.0.0.1:{port}"));
        let tally = Arc::new(Tally::default());
        let next = Arc::new(AtomicU64::new(0));

        // 1. The capacity: closed-loop clients, each waiting for its answer.
        let measure_until = Instant::now() + MEASURE;
        let clients: Vec<_> = (0..MEASURE_CLIENTS)
            .map(|_| {
                let (api, tally, next) = (api.clone(), tally.clone(), next.clone());
                tokio::spawn(async move {
                    while Instant::now() < measure_until {
                        tally.offer(&api, next.fetch_add(1, Ordering::Relaxed)).await;
                    }
                })
            })
            .collect();
        let t0 = Instant::now();
        for client in clients {
            client.await.unwrap();
        }
        let capacity_items_per_s = (tally.admitted.load(Ordering::Relaxed) * ITEMS) as f64 / t0.elapsed().as_secs_f64();
        assert!(capacity_items_per_s > 0.0, "nothing was admitted while measuring");
        let admitted_while_measuring = tally.admitted.load(Ordering::Relaxed);
        tally.admitted_us.lock().unwrap().clear();

        // 2. Five times that, open loop: requests sent on a clock whatever
        // the answers, for 60 s.
        let rate = OVERLOAD as f64 * capacity_items_per_s / ITEMS as f64;
        let in_flight = Arc::new(AtomicU64::new(0));
        let (mut sent, mut not_sent) = (0u64, 0u64);
        let start = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        let mut tasks = tokio::task::JoinSet::new();
        let offered = offered_for();
        while start.elapsed() < offered {
            tick.tick().await;
            let due = (start.elapsed().as_secs_f64() * rate) as u64;
            while sent + not_sent < due {
                if in_flight.load(Ordering::Relaxed) >= CLIENT_IN_FLIGHT {
                    not_sent += 1;
                    continue;
                }
                sent += 1;
                in_flight.fetch_add(1, Ordering::Relaxed);
                let (api, tally, in_flight) = (api.clone(), tally.clone(), in_flight.clone());
                let n = next.fetch_add(1, Ordering::Relaxed);
                tasks.spawn(async move {
                    tally.offer(&api, n).await;
                    in_flight.fetch_sub(1, Ordering::Relaxed);
                });
            }
            while tasks.try_join_next().is_some() {}
        }
        while tasks.join_next().await.is_some() {}
        let offered_for = start.elapsed();
        let admitted_overload = tally.admitted.load(Ordering::Relaxed) - admitted_while_measuring;
        let mut latencies = std::mem::take(&mut *tally.admitted_us.lock().unwrap());
        latencies.sort_unstable();
        let peak_rss = peak_rss_mib(pid);
        let shed_concurrent = api.metric("counter_service_shed_total{bound=\"concurrent_requests\"}").await;
        let shed_queued = api.metric("counter_service_shed_total{bound=\"queued_items\"}").await;
        let shed_503 = tally.shed_503.load(Ordering::Relaxed);

        // 3. Right after: the totals are exactly the acknowledged adds (a
        // refused add applied nothing; transport errors would be unknown,
        // and there must be none).
        let refused = std::mem::take(&mut *tally.refused.lock().unwrap());
        let unknown = std::mem::take(&mut *tally.unknown.lock().unwrap());
        let sent_all = next.load(Ordering::Relaxed);
        let not_acked: std::collections::HashSet<u64> = refused.iter().chain(&unknown).copied().collect();
        let refused_set: std::collections::HashSet<u64> = refused.iter().copied().collect();
        let transport = tally.transport.load(Ordering::Relaxed);
        // At least every acknowledged add, at most those and the unknown.
        let (acked_lost, _) = compare(&api, (0..sent_all).filter(|n| !not_acked.contains(n))).await;
        let (_, acked_extra) = compare(&api, (0..sent_all).filter(|n| !refused_set.contains(n))).await;

        // 4. Every refused add sent again with its key until it is answered
        // 200, as a client that honours `Retry-After` would.
        let retried = (refused.len() + unknown.len()) as u64;
        let retry_started = Instant::now();
        let deadline = retry_started + Duration::from_secs(900);
        let queue = Arc::new(Mutex::new([refused, unknown].concat()));
        let retriers: Vec<_> = (0..RETRIERS)
            .map(|_| {
                let (api, tally, queue) = (api.clone(), tally.clone(), queue.clone());
                tokio::spawn(async move {
                    loop {
                        let Some(n) = queue.lock().unwrap().pop() else { return };
                        while tally.send(&api, n).await != Fate::Applied {
                            assert!(Instant::now() < deadline, "request {n} still refused after 900 s");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                })
            })
            .collect();
        for retrier in retriers {
            retrier.await.unwrap();
        }
        let retry_s = retry_started.elapsed().as_secs();

        // 5. Exact totals: every request applied once.
        let (lost, doubled) = compare(&api, 0..sent_all).await;
        let wrong = tally.wrong.lock().unwrap().clone();
        let admitted_items_per_s = admitted_overload * ITEMS / offered_for.as_secs().max(1);
        let goodput_pct = admitted_items_per_s * 100 / (capacity_items_per_s as u64).max(1);
        let admitted_p99_ms = percentile(&latencies, 0.99) / 1_000;
        let shed_wait = api.metric("counter_service_shed_total{bound=\"queue_wait\"}").await;
        figures(
            "service_overload",
            t.backend,
            &[
                ("capacity_items_per_s", capacity_items_per_s as u64),
                ("offered_items_per_s", sent * ITEMS / offered_for.as_secs().max(1)),
                ("offered_s", offered_for.as_secs()),
                ("requests", sent),
                ("client_capped", not_sent),
                ("admitted", admitted_overload),
                ("admitted_items_per_s", admitted_items_per_s),
                ("goodput_pct", goodput_pct),
                ("admitted_p50_ms", percentile(&latencies, 0.50) / 1_000),
                ("admitted_p99_ms", admitted_p99_ms),
                ("shed_503", shed_503),
                ("shed_concurrent", shed_concurrent),
                ("shed_queued_items", shed_queued),
                ("shed_queue_wait", shed_wait),
                ("rate_limited_429", tally.limited_429.load(Ordering::Relaxed)),
                ("timed_out_503", tally.timed_out.load(Ordering::Relaxed)),
                ("transport_errors", transport),
                ("wrong_answers", wrong.len() as u64),
                ("acked_lost", acked_lost),
                ("acked_extra", acked_extra),
                ("retried", retried),
                ("retry_s", retry_s),
                ("peak_rss_mib", peak_rss),
                ("memory_bound_mib", MEMORY_BOUND_MIB),
                ("lost", lost),
                ("doubled", doubled),
            ],
        );
        assert!(wrong.is_empty(), "[{}] answers other than 200, or 503/429 with Retry-After: {wrong:?}", t.backend);
        assert_eq!((acked_lost, acked_extra), (0, 0), "[{}] totals right after the overload against the acknowledged adds", t.backend);
        assert_eq!((lost, doubled), (0, 0), "[{}] totals after {sent_all} requests", t.backend);
        assert_eq!(transport, 0, "[{}] requests without an answer", t.backend);
        assert!(shed_503 > 0 && shed_wait > 0, "[{}] the offered load was not shed by the queue's wait: {shed_503} answered 503, {shed_wait} shed by the wait, {shed_queued} at the item bound, {shed_concurrent} at the concurrency limit", t.backend);
        if std::env::var_os("COUNTER_TEST_SERVICE_BIN").is_some() && !cfg!(debug_assertions) {
            assert!(admitted_p99_ms < RELEASE_ADMITTED_P99_MS, "[{}] admitted adds waited {admitted_p99_ms} ms (p99)", t.backend);
            assert!(goodput_pct >= RELEASE_GOODPUT_PCT, "[{}] admitted {admitted_items_per_s} items/s under the overload, {goodput_pct} % of the capacity {capacity_items_per_s:.0}", t.backend);
        }
        assert!(peak_rss <= MEMORY_BOUND_MIB, "[{}] the service's resident memory reached {peak_rss} MiB", t.backend);
        child.start_kill().unwrap();
        child.wait().await.unwrap();
        let _ = std::fs::remove_file(&file);
        t.finish().await;
    }
}

/// The test's own sockets: up to [`CLIENT_IN_FLIGHT`] connections.
fn raise_own_file_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        },
    );
}

/// The concurrency bound, met for certain: two requests whose bodies are
/// still arriving hold both places of `max_concurrent_requests = 2`; the
/// next API request is refused at once, before its token or body is read;
/// the probes are not; once the two go, requests are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_concurrency_bound_are_refused_at_once() {
    use tokio::io::AsyncWriteExt;
    let dir = std::env::temp_dir().join(format!("counter-service-bound-{}.db", std::process::id()));
    let service = crate::support::Running::start(&format!(
        "[server]\nopen = true\nmax_concurrent_requests = 2\n[database]\nurl = \"sqlite://{}?mode=rwc\"\n\
         [namespaces.posts]\ntable = \"post_counters\"\nowner = \"integer\"\n[namespaces.posts.keys.likes]\n",
        dir.display()
    ))
    .await;
    let address = service.api.base.trim_start_matches("http://").to_owned();
    let hold = || async {
        let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
        stream
            .write_all(b"POST /v1/posts/counters:add HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"owner\":")
            .await
            .unwrap();
        stream
    };
    let mut holding = vec![hold().await, hold().await];
    // A request sent before a holder's head was dispatched may take its
    // place (and the holder is refused): then that holder comes again.
    // Until one is refused while both holders are still unanswered.
    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        assert!(
            Instant::now() < deadline,
            "no request was refused with both places held"
        );
        let reply = service
            .post(
                "/v1/posts/counters:add",
                None,
                json!({"owner": 1, "key": "likes"}),
            )
            .await;
        let mut answered = false;
        for holder in &mut holding {
            let mut buf = [0u8; 64];
            match holder.try_read(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                _ => {
                    answered = true;
                    *holder = hold().await;
                }
            }
        }
        if reply.status == 503 && !answered {
            break reply;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    refused.assert_problem(503, "overloaded");
    assert_eq!(refused.header("retry-after"), Some("1"), "{refused:?}");
    assert_eq!(refused.json["bound"], "concurrent requests", "{refused:?}");
    assert_eq!(service.get("/healthz", None).await.status, 200);
    assert_eq!(service.get("/metrics", None).await.status, 200);
    // The two callers go: their places are free again.
    drop(holding);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = service
            .post(
                "/v1/posts/counters:add",
                None,
                json!({"owner": 1, "key": "likes"}),
            )
            .await;
        if reply.status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still refused after the holders left: {reply:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    service.stop().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", dir.display()));
    }
}
