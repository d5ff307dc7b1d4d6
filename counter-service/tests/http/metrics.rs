//! `/metrics` as an operator meets it: every metric family says what it
//! counts (`# HELP`), and a checked key's drift series is there at 0 from
//! the first scrape after a start, so the first drift is a rise the drift
//! alert's `increase()` sees (deploy/prometheus/counter-service-rules.yml).

use std::collections::{BTreeMap, BTreeSet};

use counter_tests::{TestDb, backend_test};
use sea_orm::ConnectionTrait;
use serde_json::json;

use crate::support::{NAMESPACES, Running, Scratch, cache_section, config_text};

/// The families of a scrape: name -> (has `# HELP`, has `# TYPE`), and
/// every sample's family (a histogram's `_bucket`, `_sum` and `_count`
/// samples are its family's).
fn families(text: &str) -> (BTreeMap<String, (bool, bool)>, BTreeSet<String>) {
    let mut families: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    let mut samples = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            assert!(!help.trim().is_empty(), "an empty # HELP: {line}");
            families.entry(name.to_owned()).or_default().0 = true;
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split(' ').next().unwrap();
            families.entry(name.to_owned()).or_default().1 = true;
        } else if !line.is_empty() && !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap();
            samples.insert(name.to_owned());
        }
    }
    let samples = samples
        .into_iter()
        .map(|name| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    name.strip_suffix(suffix)
                        .filter(|family| families.contains_key(*family))
                })
                .unwrap_or(&name)
                .to_owned()
        })
        .collect();
    (families, samples)
}

/// The value of the sample `series` (name and labels, as rendered).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

backend_test! {
    /// After traffic through every kind of call (adds, a batch, reads
    /// through the cache where Redis is configured, unique observes and
    /// reads, refusals, a check that finds drift, a rate-limited token),
    /// every family of the scrape has a `# HELP` and a `# TYPE`, and every
    /// sample belongs to one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn every_metric_has_help(t: TestDb) {
        let b = t.backend;
        let scratch = Scratch::of(&t).await;
        let mut rest = format!(
            "{NAMESPACES}\n[[tokens]]\nname = \"all\"\nsecret = \"all-secret-0123456789\"\nscopes = [\"read\", \"write\", \"admin\"]\n\
             [[tokens]]\nname = \"slow\"\nsecret = \"slow-secret-0123456789\"\nscopes = [\"read\"]\nrate_per_second = 1\nburst = 1\n"
        );
        if let Some(cache) = cache_section(&t) {
            rest.push_str(&cache);
        }
        let service = Running::start(&config_text("", &scratch, &rest)).await;
        let token = Some("all-secret-0123456789");
        let db = scratch.connect(&t).await;
        db.execute_unprepared("INSERT INTO comments (id, post_id) VALUES (1, 1)").await.unwrap();
        service.post("/v1/posts/counters:add", token, json!({"owner": 1, "key": "likes"})).await.ok();
        service.post("/v1/posts/counters:addAndGet", token, json!({"owner": 2, "key": "views"})).await.ok();
        service.post("/v1/posts/counters:batchAdd", token, json!({"items": [{"owner": 3, "key": "likes"}]})).await.ok();
        for _ in 0..2 {
            service.get("/v1/posts/counts:batchGet?owners=1,2,3&keys=likes,views", token).await.ok();
        }
        service.post("/v1/posts/counters:observe", token, json!({"observations": [{"owner": 1, "key": "viewers", "member": "m"}]})).await.ok();
        service.get("/v1/posts/uniques:batchGet?owners=1&keys=viewers", token).await.ok();
        service.get("/v1/posts/counts:batchGet?owners=x&keys=likes", token).await.assert_problem(400, "invalid_input");
        service.get("/v1/posts/keys", None).await.assert_problem(401, "unauthorized");
        for _ in 0..3 {
            service.get("/v1/posts/keys", Some("slow-secret-0123456789")).await;
        }
        let report = service.run_job("/v1/posts/admin:check?dry_run=true", token).await;
        assert_eq!(report["checks"][0]["owners_drifted"], 1, "[{b}] {report}");
        service.get("/readyz", None).await.ok();

        let text = service.get("/metrics", None).await.text;
        let (families, samples) = families(&text);
        for expected in [
            "counter_service_requests_total",
            "counter_service_request_duration_seconds",
            "counter_service_batch_size",
            "counter_service_add_group_requests",
            "counter_service_errors_total",
            "counter_service_rate_limited_total",
            "counter_service_check_owners_drifted_total",
            "counter_service_dependency_up",
            "counter_service_ready",
        ] {
            assert!(families.contains_key(expected), "[{b}] {expected} not scraped:\n{text}");
        }
        let without: Vec<_> = families.iter().filter(|(_, (help, kind))| !(*help && *kind)).collect();
        assert!(without.is_empty(), "[{b}] families without # HELP or # TYPE (help, type): {without:?}");
        let orphans: Vec<_> = samples.iter().filter(|s| !families.contains_key(*s)).collect();
        assert!(orphans.is_empty(), "[{b}] samples of no described family: {orphans:?}");
        if cache_section(&t).is_some() {
            for name in ["counter_service_cache_hits_total", "counter_service_cache_misses_total"] {
                assert!(families.contains_key(name), "[{b}] {name} not scraped");
            }
        }
        eprintln!("[{b}] /metrics: {} families, each with # HELP", families.len());
        service.stop().await;
        t.finish().await;
    }
}

backend_test! {
    /// Right after a start, before any check ran, the first scrape shows
    /// each checked key's drift series at 0; a check that finds drift then
    /// raises it. (A namespace of this test's own: the recorder is the
    /// process's, shared by every test running beside it.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn drift_series_start_at_zero(t: TestDb) {
        let b = t.backend;
        let scratch = Scratch::of(&t).await;
        let ns = format!("fresh_{b}").to_lowercase();
        let namespaces = format!(
            "[namespaces.{ns}]\ntable = \"fresh_counters\"\nowner = \"integer\"\n\
             [namespaces.{ns}.keys.likes]\n\
             [namespaces.{ns}.keys.comments.check]\ntable = \"comments\"\nvia = \"post_id\"\n"
        );
        let service = Running::start(&config_text("open = true", &scratch, &namespaces)).await;
        let first = service.get("/metrics", None).await.text;
        for name in ["counter_service_check_owners_drifted_total", "counter_service_check_drift_total"] {
            let series = format!("{name}{{namespace=\"{ns}\",key=\"comments\"}}");
            assert_eq!(sample(&first, &series), Some(0.0), "[{b}] {series} at the first scrape:\n{first}");
            let unchecked = format!("{name}{{namespace=\"{ns}\",key=\"likes\"}}");
            assert_eq!(sample(&first, &unchecked), None, "[{b}] an unchecked key has no drift series");
        }
        let db = scratch.connect(&t).await;
        db.execute_unprepared("INSERT INTO comments (id, post_id) VALUES (1, 7), (2, 8)").await.unwrap();
        service.run_job(&format!("/v1/{ns}/admin:check?dry_run=true"), None).await;
        let after = service.get("/metrics", None).await.text;
        let series = format!("counter_service_check_owners_drifted_total{{namespace=\"{ns}\",key=\"comments\"}}");
        assert_eq!(sample(&after, &series), Some(2.0), "[{b}] after a check that found 2 owners drifted");
        service.stop().await;
        t.finish().await;
    }
}
