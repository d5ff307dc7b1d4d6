//! The service's life: killed with SIGKILL under load and restarted (every
//! unanswered add retried with its key), stopped gracefully under load,
//! fed by HTTP and a queue at once.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use counter_core::{CounterTable, Counters};
use counter_mq::Publish;
use counter_tests::{TestDb, backend_test, figures, mq, servers::free_port};
use serde_json::json;

use crate::support::{Api, NAMESPACES, Running, Scratch, config_text, spawn_binary};

/// Adds applied per load, and clients.
const ADDS: u64 = 600;
const CLIENTS: u64 = 16;

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 8)]
    async fn sigkill_under_load_then_retries_count_once(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        let file = std::env::temp_dir().join(format!("counter-service-kill-{}-{}.toml", t.backend, std::process::id()));
        std::fs::write(&file, config_text("open = true", &scratch, NAMESPACES)).unwrap();
        let port = free_port();
        let mut child = spawn_binary(&file, port).await;
        let api = Api::new(format!("http://127.0.0.1:{port}"));

        // 16 clients, 600 adds with a key each, each retried until answered.
        let acked = Arc::new(AtomicU64::new(0));
        let retries = Arc::new(AtomicU64::new(0));
        let replays = Arc::new(AtomicU64::new(0));
        let deadline = Instant::now() + Duration::from_secs(120);
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|client| {
                let (api, acked, retries, replays) = (api.clone(), acked.clone(), retries.clone(), replays.clone());
                tokio::spawn(async move {
                    for n in (client..ADDS).step_by(CLIENTS as usize) {
                        let key = format!("kill-{n}");
                        loop {
                            assert!(Instant::now() < deadline, "add {n} unanswered after 120 s");
                            let body = Some(json!({"owner": 1, "key": "likes"}).to_string());
                            match api.try_call(hyper::Method::POST, "/v1/posts/counters:add", None, &[("idempotency-key", &key)], body).await {
                                Ok(reply) if reply.status == 200 => {
                                    acked.fetch_add(1, Ordering::Relaxed);
                                    if reply.header("idempotent-replayed") == Some("true") {
                                        replays.fetch_add(1, Ordering::Relaxed);
                                    }
                                    break;
                                }
                                // 503 while the database or the process
                                // comes back; a reset while it is dead.
                                _ => {
                                    retries.fetch_add(1, Ordering::Relaxed);
                                    tokio::time::sleep(Duration::from_millis(50)).await;
                                }
                            }
                        }
                    }
                })
            })
            .collect();

        // SIGKILL once a third is acknowledged, then start it again.
        let wait = Instant::now();
        while acked.load(Ordering::Relaxed) < ADDS / 3 {
            assert!(wait.elapsed() < Duration::from_secs(60), "the load did not start");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        child.start_kill().unwrap();
        child.wait().await.unwrap();
        let acked_at_kill = acked.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut child = spawn_binary(&file, port).await;
        for task in tasks {
            task.await.unwrap();
        }
        let total = api.totals("posts", None, json!([1]), json!(["likes"])).await["1"]["likes"].as_u64().unwrap();
        let (lost, doubled) = (ADDS.saturating_sub(total), total.saturating_sub(ADDS));
        figures(
            "service_sigkill",
            t.backend,
            &[
                ("adds", ADDS),
                ("acked_at_kill", acked_at_kill),
                ("retries", retries.load(Ordering::Relaxed)),
                ("replayed", replays.load(Ordering::Relaxed)),
                ("lost", lost),
                ("doubled", doubled),
            ],
        );
        assert_eq!((lost, doubled), (0, 0), "[{}] total {total} of {ADDS}", t.backend);
        child.start_kill().unwrap();
        child.wait().await.unwrap();
        let _ = std::fs::remove_file(&file);
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 8)]
    async fn graceful_shutdown_loses_no_acknowledged_add(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        let service = Running::start(&config_text("open = true", &scratch, NAMESPACES)).await;
        let acked = Arc::new(AtomicU64::new(0));
        let stopping = Arc::new(AtomicBool::new(false));
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let (api, acked, stopping) = (service.api.clone(), acked.clone(), stopping.clone());
                tokio::spawn(async move {
                    // Without keys: at least once, so every 200 must be in
                    // the total and nothing unanswered may be.
                    for _ in 0..200 {
                        let body = Some(json!({"owner": 1, "key": "likes"}).to_string());
                        match api.try_call(hyper::Method::POST, "/v1/posts/counters:add", None, &[], body).await {
                            Ok(reply) if reply.status == 200 => {
                                acked.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(reply) => panic!("{reply:?}"),
                            Err(_) if stopping.load(Ordering::Relaxed) => return,
                            Err(e) => panic!("{e}"),
                        }
                    }
                })
            })
            .collect();
        let wait = Instant::now();
        while acked.load(Ordering::Relaxed) < 300 {
            assert!(wait.elapsed() < Duration::from_secs(60), "the load did not start");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        stopping.store(true, Ordering::Relaxed);
        service.stop().await;
        for task in tasks {
            task.await.unwrap();
        }
        let acked = acked.load(Ordering::Relaxed);
        let db = scratch.connect(&t).await;
        let posts = Counters::<i64>::new(CounterTable::new("post_counters").unwrap());
        let total = posts.get(&db, 1, "likes").await.unwrap() as u64;
        figures("service_graceful_shutdown", t.backend, &[("acked", acked), ("total", total), ("lost", acked.saturating_sub(total)), ("doubled", total.saturating_sub(acked))]);
        assert_eq!(total, acked, "[{}] every acknowledged add, and only those", t.backend);
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 8)]
    async fn http_and_queue_adds_sum_exactly(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        let posts = Counters::<i64>::new(CounterTable::new("post_counters").unwrap().with_unique_key("viewers").unwrap());
        // RabbitMQ: the shared server, a queue of this test's own.
        if let Some(amqp) = mq::amqp_url(t.backend, t.label()) {
            let queue = mq::AmqpQueue::named(&amqp, t.label()).await;
            let broker = format!("[broker]\nkind = \"amqp\"\nurl = \"{amqp}\"\nqueue = \"{}\"\n", queue.settings.name);
            let service = Running::start(&config_text("open = true", &scratch, &format!("{NAMESPACES}\n{broker}"))).await;
            let publisher = queue.publisher().await;
            both_paths(&t, &service, "amqp", 9, |n| {
                let (publisher, posts) = (&publisher, &posts);
                async move {
                    publisher.publish(posts, 9, "likes", 1).await.unwrap();
                    if let Some(member) = queue_member(n) {
                        publisher.observe(posts, 9, "viewers", &member).await.unwrap();
                    }
                }
            })
            .await;
            service.stop().await;
            queue.delete().await;
        }
        // JetStream: a private nats-server, a stream the service creates
        // with the subjects configured (the publisher's are not the
        // default `counters.>`, so an ignored setting loses every message).
        if let Some(bin) = mq::nats_server(t.backend, t.label()) {
            let nats = mq::PrivateNats::start(&bin);
            let broker = format!(
                "[broker]\nkind = \"nats\"\nurl = \"{}\"\nstream = \"SERVICE_COUNTS\"\nsubjects = [\"svc.counts.>\"]\n",
                nats.url()
            );
            let service = Running::start(&config_text("open = true", &scratch, &format!("{NAMESPACES}\n{broker}"))).await;
            let js = mq::jetstream(&[nats.url()]).await;
            let publisher = counter_mq::nats::JetStreamPublisher::new(js).subject_prefix("svc.counts");
            both_paths(&t, &service, "nats", 10, |n| {
                let (publisher, posts) = (&publisher, &posts);
                async move {
                    publisher.publish(posts, 10, "likes", 1).await.unwrap();
                    if let Some(member) = queue_member(n) {
                        publisher.observe(posts, 10, "viewers", &member).await.unwrap();
                    }
                }
            })
            .await;
            service.stop().await;
        }
        t.finish().await;
    }
}

/// Members the queue observes (`m-0` to `m-99`) and HTTP observes (`m-50`
/// to `m-149`): 150 distinct between them.
fn queue_member(n: u64) -> Option<String> {
    (n < 100).then(|| format!("m-{n}"))
}

fn http_member(n: u64) -> Option<String> {
    (n < 100).then(|| format!("m-{}", n + 50))
}

/// 500 keyed HTTP adds and 500 published events to `owner`'s likes at
/// once: 1,000, reported as `service_http_and_queue_<broker>`; and the
/// observations of [`queue_member`] and [`http_member`] to its viewers,
/// whose estimate must be the union's.
async fn both_paths<F, Fut>(t: &TestDb, service: &Running, broker: &str, owner: i64, publish: F)
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    const EACH: u64 = 500;
    let http = {
        let api = service.api.clone();
        let broker = broker.to_owned();
        tokio::spawn(async move {
            for n in 0..EACH {
                api.post_keyed(
                    "/v1/posts/counters:add",
                    None,
                    &format!("{broker}-{n}"),
                    json!({"owner": owner, "key": "likes"}),
                )
                .await
                .ok();
                if let Some(member) = http_member(n) {
                    let observation = json!({"owner": owner, "key": "viewers", "member": member});
                    api.post(
                        "/v1/posts/counters:observe",
                        None,
                        json!({"observations": [observation]}),
                    )
                    .await
                    .ok();
                }
            }
        })
    };
    for n in 0..EACH {
        publish(n).await;
    }
    http.await.unwrap();
    // The queue drains into the same counter.
    let wait = Instant::now();
    let total = loop {
        let total = service
            .totals("posts", None, json!([owner]), json!(["likes"]))
            .await[owner.to_string()]["likes"]
            .as_u64()
            .unwrap();
        if total >= 2 * EACH || wait.elapsed() > Duration::from_secs(60) {
            break total;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The union's sketch, made here: what the stored estimate must equal.
    let mut union = counter_core::unique::Sketch::new();
    for n in 0..EACH {
        for member in [queue_member(n), http_member(n)].into_iter().flatten() {
            union.insert(member.as_str());
        }
    }
    let read = || async {
        service
            .post(
                "/v1/posts/uniques:batchGet",
                None,
                json!({"owners": [owner], "keys": ["viewers"]}),
            )
            .await
            .ok()["uniques"][owner.to_string()]["viewers"]
            .as_u64()
            .unwrap()
    };
    let mut viewers = read().await;
    while viewers < union.estimate() && wait.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        viewers = read().await;
    }
    assert_eq!(
        viewers,
        union.estimate(),
        "[{}] {broker}: the union of queue and HTTP observations",
        t.backend
    );
    let ready = service.get("/readyz", None).await.ok();
    assert_eq!(ready["broker"]["ok"], true, "{ready}");
    figures(
        &format!("service_http_and_queue_{broker}"),
        t.backend,
        &[
            ("http", EACH),
            ("queue", EACH),
            ("lost", (2 * EACH).saturating_sub(total)),
            ("doubled", total.saturating_sub(2 * EACH)),
        ],
    );
    assert_eq!(total, 2 * EACH, "[{}] {broker}", t.backend);
}

backend_test! {
    /// Clients that give up mid-call (the connection closes, axum drops the
    /// handler) and retry with their key: each add counted once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 8)]
    async fn clients_that_give_up_and_retry_count_once(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        let service = Running::start(&config_text("open = true", &scratch, NAMESPACES)).await;
        const ADDS: u64 = 240;
        let dropped = Arc::new(AtomicU64::new(0));
        let replays = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..8u64)
            .map(|client| {
                let (api, dropped, replays) = (service.api.clone(), dropped.clone(), replays.clone());
                tokio::spawn(async move {
                    for n in (client..ADDS).step_by(8) {
                        let key = format!("drop-{n}");
                        let body = || Some(json!({"owner": 3, "key": "likes"}).to_string());
                        // First a call given up after 0.1 to 3 ms...
                        let patience = Duration::from_micros(100 + (n * 7919) % 2_900);
                        let first = tokio::time::timeout(patience, api.try_call(hyper::Method::POST, "/v1/posts/counters:add", None, &[("idempotency-key", &key)], body())).await;
                        if !matches!(first, Ok(Ok(ref reply)) if reply.status == 200) {
                            dropped.fetch_add(1, Ordering::Relaxed);
                            // ...then the retry, until answered.
                            let reply = api.post_keyed("/v1/posts/counters:add", None, &key, json!({"owner": 3, "key": "likes"})).await;
                            assert_eq!(reply.status, 200, "{reply:?}");
                            if reply.header("idempotent-replayed") == Some("true") {
                                replays.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let total = service.totals("posts", None, json!([3]), json!(["likes"])).await["3"]["likes"].as_u64().unwrap();
        let (dropped, replays) = (dropped.load(Ordering::Relaxed), replays.load(Ordering::Relaxed));
        figures("service_dropped_calls", t.backend, &[("adds", ADDS), ("given_up", dropped), ("replayed", replays), ("lost", ADDS.saturating_sub(total)), ("doubled", total.saturating_sub(ADDS))]);
        assert_eq!(total, ADDS, "[{}]", t.backend);
        assert!(dropped > 0, "[{}] no call was given up: the test proved nothing", t.backend);
        service.stop().await;
        t.finish().await;
    }
}

backend_test! {
    /// Two service processes on one database observe overlapping members
    /// into one owner's unique key at once (each process merges into the
    /// slot rows it picks): both read the estimate of the union's sketch
    /// made here, before and after a compaction folds the slots, so
    /// sketches written by different processes merge as one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 8)]
    async fn two_processes_observing_one_owner_make_one_sketch(t: TestDb) {
        const OWNER: i64 = 7;
        let scratch = Scratch::of(&t).await;
        let file = std::env::temp_dir().join(format!(
            "counter-service-uniques-{}-{}.toml",
            t.backend,
            std::process::id()
        ));
        std::fs::write(&file, config_text("open = true", &scratch, NAMESPACES)).unwrap();
        let ports = [free_port(), free_port()];
        let mut children = Vec::new();
        for port in ports {
            children.push(spawn_binary(&file, port).await);
        }
        let apis: Vec<Api> = ports
            .iter()
            .map(|port| Api::new(format!("http://127.0.0.1:{port}")))
            .collect();
        // Process 0 sees members 0..1500, process 1 sees 1000..2500, in
        // batches of 250, at once.
        let ranges = [0..1_500u64, 1_000..2_500];
        let writers: Vec<_> = apis
            .iter()
            .zip(ranges.clone())
            .map(|(api, range)| {
                let api = api.clone();
                tokio::spawn(async move {
                    let members: Vec<u64> = range.collect();
                    for chunk in members.chunks(250) {
                        let observations: Vec<_> = chunk
                            .iter()
                            .map(|n| json!({"owner": OWNER, "key": "viewers", "member": format!("user-{n}")}))
                            .collect();
                        let reply = api
                            .post("/v1/posts/counters:observe", None, json!({"observations": observations}))
                            .await
                            .ok();
                        assert_eq!(reply["observed"], chunk.len(), "{reply}");
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.await.unwrap();
        }
        let mut union = counter_core::unique::Sketch::new();
        for n in 0..2_500u64 {
            union.insert(format!("user-{n}").as_str());
        }
        let read = |api: Api| async move {
            api.post("/v1/posts/uniques:batchGet", None, json!({"owners": [OWNER], "keys": ["viewers"]}))
                .await
                .ok()["uniques"][OWNER.to_string()]["viewers"]
                .as_u64()
                .unwrap()
        };
        let before = [read(apis[0].clone()).await, read(apis[1].clone()).await];
        let compacted = apis[1].run_job("/v1/posts/admin:compact", None).await;
        let after = read(apis[0].clone()).await;
        figures(
            "service_unique_processes",
            t.backend,
            &[
                ("members", 2_500),
                ("union_estimate", union.estimate()),
                ("process_0_reads", before[0]),
                ("process_1_reads", before[1]),
                ("after_compaction", after),
                ("sketch_rows_after", compacted["sketch_rows_after"].as_u64().unwrap_or(u64::MAX)),
            ],
        );
        assert_eq!(before, [union.estimate(); 2], "[{}] both processes read the union", t.backend);
        assert_eq!(after, union.estimate(), "[{}] after compaction: {compacted}", t.backend);
        for mut child in children {
            child.start_kill().unwrap();
            child.wait().await.unwrap();
        }
        let _ = std::fs::remove_file(&file);
        t.finish().await;
    }
}

/// A stopping instance drains for `drain_ms` before it takes no more
/// connections: `/readyz` answers 503 `draining`, adds are still served,
/// and each answer closes its connection (so a load balancer's pooled
/// connection is never left on it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draining_instance_says_so_and_still_serves() {
    let file =
        std::env::temp_dir().join(format!("counter-service-drain-{}.db", std::process::id()));
    let text = format!(
        "[server]\nopen = true\ndrain_ms = 1000\n[database]\nurl = \"sqlite://{}?mode=rwc\"\n\
         [namespaces.posts]\ntable = \"post_counters\"\nowner = \"integer\"\nkeys.likes = {{}}\n",
        file.display()
    );
    let service = Running::start(&text).await;
    let api = service.api.clone();
    let ready = api.get("/readyz", None).await;
    assert_eq!(
        (ready.status, ready.json["status"].as_str()),
        (200, Some("ready")),
        "{ready:?}"
    );
    let add = json!({"owner": 1, "key": "likes", "delta": 1});
    assert_eq!(
        api.post("/v1/posts/counters:add", None, add.clone())
            .await
            .header("connection"),
        None
    );

    let stopped = tokio::spawn(service.stop());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ready = api.get("/readyz", None).await;
    assert_eq!(
        (ready.status, ready.json["status"].as_str()),
        (503, Some("draining")),
        "{ready:?}"
    );
    let reply = api.post("/v1/posts/counters:add", None, add).await;
    assert_eq!(
        (reply.status, reply.header("connection")),
        (200, Some("close")),
        "{reply:?}"
    );
    assert!(
        !stopped.is_finished(),
        "still draining after 200 ms of 1,000"
    );
    stopped.await.unwrap();
    assert!(
        api.try_call(hyper::Method::GET, "/healthz", None, &[], None)
            .await
            .is_err(),
        "no connection taken once stopped"
    );
    let db = sea_orm::Database::connect(format!("sqlite://{}?mode=rwc", file.display()))
        .await
        .unwrap();
    let posts = Counters::<i64>::new(CounterTable::new("post_counters").unwrap());
    assert_eq!(
        posts.get(&db, 1, "likes").await.unwrap(),
        2,
        "both adds counted"
    );
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}
