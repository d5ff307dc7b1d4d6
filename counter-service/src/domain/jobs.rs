//! Long maintenance as jobs: `admin:compact` and `admin:check` answer 202
//! at once with a job, which runs in a task of its own, free of the request
//! timeout (a compaction of 130,000 sketch rows takes minutes), one per
//! namespace and kind at a time; `GET /v1/{ns}/admin/jobs/{id}` reports it,
//! `GET /v1/{ns}/admin/jobs` lists them.
//! Each transaction a job commits is bounded by the library (a compaction
//! batch, one sketch counter, a recount batch of owners), so a long job
//! never holds locks for long.
//!
//! Jobs live in the instance that runs them: the last
//! [`KEPT_PER_NAMESPACE`] finished ones of each namespace are kept in
//! memory, and another instance does not know them (404).

use std::{
    collections::{BTreeMap, VecDeque},
    future::Future,
    sync::{Arc, Mutex, PoisonError},
};

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::problem::Problem;

/// Finished jobs kept per namespace.
pub const KEPT_PER_NAMESPACE: usize = 16;

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    /// `admin:compact`.
    Compact,
    /// `admin:check`, repairing.
    Check,
    /// `admin:check?dry_run=true`.
    CheckDryRun,
}

impl JobKind {
    /// Which kinds exclude each other: a check and a dry run both read
    /// every owner, so one of them runs at a time.
    fn family(self) -> &'static str {
        match self {
            Self::Compact => "compact",
            Self::Check | Self::CheckDryRun => "check",
        }
    }
}

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Running now.
    Running,
    /// Finished; `report` holds what it did.
    Done,
    /// Stopped on an error; `error` says which.
    Failed,
}

/// A job, as `GET /v1/{ns}/admin/jobs/{id}` answers it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Job {
    /// Its id.
    pub id: String,
    /// Its namespace.
    pub namespace: String,
    /// What it does.
    pub kind: JobKind,
    /// Where it is.
    pub state: JobState,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// When it finished, if it has.
    pub finished_at: Option<DateTime<Utc>>,
    /// What it did, once done: a compaction's `CompactReply`, a check's
    /// `CheckReply`.
    #[schema(value_type = Option<Object>)]
    pub report: Option<Value>,
    /// Why it failed: the problem document a request would have answered.
    #[schema(value_type = Option<Object>)]
    pub error: Option<Value>,
}

/// The jobs of one service instance.
#[derive(Default)]
pub(crate) struct Jobs {
    by_namespace: Mutex<BTreeMap<String, VecDeque<Job>>>,
}

impl Jobs {
    /// Starts `work` as a job of `kind` in `namespace` and returns it
    /// (running); 409 naming the running one if a job of its family runs
    /// there already.
    pub fn start<F>(
        self: &Arc<Self>,
        namespace: &str,
        kind: JobKind,
        work: F,
    ) -> Result<Job, Problem>
    where
        F: Future<Output = Result<Value, Problem>> + Send + 'static,
    {
        let job = {
            let mut all = self.lock();
            let jobs = all.entry(namespace.to_owned()).or_default();
            if let Some(running) = jobs
                .iter()
                .find(|j| j.state == JobState::Running && j.kind.family() == kind.family())
            {
                return Err(Problem::job_running(&running.id, namespace));
            }
            let job = Job {
                id: uuid::Uuid::new_v4().to_string(),
                namespace: namespace.to_owned(),
                kind,
                state: JobState::Running,
                started_at: Utc::now(),
                finished_at: None,
                report: None,
                error: None,
            };
            jobs.push_back(job.clone());
            job
        };
        let (jobs, id, ns) = (self.clone(), job.id.clone(), namespace.to_owned());
        tokio::spawn(async move {
            // A panic in the work is a failed job, not a job running forever.
            let outcome = tokio::spawn(work)
                .await
                .unwrap_or_else(|e| Err(Problem::internal(e)));
            jobs.finish(&ns, &id, outcome);
        });
        Ok(job)
    }

    /// The job `id` of `namespace`, running or kept.
    pub fn get(&self, namespace: &str, id: &str) -> Option<Job> {
        self.lock()
            .get(namespace)?
            .iter()
            .find(|j| j.id == id)
            .cloned()
    }

    /// The jobs of `namespace`, running and kept, newest first.
    pub fn list(&self, namespace: &str) -> Vec<Job> {
        let mut jobs: Vec<Job> = self
            .lock()
            .get(namespace)
            .map(|jobs| jobs.iter().cloned().collect())
            .unwrap_or_default();
        jobs.sort_by_key(|job| std::cmp::Reverse(job.started_at));
        jobs
    }

    fn finish(&self, namespace: &str, id: &str, outcome: Result<Value, Problem>) {
        let mut all = self.lock();
        let Some(jobs) = all.get_mut(namespace) else {
            return;
        };
        if let Some(job) = jobs.iter_mut().find(|j| j.id == id) {
            job.finished_at = Some(Utc::now());
            match outcome {
                Ok(report) => {
                    job.state = JobState::Done;
                    job.report = Some(report);
                }
                Err(problem) => {
                    job.state = JobState::Failed;
                    job.error = Some(problem.document());
                }
            }
        }
        // Keep the running ones and the last finished ones.
        while jobs.iter().filter(|j| j.state != JobState::Running).count() > KEPT_PER_NAMESPACE {
            let Some(oldest) = jobs.iter().position(|j| j.state != JobState::Running) else {
                break;
            };
            jobs.remove(oldest);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, VecDeque<Job>>> {
        self.by_namespace
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
