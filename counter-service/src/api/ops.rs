//! `/healthz`, `/readyz`, `/metrics` and `/openapi.json`: open to anyone
//! who reaches the port (put the port behind the network's own controls).

use std::time::Duration;

use axum::{
    extract::State,
    http::{HeaderValue, StatusCode, header::CONTENT_TYPE},
    response::{IntoResponse, Response},
};
use serde::Serialize;
use utoipa::ToSchema;

use crate::state::AppState;

/// One dependency's state.
#[derive(Debug, Serialize, ToSchema)]
pub struct Dependency {
    /// Whether it answered.
    pub ok: bool,
    /// What went wrong, or a figure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Readiness, per dependency.
#[derive(Debug, Serialize, ToSchema)]
pub struct Readiness {
    /// `ready`; `unready` (a dependency it needs is down, or the database
    /// takes no writes); `draining` (the instance is shutting down: send
    /// requests elsewhere).
    pub status: String,
    /// The database: needed.
    pub database: Dependency,
    /// The cache, if configured: reads fall back to the database without it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<Dependency>,
    /// The queue consumer, if configured: needed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broker: Option<Dependency>,
}

/// Alive: the process answers.
#[utoipa::path(operation_id = "healthz", get, path = "/healthz", tag = "operations", responses((status = 200, description = "Alive", body = String)))]
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

/// Ready: the database answers and takes writes (and the consumer runs, if
/// configured); the cache is reported but not required.
#[utoipa::path(
    operation_id = "readyz",
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready", body = Readiness),
        (status = 503, description = "Not ready", body = Readiness),
    )
)]
pub(crate) async fn readyz(State(state): State<AppState>) -> Response {
    let body = readiness(&state).await;
    let status = if body.status == "ready" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

/// Each dependency asked once, with its timeout: what `/readyz` answers
/// and each scrape of `/metrics` records.
pub(crate) async fn readiness(state: &AppState) -> Readiness {
    // A standby answers pings: ask whether it takes writes, which every
    // add needs (a demoted primary in a failover, a replica's address).
    let writable = counter_core::accepts_writes(&state.db);
    let database = match tokio::time::timeout(Duration::from_secs(2), writable).await {
        Ok(Ok(true)) => Dependency {
            ok: true,
            detail: None,
        },
        Ok(Ok(false)) => Dependency {
            ok: false,
            detail: Some("the server takes no writes (a standby, or read-only)".into()),
        },
        Ok(Err(e)) => Dependency {
            ok: false,
            detail: Some(e.to_string()),
        },
        Err(_) => Dependency {
            ok: false,
            detail: Some("no answer within 2 s".into()),
        },
    };
    let cache = match &state.cache {
        None => None,
        Some(cache) => Some(ping_cache(cache).await),
    };
    let broker = state.feed.as_ref().map(|feed| {
        let stats = feed.stats();
        Dependency {
            ok: feed.running(),
            detail: Some(format!(
                "{}: {} applied, lag {}",
                feed.broker,
                stats.applied,
                stats
                    .lag
                    .map_or_else(|| "unknown".to_owned(), |l| l.to_string())
            )),
        }
    });
    let ready = database.ok && broker.as_ref().is_none_or(|b| b.ok);
    let status = if state.draining() {
        "draining"
    } else if ready {
        "ready"
    } else {
        "unready"
    };
    Readiness {
        status: status.into(),
        database,
        cache,
        broker,
    }
}

async fn ping_cache(cache: &counter_redis::CountCache) -> Dependency {
    match cache.ping(Duration::from_secs(1)).await {
        Ok(()) => Dependency {
            ok: true,
            detail: None,
        },
        Err(e) => Dependency {
            ok: false,
            detail: Some(format!("{e}; reads go to the database")),
        },
    }
}

/// Prometheus metrics, in its text format.
#[utoipa::path(operation_id = "metrics", get, path = "/metrics", tag = "operations", responses((status = 200, description = "Prometheus text", body = String)))]
pub(crate) async fn metrics(State(state): State<AppState>) -> Response {
    crate::metrics::record_readiness(&readiness(&state).await);
    (
        [(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        crate::metrics::render(&state),
    )
        .into_response()
}

/// This API's OpenAPI 3.1 document.
#[utoipa::path(operation_id = "openapi", get, path = "/openapi.json", tag = "operations", responses((status = 200, description = "The OpenAPI document", body = Object)))]
pub(crate) async fn openapi(State(state): State<AppState>) -> Response {
    (
        [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        state.openapi.get().cloned().unwrap_or_default(),
    )
        .into_response()
}
