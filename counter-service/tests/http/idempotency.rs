//! Exactly once: one key from 16 clients at once, across two instances on
//! one database; retried batches; a key reused with another request.

use std::sync::Arc;

use counter_tests::{TestDb, backend_test, figures};
use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::support::{NAMESPACES, Running, Scratch, config_text};

/// Sends `body` with `key` from `clients` tasks at once, spread over
/// `services`; returns each answer's status, body and replay header.
async fn at_once(
    services: &[&Running],
    clients: usize,
    path: &str,
    key: &str,
    body: Value,
) -> Vec<(u16, String, bool)> {
    let barrier = Arc::new(Barrier::new(clients));
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            let (api, barrier, body) = (
                services[i % services.len()].api.clone(),
                barrier.clone(),
                body.clone(),
            );
            let (path, key) = (path.to_owned(), key.to_owned());
            tokio::spawn(async move {
                barrier.wait().await;
                let reply = api.post_keyed(&path, None, &key, body).await;
                (
                    reply.status,
                    reply.text.clone(),
                    reply.header("idempotent-replayed") == Some("true"),
                )
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 8)]
    async fn one_key_sixteen_clients_two_instances(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        let text = config_text("open = true", &scratch, NAMESPACES);
        let first = Running::start(&text).await;
        let second = Running::start(&text).await;
        let b = t.backend;

        // 16 clients, one instance, one key: one add, 16 equal answers.
        let body = json!({"owner": 1, "key": "likes", "delta": 5});
        let answers = at_once(&[&first], 16, "/v1/posts/counters:addAndGet", "k-one", body.clone()).await;
        let replays = answers.iter().filter(|a| a.2).count();
        assert!(answers.iter().all(|a| a.0 == 200 && a.1 == answers[0].1), "[{b}] {answers:?}");
        assert_eq!((answers[0].1.as_str(), replays), ("{\"applied\":true,\"total\":5}", 15), "[{b}]");

        // The same across two instances on one database: the service is
        // stateless, any instance replays any key.
        let answers = at_once(&[&first, &second], 16, "/v1/posts/counters:addAndGet", "k-two", body.clone()).await;
        assert!(answers.iter().all(|a| a.0 == 200 && a.1 == answers[0].1), "[{b}] {answers:?}");
        assert_eq!((answers[0].1.as_str(), answers.iter().filter(|a| a.2).count()), ("{\"applied\":true,\"total\":10}", 15), "[{b}]");

        // 200 keys, each sent twice at once to both instances: 200 adds.
        let mut tasks = Vec::new();
        for i in 0..200 {
            for api in [first.api.clone(), second.api.clone()] {
                tasks.push(tokio::spawn(async move {
                    api.post_keyed("/v1/posts/counters:add", None, &format!("k-{i}"), json!({"owner": 2, "key": "likes"})).await.status
                }));
            }
        }
        let mut statuses = Vec::new();
        for task in tasks {
            statuses.push(task.await.unwrap());
        }
        assert!(statuses.iter().all(|s| *s == 200), "[{b}] {statuses:?}");
        let counts = first.totals("posts", None, json!([1, 2]), json!(["likes"])).await;
        assert_eq!(counts, json!({"1": {"likes": 10}, "2": {"likes": 200}}), "[{b}]");
        let total_2 = counts["2"]["likes"].as_u64().unwrap();
        figures("service_idempotency", b, &[("clients", 16), ("instances", 2), ("keys", 202), ("lost", 200u64.saturating_sub(total_2)), ("doubled", total_2.saturating_sub(200))]);

        // The same key with another body, or on another endpoint: 409.
        first.post_keyed("/v1/posts/counters:addAndGet", None, "k-one", json!({"owner": 1, "key": "likes", "delta": 6})).await.assert_problem(409, "conflict");
        second.post_keyed("/v1/posts/counters:add", None, "k-one", body).await.assert_problem(409, "conflict");
        first.stop().await;
        second.stop().await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn batch_items_apply_once_per_id(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        let service = Running::start(&config_text("open = true", &scratch, NAMESPACES)).await;
        let b = t.backend;
        let path = "/v1/posts/counters:batchAdd";
        let item = |id: &str, owner: i64, delta: i64| json!({"id": id, "owner": owner, "key": "likes", "delta": delta});

        let first = service.post(path, None, json!({"items": [item("a", 1, 1), item("b", 2, 2)]})).await.ok();
        assert_eq!(first, json!({"applied": 2, "duplicates": 0}), "[{b}]");
        // The batch retried with one more item: only the new one applies.
        let retry = service.post(path, None, json!({"items": [item("a", 1, 1), item("b", 2, 2), item("c", 3, 3)]})).await.ok();
        assert_eq!(retry, json!({"applied": 1, "duplicates": 2}), "[{b}]");
        // One id twice in a batch: once.
        let twice = service.post(path, None, json!({"items": [item("d", 4, 4), item("d", 4, 4)]})).await.ok();
        assert_eq!(twice, json!({"applied": 1, "duplicates": 1}), "[{b}]");
        // An id reused for another item: 409 naming it, and nothing of the batch applied.
        let reused = service.post(path, None, json!({"items": [item("e", 5, 5), item("a", 1, 100)]})).await;
        reused.assert_problem(409, "conflict");
        assert_eq!(reused.json["item"], 1, "[{b}]");
        service.post(path, None, json!({"items": [item("f", 6, 1), item("f", 6, 2)]})).await.assert_problem(409, "conflict");
        // A whole request under an Idempotency-Key replays its first answer.
        let keyed = json!({"items": [item("g", 7, 7), {"owner": 7, "key": "likes", "delta": 1}]});
        let answer = service.post_keyed(path, None, "batch-1", keyed.clone()).await;
        let replay = service.post_keyed(path, None, "batch-1", keyed).await;
        assert_eq!((answer.status, replay.status, answer.text.clone()), (200, 200, replay.text.clone()), "[{b}]");
        assert_eq!(replay.header("idempotent-replayed"), Some("true"), "[{b}]");

        let totals = service.totals("posts", None, json!([1, 2, 3, 4, 5, 6, 7]), json!(["likes"])).await;
        assert_eq!(
            totals,
            json!({"1": {"likes": 1}, "2": {"likes": 2}, "3": {"likes": 3}, "4": {"likes": 4}, "5": {"likes": 0}, "6": {"likes": 0}, "7": {"likes": 8}}),
            "[{b}]"
        );
        service.stop().await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn keys_are_scoped_per_token(t: TestDb) {
        use crate::support::{ADMIN, TOKENS, WRITER};
        let scratch = Scratch::of(&t).await;
        let service = Running::start(&config_text("", &scratch, &format!("{NAMESPACES}\n{TOKENS}"))).await;
        let b = t.backend;
        let path = "/v1/posts/counters:addAndGet";
        let writers = [WRITER, ADMIN];

        // The same key from two tokens, with different requests: two
        // requests, each applied once, neither a 409 nor the other's answer.
        let mine = service.post_keyed(path, Some(WRITER), "shared-key", json!({"owner": 1, "key": "likes", "delta": 2})).await.ok();
        let theirs = service.post_keyed(path, Some(ADMIN), "shared-key", json!({"owner": 2, "key": "likes", "delta": 3})).await.ok();
        assert_eq!((mine["total"].clone(), theirs["total"].clone()), (json!(2), json!(3)), "[{b}]");
        // The same key and request from both: applied once per token.
        for token in writers {
            service.post_keyed(path, Some(token), "same-request", json!({"owner": 3, "key": "likes", "delta": 1})).await.ok();
        }
        // Each retry replays its own caller's first answer.
        for (token, owner, delta, total) in [(WRITER, 1, 2, 2), (ADMIN, 2, 3, 3)] {
            let retry = service
                .post_keyed(path, Some(token), "shared-key", json!({"owner": owner, "key": "likes", "delta": delta}))
                .await;
            assert_eq!(retry.header("idempotent-replayed"), Some("true"), "[{b}]");
            assert_eq!(retry.ok()["total"], json!(total), "[{b}]");
        }
        // Another caller's key with my request is mine, new; with another's
        // request under my own key, a 409 of my own.
        service
            .post_keyed(path, Some(WRITER), "shared-key", json!({"owner": 2, "key": "likes", "delta": 3}))
            .await
            .assert_problem(409, "conflict");
        // Batch item ids are scoped the same way.
        let batch = json!({"items": [{"id": "item-1", "owner": 4, "key": "likes", "delta": 1}]});
        for token in writers {
            let reply = service.post("/v1/posts/counters:batchAdd", Some(token), batch.clone()).await.ok();
            assert_eq!(reply, json!({"applied": 1, "duplicates": 0}), "[{b}]");
        }
        let totals = service.totals("posts", Some(WRITER), json!([1, 2, 3, 4]), json!(["likes"])).await;
        assert_eq!(
            totals,
            json!({"1": {"likes": 2}, "2": {"likes": 3}, "3": {"likes": 2}, "4": {"likes": 2}}),
            "[{b}]"
        );
        service.stop().await;
        t.finish().await;
    }
}

backend_test! {
    /// `Service::local`: the write path without HTTP shares the HTTP
    /// path's checks, groups and ledger (a retry over HTTP of an
    /// in-process call replays its answer), and refuses what HTTP refuses
    /// with the same problem documents.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn in_process_adds_share_the_ledger_and_the_checks(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        let service = Running::start(&config_text("open = true", &scratch, NAMESPACES)).await;
        let b = t.backend;
        let item = || counter_service::api::BatchItem {
            id: Some("item-1".into()),
            owner: json!(7),
            key: "likes".into(),
            delta: 3,
            at: None,
        };

        let first = service.local.batch_add("posts", vec![item()], Some("local-1")).await.unwrap();
        assert_eq!((first.applied, first.duplicates), (1, 0), "[{b}]");
        let again = service.local.batch_add("posts", vec![item()], Some("local-1")).await.unwrap();
        assert_eq!((again.applied, again.duplicates), (1, 0), "[{b}] a retry answers the first reply");
        let body = json!({"items": [{"id": "item-1", "owner": 7, "key": "likes", "delta": 3}]});
        let over_http = service.post_keyed("/v1/posts/counters:batchAdd", None, "local-1", body.clone()).await;
        assert_eq!(over_http.status, 200, "[{b}] {}", over_http.text);
        assert_eq!(over_http.header("idempotent-replayed"), Some("true"), "[{b}]");
        assert_eq!(over_http.text, r#"{"applied":1,"duplicates":0}"#, "[{b}]");
        // Without the key, the item's id still applies it once.
        let by_id = service.local.batch_add("posts", vec![item()], None).await.unwrap();
        assert_eq!((by_id.applied, by_id.duplicates), (0, 1), "[{b}]");
        let plain = counter_service::api::BatchItem { id: None, ..item() };
        service.local.batch_add("posts", vec![plain], None).await.unwrap();
        let totals = service.totals("posts", None, json!([7]), json!(["likes"])).await;
        assert_eq!(totals, json!({"7": {"likes": 6}}), "[{b}]");

        let refused = |e: counter_service::ProblemBody| (e.status, e.kind);
        let unknown = service.local.batch_add("nope", vec![item()], None).await.unwrap_err();
        assert_eq!(refused(unknown), (404, "not_found".to_owned()), "[{b}]");
        let empty = service.local.batch_add("posts", vec![], None).await.unwrap_err();
        assert_eq!(refused(empty), (400, "invalid_input".to_owned()), "[{b}]");
        let undeclared = counter_service::api::BatchItem { key: "nope".into(), ..item() };
        let undeclared = service.local.batch_add("posts", vec![undeclared], None).await.unwrap_err();
        assert_eq!(undeclared.status, 400, "[{b}] {undeclared}");
        let bad_key = service.local.batch_add("posts", vec![item()], Some("bad key\n")).await.unwrap_err();
        assert_eq!(refused(bad_key), (400, "invalid_input".to_owned()), "[{b}]");
        let reused = service.local.batch_add("posts", vec![plain_of(item(), 9)], Some("local-1")).await.unwrap_err();
        assert_eq!(refused(reused), (409, "conflict".to_owned()), "[{b}]");
        service.stop().await;
    }
}

/// `item` with another delta.
fn plain_of(item: counter_service::api::BatchItem, delta: i64) -> counter_service::api::BatchItem {
    counter_service::api::BatchItem { delta, ..item }
}
