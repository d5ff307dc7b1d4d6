//! Publishing counter changes: a message per event or per flush, retried
//! with the same id until the broker confirms it.

use std::{future::Future, time::Instant};

use chrono::Utc;
use counter_core::{Counters, DeltaBatch, KeyOf, KeySpace, OwnerId, UniqueKeyOf};
use serde::Serialize;

use crate::{
    error::{BrokerError, MqError, Rejection},
    message::{Change, CounterMessage, Observation},
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
///
/// # Retrying
///
/// Every method already retries with the same id until the broker confirms
/// or the publisher's `retry_for` has passed. An `Err` after that leaves
/// the outcome unknown: the message may be stored. What a retry must not do
/// is publish the event *anew*, under a new id: if the first attempt was
/// stored, the event counts twice. The safe retries:
///
/// * the message of an [`MqError::Unconfirmed`] (what [`publish`](Self::publish)
///   returns when the broker did not confirm), sent again with
///   [`send`](Self::send);
/// * [`publish_with_id`](Self::publish_with_id), whose id comes from the
///   caller (a request's idempotency key, an outbox row): call it again as
///   it is, as often as needed;
/// * a message built once ([`CounterMessage::event`]), sent in a loop.
///
/// ```no_run
/// # async fn f(publisher: counter_mq::nats::JetStreamPublisher) -> Result<(), counter_mq::MqError> {
/// use counter_core::{CounterTable, Counters};
/// use counter_mq::{CounterMessage, MqError, Publish};
///
/// let posts = Counters::<i64>::new(CounterTable::new("post_counters")?);
/// // Your own retry loop: the id is fixed before the first attempt.
/// let message = CounterMessage::event(&posts, 17, "views", 1)?;
/// for attempt in 1.. {
///     match publisher.send(&message).await {
///         Ok(_) => break,
///         Err(e) if e.kind() == counter_core::ErrorKind::Transient && attempt < 3 => continue,
///         Err(e) => return Err(e),
///     }
/// }
/// // Or keep what `publish` could not get confirmed, to send later.
/// if let Err(MqError::Unconfirmed { message, .. }) = publisher.publish(&posts, 17, "likes", 1).await {
///     publisher.send(&message).await?; // the same id: applied at most once
/// }
/// # Ok(()) }
/// ```
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
    /// When the broker does not confirm it, the error is
    /// [`MqError::Unconfirmed`] with the message: send *that* again (see
    /// the trait's "Retrying"); calling `publish` again makes a second
    /// event.
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
        let built = CounterMessage::event(counters, owner, key, delta);
        async move { send_keeping(self, built?).await }
    }

    /// [`publish`](Self::publish) under the caller's idempotency id (1 to
    /// 128 printable ASCII characters): the same call made again, after a
    /// timeout, a crash or by a client retrying its request, is applied
    /// once. Derive the id from what is unique per event and stable across
    /// retries (`"like:{request_id}"`, an outbox row's key), never from a
    /// counter that restarts; an id names one event for good (see
    /// [`crate::message`]).
    ///
    /// ```no_run
    /// # async fn f(publisher: counter_mq::nats::JetStreamPublisher, request_id: &str) -> Result<(), counter_mq::MqError> {
    /// use counter_core::{CounterTable, Counters};
    /// use counter_mq::Publish;
    ///
    /// let posts = Counters::<i64>::new(CounterTable::new("post_counters")?);
    /// let id = format!("like:{request_id}");
    /// // Safe to call again with the same id: counted once.
    /// publisher.publish_with_id(&id, &posts, 17, "likes", 1).await?;
    /// # Ok(()) }
    /// ```
    fn publish_with_id<I, S, K>(
        &self,
        id: &str,
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
        let built = CounterMessage::event(counters, owner, key, delta)
            .and_then(|message| message.with_event_id(id));
        async move { send_keeping(self, built?).await }
    }

    /// Publishes one observation of a unique key: `member` counted once
    /// among the distinct members of `key` of `owner` (see counter-core's
    /// `Counters::observe`), at the time of now. Sending it twice, or
    /// calling `observe` again after a timeout, cannot count the member
    /// twice: a retry needs no idempotency id.
    ///
    /// ```no_run
    /// # async fn f(publisher: counter_mq::nats::JetStreamPublisher) -> Result<(), counter_mq::MqError> {
    /// use counter_core::{CounterTable, Counters};
    /// use counter_mq::Publish;
    ///
    /// let posts = Counters::<i64>::new(CounterTable::new("post_counters")?.with_unique_key("viewers")?);
    /// publisher.observe(&posts, 17, "viewers", "user:42").await?;
    /// # Ok(()) }
    /// ```
    fn observe<I, S, K>(
        &self,
        counters: &Counters<I, S>,
        owner: I,
        key: K,
        member: &str,
    ) -> impl Future<Output = Result<Sent, MqError>> + Send
    where
        I: OwnerId + Serialize,
        S: KeySpace,
        K: UniqueKeyOf<S>,
    {
        let built = CounterMessage::observation(counters, owner, key, member);
        async move { send_keeping(self, built?).await }
    }
}

/// Sends `message`; a broker failure comes back as [`MqError::Unconfirmed`]
/// holding it, for the caller to send again.
async fn send_keeping<P: Publish + ?Sized>(
    publisher: &P,
    message: CounterMessage,
) -> Result<Sent, MqError> {
    match publisher.send(&message).await {
        Err(MqError::Broker(source)) => Err(MqError::Unconfirmed {
            message: Box::new(message),
            source,
        }),
        other => other,
    }
}

impl CounterMessage {
    /// One event as a message, checked as a consumer would check it
    /// against `counters` (key, owner, window): `delta` to `key` of
    /// `owner`, at the time of now (its bucket, for a windowed key), with
    /// a new UUIDv7 id fixed here. Build it once and send it until
    /// confirmed: every attempt carries the same id.
    pub fn event<I, S, K>(
        counters: &Counters<I, S>,
        owner: I,
        key: K,
        delta: i64,
    ) -> Result<Self, MqError>
    where
        I: OwnerId + Serialize,
        S: KeySpace,
        K: KeyOf<S>,
    {
        let at = Utc::now();
        let json = owner_json(&owner)?;
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

    /// One observation of a unique key as a message, checked as a consumer
    /// would check it against `counters`: `member` of `key` of `owner`, at
    /// the time of now, with a new UUIDv7 id.
    pub fn observation<I, S, K>(
        counters: &Counters<I, S>,
        owner: I,
        key: K,
        member: &str,
    ) -> Result<Self, MqError>
    where
        I: OwnerId + Serialize,
        S: KeySpace,
        K: UniqueKeyOf<S>,
    {
        let at = Utc::now();
        let json = owner_json(&owner)?;
        let key_name = key.as_key_str().to_owned();
        DeltaBatch::new().observe_at(counters, owner, key, member, at)?;
        let mut message = CounterMessage::new(counters.table().name());
        message.push_observation(Observation {
            owner: json,
            key: key_name,
            member: member.to_owned(),
            at: Some(at),
        });
        Ok(message)
    }

    /// This message under the id `id`, checked (1 to 128 printable ASCII
    /// characters, no space).
    fn with_event_id(mut self, id: &str) -> Result<Self, MqError> {
        crate::message::check_id(id)?;
        self.set_id(id);
        Ok(self)
    }
}

/// An owner as the JSON of a message.
fn owner_json<I: OwnerId + Serialize>(owner: &I) -> Result<serde_json::Value, MqError> {
    serde_json::to_value(owner).map_err(|e| {
        Rejection::BadOwner {
            owner: format!("{owner:?}"),
            reason: e.to_string(),
        }
        .into()
    })
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
            // The message itself, or a setting, is refused: another
            // attempt would be refused too.
            Err(error @ (MqError::Message(_) | MqError::InvalidSetting(_))) => return Err(error),
            Err(error) if Instant::now() + pause >= deadline => return Err(error),
            Err(error) => {
                tracing::warn!(%error, retry_in_ms = pause.as_millis() as u64, "counter publisher: not confirmed; retrying with the same id");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(2));
            }
        }
    }
}
