//! `/healthz`, `/readyz`, `/metrics` and `/openapi.json`: open to anyone
//! who reaches the port (put the port behind the network's own controls).

use crate::{domain::health::Readiness, state::AppState};
use axum::{
    extract::State,
    http::{HeaderValue, StatusCode, header::CONTENT_TYPE},
    response::{IntoResponse, Response},
};

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
    let body = state.readiness().await;
    let status = if body.status == "ready" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

/// Prometheus metrics, in its text format.
#[utoipa::path(operation_id = "metrics", get, path = "/metrics", tag = "operations", responses((status = 200, description = "Prometheus text", body = String)))]
pub(crate) async fn metrics(State(state): State<AppState>) -> Response {
    state.readiness().await.record();
    (
        [(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        super::scrape::render(&state),
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
