//! `counters:add`, `counters:addAndGet` and `counters:batchAdd`: every add
//! is one transaction, applied exactly once per id (see
//! [`idempotency`](crate::domain::idempotency)).

use axum::{
    extract::State,
    http::{HeaderMap, HeaderValue, header::CONTENT_TYPE},
    response::{IntoResponse, Response},
};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::extract::{Adding, Json, Target};
use crate::{
    domain::{
        adds::{Op, Outcome},
        admission::Arrival,
        idempotency,
        schema::OwnerValue,
        writes::{AddAndGetReply, AddReply, BatchAddReply, BatchItem, apply},
    },
    problem::{Problem, ProblemBody},
    state::AppState,
};

/// The header of a retry-safe add.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Set on an answer replayed to a retry.
pub const REPLAYED: &str = "idempotent-replayed";

/// One delta.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddRequest {
    /// The owner: a string, or for an integer namespace a number too.
    #[schema(value_type = OwnerValue)]
    pub owner: Value,
    /// A declared key, or one matching the namespace's key patterns.
    pub key: String,
    /// The amount added (negative subtracts); default 1. A decimal string
    /// is taken too.
    #[serde(
        default = "crate::domain::writes::one",
        deserialize_with = "crate::domain::writes::int64"
    )]
    pub delta: i64,
    /// When the event happened, for a windowed key's bucket (RFC 3339;
    /// default now).
    pub at: Option<DateTime<Utc>>,
}

/// An add is a batch of one item, whose id is the request's key.
impl From<AddRequest> for BatchItem {
    fn from(request: AddRequest) -> Self {
        Self {
            id: None,
            owner: request.owner,
            key: request.key,
            delta: request.delta,
            at: request.at,
        }
    }
}

/// A batch of deltas, applied all or nothing.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchAddRequest {
    /// At most `server.max_batch_items`.
    pub items: Vec<BatchItem>,
}

/// Adds `delta` to one counter.
///
/// With an `Idempotency-Key` the add is applied exactly once while the key
/// is kept (`idempotency.retention_hours`, 24 by default): a retry gets the
/// first answer, marked `Idempotent-Replayed: true`; the same key with
/// another request is 409. Without one, a client that retries after a
/// timeout may count twice.
#[utoipa::path(
    operation_id = "add",
    post,
    path = "/v1/{ns}/counters:add",
    tag = "counters",
    params(
        ("ns" = String, Path, description = "The namespace"),
        ("Idempotency-Key" = Option<String>, Header, description = "Makes the add retry-safe"),
    ),
    request_body = AddRequest,
    responses(
        (status = 200, description = "Committed (or replayed)", body = AddReply),
        (status = 400, description = "Bad input", body = ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "No valid token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 403, description = "Outside the token's scopes", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such namespace", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "Key reused with another request, or overflow", body = ProblemBody, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = ProblemBody, content_type = "application/problem+json"),
        (status = 429, description = "Rate limited", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable or timeout: retry with the same key", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn add(
    State(state): State<AppState>,
    target: Target<Adding>,
    arrival: Arrival,
    headers: HeaderMap,
    Json(request): Json<AddRequest>,
) -> Result<Response, Problem> {
    let items = vec![request.into()];
    write(state, target, arrival, &headers, Op::Add, items).await
}

/// Adds `delta` to one counter and answers its new total (idempotent like
/// `counters:add`).
#[utoipa::path(
    operation_id = "addAndGet",
    post,
    path = "/v1/{ns}/counters:addAndGet",
    tag = "counters",
    params(
        ("ns" = String, Path, description = "The namespace"),
        ("Idempotency-Key" = Option<String>, Header, description = "Makes the add retry-safe"),
    ),
    request_body = AddRequest,
    responses(
        (status = 200, description = "Committed; the total after it", body = AddAndGetReply),
        (status = 400, description = "Bad input", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "Key reused, or overflow", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn add_and_get(
    State(state): State<AppState>,
    target: Target<Adding>,
    arrival: Arrival,
    headers: HeaderMap,
    Json(request): Json<AddRequest>,
) -> Result<Response, Problem> {
    let items = vec![request.into()];
    write(state, target, arrival, &headers, Op::AddAndGet, items).await
}

/// Applies many deltas in one transaction, all or nothing. Items with an
/// `id` are applied once per id (a retried batch applies only what it did
/// not before); an `Idempotency-Key` makes the whole request replay its
/// first answer.
#[utoipa::path(
    operation_id = "batchAdd",
    post,
    path = "/v1/{ns}/counters:batchAdd",
    tag = "counters",
    params(
        ("ns" = String, Path, description = "The namespace"),
        ("Idempotency-Key" = Option<String>, Header, description = "Makes the request retry-safe"),
    ),
    request_body = BatchAddRequest,
    responses(
        (status = 200, description = "Committed", body = BatchAddReply),
        (status = 400, description = "Bad input, or over `max_batch_items`", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "An id reused with another item, or overflow", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn batch_add(
    State(state): State<AppState>,
    target: Target<Adding>,
    arrival: Arrival,
    headers: HeaderMap,
    Json(request): Json<BatchAddRequest>,
) -> Result<Response, Problem> {
    let max = state.server.max_batch_items;
    if request.items.is_empty() || request.items.len() > max {
        return Err(Problem::out_of_range(
            "batch items",
            1,
            max,
            request.items.len(),
        ));
    }
    metrics::histogram!("counter_service_batch_size", "op" => "batchAdd")
        .record(request.items.len() as f64);
    write(state, target, arrival, &headers, Op::Batch, request.items).await
}

async fn write(
    state: AppState,
    target: Target<Adding>,
    arrival: Arrival,
    headers: &HeaderMap,
    op: Op,
    items: Vec<BatchItem>,
) -> Result<Response, Problem> {
    let namespace = target.namespace(&state);
    let key = idempotency_key(headers)?;
    let request_id = headers
        .get(super::REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let source = namespace.source_for(target.caller.token());
    respond(apply(namespace, source, key, request_id, arrival, op, items).await?)
}

/// The `Idempotency-Key` header, checked.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, Problem> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Problem::bad_request("send one Idempotency-Key header"));
    }
    let key = value
        .to_str()
        .map_err(|_| Problem::bad_request("the Idempotency-Key is not ASCII"))?;
    // The draft's form is a quoted string; a bare token is accepted too.
    let key = key
        .strip_prefix('"')
        .and_then(|k| k.strip_suffix('"'))
        .unwrap_or(key);
    idempotency::check_id(key)?;
    Ok(Some(key.to_owned()))
}

/// The answer's response: JSON, marked when replayed. The add ran in the
/// namespace's add queue, whose workers are tasks of their own: a client
/// that goes away does not stop it halfway, and its retry finds the answer.
fn respond(outcome: Outcome) -> Result<Response, Problem> {
    let mut response = (
        [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        outcome.body,
    )
        .into_response();
    if outcome.replayed {
        response
            .headers_mut()
            .insert(REPLAYED, HeaderValue::from_static("true"));
    }
    Ok(response)
}
