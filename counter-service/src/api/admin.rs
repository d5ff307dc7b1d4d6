//! `admin:check`, `admin:compact` and `counters:clear`: maintenance on
//! demand, for tokens with the admin scope.

use axum::{
    extract::State,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use counter_core::Compact;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::{
    extract::{Administering, Json, Query, Target},
    read::check_batch,
};
use crate::domain::schema::OwnerValue;
use crate::{
    dispatch,
    domain::check::{self, CheckReport},
    domain::jobs::{Job, JobKind},
    domain::namespace::{Handle, Namespace},
    domain::owner::ServiceOwner,
    problem::{Problem, ProblemBody},
    state::AppState,
};

/// `admin:check`'s query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct CheckQuery {
    /// Report the drift without repairing it.
    #[serde(default)]
    pub dry_run: bool,
}

/// The checks run.
#[derive(Debug, Serialize, ToSchema)]
pub struct CheckReply {
    /// One report per checked key.
    pub checks: Vec<CheckReport>,
}

/// Starts a check of the namespace's checked keys against their truth,
/// repairing the drift found (never undoing a concurrent add) unless
/// `dry_run`: a job, followed with `GET /v1/{ns}/admin/jobs/{id}`, whose
/// report is a `CheckReply`.
#[utoipa::path(
    operation_id = "check",
    post,
    path = "/v1/{ns}/admin:check",
    tag = "admin",
    params(("ns" = String, Path, description = "The namespace"), CheckQuery),
    responses(
        (status = 202, description = "Started: the job (`Location` is its address)", body = Job),
        (status = 403, description = "Needs the admin scope", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "A check runs in this namespace already (`job` names it)", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn check(
    State(state): State<AppState>,
    target: Target<Administering>,
    Query(query): Query<CheckQuery>,
) -> Result<Response, Problem> {
    let namespace = target.namespace(&state).clone();
    let kind = match query.dry_run {
        true => JobKind::CheckDryRun,
        false => JobKind::Check,
    };
    let shared = state.clone();
    let job = state
        .jobs
        .start(&namespace.name.clone(), kind, async move {
            let checks = check::run(&shared.db, &namespace, query.dry_run).await?;
            Ok(serde_json::to_value(CheckReply { checks }).unwrap_or_default())
        })?;
    Ok(accepted(job))
}

/// 202 with the job and its address.
fn accepted(job: Job) -> Response {
    let location = format!("/v1/{}/admin/jobs/{}", job.namespace, job.id);
    let mut response = (StatusCode::ACCEPTED, axum::Json(job)).into_response();
    if let Ok(value) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}

/// `GET admin/jobs/{id}`'s path.
#[derive(Debug, Deserialize)]
pub struct JobPath {
    ns: String,
    id: String,
}

/// A maintenance job of this instance: running, done with its report, or
/// failed with its problem.
#[utoipa::path(
    operation_id = "job",
    get,
    path = "/v1/{ns}/admin/jobs/{id}",
    tag = "admin",
    params(
        ("ns" = String, Path, description = "The namespace"),
        ("id" = String, Path, description = "The job's id, from the 202 that started it"),
    ),
    responses(
        (status = 200, description = "The job", body = Job),
        (status = 403, description = "Needs the admin scope", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such job on this instance", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn job(
    State(state): State<AppState>,
    target: Target<Administering>,
    axum::extract::Path(path): axum::extract::Path<JobPath>,
) -> Result<axum::Json<Job>, Problem> {
    let namespace = target.namespace(&state);
    debug_assert_eq!(namespace.name, path.ns);
    state
        .jobs
        .get(&namespace.name, &path.id)
        .map(axum::Json)
        .ok_or_else(|| Problem::unknown_job(&path.id))
}

/// A namespace's jobs.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobsReply {
    /// Running and kept (the last 16 finished), newest first, each as
    /// `GET /v1/{ns}/admin/jobs/{id}` answers it.
    pub jobs: Vec<Job>,
}

/// The namespace's maintenance jobs on this instance, running and kept
/// (the last 16 finished), newest first: the history of its checks (owners
/// checked, drift found, fixed) and compactions.
///
/// The admin scope, as for one job (`admin/jobs/{id}`): the list is that
/// route's answers together, and a failed job's `error` is the problem
/// the database gave, written for the operators who run maintenance, not
/// for every reader of counts. A token that may not call it is not shown
/// the check history in the console.
#[utoipa::path(
    operation_id = "jobs",
    get,
    path = "/v1/{ns}/admin/jobs",
    tag = "admin",
    params(("ns" = String, Path, description = "The namespace")),
    responses(
        (status = 200, description = "The jobs, newest first", body = JobsReply),
        (status = 403, description = "Needs the admin scope", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn jobs(
    State(state): State<AppState>,
    target: Target<Administering>,
) -> axum::Json<JobsReply> {
    let namespace = target.namespace(&state);
    axum::Json(JobsReply {
        jobs: state.jobs.list(&namespace.name),
    })
}

/// What a compaction did.
#[derive(Debug, Serialize, ToSchema)]
pub struct CompactReply {
    /// Slot rows before and after, in the counter table.
    pub rows_before: u64,
    /// Slot rows after.
    pub rows_after: u64,
    /// Counters folded into one row.
    pub counters_folded: u64,
    /// Bucket rows before (windowed keys).
    pub bucket_rows_before: u64,
    /// Bucket rows after.
    pub bucket_rows_after: u64,
    /// Sketch rows of unique keys before (each counter's merged into one).
    pub sketch_rows_before: u64,
    /// Sketch rows after.
    pub sketch_rows_after: u64,
}

/// Starts folding each counter's slot rows into one, online (totals never
/// change): a job, followed with `GET /v1/{ns}/admin/jobs/{id}`, whose
/// report is a `CompactReply`.
#[utoipa::path(
    operation_id = "compact",
    post,
    path = "/v1/{ns}/admin:compact",
    tag = "admin",
    params(("ns" = String, Path, description = "The namespace")),
    responses(
        (status = 202, description = "Started: the job (`Location` is its address)", body = Job),
        (status = 403, description = "Needs the admin scope", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "A compaction runs in this namespace already (`job` names it)", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn compact(
    State(state): State<AppState>,
    target: Target<Administering>,
) -> Result<Response, Problem> {
    let namespace = target.namespace(&state).clone();
    let shared = state.clone();
    let job = state.jobs.start(&namespace.name.clone(), JobKind::Compact, async move {
        let report =
            dispatch!(&namespace.table, h => h.counters.compact(&shared.db, &Compact::new()).await)?;
        let reply = CompactReply {
            rows_before: report.totals.rows_before,
            rows_after: report.totals.rows_after,
            counters_folded: report.totals.counters_folded,
            bucket_rows_before: report.buckets.rows_before,
            bucket_rows_after: report.buckets.rows_after,
            sketch_rows_before: report.sketches.rows_before,
            sketch_rows_after: report.sketches.rows_after,
        };
        Ok(serde_json::to_value(reply).unwrap_or_default())
    })?;
    Ok(accepted(job))
}

/// `counters:clear`'s body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClearRequest {
    /// Owners (strings, or numbers in an integer namespace).
    #[schema(value_type = Vec<OwnerValue>)]
    pub owners: Vec<Value>,
    /// Keys: counted or unique, declared or of a pattern.
    pub keys: Vec<String>,
}

/// What a clear deleted.
#[derive(Debug, Serialize, ToSchema)]
pub struct ClearReply {
    /// Slot, bucket and sketch rows deleted (0 when the counters were
    /// zero already).
    pub rows_deleted: u64,
}

/// Sets the counters `keys` of `owners` back to zero (totals, time buckets,
/// unique keys' sketches). Adds committed before it are erased, later ones
/// count from zero; an `Idempotency-Key` already used still replays its
/// first answer (a retried add is not applied again after a clear). Not
/// idempotent across adds: a clear retried after adds erases them too.
#[utoipa::path(
    operation_id = "clear",
    post,
    path = "/v1/{ns}/counters:clear",
    tag = "admin",
    params(("ns" = String, Path, description = "The namespace")),
    request_body = ClearRequest,
    responses(
        (status = 200, description = "The counters are zero", body = ClearReply),
        (status = 400, description = "Bad input, or over a batch bound", body = ProblemBody, content_type = "application/problem+json"),
        (status = 403, description = "Needs the admin scope", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn clear(
    State(state): State<AppState>,
    target: Target<Administering>,
    Json(request): Json<ClearRequest>,
) -> Result<axum::Json<ClearReply>, Problem> {
    let namespace = target.namespace(&state).clone();
    check_batch(&state, &request.owners, &request.keys, |key| {
        namespace.key(key)
    })?;
    // A task of its own: a client that gives up does not stop a clear
    // between its keys.
    let task = tokio::spawn(async move {
        let rows = dispatch!(&namespace.table, h => reset(&state, &namespace, h, &request).await);
        crate::domain::freshness::confirm_deletions(state.cache.as_ref()).await;
        rows
    });
    let rows_deleted = task.await.map_err(Problem::internal)??;
    Ok(axum::Json(ClearReply { rows_deleted }))
}

async fn reset<I: ServiceOwner>(
    state: &AppState,
    namespace: &Namespace,
    handle: &Handle<I>,
    request: &ClearRequest,
) -> Result<u64, Problem> {
    let owners: Vec<I> = request
        .owners
        .iter()
        .map(I::from_json)
        .collect::<Result<_, _>>()?;
    let mut rows = 0;
    for key in &request.keys {
        let key = key.as_str();
        rows += match namespace.is_unique(key) {
            true => {
                handle
                    .counters
                    .reset_unique(&state.db, &owners, key)
                    .await?
            }
            false => handle.counters.reset(&state.db, &owners, key).await?,
        };
    }
    Ok(rows)
}
