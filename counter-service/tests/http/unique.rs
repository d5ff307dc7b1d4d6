//! Unique counts over HTTP: observations from many clients, retried ones,
//! day windows and their unions, the cache, compaction, and every way a
//! caller can get them wrong.

use counter_tests::{TestDb, backend_test};
use serde_json::{Value, json};

use crate::support::{
    NAMESPACES, READER, Running, Scratch, TOKENS, WRITER, cache_section, config_text,
};

/// The estimate of `owner`'s `key` in `ns`, read through `uniques:batchGet`.
async fn estimate(
    service: &Running,
    token: Option<&str>,
    ns: &str,
    owner: Value,
    key: &str,
    range: &str,
) -> u64 {
    let owners = json!([owner.clone()]);
    let mut body = json!({"owners": owners, "keys": [key]});
    if let Some((from, to)) = range.split_once('/') {
        body["from"] = json!(from);
        body["to"] = json!(to);
    }
    let reply = service
        .post(&format!("/v1/{ns}/uniques:batchGet"), token, body)
        .await
        .ok();
    let owner = owner
        .as_str()
        .map_or_else(|| owner.to_string(), str::to_owned);
    reply["uniques"][owner][key]
        .as_u64()
        .unwrap_or_else(|| panic!("{reply}"))
}

fn observation(owner: i64, member: &str, at: &str) -> Value {
    json!({"owner": owner, "key": "viewers", "member": member, "at": at})
}

const MONDAY: &str = "2026-11-02T10:00:00Z";
const TUESDAY: &str = "2026-11-03T10:00:00Z";
const WEEK: &str = "2026-11-02T00:00:00Z/2026-11-09T00:00:00Z";

backend_test! {
    /// Eight clients observe overlapping members of one owner at once, each
    /// request sent twice (a retry after a lost answer): the estimate is the
    /// union's, within three standard errors, and the week's union counts a
    /// member seen on two days once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_and_retried_observations_count_the_union(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        let service = Running::start(&config_text("", &scratch, &format!("{NAMESPACES}\n{TOKENS}"))).await;
        let b = t.backend;
        // Client c sees members [250c, 250c + 1000): the union is [0, 2750).
        const CLIENTS: usize = 8;
        const PER_CLIENT: usize = 1_000;
        const UNION: usize = 250 * (CLIENTS - 1) + PER_CLIENT;
        let mut clients = Vec::new();
        for c in 0..CLIENTS {
            let api = service.api.clone();
            clients.push(tokio::spawn(async move {
                let members: Vec<usize> = (250 * c..250 * c + PER_CLIENT).collect();
                for chunk in members.chunks(250) {
                    let day = if c % 2 == 0 { MONDAY } else { TUESDAY };
                    let items: Vec<Value> = chunk.iter().map(|m| observation(1, &format!("user-{m}"), day)).collect();
                    for _ in 0..2 {
                        let reply = api.post("/v1/posts/counters:observe", Some(WRITER), json!({"observations": items})).await.ok();
                        assert_eq!(reply["observed"], chunk.len());
                    }
                }
            }));
        }
        for client in clients {
            client.await.unwrap();
        }
        let all_time = estimate(&service, Some(WRITER), "posts", json!(1), "viewers", "").await;
        let week = estimate(&service, Some(WRITER), "posts", json!(1), "viewers", WEEK).await;
        let monday = estimate(&service, Some(WRITER), "posts", json!(1), "viewers", "2026-11-02T00:00:00Z/2026-11-03T00:00:00Z").await;
        // Monday's clients (even c) see [0, 1000) ∪ [500, 1500) ∪ ... = [0, 2500).
        let monday_exact = 250 * (CLIENTS - 2) + PER_CLIENT;
        let error_ppm = all_time.abs_diff(UNION as u64) * 1_000_000 / UNION as u64;
        counter_tests::figures(
            "service_unique",
            b,
            &[
                ("observations", (2 * CLIENTS * PER_CLIENT) as u64),
                ("distinct", UNION as u64),
                ("estimate", all_time),
                ("error_ppm", error_ppm),
                ("week", week),
                ("monday", monday),
            ],
        );
        // Three standard errors of the 0.81 % sketch.
        assert!(error_ppm <= 24_300, "[{b}] {all_time} for {UNION}");
        assert_eq!(week, all_time, "[{b}] the week is the union of its days, not their sum");
        assert!(monday.abs_diff(monday_exact as u64) * 1_000_000 / monday_exact as u64 <= 24_300, "[{b}] {monday} for {monday_exact}");

        // Compaction merges the slot rows of each counter and changes no estimate.
        let compact = service.run_job("/v1/posts/admin:compact", Some(crate::support::ADMIN)).await;
        let (before, after) = (compact["sketch_rows_before"].as_u64().unwrap(), compact["sketch_rows_after"].as_u64().unwrap());
        assert!(after < before, "[{b}] {compact}");
        // A second compaction reports what is there, merged already.
        let again = service.run_job("/v1/posts/admin:compact", Some(crate::support::ADMIN)).await;
        assert_eq!((again["sketch_rows_before"].as_u64(), again["sketch_rows_after"].as_u64()), (Some(after), Some(after)), "[{b}] {again}");
        assert_eq!(estimate(&service, Some(WRITER), "posts", json!(1), "viewers", "").await, all_time, "[{b}]");
        assert_eq!(estimate(&service, Some(WRITER), "posts", json!(1), "viewers", WEEK).await, week, "[{b}]");

        // A reader reads and may not observe.
        service
            .post("/v1/posts/counters:observe", Some(READER), json!({"observations": [observation(1, "x", MONDAY)]}))
            .await
            .assert_problem(403, "forbidden");
        service.get("/v1/posts/uniques:batchGet?owners=1&keys=viewers", Some(READER)).await.ok();
        service.stop().await;
        t.finish().await;
    }
}

backend_test! {
    /// Every misuse is a typed 400 that names what to do, and writes nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn unique_keys_refuse_what_they_cannot_do(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        let service = Running::start(&config_text("open = true", &scratch, NAMESPACES)).await;
        let b = t.backend;
        let observe = |items: Value| json!({"observations": items});
        let cases: Vec<(&str, Value, &str)> = vec![
            ("/v1/posts/counters:observe", observe(json!([{"owner": 1, "key": "likes", "member": "ann"}])), "counts deltas"),
            ("/v1/posts/counters:observe", observe(json!([{"owner": 1, "key": "viewers", "member": {"id": 1}}])), "a string or an integer"),
            ("/v1/posts/counters:observe", observe(json!([{"owner": 1, "key": "viewers", "member": 1.5}])), "a string or an integer"),
            ("/v1/posts/counters:observe", observe(json!([{"owner": 1, "key": "viewers", "member": "m".repeat(1_025)}])), "member bytes"),
            ("/v1/posts/counters:observe", observe(json!([{"owner": 1, "key": "nope", "member": "ann"}])), "no key"),
            ("/v1/posts/counters:observe", observe(json!([])), "batch items"),
            ("/v1/posts/counters:observe", observe(json!([{"owner": 1, "key": "viewers"}])), "member"),
            ("/v1/posts/counters:add", json!({"owner": 1, "key": "viewers"}), "counters:observe"),
            ("/v1/posts/counts:batchGet", json!({"owners": [1], "keys": ["viewers"]}), "uniques:batchGet"),
            ("/v1/posts/uniques:batchGet", json!({"owners": [1], "keys": ["likes"]}), "counts:batchGet"),
            ("/v1/posts/uniques:batchGet", json!({"owners": [1], "keys": ["viewers"], "from": MONDAY}), "both `from` and `to`"),
            ("/v1/posts/uniques:batchGet", json!({"owners": [1], "keys": ["viewers"], "from": TUESDAY, "to": MONDAY}), ""),
            ("/v1/tags/uniques:batchGet", json!({"owners": ["a"], "keys": ["visitors"], "from": MONDAY, "to": TUESDAY}), "window"),
            // 1,000 owners over 101 days: more sketches than one read
            // merges, the bound named (`bound`, `max`: hostile.rs).
            (
                "/v1/posts/uniques:batchGet",
                json!({"owners": (1..=1_000).collect::<Vec<i64>>(), "keys": ["viewers"], "from": "2026-01-01T00:00:00Z", "to": "2026-04-12T00:00:00Z"}),
                "unique range sketches: 101000 is over the limit of 100000",
            ),
        ];
        for (path, body, says) in cases {
            let reply = service.post(path, None, body.clone()).await;
            reply.assert_problem(400, "invalid_input");
            let detail = reply.json["detail"].as_str().unwrap();
            assert!(detail.contains(says), "[{b}] {path} {body}: {detail}");
        }
        // The one bad item of a batch is named, and nothing of it was written.
        let reply = service
            .post(
                "/v1/posts/counters:observe",
                None,
                observe(json!([
                    {"owner": 1, "key": "viewers", "member": "ann"},
                    {"owner": 1, "key": "viewers", "member": null},
                ])),
            )
            .await;
        reply.assert_problem(400, "invalid_input");
        assert_eq!(reply.json["item"], 1, "[{b}] {:?}", reply.json);
        service.get("/v1/posts/top?key=viewers", None).await.assert_problem(400, "invalid_input");
        assert_eq!(estimate(&service, None, "posts", json!(1), "viewers", "").await, 0, "[{b}] nothing written");

        // Hostile but valid members are counted like any other, on a string owner.
        let members = json!(["", "ünïcödé ✓", "it's \"quoted\"", "nul\u{0}inside", "m".repeat(1_024)]);
        let items: Vec<Value> = members.as_array().unwrap().iter().map(|m| json!({"owner": "o'1", "key": "visitors", "member": m})).collect();
        service.post("/v1/tags/counters:observe", None, observe(json!(items))).await.ok();
        assert_eq!(estimate(&service, None, "tags", json!("o'1"), "visitors", "").await, 5, "[{b}]");
        service.stop().await;
        t.finish().await;
    }
}

backend_test! {
    /// Through the Redis cache, every read after an acknowledged observe
    /// sees it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn cached_unique_reads_see_every_acknowledged_observe(t: TestDb) {
        let Some(cache) = cache_section(&t) else {
            return t.finish().await;
        };
        let scratch = Scratch::of(&t).await;
        let service = Running::start(&config_text("open = true", &scratch, &format!("{NAMESPACES}\n{cache}"))).await;
        let b = t.backend;
        let mut stale = 0u64;
        const ROUNDS: u64 = 40;
        for n in 1..=ROUNDS {
            service
                .post("/v1/posts/counters:observe", None, json!({"observations": [observation(7, &format!("v{n}"), MONDAY)]}))
                .await
                .ok();
            // Twice: the second read is the cache's.
            for _ in 0..2 {
                if estimate(&service, None, "posts", json!(7), "viewers", "").await != n {
                    stale += 1;
                }
            }
        }
        counter_tests::figures("service_unique_cached", b, &[("reads", 2 * ROUNDS), ("stale_reads", stale)]);
        assert_eq!(stale, 0, "[{b}] reads that missed an acknowledged observe");
        service.stop().await;
        t.finish().await;
    }
}
