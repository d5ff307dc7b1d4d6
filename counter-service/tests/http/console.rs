//! The console at `/ui`: its page and every file the page references,
//! each with its content type and the strict headers; off with
//! `console = false`; and the two endpoints it needs, `GET /v1/namespaces`
//! and `GET /v1/{ns}/admin/jobs`, with their scopes. (A real browser
//! drives the pages elsewhere.)

use counter_tests::{TestDb, backend_test};
use serde_json::json;

use crate::support::{
    ADMIN, NAMESPACES, POSTS_ONLY, READER, Reply, Running, Scratch, TOKENS, WRITER, config_text,
};

/// What every answer of the console carries.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// A reader of `posts` only.
const POSTS_READER: &str = "posts-reader-secret-0123456789";

#[track_caller]
fn assert_console_headers(reply: &Reply, path: &str, content_type: &str) {
    assert_eq!(reply.status, 200, "{path}: {reply:?}");
    assert_eq!(reply.header("content-type"), Some(content_type), "{path}");
    assert_eq!(reply.header("content-security-policy"), Some(CSP), "{path}");
    assert_eq!(
        reply.header("x-content-type-options"),
        Some("nosniff"),
        "{path}"
    );
    assert_eq!(
        reply.header("referrer-policy"),
        Some("no-referrer"),
        "{path}"
    );
}

/// The `src` and `href` values of the page that name a file of this
/// origin (no `#` route, no `data:`).
fn references(html: &str) -> Vec<String> {
    let mut found = Vec::new();
    for attribute in ["src=\"", "href=\""] {
        for (at, _) in html.match_indices(attribute) {
            let rest = &html[at + attribute.len()..];
            let value = &rest[..rest.find('"').unwrap()];
            if value.starts_with('/') {
                found.push(value.to_owned());
            }
        }
    }
    found
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_console_is_served_with_a_strict_policy(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        let service = Running::start(&config_text("", &scratch, &format!("{NAMESPACES}\n{TOKENS}"))).await;

        // The page, with no token: the files are the same for everyone.
        let page = service.get("/ui", None).await;
        assert_console_headers(&page, "/ui", "text/html; charset=utf-8");
        assert!(page.text.contains("id=\"token\""), "{}", page.text);
        assert!(!page.text.contains("<script>") && !page.text.contains("style="), "no inline code: {}", page.text);
        // Every file it references: a script, a style sheet, and nothing
        // unaccounted for (`/openapi.json` is the API's, linked).
        let mut kinds = Vec::new();
        for path in references(&page.text) {
            if path == "/openapi.json" {
                continue;
            }
            let reply = service.get(&path, None).await;
            let content_type = match path.rsplit('.').next() {
                Some("js") => "text/javascript; charset=utf-8",
                Some("css") => "text/css; charset=utf-8",
                _ => panic!("an unexpected reference {path}"),
            };
            assert_console_headers(&reply, &path, content_type);
            assert!(!reply.text.is_empty(), "{path}");
            kinds.push(content_type);
            if path.ends_with(".js") {
                // A cheap guard beside the browser test: no markup from data.
                for sink in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("] {
                    assert!(!reply.text.contains(sink), "{path} uses {sink}");
                }
                assert!(reply.text.contains("textContent") && reply.text.contains("encodeURIComponent"));
                // The health page's cache hit ratio comes from the hit and
                // miss counters over a window of scrapes (the browser test
                // checks the figure), never a ratio since start.
                assert!(reply.text.contains("counter_service_cache_hits_total") && reply.text.contains("CACHE_WINDOW_MS"));
                assert!(!reply.text.contains("counter_service_cache_hit_ratio"), "a ratio since start");
            }
        }
        kinds.sort();
        assert_eq!(kinds, ["text/css; charset=utf-8", "text/javascript; charset=utf-8"]);
        assert_console_headers(&service.get("/ui/", None).await, "/ui/", "text/html; charset=utf-8");
        // Beyond its files, `/ui/...` is an unknown route like any other.
        service.get("/ui/nope.js", None).await.assert_problem(404, "not_found");
        service.stop().await;

        // Off: `/ui` is a 404 problem, the API unchanged.
        let service = Running::start(&config_text("console = false\nopen = true", &scratch, NAMESPACES)).await;
        for path in ["/ui", "/ui/", "/ui/console.js", "/ui/console.css"] {
            let reply = service.get(path, None).await;
            reply.assert_problem(404, "not_found");
            assert!(reply.header("content-security-policy").is_none(), "{path}");
        }
        service.get("/v1/namespaces", None).await.ok();
        service.stop().await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn namespaces_and_jobs_for_the_console(t: TestDb) {
        let b = t.backend;
        let scratch = Scratch::of(&t).await;
        let reader = format!(
            "[[tokens]]\nname = \"posts-reader\"\nsecret = \"{POSTS_READER}\"\nscopes = [\"read\"]\nnamespaces = [\"posts\"]\n"
        );
        let service = Running::start(&config_text("", &scratch, &format!("{NAMESPACES}\n{TOKENS}\n{reader}"))).await;

        // A reader of one namespace: that namespace, its keys, and `read`.
        let listed = service.get("/v1/namespaces", Some(POSTS_READER)).await.ok();
        assert_eq!(listed["scopes"], json!(["read"]), "[{b}] {listed}");
        let names: Vec<&str> = listed["namespaces"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["posts"], "[{b}] {listed}");
        let posts = &listed["namespaces"][0];
        // What `GET /v1/posts/keys` answers, the same.
        let keys = service.get("/v1/posts/keys", Some(POSTS_READER)).await.ok();
        for field in ["keys", "patterns", "in_use"] {
            assert_eq!(posts[field], keys[field], "[{b}] {field}");
        }
        let viewers = posts["keys"].as_array().unwrap().iter().find(|k| k["name"] == "viewers").unwrap();
        assert_eq!((viewers["unique"].clone(), viewers["window"].clone()), (json!(true), json!("day")), "[{b}]");
        let comments = posts["keys"].as_array().unwrap().iter().find(|k| k["name"] == "comments").unwrap();
        assert_eq!(comments["checked"], true, "[{b}]");
        // Every namespace for an unrestricted token; none without read.
        let all = service.get("/v1/namespaces", Some(ADMIN)).await.ok();
        assert_eq!(all["scopes"], json!(["read", "write", "admin"]), "[{b}]");
        assert_eq!(all["namespaces"].as_array().unwrap().len(), 3, "[{b}] {all}");
        let mixed = service.get("/v1/namespaces", Some(POSTS_ONLY)).await.ok();
        assert_eq!((mixed["scopes"].clone(), mixed["namespaces"].as_array().unwrap().len()), (json!(["read", "write"]), 1), "[{b}]");
        service.get("/v1/namespaces", None).await.assert_problem(401, "unauthorized");
        service.get("/v1/namespaces", Some("not-a-token-0123456789")).await.assert_problem(401, "unauthorized");

        // The jobs: none yet, then a finished check with its report, newest first.
        assert_eq!(service.get("/v1/posts/admin/jobs", Some(ADMIN)).await.ok(), json!({"jobs": []}), "[{b}]");
        let db = scratch.connect(&t).await;
        use sea_orm::ConnectionTrait;
        db.execute_unprepared("INSERT INTO comments (id, post_id) VALUES (1, 1), (2, 1)").await.unwrap();
        service.post("/v1/posts/counters:add", Some(WRITER), json!({"owner": 1, "key": "comments"})).await.ok();
        service.run_job("/v1/posts/admin:check?dry_run=true", Some(ADMIN)).await;
        service.run_job("/v1/posts/admin:compact", Some(ADMIN)).await;
        let jobs = service.get("/v1/posts/admin/jobs", Some(ADMIN)).await.ok();
        let jobs = jobs["jobs"].as_array().unwrap();
        let kinds: Vec<&str> = jobs.iter().map(|j| j["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["compact", "check_dry_run"], "[{b}] newest first");
        let check = &jobs[1];
        assert_eq!(check["state"], "done", "[{b}] {check}");
        let report = &check["report"]["checks"][0];
        assert_eq!(
            (report["key"].clone(), report["owners_drifted"].clone(), report["total_abs_drift"].clone(), report["fixed"].clone()),
            (json!("comments"), json!(1), json!(1), json!(false)),
            "[{b}] {check}"
        );
        // The same shape as one job's address.
        let one = service.get(&format!("/v1/posts/admin/jobs/{}", check["id"].as_str().unwrap()), Some(ADMIN)).await.ok();
        assert_eq!(&one, check, "[{b}]");
        // Another namespace's jobs are its own.
        assert_eq!(service.get("/v1/tags/admin/jobs", Some(ADMIN)).await.ok(), json!({"jobs": []}), "[{b}]");

        // The admin scope: a reader or a writer is refused, with a problem.
        for token in [READER, POSTS_READER, WRITER, POSTS_ONLY] {
            service.get("/v1/posts/admin/jobs", Some(token)).await.assert_problem(403, "forbidden");
        }
        service.get("/v1/posts/admin/jobs", None).await.assert_problem(401, "unauthorized");
        service.get("/v1/nope/admin/jobs", Some(ADMIN)).await.assert_problem(404, "not_found");
        service.stop().await;
        t.finish().await;
    }
}
