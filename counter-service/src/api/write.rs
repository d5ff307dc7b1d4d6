//! `counters:add`, `counters:addAndGet` and `counters:batchAdd`: every add
//! is one transaction, applied exactly once per id (see
//! [`idempotency`](crate::idempotency)).

use axum::{
    extract::State,
    http::{HeaderMap, HeaderValue, header::CONTENT_TYPE},
    response::{IntoResponse, Response},
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::extract::{Adding, Json, Target};
use super::schema::OwnerValue;
use crate::{
    adds::{Item, Op, Outcome, Write},
    dispatch, idempotency,
    namespace::Namespace,
    owner::ServiceOwner,
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
    /// The amount added (negative subtracts); default 1.
    #[serde(default = "one")]
    pub delta: i64,
    /// When the event happened, for a windowed key's bucket (RFC 3339;
    /// default now).
    pub at: Option<DateTime<Utc>>,
}

fn one() -> i64 {
    1
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

/// One item of a batch: a delta and the id that makes it retry-safe.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchItem {
    /// Applied once per id (1 to 128 printable ASCII characters); without
    /// one, the item is applied as often as it is sent.
    pub id: Option<String>,
    /// The owner.
    #[schema(value_type = OwnerValue)]
    pub owner: Value,
    /// The key.
    pub key: String,
    /// The amount; default 1.
    #[serde(default = "one")]
    pub delta: i64,
    /// When it happened.
    pub at: Option<DateTime<Utc>>,
}

/// A batch of deltas, applied all or nothing.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchAddRequest {
    /// At most `server.max_batch_items`.
    pub items: Vec<BatchItem>,
}

/// The answer to an add.
#[derive(Debug, Serialize, ToSchema)]
pub struct AddReply {
    /// True: the add is committed (a replay answers what the first did).
    pub applied: bool,
}

/// The answer to an add-and-get.
#[derive(Debug, Serialize, ToSchema)]
pub struct AddAndGetReply {
    /// True: the add is committed.
    pub applied: bool,
    /// The counter's total right after the add.
    pub total: i64,
}

/// The answer to a batch add.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BatchAddReply {
    /// Items applied now.
    pub applied: u64,
    /// Items whose id was applied before (skipped).
    pub duplicates: u64,
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
    headers: HeaderMap,
    Json(request): Json<AddRequest>,
) -> Result<Response, Problem> {
    write(state, target, &headers, Op::Add, vec![request.into()]).await
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
    headers: HeaderMap,
    Json(request): Json<AddRequest>,
) -> Result<Response, Problem> {
    write(state, target, &headers, Op::AddAndGet, vec![request.into()]).await
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
    headers: HeaderMap,
    Json(request): Json<BatchAddRequest>,
) -> Result<Response, Problem> {
    let max = state.server.max_batch_items;
    if request.items.is_empty() || request.items.len() > max {
        return Err(Problem::over_bound("batch items", max, request.items.len()).with("min", 1));
    }
    metrics::histogram!("counter_service_batch_size", "op" => "batchAdd")
        .record(request.items.len() as f64);
    write(state, target, &headers, Op::Batch, request.items).await
}

async fn write(
    state: AppState,
    target: Target<Adding>,
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
    respond(apply(namespace, source, key, request_id, op, items).await?)
}

/// Checks `items` and applies them through the namespace's add queue as
/// `source`'s write: the HTTP handlers' path, and the in-process one
/// ([`crate::Local`]).
pub(crate) async fn apply(
    namespace: &Namespace,
    source: String,
    key: Option<String>,
    request_id: Option<String>,
    op: Op,
    items: Vec<BatchItem>,
) -> Result<Outcome, Problem> {
    dispatch!(&namespace.table, h => {
        let mut write = check(namespace, op, key, items)?;
        write.request_id = request_id;
        write.source = source;
        let adds = h.adds.as_ref().ok_or_else(|| Problem::internal("the add queue is not started"))?;
        adds.submit(write).await
    })
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

fn check<I: ServiceOwner>(
    namespace: &Namespace,
    op: Op,
    key: Option<String>,
    raw: Vec<BatchItem>,
) -> Result<Write<I>, Problem> {
    let mut items = Vec::with_capacity(raw.len());
    let mut canonical_items = Vec::with_capacity(raw.len());
    for (i, item) in raw.into_iter().enumerate() {
        let at_item = |p: Problem| {
            if op == Op::Batch {
                p.with("item", i)
            } else {
                p
            }
        };
        let owner = I::from_json(&item.owner).map_err(at_item)?;
        let counter_key = namespace
            .counted_key(&item.key)
            .map_err(at_item)?
            .to_owned();
        if let Some(id) = &item.id {
            idempotency::check_id(id).map_err(at_item)?;
            if key.as_deref() == Some(id.as_str()) {
                return Err(at_item(Problem::bad_request(
                    "an item id cannot be the request's Idempotency-Key",
                )));
            }
        }
        let canonical = json!({
            "owner": owner.render(),
            "key": counter_key,
            "delta": item.delta,
            "at": item.at.map(|t| t.to_rfc3339()),
        });
        canonical_items.push(json!({"id": item.id, "item": canonical}));
        items.push(Item {
            id: item.id,
            owner,
            key: counter_key,
            delta: item.delta,
            at: item.at,
            canonical: canonical.to_string(),
        });
    }
    // One id twice in a request: the same item is applied once, two
    // different ones are a mistake.
    let mut by_id = std::collections::HashMap::new();
    for (i, item) in items.iter().enumerate() {
        if let Some(id) = &item.id
            && let Some(first) = by_id.insert(id.as_str(), &item.canonical)
            && *first != item.canonical
        {
            return Err(Problem::idempotency_conflict(id).with("item", i));
        }
    }
    Ok(Write {
        request_id: None,
        op,
        source: String::new(),
        key,
        canonical: json!({"op": op.name(), "items": canonical_items}).to_string(),
        items,
    })
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
