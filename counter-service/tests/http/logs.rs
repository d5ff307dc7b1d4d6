//! Log lines name the requests they serve: an add's group logs inside a
//! span carrying the `X-Request-Id`s of its requests, although it runs in
//! a worker task of its own, and the request's own lines carry its id.
//! Those lines are DEBUG: under the default filter (`info`) a request or a
//! scrape writes no line, and `RUST_LOG=info,tower_http=debug` shows them.
//!
//! A layer installed once for this test binary records events inside
//! spans named `request` or `add_group` with their id fields; everything
//! else is dropped at once.

use std::sync::{Mutex, OnceLock};

use counter_tests::{TestDb, backend_test};
use serde_json::json;
use tracing::{
    Subscriber,
    field::{Field, Visit},
    span::{Attributes, Id},
};
use tracing_subscriber::{
    Layer,
    layer::{Context, SubscriberExt},
    registry::LookupSpan,
};

use crate::support::{NAMESPACES, Running, Scratch, config_text};

/// Events seen: (the span's name, its ids field, the event's message, its
/// level).
#[derive(Default)]
struct Seen(Mutex<Vec<(String, String, String, tracing::Level)>>);

/// A span's id field (`request_id` or `request_ids`), kept in its extensions.
struct Ids(String);

#[derive(Default)]
struct Fields {
    ids: Option<String>,
    message: Option<String>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}").trim_matches('"').to_owned();
        match field.name() {
            "request_id" | "request_ids" => self.ids = Some(text),
            "message" => self.message = Some(text),
            _ => {}
        }
    }
}

struct SeenLayer(&'static Seen);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for SeenLayer {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if !matches!(attrs.metadata().name(), "request" | "add_group") {
            return;
        }
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let (Some(span), Some(ids)) = (ctx.span(id), fields.ids) {
            span.extensions_mut().insert(Ids(ids));
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let Some(scope) = ctx.event_scope(event) else {
            return;
        };
        for span in scope {
            if let Some(Ids(ids)) = span.extensions().get::<Ids>() {
                let mut fields = Fields::default();
                event.record(&mut fields);
                self.0.0.lock().unwrap_or_else(|e| e.into_inner()).push((
                    span.name().to_owned(),
                    ids.clone(),
                    fields.message.unwrap_or_default(),
                    *event.metadata().level(),
                ));
                return;
            }
        }
    }
}

fn seen() -> &'static Seen {
    static SEEN: OnceLock<&'static Seen> = OnceLock::new();
    SEEN.get_or_init(|| {
        let seen: &'static Seen = Box::leak(Box::default());
        tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(SeenLayer(seen)),
        )
        .expect("no other global subscriber in this test binary");
        seen
    })
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn log_lines_name_their_requests(t: TestDb) {
        let seen = seen();
        let scratch = Scratch::of(&t).await;
        let service = Running::start(&config_text("open = true", &scratch, NAMESPACES)).await;
        let id = format!("probe-{}-{}", t.backend, std::process::id());
        let reply = service
            .call(hyper::Method::POST, "/v1/posts/counters:add", None, &[("x-request-id", &id)], Some(json!({"owner": 1, "key": "likes"}).to_string()))
            .await;
        assert_eq!((reply.status, reply.header("x-request-id")), (200, Some(id.as_str())), "{reply:?}");
        let lines = seen.0.lock().unwrap().clone();
        let group = lines.iter().any(|(span, ids, message, _)| span == "add_group" && ids.split(',').any(|i| i == id) && message == "add group committed");
        let request: Vec<_> = lines.iter().filter(|(span, ids, message, _)| span == "request" && *ids == id && message.contains("finished processing request")).collect();
        assert!(group, "[{}] no add group line names {id}: {lines:?}", t.backend);
        assert!(!request.is_empty(), "[{}] no request line names {id}", t.backend);
        // Below the default filter: a request is not an INFO line.
        for (.., level) in &request {
            assert_eq!(*level, tracing::Level::DEBUG, "[{}] the request line of {id}", t.backend);
        }
        service.stop().await;
        t.finish().await;
    }
}

/// The real binary's output as a collector sees it: with `log_format =
/// "json"` every line it writes, the start lines included, is a JSON
/// object; with text logs into a pipe (a file, a journal), no colour codes.
/// Under the default filter (no `RUST_LOG`, the JSON run) an add, a
/// refused read and scrapes of `/metrics` write no line at all; with
/// `RUST_LOG=info,tower_http=debug` (the text run) each is a line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_json_from_the_first_line_and_text_has_no_colour_codes() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    for (format, filter) in [("json", None), ("text", Some("info,tower_http=debug"))] {
        let dir = std::env::temp_dir().join(format!(
            "counter-service-logs-{format}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("service.toml");
        std::fs::write(
            &config,
            format!(
                "[server]\nopen = true\nlog_format = \"{format}\"\n[database]\nurl = \"sqlite://{}?mode=rwc\"\n\
                 [namespaces.posts]\ntable = \"post_counters\"\nowner = \"integer\"\n[namespaces.posts.keys.likes]\n",
                dir.join("service.db").display()
            ),
        )
        .unwrap();
        let port = counter_tests::servers::free_port();
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_counter-service"));
        match filter {
            Some(filter) => command.env("RUST_LOG", filter),
            None => command.env_remove("RUST_LOG"),
        };
        let mut child = command
            .args([
                "--config",
                config.to_str().unwrap(),
                "--listen",
                &format!("127.0.0.1:{port}"),
                "serve",
                "--migrate",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let lines = std::sync::Arc::new(Mutex::new(Vec::<String>::new()));
        let collect = |stream: Box<dyn tokio::io::AsyncRead + Send + Unpin>| {
            let lines = lines.clone();
            tokio::spawn(async move {
                let mut stream = BufReader::new(stream).lines();
                while let Ok(Some(line)) = stream.next_line().await {
                    lines.lock().unwrap().push(line);
                }
            });
        };
        collect(Box::new(child.stdout.take().unwrap()));
        collect(Box::new(child.stderr.take().unwrap()));
        let api = crate::support::Api::new(format!("http://127.0.0.1:{port}"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("counter-service listening on"))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "[{format}] no listening line: {:?}",
                lines.lock().unwrap()
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        api.post(
            "/v1/posts/counters:add",
            None,
            json!({"owner": 1, "key": "likes"}),
        )
        .await
        .ok();
        api.get("/v1/posts/counts:batchGet?owners=x&keys=likes", None)
            .await
            .assert_problem(400, "invalid_input");
        for _ in 0..3 {
            assert_eq!(api.get("/metrics", None).await.status, 200);
        }
        // Lines still coming in would be lost to the kill: wait for the
        // text run's, and give the JSON run's (none) the same time.
        let settle = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while filter.is_some()
            && lines
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains("/metrics"))
                .count()
                < 3
            && std::time::Instant::now() < settle
        {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        child.start_kill().unwrap();
        child.wait().await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let lines = lines.lock().unwrap().clone();
        assert!(lines.len() >= 4, "[{format}] {lines:?}");
        let request_lines: Vec<&String> = lines
            .iter()
            .filter(|l| l.contains("finished processing request"))
            .collect();
        match filter {
            None => assert!(
                request_lines.is_empty(),
                "[{format}] request lines under the default filter: {request_lines:?}"
            ),
            // The add, the refused read and the three scrapes.
            Some(_) => {
                assert!(request_lines.len() >= 5, "[{format}] {lines:?}");
                let scrapes = request_lines
                    .iter()
                    .filter(|l| l.contains("/metrics"))
                    .count();
                assert_eq!(scrapes, 3, "[{format}] {request_lines:?}");
            }
        }
        for line in &lines {
            match format {
                "json" => {
                    let parsed: Result<serde_json::Value, _> = serde_json::from_str(line);
                    assert!(
                        parsed.is_ok_and(|v| v.is_object()),
                        "[json] not a JSON object: {line}"
                    );
                }
                _ => assert!(
                    !line.contains('\u{1b}'),
                    "[text] a colour code in: {line:?}"
                ),
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
