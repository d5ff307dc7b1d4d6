//! Hostile input: each answered by a typed 4xx problem, nothing written,
//! the service still serving.

use counter_tests::{TestDb, backend_test};
use hyper::Method;
use serde_json::json;

use crate::support::{NAMESPACES, Running, Scratch, config_text};

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn hostile_input_is_a_typed_4xx(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        let server = "open = true\nmax_body_bytes = 65536\nmax_batch_items = 100\nmax_batch_owners = 50\nmax_batch_keys = 4";
        let service = Running::start(&config_text(server, &scratch, NAMESPACES)).await;
        let b = t.backend;
        let add = "/v1/posts/counters:add";

        // Bodies: over the size bound, broken, mistyped, not JSON.
        let huge = format!("{{\"owner\": 1, \"key\": \"likes\", \"pad\": \"{}\"}}", "x".repeat(100_000));
        let reply = service.call(Method::POST, add, None, &[], Some(huge)).await;
        reply.assert_problem(413, "too_large");
        assert_eq!((reply.json["bound"].clone(), reply.json["max"].clone()), (json!("max_body_bytes"), json!(65536)), "[{b}]");
        let million: Vec<_> = (0..1_000_000).map(|i| json!({"owner": i, "key": "likes"})).collect();
        // 30 MB: the service may answer 413 and close while the client is
        // still sending, which the client then sees as a reset; either way
        // nothing is counted and the service keeps serving.
        let body = json!({"items": million}).to_string();
        match service.try_call(Method::POST, "/v1/posts/counters:batchAdd", None, &[], Some(body)).await {
            Ok(reply) => reply.assert_problem(413, "too_large"),
            Err(e) => eprintln!("[{b}] a 30 MB body: the connection closed early ({e})"),
        }
        let over: Vec<_> = (0..101).map(|i| json!({"owner": i, "key": "likes"})).collect();
        let reply = service.post("/v1/posts/counters:batchAdd", None, json!({"items": over})).await;
        reply.assert_problem(400, "invalid_input");
        assert_eq!((reply.json["bound"].clone(), reply.json["max"].clone()), (json!("batch items"), json!(100)), "[{b}]");
        service.post("/v1/posts/counters:batchAdd", None, json!({"items": []})).await.assert_problem(400, "invalid_input");
        service.call(Method::POST, add, None, &[], Some("{\"owner\": 1, \"key\": ".into())).await.assert_problem(400, "invalid_input");
        service.call(Method::POST, add, None, &[], Some("[1, 2]".into())).await.assert_problem(400, "invalid_input");
        service.post(add, None, json!({"owner": 1, "key": "likes", "extra": true})).await.assert_problem(400, "invalid_input");
        let no_type = service
            .call(Method::POST, add, None, &[("content-type", "text/plain")], Some("{}".into()))
            .await;
        assert!(matches!(no_type.status, 400 | 415), "[{b}] {no_type:?}");
        assert_eq!(no_type.header("content-type"), Some("application/problem+json"), "[{b}]");

        // Deltas: out of i64, and a sum that would overflow (nothing written).
        service.post(add, None, json!({"owner": 1, "key": "likes", "delta": 1e30})).await.assert_problem(400, "invalid_input");
        service.call(Method::POST, add, None, &[], Some("{\"owner\": 1, \"key\": \"likes\", \"delta\": 9223372036854775808}".into())).await.assert_problem(400, "invalid_input");
        // A batch whose deltas overflow when folded: 409, nothing written.
        let batch = json!({"items": [
            {"owner": 6, "key": "likes", "delta": 1},
            {"owner": 5, "key": "likes", "delta": i64::MAX},
            {"owner": 5, "key": "likes", "delta": i64::MAX},
        ]});
        service.post("/v1/posts/counters:batchAdd", None, batch).await.assert_problem(409, "overflow");
        assert_eq!(
            service.totals("posts", None, json!([5, 6]), json!(["likes"])).await,
            json!({"5": {"likes": 0}, "6": {"likes": 0}}),
            "[{b}] a refused batch writes nothing"
        );
        // Issue 39's reproduction: two adds of i64::MAX land on two slots
        // that each fit. The second is 409 on every add route and on its
        // retry (nothing written); the page that reads the owner with
        // others still answers, and so do `top` and compaction.
        service.post(add, None, json!({"owner": 5, "key": "likes", "delta": i64::MAX})).await.ok();
        let body = json!({"owner": 5, "key": "likes", "delta": i64::MAX});
        for attempt in 0..2 {
            let keyed = service.post_keyed(add, None, "past-the-limit", body.clone()).await;
            keyed.assert_problem(409, "overflow");
            assert!(keyed.header("retry-after").is_none(), "[{b}] attempt {attempt}: not retryable");
        }
        service.post(add, None, body.clone()).await.assert_problem(409, "overflow");
        service.post("/v1/posts/counters:addAndGet", None, body.clone()).await.assert_problem(409, "overflow");
        let batch = json!({"items": [{"owner": 6, "key": "likes", "delta": 1}, body.clone()]});
        service.post("/v1/posts/counters:batchAdd", None, batch).await.assert_problem(409, "overflow");
        service.post(add, None, json!({"owner": 7, "key": "likes", "delta": i64::MIN})).await.ok();
        service.post(add, None, json!({"owner": 7, "key": "likes", "delta": -1})).await.assert_problem(409, "overflow");
        assert_eq!(
            service.totals("posts", None, json!([5, 6, 7]), json!(["likes"])).await,
            json!({"5": {"likes": i64::MAX}, "6": {"likes": 0}, "7": {"likes": i64::MIN}}),
            "[{b}] the page still reads, every refused add wrote nothing"
        );
        service.get("/v1/posts/top?key=likes&limit=3", None).await.ok();
        service.run_job("/v1/posts/admin:compact", None).await;

        // Namespaces, keys and routes that do not exist.
        service.post("/v1/nope/counters:add", None, json!({"owner": 1, "key": "likes"})).await.assert_problem(404, "not_found");
        service.post(add, None, json!({"owner": 1, "key": "unknown"})).await.assert_problem(400, "invalid_input");
        service.post(add, None, json!({"owner": 1, "key": "reaction:"})).await.assert_problem(400, "invalid_input");
        service.post(add, None, json!({"owner": 1, "key": "reaction:has space"})).await.assert_problem(400, "invalid_input");
        service.get("/v1/posts/counts:batchGet?owners=1&keys=nope", None).await.assert_problem(400, "invalid_input");
        service.get("/v2/posts/keys", None).await.assert_problem(404, "not_found");
        service.call(Method::DELETE, add, None, &[], None).await.assert_problem(405, "invalid_input");

        // Owners: wrong type, quotes, NUL, trailing space, 10 kB of text.
        service.post(add, None, json!({"owner": "abc", "key": "likes"})).await.assert_problem(400, "invalid_input");
        service.post(add, None, json!({"owner": 1.5, "key": "likes"})).await.assert_problem(400, "invalid_input");
        service.post(add, None, json!({"owner": null, "key": "likes"})).await.assert_problem(400, "invalid_input");
        service.post("/v1/users/counters:add", None, json!({"owner": "not-a-uuid", "key": "followers"})).await.assert_problem(400, "invalid_input");
        let tags = "/v1/tags/counters:add";
        service.post(tags, None, json!({"owner": 17, "key": "uses"})).await.assert_problem(400, "invalid_input");
        service.post(tags, None, json!({"owner": "nul\u{0}inside", "key": "uses"})).await.assert_problem(400, "invalid_input");
        service.post(tags, None, json!({"owner": "trailing ", "key": "uses"})).await.assert_problem(400, "invalid_input");
        let long = "é".repeat(10_000);
        let reply = service.post(tags, None, json!({"owner": long, "key": "uses"})).await;
        reply.assert_problem(400, "invalid_input");
        assert_eq!(reply.json["bound"], "owner length", "[{b}]");
        assert!(reply.text.len() < 2_000, "[{b}] a 10 kB owner is not echoed whole");
        let quoted = "'; DROP TABLE tag_counters; --\"`";
        service.post(tags, None, json!({"owner": quoted, "key": "uses"})).await.ok();
        assert_eq!(service.totals("tags", None, json!([quoted]), json!(["uses"])).await, json!({quoted: {"uses": 1}}), "[{b}]");

        // Batch-get bounds, named.
        let owners: Vec<String> = (0..51).map(|i| i.to_string()).collect();
        let reply = service.get(&format!("/v1/posts/counts:batchGet?owners={}&keys=likes", owners.join(",")), None).await;
        reply.assert_problem(400, "invalid_input");
        assert_eq!(reply.json["bound"], "batch owners", "[{b}]");
        service.get("/v1/posts/counts:batchGet?owners=1&keys=likes,views,comments,reaction:a,reaction:b", None).await.assert_problem(400, "invalid_input");
        service.get("/v1/posts/counts:batchGet?owners=&keys=likes", None).await.assert_problem(400, "invalid_input");
        service.get("/v1/posts/counts:batchGet?keys=likes", None).await.assert_problem(400, "invalid_input");

        // Rankings and series: bad cursors, limits and ranges.
        service.get("/v1/posts/top?key=likes&after=zz", None).await.assert_problem(400, "invalid_input");
        service.get("/v1/posts/top?key=likes&limit=0", None).await.assert_problem(400, "invalid_input");
        service.get("/v1/posts/top?key=likes&limit=1000000", None).await.assert_problem(400, "invalid_input");
        service.get("/v1/posts/series?owner=1&key=views&from=2026-11-05T00:00:00Z&to=2026-11-01T00:00:00Z", None).await.assert_problem(400, "invalid_input");
        service.get("/v1/posts/series?owner=1&key=views&from=yesterday&to=2026-11-01T00:00:00Z", None).await.assert_problem(400, "invalid_input");

        // Idempotency keys that cannot be ledger ids.
        let long_key = "k".repeat(129);
        for key in ["has space", long_key.as_str()] {
            service.post_keyed(add, None, key, json!({"owner": 1, "key": "likes"})).await.assert_problem(400, "invalid_input");
        }

        // Still serving, and nothing above was counted but what was meant.
        assert_eq!(service.totals("posts", None, json!([1]), json!(["likes"])).await, json!({"1": {"likes": 0}}), "[{b}]");
        service.stop().await;
        t.finish().await;
    }
}

backend_test! {
    /// Every refusal by a bound names it, as the guide's error table says:
    /// `bound` and `max` members in the problem body, on each route that
    /// has one, the range reads of series and unique keys included (whose
    /// refusals once came from the library as plain invalid ranges).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn every_bound_refusal_names_its_bound_and_max(t: TestDb) {
        let b = t.backend;
        let scratch = Scratch::of(&t).await;
        let server = "open = true\nmax_batch_items = 100\nmax_batch_owners = 50\nmax_batch_keys = 4";
        let service = Running::start(&config_text(server, &scratch, NAMESPACES)).await;
        let items: Vec<_> = (0..101).map(|i| json!({"owner": i, "key": "likes"})).collect();
        let observations: Vec<_> = (0..101).map(|i| json!({"owner": 1, "key": "viewers", "member": i})).collect();
        let owners: Vec<String> = (0..51).map(|i| i.to_string()).collect();
        let long_key = format!("reaction:{}", "k".repeat(60));
        let centuries = "from=1800-01-01T00:00:00Z&to=2200-01-01T00:00:00Z";
        let refusals = [
            ("batch items", 100, service.post("/v1/posts/counters:batchAdd", None, json!({"items": items})).await),
            ("batch items", 100, service.post("/v1/posts/counters:observe", None, json!({"observations": observations})).await),
            ("batch owners", 50, service.get(&format!("/v1/posts/counts:batchGet?owners={}&keys=likes", owners.join(",")), None).await),
            ("batch keys", 4, service.get("/v1/posts/counts:batchGet?owners=1&keys=likes,views,comments,reaction:a,reaction:b", None).await),
            ("limit", 1_000, service.get("/v1/posts/top?key=likes&limit=1000000", None).await),
            ("owner length", 255, service.post("/v1/tags/counters:add", None, json!({"owner": "o".repeat(256), "key": "uses"})).await),
            ("member bytes", 1_024, service.post("/v1/posts/counters:observe", None, json!({"observations": [{"owner": 1, "key": "viewers", "member": "m".repeat(1_025)}]})).await),
            ("key length", 64, service.post("/v1/posts/counters:add", None, json!({"owner": 1, "key": long_key})).await),
            ("idempotency key length", 128, service.post_keyed("/v1/posts/counters:add", None, &"k".repeat(129), json!({"owner": 1, "key": "likes"})).await),
            // 146,097 day buckets in four centuries; a series has at most 100,000.
            ("series buckets", 100_000, service.get(&format!("/v1/posts/series?owner=1&key=views&{centuries}"), None).await),
            // 2 owners x 146,097 days of sketches; a range read merges at most 100,000.
            ("unique range sketches", 100_000, service.get(&format!("/v1/posts/uniques:batchGet?owners=1,2&keys=viewers&{centuries}"), None).await),
            ("unique range sketches", 100_000, service.post("/v1/posts/uniques:batchGet", None, json!({"owners": [1, 2], "keys": ["viewers"], "from": "1800-01-01T00:00:00Z", "to": "2200-01-01T00:00:00Z"})).await),
        ];
        for (bound, max, reply) in refusals {
            reply.assert_problem(400, "invalid_input");
            assert_eq!(
                (reply.json["bound"].clone(), reply.json["max"].clone()),
                (json!(bound), json!(max)),
                "[{b}] {reply:?}"
            );
        }
        // At the bounds the same reads answer: a series of 100,000 day
        // buckets, and 1 owner x 100,000 days of sketches; a day more is over.
        let inside = "from=2000-01-01T00:00:00Z&to=2273-10-16T00:00:00Z";
        let series = service.get(&format!("/v1/posts/series?owner=1&key=views&{inside}"), None).await.ok();
        assert_eq!(series["buckets"].as_array().map(Vec::len), Some(100_000), "[{b}]");
        service.get(&format!("/v1/posts/uniques:batchGet?owners=1&keys=viewers&{inside}"), None).await.ok();
        let over = "from=2000-01-01T00:00:00Z&to=2273-10-17T00:00:00Z";
        let reply = service.get(&format!("/v1/posts/series?owner=1&key=views&{over}"), None).await;
        assert_eq!(reply.json["bound"], "series buckets", "[{b}] 100,001 buckets: {reply:?}");
        service.stop().await;
        t.finish().await;
    }
}
