//! 64-bit integers as strings (`application/json; int64=string`): a total
//! of `i64::MAX` read back exactly by a client whose numbers are doubles,
//! and deltas sent as strings.

use counter_tests::{TestDb, backend_test};
use hyper::Method;
use serde_json::json;

use crate::support::{NAMESPACES, Running, Scratch, config_text};

const AS_STRINGS: &str = "application/json; int64=string";

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn totals_past_2_53_travel_exactly_as_strings(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        let service = Running::start(&config_text("open = true", &scratch, NAMESPACES)).await;
        let accept = [("accept", AS_STRINGS)];
        let add = |delta: serde_json::Value| {
            let api = service.api.clone();
            async move {
                api.call(Method::POST, "/v1/posts/counters:addAndGet", None, &accept, Some(json!({"owner": 1, "key": "likes", "delta": delta}).to_string())).await
            }
        };
        // A delta past 2^53 sent as a string, the total answered as one.
        let first = add(json!("9223372036854775806")).await;
        assert_eq!((first.status, first.header("content-type")), (200, Some(AS_STRINGS)), "{first:?}");
        assert_eq!(first.json, json!({"applied": true, "total": "9223372036854775806"}));
        let second = add(json!(1)).await;
        assert_eq!(second.json["total"], json!("9223372036854775807"));

        let path = "/v1/posts/counts:batchGet?owners=1,2&keys=likes";
        let strings = service.call(Method::GET, path, None, &accept, None).await;
        assert_eq!(strings.header("content-type"), Some(AS_STRINGS));
        assert_eq!(strings.json, json!({"counts": {"1": {"likes": "9223372036854775807"}, "2": {"likes": "0"}}}));
        // Without the parameter: numbers, exact for a reader with 64-bit integers.
        let numbers = service.get(path, None).await.ok();
        assert_eq!(numbers["counts"]["1"]["likes"].as_i64(), Some(i64::MAX));

        // Problems stay as they are; a delta that is no integer is refused.
        let refused = add(json!("12x")).await;
        refused.assert_problem(400, "invalid_input");
        assert_eq!(refused.json["status"], json!(400));
        let overflow = add(json!("1")).await;
        overflow.assert_problem(409, "overflow");

        // A watch stream asked for the same way.
        let addr = service.base.trim_start_matches("http://").to_owned();
        let mut watcher = crate::watch::Watcher::open(&addr, "/v1/posts/counts:watch?owners=1&keys=likes", None, &[("accept", "text/event-stream; int64=string")], None)
            .await
            .unwrap();
        let snapshot = watcher.next_within(std::time::Duration::from_secs(10)).await.unwrap();
        assert_eq!(snapshot.data["counts"]["1"]["likes"], json!("9223372036854775807"));
        drop(watcher);
        service.stop().await;
        t.finish().await;
    }
}
