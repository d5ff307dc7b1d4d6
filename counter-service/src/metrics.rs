//! Prometheus metrics: the names the other layers record under, their
//! `# HELP` texts, and the process's recorder. What records them lives
//! where it happens (the request middleware and the scrape's own figures
//! in `api::scrape`, group sizes in `domain::adds`, drift in
//! `domain::check`).
//!
//! Every metric is described once, when the recorder is installed
//! ([`describe`]): a `# HELP` line is what an operator meeting a series in
//! Prometheus or Grafana reads to learn what it counts.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Requests committed per add group (group commit's effect: the database
/// work of one transaction shared by this many requests).
pub(crate) const ADD_GROUP_REQUESTS: &str = "counter_service_add_group_requests";

/// Requests refused at once by a bound of the service (label `bound`:
/// `concurrent_requests`, `queued_items` or `queue_wait`), answered 503
/// `overloaded`.
pub(crate) const SHED: &str = "counter_service_shed_total";
/// The wait a queue expected for the last request it was asked to admit
/// (labels `namespace`, `queue`: `add` or `observe`), in seconds; 0 while
/// it is idle. Above `server.max_queue_wait_ms`, requests are shed.
pub(crate) const QUEUE_EXPECTED_WAIT: &str = "counter_service_queue_expected_wait_seconds";
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

/// Reads served, by `op` and `source` (`primary`, `replica`, `cache`).
pub(crate) const READS: &str = "counter_service_reads_total";
/// Lag-tolerant reads the primary served, by `reason`: `lag` (no standby
/// within the bound) or `error` (the standby failed the read).
pub(crate) const REPLICA_FALLBACKS: &str = "counter_service_replica_fallbacks_total";
/// Each standby's lag as last measured (label `replica`), in seconds; -1
/// while it is unknown (unreachable, promoted, or behind every probe kept).
pub(crate) const REPLICA_LAG: &str = "counter_service_replica_lag_seconds";
/// Each other region's heartbeat age here (label `region`), in seconds: how
/// stale its share of a total may be (`[region]`).
pub(crate) const REGION_LAG: &str = "counter_service_region_lag_seconds";
/// Answers that went out before Redis confirmed their deletions.
pub(crate) const UNCONFIRMED: &str = "counter_service_cache_unconfirmed_answers_total";

/// `counts:watch` streams open now.
pub(crate) const WATCH_STREAMS: &str = "counter_service_watch_streams";
/// Events sent on watch streams, by `kind` (`snapshot`, `change`, `closed`).
pub(crate) const WATCH_EVENTS: &str = "counter_service_watch_events_total";
/// Watch streams the service ended, by `reason` (`slow_consumer`, `draining`).
pub(crate) const WATCH_CLOSED: &str = "counter_service_watch_closed_total";
/// Messages of the watch bus, by `direction` (`sent`, `received`).
pub(crate) const WATCH_BUS_MESSAGES: &str = "counter_service_watch_bus_messages_total";
/// Sends and listens of the watch bus that failed.
pub(crate) const WATCH_BUS_ERRORS: &str = "counter_service_watch_bus_errors_total";

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
        READS,
        "Reads served, by op (batchGet, top, series, uniquesBatchGet) and source (primary, replica, cache)."
    );
    describe_counter!(
        REPLICA_FALLBACKS,
        "Lag-tolerant reads the primary served instead, by reason: lag (no standby within the bound) or error (the standby failed the read)."
    );
    describe_gauge!(
        REPLICA_LAG,
        "Each standby's lag behind the primary's flushed WAL as last measured, in seconds; -1 while unknown (down, promoted, or further behind than any probe kept)."
    );
    describe_gauge!(
        REGION_LAG,
        "Each other region's latest heartbeat applied here by replication, its age in seconds: how stale that region's share of a total may be. Grows without bound while replication is cut."
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
        "Requests refused at once with 503 overloaded, by the bound reached (concurrent_requests, queued_items, queue_wait)."
    );
    describe_gauge!(
        QUEUE_EXPECTED_WAIT,
        "The wait a namespace's add or observe queue expected for the last request it was asked to admit, in seconds (0 while idle); above server.max_queue_wait_ms requests are shed."
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
    describe_gauge!(WATCH_STREAMS, "counts:watch streams open now.");
    describe_counter!(
        WATCH_EVENTS,
        "Events sent on counts:watch streams, by kind (snapshot, change, closed)."
    );
    describe_counter!(
        WATCH_CLOSED,
        "counts:watch streams the service ended, by reason (slow_consumer: the client did not take what it was sent; draining: a shutdown)."
    );
    describe_counter!(
        WATCH_BUS_MESSAGES,
        "Messages of the bus that tells other instances which owners changed, by direction (sent, received)."
    );
    describe_counter!(
        WATCH_BUS_ERRORS,
        "Sends and listens of the watch bus that failed (watchers then catch up at the next poll)."
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
        UNCONFIRMED,
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
