//! Prometheus metrics: requests by route and status with latency
//! histograms (a middleware), batch sizes and check drift (where they
//! happen), cache and consumer figures (read when scraped).

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
            handle
        })
        .clone()
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

/// Sets the gauges read from the cache and the consumer, then renders.
pub(crate) fn render(state: &AppState) -> String {
    if let Some(cache) = &state.cache {
        let stats = cache.stats();
        metrics::gauge!("counter_service_cache_hits").set(stats.hits as f64);
        metrics::gauge!("counter_service_cache_misses").set(stats.misses as f64);
        let reads = stats.hits + stats.misses;
        if reads > 0 {
            metrics::gauge!("counter_service_cache_hit_ratio")
                .set(stats.hits as f64 / reads as f64);
        }
        metrics::gauge!("counter_service_cache_redis_errors").set(stats.redis_errors as f64);
        // Deletions after a commit that Redis did not confirm in time, and
        // those still owed: while owed, other instances may read the old
        // total (see the service guide's read-your-write).
        metrics::gauge!("counter_service_cache_invalidation_failures")
            .set(stats.invalidation_failures as f64);
        metrics::gauge!("counter_service_cache_invalidations_pending")
            .set(stats.invalidations_pending as f64);
    }
    if let Some(feed) = &state.feed {
        let stats = feed.stats();
        if let Some(lag) = stats.lag {
            metrics::gauge!("counter_service_consumer_lag").set(lag as f64);
        }
        metrics::gauge!("counter_service_consumer_applied").set(stats.applied as f64);
        metrics::gauge!("counter_service_consumer_duplicates").set(stats.duplicates_skipped as f64);
        metrics::gauge!("counter_service_consumer_rejected").set(stats.rejected as f64);
    }
    state.metrics.render()
}
