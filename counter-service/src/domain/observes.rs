//! Applying observes: like adds (see [`crate::domain::adds`]), each namespace's
//! observes go through a queue whose workers commit what is waiting as one
//! group. The group's requests are merged in memory first
//! ([`DeltaBatch::append`]: one sketch per counter and bucket, whatever the
//! number of requests and members), so a sketch row is read, merged and
//! written once per group, in one transaction, not once per request.
//!
//! An observe needs no ledger: a member counted twice counts once, so the
//! library retries a group's transaction whole after a conflict, and a
//! client retries a 503 as it is. Every request of a group hears the
//! group's outcome: its requests were checked before they were queued, so
//! what can still fail is the database's, and theirs alike.

use std::{collections::VecDeque, sync::Arc};

use counter_core::DeltaBatch;
use counter_redis::CountCache;
use sea_orm::DatabaseConnection;
use tokio::sync::{Mutex, mpsc, oneshot};

use crate::{
    domain::admission::{Admission, Admitted, Arrival},
    problem::Problem,
};

/// Observations in one group at most (a larger request goes alone).
pub(crate) const MAX_GROUP_OBSERVATIONS: usize = 10_000;

struct Job {
    batch: DeltaBatch,
    observations: usize,
    reply: oneshot::Sender<Result<(), Problem>>,
    /// The job's place in the queue, given back when it is answered or
    /// dropped.
    _admitted: Admitted,
}

/// A namespace's observe queue and its workers.
#[derive(Clone)]
pub(crate) struct ObserveQueue {
    jobs: mpsc::Sender<Job>,
    admission: Arc<Admission>,
}

impl std::fmt::Debug for ObserveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObserveQueue")
            .field("admission", &self.admission)
            .finish()
    }
}

impl ObserveQueue {
    /// Starts `workers` workers (groups in flight at once), admitting what
    /// `admission` admits; the workers end when every handle is dropped.
    pub fn start(
        db: DatabaseConnection,
        cache: Option<CountCache>,
        workers: usize,
        admission: Admission,
    ) -> Self {
        // Every job counts at least one observation: `send` never waits.
        let (jobs, receiver) = mpsc::channel(admission.max_items());
        let admission = Arc::new(admission);
        let waiting = Arc::new(Mutex::new(Waiting {
            receiver,
            carried: VecDeque::new(),
        }));
        for _ in 0..workers.max(1) {
            let (db, cache, waiting, admission) = (
                db.clone(),
                cache.clone(),
                waiting.clone(),
                admission.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let group = waiting.lock().await.next_group().await;
                    let Some(group) = group else { return };
                    let items = group.iter().map(|job| job.observations.max(1)).sum();
                    admission
                        .draining(items, run_group(&db, cache.as_ref(), group))
                        .await;
                }
            });
        }
        Self { jobs, admission }
    }

    /// `Ok` if one more observation would be admitted now; the refusal if
    /// not.
    pub fn has_room(&self, arrival: Arrival) -> Result<(), Problem> {
        self.admission.has_room(arrival)
    }

    /// A place in the queue for `observations` observations that the
    /// service `received` then; 503 `overloaded` at once, nothing applied,
    /// if they would pass the queue's bound. Taken before the members are
    /// hashed, so that a refusal costs none of it.
    pub fn admit(&self, observations: usize, arrival: Arrival) -> Result<Admitted, Problem> {
        self.admission.admit(observations, arrival)
    }

    /// Commits `batch` (of `observations` observations), in the place
    /// `admitted` holds, with whatever else is waiting.
    pub async fn submit(
        &self,
        batch: DeltaBatch,
        observations: usize,
        admitted: Admitted,
    ) -> Result<(), Problem> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job {
                batch,
                observations,
                reply,
                _admitted: admitted,
            })
            .await
            .map_err(|_| Problem::internal("the observe queue is closed"))?;
        answer
            .await
            .map_err(|_| Problem::internal("an observe worker stopped"))?
    }
}

/// The queue's receiving end, and a request held back from the last group
/// because it did not fit.
struct Waiting {
    receiver: mpsc::Receiver<Job>,
    carried: VecDeque<Job>,
}

impl Waiting {
    /// The next group: what is waiting now (at least one request), at most
    /// [`MAX_GROUP_OBSERVATIONS`] observations. Requests whose callers
    /// have gone are dropped unrun (nothing of them was applied). `None`
    /// once the queue is closed and empty.
    async fn next_group(&mut self) -> Option<Vec<Job>> {
        let mut group = Vec::new();
        let mut observations = 0;
        loop {
            let job = match self.carried.pop_front() {
                Some(job) => job,
                None if group.is_empty() => self.receiver.recv().await?,
                None => match self.receiver.try_recv() {
                    Ok(job) => job,
                    Err(_) => return Some(group),
                },
            };
            if job.reply.is_closed() {
                metrics::counter!(crate::metrics::OBSERVES_SKIPPED).increment(1);
                continue;
            }
            if !group.is_empty() && observations + job.observations > MAX_GROUP_OBSERVATIONS {
                self.carried.push_front(job);
                return Some(group);
            }
            observations += job.observations;
            group.push(job);
        }
    }
}

/// Commits `jobs` as one transaction and answers each.
async fn run_group(db: &DatabaseConnection, cache: Option<&CountCache>, jobs: Vec<Job>) {
    metrics::histogram!(crate::metrics::OBSERVE_GROUP_REQUESTS).record(jobs.len() as f64);
    let mut batch = DeltaBatch::new();
    let mut replies = Vec::with_capacity(jobs.len());
    let mut outcome = Ok(());
    for job in jobs {
        if outcome.is_ok() {
            outcome = batch.append(job.batch).map(|_| ()).map_err(Problem::from);
        }
        replies.push((job.reply, job._admitted));
    }
    if outcome.is_ok() {
        outcome = batch.apply(db).await.map(|_| ()).map_err(Problem::from);
        crate::domain::freshness::confirm_deletions(cache).await;
    }
    for (reply, _admitted) in replies {
        let _ = reply.send(outcome.clone());
    }
}
