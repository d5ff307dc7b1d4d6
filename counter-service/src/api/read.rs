//! `counts:batchGet`, `top`, `series`, `keys` and `namespaces`.

use std::collections::BTreeMap;

use axum::extract::State;
use chrono::{DateTime, Utc};
use counter_core::{Window, limits::MAX_SERIES_BUCKETS};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::extract::{Calling, Json, Query, Reading, Target};
use super::served::{ReadFrom, Served};
use crate::domain::schema::OwnerValue;
use crate::{
    config::Scope,
    dispatch,
    domain::namespace::{Handle, KeyInfo, Namespace},
    domain::owner::ServiceOwner,
    domain::replicas::{Source, counted, read_from},
    problem::{Problem, ProblemBody},
    state::AppState,
};

/// `GET counts:batchGet`'s query: comma-separated lists.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct BatchGetQuery {
    /// Owners, comma-separated (`1,2,3`); use POST for owners with commas.
    pub owners: String,
    /// Keys, comma-separated (`likes,views`).
    pub keys: String,
}

/// `POST counts:batchGet`'s body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchGetRequest {
    /// Owners (strings, or numbers in an integer namespace).
    #[schema(value_type = Vec<OwnerValue>)]
    pub owners: Vec<Value>,
    /// Keys.
    pub keys: Vec<String>,
}

/// Totals by owner, then by key: every owner and key asked for, zero-filled.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchGetReply {
    /// `{"<owner>": {"<key>": total}}`.
    pub counts: BTreeMap<String, BTreeMap<String, i64>>,
}

/// The totals of many owners' keys in one read (AIP-231 `batchGet`).
#[utoipa::path(
    operation_id = "countsBatchGet",
    get,
    path = "/v1/{ns}/counts:batchGet",
    tag = "counts",
    params(("ns" = String, Path, description = "The namespace"), BatchGetQuery, ("Counter-Read-From" = Option<String>, Header, description = "`replica`: the read may be served by a standby within `database.replica_max_lag_ms`; `primary`: it may not (default: the namespace's `replica_reads`)")),
    responses(
        (status = 200, description = "Every owner and key, zero-filled", body = BatchGetReply, headers(("Counter-Read-Source" = String, description = "`primary`, `replica` or `cache`"), ("Counter-Read-Lag-Ms" = Option<u64>, description = "With `replica`: the standby's lag when the read began, in ms"))),
        (status = 400, description = "Bad input, or over a batch bound", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such namespace", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn batch_get(
    State(state): State<AppState>,
    target: Target<Reading>,
    read_from: ReadFrom,
    Query(query): Query<BatchGetQuery>,
) -> Result<Served<BatchGetReply>, Problem> {
    let owners: Vec<Value> = split(&query.owners)
        .map(|o| Value::String(o.to_owned()))
        .collect();
    let keys: Vec<String> = split(&query.keys).map(str::to_owned).collect();
    counts(&state, target.namespace(&state), &read_from, owners, keys).await
}

/// `counts:batchGet` with the lists in a body: for long lists.
#[utoipa::path(
    operation_id = "countsBatchGetPost",
    post,
    path = "/v1/{ns}/counts:batchGet",
    tag = "counts",
    params(("ns" = String, Path, description = "The namespace"), ("Counter-Read-From" = Option<String>, Header, description = "`replica`: the read may be served by a standby within `database.replica_max_lag_ms`; `primary`: it may not (default: the namespace's `replica_reads`)")),
    request_body = BatchGetRequest,
    responses(
        (status = 200, description = "Every owner and key, zero-filled", body = BatchGetReply, headers(("Counter-Read-Source" = String, description = "`primary`, `replica` or `cache`"), ("Counter-Read-Lag-Ms" = Option<u64>, description = "With `replica`: the standby's lag when the read began, in ms"))),
        (status = 400, description = "Bad input, or over a batch bound", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn batch_get_post(
    State(state): State<AppState>,
    target: Target<Reading>,
    read_from: ReadFrom,
    Json(request): Json<BatchGetRequest>,
) -> Result<Served<BatchGetReply>, Problem> {
    counts(
        &state,
        target.namespace(&state),
        &read_from,
        request.owners,
        request.keys,
    )
    .await
}

/// Bounds a batch read's lists (1 to `max_batch_owners` owners, 1 to
/// `max_batch_keys` keys) and checks each key with `admit`.
pub(super) fn check_batch<'k>(
    state: &AppState,
    owners: &[Value],
    keys: &'k [String],
    admit: impl Fn(&'k str) -> Result<&'k str, Problem>,
) -> Result<(), Problem> {
    let (max_owners, max_keys) = (state.server.max_batch_owners, state.server.max_batch_keys);
    if owners.is_empty() || owners.len() > max_owners {
        return Err(Problem::out_of_range(
            "batch owners",
            1,
            max_owners,
            owners.len(),
        ));
    }
    if keys.is_empty() || keys.len() > max_keys {
        return Err(Problem::out_of_range("batch keys", 1, max_keys, keys.len()));
    }
    for key in keys {
        admit(key)?;
    }
    Ok(())
}

/// The items of a comma-separated query list.
pub(super) fn split(list: &str) -> impl Iterator<Item = &str> {
    list.split(',').filter(|s| !s.is_empty())
}

async fn counts(
    state: &AppState,
    namespace: &Namespace,
    read_from: &ReadFrom,
    owners: Vec<Value>,
    keys: Vec<String>,
) -> Result<Served<BatchGetReply>, Problem> {
    check_batch(state, &owners, &keys, |key| namespace.counted_key(key))?;
    metrics::histogram!("counter_service_batch_size", "op" => "batchGet")
        .record((owners.len() * keys.len()) as f64);
    let tolerate_lag = read_from.tolerates_lag(namespace);
    let (counts, source) = dispatch!(&namespace.table, h => read_counts(state, h, &owners, &keys, tolerate_lag).await?);
    Ok(Served(BatchGetReply { counts }, source))
}

/// The totals, from the cache where the namespace has one (its misses
/// filled from the primary: a fill never takes a replica's older total),
/// else from a replica within the bound if `tolerate_lag`, else the
/// primary.
async fn read_counts<I: ServiceOwner>(
    state: &AppState,
    handle: &Handle<I>,
    owners: &[Value],
    keys: &[String],
    tolerate_lag: bool,
) -> Result<(BTreeMap<String, BTreeMap<String, i64>>, Source), Problem> {
    let owners: Vec<I> = owners.iter().map(I::from_json).collect::<Result<_, _>>()?;
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let (totals, source) = match &handle.cached {
        Some(cached) => counted(
            "batchGet",
            (
                cached.get_many(&state.db, &owners, &keys).await?,
                Source::Cache,
            ),
        ),
        None => read_from!(
            state.replicas.as_deref(),
            &state.db,
            tolerate_lag,
            "batchGet",
            |db| handle.counters.get_many(db, &owners, &keys).await
        )?,
    };
    let totals = totals
        .into_iter()
        .map(|(owner, by_key)| (owner.render(), by_key.into_iter().collect()))
        .collect();
    Ok((totals, source))
}

/// `top`'s query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct TopQuery {
    /// The key ranked.
    pub key: String,
    /// Owners per page, 1 to 1,000 (default 10).
    pub limit: Option<usize>,
    /// The `next` cursor of the page before.
    pub after: Option<String>,
}

/// One ranked owner.
#[derive(Debug, Serialize, ToSchema)]
pub struct RankedOwner {
    /// The owner.
    pub owner: String,
    /// Its total.
    pub total: i64,
}

/// A page of a ranking.
#[derive(Debug, Serialize, ToSchema)]
pub struct TopReply {
    /// Highest first; ties by owner, ascending.
    pub owners: Vec<RankedOwner>,
    /// The cursor of the next page, if this one was full.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// The most-counted owners of a key, exact, in keyset pages.
#[utoipa::path(
    operation_id = "top",
    get,
    path = "/v1/{ns}/top",
    tag = "counts",
    params(("ns" = String, Path, description = "The namespace"), TopQuery, ("Counter-Read-From" = Option<String>, Header, description = "`replica`: the read may be served by a standby within `database.replica_max_lag_ms`; `primary`: it may not (default: the namespace's `replica_reads`)")),
    responses(
        (status = 200, description = "A page", body = TopReply, headers(("Counter-Read-Source" = String, description = "`primary`, `replica` or `cache`"), ("Counter-Read-Lag-Ms" = Option<u64>, description = "With `replica`: the standby's lag when the read began, in ms"))),
        (status = 400, description = "Bad input", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn top(
    State(state): State<AppState>,
    target: Target<Reading>,
    read_from: ReadFrom,
    Query(query): Query<TopQuery>,
) -> Result<Served<TopReply>, Problem> {
    let namespace = target.namespace(&state);
    let key = namespace.counted_key(&query.key)?;
    let limit = query.limit.unwrap_or(10);
    if !(1..=MAX_TOP).contains(&limit) {
        return Err(Problem::out_of_range("limit", 1, MAX_TOP, limit));
    }
    let after = query.after.as_deref();
    let served = dispatch!(&namespace.table, h => {
        let after = after.map(|cursor| decode_after(h, cursor)).transpose()?;
        read_from!(state.replicas.as_deref(), &state.db, read_from.tolerates_lag(namespace), "top", |db| ranked(
            db,
            h,
            key,
            limit,
            after.as_ref()
        )
        .await)?
    });
    Ok(served.into())
}

/// The longest ranking page.
const MAX_TOP: usize = 1_000;

/// `text` as the handle's owner type.
fn owner_of<I: ServiceOwner>(_: &Handle<I>, text: &str) -> Result<I, Problem> {
    I::from_text(text)
}

/// The last owner of the page before, from its cursor (the handle names
/// the owner type).
fn decode_after<I: ServiceOwner>(
    _: &Handle<I>,
    cursor: &str,
) -> Result<counter_core::Ranked<I>, Problem> {
    let (total, owner) = decode_cursor(cursor)?;
    Ok(counter_core::Ranked {
        owner: I::from_text(&owner)?,
        total,
    })
}

async fn ranked<I: ServiceOwner>(
    db: &sea_orm::DatabaseConnection,
    handle: &Handle<I>,
    key: &str,
    limit: usize,
    after: Option<&counter_core::Ranked<I>>,
) -> Result<TopReply, Problem> {
    let page = match after {
        None => handle.counters.top(db, key, limit).await?,
        Some(last) => handle.counters.top_after(db, key, last, limit).await?,
    };
    let next = (page.len() == limit)
        .then(|| {
            page.last()
                .map(|r| encode_cursor(r.total, &r.owner.render()))
        })
        .flatten();
    Ok(TopReply {
        owners: page
            .into_iter()
            .map(|r| RankedOwner {
                owner: r.owner.render(),
                total: r.total,
            })
            .collect(),
        next,
    })
}

/// A cursor: the last owner and total of a page, as hex of their JSON, so
/// it travels in a query string untouched.
fn encode_cursor(total: i64, owner: &str) -> String {
    let json = serde_json::json!([total, owner]).to_string();
    json.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_cursor(cursor: &str) -> Result<(i64, String), Problem> {
    let bad = || Problem::bad_request("`after` is not a cursor this service gave");
    if !cursor.len().is_multiple_of(2) || cursor.len() > 1_200 {
        return Err(bad());
    }
    let bytes: Vec<u8> = (0..cursor.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(cursor.get(i..i + 2).ok_or_else(bad)?, 16).map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    serde_json::from_slice::<(i64, String)>(&bytes).map_err(|_| bad())
}

/// `series`'s query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SeriesQuery {
    /// The owner.
    pub owner: String,
    /// A windowed key.
    pub key: String,
    /// The first bucket's start (RFC 3339), inclusive.
    pub from: DateTime<Utc>,
    /// The end (RFC 3339), exclusive.
    pub to: DateTime<Utc>,
}

/// One bucket.
#[derive(Debug, Serialize, ToSchema)]
pub struct Bucket {
    /// Its start.
    pub start: DateTime<Utc>,
    /// Its count.
    pub count: i64,
}

/// A zero-filled series and its sum.
#[derive(Debug, Serialize, ToSchema)]
pub struct SeriesReply {
    /// Oldest first.
    pub buckets: Vec<Bucket>,
    /// The count over the whole range.
    pub sum: i64,
}

/// A windowed key's count per bucket over `[from, to)`, and their sum.
#[utoipa::path(
    operation_id = "series",
    get,
    path = "/v1/{ns}/series",
    tag = "counts",
    params(("ns" = String, Path, description = "The namespace"), SeriesQuery, ("Counter-Read-From" = Option<String>, Header, description = "`replica`: the read may be served by a standby within `database.replica_max_lag_ms`; `primary`: it may not (default: the namespace's `replica_reads`)")),
    responses(
        (status = 200, description = "The series", body = SeriesReply, headers(("Counter-Read-Source" = String, description = "`primary`, `replica` or `cache`"), ("Counter-Read-Lag-Ms" = Option<u64>, description = "With `replica`: the standby's lag when the read began, in ms"))),
        (status = 400, description = "Bad input, a key without a window, a reversed or too long range", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn series(
    State(state): State<AppState>,
    target: Target<Reading>,
    read_from: ReadFrom,
    Query(query): Query<SeriesQuery>,
) -> Result<Served<SeriesReply>, Problem> {
    let namespace = target.namespace(&state);
    let key = namespace.counted_key(&query.key)?;
    // The library refuses a series past its bound too, but as a plain
    // invalid range: checked here first, the refusal names the bound and
    // its `max` as every other bound's does (a reversed range, or a key
    // without a window, is still the library's to refuse).
    if let Some(window) = dispatch!(&namespace.table, h => h.counters.table().window_for(key)) {
        let buckets = buckets_in(window, query.from, query.to);
        if buckets > MAX_SERIES_BUCKETS as u64 {
            return Err(over_bound(SERIES_BUCKETS, MAX_SERIES_BUCKETS, buckets));
        }
    }
    let (buckets, source) = dispatch!(&namespace.table, h => {
        let owner = owner_of(h, &query.owner)?;
        read_from!(state.replicas.as_deref(), &state.db, read_from.tolerates_lag(namespace), "series", |db| {
            series_of(db, h, &owner, key, &query).await
        })?
    });
    let buckets: Vec<Bucket> = buckets
        .into_iter()
        .map(|(start, count)| Bucket { start, count })
        .collect();
    let sum = buckets
        .iter()
        .try_fold(0i64, |sum, b| sum.checked_add(b.count))
        .ok_or_else(|| {
            Problem::from(counter_core::CounterError::Overflow {
                context: "the sum of a series".into(),
            })
        })?;
    Ok(Served(SeriesReply { buckets, sum }, source))
}

/// `owner`'s buckets of `key` over the query's range.
async fn series_of<I: ServiceOwner>(
    db: &sea_orm::DatabaseConnection,
    handle: &Handle<I>,
    owner: &I,
    key: &str,
    query: &SeriesQuery,
) -> Result<Vec<(DateTime<Utc>, i64)>, counter_core::CounterError> {
    handle
        .counters
        .series(db, owner.clone(), key, query.from, query.to)
        .await
}

/// The bound a series longer than [`MAX_SERIES_BUCKETS`] is refused by.
const SERIES_BUCKETS: &str = "series buckets";

/// How many buckets of `window` start in `[from, to)`, counted as the
/// library's `Window::starts` counts them (whole seconds, a bucket
/// starting at `to` left out) without listing them: a range of a million
/// years is counted, not allocated. 0 for a reversed range, which the
/// library refuses by its own name.
pub(super) fn buckets_in(window: Window, from: DateTime<Utc>, to: DateTime<Utc>) -> u64 {
    let ceil = |at: DateTime<Utc>| at.timestamp() + i64::from(at.timestamp_subsec_nanos() > 0);
    let width = window.seconds();
    let start = ceil(from);
    let first = match start.rem_euclid(width) {
        0 => start,
        past => start - past + width,
    };
    let end = ceil(to);
    if first >= end {
        return 0;
    }
    u64::try_from((end - first - 1) / width + 1).unwrap_or(u64::MAX)
}

/// [`Problem::over_bound`] for a count that may not fit a `usize`.
pub(super) fn over_bound(bound: &'static str, max: usize, got: u64) -> Problem {
    Problem::over_bound(bound, max, usize::try_from(got).unwrap_or(usize::MAX))
}

/// A namespace's keys.
#[derive(Debug, Serialize, ToSchema)]
pub struct KeysReply {
    /// The declared keys.
    pub keys: Vec<KeyInfo>,
    /// Open key sets (`prefix*`).
    pub patterns: Vec<String>,
    /// Keys of the open sets that have counters (at most 1,000).
    pub in_use: Vec<String>,
}

/// The namespace's declared keys, its key patterns, and the pattern keys
/// in use.
#[utoipa::path(
    operation_id = "keys",
    get,
    path = "/v1/{ns}/keys",
    tag = "counts",
    params(("ns" = String, Path, description = "The namespace")),
    responses(
        (status = 200, description = "The keys", body = KeysReply),
        (status = 404, description = "No such namespace", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn keys(
    State(state): State<AppState>,
    target: Target<Reading>,
) -> Result<axum::Json<KeysReply>, Problem> {
    Ok(axum::Json(keys_of(&state, target.namespace(&state)).await?))
}

/// What `keys` answers for `namespace` (and `namespaces` for each).
async fn keys_of(state: &AppState, namespace: &Namespace) -> Result<KeysReply, Problem> {
    let in_use = if namespace.prefixes.is_empty() {
        Vec::new()
    } else {
        keys_in_use(state, namespace).await?
    };
    Ok(KeysReply {
        keys: namespace.keys.values().cloned().collect(),
        patterns: namespace.prefixes.iter().map(|p| format!("{p}*")).collect(),
        in_use,
    })
}

/// One namespace the caller may read, with its keys.
#[derive(Debug, Serialize, ToSchema)]
pub struct NamespaceKeys {
    /// The namespace.
    pub name: String,
    /// The declared keys (`unique`: a unique key, read by
    /// `uniques:batchGet`; otherwise a count).
    pub keys: Vec<KeyInfo>,
    /// Open key sets (`prefix*`).
    pub patterns: Vec<String>,
    /// Keys of the open sets that have counters (at most 1,000).
    pub in_use: Vec<String>,
}

/// The calling token's scopes and the namespaces it may read.
#[derive(Debug, Serialize, ToSchema)]
pub struct NamespacesReply {
    /// The token's scopes (all three on an open service).
    pub scopes: Vec<Scope>,
    /// The namespaces the token may read, by name, each with what
    /// `GET /v1/{ns}/keys` answers for it.
    pub namespaces: Vec<NamespaceKeys>,
}

/// The namespaces the calling token may read, each with its keys, and the
/// token's scopes: what a client (the console at `/ui`) shows before it
/// knows any namespace. Any valid token may call it; a token without the
/// read scope gets its scopes and no namespace.
#[utoipa::path(
    operation_id = "namespaces",
    get,
    path = "/v1/namespaces",
    tag = "counts",
    responses(
        (status = 200, description = "The readable namespaces and the token's scopes", body = NamespacesReply),
    )
)]
pub(crate) async fn namespaces(
    State(state): State<AppState>,
    Calling(caller): Calling,
) -> Result<axum::Json<NamespacesReply>, Problem> {
    let mut namespaces = Vec::new();
    for namespace in state.namespaces.values() {
        if !caller.may(&namespace.name, Scope::Read) {
            continue;
        }
        let KeysReply {
            keys,
            patterns,
            in_use,
        } = keys_of(&state, namespace).await?;
        namespaces.push(NamespaceKeys {
            name: namespace.name.clone(),
            keys,
            patterns,
            in_use,
        });
    }
    Ok(axum::Json(NamespacesReply {
        scopes: caller.scopes(),
        namespaces,
    }))
}

/// The distinct keys of the table that match a pattern, through the key
/// index `(count_key, owner_id)`; the table name is the configuration's.
async fn keys_in_use(state: &AppState, namespace: &Namespace) -> Result<Vec<String>, Problem> {
    use sea_orm::sea_query::{Alias, Expr, ExprTrait, Order, Query};
    let mut query = Query::select();
    query
        .distinct()
        .column(Alias::new("count_key"))
        .from(Alias::new(namespace.table_name()))
        .order_by(Alias::new("count_key"), Order::Asc)
        .limit(1_000);
    let mut any = sea_orm::sea_query::Condition::any();
    // `_` and `%` in a prefix match more than it; the exact check below
    // filters those out.
    for prefix in &namespace.prefixes {
        any = any.add(Expr::col(Alias::new("count_key")).like(format!("{prefix}%")));
    }
    query.cond_where(any);
    let backend = state.db.get_database_backend();
    let rows = counter_core::pooling::query_all(&state.db, backend.build(&query)).await?;
    let mut keys = Vec::with_capacity(rows.len());
    for row in rows {
        let key: String = row.try_get_by_index(0)?;
        if namespace
            .prefixes
            .iter()
            .any(|p| key.starts_with(p.as_str()))
        {
            keys.push(key);
        }
    }
    Ok(keys)
}
