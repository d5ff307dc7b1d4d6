//! Prometheus metrics: requests by route and status with latency
//! histograms (a middleware), batch sizes and check drift (where they
//! happen), cache and consumer figures (read when scraped).
//!
//! Every metric is described once, when the recorder is installed
//! ([`describe`]): a `# HELP` line is what an operator meeting a series in
//! Prometheus or Grafana reads to learn what it counts.

use std::{sync::OnceLock, time::Instant};

use axum::{
    extract::{MatchedPath, Request},
    middleware::Next,
    response::Response,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::state::AppState;

/// Requests committed per add group (group commit's effect: the database
/// work of one transaction shared by this many requests).
pub(crate) const ADD_GROUP_REQUESTS: &str = "counter_service_add_group_requests";

/// Requests refused at once by a bound of the service (label `bound`:
/// `concurrent_requests` or `queued_items`), answered 503 `overloaded`.
pub(crate) const SHED: &str = "counter_service_shed_total";
/// API requests being served now (of `server.max_concurrent_requests`).
pub(crate) const REQUESTS_IN_FLIGHT: &str = "counter_service_requests_in_flight";
/// Adds dropped unrun because their caller had gone before their group.
pub(crate) const ADDS_SKIPPED: &str = "counter_service_adds_skipped_total";
/// Requests committed per observe group (see [`ADD_GROUP_REQUESTS`]).
pub(crate) const OBSERVE_GROUP_REQUESTS: &str = "counter_service_observe_group_requests";
/// Observes dropped unrun because their caller had gone before their group.
pub(crate) const OBSERVES_SKIPPED: &str = "counter_service_observes_skipped_total";

/// Problem answers by `kind` (the problem document's), whatever route or
/// status: what the dashboard's "errors by kind" and the error-rate alert
/// read.
pub(crate) const ERRORS: &str = "counter_service_errors_total";
/// 1 while `/readyz` would answer 200, read at each scrape.
pub(crate) const READY: &str = "counter_service_ready";
/// 1 while a dependency answers (label `dependency`: `database`, `cache`,
/// `broker`), read at each scrape as `/readyz` reads it.
pub(crate) const DEPENDENCY_UP: &str = "counter_service_dependency_up";

/// Owners a check found drifted from their truth (labels `namespace`,
/// `key`). Exported at 0 for every checked key from the first scrape, so
/// that the first drift after a start is a rise `increase()` sees.
pub(crate) const CHECK_OWNERS_DRIFTED: &str = "counter_service_check_owners_drifted_total";
/// The drift a check found, summed over owners (`|truth - total|`).
pub(crate) const CHECK_DRIFT: &str = "counter_service_check_drift_total";

/// Owners a batch get served from Redis, since start: a counter, so that
/// `rate()` over a window gives that window's hit ratio with
/// [`CACHE_MISSES`] (a ratio since start hides a cache that stopped
/// serving an hour ago behind a week of hits).
pub(crate) const CACHE_HITS: &str = "counter_service_cache_hits_total";
/// Owners a batch get did not find (whole) in Redis, since start.
pub(crate) const CACHE_MISSES: &str = "counter_service_cache_misses_total";

/// Connections open now.
pub(crate) const CONNECTIONS_OPEN: &str = "counter_service_connections_open";
/// Connections closed at the cap to make room for a new one.
pub(crate) const CONNECTIONS_EVICTED: &str = "counter_service_connections_evicted_total";
/// Connections refused at the cap, every open one serving a request.
pub(crate) const CONNECTIONS_REFUSED: &str = "counter_service_connections_refused_total";

/// The process's recorder, installed once (a process may run several
/// services, as the tests do; they share it).
pub(crate) fn handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(&[
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0,
                ])
                .expect("static buckets are valid")
                .set_buckets_for_metric(
                    Matcher::Suffix("_group_requests".into()),
                    &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0],
                )
                .expect("static buckets are valid")
                .build_recorder();
            let handle = recorder.handle();
            // Another recorder already installed (an embedding program's)
            // keeps the facade's calls; this handle then renders nothing.
            let _ = metrics::set_global_recorder(recorder);
            describe();
            handle
        })
        .clone()
}

/// A `# HELP` text for every metric the service exports, given to the
/// installed recorder once (descriptions are kept by name, whichever
/// service of the process records the series). The HTTP test
/// `every_metric_has_help` scrapes after traffic and fails on a family
/// without one, so a metric added without a line here is caught.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        crate::replicas::READS,
        "Reads served, by op (batchGet, top, series, uniquesBatchGet) and source (primary, replica, cache)."
    );
    describe_counter!(
        crate::replicas::REPLICA_FALLBACKS,
        "Lag-tolerant reads the primary served instead, by reason: lag (no standby within the bound) or error (the standby failed the read)."
    );
    describe_gauge!(
        crate::replicas::REPLICA_LAG,
        "Each standby's lag behind the primary's flushed WAL as last measured, in seconds; -1 while unknown (down, promoted, or further behind than any probe kept)."
    );
    describe_counter!(
        "counter_service_requests_total",
        "HTTP requests answered, by matched route, method and status."
    );
    describe_histogram!(
        "counter_service_request_duration_seconds",
        "Time to answer an HTTP request, by matched route and method."
    );
    describe_histogram!(
        "counter_service_batch_size",
        "Items per batch request, by op (batchAdd, batchGet owners x keys, observe, uniquesBatchGet)."
    );
    describe_histogram!(
        ADD_GROUP_REQUESTS,
        "Add requests committed together in one transaction (group commit)."
    );
    describe_histogram!(
        OBSERVE_GROUP_REQUESTS,
        "Observe requests committed together in one transaction."
    );
    describe_counter!(
        "counter_service_rate_limited_total",
        "Requests refused with 429 because the token's rate was used up, by token."
    );
    describe_counter!(
        SHED,
        "Requests refused at once with 503 overloaded, by the bound reached (concurrent_requests, queued_items)."
    );
    describe_gauge!(
        REQUESTS_IN_FLIGHT,
        "API requests being served now (of server.max_concurrent_requests)."
    );
    describe_counter!(
        ADDS_SKIPPED,
        "Adds dropped before their group ran because their caller had gone (nothing applied)."
    );
    describe_counter!(
        OBSERVES_SKIPPED,
        "Observes dropped before their group ran because their caller had gone (nothing applied)."
    );
    describe_counter!(
        ERRORS,
        "Problem answers (4xx and 5xx), by the problem document's kind."
    );
    describe_gauge!(
        READY,
        "1 while /readyz would answer 200 (the database answers, the consumer runs), else 0; read at each scrape."
    );
    describe_gauge!(
        DEPENDENCY_UP,
        "1 while a dependency answers, else 0, by dependency (database, cache, broker); read at each scrape."
    );
    describe_gauge!(CONNECTIONS_OPEN, "HTTP connections open now.");
    describe_counter!(
        CONNECTIONS_EVICTED,
        "Idle connections closed at server.max_connections to make room for a new one."
    );
    describe_counter!(
        CONNECTIONS_REFUSED,
        "Connections refused at server.max_connections, every open one serving a request."
    );
    describe_counter!(
        CHECK_OWNERS_DRIFTED,
        "Owners a check found differing from their truth, by namespace and key (0 from start for every checked key)."
    );
    describe_counter!(
        CHECK_DRIFT,
        "The drift a check found, the sum of |truth - total| over owners, by namespace and key."
    );
    describe_counter!(
        crate::freshness::UNCONFIRMED,
        "Answers to writes sent before Redis confirmed their cache deletions (after 500 ms)."
    );
}

/// How often the recorder's histogram samples are folded into buckets.
const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Folds the recorder's histogram samples into their buckets on a timer.
/// The recorder keeps every sample until it renders; without this a
/// service that nobody scrapes would keep one sample per request forever.
pub(crate) async fn upkeep(handle: PrometheusHandle, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(UPKEEP_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => handle.run_upkeep(),
            _ = stop.changed() => return,
        }
    }
}

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

/// Sets the readiness gauges from one `/readyz` check.
pub(crate) fn record_readiness(readiness: &crate::api::ops::Readiness) {
    metrics::gauge!(READY).set(f64::from(u8::from(readiness.status == "ready")));
    let dependencies = [
        ("database", Some(&readiness.database)),
        ("cache", readiness.cache.as_ref()),
        ("broker", readiness.broker.as_ref()),
    ];
    for (name, dependency) in dependencies {
        if let Some(dependency) = dependency {
            metrics::gauge!(DEPENDENCY_UP, "dependency" => name)
                .set(f64::from(u8::from(dependency.ok)));
        }
    }
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
