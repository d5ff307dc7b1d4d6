//! The dashboard and the alert rules in `deploy/` against a real
//! Prometheus scraping a live service: every panel's query and every
//! series an alert reads answers with data, so a panel on a metric the
//! service does not export fails here. `promtool` checks the rules and runs
//! their unit tests.
//!
//! The cache hit ratio panel is checked to be a window's: after a spell of
//! hits only, it reads 100 % while the ratio since start is far lower.
//!
//! Runs where `COUNTER_TEST_PROMETHEUS` names the `prometheus` binary
//! (`promtool` beside it); `.ci/run` unpacks Debian's package for it.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use counter_core::{CounterTable, Counters};
use counter_mq::Publish;
use counter_tests::{TestDb, backend_test, mq, servers::free_port};
use sea_orm::ConnectionTrait;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use crate::support::{
    Api, NAMESPACES, Running, SLOW, Scratch, TOKENS, WRITER, cache_section, config_text,
};

const PROMETHEUS_VAR: &str = "COUNTER_TEST_PROMETHEUS";
/// How long the queries may take to answer with data once the load ran
/// (Prometheus scrapes and evaluates every second here).
const ANSWER_WITHIN: Duration = Duration::from_secs(45);

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn prometheus_binary(t: &TestDb) -> Option<PathBuf> {
    match std::env::var_os(PROMETHEUS_VAR) {
        Some(path) => Some(PathBuf::from(path)),
        None => {
            eprintln!(
                "[{}] {}: Prometheus skipped, {PROMETHEUS_VAR} is not set",
                t.backend,
                t.label()
            );
            None
        }
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[backends(postgres, mysql)]
    async fn dashboard_and_alerts_answer_from_a_real_prometheus(t: TestDb) {
        let Some(prometheus) = prometheus_binary(&t) else {
            t.finish().await;
            return;
        };
        promtool(&prometheus.with_file_name("promtool"));

        // The service with every source the dashboard shows: a cache, a
        // queue consumer, a checked key, a rate-limited token.
        let scratch = Scratch::of(&t).await;
        let nats = mq::nats_server(t.backend, t.label()).map(|bin| mq::PrivateNats::start(&bin));
        let mut rest = format!("{NAMESPACES}\n{TOKENS}\n");
        rest.push_str(&cache_section(&t).expect("the dashboard's cache panel needs Redis"));
        let nats = nats.expect("the dashboard's consumer lag panel needs nats-server");
        rest.push_str(&format!(
            "[broker]\nkind = \"nats\"\nurl = \"{}\"\nstream = \"DASHBOARD_COUNTS\"\nsubjects = [\"dash.counts.>\"]\n",
            nats.url()
        ));
        let service = Running::start(&config_text("", &scratch, &rest)).await;
        let server = Prometheus::start(&prometheus, &service.base).await;

        // Load while Prometheus scrapes: adds (grouped), cached reads, a
        // check that finds drift, queued messages, refused calls.
        let db = scratch.connect(&t).await;
        db.execute_unprepared("INSERT INTO comments (id, post_id) VALUES (1, 1), (2, 1)").await.unwrap();
        let js = mq::jetstream(&[nats.url()]).await;
        let publisher = counter_mq::nats::JetStreamPublisher::new(js).subject_prefix("dash.counts");
        let posts = Counters::<i64>::new(CounterTable::new("post_counters").unwrap());
        let load_until = Instant::now() + Duration::from_secs(6);
        let mut round = 0_i64;
        while Instant::now() < load_until {
            round += 1;
            let adds: Vec<_> = (0..16)
                .map(|n| {
                    let api = service.api.clone();
                    tokio::spawn(async move {
                        api.post("/v1/posts/counters:add", Some(WRITER), json!({"owner": n % 4 + 1, "key": "likes"})).await.ok();
                    })
                })
                .collect();
            for add in adds {
                add.await.unwrap();
            }
            for _ in 0..2 {
                service.get("/v1/posts/counts:batchGet?owners=1,2,3,4&keys=likes,comments", Some(WRITER)).await.ok();
            }
            publisher.publish(&posts, round, "likes", 1).await.unwrap();
            // A caller's mistakes: typed 4xx, counted by kind.
            service.post("/v1/posts/counters:add", Some(WRITER), json!({"owner": "x", "key": "likes"})).await.assert_problem(400, "invalid_input");
            service.get("/v1/posts/counts:batchGet?owners=1&keys=likes", None).await.assert_problem(401, "unauthorized");
            for _ in 0..3 {
                service.get("/v1/posts/counts:batchGet?owners=1&keys=likes", Some(SLOW)).await;
            }
            if round == 1 {
                let report = service.run_job("/v1/posts/admin:check?dry_run=true", Some(crate::support::ADMIN)).await;
                assert_eq!(report["checks"][0]["owners_drifted"], 1, "the seeded drift: {report}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(deploy().join("grafana/counter-service.json")).unwrap()).unwrap();

        // The cache hit ratio is a window's, not since start. About half
        // the load's reads missed (each round's adds invalidate the owners
        // read next); now owners nobody writes are read for 15 s, hits
        // after their first read. The panel's query over a 10 s rate
        // interval (what Grafana gives at 1 s scrapes and a short range)
        // says 100 %; since start, the service's own counters say less.
        let hits_only_until = Instant::now() + Duration::from_secs(15);
        while Instant::now() < hits_only_until {
            service.get("/v1/posts/counts:batchGet?owners=1001,1002&keys=likes", Some(WRITER)).await.ok();
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let scrape = service.get("/metrics", None).await.text;
        let counter = |name: &str| {
            scrape.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
                .unwrap_or_else(|| panic!("{name} not scraped:\n{scrape}"))
        };
        let (hits, misses) = (counter("counter_service_cache_hits_total"), counter("counter_service_cache_misses_total"));
        let since_start = hits / (hits + misses);
        assert!(since_start < 0.9, "[{}] the load's reads should have missed often: {hits} hits, {misses} misses", t.backend);
        let panel = dashboard["panels"].as_array().unwrap().iter()
            .find(|p| p["title"].as_str().is_some_and(|t| t.starts_with("Cache hit ratio")))
            .expect("the cache hit ratio panel");
        let expr = panel["targets"][0]["expr"].as_str().unwrap();
        for counter in ["rate(counter_service_cache_hits_total[$__rate_interval])", "rate(counter_service_cache_misses_total[$__rate_interval])"] {
            assert!(expr.contains(counter), "the hit ratio panel reads {counter}: {expr}");
        }
        let windowed = server.value(&expr.replace("$__rate_interval", "10s")).await;
        assert!(
            (windowed - 1.0).abs() < 1e-9,
            "[{}] the hit ratio over the last 10 s, all hits: {windowed} (since start: {since_start:.3})",
            t.backend
        );
        eprintln!("[{}] cache hit ratio: {windowed} over 10 s, {since_start:.3} since start", t.backend);

        // Every panel's query, as Grafana sends it, answers with data.
        let mut queries = Vec::new();
        for panel in dashboard["panels"].as_array().expect("panels") {
            let targets = panel["targets"].as_array().expect("a panel's targets");
            assert!(!targets.is_empty(), "a panel with no query: {}", panel["title"]);
            for target in targets {
                let expr = target["expr"].as_str().expect("a target's expr");
                queries.push((format!("panel {:?}", panel["title"].as_str().unwrap_or_default()), grafana_to_promql(expr)));
            }
        }
        // Every rule loaded and healthy; every recorded series and every
        // series an alert reads answers.
        let rules = server.wait_for_rules().await;
        for rule in &rules {
            let (kind, name) = (rule["type"].as_str().unwrap(), rule["name"].as_str().unwrap());
            if kind == "recording" {
                queries.push((format!("recording rule {name}"), name.to_owned()));
            } else {
                for series in series_read_by(rule["query"].as_str().unwrap()) {
                    queries.push((format!("alert {name}"), format!("count({series})")));
                }
            }
        }
        let silent = server.wait_for_data(&queries).await;
        assert!(silent.is_empty(), "queries without data after {ANSWER_WITHIN:?}: {silent:#?}");
        let unhealthy: Vec<_> = server.rules().await.into_iter().filter(|r| r["health"] != "ok").collect();
        assert!(unhealthy.is_empty(), "rules Prometheus could not evaluate: {unhealthy:#?}");
        eprintln!("[{}] dashboard: {} queries answered, {} rules healthy", t.backend, queries.len(), rules.len());

        server.stop().await;
        service.stop().await;
        t.finish().await;
    }
}

/// `promtool check rules` and the rules' unit tests.
fn promtool(promtool: &Path) {
    let rules = deploy().join("prometheus");
    for args in [
        vec!["check", "rules", "counter-service-rules.yml"],
        vec!["test", "rules", "counter-service-rules.test.yml"],
    ] {
        let out = std::process::Command::new(promtool)
            .args(&args)
            .current_dir(&rules)
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", promtool.display()));
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Grafana's interval variables as a short test's Prometheus can answer.
fn grafana_to_promql(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
}

/// The series names an expression reads: the service's metrics and
/// recorded series, and Prometheus's `up`.
fn series_read_by(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    for token in expr.split(|c: char| !word(c)) {
        if (token.starts_with("counter_service") || token == "up")
            && !names.iter().any(|n| n == token)
        {
            names.push(token.to_owned());
        }
    }
    assert!(!names.is_empty(), "an alert that reads no series: {expr}");
    names
}

/// A private Prometheus scraping the service and evaluating the rules,
/// every second.
struct Prometheus {
    child: Child,
    api: Api,
    dir: PathBuf,
}

impl Prometheus {
    async fn start(binary: &Path, service: &str) -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("counter-prometheus-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = service.trim_start_matches("http://");
        let rules = deploy().join("prometheus/counter-service-rules.yml");
        std::fs::write(
            dir.join("prometheus.yml"),
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [\"{}\"]\n\
                 scrape_configs:\n  - job_name: counter-service\n    static_configs:\n      - targets: [\"{target}\"]\n",
                rules.display()
            ),
        )
        .unwrap();
        let child = Command::new(binary)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{} ({PROMETHEUS_VAR}): {e}", binary.display()));
        let api = Api::new(format!("http://127.0.0.1:{port}"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !matches!(api.try_call(hyper::Method::GET, "/-/ready", None, &[], None).await, Ok(r) if r.status == 200)
        {
            assert!(
                Instant::now() < deadline,
                "Prometheus not ready on port {port} within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Prometheus { child, api, dir }
    }

    async fn rules(&self) -> Vec<Value> {
        let reply = self.api.get("/api/v1/rules", None).await.ok();
        reply["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect()
    }

    /// The loaded rules, once every rule of the file is there.
    async fn wait_for_rules(&self) -> Vec<Value> {
        let text =
            std::fs::read_to_string(deploy().join("prometheus/counter-service-rules.yml")).unwrap();
        let in_file = text
            .lines()
            .filter(|l| {
                l.trim_start().starts_with("- alert:") || l.trim_start().starts_with("- record:")
            })
            .count();
        assert!(in_file > 0, "no rules in the rules file");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let rules = self.rules().await;
            if rules.len() == in_file {
                return rules;
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus loaded {} of {in_file} rules",
                rules.len()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The value of `query`'s one series, once it answers with one (within
    /// [`ANSWER_WITHIN`]).
    async fn value(&self, query: &str) -> f64 {
        let encoded: String = form_urlencoded::byte_serialize(query.as_bytes()).collect();
        let deadline = Instant::now() + ANSWER_WITHIN;
        loop {
            let reply = self
                .api
                .get(&format!("/api/v1/query?query={encoded}"), None)
                .await
                .ok();
            assert_eq!(reply["status"], "success", "{query}: {reply}");
            let result = reply["data"]["result"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if let [series] = result.as_slice() {
                return series["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("{query}: {reply}"));
            }
            assert!(result.len() < 2, "{query}: one series expected: {reply}");
            assert!(
                Instant::now() < deadline,
                "{query}: no data within {ANSWER_WITHIN:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The queries that still answer with no data after [`ANSWER_WITHIN`]
    /// (an error is a failure at once: a query Prometheus cannot parse).
    async fn wait_for_data(&self, queries: &[(String, String)]) -> Vec<(String, String)> {
        let deadline = Instant::now() + ANSWER_WITHIN;
        let mut silent: Vec<(String, String)> = queries.to_vec();
        loop {
            let mut still = Vec::new();
            for (what, query) in silent {
                let encoded: String = form_urlencoded::byte_serialize(query.as_bytes()).collect();
                let reply = self
                    .api
                    .get(&format!("/api/v1/query?query={encoded}"), None)
                    .await
                    .ok();
                assert_eq!(reply["status"], "success", "{what}: {query}: {reply}");
                if reply["data"]["result"].as_array().is_none_or(Vec::is_empty) {
                    still.push((what, query));
                }
            }
            if still.is_empty() || Instant::now() >= deadline {
                return still;
            }
            silent = still;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// The server's store goes with it, even when the test fails.
impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
