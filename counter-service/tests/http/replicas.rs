//! Reads from PostgreSQL standbys, with a bound you can see: a read a
//! caller marks lag-tolerant (`Counter-Read-From: replica`) goes to a
//! standby only while that standby has replayed what the primary had
//! flushed within `replica_max_lag_ms`; every answer says where it was
//! served (`Counter-Read-Source`).
//!
//! On every backend: the header's values, the sources answered, the
//! settings refused. On `deploy/ha/` (Patroni, two standbys): keyed adds and
//! replica reads at once while one standby's replay is paused and then
//! both: 0 reads older than the bound, the primary serving when no standby
//! is within it, and the read throughput of two standbys against the
//! primary's, measured in one run.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use counter_service::config::Config;
use counter_tests::{Backend, TestDb, backend_test, figures};
use hyper::Method;
use sea_orm::ConnectionTrait;
use serde_json::{Value, json};

use crate::{
    load::Load,
    support::{Api, NAMESPACES, Reply, Running, Scratch, cache_section},
    topology::Topology,
};

const READ_FROM: &str = "counter-read-from";
const SOURCE: &str = "counter-read-source";

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_read_says_where_it_was_served(t: TestDb) {
        let b = t.backend;
        let scratch = Scratch::of(&t).await;
        let cache = cache_section(&t);
        // Off PostgreSQL, replicas are refused by name; everywhere, a
        // namespace that asks for them with none listed is.
        let refusals = |database: &str, namespaces: &str| {
            let text = format!("[server]\nopen = true\n{database}\n{namespaces}");
            let config = Config::from_text(&text, "test", std::iter::empty(), &[]).unwrap();
            config.check().map_err(|e| e.to_string())
        };
        let asking = NAMESPACES.replace("key_patterns = [\"reaction:*\"]", "key_patterns = [\"reaction:*\"]\nreplica_reads = true");
        let refused = refusals(&scratch.database, &asking).unwrap_err();
        assert!(refused.contains("namespaces.posts.replica_reads"), "[{b}] {refused}");
        let standby = "postgres://postgres@127.0.0.1:1/standby";
        let listed = format!("{}replica_urls = [\"{standby}\"]\nreplica_max_lag_ms = 50\n", scratch.database);
        let refused = refusals(&listed, NAMESPACES).unwrap_err();
        assert!(refused.contains("database.replica_max_lag_ms"), "[{b}] {refused}");
        if b != Backend::Postgres {
            assert!(refused.contains("database.replica_urls"), "[{b}] {refused}");
        }

        // On PostgreSQL the list names the primary itself: a server that is
        // not a standby is passed over, so every lag-tolerant read is the
        // primary's (and counted as a fallback).
        let (database, namespaces) = match (b, t.url()) {
            (Backend::Postgres, Some(url)) => (
                format!("{}replica_urls = [\"{url}\"]\n", scratch.database),
                asking.clone(),
            ),
            _ => (scratch.database.clone(), NAMESPACES.to_owned()),
        };
        let text = format!(
            "[server]\nopen = true\n{database}\n{}\n{namespaces}",
            cache.as_deref().unwrap_or_default()
        );
        let service = Running::start(&text).await;
        service.post("/v1/posts/counters:add", None, json!({"owner": 1, "key": "likes", "delta": 3})).await.ok();
        service
            .post("/v1/posts/counters:observe", None, json!({"observations": [{"owner": 1, "key": "viewers", "member": "ann"}]}))
            .await
            .ok();
        let read = |method: Method, path: &'static str, from: Option<&'static str>, body: Option<Value>| {
            let service = &service;
            async move {
                let headers: Vec<(&str, &str)> = from.map(|f| (READ_FROM, f)).into_iter().collect();
                service.call(method, path, None, &headers, body.map(|b| b.to_string())).await
            }
        };
        let batch = cache.as_ref().map_or("primary", |_| "cache");
        let reads: [(Method, &str, Option<Value>, &str); 6] = [
            (Method::GET, "/v1/posts/counts:batchGet?owners=1&keys=likes", None, batch),
            (Method::POST, "/v1/posts/counts:batchGet", Some(json!({"owners": [1], "keys": ["likes"]})), batch),
            (Method::GET, "/v1/posts/top?key=likes", None, "primary"),
            (Method::GET, "/v1/posts/series?owner=1&key=views&from=2026-11-01T00:00:00Z&to=2026-11-03T00:00:00Z", None, "primary"),
            (Method::GET, "/v1/posts/uniques:batchGet?owners=1&keys=viewers", None, batch),
            (Method::GET, "/v1/posts/uniques:batchGet?owners=1&keys=viewers&from=2026-11-01T00:00:00Z&to=2026-11-03T00:00:00Z", None, "primary"),
        ];
        for (method, path, body, expected) in reads {
            for from in [None, Some("replica"), Some("PRIMARY")] {
                let reply: Reply = read(method.clone(), path, from, body.clone()).await;
                assert_eq!(reply.status, 200, "[{b}] {method} {path} {from:?}: {reply:?}");
                assert_eq!(reply.header(SOURCE), Some(expected), "[{b}] {method} {path} {from:?}");
                assert_eq!(reply.header("counter-read-lag-ms"), None, "[{b}] {path}");
            }
        }
        let total = read(Method::GET, "/v1/posts/counts:batchGet?owners=1&keys=likes", Some("replica"), None).await.ok();
        assert_eq!(total["counts"]["1"]["likes"], 3, "[{b}]");
        for bad in ["nearest", "replica, primary", ""] {
            let reply = service
                .call(Method::GET, "/v1/posts/top?key=likes", None, &[(READ_FROM, bad)], None)
                .await;
            reply.assert_problem(400, "invalid_input");
        }
        // The standby's lag is exported from its first probe on: -1, not one.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut metrics = service.get("/metrics", None).await.text;
        while b == Backend::Postgres && !metrics.contains("counter_service_replica_lag_seconds{") && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            metrics = service.get("/metrics", None).await.text;
        }
        assert!(
            metrics.contains("counter_service_reads_total{op=\"top\",source=\"primary\"}"),
            "[{b}] {metrics}"
        );
        if b == Backend::Postgres && t.url().is_some() {
            assert!(metrics.contains("counter_service_replica_fallbacks_total{reason=\"lag\"}"), "[{b}]");
            let lag = metrics
                .lines()
                .find(|l| l.starts_with("counter_service_replica_lag_seconds{replica=\"127.0.0.1:"))
                .unwrap_or_else(|| panic!("[{b}] no lag of the listed server: {metrics}"));
            assert!(lag.ends_with(" -1"), "[{b}] not a standby, its lag is unknown: {lag}");
        }
        service.stop().await;
    }
}

/// What the readers saw: when each read began, where it was served, its
/// lag header, and the totals it answered.
#[derive(Default)]
struct Journal {
    reads: Vec<Observed>,
}

struct Observed {
    began: Instant,
    source: String,
    lag_ms: Option<u64>,
    totals: Vec<(u64, u64)>,
}

/// Replica reads of every writer's owner, by batch get and by ranking,
/// until `stop`.
async fn reader(api: Api, owners: Vec<u64>, stop: Arc<AtomicBool>, journal: Arc<Mutex<Journal>>) {
    let batch = json!({"owners": owners, "keys": ["likes"]}).to_string();
    let mut turn = 0u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        turn += 1;
        let began = Instant::now();
        let (method, path, body) = if turn.is_multiple_of(3) {
            (Method::GET, "/v1/posts/top?key=likes&limit=100", None)
        } else {
            (
                Method::POST,
                "/v1/posts/counts:batchGet",
                Some(batch.clone()),
            )
        };
        let Ok(reply) = api
            .try_call(method, path, None, &[(READ_FROM, "replica")], body)
            .await
        else {
            continue;
        };
        assert_eq!(reply.status, 200, "{path}: {reply:?}");
        let totals = match reply.json.get("counts") {
            Some(counts) => owners
                .iter()
                .map(|o| (*o, counts[o.to_string()]["likes"].as_u64().unwrap_or(0)))
                .collect(),
            None => reply.json["owners"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| Some((r["owner"].as_str()?.parse().ok()?, r["total"].as_u64()?)))
                .collect(),
        };
        journal.lock().unwrap().reads.push(Observed {
            began,
            source: reply.header(SOURCE).unwrap_or("none").to_owned(),
            lag_ms: reply
                .header("counter-read-lag-ms")
                .and_then(|l| l.parse().ok()),
            totals,
        });
    }
}

/// A standby whose WAL replay is frozen, thawed on drop: its startup
/// process (the one that replays) SIGSTOPped. Not `pg_wal_replay_pause()`:
/// Patroni resumes a paused replay within its loop. Its walreceiver keeps
/// receiving and flushing, so the primary's synchronous commits go on.
struct Frozen(String);

impl Frozen {
    async fn replay_of(url: &str) -> Frozen {
        let db = sea_orm::Database::connect(url)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        let row = db
            .query_one_raw(sea_orm::Statement::from_string(
                sea_orm::DbBackend::Postgres,
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'startup'",
            ))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{url}: no startup process"));
        let pid: i32 = row.try_get("", "pid").unwrap();
        db.close().await.unwrap();
        let frozen = Frozen(pid.to_string());
        frozen.signal("-STOP");
        frozen
    }

    fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &self.0])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {}", self.0);
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        self.signal("-CONT");
    }
}

/// Reads per second of `clients` clients, each batch-getting 200 owners
/// with `from`, for `for_how_long`, and the sources that served them.
async fn read_rate(
    api: &Api,
    from: &'static str,
    clients: usize,
    for_how_long: Duration,
) -> (f64, BTreeMap<String, u64>) {
    let owners: Vec<u64> = (0..200).collect();
    let body = json!({"owners": owners, "keys": ["likes", "views"]}).to_string();
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (api, body) = (api.clone(), body.clone());
            tokio::spawn(async move {
                let mut sources: BTreeMap<String, u64> = BTreeMap::new();
                while started.elapsed() < for_how_long {
                    let reply = api
                        .call(
                            Method::POST,
                            "/v1/posts/counts:batchGet",
                            None,
                            &[(READ_FROM, from)],
                            Some(body.clone()),
                        )
                        .await;
                    assert_eq!(reply.status, 200, "{reply:?}");
                    *sources
                        .entry(reply.header(SOURCE).unwrap_or("none").to_owned())
                        .or_default() += 1;
                }
                sources
            })
        })
        .collect();
    let mut sources = BTreeMap::new();
    for task in tasks {
        for (source, n) in task.await.unwrap() {
            *sources.entry(source).or_default() += n;
        }
    }
    let reads: u64 = sources.values().sum();
    (reads as f64 / started.elapsed().as_secs_f64(), sources)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ha_replica_reads_within_the_bound() {
    let Some(ha) = Topology::up_with("ha_replicas", 17400, 1, true, &[("HA_REDIS", "off")]) else {
        return;
    };
    ha.await_healthy(true, Duration::from_secs(60));
    let bound = ha.replica_max_lag();
    let api = Api::new(ha.instances()[0].clone());
    let leader = ha.leader().expect("a leader");
    let standbys: Vec<String> = ha
        .node_urls()
        .into_iter()
        .filter(|(name, _)| *name != leader)
        .map(|(_, url)| url)
        .collect();
    assert_eq!(standbys.len(), 2, "two standbys");

    // Both standbys measured fresh: a replica read is served by one.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let reply = api
            .call(
                Method::GET,
                "/v1/posts/top?key=likes",
                None,
                &[(READ_FROM, "replica")],
                None,
            )
            .await;
        if reply.header(SOURCE) == Some("replica") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no read served by a standby within 30 s: {reply:?}\n{}",
            ha.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Keyed adds (one client per owner 0..6) and replica readers at
    // once, through four phases.
    let stop = Arc::new(AtomicBool::new(false));
    let journal = Arc::new(Mutex::new(Journal::default()));
    let owners: Vec<u64> = (0..6).collect();
    let load = Load::start(api.clone(), owners.len() as u64);
    let mut tasks = Vec::new();
    for _ in 0..4 {
        tasks.push(tokio::spawn(reader(
            api.clone(),
            owners.clone(),
            stop.clone(),
            journal.clone(),
        )));
    }
    let phase = Duration::from_secs(3);
    tokio::time::sleep(phase).await;
    let one_paused = Instant::now();
    let first = Frozen::replay_of(&standbys[0]).await;
    tokio::time::sleep(phase).await;
    let both_paused = Instant::now();
    let second = Frozen::replay_of(&standbys[1]).await;
    tokio::time::sleep(phase).await;
    let resumed = Instant::now();
    drop((first, second));
    tokio::time::sleep(phase).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let outcome = load.stop().await;
    // Per owner, the instant each of its adds was answered 200, in order.
    let mut acks: BTreeMap<u64, Vec<Instant>> = BTreeMap::new();
    for answer in outcome.answers.iter().filter(|a| a.status == Some(200)) {
        acks.entry(answer.owner).or_default().push(answer.at);
    }
    acks.values_mut().for_each(|at| at.sort_unstable());

    let journal = Arc::into_inner(journal)
        .expect("every task joined")
        .into_inner()
        .unwrap();
    let acked_before = |owner: u64, at: Instant| {
        acks.get(&owner)
            .map_or(0, |acks| acks.partition_point(|ack| *ack < at) as u64)
    };
    let (mut older_than_bound, mut behind_latest, mut lag_max_ms) = (0u64, 0u64, 0u64);
    let mut by_source: BTreeMap<String, u64> = BTreeMap::new();
    let mut replica_while_both_paused = 0u64;
    for read in &journal.reads {
        *by_source.entry(read.source.clone()).or_default() += 1;
        lag_max_ms = lag_max_ms.max(read.lag_ms.unwrap_or(0));
        let mut older = false;
        for (owner, total) in &read.totals {
            let Some(cutoff) = read.began.checked_sub(bound) else {
                continue;
            };
            if *total < acked_before(*owner, cutoff) {
                older = true;
                eprintln!(
                    "a {} read began {:?} into the run saw owner {owner} at {total}, {} acknowledged {bound:?} before",
                    read.source,
                    read.began - one_paused,
                    acked_before(*owner, cutoff)
                );
            }
            behind_latest += u64::from(*total < acked_before(*owner, read.began));
        }
        older_than_bound += u64::from(older);
        // Both standbys frozen for longer than the bound: none may serve.
        if read.source == "replica"
            && read.began > both_paused + bound + Duration::from_millis(100)
            && read.began < resumed
        {
            replica_while_both_paused += 1;
        }
    }
    let acked = outcome.acked;
    let replica_reads = by_source.get("replica").copied().unwrap_or(0);
    let primary_reads = by_source.get("primary").copied().unwrap_or(0);

    // The throughput of reading from two standbys against the primary's,
    // no writes running: the same clients and batch, one after the other.
    let (primary_rps, primary_sources) =
        read_rate(&api, "primary", 8, Duration::from_secs(4)).await;
    let (replica_rps, replica_sources) =
        read_rate(&api, "replica", 8, Duration::from_secs(4)).await;
    let served_by_standbys = replica_sources.get("replica").copied().unwrap_or(0);
    let replica_total: u64 = replica_sources.values().sum();
    figures(
        "ha_replica_reads",
        "postgres",
        &[
            ("acked", acked),
            ("lost", outcome.lost),
            ("doubled", outcome.doubled),
            ("reads", replica_reads + primary_reads),
            ("replica_reads", replica_reads),
            ("primary_reads", primary_reads),
            ("older_than_bound", older_than_bound),
            ("behind_latest", behind_latest),
            ("replica_while_both_paused", replica_while_both_paused),
            ("lag_max_ms", lag_max_ms),
            ("bound_ms", bound.as_millis() as u64),
            ("primary_reads_per_s", primary_rps as u64),
            ("replica_reads_per_s", replica_rps as u64),
            (
                "replica_over_primary_x100",
                (100.0 * replica_rps / primary_rps.max(1.0)) as u64,
            ),
        ],
    );
    assert_eq!(older_than_bound, 0, "reads older than the bound");
    assert_eq!(
        replica_while_both_paused, 0,
        "a frozen standby served a read past the bound"
    );
    assert!(
        replica_reads > 0 && primary_reads > 0,
        "both sources served: {by_source:?}"
    );
    assert!(
        lag_max_ms <= bound.as_millis() as u64,
        "a lag header past the bound: {lag_max_ms}"
    );
    assert!(acked > 100, "the writers ran: {acked}");
    assert_eq!(
        (outcome.lost, outcome.doubled),
        (0, 0),
        "adds lost or doubled"
    );
    assert_eq!(
        primary_sources.keys().collect::<Vec<_>>(),
        ["primary"],
        "{primary_sources:?}"
    );
    // Idle, a standby is as current as the primary: its measured lag stays
    // within the bound, and it serves.
    assert!(
        served_by_standbys * 10 >= replica_total * 9,
        "standbys served {served_by_standbys} of {replica_total} idle replica reads"
    );
    let metrics = api.get("/metrics", None).await.text;
    assert!(
        metrics.contains("counter_service_replica_fallbacks_total{reason=\"lag\"}"),
        "{metrics}"
    );
}
