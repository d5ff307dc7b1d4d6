//! The HTTP API: routes, their OpenAPI document, and the layers every
//! request passes (request id, trace span, metrics, timeout, body limit,
//! authentication).
//!
//! ```text
//! POST /v1/{ns}/counters:add          POST /v1/{ns}/counters:addAndGet
//! POST /v1/{ns}/counters:batchAdd     GET|POST /v1/{ns}/counts:batchGet
//! POST /v1/{ns}/counters:observe      GET|POST /v1/{ns}/uniques:batchGet
//! GET  /v1/{ns}/counts:watch          GET  /v1/{ns}/top:watch  (Server-Sent Events)
//! GET  /v1/{ns}/top                   GET  /v1/{ns}/series
//! GET  /v1/{ns}/keys                  POST /v1/{ns}/admin:check  POST /v1/{ns}/admin:compact
//! GET  /v1/{ns}/admin/jobs/{id}       GET  /v1/{ns}/admin/jobs   POST /v1/{ns}/counters:clear
//! GET  /v1/namespaces
//! GET  /healthz  /readyz  /metrics  /openapi.json
//! GET  /ui, /ui/*                     (the browser console, `server.console`)
//! ```

mod admin;
pub(crate) mod connections;
mod console;
pub(crate) mod document;
mod extract;
pub(crate) mod int64;
mod ops;
mod read;
pub(crate) mod scrape;
mod served;
mod unique;
mod watch;
mod write;

use std::{sync::Arc, time::Duration};

use tokio::sync::Semaphore;

use axum::{
    Router,
    extract::{DefaultBodyLimit, Request, State},
    http::{HeaderName, HeaderValue, Uri},
    middleware::{self, Next},
    response::{IntoResponse, Response},
};
use tower_http::{
    request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer},
    trace::{DefaultOnResponse, TraceLayer},
};
use utoipa::OpenApi;
use utoipa_axum::{router::OpenApiRouter, routes};

pub use crate::domain::writes::{BatchAddReply, BatchItem};
pub use write::{IDEMPOTENCY_KEY, REPLAYED};

use crate::{problem::Problem, state::AppState};

/// The header carrying each request's id (set if the client sent none,
/// echoed on the answer, and a field of every log line of the request).
pub const REQUEST_ID: &str = "x-request-id";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "counter-service",
        description = "Slotted counters over HTTP: idempotent adds, batch gets, rankings, series, \
                       unique counts. \
                       Every error is RFC 9457 problem details with a `kind`."
    ),
    // The data of `counts:watch`'s events: named in its description, typed
    // here (an event stream's body has no schema of its own).
    components(schemas(
        crate::domain::watch::WatchedValues,
        crate::domain::watch::WatchedRanking,
        crate::domain::watch::RankedTotal,
        crate::domain::watch::ClosedEvent,
        crate::domain::watch::Reason,
        admin::CheckReply,
        admin::CompactReply
    )),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    tags(
        (name = "counters", description = "Adds and observations"),
        (name = "counts", description = "Reads"),
        (name = "admin", description = "Maintenance on demand (admin scope)"),
        (name = "operations", description = "Probes, metrics, this document (no token)"),
    )
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        openapi
            .components
            .get_or_insert_default()
            .add_security_scheme(
                "bearer",
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
    }
}

/// What any `/v1/` call may answer, whatever the route: listed on every
/// such operation that does not say more, so a generated client knows each.
const COMMON_PROBLEMS: [(&str, &str); 7] = [
    ("401", "No token, or none that matches"),
    ("403", "The token lacks the scope or the namespace"),
    ("404", "No such namespace"),
    ("413", "A body over `max_body_bytes`"),
    (
        "429",
        "The token's rate is used up; `Retry-After` says when",
    ),
    (
        "500",
        "The database refused the request for good; no `Retry-After`",
    ),
    (
        "503",
        "Overloaded, timed out or the database unavailable; `Retry-After` says when (an add: retry with the same Idempotency-Key)",
    ),
];

/// Adds [`COMMON_PROBLEMS`] to every `/v1/` operation of `document`.
fn add_common_problems(document: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    for (path, item) in document.paths.paths.iter_mut() {
        if !path.starts_with("/v1/") {
            continue;
        }
        let operations = [
            &mut item.get,
            &mut item.post,
            &mut item.put,
            &mut item.delete,
        ];
        for operation in operations.into_iter().flatten() {
            for (status, description) in COMMON_PROBLEMS {
                operation
                    .responses
                    .responses
                    .entry(status.to_owned())
                    .or_insert_with(|| {
                        ResponseBuilder::new()
                            .description(description)
                            .content(
                                crate::problem::PROBLEM_JSON,
                                ContentBuilder::new()
                                    .schema(Some(Ref::from_schema_name("ProblemBody")))
                                    .build(),
                            )
                            .build()
                            .into()
                    });
            }
        }
    }
}

/// The routes and their OpenAPI document, registered together: a route
/// cannot exist without its entry.
fn routes() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let (router, mut document) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(write::add))
        .routes(routes!(write::add_and_get))
        .routes(routes!(write::batch_add))
        .routes(routes!(read::batch_get, read::batch_get_post))
        .routes(routes!(watch::watch))
        .routes(routes!(watch::top_watch))
        .routes(routes!(unique::observe))
        .routes(routes!(unique::batch_get, unique::batch_get_post))
        .routes(routes!(read::top))
        .routes(routes!(read::series))
        .routes(routes!(read::keys))
        .routes(routes!(read::namespaces))
        .routes(routes!(admin::check))
        .routes(routes!(admin::compact))
        .routes(routes!(admin::job))
        .routes(routes!(admin::jobs))
        .routes(routes!(admin::clear))
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        .routes(routes!(ops::metrics))
        .routes(routes!(ops::openapi))
        .split_for_parts();
    add_common_problems(&mut document);
    (router, document::complete(document))
}

/// The OpenAPI document of this version of the service.
pub fn openapi_document() -> utoipa::openapi::OpenApi {
    routes().1
}

/// The service's router over `state`.
pub(crate) fn router(state: AppState) -> Router {
    let (routes, openapi) = routes();
    let _ = state
        .openapi
        .set(openapi.to_pretty_json().unwrap_or_default());
    let request_id = HeaderName::from_static(REQUEST_ID);
    // The console is static files, not API: outside the document.
    let routes = match state.server.console {
        true => routes.merge(crate::api::console::routes()),
        false => routes,
    };
    let routes = routes
        .fallback(|uri: Uri| async move { Problem::no_route(uri.path()) })
        .method_not_allowed_fallback(|| async { Problem::method_not_allowed() })
        // Innermost first: the body bound, the deadline, the load shedding,
        // the figures, then the span and the id around everything. The
        // token, its rate, scope and namespace are each handler's first
        // extractor (`extract::Target`).
        .layer(DefaultBodyLimit::max(state.server.max_body_bytes))
        .layer(middleware::from_fn(int64::rewrite))
        .layer(middleware::from_fn_with_state(state.clone(), deadline))
        .layer(middleware::from_fn_with_state(
            Arc::new(Semaphore::new(state.server.max_concurrent_requests)),
            shed,
        ))
        .layer(middleware::from_fn(scrape::track))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            region_headers,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            close_when_draining,
        ))
        .layer(PropagateRequestIdLayer::new(request_id.clone()))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|request: &Request| {
                    let id = request
                        .headers()
                        .get(REQUEST_ID)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-");
                    tracing::info_span!(
                        "request",
                        method = %request.method(),
                        path = %request.uri().path(),
                        request_id = %id,
                        caller = tracing::field::Empty,
                    )
                })
                // Every answer is logged with its status at DEBUG, below
                // the default filter (`info`): at INFO each scrape, probe
                // and add would be a line, thousands a second under load,
                // burying what an operator must see. `/metrics` counts
                // every answer; `RUST_LOG=info,tower_http=debug` shows the
                // lines. A 5xx's cause is logged at WARN or ERROR where it
                // is known (`Problem`), inside this span, with its id. A
                // line per failure at ERROR would add one per shed
                // request, the moment the service can least afford it.
                .on_response(DefaultOnResponse::new().level(tracing::Level::DEBUG))
                .on_failure(()),
        )
        .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid));
    // Outermost: a preflight is answered before anything else runs.
    let routes = match cors(&state.server.cors_origins) {
        Some(cors) => routes.layer(cors),
        None => routes,
    };
    routes.with_state(state)
}

/// The CORS layer for `origins` (`server.cors_origins`), if any: the
/// methods and request headers the API takes, the answer headers a page may
/// read, preflights cached 10 minutes, never credentials.
fn cors(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use axum::http::{Method, header};
    use tower_http::cors::{AllowOrigin, CorsLayer};
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    let names = |names: &[&'static str]| -> Vec<HeaderName> {
        names.iter().map(|n| HeaderName::from_static(n)).collect()
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers(
                [header::AUTHORIZATION, header::CONTENT_TYPE, header::ACCEPT]
                    .into_iter()
                    .chain(names(&[
                        "idempotency-key",
                        "counter-read-from",
                        "last-event-id",
                        REQUEST_ID,
                    ]))
                    .collect::<Vec<_>>(),
            )
            .expose_headers(names(&[
                REQUEST_ID,
                "retry-after",
                "location",
                "idempotent-replayed",
                "counter-read-source",
                "counter-read-lag-ms",
                "counter-region",
                "counter-region-lag-ms",
            ]))
            .max_age(Duration::from_secs(600)),
    )
}

/// With `[region]`, tells every API answer's caller which region served it
/// and how fresh the other regions' shares are (`Counter-Region`,
/// `Counter-Region-Lag-Ms`; see [`served`]).
async fn region_headers(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some(region) = state
        .region
        .as_ref()
        .filter(|_| request.uri().path().starts_with("/v1/"))
    else {
        return next.run(request).await;
    };
    let region = region.clone();
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    if let Ok(name) = HeaderValue::from_str(region.region.name()) {
        headers.insert(served::REGION, name);
    }
    if let Some(lag) = region.oldest() {
        headers.insert(
            served::REGION_LAG_MS,
            HeaderValue::from(lag.as_millis() as u64),
        );
    }
    response
}

/// Sheds load: an API request beyond `server.max_concurrent_requests`
/// served at once is answered 503 `overloaded` at once, before its token
/// or body is read, so a flood costs the service almost nothing and the
/// admitted requests keep their latency (axum's `load_shed` over
/// `concurrency_limit`, answered as problem+json). Probes, `/metrics` and
/// `/openapi.json` are never shed: an orchestrator must see a busy
/// instance as alive.
async fn shed(State(limit): State<Arc<Semaphore>>, request: Request, next: Next) -> Response {
    if !request.uri().path().starts_with("/v1/") {
        return next.run(request).await;
    }
    match limit.try_acquire() {
        Ok(_place) => {
            let _serving = Serving::start();
            next.run(request).await
        }
        Err(_) => {
            metrics::counter!(crate::metrics::SHED, "bound" => "concurrent_requests").increment(1);
            Problem::overloaded("concurrent requests").into_response()
        }
    }
}

/// A request counted in `counter_service_requests_in_flight` while it
/// lives (also when axum drops its handler because the client left).
struct Serving(metrics::Gauge);

impl Serving {
    fn start() -> Self {
        let gauge = metrics::gauge!(crate::metrics::REQUESTS_IN_FLIGHT);
        gauge.increment(1);
        Self(gauge)
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.decrement(1);
    }
}

/// While the instance drains (`server.drain_ms`), every answer closes its
/// connection: a load balancer's pooled connection is never left idle on
/// an instance about to stop, where a request sent on it as it closes
/// would get no answer at all.
async fn close_when_draining(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = next.run(request).await;
    if state.draining() {
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    response
}

/// Answers 503 when a request outlives `server.request_timeout_ms`. A
/// write's transaction runs in a task of its own and ends whole either way:
/// the client retries with its Idempotency-Key and learns what happened.
async fn deadline(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let limit: Duration = state.server.request_timeout();
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => Problem::timeout(limit.as_millis() as u64).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    fn document() -> Value {
        serde_json::to_value(super::openapi_document()).unwrap()
    }

    fn operations(document: &Value) -> Vec<(String, String, &Value)> {
        let mut all = Vec::new();
        for (path, item) in document["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                all.push((method.clone(), path.clone(), operation));
            }
        }
        all
    }

    /// What a generated client trusts: each parameter where it is sent,
    /// every problem an authenticated call may meet, one id per operation.
    #[test]
    fn the_document_says_what_the_wire_carries() {
        let document = document();
        let mut ids = std::collections::HashSet::new();
        for (method, path, operation) in operations(&document) {
            let id = operation["operationId"].as_str().unwrap();
            assert!(
                ids.insert(id.to_owned()),
                "{method} {path}: operationId {id} twice"
            );
            for parameter in operation["parameters"].as_array().into_iter().flatten() {
                let (name, place) = (
                    parameter["name"].as_str().unwrap(),
                    parameter["in"].as_str().unwrap(),
                );
                let expected = match name {
                    "ns" | "id" => "path",
                    "Idempotency-Key" | "Counter-Read-From" | "Last-Event-ID" => "header",
                    _ => "query",
                };
                assert_eq!(place, expected, "{method} {path}: {name}");
            }
            if path.starts_with("/v1/") {
                for status in ["401", "403", "404", "413", "429", "500", "503"] {
                    let problem =
                        &operation["responses"][status]["content"]["application/problem+json"];
                    assert_eq!(
                        problem["schema"]["$ref"], "#/components/schemas/ProblemBody",
                        "{method} {path}: {status}"
                    );
                }
            }
        }
        // Owners and members: a string or an integer, not any object.
        let schemas = &document["components"]["schemas"];
        for name in ["OwnerValue", "MemberValue"] {
            let kinds: Vec<&str> = schemas[name]["oneOf"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["type"].as_str().unwrap())
                .collect();
            assert_eq!(kinds, ["string", "integer"], "{name}");
        }
        let text = document.to_string();
        assert!(
            !text.contains(r#""owner":{"type":"object""#),
            "an owner typed object"
        );
        assert_eq!(
            schemas["AddRequest"]["properties"]["owner"]["$ref"],
            "#/components/schemas/OwnerValue"
        );
        assert_eq!(
            schemas["Observation"]["properties"]["member"]["$ref"],
            "#/components/schemas/MemberValue"
        );
    }

    /// The bodies on the wire are the documented types, serialized.
    #[test]
    fn problems_serialize_as_the_documented_body() {
        let problem = crate::problem::Problem::over_bound("batch items", 10, 11).document();
        let fields: Vec<&String> = problem.as_object().unwrap().keys().collect();
        for field in ["type", "title", "status", "detail", "kind", "bound", "max"] {
            assert!(problem.get(field).is_some(), "{field} missing: {fields:?}");
        }
        // The fixed members, and room for the extension members (utoipa
        // writes the flattened map as an `allOf` part).
        let documented = document()["components"]["schemas"]["ProblemBody"].clone();
        let parts = documented["allOf"]
            .as_array()
            .cloned()
            .unwrap_or(vec![documented.clone()]);
        for field in ["type", "title", "status", "detail", "kind"] {
            assert!(
                parts.iter().any(|p| p["properties"].get(field).is_some()),
                "{field} undocumented: {documented}"
            );
        }
        assert!(
            parts.iter().all(|p| p["additionalProperties"] != false),
            "{documented}"
        );
    }
}
