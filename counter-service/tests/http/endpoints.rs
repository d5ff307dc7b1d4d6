//! Every endpoint, answered as documented, and listed in `/openapi.json`.

use std::collections::BTreeSet;

use counter_tests::{TestDb, backend_test};
use sea_orm::ConnectionTrait;
use serde_json::{Value, json};

use crate::support::{NAMESPACES, Running, Scratch, cache_section, config_text};

/// Every route the tests below call, as `METHOD path`: the OpenAPI
/// document must list each, and nothing else.
const ROUTES: &[&str] = &[
    "POST /v1/{ns}/counters:add",
    "POST /v1/{ns}/counters:addAndGet",
    "POST /v1/{ns}/counters:batchAdd",
    "GET /v1/{ns}/counts:batchGet",
    "POST /v1/{ns}/counts:batchGet",
    "GET /v1/{ns}/counts:watch",
    "GET /v1/{ns}/top:watch",
    "POST /v1/{ns}/counters:observe",
    "GET /v1/{ns}/uniques:batchGet",
    "POST /v1/{ns}/uniques:batchGet",
    "GET /v1/{ns}/top",
    "GET /v1/{ns}/series",
    "GET /v1/{ns}/keys",
    "POST /v1/{ns}/admin:check",
    "POST /v1/{ns}/admin:compact",
    "GET /v1/{ns}/admin/jobs/{id}",
    "GET /v1/{ns}/admin/jobs",
    "GET /v1/namespaces",
    "POST /v1/{ns}/counters:clear",
    "GET /healthz",
    "GET /readyz",
    "GET /metrics",
    "GET /openapi.json",
];

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn every_endpoint(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        let service = Running::start(&config_text("open = true", &scratch, NAMESPACES)).await;
        let b = t.backend;

        // Adds, on each owner type.
        let added = service.post("/v1/posts/counters:add", None, json!({"owner": 1, "key": "likes"})).await.ok();
        assert_eq!(added, json!({"applied": true}), "[{b}]");
        let total = service
            .post("/v1/posts/counters:addAndGet", None, json!({"owner": "1", "key": "likes", "delta": 4}))
            .await
            .ok();
        assert_eq!(total, json!({"applied": true, "total": 5}), "[{b}]");
        let user = "7f0c7a53-5c1d-4c49-9d33-5ad0f7a1b2c3";
        service.post("/v1/users/counters:add", None, json!({"owner": user, "key": "followers", "delta": 3})).await.ok();
        service.post("/v1/tags/counters:add", None, json!({"owner": "rust's \"best\"", "key": "uses"})).await.ok();
        let batch = service
            .post(
                "/v1/posts/counters:batchAdd",
                None,
                json!({"items": [
                    {"id": "b-1", "owner": 2, "key": "likes", "delta": 7},
                    {"id": "b-2", "owner": 3, "key": "reaction:heart"},
                    {"owner": 2, "key": "views", "delta": 2, "at": "2026-11-02T10:00:00Z"},
                    {"owner": 2, "key": "views", "delta": 5, "at": "2026-11-04T10:00:00Z"},
                ]}),
            )
            .await
            .ok();
        assert_eq!(batch, json!({"applied": 4, "duplicates": 0}), "[{b}]");

        // A watch: its first event holds the same totals.
        let addr = service.base.trim_start_matches("http://").to_owned();
        let mut watcher = crate::watch::Watcher::open(&addr, "/v1/posts/counts:watch?owners=1,2&keys=likes,reaction:heart", None, &[], None)
            .await
            .unwrap();
        let snapshot = watcher.next_within(std::time::Duration::from_secs(10)).await.unwrap();
        assert_eq!(
            (snapshot.event.as_str(), &snapshot.data),
            ("snapshot", &json!({"counts": {"1": {"likes": 5, "reaction:heart": 0}, "2": {"likes": 7, "reaction:heart": 0}}, "uniques": {}})),
            "[{b}]"
        );
        drop(watcher);
        let mut watcher = crate::watch::Watcher::open(&addr, "/v1/posts/top:watch?key=likes&limit=2", None, &[], None)
            .await
            .unwrap();
        let snapshot = watcher.next_within(std::time::Duration::from_secs(10)).await.unwrap();
        assert_eq!(
            (snapshot.event.as_str(), &snapshot.data),
            ("snapshot", &json!({"key": "likes", "owners": [{"owner": "2", "total": 7}, {"owner": "1", "total": 5}]})),
            "[{b}]"
        );
        drop(watcher);

        // Batch gets, by GET and by POST, zero-filled.
        let got = service.get("/v1/posts/counts:batchGet?owners=1,2,3,4&keys=likes,views,reaction:heart", None).await.ok();
        assert_eq!(
            got["counts"],
            json!({
                "1": {"likes": 5, "views": 0, "reaction:heart": 0},
                "2": {"likes": 7, "views": 7, "reaction:heart": 0},
                "3": {"likes": 0, "views": 0, "reaction:heart": 1},
                "4": {"likes": 0, "views": 0, "reaction:heart": 0},
            }),
            "[{b}]"
        );
        assert_eq!(service.totals("users", None, json!([user]), json!(["followers"])).await, json!({user: {"followers": 3}}));
        assert_eq!(
            service.totals("tags", None, json!(["rust's \"best\"", "other"]), json!(["uses"])).await,
            json!({"rust's \"best\"": {"uses": 1}, "other": {"uses": 0}})
        );

        // Rankings in keyset pages.
        for (owner, delta) in [(10, 3), (11, 9), (12, 3)] {
            service.post("/v1/posts/counters:add", None, json!({"owner": owner, "key": "likes", "delta": delta})).await.ok();
        }
        let page = service.get("/v1/posts/top?key=likes&limit=2", None).await.ok();
        assert_eq!(page["owners"], json!([{"owner": "11", "total": 9}, {"owner": "2", "total": 7}]), "[{b}]");
        let next = page["next"].as_str().expect("a full page has a cursor").to_owned();
        let page = service.get(&format!("/v1/posts/top?key=likes&limit=3&after={next}"), None).await.ok();
        assert_eq!(
            page["owners"],
            json!([{"owner": "1", "total": 5}, {"owner": "10", "total": 3}, {"owner": "12", "total": 3}]),
            "[{b}]"
        );

        // A series of a windowed key: zero-filled days and their sum.
        let series = service
            .get("/v1/posts/series?owner=2&key=views&from=2026-11-01T00:00:00Z&to=2026-11-05T00:00:00Z", None)
            .await
            .ok();
        let counts: Vec<i64> = series["buckets"].as_array().unwrap().iter().map(|b| b["count"].as_i64().unwrap()).collect();
        assert_eq!((counts, series["sum"].clone()), (vec![0, 2, 0, 5], json!(7)), "[{b}]");
        service
            .get("/v1/posts/series?owner=2&key=likes&from=2026-11-01T00:00:00Z&to=2026-11-05T00:00:00Z", None)
            .await
            .assert_problem(400, "invalid_input");

        // Unique counts: members observed (42 and "42" are one), read by GET and POST.
        let observed = service
            .post(
                "/v1/posts/counters:observe",
                None,
                json!({"observations": [
                    {"owner": 1, "key": "viewers", "member": "ann"},
                    {"owner": 1, "key": "viewers", "member": 42},
                    {"owner": "1", "key": "viewers", "member": "42"},
                ]}),
            )
            .await
            .ok();
        assert_eq!(observed, json!({"observed": 3}), "[{b}]");
        let got = service.get("/v1/posts/uniques:batchGet?owners=1,2&keys=viewers", None).await.ok();
        assert_eq!(got["uniques"], json!({"1": {"viewers": 2}, "2": {"viewers": 0}}), "[{b}]");
        let got = service.post("/v1/posts/uniques:batchGet", None, json!({"owners": [1], "keys": ["viewers"]})).await.ok();
        assert_eq!(got["uniques"], json!({"1": {"viewers": 2}}), "[{b}]");

        // Keys: declared, patterns, and the pattern keys in use.
        let keys = service.get("/v1/posts/keys", None).await.ok();
        let names: Vec<&str> = keys["keys"].as_array().unwrap().iter().map(|k| k["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["comments", "likes", "viewers", "views"], "[{b}]");
        let unique: Vec<bool> = keys["keys"].as_array().unwrap().iter().map(|k| k["unique"].as_bool().unwrap()).collect();
        assert_eq!(unique, [false, false, true, false], "[{b}]");
        assert_eq!((keys["patterns"].clone(), keys["in_use"].clone()), (json!(["reaction:*"]), json!(["reaction:heart"])), "[{b}]");
        // Every namespace with its keys, as `keys` lists them, and the scopes.
        let namespaces = service.get("/v1/namespaces", None).await.ok();
        assert_eq!(namespaces["scopes"], json!(["read", "write", "admin"]), "[{b}]");
        let listed: Vec<&str> = namespaces["namespaces"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap()).collect();
        assert_eq!(listed, ["posts", "tags", "users"], "[{b}]");
        assert_eq!((namespaces["namespaces"][0]["keys"].clone(), namespaces["namespaces"][0]["in_use"].clone()), (keys["keys"].clone(), keys["in_use"].clone()), "[{b}]");

        // Check and fix: seeded drift found and repaired.
        let db = scratch.connect(&t).await;
        db.execute_unprepared("INSERT INTO comments (id, post_id) VALUES (1, 1), (2, 1), (3, 2)").await.unwrap();
        service.post("/v1/posts/counters:add", None, json!({"owner": 2, "key": "comments", "delta": 5})).await.ok();
        let check = service.run_job("/v1/posts/admin:check?dry_run=true", None).await;
        assert_eq!(check["checks"][0]["owners_drifted"], 2, "[{b}] {check}");
        let check = service.run_job("/v1/posts/admin:check", None).await;
        assert_eq!((check["checks"][0]["owners_drifted"].clone(), check["checks"][0]["fixed"].clone()), (json!(2), json!(true)), "[{b}]");
        assert_eq!(
            service.totals("posts", None, json!([1, 2]), json!(["comments"])).await,
            json!({"1": {"comments": 2}, "2": {"comments": 1}}),
            "[{b}]"
        );

        // Compaction folds slot rows and changes no total.
        for _ in 0..20 {
            service.post("/v1/posts/counters:add", None, json!({"owner": 1, "key": "likes"})).await.ok();
        }
        let compact = service.run_job("/v1/posts/admin:compact", None).await;
        assert!(compact["rows_after"].as_u64() <= compact["rows_before"].as_u64(), "[{b}] {compact}");
        // The namespace's jobs, newest first: the compaction, the check, the dry run.
        let jobs = service.get("/v1/posts/admin/jobs", None).await.ok();
        let kinds: Vec<&str> = jobs["jobs"].as_array().unwrap().iter().map(|j| j["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["compact", "check", "check_dry_run"], "[{b}] {jobs}");
        assert_eq!(jobs["jobs"][0]["report"], compact, "[{b}]");
        assert_eq!(service.totals("posts", None, json!([1]), json!(["likes"])).await, json!({"1": {"likes": 25}}), "[{b}]");

        // Clear: owner 2's likes and views (its buckets too) and owner 1's
        // viewers back to zero; nothing else changes; counting starts again.
        let cleared = service.post("/v1/posts/counters:clear", None, json!({"owners": [2], "keys": ["likes", "views"]})).await.ok();
        assert!(cleared["rows_deleted"].as_u64() >= Some(3), "[{b}] {cleared}");
        let cleared = service.post("/v1/posts/counters:clear", None, json!({"owners": ["1"], "keys": ["viewers"]})).await.ok();
        assert!(cleared["rows_deleted"].as_u64() >= Some(1), "[{b}] {cleared}");
        assert_eq!(
            service.totals("posts", None, json!([1, 2]), json!(["likes", "views"])).await,
            json!({"1": {"likes": 25, "views": 0}, "2": {"likes": 0, "views": 0}}),
            "[{b}]"
        );
        let series = service
            .get("/v1/posts/series?owner=2&key=views&from=2026-11-01T00:00:00Z&to=2026-11-05T00:00:00Z", None)
            .await
            .ok();
        assert_eq!(series["sum"], json!(0), "[{b}] {series}");
        let got = service.get("/v1/posts/uniques:batchGet?owners=1&keys=viewers", None).await.ok();
        assert_eq!(got["uniques"], json!({"1": {"viewers": 0}}), "[{b}]");
        let total = service.post("/v1/posts/counters:addAndGet", None, json!({"owner": 2, "key": "likes"})).await.ok();
        assert_eq!(total["total"], 1, "[{b}] counts again from zero");
        service
            .post("/v1/posts/counters:clear", None, json!({"owners": [2], "keys": ["nope"]}))
            .await
            .assert_problem(400, "invalid_input");
        service
            .post("/v1/posts/counters:clear", None, json!({"owners": [], "keys": ["likes"]}))
            .await
            .assert_problem(400, "invalid_input");

        // Operations.
        assert_eq!(service.get("/healthz", None).await.text, "ok");
        let ready = service.get("/readyz", None).await.ok();
        assert_eq!((ready["status"].clone(), ready["database"]["ok"].clone()), (json!("ready"), json!(true)), "[{b}]");
        let metrics = service.get("/metrics", None).await;
        assert_eq!(metrics.status, 200);
        for name in [
            "counter_service_requests_total",
            "counter_service_request_duration_seconds",
            "counter_service_batch_size",
            "counter_service_add_group_requests_count",
        ] {
            assert!(metrics.text.contains(name), "[{b}] /metrics lacks {name}");
        }
        assert!(metrics.text.contains("route=\"/v1/{ns}/counters:add\""), "[{b}] requests by route");

        // The OpenAPI document lists every route exercised here, and only those.
        let document = service.get("/openapi.json", None).await.ok();
        assert_eq!(routes_of(&document), ROUTES.iter().map(|r| r.to_string()).collect::<BTreeSet<_>>(), "[{b}]");
        assert_eq!(document["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");

        service.stop().await;
        t.finish().await;
    }
}

/// `METHOD path` of every operation of an OpenAPI document.
fn routes_of(document: &Value) -> BTreeSet<String> {
    let mut routes = BTreeSet::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for method in item.as_object().unwrap().keys() {
            routes.insert(format!("{} {path}", method.to_uppercase()));
        }
    }
    routes
}

backend_test! {
    /// Batch gets through the Redis cache: every read after an acknowledged
    /// add or clear sees it, and the cache serves the repeated reads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn cached_batch_gets_see_every_acknowledged_add(t: TestDb) {
        let Some(cache) = cache_section(&t) else {
            return t.finish().await;
        };
        let scratch = Scratch::of(&t).await;
        let service = Running::start(&config_text("open = true", &scratch, &format!("{NAMESPACES}\n{cache}"))).await;
        let b = t.backend;
        let owners = json!([1, 2, 3]);
        let mut stale = 0u64;
        for n in 1..=100u64 {
            service.post("/v1/posts/counters:add", None, json!({"owner": 1 + n % 3, "key": "likes"})).await.ok();
            // Read twice: the second read is the cache's.
            for _ in 0..2 {
                let counts = service.totals("posts", None, owners.clone(), json!(["likes"])).await;
                let seen: u64 = (1..=3).map(|o| counts[o.to_string()]["likes"].as_u64().unwrap()).sum();
                if seen != n {
                    stale += 1;
                }
            }
        }
        // A clear is a write too: the cached totals are forgotten.
        let before = service.totals("posts", None, owners.clone(), json!(["likes"])).await;
        service.post("/v1/posts/counters:clear", None, json!({"owners": [2], "keys": ["likes"]})).await.ok();
        for _ in 0..2 {
            let counts = service.totals("posts", None, owners.clone(), json!(["likes"])).await;
            if counts["2"]["likes"] != 0 || counts["1"] != before["1"] {
                stale += 1;
            }
        }
        let ready = service.get("/readyz", None).await.ok();
        assert_eq!(ready["cache"]["ok"], true, "[{b}] {ready}");
        let metrics = service.get("/metrics", None).await.text;
        let hits = metrics
            .lines()
            .find_map(|l| l.strip_prefix("counter_service_cache_hits_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        counter_tests::figures("service_cached_reads", b, &[("reads", 202), ("owner_hits", hits as u64), ("stale_reads", stale)]);
        assert_eq!(stale, 0, "[{b}] reads that missed an acknowledged add");
        assert!(hits >= 50.0, "[{b}] the cache served {hits} of 200 reads");
        service.stop().await;
        t.finish().await;
    }
}

backend_test! {
    /// The cache on a Redis Cluster (`cluster_urls`): batch gets see every
    /// acknowledged add and clear; `/readyz` pings every master, and with
    /// one master killed reports the cache down while the service stays
    /// ready and its reads stay exact (they go to the database).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_redis_cluster_cache_serves_exact_batch_gets(t: TestDb) {
        if cache_section(&t).is_none() {
            return t.finish().await;
        }
        let cluster = counter_tests::redis::RedisCluster::start(true);
        let urls: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
        let cache = format!(
            "[cache]\ncluster_urls = [{}]\nnamespace = \"{}\"\n",
            urls.join(", "),
            counter_tests::redis::namespace(t.backend, t.label())
        );
        let scratch = Scratch::of(&t).await;
        let service = Running::start(&config_text("open = true", &scratch, &format!("{NAMESPACES}\n{cache}"))).await;
        let b = t.backend;
        let owners = json!([1, 2, 3]);
        let (mut stale, mut reads) = (0u64, 0u64);
        let read_sum = |counts: &Value| (1..=3).map(|o| counts[o.to_string()]["likes"].as_u64().unwrap()).sum::<u64>();
        for n in 1..=30u64 {
            service.post("/v1/posts/counters:add", None, json!({"owner": 1 + n % 3, "key": "likes"})).await.ok();
            for _ in 0..2 {
                let counts = service.totals("posts", None, owners.clone(), json!(["likes"])).await;
                reads += 1;
                if read_sum(&counts) != n {
                    stale += 1;
                }
            }
        }
        service.post("/v1/posts/counters:clear", None, json!({"owners": [1, 2, 3], "keys": ["likes"]})).await.ok();
        let counts = service.totals("posts", None, owners.clone(), json!(["likes"])).await;
        reads += 1;
        if read_sum(&counts) != 0 {
            stale += 1;
        }
        let ready = service.get("/readyz", None).await.ok();
        assert_eq!(ready["cache"]["ok"], true, "[{b}] {ready}");

        // One master down: the cache is reported down, reads stay exact.
        cluster.nodes[0].kill();
        service.post("/v1/posts/counters:add", None, json!({"owner": 2, "key": "likes", "delta": 5})).await.ok();
        let counts = service.totals("posts", None, owners.clone(), json!(["likes"])).await;
        reads += 1;
        if read_sum(&counts) != 5 {
            stale += 1;
        }
        let ready = service.get("/readyz", None).await.ok();
        assert_eq!((ready["status"].clone(), ready["cache"]["ok"].clone()), (json!("ready"), json!(false)), "[{b}] {ready}");
        counter_tests::figures(
            "service_cluster_cache",
            b,
            &[("reads", reads), ("stale_reads", stale)],
        );
        assert_eq!(stale, 0, "[{b}] reads that missed an acknowledged write");
        service.stop().await;
        drop(cluster);
        t.finish().await;
    }
}
