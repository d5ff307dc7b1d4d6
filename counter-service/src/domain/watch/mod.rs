//! Watching totals (`counts:watch`): each stream gets the totals it
//! watches at once, then the ones that changed, as read after their commit.
//!
//! ```text
//!  this instance's writes ──► Observer ─┬─► Hub.dirty ──► refresher: one grouped read
//!  (counter_core::observe)              │        ▲          per namespace, values fanned
//!                                       ▼        │          out to the Mailboxes that
//!                               bus (outbox) ────┘          watch them (latest value wins)
//!                    other instances ◄──┘ NOTIFY / PUBLISH         │
//!                                                                  ▼
//!                                      Watch::next: at most one event per min_interval
//! ```
//!
//! * A change is only a name (namespace table, owner): every event carries
//!   a total read from the primary after the change committed, never a
//!   sum of deltas, so a lost, late or doubled message costs freshness,
//!   never exactness.
//! * Other instances' changes come through a bus: PostgreSQL
//!   `LISTEN`/`NOTIFY` ([`bus`]), or none, when every watched total is read
//!   again every `watch.poll_ms`. Behind a bus that read still runs, every
//!   30 s, for what a bus can lose.
//! * Everything is bounded by work: streams per instance and per token,
//!   owners per stream, one pending value per watched total. A client that
//!   stops taking what it is sent is closed ([`Reason::SlowConsumer`]).

pub(crate) mod bus;
mod hub;
mod mailbox;
mod read;

use std::collections::BTreeMap;

use serde::Serialize;

pub(crate) use hub::Hub;

/// What one stream watches, checked: owners rendered as answers render
/// them, and the namespace's counted and unique keys among those asked; or
/// the first owners of a counted key's ranking.
#[derive(Debug, Clone)]
pub(crate) struct Interest {
    pub namespace: String,
    pub owners: Vec<String>,
    pub counted: Vec<String>,
    pub unique: Vec<String>,
    pub ranking: Option<RankingInterest>,
}

/// The `limit` first owners of `key`'s ranking.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct RankingInterest {
    pub key: String,
    pub limit: usize,
}

/// A ranking's first owners: a `top:watch` event's data.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct WatchedRanking {
    /// The key ranked.
    pub key: String,
    /// The first owners, highest total first (ties by owner).
    pub owners: Vec<RankedTotal>,
}

/// One owner of a ranking.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct RankedTotal {
    /// The owner, as answers render it.
    pub owner: String,
    /// Its total.
    pub total: i64,
}

/// What an event carries: totals (`counts:watch`) or a ranking
/// (`top:watch`), serialized as itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub(crate) enum Payload {
    Totals(WatchedValues),
    Ranking(WatchedRanking),
}

/// Totals and estimates by owner, then key: an event's data.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct WatchedValues {
    /// `{"<owner>": {"<key>": total}}` of counted keys.
    pub counts: BTreeMap<String, BTreeMap<String, i64>>,
    /// `{"<owner>": {"<key>": estimate}}` of unique keys.
    pub uniques: BTreeMap<String, BTreeMap<String, u64>>,
}

impl WatchedValues {
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty() && self.uniques.is_empty()
    }
}

/// One event of a stream.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Event {
    /// The first: every watched total, or the ranking.
    Snapshot(Payload),
    /// The totals that changed since the event before, or the ranking
    /// again when it changed.
    Change(Payload),
    /// The last: why the stream ends.
    Closed(Reason),
}

/// Why a stream was ended by the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Its client did not take what it was sent within
    /// `watch.slow_after_ms`, or let more than `watch.max_backlog_bytes`
    /// pile up: reconnect, and read faster.
    SlowConsumer,
    /// The instance is shutting down: reconnect (to another instance).
    Draining,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::SlowConsumer => "slow_consumer",
            Reason::Draining => "draining",
        }
    }
}

/// The `closed` event's data.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ClosedEvent {
    /// Why the stream ends.
    pub reason: Reason,
}

/// The connection a stream is sent on, as far as the domain needs it: the
/// HTTP layer implements it (`api::connections::Connection`).
pub(crate) trait Link: Send + Sync + 'static {
    /// Bytes written to the client so far on this connection.
    fn written(&self) -> u64;
    /// Closes the connection now.
    fn close(&self);
}
