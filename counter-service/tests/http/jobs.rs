//! Long maintenance runs as a job: `admin:compact` answers 202 with the job
//! at once, however long the work; a second compaction while one runs is
//! 409 naming it; the job reports its figures once done; the job's address
//! needs the admin scope; an unknown job is 404. The compaction is held
//! running by a lock the test takes on the counter table.

use counter_tests::{TestDb, backend_test};
use hyper::Method;
use sea_orm::{ConnectionTrait, TransactionTrait};
use serde_json::json;

use crate::support::{ADMIN, NAMESPACES, Running, Scratch, TOKENS, WRITER, config_text};

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[backends(postgres, mysql)]
    async fn a_compaction_is_a_job_and_a_second_one_says_so(t: TestDb) {
        let b = t.backend;
        let scratch = Scratch::of(&t).await;
        let service = Running::start(&config_text("request_timeout_ms = 1000", &scratch, &format!("{NAMESPACES}\n{TOKENS}"))).await;
        for _ in 0..20 {
            service.post("/v1/posts/counters:add", Some(WRITER), json!({"owner": 1, "key": "likes"})).await.ok();
        }
        // The test holds the counter table: the compaction waits for it.
        let db = scratch.connect(&t).await;
        let hold = db.begin().await.unwrap();
        let lock = match b.to_string().as_str() {
            "postgres" => "LOCK TABLE post_counters IN ACCESS EXCLUSIVE MODE",
            _ => "SELECT * FROM post_counters FOR UPDATE",
        };
        hold.execute_unprepared(lock).await.unwrap();
        let started = service.call(Method::POST, "/v1/posts/admin:compact", Some(ADMIN), &[], None).await;
        assert_eq!(started.status, 202, "[{b}] {started:?}");
        let id = started.json["id"].as_str().unwrap().to_owned();
        assert_eq!(started.json["state"], "running", "[{b}]");
        // Longer than the request timeout: a job is not a request.
        tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
        let again = service.call(Method::POST, "/v1/posts/admin:compact", Some(ADMIN), &[], None).await;
        again.assert_problem(409, "conflict");
        assert_eq!(again.json["job"], id.as_str(), "[{b}] {again:?}");
        let path = format!("/v1/posts/admin/jobs/{id}");
        assert_eq!(service.get(&path, Some(ADMIN)).await.ok()["state"], "running", "[{b}]");
        service.get(&path, Some(WRITER)).await.assert_problem(403, "forbidden");
        service.get("/v1/posts/admin/jobs/nope", Some(ADMIN)).await.assert_problem(404, "not_found");
        hold.rollback().await.unwrap();
        // Let go, it ends, and reports what it found.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let job = loop {
            let job = service.get(&path, Some(ADMIN)).await.ok();
            if job["state"] != "running" {
                break job;
            }
            assert!(std::time::Instant::now() < deadline, "[{b}] still running");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        assert_eq!(job["state"], "done", "[{b}] {job}");
        assert!(job["report"]["rows_before"].as_u64().unwrap() >= 1, "[{b}] {job}");
        assert!(job["finished_at"].is_string(), "[{b}] {job}");
        assert_eq!(service.totals("posts", Some(ADMIN), json!([1]), json!(["likes"])).await, json!({"1": {"likes": 20}}), "[{b}]");
        service.stop().await;
        t.finish().await;
    }
}
