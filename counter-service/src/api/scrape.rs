//! What `/metrics` answers (the recorder's text, then the cache's and the
//! consumer's own figures), and the middleware counting every request.

use std::time::Instant;

use axum::{
    extract::{MatchedPath, Request},
    middleware::Next,
    response::Response,
};

use crate::{
    metrics::{CACHE_HITS, CACHE_MISSES, CHECK_DRIFT, CHECK_OWNERS_DRIFTED},
    state::AppState,
};

/// The middleware counting each request by route, method and status.
pub(crate) async fn track(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = request.method().as_str().to_owned();
    let start = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!("counter_service_requests_total", "route" => route.clone(), "method" => method.clone(), "status" => status)
        .increment(1);
    metrics::histogram!("counter_service_request_duration_seconds", "route" => route, "method" => method)
        .record(start.elapsed().as_secs_f64());
    response
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
