//! The library's log lines keep the caller's span. Statements on a pool
//! run in tasks of their own (so a dropped caller never leaves a
//! connection half way); their log lines (sqlx's statement lines, the
//! library's retries) must still carry the request they serve, as an axum
//! or Loco app's `request_id` span field.
//!
//! A layer installed once for this test binary records the events that
//! happen inside a span named `counter_probe`, with that span's
//! `request_id`; events elsewhere are dropped at once.

use std::sync::{Mutex, OnceLock};

use counter_core::Compact;
use counter_tests::{TestDb, backend_test, counters, figures};
use sea_orm::{ConnectOptions, Database, DatabaseConnection};
use tracing::{
    Instrument, Subscriber,
    field::{Field, Visit},
    span::{Attributes, Id},
};
use tracing_subscriber::{
    Layer,
    layer::{Context, SubscriberExt},
    registry::LookupSpan,
};

/// The probe span's name.
const PROBE: &str = "counter_probe";

/// Events seen inside a probe span: (its `request_id`, the event's target).
#[derive(Default)]
struct Probe {
    seen: Mutex<Vec<(String, String)>>,
}

/// A probe span's `request_id`, kept in its extensions.
struct RequestId(String);

struct RequestIdVisitor(Option<String>);

impl Visit for RequestIdVisitor {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "request_id" {
            self.0 = Some(format!("{value:?}").trim_matches('"').to_owned());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "request_id" {
            self.0 = Some(value.to_owned());
        }
    }
}

struct ProbeLayer(&'static Probe);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for ProbeLayer {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != PROBE {
            return;
        }
        let mut visitor = RequestIdVisitor(None);
        attrs.record(&mut visitor);
        if let (Some(span), Some(request)) = (ctx.span(id), visitor.0) {
            span.extensions_mut().insert(RequestId(request));
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let Some(scope) = ctx.event_scope(event) else {
            return;
        };
        for span in scope.from_root() {
            if let Some(RequestId(request)) = span.extensions().get::<RequestId>() {
                let target = event.metadata().target().to_owned();
                self.0
                    .seen
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((request.clone(), target));
                return;
            }
        }
    }
}

/// The probe, installed as this binary's global subscriber on first use.
fn probe() -> &'static Probe {
    static PROBE_STATE: OnceLock<&'static Probe> = OnceLock::new();
    PROBE_STATE.get_or_init(|| {
        let probe: &'static Probe = Box::leak(Box::default());
        let subscriber = tracing_subscriber::registry().with(ProbeLayer(probe));
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in this test binary");
        probe
    })
}

/// A pool on the test's database (SQLite: a new in-memory one) with sqlx's
/// statement logging on, as an app that logs its queries has.
async fn logging_pool(t: &TestDb) -> DatabaseConnection {
    let mut options = ConnectOptions::new(t.url().unwrap_or("sqlite::memory:"));
    options
        .max_connections(2)
        .sqlx_logging(true)
        .sqlx_logging_level(tracing::log::LevelFilter::Info);
    if t.url().is_none() {
        options.min_connections(1).max_connections(1);
    }
    if let Some(schema) = t.schema() {
        options.set_schema_search_path(schema);
    }
    Database::connect(options).await.expect("a logging pool")
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[label = "log_spans"]
    /// An increment, a read and a compaction on a pool, inside a request's
    /// span: every statement line sqlx logs for them carries the request's
    /// `request_id`, although the statements ran in tasks of their own.
    async fn statement_logs_carry_the_callers_span(t: TestDb) {
        let probe = probe();
        let pool = logging_pool(&t).await;
        let posts = counters::<i64>("log_counters", 4);
        posts.create_table(&pool).await.expect("create the table");
        let request = format!("req-{}-{:08x}", t.backend, rand::random::<u32>());
        let work = async {
            for _ in 0..3 {
                posts.increment(&pool, 7, "likes").await.expect("increment");
            }
            assert_eq!(posts.get(&pool, 7, "likes").await.expect("read"), 3);
            posts.compact(&pool, &Compact::new()).await.expect("compact");
        };
        work.instrument(tracing::info_span!(PROBE, request_id = %request))
            .await;
        let seen: Vec<String> = probe
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(id, _)| *id == request)
            .map(|(_, target)| target.clone())
            .collect();
        let statements = seen.iter().filter(|t| t.starts_with("sqlx::query")).count();
        figures("log_spans", t.backend, &[("statement_lines_in_span", statements as u64)]);
        // 3 upserts, a read, the compaction's transaction: at least 5.
        assert!(
            statements >= 5,
            "[{}] statement lines in the request's span: {seen:?}",
            t.backend
        );
        let _ = pool.close().await;
        t.finish().await;
    }
}
