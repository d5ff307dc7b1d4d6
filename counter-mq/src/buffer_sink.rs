//! A [`CounterBuffer`](counter_core::CounterBuffer) that flushes to a message
//! queue: thousands of adds per second become one message per flush, and
//! one dedup row per flush at the consumer.

use counter_core::{Flush, FlushSink, SinkFuture};
use sea_orm::Value;
use serde_json::Value as Json;

use crate::{
    error::{MqError, Rejection},
    message::{Change, CounterMessage, MAX_CHANGES},
    publish::Publish,
};

/// Publishes each flush of a [`CounterBuffer`](counter_core::CounterBuffer)
/// as messages of at most [`MAX_CHANGES`] changes and about 512 KiB (half
/// the consumer's limit, and under NATS's default 1 MB payload), one table
/// each, with ids
/// `<writer>:<seq>:<part>`: the same ids on every retry of a flush, so the
/// consumer applies each part once however often it is sent.
///
/// ```no_run
/// # async fn f(db: sea_orm::DatabaseConnection, js: async_nats::jetstream::Context) -> Result<(), Box<dyn std::error::Error>> {
/// use std::{sync::Arc, time::Duration};
/// use counter_core::{CounterBuffer, CounterTable, Counters};
/// use counter_mq::{BufferSink, nats::JetStreamPublisher};
///
/// let posts = Counters::<i64>::new(CounterTable::new("post_counters")?);
/// let views = CounterBuffer::builder(&db)
///     .interval(Duration::from_secs(1))
///     .sink(Arc::new(BufferSink::new(JetStreamPublisher::new(js))))
///     .start()
///     .await?;
/// views.add(&posts, 17, "views", 1)?; // in memory; published with the next flush
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct BufferSink<P> {
    publisher: P,
}

impl<P: Publish + 'static> BufferSink<P> {
    /// Flushes through `publisher`.
    pub fn new(publisher: P) -> Self {
        Self { publisher }
    }
}

impl<P: Publish + 'static> FlushSink for BufferSink<P> {
    fn send<'a>(&'a self, flush: &'a Flush) -> SinkFuture<'a> {
        Box::pin(async move {
            for message in messages_of(flush)? {
                self.publisher.send(&message).await?;
            }
            Ok(())
        })
    }
}

/// The most encoded bytes of changes one message of a flush carries.
const MAX_PART_BYTES: usize = 512 * 1024;

/// The messages of `flush`: per table (in the flush's order), changes in
/// chunks of at most [`MAX_CHANGES`] and [`MAX_PART_BYTES`]; a windowed
/// key's delta as one change per bucket, at the bucket's start.
pub(crate) fn messages_of(flush: &Flush) -> Result<Vec<CounterMessage>, MqError> {
    let id = flush.id();
    let mut messages: Vec<CounterMessage> = Vec::new();
    // The part being filled, and the encoded bytes of its changes.
    let mut current: Option<CounterMessage> = None;
    let mut bytes = 0usize;
    for delta in flush.deltas() {
        let owner = json_of(&delta.owner)?;
        let mut changes = Vec::with_capacity(delta.buckets.len().max(1));
        if delta.buckets.is_empty() {
            changes.push(Change {
                owner,
                key: delta.key.clone(),
                delta: delta.delta,
                at: None,
            });
        } else {
            for &(start, d) in &delta.buckets {
                changes.push(Change {
                    owner: owner.clone(),
                    key: delta.key.clone(),
                    delta: d,
                    at: Some(
                        chrono::DateTime::from_timestamp(start, 0)
                            .ok_or(Rejection::BadTime(start))?,
                    ),
                });
            }
        }
        for change in changes {
            // `[owner,"key",delta,at],`: the owner's JSON, the key, and at
            // most 20 digits for each number and 8 characters of syntax.
            let size = change.owner.to_string().len() + change.key.len() + 48;
            let full = current.as_ref().is_none_or(|m| {
                m.table() != delta.table
                    || m.changes().len() >= MAX_CHANGES
                    || bytes + size > MAX_PART_BYTES
            });
            if full {
                messages.extend(current.take());
                let part = messages.len();
                bytes = 0;
                current = Some(CounterMessage::with_id(
                    format!("{id}:{part}"),
                    &delta.table,
                ));
            }
            bytes += size;
            if let Some(message) = current.as_mut() {
                message.push(change);
            }
        }
    }
    messages.extend(current);
    Ok(messages)
}

/// An owner as JSON: integers as numbers, strings and UUIDs as strings.
fn json_of(owner: &Value) -> Result<Json, MqError> {
    Ok(match owner {
        Value::Int(Some(v)) => Json::from(*v),
        Value::BigInt(Some(v)) => Json::from(*v),
        Value::String(Some(v)) => Json::from(v.as_str()),
        Value::Uuid(Some(v)) => Json::from(v.to_string()),
        other => {
            return Err(Rejection::BadOwner {
                owner: format!("{other:?}"),
                reason: "not an owner id type".into(),
            }
            .into());
        }
    })
}
