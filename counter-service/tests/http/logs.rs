//! Log lines name the requests they serve: an add's group logs inside a
//! span carrying the `X-Request-Id`s of its requests, although it runs in
//! a worker task of its own, and the request's own lines carry its id.
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

/// Events seen: (the span's name, its ids field, the event's message).
#[derive(Default)]
struct Seen(Mutex<Vec<(String, String, String)>>);

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
        let group = lines.iter().any(|(span, ids, message)| span == "add_group" && ids.split(',').any(|i| i == id) && message == "add group committed");
        let request = lines.iter().any(|(span, ids, message)| span == "request" && *ids == id && message.contains("finished processing request"));
        assert!(group, "[{}] no add group line names {id}: {lines:?}", t.backend);
        assert!(request, "[{}] no request line names {id}", t.backend);
        service.stop().await;
        t.finish().await;
    }
}
