//! One stream's mailbox: the latest value of each total it watches, what
//! its client was last sent, and whether its client keeps up.
//!
//! Memory is bounded by what the stream watches: one current and one sent
//! value per watched total, however many changes arrive.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use tokio::sync::Notify;

use super::{Interest, Link, Payload, Reason, WatchedRanking, WatchedValues};

/// A watched total: (owner, key).
pub(super) type Total = (String, String);

/// A total's value: a sum of deltas or a distinct-member estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Value {
    Count(i64),
    Unique(u64),
}

pub(super) struct Mailbox {
    pub id: u64,
    /// The token whose stream this is (its bound of streams).
    pub token: String,
    pub interest: Interest,
    counted: HashSet<String>,
    unique: HashSet<String>,
    state: Mutex<State>,
    ready: Notify,
    link: Option<Arc<dyn Link>>,
    /// The connection's bytes written when the stream began.
    written_at_start: u64,
}

#[derive(Default)]
struct State {
    /// The latest value known of each total, with the sequence number of
    /// the read it came from: a value read earlier never replaces one read
    /// later (reads finish out of order).
    current: HashMap<Total, (u64, Value)>,
    /// What the client was last sent.
    sent: HashMap<Total, Value>,
    /// The totals whose current value differs from the one sent.
    changed: BTreeSet<Total>,
    /// A ranking stream's: the latest ranking read (with its read's
    /// number), the one sent, and whether they differ.
    ranking: Option<(u64, WatchedRanking)>,
    ranking_sent: Option<WatchedRanking>,
    ranking_changed: bool,
    closed: Option<Reason>,
    /// Bytes of events handed to the connection, and the largest event.
    handed: u64,
    largest: u64,
    /// Bytes the client had taken at the last look, and since when it has
    /// taken none while some waited for it.
    taken: u64,
    stalled_since: Option<Instant>,
}

impl Mailbox {
    pub fn new(id: u64, token: String, interest: Interest, link: Option<Arc<dyn Link>>) -> Self {
        let written_at_start = link.as_ref().map_or(0, |l| l.written());
        Self {
            id,
            token,
            counted: interest.counted.iter().cloned().collect(),
            unique: interest.unique.iter().cloned().collect(),
            interest,
            state: Mutex::default(),
            ready: Notify::new(),
            link,
            written_at_start,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether this stream watches `key` (of an owner it watches).
    pub fn watches(&self, key: &str) -> bool {
        self.counted.contains(key) || self.unique.contains(key)
    }

    /// Takes the values of read `seq` of the totals this stream watches;
    /// wakes the stream if one now differs from what its client was sent.
    pub fn offer<'a>(&self, seq: u64, values: impl IntoIterator<Item = (&'a Total, Value)>) {
        let mut state = self.state();
        let mut woke = false;
        for (total, value) in values {
            if !self.watches(&total.1) {
                continue;
            }
            let newer = match state.current.get(total) {
                Some((known, _)) => *known <= seq,
                None => true,
            };
            if !newer {
                continue;
            }
            state.current.insert(total.clone(), (seq, value));
            if state.sent.get(total) == Some(&value) {
                state.changed.remove(total);
            } else {
                woke |= state.changed.insert(total.clone());
            }
        }
        drop(state);
        if woke {
            self.ready.notify_one();
        }
    }

    /// Takes ranking `ranking` of read `seq`; wakes the stream if it
    /// differs from the one its client was sent.
    pub fn offer_ranking(&self, seq: u64, ranking: &WatchedRanking) {
        let mut state = self.state();
        if state
            .ranking
            .as_ref()
            .is_some_and(|(known, _)| *known > seq)
        {
            return;
        }
        state.ranking = Some((seq, ranking.clone()));
        let changed = state.ranking_sent.as_ref() != Some(ranking);
        let woke = changed && !state.ranking_changed;
        state.ranking_changed = changed;
        drop(state);
        if woke {
            self.ready.notify_one();
        }
    }

    /// Every value known (the first event), or the changed ones; marked
    /// sent. `None` when nothing changed.
    pub fn take(&self, all: bool) -> Option<Payload> {
        if self.interest.ranking.is_some() {
            let mut state = self.state();
            if !all && !state.ranking_changed {
                return None;
            }
            state.ranking_changed = false;
            let ranking = state
                .ranking
                .as_ref()
                .map(|(_, r)| r.clone())
                .unwrap_or_default();
            state.ranking_sent = Some(ranking.clone());
            return Some(Payload::Ranking(ranking));
        }
        self.take_totals(all).map(Payload::Totals)
    }

    fn take_totals(&self, all: bool) -> Option<WatchedValues> {
        let mut state = self.state();
        let totals: Vec<Total> = if all {
            state.current.keys().cloned().collect()
        } else {
            std::mem::take(&mut state.changed).into_iter().collect()
        };
        state.changed.clear();
        let mut values = WatchedValues::default();
        for total in totals {
            let Some(&(_, value)) = state.current.get(&total) else {
                continue;
            };
            state.sent.insert(total.clone(), value);
            let (owner, key) = total;
            match value {
                Value::Count(n) => {
                    values.counts.entry(owner).or_default().insert(key, n);
                }
                Value::Unique(n) => {
                    values.uniques.entry(owner).or_default().insert(key, n);
                }
            }
        }
        (all || !values.is_empty()).then_some(values)
    }

    /// Whether a change waits to be sent.
    pub fn has_changes(&self) -> bool {
        let state = self.state();
        !state.changed.is_empty() || state.ranking_changed
    }

    /// Ends the stream for `reason` (the first reason stays); `false` if
    /// it was ended already.
    pub fn close(&self, reason: Reason) -> bool {
        let mut state = self.state();
        if state.closed.is_some() {
            return false;
        }
        state.closed = Some(reason);
        drop(state);
        self.ready.notify_one();
        true
    }

    pub fn closed(&self) -> Option<Reason> {
        self.state().closed
    }

    /// Waits until something may be sent (a change, the end).
    pub async fn ready(&self) {
        self.ready.notified().await;
    }

    /// Counts `bytes` of an event handed to the connection.
    pub fn handed(&self, bytes: u64) {
        let mut state = self.state();
        state.handed += bytes;
        state.largest = state.largest.max(bytes);
    }

    /// Whether the client keeps up: `false` when bytes handed to its
    /// connection have waited `slow_after` with none of them taken, or when
    /// more than `max_backlog` wait. A stream without a connection to
    /// measure always keeps up.
    pub fn keeps_up(&self, now: Instant, slow_after: Duration, max_backlog: u64) -> bool {
        let Some(link) = &self.link else { return true };
        let taken = link.written().saturating_sub(self.written_at_start);
        let mut state = self.state();
        let backlog = state.handed.saturating_sub(taken);
        // One event larger than the bound is no sign of a slow client.
        if backlog > max_backlog.max(2 * state.largest) {
            return false;
        }
        if backlog == 0 || taken > state.taken {
            state.taken = taken;
            state.stalled_since = (backlog > 0).then_some(now);
            return true;
        }
        let since = *state.stalled_since.get_or_insert(now);
        now.duration_since(since) < slow_after
    }

    /// Closes the connection the stream is sent on.
    pub fn hang_up(&self) {
        if let Some(link) = &self.link {
            link.close();
        }
    }
}
