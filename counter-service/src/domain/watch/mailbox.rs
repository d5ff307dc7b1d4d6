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

/// When a read ran, on the hub's clock ([`super::hub`] ticks it just
/// before a read is sent and just after its rows are back): the database
/// took the read's snapshot somewhere in between. A read that began after
/// another ended saw every commit the other saw; two reads whose spans
/// overlap (a stream's first read, which may wait for a connection, beside
/// a refresh) are in no known order, whatever order they began in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ReadSpan {
    pub began: u64,
    pub ended: u64,
}

/// How an offered value stands against the one a stream holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    /// Read after it, or the first: it replaces the held value.
    Newer,
    /// Read before it, or the same value: nothing changes.
    NoNews,
    /// Another value from a read in no known order: the held one stays
    /// (a stream never steps back), and the total must be read again,
    /// after both, to know which is the latest.
    Unsure,
}

impl ReadSpan {
    fn standing<T: PartialEq>(self, value: &T, held: Option<(&ReadSpan, &T)>) -> Standing {
        match held {
            None => Standing::Newer,
            Some((span, _)) if self.began > span.ended => Standing::Newer,
            Some((span, _)) if span.began > self.ended => Standing::NoNews,
            Some((_, held)) if held == value => Standing::NoNews,
            Some(_) => Standing::Unsure,
        }
    }
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
    /// The latest value known of each total, with the span of the read it
    /// came from: a value read earlier never replaces one read later
    /// (reads finish out of order).
    current: HashMap<Total, (ReadSpan, Value)>,
    /// What the client was last sent.
    sent: HashMap<Total, Value>,
    /// The totals whose current value differs from the one sent.
    changed: BTreeSet<Total>,
    /// A ranking stream's: the latest ranking read (with its read's
    /// span), the one sent, and whether they differ.
    ranking: Option<(ReadSpan, WatchedRanking)>,
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

    /// Takes the values of the read that ran over `span`, of the totals
    /// this stream watches; wakes the stream if one now differs from what
    /// its client was sent. Returns the owners whose values were in doubt
    /// (see [`ReadSpan`]): the caller reads them again.
    #[must_use = "owners in doubt must be read again"]
    pub fn offer<'a>(
        &self,
        span: ReadSpan,
        values: impl IntoIterator<Item = (&'a Total, Value)>,
    ) -> BTreeSet<String> {
        let mut state = self.state();
        let mut woke = false;
        let mut unsure = BTreeSet::new();
        for (total, value) in values {
            if !self.watches(&total.1) {
                continue;
            }
            let held = state.current.get(total).map(|(span, value)| (span, value));
            match span.standing(&value, held) {
                Standing::NoNews => continue,
                Standing::Unsure => {
                    unsure.insert(total.0.clone());
                    continue;
                }
                Standing::Newer => {}
            }
            state.current.insert(total.clone(), (span, value));
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
        unsure
    }

    /// Takes `ranking`, read over `span`; wakes the stream if it differs
    /// from the one its client was sent. Returns whether it was in doubt
    /// (see [`ReadSpan`]): the caller reads the ranking again.
    #[must_use = "a ranking in doubt must be read again"]
    pub fn offer_ranking(&self, span: ReadSpan, ranking: &WatchedRanking) -> bool {
        let mut state = self.state();
        let held = state
            .ranking
            .as_ref()
            .map(|(span, ranking)| (span, ranking));
        match span.standing(ranking, held) {
            Standing::NoNews => return false,
            Standing::Unsure => return true,
            Standing::Newer => {}
        }
        state.ranking = Some((span, ranking.clone()));
        let changed = state.ranking_sent.as_ref() != Some(ranking);
        let woke = changed && !state.ranking_changed;
        state.ranking_changed = changed;
        drop(state);
        if woke {
            self.ready.notify_one();
        }
        false
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn counted(owner: &str, key: &str) -> Mailbox {
        let interest = Interest {
            namespace: "posts".into(),
            owners: vec![owner.into()],
            counted: vec![key.into()],
            unique: Vec::new(),
            ranking: None,
        };
        Mailbox::new(1, String::new(), interest, None)
    }

    fn span(began: u64, ended: u64) -> ReadSpan {
        ReadSpan { began, ended }
    }

    /// The count the stream holds now (what its next event would carry).
    fn held(mailbox: &Mailbox) -> Option<i64> {
        let Some(Payload::Totals(values)) = mailbox.take(true) else {
            panic!("a counts stream takes totals");
        };
        values
            .counts
            .get("1")
            .and_then(|keys| keys.get("likes"))
            .copied()
    }

    #[test]
    fn a_value_replaces_the_held_one_only_when_read_after_it() {
        let total: Total = ("1".into(), "likes".into());
        let mailbox = counted("1", "likes");
        assert!(
            mailbox
                .offer(span(10, 20), [(&total, Value::Count(5))])
                .is_empty()
        );
        // Read before it: dropped, nothing to read again.
        assert!(
            mailbox
                .offer(span(1, 9), [(&total, Value::Count(3))])
                .is_empty()
        );
        assert_eq!(held(&mailbox), Some(5));
        // Overlapping, the same value: no news.
        assert!(
            mailbox
                .offer(span(15, 30), [(&total, Value::Count(5))])
                .is_empty()
        );
        // Overlapping, another value (began later, which proves nothing):
        // the held one stays and the owner is read again.
        let unsure = mailbox.offer(span(12, 40), [(&total, Value::Count(4))]);
        assert_eq!(unsure, BTreeSet::from(["1".to_owned()]));
        assert_eq!(held(&mailbox), Some(5));
        // Read after it: replaces it.
        assert!(
            mailbox
                .offer(span(21, 22), [(&total, Value::Count(4))])
                .is_empty()
        );
        assert_eq!(held(&mailbox), Some(4));
    }

    #[test]
    fn a_ranking_in_doubt_is_kept_and_read_again() {
        let interest = Interest {
            namespace: "posts".into(),
            owners: Vec::new(),
            counted: Vec::new(),
            unique: Vec::new(),
            ranking: Some(super::super::RankingInterest {
                key: "likes".into(),
                limit: 1,
            }),
        };
        let mailbox = Mailbox::new(1, String::new(), interest, None);
        let ranking = |owner: &str, total| WatchedRanking {
            key: "likes".into(),
            owners: vec![super::super::RankedTotal {
                owner: owner.into(),
                total,
            }],
        };
        assert!(!mailbox.offer_ranking(span(10, 20), &ranking("a", 3)));
        assert!(mailbox.offer_ranking(span(5, 30), &ranking("b", 4)));
        assert!(!mailbox.offer_ranking(span(1, 4), &ranking("c", 1)));
        assert_eq!(mailbox.take(true), Some(Payload::Ranking(ranking("a", 3))));
        assert!(!mailbox.offer_ranking(span(31, 32), &ranking("b", 4)));
        assert_eq!(mailbox.take(false), Some(Payload::Ranking(ranking("b", 4))));
    }

    /// A small deterministic generator: schedules are reproducible by seed.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// Reads of one total that overlap at random and are delivered in any
    /// order after they end, against commits that only add (so a value
    /// older than another is smaller): what the stream holds never goes
    /// back, and a read begun after the last commit leaves it holding the
    /// last value. A doubt is read again, beginning when it is found.
    #[test]
    fn reads_in_any_order_never_take_a_stream_back() {
        let total: Total = ("1".into(), "likes".into());
        let mut doubts = 0;
        for seed in 1..=300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let commits: Vec<u64> = {
                let mut at: Vec<u64> = (0..40).map(|_| rng.below(1_000)).collect();
                at.sort_unstable();
                at
            };
            let value_at = |t: u64| commits.iter().filter(|c| **c < t).count() as i64;
            // (delivered at, the read's number) -> (began, snapshot at, ended)
            let mut reads: BTreeMap<(u64, usize), (u64, u64, u64)> = BTreeMap::new();
            let mut numbered = 0;
            let mut read = |rng: &mut Rng, began: u64, reads: &mut BTreeMap<_, _>| {
                let ended = began + 2 + rng.below(200);
                let snapshot = began + 1 + rng.below(ended - began - 1);
                let delivered = ended + rng.below(150);
                numbered += 1;
                reads.insert((delivered, numbered), (began, snapshot, ended));
            };
            for _ in 0..30 {
                let began = rng.below(1_000);
                read(&mut rng, began, &mut reads);
            }
            let mailbox = counted("1", "likes");
            let mut shown = i64::MIN;
            let mut latest_snapshot = 0;
            while let Some(((delivered, _), (began, snapshot, ended))) = reads.pop_first() {
                latest_snapshot = latest_snapshot.max(snapshot);
                let unsure = mailbox.offer(
                    span(began, ended),
                    [(&total, Value::Count(value_at(snapshot)))],
                );
                if !unsure.is_empty() {
                    doubts += 1;
                    read(&mut rng, delivered + 1, &mut reads);
                }
                let now = held(&mailbox).expect("a value is held after the first read");
                assert!(
                    now >= shown,
                    "seed {seed}: the stream went back from {shown} to {now}"
                );
                shown = now;
            }
            // The doubts read again, the stream holds the newest value any
            // read saw (without the reads again, some schedules end older).
            assert_eq!(
                shown,
                value_at(latest_snapshot),
                "seed {seed}: not the newest value read"
            );
            let last = span(2_000, 2_001);
            assert!(
                mailbox
                    .offer(last, [(&total, Value::Count(value_at(2_000)))])
                    .is_empty()
            );
            assert_eq!(held(&mailbox), Some(commits.len() as i64), "seed {seed}");
        }
        // The schedules did overlap: doubts were found and read again.
        assert!(doubts > 100, "only {doubts} doubts in 300 schedules");
    }
}
