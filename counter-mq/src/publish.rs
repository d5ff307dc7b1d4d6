//! Publishing counter changes: a message per event or per flush, retried
//! with the same id until the broker confirms it.

use std::{future::Future, time::Instant};

use chrono::Utc;
use counter_core::{Counters, DeltaBatch, KeyOf, KeySpace, OwnerId};
use serde::Serialize;

use crate::{
    error::{BrokerError, MqError, Rejection},
    message::{Change, CounterMessage},
};

/// What the broker confirmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// The message id.
    pub id: String,
    /// The broker had this id already (JetStream, within the stream's
    /// duplicate window) and did not store it again.
    pub duplicate: bool,
}

/// A broker that takes counter messages: [`JetStreamPublisher`](crate::nats::JetStreamPublisher)
/// or [`AmqpPublisher`](crate::amqp::AmqpPublisher).
pub trait Publish: Send + Sync {
    /// Sends `message` and waits for the broker's confirmation, retrying
    /// with the same id on failure. An `Err` leaves the outcome unknown:
    /// send the same message again (same id), and the consumer applies it
    /// at most once.
    fn send(&self, message: &CounterMessage) -> impl Future<Output = Result<Sent, MqError>> + Send;

    /// Publishes one event, `delta` to `key` of `owner` in `counters`'
    /// table, as a message with a new UUIDv7 id and the time of now (the
    /// event's time bucket for a windowed key). The key and owner are
    /// checked here, as the consumer will.
    ///
    /// ```no_run
    /// # async fn f(publisher: counter_mq::nats::JetStreamPublisher) -> Result<(), counter_mq::MqError> {
    /// use counter_core::{CounterTable, Counters};
    /// use counter_mq::Publish;
    ///
    /// let posts = Counters::<i64>::new(CounterTable::new("post_counters")?);
    /// publisher.publish(&posts, 17, "views", 1).await?;
    /// # Ok(()) }
    /// ```
    fn publish<I, S, K>(
        &self,
        counters: &Counters<I, S>,
        owner: I,
        key: K,
        delta: i64,
    ) -> impl Future<Output = Result<Sent, MqError>> + Send
    where
        I: OwnerId + Serialize,
        S: KeySpace,
        K: KeyOf<S>,
    {
        let built = message_of(counters, owner, key, delta);
        async move { self.send(&built?).await }
    }
}

/// One event as a message, checked as a consumer would check it.
pub(crate) fn message_of<I, S, K>(
    counters: &Counters<I, S>,
    owner: I,
    key: K,
    delta: i64,
) -> Result<CounterMessage, MqError>
where
    I: OwnerId + Serialize,
    S: KeySpace,
    K: KeyOf<S>,
{
    let at = Utc::now();
    let json = serde_json::to_value(&owner).map_err(|e| Rejection::BadOwner {
        owner: format!("{owner:?}"),
        reason: e.to_string(),
    })?;
    let key_name = key.as_key_str().to_owned();
    // The same checks as the consumer's: key, owner, window.
    DeltaBatch::new().add_at(counters, owner, key, delta, at)?;
    let mut message = CounterMessage::new(counters.table().name());
    message.push(Change {
        owner: json,
        key: key_name,
        delta,
        at: Some(at),
    });
    Ok(message)
}

/// What a redelivery horizon adds to the broker's own retention (a
/// stream's `max_age`, a queue's message TTL): a publisher's retries of one
/// id, which may store a second copy that long after the first, and clocks
/// that disagree.
pub(crate) const HORIZON_MARGIN: std::time::Duration = std::time::Duration::from_secs(3600);

/// A publisher's `retry_for`, kept inside [`HORIZON_MARGIN`]: a copy stored
/// later than that could outlive its dedup row.
pub(crate) fn capped_retry(retry_for: std::time::Duration) -> std::time::Duration {
    if retry_for > HORIZON_MARGIN {
        tracing::warn!(
            ?retry_for,
            "counter publisher: retry_for is cut to one hour, the margin of the consumer's dedup retention"
        );
    }
    retry_for.min(HORIZON_MARGIN)
}

/// Runs `attempt` until it succeeds or `deadline` passes (then its last
/// error), pausing 50 ms doubling to 2 s between attempts; an attempt that
/// hangs (a broker that took the message and is gone) is abandoned at the
/// deadline. Rejections of the message itself are not retried.
pub(crate) async fn retry_until<F, Fut>(deadline: Instant, mut attempt: F) -> Result<Sent, MqError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Sent, MqError>>,
{
    let mut pause = std::time::Duration::from_millis(50);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let left = left.max(std::time::Duration::from_millis(1));
        let outcome = tokio::time::timeout(left, attempt())
            .await
            .unwrap_or_else(|_| Err(BrokerError::timed_out("publish", left).into()));
        match outcome {
            Ok(sent) => return Ok(sent),
            Err(error @ MqError::Message(_)) => return Err(error),
            Err(error) if Instant::now() + pause >= deadline => return Err(error),
            Err(error) => {
                tracing::warn!(%error, retry_in_ms = pause.as_millis() as u64, "counter publisher: not confirmed; retrying with the same id");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(2));
            }
        }
    }
}
