//! Unique counts over HTTP: `counters:observe` and `uniques:batchGet`.
//!
//! An observation merges a member into a HyperLogLog sketch (see
//! `counter_core::unique`), and a merge applied twice is the same merge: a
//! client that retries an observe after a timeout counts nobody twice, so
//! these writes need no `Idempotency-Key` and skip the add queue's ledger.

use std::collections::{BTreeMap, HashMap};

use axum::extract::State;
use chrono::{DateTime, Utc};
use counter_core::{DeltaBatch, limits::MAX_UNIQUE_RANGE_SKETCHES};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::{
    extract::{Json, Observing, Query, Reading, Target},
    read::{check_batch, split},
    served::{ReadFrom, Served},
};
use crate::domain::{
    admission::Arrival,
    schema::{MemberValue, OwnerValue},
};
use crate::{
    dispatch,
    domain::namespace::{Handle, Namespace},
    domain::owner::ServiceOwner,
    domain::replicas::{Source, counted, read_from},
    problem::{Problem, ProblemBody},
    state::AppState,
};

/// The longest member, in bytes of its text: user ids, IP addresses and
/// session ids fit many times over; a longer one is a caller's mistake.
pub const MAX_MEMBER_BYTES: usize = 1_024;

/// One member seen by one owner's unique key.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Observation {
    /// The owner: a string, or for an integer namespace a number too.
    #[schema(value_type = OwnerValue)]
    pub owner: Value,
    /// A key declared `unique = true`.
    pub key: String,
    /// Who or what was seen: a string or an integer (`42` and `"42"` are
    /// the same member), at most 1,024 bytes.
    #[schema(value_type = MemberValue)]
    pub member: Value,
    /// When, for a windowed key's bucket (RFC 3339; default now).
    pub at: Option<DateTime<Utc>>,
}

/// Observations, applied all or nothing.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ObserveRequest {
    /// 1 to `server.max_batch_items`.
    pub observations: Vec<Observation>,
}

/// The answer to an observe.
#[derive(Debug, Serialize, ToSchema)]
pub struct ObserveReply {
    /// Observations committed (members seen before included: they change
    /// no estimate).
    pub observed: u64,
}

/// Counts members of unique keys, in one transaction: each counter's
/// members merged into one sketch first, then one slot row per counter
/// (and bucket) merged with it. Safe to retry as is: a member observed
/// twice counts once.
#[utoipa::path(
    operation_id = "observe",
    post,
    path = "/v1/{ns}/counters:observe",
    tag = "counters",
    params(("ns" = String, Path, description = "The namespace")),
    request_body = ObserveRequest,
    responses(
        (status = 200, description = "Committed", body = ObserveReply),
        (status = 400, description = "Bad input, a key that is not unique, or over `max_batch_items`", body = ProblemBody, content_type = "application/problem+json"),
        (status = 403, description = "Needs the write scope", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable or timeout: send it again", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn observe(
    State(state): State<AppState>,
    target: Target<Observing>,
    arrival: Arrival,
    Json(request): Json<ObserveRequest>,
) -> Result<axum::Json<ObserveReply>, Problem> {
    let namespace = target.namespace(&state);
    let observations = request.observations;
    let max = state.server.max_batch_items;
    if observations.is_empty() || observations.len() > max {
        return Err(Problem::out_of_range(
            "batch items",
            1,
            max,
            observations.len(),
        ));
    }
    metrics::histogram!("counter_service_batch_size", "op" => "observe")
        .record(observations.len() as f64);
    let observed = observations.len() as u64;
    // Committed by the queue's worker, with what else is waiting (see
    // `observes`): a client that goes away does not cut it short.
    let queue = namespace
        .observes
        .as_ref()
        .ok_or_else(|| Problem::internal("the observe queue is not started"))?;
    let admitted = queue.admit(observed as usize, arrival)?;
    let batch = dispatch!(&namespace.table, h => batch_of(namespace, h, observations)?);
    queue.submit(batch, observed as usize, admitted).await?;
    Ok(axum::Json(ObserveReply { observed }))
}

fn batch_of<I: ServiceOwner>(
    namespace: &Namespace,
    handle: &Handle<I>,
    observations: Vec<Observation>,
) -> Result<DeltaBatch, Problem> {
    let now = Utc::now();
    let mut batch = DeltaBatch::new();
    for (i, observation) in observations.into_iter().enumerate() {
        let item = |p: Problem| p.with("item", i);
        let owner = I::from_json(&observation.owner).map_err(item)?;
        let key = namespace.unique_key(&observation.key).map_err(item)?;
        let member = member_text(&observation.member).map_err(item)?;
        batch
            .observe_at(
                &handle.counters,
                owner,
                key,
                member.as_str(),
                observation.at.unwrap_or(now),
            )
            .map_err(|e| item(e.into()))?;
    }
    Ok(batch)
}

/// A member's text: a string as is, an integer as its digits (the
/// library's rule for integer members, so both count the same person).
fn member_text(member: &Value) -> Result<String, Problem> {
    let text = match member {
        Value::String(text) => text.clone(),
        Value::Number(n) if n.is_i64() || n.is_u64() => n.to_string(),
        _ => return Err(Problem::bad_request("a member is a string or an integer")),
    };
    if text.len() > MAX_MEMBER_BYTES {
        return Err(Problem::over_bound(
            "member bytes",
            MAX_MEMBER_BYTES,
            text.len(),
        ));
    }
    Ok(text)
}

/// `GET uniques:batchGet`'s query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct UniquesQuery {
    /// Owners, comma-separated; use POST for owners with commas.
    pub owners: String,
    /// Unique keys, comma-separated.
    pub keys: String,
    /// With `to`: distinct members over the buckets starting in
    /// `[from, to)` of windowed keys (RFC 3339).
    pub from: Option<DateTime<Utc>>,
    /// The range's end, exclusive.
    pub to: Option<DateTime<Utc>>,
}

/// `POST uniques:batchGet`'s body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UniquesRequest {
    /// Owners.
    #[schema(value_type = Vec<OwnerValue>)]
    pub owners: Vec<Value>,
    /// Unique keys.
    pub keys: Vec<String>,
    /// With `to`: a range of a windowed key's buckets.
    pub from: Option<DateTime<Utc>>,
    /// The range's end, exclusive.
    pub to: Option<DateTime<Utc>>,
}

/// Estimates by owner, then by key.
#[derive(Debug, Serialize, ToSchema)]
pub struct UniquesReply {
    /// `{"<owner>": {"<key>": distinct members}}`, every owner and key
    /// asked for, 0 where nothing was observed. Estimates: within 0.81 %
    /// (one standard error) of the exact count.
    pub uniques: BTreeMap<String, BTreeMap<String, u64>>,
}

/// Distinct members of many owners' unique keys in one read: all time, or
/// with `from` and `to` the union of a windowed key's buckets in the
/// range (a member seen on two days counts once in the week).
#[utoipa::path(
    operation_id = "uniquesBatchGet",
    get,
    path = "/v1/{ns}/uniques:batchGet",
    tag = "counts",
    params(("ns" = String, Path, description = "The namespace"), UniquesQuery, ("Counter-Read-From" = Option<String>, Header, description = "`replica`: the read may be served by a standby within `database.replica_max_lag_ms`; `primary`: it may not (default: the namespace's `replica_reads`)")),
    responses(
        (status = 200, description = "Every owner and key", body = UniquesReply, headers(("Counter-Read-Source" = String, description = "`primary`, `replica` or `cache`"), ("Counter-Read-Lag-Ms" = Option<u64>, description = "With `replica`: the standby's lag when the read began, in ms"))),
        (status = 400, description = "Bad input, a key that is not unique, a range on a key without a window", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn batch_get(
    State(state): State<AppState>,
    target: Target<Reading>,
    read_from: ReadFrom,
    Query(query): Query<UniquesQuery>,
) -> Result<Served<UniquesReply>, Problem> {
    let owners = split(&query.owners)
        .map(|o| Value::String(o.to_owned()))
        .collect();
    let keys = split(&query.keys).map(str::to_owned).collect();
    let range = range(query.from, query.to)?;
    uniques(
        &state,
        target.namespace(&state),
        &read_from,
        owners,
        keys,
        range,
    )
    .await
}

/// `uniques:batchGet` with the lists in a body.
#[utoipa::path(
    operation_id = "uniquesBatchGetPost",
    post,
    path = "/v1/{ns}/uniques:batchGet",
    tag = "counts",
    params(("ns" = String, Path, description = "The namespace"), ("Counter-Read-From" = Option<String>, Header, description = "`replica`: the read may be served by a standby within `database.replica_max_lag_ms`; `primary`: it may not (default: the namespace's `replica_reads`)")),
    request_body = UniquesRequest,
    responses(
        (status = 200, description = "Every owner and key", body = UniquesReply, headers(("Counter-Read-Source" = String, description = "`primary`, `replica` or `cache`"), ("Counter-Read-Lag-Ms" = Option<u64>, description = "With `replica`: the standby's lag when the read began, in ms"))),
        (status = 400, description = "Bad input, a key that is not unique, a range on a key without a window", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn batch_get_post(
    State(state): State<AppState>,
    target: Target<Reading>,
    read_from: ReadFrom,
    Json(request): Json<UniquesRequest>,
) -> Result<Served<UniquesReply>, Problem> {
    let range = range(request.from, request.to)?;
    uniques(
        &state,
        target.namespace(&state),
        &read_from,
        request.owners,
        request.keys,
        range,
    )
    .await
}

type Range = Option<(DateTime<Utc>, DateTime<Utc>)>;

fn range(from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> Result<Range, Problem> {
    match (from, to) {
        (Some(from), Some(to)) => Ok(Some((from, to))),
        (None, None) => Ok(None),
        _ => Err(Problem::bad_request(
            "a range needs both `from` and `to`, or neither for all time",
        )),
    }
}

async fn uniques(
    state: &AppState,
    namespace: &Namespace,
    read_from: &ReadFrom,
    owners: Vec<Value>,
    keys: Vec<String>,
    range: Range,
) -> Result<Served<UniquesReply>, Problem> {
    check_batch(state, &owners, &keys, |key| namespace.unique_key(key))?;
    metrics::histogram!("counter_service_batch_size", "op" => "uniquesBatchGet")
        .record((owners.len() * keys.len()) as f64);
    let tolerate_lag = read_from.tolerates_lag(namespace);
    let (uniques, source) = dispatch!(&namespace.table, h => read_uniques(state, h, &owners, &keys, range, tolerate_lag).await?);
    Ok(Served(UniquesReply { uniques }, source))
}

async fn read_uniques<I: ServiceOwner>(
    state: &AppState,
    handle: &Handle<I>,
    owners: &[Value],
    keys: &[String],
    range: Range,
    tolerate_lag: bool,
) -> Result<(BTreeMap<String, BTreeMap<String, u64>>, Source), Problem> {
    let owners: Vec<I> = owners.iter().map(I::from_json).collect::<Result<_, _>>()?;
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    // owners x buckets sketches at most per key, refused here with the
    // bound named (the library refuses it too, as a plain invalid range).
    if let Some((from, to)) = range {
        for key in &keys {
            if let Some(window) = handle.counters.table().window_for(key) {
                let sketches =
                    (owners.len() as u64).saturating_mul(super::read::buckets_in(window, from, to));
                if sketches > MAX_UNIQUE_RANGE_SKETCHES as u64 {
                    return Err(super::read::over_bound(
                        "unique range sketches",
                        MAX_UNIQUE_RANGE_SKETCHES,
                        sketches,
                    ));
                }
            }
        }
    }
    const OP: &str = "uniquesBatchGet";
    let (estimates, source) = match (range, &handle.cached) {
        // The cache keeps all-time estimates; a range is read from the sketches.
        (Some((from, to)), _) => read_from!(
            state.replicas.as_deref(),
            &state.db,
            tolerate_lag,
            OP,
            |db| unique_over(db, handle, &owners, &keys, from, to).await
        )?,
        (None, Some(cached)) => counted(
            OP,
            (
                cached.unique_many(&state.db, &owners, &keys).await?,
                Source::Cache,
            ),
        ),
        (None, None) => read_from!(
            state.replicas.as_deref(),
            &state.db,
            tolerate_lag,
            OP,
            |db| handle.counters.unique_many(db, &owners, &keys).await
        )?,
    };
    let estimates = estimates
        .into_iter()
        .map(|(owner, by_key)| (owner.render(), by_key.into_iter().collect()))
        .collect();
    Ok((estimates, source))
}

/// Each key's estimates over `[from, to)`, by owner.
async fn unique_over<I: ServiceOwner>(
    db: &sea_orm::DatabaseConnection,
    handle: &Handle<I>,
    owners: &[I],
    keys: &[&str],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<HashMap<I, HashMap<String, u64>>, counter_core::CounterError> {
    let mut by_owner: HashMap<I, HashMap<String, u64>> = HashMap::new();
    for key in keys {
        let over = handle
            .counters
            .unique_over_many(db, owners, *key, from, to)
            .await?;
        for (owner, estimate) in over {
            by_owner
                .entry(owner)
                .or_default()
                .insert((*key).to_owned(), estimate);
        }
    }
    Ok(by_owner)
}
