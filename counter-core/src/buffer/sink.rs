//! Where a buffer's flushes go when not to the database: a message queue
//! (the `counter-mq` crate's `BufferSink`), which a counting consumer then
//! applies exactly once.

use std::{fmt, future::Future, pin::Pin, sync::Arc};

use sea_orm::Value;

/// A boxed future of [`FlushSink::send`].
pub type SinkFuture<'a> =
    Pin<Box<dyn Future<Output = Result<(), Box<dyn std::error::Error + Send + Sync>>> + Send + 'a>>;

/// Takes a buffer's flushes instead of the database; set with
/// [`BufferBuilder::sink`](crate::BufferBuilder::sink).
///
/// A flush is sent until `send` returns `Ok`, retried with backoff, and
/// every retry carries the same [`Flush::id`] and the same deltas: a sink
/// that derives its message ids from it lets the receiving side apply each
/// flush once even when an earlier attempt did arrive.
pub trait FlushSink: Send + Sync + 'static {
    /// Delivers `flush`; `Ok` once it is durably taken (a broker's
    /// confirmation).
    fn send<'a>(&'a self, flush: &'a Flush) -> SinkFuture<'a>;
}

/// One flush of a buffer: every counter's net delta since the last one.
#[derive(Debug, Clone, PartialEq)]
pub struct Flush {
    pub(super) writer: String,
    pub(super) seq: u64,
    pub(super) deltas: Vec<FlushedDelta>,
}

impl Flush {
    /// `<writer>:<seq>`: unique per buffer start (the writer is a new UUID
    /// each time) and flush, the same on every retry of this flush.
    pub fn id(&self) -> String {
        format!("{}:{}", self.writer, self.seq)
    }

    /// The counters, by table name, owner and key.
    pub fn deltas(&self) -> &[FlushedDelta] {
        &self.deltas
    }
}

/// One counter's net delta in a [`Flush`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FlushedDelta {
    /// The counter table.
    pub table: String,
    /// The owner id as bound in SQL (`Value::BigInt`, `Value::String`, …).
    pub owner: Value,
    /// The counter key.
    pub key: String,
    /// The net delta of the all-time total.
    pub delta: i64,
    /// For a windowed key, the delta of each time bucket (its start in Unix
    /// seconds); they sum to `delta`. Empty for other keys.
    pub buckets: Vec<(i64, i64)>,
}

/// The configured sink, printable for the builder's `Debug`.
#[derive(Clone)]
pub(super) struct Sink(pub Arc<dyn FlushSink>);

impl fmt::Debug for Sink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FlushSink")
    }
}
