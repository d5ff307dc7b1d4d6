//! The auth matrix: no token, a wrong one, a scope or namespace outside the
//! token's, the rate limit; and the configurations that must not start.

use counter_service::{Config, Service};
use counter_tests::{TestDb, backend_test};
use hyper::Method;
use serde_json::json;

use crate::support::{
    ADMIN, NAMESPACES, POSTS_ONLY, READER, Running, SLOW, Scratch, TOKENS, WRITER, config_text,
};

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn tokens_scopes_and_namespaces(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        let service = Running::start(&config_text("", &scratch, &format!("{NAMESPACES}\n{TOKENS}"))).await;
        let b = t.backend;
        let add = |ns: &str| format!("/v1/{ns}/counters:add");
        let like = json!({"owner": 1, "key": "likes"});
        let user = json!({"owner": "7f0c7a53-5c1d-4c49-9d33-5ad0f7a1b2c3", "key": "followers"});

        // No token, a malformed header, a wrong token: 401, with the challenge.
        let reply = service.post(&add("posts"), None, like.clone()).await;
        reply.assert_problem(401, "unauthorized");
        assert_eq!(reply.header("www-authenticate"), Some("Bearer"), "[{b}]");
        let basic = service
            .call(Method::POST, &add("posts"), None, &[("authorization", "Basic d3JpdGVyOnNlY3JldA==")], Some(like.to_string()))
            .await;
        basic.assert_problem(401, "unauthorized");
        service.post(&add("posts"), Some("writer-secret-012345678"), like.clone()).await.assert_problem(401, "unauthorized");
        service.post(&add("posts"), Some("writer-secret-01234567890"), like.clone()).await.assert_problem(401, "unauthorized");
        service.post(&add("posts"), Some(""), like.clone()).await.assert_problem(401, "unauthorized");

        // Scopes: a reader reads and may not write; only admin administers.
        service.post(&add("posts"), Some(READER), like.clone()).await.assert_problem(403, "forbidden");
        service.get("/v1/posts/keys", Some(READER)).await.ok();
        service.post(&add("posts"), Some(WRITER), like.clone()).await.ok();
        service.post("/v1/posts/admin:compact", Some(WRITER), json!({})).await.assert_problem(403, "forbidden");
        service.run_job("/v1/posts/admin:compact", Some(ADMIN)).await;
        // A namespace's jobs: admin only, as one job is.
        service.get("/v1/posts/admin/jobs", Some(READER)).await.assert_problem(403, "forbidden");
        service.get("/v1/posts/admin/jobs", Some(WRITER)).await.assert_problem(403, "forbidden");
        assert_eq!(service.get("/v1/posts/admin/jobs", Some(ADMIN)).await.ok()["jobs"][0]["kind"], "compact", "[{b}]");
        let clear = |owner: i64| json!({"owners": [owner], "keys": ["likes"]});
        service.post("/v1/posts/counters:clear", Some(WRITER), clear(1)).await.assert_problem(403, "forbidden");
        service.post("/v1/posts/counters:clear", Some(ADMIN), clear(99)).await.ok();

        // Namespaces: a token for `posts` only.
        service.post(&add("posts"), Some(POSTS_ONLY), like.clone()).await.ok();
        service.post(&add("users"), Some(POSTS_ONLY), user.clone()).await.assert_problem(403, "forbidden");
        service.get("/v1/users/counts:batchGet?owners=7f0c7a53-5c1d-4c49-9d33-5ad0f7a1b2c3&keys=followers", Some(POSTS_ONLY)).await.assert_problem(403, "forbidden");
        service.post(&add("users"), Some(WRITER), user.clone()).await.ok();
        // The namespaces a token may read: `posts` only, for this one.
        let listed = service.get("/v1/namespaces", Some(POSTS_ONLY)).await.ok();
        assert_eq!((listed["scopes"].clone(), listed["namespaces"].as_array().unwrap().len(), listed["namespaces"][0]["name"].clone()), (json!(["read", "write"]), 1, json!("posts")), "[{b}]");
        service.get("/v1/namespaces", None).await.assert_problem(401, "unauthorized");

        // What the refused calls did: nothing.
        assert_eq!(service.totals("posts", Some(READER), json!([1]), json!(["likes"])).await, json!({"1": {"likes": 2}}), "[{b}]");

        // The rate limit: a burst of 2, then 429 with Retry-After.
        let mut statuses = Vec::new();
        let mut retry_after = None;
        for _ in 0..4 {
            let reply = service.get("/v1/posts/keys", Some(SLOW)).await;
            if reply.status == 429 {
                reply.assert_problem(429, "rate_limited");
                retry_after = reply.header("retry-after").map(str::to_owned);
            }
            statuses.push(reply.status);
        }
        assert_eq!(&statuses[..2], [200, 200], "[{b}] {statuses:?}");
        assert!(statuses[2..].contains(&429), "[{b}] {statuses:?}");
        assert_eq!(retry_after.as_deref(), Some("1"), "[{b}]");
        // Other tokens have their own buckets.
        service.get("/v1/posts/keys", Some(READER)).await.ok();

        // Probes, metrics and the document need no token.
        for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
            assert_eq!(service.get(path, None).await.status, 200, "[{b}] {path}");
        }
        // The secrets appear in no answer.
        let metrics = service.get("/metrics", None).await.text;
        assert!(!metrics.contains(WRITER) && !metrics.contains(SLOW), "[{b}]");
        service.stop().await;
        t.finish().await;
    }
}

/// Configurations that must not start, each naming what to fix.
#[tokio::test]
async fn unsafe_or_broken_configurations_refuse_to_start() {
    let database = "[database]\nurl = \"sqlite::memory:\"\n";
    let refused = |text: String| async move {
        let config = Config::from_text(&text, "test", std::iter::empty(), &[]);
        match config {
            Err(e) => e.to_string(),
            Ok(config) => Service::start(config)
                .await
                .expect_err("must not start")
                .to_string(),
        }
    };
    // No tokens without `open = true`.
    let error = refused(format!("{database}{NAMESPACES}")).await;
    assert!(error.contains("no tokens are configured"), "{error}");
    // A short secret, an unknown scope, an unknown namespace.
    let token = |body: &str| format!("{database}{NAMESPACES}\n[[tokens]]\nname = \"t\"\n{body}\n");
    let error = refused(token("secret = \"short\"\nscopes = [\"read\"]")).await;
    assert!(
        error.contains("tokens.0.secret") && error.contains("at least 16"),
        "{error}"
    );
    let error = refused(token("secret = \"0123456789abcdef0\"\nscopes = [\"root\"]")).await;
    assert!(error.contains("line") && error.contains("root"), "{error}");
    let error = refused(token(
        "secret = \"0123456789abcdef0\"\nscopes = [\"read\"]\nnamespaces = [\"nope\"]",
    ))
    .await;
    assert!(
        error.contains("tokens.0.namespaces") && error.contains("nope"),
        "{error}"
    );
    let error = refused(token(
        "secret_env = \"COUNTER_SERVICE_TEST_UNSET_VAR\"\nscopes = [\"read\"]",
    ))
    .await;
    assert!(error.contains("COUNTER_SERVICE_TEST_UNSET_VAR"), "{error}");
    // A table that was never migrated: a refusal to start, not a 500 later.
    let error = refused(format!("[server]\nopen = true\n{database}{NAMESPACES}")).await;
    assert!(error.contains("migrate"), "{error}");
    // Migrated, but a check's truth table is missing, then one of its
    // columns: refused at start, naming the key and the table.
    let file =
        std::env::temp_dir().join(format!("counter-service-truth-{}.db", std::process::id()));
    let text = format!(
        "[server]\nopen = true\n[database]\nurl = \"sqlite://{}?mode=rwc\"\n{NAMESPACES}",
        file.display()
    );
    let config = Config::from_text(&text, "test", std::iter::empty(), &[]).unwrap();
    Service::migrate(&config).await.unwrap();
    let error = refused(text.clone()).await;
    assert!(
        error.contains("key `comments`")
            && error.contains("truth table `comments`")
            && error.contains("check"),
        "{error}"
    );
    let db = sea_orm::Database::connect(format!("sqlite://{}?mode=rwc", file.display()))
        .await
        .unwrap();
    use sea_orm::ConnectionTrait;
    db.execute_unprepared("CREATE TABLE comments (id INTEGER PRIMARY KEY, postid BIGINT)")
        .await
        .unwrap();
    let error = refused(text.clone()).await;
    assert!(
        error.contains("key `comments`") && error.contains("comments.post_id"),
        "{error}"
    );
    db.execute_unprepared("ALTER TABLE comments RENAME COLUMN postid TO post_id")
        .await
        .unwrap();
    db.close().await.unwrap();
    let config = Config::from_text(&text, "test", std::iter::empty(), &[]).unwrap();
    Service::start(config)
        .await
        .expect("starts once the truth table is there")
        .stop()
        .await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}
