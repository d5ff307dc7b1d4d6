//! `admin:check` and `admin:compact`: maintenance on demand.

use axum::{Extension, extract::State};
use counter_core::Compact;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::extract::{Ns, Query};
use crate::{
    auth::Caller,
    check::{self, CheckReport},
    config::Scope,
    dispatch,
    problem::{Problem, ProblemBody},
    state::AppState,
};

/// `admin:check`'s query.
#[derive(Debug, Deserialize, IntoParams)]
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

/// Checks the namespace's checked keys against their truth now, and repairs
/// the drift found (never undoing a concurrent add).
#[utoipa::path(
    post,
    path = "/v1/{ns}/admin:check",
    tag = "admin",
    params(("ns" = String, Path, description = "The namespace"), CheckQuery),
    responses(
        (status = 200, description = "What was found and fixed", body = CheckReply),
        (status = 403, description = "Needs the admin scope", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn check(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Ns(ns): Ns,
    Query(query): Query<CheckQuery>,
) -> Result<axum::Json<CheckReply>, Problem> {
    let namespace = state.namespace(&caller, &ns, Scope::Admin)?.clone();
    // A task of its own: a client that gives up does not stop a recount
    // between its batches.
    let task = tokio::spawn(async move { check::run(&state, &namespace, query.dry_run).await });
    let checks = task.await.map_err(Problem::internal)??;
    Ok(axum::Json(CheckReply { checks }))
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

/// Folds each counter's slot rows into one, online: totals never change.
#[utoipa::path(
    post,
    path = "/v1/{ns}/admin:compact",
    tag = "admin",
    params(("ns" = String, Path, description = "The namespace")),
    responses(
        (status = 200, description = "What was folded", body = CompactReply),
        (status = 403, description = "Needs the admin scope", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn compact(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Ns(ns): Ns,
) -> Result<axum::Json<CompactReply>, Problem> {
    let namespace = state.namespace(&caller, &ns, Scope::Admin)?.clone();
    let task = tokio::spawn(async move {
        dispatch!(&namespace.table, h => h.counters.compact(&state.db, &Compact::new()).await)
    });
    let report = task.await.map_err(Problem::internal)??;
    Ok(axum::Json(CompactReply {
        rows_before: report.totals.rows_before,
        rows_after: report.totals.rows_after,
        counters_folded: report.totals.counters_folded,
        bucket_rows_before: report.buckets.rows_before,
        bucket_rows_after: report.buckets.rows_after,
        sketch_rows_before: report.sketches.rows_before,
        sketch_rows_after: report.sketches.rows_after,
    }))
}
