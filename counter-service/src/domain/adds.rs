//! Applying adds: each namespace's adds go through a queue whose workers
//! commit what is waiting as one group, one transaction, so 64 clients on
//! one hot counter cost a few transactions at a time, not 64 (the database
//! work a request costs shrinks as the load grows: application-level group
//! commit).
//!
//! A group's transaction, for its requests together:
//!
//! 1. record the requests' `Idempotency-Key`s in the ledger; a request
//!    whose key was recorded before is a replay (answered after the commit
//!    with its stored first answer);
//! 2. record the item ids of the other requests; an id recorded before with
//!    another item is that request's 409;
//! 3. one sorted multi-row upsert of every delta not applied before
//!    ([`DeltaBatch`]);
//! 4. the totals that `addAndGet` requests answer, in one read;
//! 5. store each keyed request's answer beside its key; `COMMIT`.
//!
//! A request that fails for good inside a group (a 409, an overflow) is
//! answered alone, and the group runs again without it: its ids are never
//! committed without its deltas. Groups never hold one id twice (a request
//! sharing an id with one in the group waits for the next group), and a
//! group is at most [`MAX_GROUP_ITEMS`] deltas.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};

use chrono::{DateTime, Utc};
use counter_core::{Counters, DeltaBatch, ErrorKind, observe};
use counter_redis::CountCache;
use sea_orm::{DatabaseConnection, TransactionTrait};
use tokio::sync::{Mutex, mpsc, oneshot};
use tracing::Instrument;

use crate::{
    domain::admission::{Admission, Admitted, Arrival},
    domain::idempotency,
    domain::owner::ServiceOwner,
    domain::writes::{AddAndGetReply, AddReply, BatchAddReply},
    problem::Problem,
};

/// Deltas in one group at most.
pub(crate) const MAX_GROUP_ITEMS: usize = 2_000;
/// Attempts of a group before its requests hear 503.
const ATTEMPTS: u32 = 8;

/// Which endpoint a write came from: what its answer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Add,
    AddAndGet,
    Batch,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Add => "add",
            Op::AddAndGet => "addAndGet",
            Op::Batch => "batchAdd",
        }
    }
}

/// One checked, typed delta.
pub(crate) struct Item<I> {
    pub id: Option<String>,
    pub owner: I,
    pub key: String,
    pub delta: i64,
    pub at: Option<DateTime<Utc>>,
    /// What a retry of this id must send again (empty without an id:
    /// nothing compares it).
    pub canonical: String,
}

/// A checked request, ready to run.
pub(crate) struct Write<I> {
    /// The request's `X-Request-Id`: the group's log lines name it.
    pub request_id: Option<String>,
    pub op: Op,
    pub source: String,
    pub key: Option<String>,
    /// What a retry of its key must send again (empty without a key).
    pub canonical: String,
    pub items: Vec<Item<I>>,
}

impl<I> Write<I> {
    /// Whether the request writes nothing but its deltas: no key or item id
    /// to record, no total to read back.
    fn only_deltas(&self) -> bool {
        self.key.is_none()
            && self.op != Op::AddAndGet
            && self.items.iter().all(|item| item.id.is_none())
    }

    /// Every id the request records, with its source: its key and its
    /// items' ids. Two callers' ids never meet (see `Namespace::source`).
    fn ids(&self) -> impl Iterator<Item = (&str, &str)> {
        self.key
            .as_deref()
            .into_iter()
            .chain(self.items.iter().filter_map(|i| i.id.as_deref()))
            .map(|id| (self.source.as_str(), id))
    }
}

/// An answer: its JSON text, first or replayed.
pub(crate) struct Outcome {
    pub body: String,
    pub replayed: bool,
}

struct Job<I> {
    write: Write<I>,
    reply: oneshot::Sender<Result<Outcome, Problem>>,
    /// The job's place in the queue, given back when the job is answered
    /// or skipped (dropped).
    _admitted: Admitted,
}

impl<I> Job<I> {
    /// Whether its caller has gone (the handler was dropped: the client
    /// left, or the request timed out): nothing waits for its answer.
    fn abandoned(&self) -> bool {
        self.reply.is_closed()
    }
}

/// A namespace's add queue and its workers.
pub(crate) struct AddQueue<I> {
    jobs: mpsc::Sender<Job<I>>,
    admission: Arc<Admission>,
}

impl<I> Clone for AddQueue<I> {
    fn clone(&self) -> Self {
        Self {
            jobs: self.jobs.clone(),
            admission: self.admission.clone(),
        }
    }
}

impl<I: ServiceOwner> AddQueue<I> {
    /// Starts `workers` workers (groups in flight at once), admitting what
    /// `admission` admits; the workers end when every handle is dropped.
    pub fn start(
        db: DatabaseConnection,
        counters: Counters<I>,
        cache: Option<CountCache>,
        workers: usize,
        admission: Admission,
    ) -> Self {
        // Every job counts at least one item, so the channel never holds
        // more jobs than the item bound and `send` never waits.
        let (jobs, waiting) = mpsc::channel(admission.max_items());
        let admission = Arc::new(admission);
        let waiting = Arc::new(Mutex::new(Waiting {
            receiver: waiting,
            carried: VecDeque::new(),
        }));
        for _ in 0..workers.max(1) {
            let (db, counters, cache, waiting, admission) = (
                db.clone(),
                counters.clone(),
                cache.clone(),
                waiting.clone(),
                admission.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let group = waiting.lock().await.next_group().await;
                    let Some(group) = group else { return };
                    let items = group_items(&group);
                    // The group's log lines (the library's statements
                    // included) carry the ids of the requests it serves.
                    let span = tracing::info_span!("add_group", requests = group.len(), request_ids = %request_ids(&group));
                    let run = run_group(&db, &counters, cache.as_ref(), group).instrument(span);
                    admission.draining(items, run).await;
                }
            });
        }
        Self { jobs, admission }
    }

    /// `Ok` if a request arriving as `arrival` says would be admitted
    /// now; the refusal, before its body is read, if not.
    pub fn has_room(&self, arrival: Arrival) -> Result<(), Problem> {
        self.admission.has_room(arrival)
    }

    /// A place in the queue for a request of `items` items that arrived
    /// as `arrival` says, held until the request is answered or
    /// dropped; 503 `overloaded` at once if its items would pass the
    /// queue's bound of items or of time. Taken before the request's items
    /// are checked: under overload most requests are refused, and a refusal
    /// then costs no checking and no canonical form.
    pub fn admit(&self, items: usize, arrival: Arrival) -> Result<Admitted, Problem> {
        self.admission.admit(items, arrival)
    }

    /// Applies `write`, in the place `admitted` holds, with whatever else is
    /// waiting; its answer.
    pub async fn submit(&self, write: Write<I>, admitted: Admitted) -> Result<Outcome, Problem> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job {
                write,
                reply,
                _admitted: admitted,
            })
            .await
            .map_err(|_| Problem::internal("the add queue is closed"))?;
        answer
            .await
            .map_err(|_| Problem::internal("an add worker stopped"))?
    }
}

/// The items of `group`'s requests (each counts at least one).
fn group_items<I>(group: &[Job<I>]) -> usize {
    group.iter().map(|job| job.write.items.len().max(1)).sum()
}

/// The request ids of `group`, comma-separated (the first 20, then a count).
fn request_ids<I>(group: &[Job<I>]) -> String {
    let mut ids: Vec<&str> = group
        .iter()
        .take(20)
        .map(|job| job.write.request_id.as_deref().unwrap_or("-"))
        .collect();
    let more = group.len().saturating_sub(20);
    let more = format!("+{more}");
    if group.len() > 20 {
        ids.push(&more);
    }
    ids.join(",")
}

/// The queue's receiving end, and requests held back from a group because
/// an id of theirs was in it.
struct Waiting<I> {
    receiver: mpsc::Receiver<Job<I>>,
    carried: VecDeque<Job<I>>,
}

impl<I> Waiting<I> {
    /// The next group: what is waiting now (at least one request), without
    /// an id twice, at most [`MAX_GROUP_ITEMS`] deltas (a larger request
    /// goes alone). Requests whose callers have gone are dropped unrun:
    /// nothing of them was applied, and a retry with their key runs them
    /// then. `None` once the queue is closed and empty.
    async fn next_group(&mut self) -> Option<Vec<Job<I>>> {
        loop {
            if self.carried.is_empty() {
                self.carried.push_back(self.receiver.recv().await?);
            }
            while self.carried.len() < MAX_GROUP_ITEMS {
                match self.receiver.try_recv() {
                    Ok(job) => self.carried.push_back(job),
                    Err(_) => break,
                }
            }
            let waiting = self.carried.len();
            self.carried.retain(|job| !job.abandoned());
            let skipped = waiting - self.carried.len();
            if skipped > 0 {
                metrics::counter!(crate::metrics::ADDS_SKIPPED).increment(skipped as u64);
            }
            if !self.carried.is_empty() {
                break;
            }
        }
        let mut group = Vec::new();
        let mut ids: HashSet<(String, String)> = HashSet::new();
        let mut items = 0;
        let mut held = VecDeque::new();
        while let Some(job) = self.carried.pop_front() {
            let size = job.write.items.len();
            let fits = group.is_empty() || items + size <= MAX_GROUP_ITEMS;
            if !fits
                || job
                    .write
                    .ids()
                    .any(|(s, i)| ids.contains(&(s.to_owned(), i.to_owned())))
            {
                held.push_back(job);
                continue;
            }
            ids.extend(
                job.write
                    .ids()
                    .map(|(source, id)| (source.to_owned(), id.to_owned())),
            );
            items += size;
            group.push(job);
        }
        self.carried = held;
        Some(group)
    }
}

/// How a group's attempt failed.
enum Failure {
    /// Request `index` fails for good: answer it, run the rest again.
    Exclude(usize, Problem),
    /// The database refused the group's deltas for good (an overflowing
    /// slot), which no request can be blamed for alone: run each alone.
    Split(Problem),
    /// The database's trouble: nothing is known to be applied, unless the
    /// failure was at `COMMIT` (`at_commit`).
    Retry {
        cause: counter_core::CounterError,
        at_commit: bool,
    },
}

fn database(at_commit: bool) -> impl Fn(sea_orm::DbErr) -> Failure {
    move |e| Failure::Retry {
        cause: e.into(),
        at_commit,
    }
}

/// How a group's batch failed: refused for good (an overflowing slot, bad
/// input: run each request alone), or the database's trouble, which may
/// have applied it when `maybe_applied` (its own commit's answer lost).
fn batch_failure(e: counter_core::CounterError, maybe_applied: bool) -> Failure {
    match e.kind() {
        ErrorKind::InvalidInput | ErrorKind::Overflow | ErrorKind::Misuse => {
            Failure::Split(e.into())
        }
        _ => Failure::Retry {
            cause: e,
            at_commit: maybe_applied,
        },
    }
}

/// A request's fate in a committed group.
enum Done {
    Answered(Outcome),
    /// Its key was applied before: replay the stored answer.
    Replay,
}

/// Runs `jobs` as one group until it commits, answering every request.
async fn run_group<I: ServiceOwner>(
    db: &DatabaseConnection,
    counters: &Counters<I>,
    cache: Option<&CountCache>,
    mut jobs: Vec<Job<I>>,
) {
    let mut backoff = Duration::from_millis(5);
    let mut attempt = 0;
    loop {
        // Before every attempt: a caller that has gone (its timeout) is
        // not waited for; nothing of its request is applied unless an
        // attempt committed, and its retry learns which from its key.
        let waiting = jobs.len();
        jobs.retain(|job| !job.abandoned());
        if jobs.len() < waiting {
            metrics::counter!(crate::metrics::ADDS_SKIPPED)
                .increment((waiting - jobs.len()) as u64);
        }
        if jobs.is_empty() {
            return;
        }
        let (result, touched) = observe::scope(attempt_group(db, counters, &jobs)).await;
        match result {
            Ok(done) => {
                tracing::debug!(requests = jobs.len(), "add group committed");
                metrics::histogram!(crate::metrics::ADD_GROUP_REQUESTS).record(jobs.len() as f64);
                touched.committed().await;
                // Read-your-write on every instance: no answer before the
                // deletions are confirmed (see `freshness`).
                crate::domain::freshness::confirm_deletions(cache).await;
                // The stored first answers of the replays, in one read.
                let replays: Vec<(&str, &str)> = jobs
                    .iter()
                    .zip(&done)
                    .filter(|(_, done)| matches!(done, Done::Replay))
                    .filter_map(|(job, _)| {
                        Some((job.write.source.as_str(), job.write.key.as_deref()?))
                    })
                    .collect();
                let stored = idempotency::stored_of(db, &replays).await;
                for (job, done) in jobs.into_iter().zip(done) {
                    let answer = match done {
                        Done::Answered(outcome) => Ok(outcome),
                        Done::Replay => replay(&stored, &job.write),
                    };
                    let _ = job.reply.send(answer);
                }
                return;
            }
            Err(Failure::Exclude(index, problem)) => {
                let _ = jobs.remove(index).reply.send(Err(problem));
            }
            Err(Failure::Split(problem)) => {
                if jobs.len() == 1 {
                    let _ = jobs.remove(0).reply.send(Err(problem));
                    return;
                }
                for job in jobs {
                    Box::pin(run_group(db, counters, cache, vec![job])).await;
                }
                return;
            }
            Err(Failure::Retry { cause, at_commit }) => {
                if at_commit {
                    // The commit may have happened: its owners are told as
                    // committed (a cache forgets them), as the library does
                    // for a lost `COMMIT` reply of its own.
                    touched.committed().await;
                }
                attempt += 1;
                if !matches!(cause.kind(), ErrorKind::Transient) || attempt >= ATTEMPTS {
                    let problem = Problem::from(cause);
                    for job in jobs {
                        let _ = job.reply.send(Err(problem.clone()));
                    }
                    return;
                }
                if at_commit {
                    // Its outcome is unknown: a request with ids learns it
                    // by running again (its ids say what was applied); one
                    // without would be applied twice.
                    let (keep, unsure): (Vec<_>, Vec<_>) = jobs.into_iter().partition(|job| {
                        job.write.key.is_some() || job.write.items.iter().all(|i| i.id.is_some())
                    });
                    for job in unsure {
                        let _ = job
                            .reply
                            .send(Err(Problem::unavailable("transient", &cause)));
                    }
                    jobs = keep;
                }
                tracing::debug!(%cause, attempt, "add group retried");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
        }
    }
}

/// One attempt: the group's transaction, committed, or rolled back whole.
async fn attempt_group<I: ServiceOwner>(
    db: &DatabaseConnection,
    counters: &Counters<I>,
    jobs: &[Job<I>],
) -> Result<Vec<Done>, Failure> {
    if jobs.iter().all(|job| job.write.only_deltas()) {
        return deltas_alone(db, counters, jobs).await;
    }
    let txn = db.begin().await.map_err(database(false))?;
    let bodies = match group_in(&txn, counters, jobs).await {
        Ok(bodies) => bodies,
        Err(failure) => {
            let _ = txn.rollback().await;
            return Err(failure);
        }
    };
    txn.commit().await.map_err(database(true))?;
    Ok(bodies
        .into_iter()
        .map(|body| match body {
            Some(body) => Done::Answered(Outcome {
                body,
                replayed: false,
            }),
            None => Done::Replay,
        })
        .collect())
}

/// A group whose requests write nothing but their deltas (no key, no item
/// id, no total to answer): the library's batch on the pool, with no
/// transaction of the service's own. One statement is sent in autocommit,
/// one round trip where `BEGIN`, the upsert and `COMMIT` were three (more
/// statements run in the library's own transaction). A failure leaves
/// nothing applied unless its outcome is unknown (a connection lost after
/// the statement went out), which the caller treats as a failed `COMMIT`.
async fn deltas_alone<I: ServiceOwner>(
    db: &DatabaseConnection,
    counters: &Counters<I>,
    jobs: &[Job<I>],
) -> Result<Vec<Done>, Failure> {
    let mut batch = DeltaBatch::new();
    for (index, job) in jobs.iter().enumerate() {
        for item in &job.write.items {
            let at = item.at.unwrap_or_else(Utc::now);
            batch
                .add_at(
                    counters,
                    item.owner.clone(),
                    item.key.as_str(),
                    item.delta,
                    at,
                )
                .map_err(|e| Failure::Exclude(index, e.into()))?;
        }
    }
    batch.apply(db).await.map_err(|e| {
        let maybe_applied = e.outcome_unknown();
        batch_failure(e, maybe_applied)
    })?;
    Ok(jobs
        .iter()
        .map(|job| {
            Done::Answered(Outcome {
                body: first_answer(job.write.op, job.write.items.len() as u64, 0, None),
                replayed: false,
            })
        })
        .collect())
}

/// A request's first answer, as the OpenAPI document types it.
fn first_answer(op: Op, applied: u64, duplicates: u64, total: Option<i64>) -> String {
    match op {
        Op::Add => serde_json::to_string(&AddReply { applied: true }),
        Op::AddAndGet => serde_json::to_string(&AddAndGetReply {
            applied: true,
            total: total.unwrap_or(0),
        }),
        Op::Batch => serde_json::to_string(&BatchAddReply {
            applied,
            duplicates,
        }),
    }
    .unwrap_or_default()
}

/// Steps 1 to 5 on `txn`: each request's answer, `None` for a replay.
async fn group_in<I: ServiceOwner>(
    txn: &sea_orm::DatabaseTransaction,
    counters: &Counters<I>,
    jobs: &[Job<I>],
) -> Result<Vec<Option<String>>, Failure> {
    // 1. The requests' keys: a key recorded before is a replay.
    let keys: Vec<(&str, &str)> = jobs
        .iter()
        .filter_map(|j| Some((j.write.source.as_str(), j.write.key.as_deref()?)))
        .collect();
    let new_keys = idempotency::record_of(txn, &keys)
        .await
        .map_err(database(false))?;
    let replay: Vec<bool> = jobs
        .iter()
        .map(|j| {
            j.write
                .key
                .as_ref()
                .is_some_and(|k| !new_keys.contains(&(j.write.source.clone(), k.clone())))
        })
        .collect();
    // 2. The item ids of the requests that run.
    let item_ids: Vec<(&str, &str)> = jobs
        .iter()
        .zip(&replay)
        .filter(|(_, replay)| !**replay)
        .flat_map(|(j, _)| {
            let source = j.write.source.as_str();
            j.write
                .items
                .iter()
                .filter_map(move |i| Some((source, i.id.as_deref()?)))
        })
        .collect();
    let new_items = idempotency::record_of(txn, &item_ids)
        .await
        .map_err(database(false))?;
    let seen_before: Vec<(&str, &str)> = item_ids
        .iter()
        .copied()
        .filter(|(source, id)| !new_items.contains(&((*source).to_owned(), (*id).to_owned())))
        .collect();
    let stored = idempotency::stored_of(txn, &seen_before)
        .await
        .map_err(database(false))?;
    // 3. One batch of every delta to apply.
    let mut batch = DeltaBatch::new();
    let mut counts = Vec::with_capacity(jobs.len());
    for (index, job) in jobs.iter().enumerate() {
        if replay[index] {
            counts.push((0, 0));
            continue;
        }
        let (mut applied, mut duplicates) = (0u64, 0u64);
        let mut fresh = HashSet::new();
        let source = &job.write.source;
        for (i, item) in job.write.items.iter().enumerate() {
            if let Some(id) = &item.id {
                let pair = (source.clone(), id.clone());
                if !new_items.contains(&pair) {
                    if let Some(before) = stored.get(&pair)
                        && before.request != item.canonical
                    {
                        return Err(Failure::Exclude(
                            index,
                            Problem::idempotency_conflict(id).with("item", i),
                        ));
                    }
                    duplicates += 1;
                    continue;
                }
                if !fresh.insert(id.as_str()) {
                    duplicates += 1;
                    continue;
                }
            }
            let at = item.at.unwrap_or_else(Utc::now);
            if let Err(e) = batch.add_at(
                counters,
                item.owner.clone(),
                item.key.as_str(),
                item.delta,
                at,
            ) {
                return Err(Failure::Exclude(index, e.into()));
            }
            applied += 1;
        }
        counts.push((applied, duplicates));
    }
    batch
        .apply_in(txn)
        .await
        .map_err(|e| batch_failure(e, false))?;
    // 4. The totals `addAndGet` answers, in one read.
    let wanted: Vec<(I, &str)> = jobs
        .iter()
        .zip(&replay)
        .filter(|(j, replay)| !**replay && j.write.op == Op::AddAndGet)
        .map(|(j, _)| {
            (
                j.write.items[0].owner.clone(),
                j.write.items[0].key.as_str(),
            )
        })
        .collect();
    let totals = if wanted.is_empty() {
        HashMap::new()
    } else {
        let owners: Vec<I> = wanted.iter().map(|(o, _)| o.clone()).collect();
        let keys: Vec<&str> = wanted.iter().map(|(_, k)| *k).collect();
        counters
            .get_many(txn, &owners, &keys)
            .await
            .map_err(|e| match e.kind() {
                ErrorKind::Overflow => Failure::Split(e.into()),
                _ => Failure::Retry {
                    cause: e,
                    at_commit: false,
                },
            })?
    };
    // 5. The answers, stored beside their keys; the items' ids with their
    // requests, for the 409 of a reused id.
    let mut bodies = Vec::with_capacity(jobs.len());
    for (index, job) in jobs.iter().enumerate() {
        if replay[index] {
            bodies.push(None);
            continue;
        }
        let (applied, duplicates) = counts[index];
        let total = (job.write.items.first())
            .and_then(|item| totals.get(&item.owner)?.get(&item.key).copied());
        bodies.push(Some(first_answer(job.write.op, applied, duplicates, total)));
    }
    let mut rows: Vec<idempotency::StoredRow<'_>> = Vec::new();
    for (job, body) in jobs.iter().zip(&bodies) {
        let Some(body) = body else { continue };
        let source = job.write.source.as_str();
        let mut fresh = HashSet::new();
        for item in &job.write.items {
            if let Some(id) = &item.id
                && new_items.contains(&(source.to_owned(), id.clone()))
                && fresh.insert(id.as_str())
            {
                rows.push((source, id, &item.canonical, None));
            }
        }
        if let Some(key) = &job.write.key {
            rows.push((source, key, &job.write.canonical, Some(body)));
        }
    }
    idempotency::store_of(txn, &rows)
        .await
        .map_err(database(false))?;
    Ok(bodies)
}

/// The first answer to `write`'s key, if it was given to this same request.
fn replay<I>(
    stored: &Result<HashMap<(String, String), idempotency::Stored>, sea_orm::DbErr>,
    write: &Write<I>,
) -> Result<Outcome, Problem> {
    let key = write.key.as_deref().unwrap_or_default();
    let stored = stored.as_ref().map_err(|e| Problem::from(e.clone()))?;
    match stored.get(&(write.source.clone(), key.to_owned())) {
        Some(first) if first.request == write.canonical => match &first.reply {
            Some(body) => Ok(Outcome {
                body: body.clone(),
                replayed: true,
            }),
            None => Err(Problem::idempotency_conflict(key)),
        },
        _ => Err(Problem::idempotency_conflict(key)),
    }
}
