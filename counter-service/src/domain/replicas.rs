//! Reads that accept a bounded lag, served by PostgreSQL standbys.
//!
//! A standby is trusted by WAL position, not by a clock: every probe
//! (`bound / 10`, 20 ms to 1 s) notes the instant `t` it began and then the
//! primary's flushed WAL position `L` (`pg_current_wal_flush_lsn()`), and
//! asks each standby how far it has replayed (`pg_last_wal_replay_lsn()`).
//! A standby that has replayed `L` holds every commit acknowledged before
//! `t`, so it is fresh as of the newest such `t`. A read begins on a
//! standby only while that instant is within the bound; the standby's
//! replay only moves forward, so the read sees every add acknowledged more
//! than the bound before it began. A standby that fell behind, stopped
//! answering, or is no longer a standby (Patroni promoted it) is passed
//! over, and a read with no standby within the bound goes to the primary,
//! as does a read a standby failed. The replay timestamp
//! (`now() - pg_last_xact_replay_timestamp()`) is not used: on a quiet
//! primary it grows while the standby is exactly current, and it trusts two
//! servers' clocks.
//!
//! Only reads their caller marked as lag-tolerant come here; reads that
//! promise read-your-write (an add's answer, a cache fill) take the
//! primary without asking.

use std::{
    collections::VecDeque,
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use counter_core::pooling::query_one;
use sea_orm::{DatabaseConnection, DbBackend, Statement};
use tokio::sync::watch;

use crate::metrics::{READS, REPLICA_FALLBACKS, REPLICA_LAG};

/// Where a read was served from, as its answer says
/// (`Counter-Read-Source`) and `counter_service_reads_total` counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The primary (through the configured database URL).
    Primary,
    /// A standby, fresh as of `lag` before the read began.
    Replica { lag: Duration },
    /// The cache tier: Redis, its misses filled from the primary.
    Cache,
}

impl Source {
    /// The label and header value.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Primary => "primary",
            Source::Replica { .. } => "replica",
            Source::Cache => "cache",
        }
    }
}

/// One standby.
pub(crate) struct Replica {
    /// `host:port`, the label of its metrics.
    pub name: String,
    pub db: DatabaseConnection,
    /// The newest probe instant whose primary position it had replayed.
    fresh_as_of: Mutex<Option<Instant>>,
}

impl Replica {
    fn fresh_as_of(&self) -> Option<Instant> {
        *self.fresh_as_of.lock().expect("not poisoned")
    }

    fn set_fresh_as_of(&self, at: Option<Instant>) {
        *self.fresh_as_of.lock().expect("not poisoned") = at;
    }
}

/// The standbys, what each was last seen to hold, and the bound.
pub(crate) struct Replicas {
    members: Vec<Replica>,
    bound: Duration,
    /// The primary's flushed positions, newest last: `(instant, lsn)`.
    marks: Mutex<VecDeque<(Instant, i64)>>,
    /// Round-robin among the fresh standbys.
    next: AtomicUsize,
}

impl Replicas {
    /// The standbys `members` (name, lazily connected pool) kept within
    /// `bound`.
    pub fn new(members: Vec<(String, DatabaseConnection)>, bound: Duration) -> Self {
        Self {
            members: members
                .into_iter()
                .map(|(name, db)| Replica {
                    name,
                    db,
                    fresh_as_of: Mutex::new(None),
                })
                .collect(),
            bound,
            marks: Mutex::new(VecDeque::new()),
            next: AtomicUsize::new(0),
        }
    }

    /// How often the standbys are measured: a tenth of the bound, 20 ms to
    /// 1 s (a standby's measured lag is at least this).
    pub fn probe_every(&self) -> Duration {
        (self.bound / 10).clamp(Duration::from_millis(20), Duration::from_secs(1))
    }

    /// A standby fresh within the bound now, and its lag: the next in turn
    /// of those that are.
    pub fn pick(&self) -> Option<(&Replica, Duration)> {
        let now = Instant::now();
        let count = self.members.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..count)
            .map(|i| &self.members[(start + i) % count])
            .find_map(|replica| {
                let lag = now.saturating_duration_since(replica.fresh_as_of()?);
                (lag <= self.bound).then_some((replica, lag))
            })
    }

    /// One round: the primary's position, then every standby's.
    pub async fn probe(&self, primary: &DatabaseConnection) {
        let began = Instant::now();
        match flushed(primary).await {
            Ok(lsn) => {
                let keep = (2 * self.bound.as_nanos() / self.probe_every().as_nanos().max(1))
                    .clamp(4, 1_000) as usize;
                let mut marks = self.marks.lock().expect("not poisoned");
                marks.push_back((began, lsn));
                while marks.len() > keep {
                    marks.pop_front();
                }
            }
            Err(error) => tracing::debug!(%error, "replica probe: the primary's position"),
        }
        let timeout = self.probe_every().max(Duration::from_millis(500));
        let rounds = self.members.iter().map(|replica| async move {
            let replayed = tokio::time::timeout(timeout, replayed(&replica.db)).await;
            let fresh_as_of = match replayed {
                Ok(Ok(Some(lsn))) => self.newest_mark_within(lsn),
                Ok(Ok(None)) => None,
                Ok(Err(error)) => {
                    tracing::debug!(replica = %replica.name, %error, "replica probe failed");
                    None
                }
                Err(_) => None,
            };
            replica.set_fresh_as_of(fresh_as_of);
            let lag = fresh_as_of.map_or(-1.0, |at| {
                Instant::now().saturating_duration_since(at).as_secs_f64()
            });
            metrics::gauge!(REPLICA_LAG, "replica" => replica.name.clone()).set(lag);
        });
        futures_util::future::join_all(rounds).await;
    }

    /// The instant of the newest mark at or below `lsn`.
    fn newest_mark_within(&self, lsn: i64) -> Option<Instant> {
        let marks = self.marks.lock().expect("not poisoned");
        marks
            .iter()
            .rev()
            .find(|(_, mark)| *mark <= lsn)
            .map(|(at, _)| *at)
    }

    /// Probes until `stopped` turns true.
    pub async fn keep_measuring(
        &self,
        primary: DatabaseConnection,
        mut stopped: watch::Receiver<bool>,
    ) {
        let mut every = tokio::time::interval(self.probe_every());
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => self.probe(&primary).await,
                _ = stopped.changed() => return,
            }
            if *stopped.borrow() {
                return;
            }
        }
    }
}

/// Where one lag-tolerant read goes: a standby within the bound, or the
/// primary. [`read_from!`] is its one user.
pub(crate) struct Choice<'r> {
    replica: Option<(&'r Replica, Duration)>,
    op: &'static str,
}

/// What became of a read's first try.
pub(crate) enum Settled<T, E> {
    /// Served (or failed by the primary, whose answer stands).
    Done(Result<(T, Source), E>),
    /// A standby failed it: run it on the primary.
    Retry,
}

impl<'r> Choice<'r> {
    /// A standby within the bound when `tolerate_lag` and one is; the
    /// primary otherwise (a lag-tolerant read the primary serves is counted
    /// as a fallback).
    pub fn of(replicas: Option<&'r Replicas>, tolerate_lag: bool, op: &'static str) -> Self {
        let replica = match replicas.filter(|_| tolerate_lag) {
            None => None,
            Some(replicas) => {
                let picked = replicas.pick();
                if picked.is_none() {
                    metrics::counter!(REPLICA_FALLBACKS, "reason" => "lag").increment(1);
                }
                picked
            }
        };
        Self { replica, op }
    }

    /// The connection to read on.
    pub fn db<'a>(&self, primary: &'a DatabaseConnection) -> &'a DatabaseConnection
    where
        'r: 'a,
    {
        self.replica.map_or(primary, |(replica, _)| &replica.db)
    }

    /// The read's outcome: counted where it was served, or, if a standby
    /// failed it, that standby distrusted until its next probe and the
    /// read to be run on the primary.
    pub fn settle<T, E: std::fmt::Debug>(self, result: Result<T, E>) -> Settled<T, E> {
        match (self.replica, result) {
            (Some((replica, _)), Err(error)) => {
                tracing::warn!(replica = %replica.name, ?error, "a read on a standby failed: served by the primary");
                replica.set_fresh_as_of(None);
                metrics::counter!(REPLICA_FALLBACKS, "reason" => "error").increment(1);
                Settled::Retry
            }
            (Some((_, lag)), Ok(value)) => {
                Settled::Done(Ok(counted(self.op, (value, Source::Replica { lag }))))
            }
            (None, result) => {
                Settled::Done(result.map(|value| counted(self.op, (value, Source::Primary))))
            }
        }
    }
}

/// Runs `$read` (an expression that reads on `$db` and yields a `Result`)
/// on a standby of `$replicas` (an `Option<&Replicas>`) within the bound
/// when `$tolerate_lag`, else on `$primary`, and on `$primary` again if the
/// standby failed it; yields `Result<(value, Source), error>`. A macro, not
/// a function taking an async closure: the read borrows the handler's
/// locals, and a closure's future is not provably `Send` for every lifetime
/// (what axum requires).
macro_rules! read_from {
    ($replicas:expr, $primary:expr, $tolerate_lag:expr, $op:expr, |$db:ident| $read:expr) => {{
        let primary: &sea_orm::DatabaseConnection = $primary;
        let choice = $crate::domain::replicas::Choice::of($replicas, $tolerate_lag, $op);
        let first = {
            let $db = choice.db(primary);
            $read
        };
        match choice.settle(first) {
            $crate::domain::replicas::Settled::Done(done) => done,
            $crate::domain::replicas::Settled::Retry => {
                let $db = primary;
                $read.map(|value| {
                    $crate::domain::replicas::counted(
                        $op,
                        (value, $crate::domain::replicas::Source::Primary),
                    )
                })
            }
        }
    }};
}
pub(crate) use read_from;

/// Counts a served read.
pub(crate) fn counted<T>(op: &'static str, served: (T, Source)) -> (T, Source) {
    metrics::counter!(READS, "op" => op, "source" => served.1.as_str()).increment(1);
    served
}

/// The primary's flushed WAL position (every acknowledged commit is at or
/// below it).
async fn flushed(primary: &DatabaseConnection) -> Result<i64, sea_orm::DbErr> {
    let row = query_one(
        primary,
        Statement::from_string(
            DbBackend::Postgres,
            "SELECT (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::bigint AS lsn",
        ),
    )
    .await?
    .ok_or_else(|| sea_orm::DbErr::RecordNotFound("pg_current_wal_flush_lsn".into()))?;
    row.try_get("", "lsn")
}

/// A standby's replayed WAL position; `None` from a server that is not a
/// standby (a promoted one is the primary's business, not a replica).
async fn replayed(replica: &DatabaseConnection) -> Result<Option<i64>, sea_orm::DbErr> {
    let row = query_one(
        replica,
        Statement::from_string(
            DbBackend::Postgres,
            "SELECT pg_is_in_recovery() AS standby, \
             (pg_last_wal_replay_lsn() - '0/0'::pg_lsn)::bigint AS replayed",
        ),
    )
    .await?;
    let Some(row) = row else { return Ok(None) };
    let standby: bool = row.try_get("", "standby")?;
    let replayed: Option<i64> = row.try_get("", "replayed")?;
    Ok(replayed.filter(|_| standby))
}
