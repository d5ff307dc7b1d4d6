//! `counts:watch`: totals pushed as they change, bounded, and ended for a
//! client that stops reading or an instance that stops.

use std::{
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    time::{Duration, Instant},
};

use counter_tests::{TestDb, backend_test, servers::free_port};
use http_body_util::{BodyExt, Empty};
use hyper::{Request, body::Bytes};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::{net::TcpSocket, task::JoinHandle};

use crate::support::{
    ADMIN, Api, NAMESPACES, POSTS_ONLY, READER, Running, Scratch, TOKENS, WRITER, config_text,
    spawn_binary,
};

/// One event as a client reads it.
#[derive(Debug, Clone)]
pub struct Received {
    pub event: String,
    pub id: String,
    pub data: Value,
    pub at: Instant,
}

/// A client of one watch stream, on a connection of its own.
pub struct Watcher {
    body: hyper::body::Incoming,
    buffer: Vec<u8>,
    _connection: JoinHandle<()>,
}

impl Watcher {
    /// Opens `path` on `addr` (`127.0.0.1:port`) with `token` and
    /// `headers`; the problem's status and body if it is refused (status 0
    /// and the error's text if no answer came). `receive_buffer` shrinks
    /// the socket's buffer (a client that stops reading fills it sooner).
    pub async fn open(
        addr: &str,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        receive_buffer: Option<u32>,
    ) -> Result<Self, (u16, Value)> {
        let socket = TcpSocket::new_v4().unwrap();
        if let Some(bytes) = receive_buffer {
            socket.set_recv_buffer_size(bytes).unwrap();
        }
        let unanswered = |e: &dyn std::fmt::Display| (0, Value::String(e.to_string()));
        let stream = socket
            .connect(addr.parse().unwrap())
            .await
            .map_err(|e| unanswered(&e))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unanswered(&e))?;
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        let mut request = Request::get(path)
            .header("host", addr)
            .header("accept", "text/event-stream");
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = sender
            .send_request(request.body(Empty::<Bytes>::new()).unwrap())
            .await
            .map_err(|e| unanswered(&e))?;
        let status = response.status().as_u16();
        if status != 200 {
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| unanswered(&e))?
                .to_bytes();
            return Err((
                status,
                serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            ));
        }
        if response
            .headers()
            .get("content-type")
            .is_none_or(|t| t != "text/event-stream")
        {
            return Err((
                status,
                Value::String(format!("not an event stream: {response:?}")),
            ));
        }
        Ok(Self {
            body: response.into_body(),
            buffer: Vec::new(),
            _connection: connection,
        })
    }

    /// The next event; `None` once the stream or its connection ended.
    pub async fn next(&mut self) -> Option<Received> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let text = String::from_utf8(block).expect("events are UTF-8");
                let (mut event, mut id, mut data) = (String::new(), String::new(), String::new());
                for line in text.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("id:") {
                        id = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                // A keep-alive comment alone.
                if event.is_empty() && data.is_empty() {
                    continue;
                }
                let data = serde_json::from_str(&data).expect("event data is JSON");
                return Some(Received {
                    event,
                    id,
                    data,
                    at: Instant::now(),
                });
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(bytes) = frame.into_data() {
                        self.buffer.extend_from_slice(&bytes);
                    }
                }
                _ => return None,
            }
        }
    }

    /// The next event within `limit`, if any.
    pub async fn next_within(&mut self, limit: Duration) -> Option<Received> {
        tokio::time::timeout(limit, self.next())
            .await
            .ok()
            .flatten()
    }
}

/// Merges an event's `counts` and `uniques` into `seen`
/// (`"counts/<owner>/<key>"` → value).
pub fn merge(seen: &mut std::collections::BTreeMap<String, i64>, data: &Value) {
    for part in ["counts", "uniques"] {
        for (owner, keys) in data[part].as_object().into_iter().flatten() {
            for (key, value) in keys.as_object().unwrap() {
                seen.insert(format!("{part}/{owner}/{key}"), value.as_i64().unwrap());
            }
        }
    }
}

fn address(service: &Running) -> String {
    service.base.trim_start_matches("http://").to_owned()
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn watch_pushes_each_total_after_it_changes(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        let rest = format!(
            "[watch]\nmin_interval_ms = 20\nmax_streams_per_token = 3\nmax_owners = 5\n{NAMESPACES}{TOKENS}"
        );
        let service = Running::start(&config_text("", &scratch, &rest)).await;
        let addr = address(&service);
        service
            .post("/v1/posts/counters:add", Some(WRITER), json!({"owner": 1, "key": "likes", "delta": 4}))
            .await
            .ok();
        let path = "/v1/posts/counts:watch?owners=1,2&keys=likes,viewers";
        let mut watcher = Watcher::open(&addr, path, Some(READER), &[], None).await.unwrap();
        let first = watcher.next_within(Duration::from_secs(10)).await.expect("a snapshot");
        assert_eq!((first.event.as_str(), first.id.as_str()), ("snapshot", "1"), "{first:?}");
        assert_eq!(
            first.data,
            json!({
                "counts": {"1": {"likes": 4}, "2": {"likes": 0}},
                "uniques": {"1": {"viewers": 0}, "2": {"viewers": 0}}
            })
        );

        // Writes to watched totals, and to ones not watched: another owner,
        // another namespace, a key not asked for.
        for _ in 0..5 {
            service
                .post("/v1/posts/counters:add", Some(WRITER), json!({"owner": 1, "key": "likes"}))
                .await
                .ok();
        }
        for (path, body) in [
            ("/v1/posts/counters:add", json!({"owner": 3, "key": "likes", "delta": 7})),
            ("/v1/posts/counters:add", json!({"owner": 1, "key": "views"})),
            ("/v1/tags/counters:add", json!({"owner": "1", "key": "uses"})),
        ] {
            service.post(path, Some(WRITER), body).await.ok();
        }
        let members = json!({"observations": [
            {"owner": 2, "key": "viewers", "member": "a"},
            {"owner": 2, "key": "viewers", "member": "b"},
            {"owner": 2, "key": "viewers", "member": "c"}
        ]});
        service.post("/v1/posts/counters:observe", Some(WRITER), members).await.ok();

        let mut seen = std::collections::BTreeMap::new();
        merge(&mut seen, &first.data);
        let mut last_id = 1;
        let deadline = Instant::now() + Duration::from_secs(20);
        while seen["counts/1/likes"] != 9 || seen["uniques/2/viewers"] != 3 {
            let left = deadline.saturating_duration_since(Instant::now());
            let event = watcher.next_within(left).await.unwrap_or_else(|| panic!("no change event within 20 s; seen {seen:?}"));
            assert_eq!(event.event, "change", "{event:?}");
            let id: u64 = event.id.parse().unwrap();
            assert_eq!(id, last_id + 1, "{event:?}");
            last_id = id;
            for part in ["counts", "uniques"] {
                for (owner, keys) in event.data[part].as_object().unwrap() {
                    assert!(owner == "1" || owner == "2", "an owner not watched: {event:?}");
                    for key in keys.as_object().unwrap().keys() {
                        assert!(key == "likes" || key == "viewers", "a key not watched: {event:?}");
                    }
                }
            }
            assert!(!event.data["counts"].as_object().unwrap().is_empty() || !event.data["uniques"].as_object().unwrap().is_empty(), "an empty change: {event:?}");
            merge(&mut seen, &event.data);
        }
        assert_eq!(seen["counts/2/likes"], 0);
        // Nothing more: no event repeats a total already sent.
        let quiet = watcher.next_within(Duration::from_millis(300)).await;
        assert!(quiet.is_none(), "{quiet:?}");

        // A reconnect (with the last id it saw) starts again from a snapshot.
        drop(watcher);
        let mut again = Watcher::open(&addr, path, Some(READER), &[("last-event-id", &last_id.to_string())], None).await.unwrap();
        let snapshot = again.next_within(Duration::from_secs(10)).await.unwrap();
        assert_eq!(snapshot.event, "snapshot");
        assert_eq!(
            snapshot.data,
            json!({
                "counts": {"1": {"likes": 9}, "2": {"likes": 0}},
                "uniques": {"1": {"viewers": 0}, "2": {"viewers": 3}}
            })
        );

        // Refusals: typed, before any stream.
        let refused = |path: &'static str, token: Option<&'static str>| {
            let addr = addr.clone();
            async move {
                match Watcher::open(&addr, path, token, &[], None).await {
                    Ok(_) => panic!("{path} was not refused"),
                    Err((status, problem)) => (status, problem),
                }
            }
        };
        let (status, problem) = refused("/v1/posts/counts:watch?owners=1,2,3,4,5,6&keys=likes", Some(READER)).await;
        assert_eq!((status, problem["kind"].as_str(), problem["bound"].as_str(), problem["max"].as_u64()), (400, Some("invalid_input"), Some("watched owners"), Some(5)), "{problem}");
        let (status, problem) = refused("/v1/posts/counts:watch?owners=1&keys=nope", Some(READER)).await;
        assert_eq!((status, problem["kind"].as_str()), (400, Some("invalid_input")), "{problem}");
        let (status, problem) = refused("/v1/posts/counts:watch?owners=x&keys=likes", Some(READER)).await;
        assert_eq!((status, problem["kind"].as_str()), (400, Some("invalid_input")), "{problem}");
        let (status, problem) = refused("/v1/posts/counts:watch?owners=1&keys=likes&extra=1", Some(READER)).await;
        assert_eq!((status, problem["kind"].as_str()), (400, Some("invalid_input")), "{problem}");
        let (status, problem) = refused("/v1/posts/counts:watch?owners=1&keys=likes", None).await;
        assert_eq!((status, problem["kind"].as_str()), (401, Some("unauthorized")), "{problem}");
        let (status, problem) = refused("/v1/users/counts:watch?owners=1&keys=followers", Some(POSTS_ONLY)).await;
        assert_eq!((status, problem["kind"].as_str()), (403, Some("forbidden")), "{problem}");
        // A token's streams are bounded (3 here); other tokens are not held back.
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(Watcher::open(&addr, path, Some(WRITER), &[], None).await.unwrap());
        }
        let (status, problem) = refused("/v1/posts/counts:watch?owners=1&keys=likes", Some(WRITER)).await;
        assert_eq!((status, problem["kind"].as_str(), problem["max"].as_u64()), (429, Some("rate_limited"), Some(3)), "{problem}");
        for watcher in &mut held {
            assert_eq!(watcher.next_within(Duration::from_secs(10)).await.unwrap().event, "snapshot");
        }
        assert!(Watcher::open(&addr, path, Some(ADMIN), &[], None).await.is_ok());
        drop(held);
        drop(again);
        service.stop().await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_watcher_that_stops_reading_is_closed_and_the_others_go_on(t: TestDb) {
        // The binary: its /metrics are its own.
        let scratch = Scratch::of(&t).await;
        let rest = format!(
            "[watch]\nmin_interval_ms = 10\nslow_after_ms = 1000\nmax_backlog_bytes = 1048576\n{NAMESPACES}{TOKENS}"
        );
        let file = std::env::temp_dir().join(format!("counter-service-slow-watcher-{}-{}.toml", t.backend, std::process::id()));
        std::fs::write(&file, config_text("max_batch_items = 3000", &scratch, &rest)).unwrap();
        let port = free_port();
        let _child = spawn_binary(&file, port).await;
        let api = Api::new(format!("http://127.0.0.1:{port}"));
        let addr = format!("127.0.0.1:{port}");
        let owners: Vec<String> = (1..=100).map(|o| o.to_string()).collect();
        let keys: Vec<String> = (0..30).map(|k| format!("reaction:{k}")).collect();
        let path = format!("/v1/posts/counts:watch?owners={}&keys={}", owners.join(","), keys.join(","));
        // Its socket's buffer made small. The kernel still holds megabytes
        // for it on loopback before the service has to: every round below
        // changes 3,000 totals, an event of about 60 kB.
        let mut stalled = Watcher::open(&addr, &path, Some(READER), &[], Some(2048)).await.unwrap();
        assert_eq!(stalled.next_within(Duration::from_secs(10)).await.unwrap().event, "snapshot");
        let mut reading = Watcher::open(&addr, &path, Some(READER), &[], None).await.unwrap();
        let reader = tokio::spawn(async move {
            let mut seen = std::collections::BTreeMap::new();
            let mut kinds = Vec::new();
            while let Some(event) = reading.next_within(Duration::from_secs(5)).await {
                merge(&mut seen, &event.data);
                kinds.push(event.event);
            }
            (seen, kinds)
        });

        // Every total changes, round after round (for at most 60 s), while
        // the stalled watcher reads nothing, until the service says it
        // closed a slow watcher; then it reads again, and its stream must
        // end within 10 s.
        let items: Vec<Value> = owners
            .iter()
            .flat_map(|o| keys.iter().map(move |k| json!({"owner": o, "key": k})))
            .collect();
        let began = Instant::now();
        let mut rounds = 0u64;
        let closed_at = loop {
            api.post("/v1/posts/counters:batchAdd", Some(WRITER), json!({"items": items})).await.ok();
            rounds += 1;
            let metrics = api.get("/metrics", None).await.text;
            let slow: f64 = metrics
                .lines()
                .filter(|l| l.starts_with("counter_service_watch_closed_total{reason=\"slow_consumer\"}"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum();
            if slow >= 1.0 {
                assert_eq!(slow, 1.0, "the watcher that kept reading was closed too");
                break began.elapsed();
            }
            assert!(began.elapsed() < Duration::from_secs(60), "no slow watcher closed after {rounds} rounds");
        };
        let mut after = 0;
        let mut last = None;
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(event) = stalled.next().await {
                after += 1;
                last = Some(event);
            }
        })
        .await;
        assert!(ended.is_ok(), "the stalled watcher's stream did not end ({after} events read after it resumed)");
        if let Some(last) = &last
            && last.event == "closed"
        {
            assert_eq!(last.data, json!({"reason": "slow_consumer"}));
        }
        let metrics = api.get("/metrics", None).await.text;
        assert!(metrics.contains("counter_service_watch_streams 1\n"), "the closed stream is gone, the other open: {}", metrics.lines().filter(|l| l.contains("watch")).collect::<Vec<_>>().join("\n"));

        // The watcher that kept reading got every total, and was not closed.
        let expected = api.totals("posts", Some(READER), json!(owners), json!(keys)).await;
        let (seen, kinds) = reader.await.unwrap();
        assert!(!kinds.iter().any(|k| k == "closed"), "the reading watcher was closed: {kinds:?}");
        for owner in &owners {
            for key in &keys {
                assert_eq!(seen[&format!("counts/{owner}/{key}")], expected[owner][key].as_i64().unwrap(), "owner {owner}, {key}");
            }
        }
        eprintln!(
            "[{}] slow watcher closed {} ms into {rounds} rounds of 3,000 changes; {after} events read after it resumed, the last {:?}; the reader got {} events",
            t.backend,
            closed_at.as_millis(),
            last.map(|e| e.event),
            kinds.len()
        );
        let _ = std::fs::remove_file(&file);
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_watched_ranking_follows_owners_that_pass_each_other(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        let rest = format!("[watch]\nmin_interval_ms = 20\n{NAMESPACES}{TOKENS}");
        let service = Running::start(&config_text("", &scratch, &rest)).await;
        let addr = address(&service);
        let add = |owner: i64, key: &'static str, delta: i64| {
            let api = service.api.clone();
            async move {
                api.post("/v1/posts/counters:add", Some(WRITER), json!({"owner": owner, "key": key, "delta": delta}))
                    .await
                    .ok();
            }
        };
        for (owner, likes) in [(1, 50), (2, 40), (3, 30), (4, 20), (5, 10)] {
            add(owner, "likes", likes).await;
        }
        let mut watcher = Watcher::open(&addr, "/v1/posts/top:watch?key=likes&limit=3", Some(READER), &[], None).await.unwrap();
        let ranking = |pairs: &[(&str, i64)]| json!({"key": "likes", "owners": pairs.iter().map(|(o, n)| json!({"owner": o, "total": n})).collect::<Vec<_>>()});
        let first = watcher.next_within(Duration::from_secs(10)).await.unwrap();
        assert_eq!((first.event.as_str(), &first.data), ("snapshot", &ranking(&[("1", 50), ("2", 40), ("3", 30)])));

        // An owner below the first three passes into them; one inside moves
        // up; a change outside them (owner 4 stays fourth), another key and
        // another namespace change nothing shown.
        add(5, "likes", 35).await;
        let mut last = first;
        let want = ranking(&[("1", 50), ("5", 45), ("2", 40)]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while last.data != want {
            last = watcher.next_within(deadline.saturating_duration_since(Instant::now())).await.unwrap_or_else(|| panic!("no ranking {want} within 20 s; last {last:?}"));
            assert_eq!(last.event, "change");
        }
        add(4, "likes", 1).await;
        add(1, "views", 100).await;
        service.post("/v1/tags/counters:add", Some(WRITER), json!({"owner": "1", "key": "uses", "delta": 500})).await.ok();
        let quiet = watcher.next_within(Duration::from_millis(500)).await;
        assert!(quiet.is_none(), "a change that moves nothing shown: {quiet:?}");
        add(2, "likes", 20).await;
        let moved = watcher.next_within(Duration::from_secs(10)).await.unwrap();
        assert_eq!(moved.data, ranking(&[("2", 60), ("1", 50), ("5", 45)]));

        // Refusals: a unique key, a limit over max_owners (100).
        for path in ["/v1/posts/top:watch?key=viewers", "/v1/posts/top:watch?key=likes&limit=101", "/v1/posts/top:watch?key=likes&limit=0"] {
            match Watcher::open(&addr, path, Some(READER), &[], None).await {
                Ok(_) => panic!("{path} was not refused"),
                Err((status, problem)) => assert_eq!((status, problem["kind"].as_str()), (400, Some("invalid_input")), "{path}: {problem}"),
            }
        }
        drop(watcher);
        service.stop().await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_stopping_instance_ends_its_streams_at_once(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        let rest = format!("{NAMESPACES}{TOKENS}");
        let service = Running::start(&config_text("shutdown_grace_ms = 30000", &scratch, &rest)).await;
        let addr = address(&service);
        let mut watcher = Watcher::open(&addr, "/v1/posts/counts:watch?owners=1&keys=likes", Some(READER), &[], None).await.unwrap();
        assert_eq!(watcher.next_within(Duration::from_secs(10)).await.unwrap().event, "snapshot");
        let began = Instant::now();
        let stopping = tokio::spawn(service.stop());
        let last = watcher.next_within(Duration::from_secs(10)).await.expect("a closed event");
        assert_eq!((last.event.as_str(), &last.data), ("closed", &json!({"reason": "draining"})));
        assert!(watcher.next_within(Duration::from_secs(10)).await.is_none());
        stopping.await.unwrap();
        // Not the 30 s grace: the stream ended, so nothing was waited for.
        assert!(began.elapsed() < Duration::from_secs(10), "{:?}", began.elapsed());
        t.finish().await;
    }
}

/// Watchers of the figures, over both instances, and the adds that land.
const WATCHERS: usize = 1_000;
const IDLE_WATCHERS: usize = 10_000;
const OWNERS: usize = 100;
const ADDS: usize = 20_000;
const UNWATCHED_ADDS: usize = 5_000;
const WRITERS: usize = 32;

/// What one watcher saw: its owner's totals, and when each arrived.
type Seen = Vec<(i64, Instant)>;

/// Resident memory of process `pid`, in kB.
fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// CPU time process `pid` has used (user and system), in ms.
fn cpu_ms(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command's closing parenthesis; utime and stime
    // are the 12th and 13th of them, in clock ticks (100 a second here).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    (fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()) * 10
}

/// Opens `count` watchers, watcher `i` on owner `i % OWNERS + 1` through
/// instance `i % 2`, each past its snapshot.
async fn open_watchers(addrs: &[String; 2], first: usize, count: usize) -> Vec<(usize, Watcher)> {
    let mut opened = Vec::with_capacity(count);
    let indexes: Vec<usize> = (first..first + count).collect();
    for chunk in indexes.chunks(50) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|&i| {
                let addr = addrs[i % 2].clone();
                tokio::spawn(async move {
                    let path = format!(
                        "/v1/posts/counts:watch?owners={}&keys=likes",
                        i % OWNERS + 1
                    );
                    let mut watcher = Watcher::open(&addr, &path, None, &[], None).await.unwrap();
                    let first = watcher
                        .next_within(Duration::from_secs(30))
                        .await
                        .expect("a snapshot");
                    assert_eq!(first.event, "snapshot");
                    (i, watcher)
                })
            })
            .collect();
        for task in tasks {
            opened.push(task.await.unwrap());
        }
    }
    opened
}

/// `count` adds of 1 over the owners through `api`, from [`WRITERS`]
/// clients: each add's owner, its total and when its 200 arrived; and how
/// long they took.
async fn add_load(api: &Api, count: usize) -> (Vec<(usize, i64, Instant)>, Duration) {
    let began = Instant::now();
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let api = api.clone();
            tokio::spawn(async move {
                let mut acked = Vec::new();
                for k in (w..count).step_by(WRITERS) {
                    let owner = k % OWNERS + 1;
                    let reply = api
                        .post(
                            "/v1/posts/counters:addAndGet",
                            None,
                            json!({"owner": owner, "key": "likes"}),
                        )
                        .await;
                    assert_eq!(reply.status, 200, "{reply:?}");
                    acked.push((owner, reply.json["total"].as_i64().unwrap(), Instant::now()));
                }
                acked
            })
        })
        .collect();
    let mut acked = Vec::with_capacity(count);
    for writer in writers {
        acked.extend(writer.await.unwrap());
    }
    (acked, began.elapsed())
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn watchers_on_two_instances_see_every_add_figures(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        // One bus per backend: MariaDB with the cache's Redis (Pub/Sub),
        // PostgreSQL by NOTIFY, SQLite none (as MariaDB without Redis, or
        // PostgreSQL behind a transaction pooler): the other instance's
        // watchers learn at their next poll (1 s).
        let cache = match t.backend {
            counter_tests::Backend::MySql => crate::support::cache_section(&t),
            _ => None,
        };
        let bus = match t.backend {
            _ if cache.is_some() => "redis",
            counter_tests::Backend::Postgres if !scratch.database.contains("pooler") => "postgres",
            _ => "poll",
        };
        let file = std::env::temp_dir().join(format!("counter-service-watch-figures-{}-{}.toml", t.backend, std::process::id()));
        let rest = format!("{}{NAMESPACES}", cache.unwrap_or_default());
        std::fs::write(&file, config_text("open = true", &scratch, &rest)).unwrap();
        let ports = [free_port(), free_port()];
        let a = spawn_binary(&file, ports[0]).await;
        let b = spawn_binary(&file, ports[1]).await;
        let pids = [a.id().unwrap(), b.id().unwrap()];
        let addrs = ports.map(|p| format!("127.0.0.1:{p}"));
        let apis = ports.map(|p| Api::new(format!("http://127.0.0.1:{p}")));
        let rss = || pids.iter().map(|&p| rss_kb(p)).sum::<u64>();
        let cpu = || pids.iter().map(|&p| cpu_ms(p)).sum::<u64>();
        // Both pools warm before the figures.
        for api in &apis {
            api.totals("posts", None, json!([1]), json!(["likes"])).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rss_none = rss();

        // The add rate with nobody watching, for the one with watchers.
        let cpu_before = cpu();
        let unwatched = add_load(&apis[0], UNWATCHED_ADDS).await;
        let unwatched_cpu = cpu() - cpu_before;
        let unwatched_rate = UNWATCHED_ADDS as f64 / unwatched.1.as_secs_f64();

        let watchers = open_watchers(&addrs, 0, WATCHERS).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rss_1k = rss();
        // Each watcher records its owner's totals as they arrive, until told
        // to stop; an event of another owner or key fails the test.
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let latest: Arc<Vec<AtomicI64>> = Arc::new((0..WATCHERS).map(|_| AtomicI64::new(0)).collect());
        let tasks: Vec<_> = watchers
            .into_iter()
            .map(|(i, mut watcher)| {
                let mut stopped = stopped.clone();
                let latest = latest.clone();
                tokio::spawn(async move {
                    let owner = (i % OWNERS + 1).to_string();
                    let mut seen: Vec<(i64, Instant)> = Vec::new();
                    loop {
                        let event = tokio::select! {
                            event = watcher.next() => event,
                            _ = stopped.changed() => break,
                        };
                        let Some(event) = event else { panic!("watcher {i}'s stream ended") };
                        assert_eq!(event.event, "change", "watcher {i}: {event:?}");
                        let counts = event.data["counts"].as_object().unwrap();
                        assert!(counts.len() == 1 && event.data["uniques"].as_object().unwrap().is_empty(), "watcher {i} of {owner}: {event:?}");
                        let total = counts[&owner].as_object().filter(|k| k.len() == 1).and_then(|k| k["likes"].as_i64()).unwrap_or_else(|| panic!("watcher {i} of {owner}: {event:?}"));
                        seen.push((total, event.at));
                        latest[i].store(total, Ordering::Relaxed);
                    }
                    (i, seen)
                })
            })
            .collect();

        // 20,000 adds of 1 over 100 owners, all through the first instance:
        // the second's watchers learn of them by the bus (or a poll).
        let cpu_before = cpu();
        let (acked, adds_took) = add_load(&apis[0], ADDS).await;
        let watched_cpu = cpu() - cpu_before;
        let finals = apis[0].totals("posts", None, json!((1..=OWNERS).collect::<Vec<_>>()), json!(["likes"])).await;
        let total: i64 = (1..=OWNERS).map(|o| finals[o.to_string()]["likes"].as_i64().unwrap()).sum();
        assert_eq!(total, (UNWATCHED_ADDS + ADDS) as i64, "every add counted once");

        // Every watcher's last event reaches its owner's final total.
        let deadline = Instant::now() + Duration::from_secs(if bus == "poll" { 15 } else { 10 });
        let caught_up = || (0..WATCHERS).all(|i| Some(latest[i].load(Ordering::Relaxed)) == finals[(i % OWNERS + 1).to_string()]["likes"].as_i64());
        while !caught_up() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = stop.send(true);
        // Latencies of the watchers on the instance that took the adds, and
        // on the other.
        let mut latencies = [Vec::with_capacity(ADDS * WATCHERS / OWNERS / 2), Vec::with_capacity(ADDS * WATCHERS / OWNERS / 2)];
        let mut by_owner: std::collections::HashMap<usize, Vec<(usize, Seen)>> = std::collections::HashMap::new();
        for task in tasks {
            let (i, seen) = task.await.unwrap();
            let owner = i % OWNERS + 1;
            let last = seen.last().map(|(total, _)| *total);
            assert_eq!(last, finals[owner.to_string()]["likes"].as_i64(), "watcher {i}'s last event (owner {owner})");
            assert!(seen.windows(2).all(|w| w[0].0 < w[1].0), "watcher {i}: totals out of order or repeated");
            by_owner.entry(owner).or_default().push((i % 2, seen));
        }
        let events: usize = by_owner.values().flatten().map(|(_, seen)| seen.len()).sum();
        for (owner, total, at) in &acked {
            for (instance, seen) in &by_owner[owner] {
                let first = seen.partition_point(|(t, _)| t < total);
                let (_, received) = seen[first];
                latencies[*instance].push(received.saturating_duration_since(*at).as_millis() as u64);
            }
        }
        let [local, remote] = latencies.map(|mut l| {
            l.sort_unstable();
            (crate::load::percentile(&l, 50), crate::load::percentile(&l, 99), *l.last().unwrap())
        });

        // 10,000 idle watchers (the thousand above gone): the memory they
        // take; then none again.
        let more = open_watchers(&addrs, WATCHERS, IDLE_WATCHERS).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rss_10k = rss();
        let streams = |api: Api| async move {
            api.get("/metrics", None).await.text.lines().find_map(|l| l.strip_prefix("counter_service_watch_streams ")?.parse::<f64>().ok()).unwrap_or(0.0)
        };
        // The first thousand closed by their clients, the 10,000 open; then
        // none, once every client has gone.
        for (expected, gone) in [(IDLE_WATCHERS, None), (0, Some(more))] {
            drop(gone);
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let open = streams(apis[0].clone()).await + streams(apis[1].clone()).await;
                if open as usize == expected {
                    break;
                }
                assert!(Instant::now() < deadline, "{open} streams open 30 s after their clients left, not {expected}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let rss_after = rss();
        assert!(local.1 <= 500, "p99 {} ms on the instance that took the adds", local.1);
        let limit = if bus == "poll" { 2_500 } else { 500 };
        assert!(remote.1 <= limit, "p99 {} ms on the other instance, over {limit} ms with bus {bus}", remote.1);
        counter_tests::figures(
            "watch_two_instances",
            t.backend,
            &[
                ("watchers", WATCHERS as u64),
                ("adds", ADDS as u64),
                ("adds_per_s_unwatched", unwatched_rate as u64),
                ("adds_per_s", (ADDS as f64 / adds_took.as_secs_f64()) as u64),
                // The instances' CPU per add, without and with the watchers,
                // and the events the watchers received.
                ("service_cpu_us_per_add_unwatched", unwatched_cpu * 1_000 / UNWATCHED_ADDS as u64),
                ("service_cpu_us_per_add", watched_cpu * 1_000 / ADDS as u64),
                ("events", events as u64),
                ("bus_redis", u64::from(bus == "redis")),
                ("bus_postgres", u64::from(bus == "postgres")),
                ("same_instance_p50_ms", local.0),
                ("same_instance_p99_ms", local.1),
                ("same_instance_max_ms", local.2),
                ("other_instance_p50_ms", remote.0),
                ("other_instance_p99_ms", remote.1),
                ("other_instance_max_ms", remote.2),
                ("last_event_wrong", 0),
                ("rss_none_kb", rss_none),
                ("rss_1k_idle_kb", rss_1k),
                ("rss_10k_idle_kb", rss_10k),
                ("per_idle_watcher_b", rss_10k.saturating_sub(rss_none) * 1024 / IDLE_WATCHERS as u64),
                ("rss_after_close_kb", rss_after),
            ],
        );
        let _ = std::fs::remove_file(&file);
        t.finish().await;
    }
}
