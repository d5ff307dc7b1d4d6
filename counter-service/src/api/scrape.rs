//! What `/metrics` answers (the recorder's text, then the cache's and the
//! consumer's own figures), and the middleware counting every request.

use std::{
    collections::HashMap,
    sync::{LazyLock, RwLock},
    time::Instant,
};

use axum::{
    extract::{MatchedPath, Request},
    http::Method,
    middleware::Next,
    response::Response,
};

use super::extract::Received;
use crate::{
    metrics::{CACHE_HITS, CACHE_MISSES, CHECK_DRIFT, CHECK_OWNERS_DRIFTED},
    state::AppState,
};

/// The middleware counting each request by route, method and status. The
/// instant it starts is the request's [`Received`] stamp.
pub(crate) async fn track(mut request: Request, next: Next) -> Response {
    let start = Instant::now();
    request.extensions_mut().insert(Received(start));
    let route = request.extensions().get::<MatchedPath>().cloned();
    let method = method_label(request.method());
    let response = next.run(request).await;
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    let (requests, duration) = handles(route, method, response.status().as_u16());
    requests.increment(1);
    duration.record(start.elapsed().as_secs_f64());
    response
}

/// A method's label: an extension method (any token a client sends) is
/// `OTHER`, so no caller grows the series without bound.
fn method_label(method: &Method) -> &'static str {
    const STANDARD: [Method; 9] = [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
        Method::HEAD,
        Method::OPTIONS,
        Method::TRACE,
        Method::CONNECT,
    ];
    STANDARD
        .iter()
        .find(|standard| *standard == method)
        .map_or("OTHER", |standard| standard.as_str())
}

/// A route's request counter and duration histogram for one method and
/// status.
type Handles = (metrics::Counter, metrics::Histogram);

/// Each route's handles, by method and status, resolved once: resolving
/// one builds its labels (three strings) and looks it up in the recorder's
/// registry, on every request otherwise. Process-wide, as the recorder is.
static HANDLES: LazyLock<RwLock<HashMap<String, ByMethodStatus>>> = LazyLock::new(RwLock::default);

/// One route's handles by method label and status.
type ByMethodStatus = HashMap<(&'static str, u16), Handles>;

/// The handles of `route`, `method` and `status`, resolved on first use.
fn handles(route: &str, method: &'static str, status: u16) -> Handles {
    let read = HANDLES.read().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = read.get(route).and_then(|by| by.get(&(method, status))) {
        return found.clone();
    }
    drop(read);
    let resolved: Handles = (
        metrics::counter!(
            "counter_service_requests_total",
            "route" => route.to_owned(),
            "method" => method,
            "status" => status.to_string()
        ),
        metrics::histogram!(
            "counter_service_request_duration_seconds",
            "route" => route.to_owned(),
            "method" => method
        ),
    );
    HANDLES
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .entry(route.to_owned())
        .or_default()
        .insert((method, status), resolved.clone());
    resolved
}

/// Renders the recorder's metrics, then the figures this service reads
/// from its cache and its consumer when scraped.
pub(crate) fn render(state: &AppState) -> String {
    // Every checked key's drift counters, at 0 until a check finds drift.
    // A counter that first appears already above 0 (the first drift after
    // a start) has no earlier sample, so `increase()` would read 0 and the
    // drift alert stay quiet: present from the first scrape, its first
    // rise is seen. (`increment(0)` registers the series, changing nothing.)
    for namespace in state.namespaces.values() {
        for key in namespace.checks.keys() {
            for name in [CHECK_OWNERS_DRIFTED, CHECK_DRIFT] {
                metrics::counter!(name, "namespace" => namespace.name.clone(), "key" => key.clone())
                    .increment(0);
            }
        }
    }
    let mut text = state.metrics.render();
    text.push_str(&scraped(state));
    text
}

/// The cache's and the consumer's own figures, written as exposition text
/// from this service's state rather than through the recorder: the
/// recorder is the process's, and two services in one process (an
/// embedding program, the tests) would otherwise show each other's totals
/// (`Counter::absolute` keeps the larger, a gauge the last written).
fn scraped(state: &AppState) -> String {
    let mut out = String::new();
    if let Some(cache) = &state.cache {
        let stats = cache.stats();
        family(
            &mut out,
            CACHE_HITS,
            "counter",
            "Owners a batch get served from Redis. Hit ratio over a window: rate of this over rate of it plus counter_service_cache_misses_total.",
            Some(stats.hits),
        );
        family(
            &mut out,
            CACHE_MISSES,
            "counter",
            "Owners a batch get did not find whole in Redis (read from the database).",
            Some(stats.misses),
        );
        family(
            &mut out,
            "counter_service_cache_redis_errors",
            "gauge",
            "Redis operations that failed or timed out, since start.",
            Some(stats.redis_errors),
        );
        // Deletions after a commit that Redis did not confirm in time, and
        // those still owed: while owed, other instances may read the old
        // total (see the service guide's read-your-write).
        family(
            &mut out,
            "counter_service_cache_invalidation_failures",
            "gauge",
            "Cache deletions after a commit that Redis did not confirm in time, since start.",
            Some(stats.invalidation_failures),
        );
        family(
            &mut out,
            "counter_service_cache_invalidations_pending",
            "gauge",
            "Cache deletions still owed: other instances may read an old total until they land.",
            Some(stats.invalidations_pending),
        );
    }
    if let Some(feed) = &state.feed {
        let stats = feed.stats();
        family(
            &mut out,
            "counter_service_consumer_lag",
            "gauge",
            "Messages waiting in the broker for the queue consumer (absent until the broker says).",
            stats.lag,
        );
        family(
            &mut out,
            "counter_service_consumer_applied",
            "gauge",
            "Queue messages whose deltas the consumer applied, since start.",
            Some(stats.applied),
        );
        family(
            &mut out,
            "counter_service_consumer_duplicates",
            "gauge",
            "Queue messages skipped as applied before (redeliveries, replays), since start.",
            Some(stats.duplicates_skipped),
        );
        family(
            &mut out,
            "counter_service_consumer_rejected",
            "gauge",
            "Queue messages refused for good (malformed, unknown key or owner), since start.",
            Some(stats.rejected),
        );
    }
    out
}

/// One family of one unlabelled sample, with its `# HELP` and `# TYPE`
/// (the sample left out while `value` is unknown).
fn family(out: &mut String, name: &str, kind: &str, help: &str, value: Option<u64>) {
    use std::fmt::Write;
    let Some(value) = value else { return };
    let _ = write!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n\n"
    );
}
