//! `counters:add`, `counters:addAndGet` and `counters:batchAdd`: every add
//! is one transaction, applied exactly once per id (see
//! [`idempotency`](crate::idempotency)).

use std::{collections::HashSet, time::Duration};

use axum::{
    Extension,
    extract::State,
    http::{HeaderMap, HeaderValue, header::CONTENT_TYPE},
    response::{IntoResponse, Response},
};
use chrono::{DateTime, Utc};
use counter_core::{Counters, DeltaBatch, ErrorKind, observe};
use sea_orm::{DatabaseConnection, TransactionTrait};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::extract::{Json, Ns};
use crate::{
    auth::Caller,
    config::Scope,
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
    #[schema(value_type = Object)]
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

/// One item of a batch: a delta and the id that makes it retry-safe.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchItem {
    /// Applied once per id (1 to 128 printable ASCII characters); without
    /// one, the item is applied as often as it is sent.
    pub id: Option<String>,
    /// The owner.
    #[schema(value_type = Object)]
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
#[derive(Debug, Serialize, ToSchema)]
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
    Extension(caller): Extension<Caller>,
    Ns(ns): Ns,
    headers: HeaderMap,
    Json(request): Json<AddRequest>,
) -> Result<Response, Problem> {
    let item = BatchItem {
        id: None,
        owner: request.owner,
        key: request.key,
        delta: request.delta,
        at: request.at,
    };
    write(state, caller, ns, &headers, Op::Add, vec![item]).await
}

/// Adds `delta` to one counter and answers its new total (idempotent like
/// `counters:add`).
#[utoipa::path(
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
    Extension(caller): Extension<Caller>,
    Ns(ns): Ns,
    headers: HeaderMap,
    Json(request): Json<AddRequest>,
) -> Result<Response, Problem> {
    let item = BatchItem {
        id: None,
        owner: request.owner,
        key: request.key,
        delta: request.delta,
        at: request.at,
    };
    write(state, caller, ns, &headers, Op::AddAndGet, vec![item]).await
}

/// Applies many deltas in one transaction, all or nothing. Items with an
/// `id` are applied once per id (a retried batch applies only what it did
/// not before); an `Idempotency-Key` makes the whole request replay its
/// first answer.
#[utoipa::path(
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
    Extension(caller): Extension<Caller>,
    Ns(ns): Ns,
    headers: HeaderMap,
    Json(request): Json<BatchAddRequest>,
) -> Result<Response, Problem> {
    let max = state.server.max_batch_items;
    if request.items.is_empty() || request.items.len() > max {
        return Err(Problem::over_bound("batch items", max, request.items.len()).with("min", 1));
    }
    metrics::histogram!("counter_service_batch_size", "op" => "batchAdd")
        .record(request.items.len() as f64);
    write(state, caller, ns, &headers, Op::Batch, request.items).await
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Add,
    AddAndGet,
    Batch,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Add => "add",
            Op::AddAndGet => "addAndGet",
            Op::Batch => "batchAdd",
        }
    }
}

/// One checked, typed item.
struct Item<I> {
    id: Option<String>,
    owner: I,
    key: String,
    delta: i64,
    at: Option<DateTime<Utc>>,
    /// What a retry of this id must send again.
    canonical: String,
}

/// A checked request, ready to run.
struct Write<I> {
    op: Op,
    source: String,
    key: Option<String>,
    canonical: String,
    items: Vec<Item<I>>,
}

async fn write(
    state: AppState,
    caller: Caller,
    ns: String,
    headers: &HeaderMap,
    op: Op,
    items: Vec<BatchItem>,
) -> Result<Response, Problem> {
    let namespace = state.namespace(&ns)?;
    caller.allow(&namespace.name, Scope::Write)?;
    let key = idempotency_key(headers)?;
    dispatch!(&namespace.table, h => {
        let write = check(namespace, op, key, items)?;
        run(state.clone(), h.counters.clone(), write).await
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
    idempotency::check_id(key).map_err(Problem::bad_request)?;
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
        let counter_key = namespace.key(&item.key).map_err(at_item)?.to_owned();
        if let Some(id) = &item.id {
            idempotency::check_id(id).map_err(|e| at_item(Problem::bad_request(e)))?;
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
        op,
        source: namespace.source(),
        key,
        canonical: json!({"op": op.name(), "items": canonical_items}).to_string(),
        items,
    })
}

/// Runs `write` in a task of its own, so a client that goes away does not
/// stop it halfway: its transaction commits or rolls back whole, and the
/// retry finds the answer stored.
async fn run<I: ServiceOwner>(
    state: AppState,
    counters: Counters<I>,
    write: Write<I>,
) -> Result<Response, Problem> {
    let task = tokio::spawn(async move { retrying(&state.db, &counters, &write).await });
    let outcome = task.await.map_err(Problem::internal)??;
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

/// An answer: its JSON text, first or replayed.
struct Outcome {
    body: String,
    replayed: bool,
}

/// How an attempt failed.
enum Failure {
    /// For good: the answer.
    Final(Problem),
    /// The database's trouble: nothing is known to be applied, unless the
    /// failure was at `COMMIT` (`at_commit`).
    Retry {
        cause: counter_core::CounterError,
        at_commit: bool,
    },
}

impl From<Problem> for Failure {
    fn from(problem: Problem) -> Self {
        Failure::Final(problem)
    }
}

fn database(at_commit: bool) -> impl Fn(sea_orm::DbErr) -> Failure {
    move |e| Failure::Retry {
        cause: e.into(),
        at_commit,
    }
}

/// Attempts the write until it commits, fails for good, or its retries run
/// out. A retry after a failed `COMMIT` (whose outcome is unknown) is
/// exact only with ids; without, the client hears 503 instead.
async fn retrying<I: ServiceOwner>(
    db: &DatabaseConnection,
    counters: &Counters<I>,
    write: &Write<I>,
) -> Result<Outcome, Problem> {
    let has_ids = write.key.is_some() || write.items.iter().all(|i| i.id.is_some());
    let mut backoff = Duration::from_millis(5);
    for attempt in 1.. {
        let (result, touched) = observe::scope(attempt_once(db, counters, write)).await;
        match result {
            Ok(outcome) => {
                touched.committed().await;
                return Ok(outcome);
            }
            Err(Failure::Final(problem)) => return Err(problem),
            Err(Failure::Retry { cause, at_commit }) => {
                let retryable =
                    matches!(cause.kind(), ErrorKind::Transient) && (has_ids || !at_commit);
                if !retryable || attempt >= 8 {
                    return Err(cause.into());
                }
                tracing::debug!(%cause, attempt, "add retried");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
        }
    }
    unreachable!("the loop returns")
}

async fn attempt_once<I: ServiceOwner>(
    db: &DatabaseConnection,
    counters: &Counters<I>,
    write: &Write<I>,
) -> Result<Outcome, Failure> {
    let txn = db.begin().await.map_err(database(false))?;
    let mut ids: Vec<&str> = write.items.iter().filter_map(|i| i.id.as_deref()).collect();
    ids.extend(write.key.as_deref());
    let new = if ids.is_empty() {
        HashSet::new()
    } else {
        idempotency::record(&txn, &write.source, &ids)
            .await
            .map_err(database(false))?
    };
    if let Some(key) = &write.key
        && !new.contains(key)
    {
        txn.rollback().await.map_err(database(false))?;
        return replay(db, &write.source, key, &write.canonical).await;
    }
    // Items whose id was applied before: the same item is skipped, another
    // one under that id is refused.
    let seen_before: Vec<&str> = write
        .items
        .iter()
        .filter_map(|i| i.id.as_deref())
        .filter(|id| !new.contains(*id))
        .collect();
    let stored = idempotency::stored(&txn, &write.source, &seen_before)
        .await
        .map_err(database(false))?;
    let mut batch = DeltaBatch::new();
    let mut fresh = HashSet::new();
    let (mut applied, mut duplicates) = (0u64, 0u64);
    let mut rows: Vec<(&str, &str, Option<&str>)> = Vec::new();
    for (i, item) in write.items.iter().enumerate() {
        if let Some(id) = &item.id {
            if !new.contains(id) {
                if let Some(before) = stored.get(id)
                    && before.request != item.canonical
                {
                    return Err(Problem::idempotency_conflict(id).with("item", i).into());
                }
                duplicates += 1;
                continue;
            }
            if !fresh.insert(id.as_str()) {
                duplicates += 1;
                continue;
            }
            rows.push((id, &item.canonical, None));
        }
        batch
            .add_at(
                counters,
                item.owner.clone(),
                item.key.as_str(),
                item.delta,
                item.at.unwrap_or_else(Utc::now),
            )
            .map_err(Problem::from)?;
        applied += 1;
    }
    batch.apply_in(&txn).await.map_err(|e| match e.kind() {
        ErrorKind::InvalidInput | ErrorKind::Overflow | ErrorKind::Misuse => {
            Failure::Final(e.into())
        }
        _ => Failure::Retry {
            cause: e,
            at_commit: false,
        },
    })?;
    let body = match write.op {
        Op::Add => json!({"applied": true}),
        Op::AddAndGet => {
            let item = &write.items[0];
            let total = counters
                .get(&txn, item.owner.clone(), item.key.as_str())
                .await
                .map_err(|e| Failure::Retry {
                    cause: e,
                    at_commit: false,
                })?;
            json!({"applied": true, "total": total})
        }
        Op::Batch => json!({"applied": applied, "duplicates": duplicates}),
    }
    .to_string();
    if let Some(key) = &write.key {
        rows.push((key, &write.canonical, Some(&body)));
    }
    idempotency::store(&txn, &write.source, &rows)
        .await
        .map_err(database(false))?;
    txn.commit().await.map_err(database(true))?;
    Ok(Outcome {
        body,
        replayed: false,
    })
}

/// The first answer to `key`, if it was given to this same request.
async fn replay(
    db: &DatabaseConnection,
    source: &str,
    key: &str,
    canonical: &str,
) -> Result<Outcome, Failure> {
    let stored = idempotency::stored(db, source, &[key])
        .await
        .map_err(database(false))?;
    match stored.get(key) {
        Some(first) if first.request == canonical => match &first.reply {
            Some(body) => Ok(Outcome {
                body: body.clone(),
                replayed: true,
            }),
            None => Err(Problem::idempotency_conflict(key).into()),
        },
        _ => Err(Problem::idempotency_conflict(key).into()),
    }
}
