//! Check and fix: a key's counts compared with its truth in the business
//! tables and repaired through the library's recount, which never undoes a
//! concurrent add (it repairs by adding the drift it saw in a snapshot).

use std::time::Duration;

use counter_core::{Reconcile, RowsOf, Truth};
use serde::Serialize;
use utoipa::ToSchema;

use crate::{
    config::CheckConfig, dispatch, domain::namespace::Namespace, domain::owner::ServiceOwner,
    problem::Problem,
};

/// What one key's check found, and fixed unless asked not to.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CheckReport {
    /// The key.
    pub key: String,
    /// Owners compared.
    pub owners_checked: u64,
    /// Owners whose total differed from the truth.
    pub owners_drifted: u64,
    /// The sum of `|truth - total|` over them.
    pub total_abs_drift: u64,
    /// Whether the drift was repaired (false: a dry run).
    pub fixed: bool,
}

/// The truth of a check's configuration.
fn truth(check: &CheckConfig) -> Truth {
    rows(check).into()
}

fn rows(check: &CheckConfig) -> RowsOf {
    let mut rows = Truth::rows_of(check.table.clone(), check.via.clone());
    if let Some(column) = &check.sum {
        rows = rows.sum(column.clone());
    }
    if let Some(when) = &check.when {
        rows = match when.strip_prefix('!') {
            Some(column) => rows.when(column, false),
            None => rows.when(when.clone(), true),
        };
    }
    rows
}

/// Checks (and unless `dry_run`, fixes) the checked keys of `namespace`.
pub(crate) async fn run(
    db: &sea_orm::DatabaseConnection,
    namespace: &Namespace,
    dry_run: bool,
) -> Result<Vec<CheckReport>, Problem> {
    let mut reports = Vec::new();
    for (key, check) in &namespace.checks {
        let report =
            dispatch!(&namespace.table, h => one(db, &h.counters, key, check, dry_run).await?);
        metrics::counter!(crate::metrics::CHECK_OWNERS_DRIFTED, "namespace" => namespace.name.clone(), "key" => key.clone())
            .increment(report.owners_drifted);
        metrics::counter!(crate::metrics::CHECK_DRIFT, "namespace" => namespace.name.clone(), "key" => key.clone())
            .increment(report.total_abs_drift);
        if report.owners_drifted > 0 {
            tracing::warn!(namespace = %namespace.name, key, owners = report.owners_drifted, drift = report.total_abs_drift, fixed = report.fixed, "check found drift");
        }
        reports.push(report);
    }
    Ok(reports)
}

async fn one<I: ServiceOwner>(
    db: &sea_orm::DatabaseConnection,
    counters: &counter_core::Counters<I>,
    key: &str,
    check: &CheckConfig,
    dry_run: bool,
) -> Result<CheckReport, Problem> {
    let report = counters
        .reconcile(db, key, truth(check), &Reconcile::new().dry_run(dry_run))
        .await?;
    Ok(CheckReport {
        key: key.to_owned(),
        owners_checked: report.owners_checked,
        owners_drifted: report.owners_drifted,
        total_abs_drift: u64::try_from(report.total_abs_drift).unwrap_or(u64::MAX),
        fixed: !dry_run,
    })
}

/// Whether `check` can run: its truth table and columns exist (from the
/// catalog), and its truth reads for one owner without repairing. Run at
/// start, so that a check that cannot work refuses the start rather than
/// failing at its first run (a 500 nobody sees until then). The problem
/// found, if any.
pub(crate) async fn probe<I: ServiceOwner>(
    db: &sea_orm::DatabaseConnection,
    counters: &counter_core::Counters<I>,
    key: &str,
    check: &CheckConfig,
) -> Result<(), String> {
    let missing = rows(check).missing(db).await.map_err(|e| e.to_string())?;
    if !missing.is_empty() {
        return Err(format!("not in the database: {}", missing.join(", ")));
    }
    let one_owner = Reconcile::new().dry_run(true).owners([I::example()]);
    counters
        .reconcile(db, key, truth(check), &one_owner)
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Runs each key's check of `namespaces` on its interval until `stop`
/// resolves.
pub(crate) async fn schedule(
    db: sea_orm::DatabaseConnection,
    namespaces: Vec<Namespace>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut tasks = Vec::new();
    for namespace in &namespaces {
        for (key, check) in &namespace.checks {
            let Some(every) = check.every_seconds else {
                continue;
            };
            let (db, mut stop) = (db.clone(), stop.clone());
            let one_key = Namespace {
                checks: [(key.clone(), check.clone())].into(),
                ..namespace.clone()
            };
            let key = key.clone();
            // In a region a fix is refused (it needs every region's rows):
            // the schedule measures the drift only.
            let dry_run =
                crate::dispatch!(&namespace.table, h => h.counters.table().region()).is_some();
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(every));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                tick.tick().await;
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = stop.changed() => return,
                    }
                    if let Err(problem) = run(&db, &one_key, dry_run).await {
                        tracing::warn!(namespace = %one_key.name, key, status = %problem.status(), "scheduled check failed");
                    }
                }
            }));
        }
    }
    for task in tasks {
        let _ = task.await;
    }
}
