//! CORS: off unless origins are configured; then a preflight is answered
//! for them alone, answers name the origin and the headers a page may
//! read, and credentials are never allowed.

use counter_tests::{TestDb, backend_test};
use hyper::Method;

use crate::support::{NAMESPACES, READER, Running, Scratch, TOKENS, config_text};

const PAGE: &str = "https://app.example";

/// A browser's preflight for a GET with a token, from `origin`.
async fn preflight(service: &Running, origin: &str) -> crate::support::Reply {
    service
        .call(
            Method::OPTIONS,
            "/v1/posts/counts:batchGet?owners=1&keys=likes",
            None,
            &[
                ("origin", origin),
                ("access-control-request-method", "GET"),
                ("access-control-request-headers", "authorization"),
            ],
            None,
        )
        .await
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pages_of_configured_origins_may_call_and_no_others(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        let rest = format!("{NAMESPACES}{TOKENS}");

        // Off by default: no CORS header, a preflight is a 405 problem.
        let off = Running::start(&config_text("", &scratch, &rest)).await;
        let refused = preflight(&off, PAGE).await;
        refused.assert_problem(405, "invalid_input");
        assert_eq!(refused.header("access-control-allow-origin"), None);
        let read = off.call(Method::GET, "/v1/posts/counts:batchGet?owners=1&keys=likes", Some(READER), &[("origin", PAGE)], None).await;
        assert_eq!((read.status, read.header("access-control-allow-origin")), (200, None));
        off.stop().await;

        // One origin configured.
        let on = Running::start(&config_text(&format!("cors_origins = [\"{PAGE}\"]"), &scratch, &rest)).await;
        let answered = preflight(&on, PAGE).await;
        assert!(answered.status == 200 || answered.status == 204, "{answered:?}");
        assert_eq!(answered.header("access-control-allow-origin"), Some(PAGE));
        let headers = answered.header("access-control-allow-headers").unwrap_or_default().to_ascii_lowercase();
        for header in ["authorization", "content-type", "idempotency-key", "last-event-id"] {
            assert!(headers.contains(header), "{header} not allowed: {headers}");
        }
        assert_eq!(answered.header("access-control-allow-credentials"), None, "credentials");
        let other = preflight(&on, "https://evil.example").await;
        assert_eq!(other.header("access-control-allow-origin"), None, "{other:?}");
        let read = on.call(Method::GET, "/v1/posts/counts:batchGet?owners=1&keys=likes", Some(READER), &[("origin", PAGE)], None).await;
        assert_eq!((read.status, read.header("access-control-allow-origin")), (200, Some(PAGE)));
        let exposed = read.header("access-control-expose-headers").unwrap_or_default().to_ascii_lowercase();
        for header in ["x-request-id", "retry-after", "idempotent-replayed", "counter-read-source"] {
            assert!(exposed.contains(header), "{header} not exposed: {exposed}");
        }
        let vary: Vec<String> = read.headers.get_all("vary").iter().filter_map(|v| v.to_str().ok()).map(str::to_ascii_lowercase).collect();
        assert!(vary.iter().any(|v| v.contains("origin")) && vary.iter().any(|v| v.contains("accept")), "{read:?}");
        // A refusal is readable by the page too.
        let unauthorized = on.call(Method::GET, "/v1/posts/counts:batchGet?owners=1&keys=likes", None, &[("origin", PAGE)], None).await;
        unauthorized.assert_problem(401, "unauthorized");
        assert_eq!(unauthorized.header("access-control-allow-origin"), Some(PAGE));
        on.stop().await;

        // Any origin: `*`, still without credentials.
        let any = Running::start(&config_text("cors_origins = [\"*\"]", &scratch, &rest)).await;
        let answered = preflight(&any, "https://anywhere.example").await;
        assert_eq!(answered.header("access-control-allow-origin"), Some("*"));
        assert_eq!(answered.header("access-control-allow-credentials"), None);
        any.stop().await;

        // Refused at start: `*` with others, a path.
        for bad in ["[\"*\", \"https://a.example\"]", "[\"https://a.example/app\"]", "[\"a.example\"]"] {
            let text = config_text(&format!("cors_origins = {bad}"), &scratch, &rest);
            let config = counter_service::Config::from_text(&text, "test", std::iter::empty(), &[]).unwrap();
            let refused = counter_service::Service::start(config).await.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(refused.contains("server.cors_origins"), "{bad}: {refused}");
        }
        t.finish().await;
    }
}
