//! A database that takes no writes, as a failover's demoted primary or a
//! standby does: `/readyz` says not ready, and every add is a `transient`
//! 503 with `Retry-After` (the same add succeeds on the new primary), never
//! a 500 that tells a client not to retry.

use counter_tests::{Backend, TestDb, backend_test, figures};
use serde_json::json;

use crate::support::{NAMESPACES, Running, Scratch, config_text};

/// The scratch database's section, with every session of the service's
/// pool read-only (PostgreSQL's `default_transaction_read_only`, as a hot
/// standby has it): a startup option of the URL, or through a transaction
/// pooler (which passes no startup option on; the scratch space is a
/// database of the test's own there) the database's default, its server
/// connections cut so that the pooler opens new ones.
async fn read_only(t: &TestDb, scratch: &Scratch) -> String {
    use sea_orm::ConnectionTrait;
    if t.schema().is_none() {
        t.db.execute_unprepared(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_read_only = on', \
             current_database()); END $$",
        )
        .await
        .expect("make the scratch database read-only");
        // Every session of the database, the pooler's server connection
        // this runs on included, last (one statement: the next could run
        // on another; a session that signals itself stops at its next
        // row), so the pooler opens new, read-only ones. Its answer may be
        // the cut.
        let _ =
            t.db.execute_unprepared(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() ORDER BY pid = pg_backend_pid()",
            )
            .await;
        return scratch.database.clone();
    }
    let url_line = scratch
        .database
        .lines()
        .find(|line| line.starts_with("url = "))
        .expect("a url line");
    let url = url_line.trim_start_matches("url = ").trim_matches('"');
    let joiner = if url.contains('?') { '&' } else { '?' };
    let read_only = format!("{url}{joiner}options=-c%20default_transaction_read_only%3Don");
    scratch.database.replace(url, &read_only)
}

backend_test! {
    #[backends(postgres)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_read_only_database_is_unready_and_transient(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        let writable = config_text("open = true", &scratch, NAMESPACES);
        let service = Running::start(&writable).await;
        service
            .post("/v1/posts/counters:add", None, json!({"owner": 1, "key": "likes", "delta": 2}))
            .await
            .ok();
        assert_eq!(service.get("/readyz", None).await.status, 200, "ready on a primary");
        service.stop().await;

        let standby = format!("[server]\nopen = true\n{}\n{NAMESPACES}", read_only(&t, &scratch).await);
        let config = counter_service::Config::from_text(
            &standby,
            "the read-only configuration",
            std::iter::empty(),
            &[],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let service = Running::serve(config).await;
        let ready = service.get("/readyz", None).await;
        assert_eq!(ready.status, 503, "a read-only database is not ready: {:?}", ready.text);
        let mut refused = 0u64;
        for (path, body) in [
            ("/v1/posts/counters:add", json!({"owner": 1, "key": "likes", "delta": 1})),
            ("/v1/posts/counters:batchAdd", json!({"items": [{"owner": 1, "key": "likes", "delta": 1}, {"owner": 2, "key": "likes", "delta": 1}]})),
        ] {
            let reply = service.post(path, None, body).await;
            reply.assert_problem(503, "transient");
            assert!(reply.header("retry-after").is_some(), "{path}: Retry-After");
            refused += 1;
        }
        let keyed = service
            .post_keyed("/v1/posts/counters:add", None, "standby-1", json!({"owner": 1, "key": "likes", "delta": 1}))
            .await;
        keyed.assert_problem(503, "transient");
        refused += 1;
        let totals = service.totals("posts", None, json!([1, 2]), json!(["likes"])).await;
        assert_eq!(totals["1"]["likes"], 2, "reads still answer: {totals}");
        service.stop().await;
        assert_eq!(t.backend, Backend::Postgres);
        figures("service_read_only", t.backend, &[("refused_503", refused), ("answered_500", 0)]);
        t.finish().await;
    }
}

/// A transaction pooler keeps no session: `schema` (a session's
/// search_path) is refused with it, by name, and so is a pooler in front
/// of anything but PostgreSQL.
#[test]
fn a_transaction_pooler_refuses_session_settings() {
    let text = "[server]\nopen = true\n[database]\nurl = \"postgres://counter@pgbouncer:6432/counts\"\n\
                pooler = \"transaction\"\nschema = \"counting\"\n[namespaces.posts]\ntable = \"post_counters\"\n\
                owner = \"integer\"\nkeys.likes = {}\n";
    let config = counter_service::Config::from_text(
        text,
        "the pooled configuration",
        std::iter::empty(),
        &[],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let refused = config
        .check()
        .expect_err("a schema with a transaction pooler")
        .to_string();
    assert!(
        refused.contains("database.schema") && refused.contains("search_path"),
        "{refused}"
    );
    let sqlite = text
        .replace(
            "postgres://counter@pgbouncer:6432/counts",
            "sqlite://x.db?mode=rwc",
        )
        .replace("schema = \"counting\"\n", "");
    let config =
        counter_service::Config::from_text(&sqlite, "a pooled SQLite", std::iter::empty(), &[])
            .unwrap_or_else(|e| panic!("{e}"));
    let refused = config
        .check()
        .expect_err("a pooler before SQLite")
        .to_string();
    assert!(refused.contains("database.pooler"), "{refused}");
    let fine = text.replace("schema = \"counting\"\n", "");
    let config =
        counter_service::Config::from_text(&fine, "a pooled PostgreSQL", std::iter::empty(), &[])
            .unwrap_or_else(|e| panic!("{e}"));
    config
        .check()
        .expect("a pooled PostgreSQL without a schema");
}
