//! NATS JetStream: a durable pull consumer with explicit acknowledgements,
//! and a publisher that waits for the stream's acknowledgement.
//!
//! Tested with async-nats 0.51 against nats-server 2.9.10 (without the
//! client's `server_2_10` features, whose consumer APIs 2.9 lacks).

use std::time::{Duration, Instant};

use async_nats::jetstream::{
    self, AckKind, Context,
    consumer::{AckPolicy, PullConsumer, pull},
    message::PublishMessage,
    stream,
};
use futures_util::StreamExt;

use crate::{
    error::{BrokerError, MqError},
    message::CounterMessage,
    publish::{HORIZON_MARGIN, Publish, Sent, capped_retry, retry_until},
    source::Source,
};

/// How long an idle consumer waits for the server to say what is pending.
const IDLE_LAG_TIMEOUT: Duration = Duration::from_secs(2);
/// How long an idle reading of the backlog answers for.
const IDLE_LAG_AGE: Duration = Duration::from_secs(1);

/// The stream counter messages are published to; [`ensure_stream`]
/// creates it when missing.
#[derive(Debug, Clone)]
pub struct StreamSettings {
    /// The stream name (default `COUNTERS`).
    pub name: String,
    /// Subjects it captures (default `counters.>`; publishers send to
    /// `counters.<table>`).
    pub subjects: Vec<String>,
    /// How long a message is kept (default 24 h). The consumer's dedup rows
    /// must outlive it; see [`Retention`](crate::Retention).
    pub max_age: Duration,
    /// Publishes of one id within this window are stored once (default
    /// 2 min); later ones are skipped by the consumer's dedup table.
    pub duplicate_window: Duration,
    /// Copies on a JetStream cluster (default 1; 3 survives a node loss).
    pub replicas: usize,
}

impl Default for StreamSettings {
    fn default() -> Self {
        Self {
            name: "COUNTERS".into(),
            subjects: vec!["counters.>".into()],
            max_age: Duration::from_secs(24 * 3600),
            duplicate_window: Duration::from_secs(120),
            replicas: 1,
        }
    }
}

/// Creates the stream with `settings` (file storage) unless one of that
/// name exists, which is then used as it is.
pub async fn ensure_stream(js: &Context, settings: &StreamSettings) -> Result<(), MqError> {
    js.get_or_create_stream(stream::Config {
        name: settings.name.clone(),
        subjects: settings.subjects.clone(),
        storage: stream::StorageType::File,
        max_age: settings.max_age,
        duplicate_window: settings.duplicate_window,
        num_replicas: settings.replicas,
        ..Default::default()
    })
    .await
    .map(drop)
    .map_err(|e| {
        MqError::from(BrokerError::new(
            format!("creating stream {}", settings.name),
            e,
        ))
    })
}

/// Settings of the durable consumer a [`JetStreamSource`] reads through.
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    /// The durable name, shared by every consumer process of the stream
    /// (default `counter-writer`): they split its messages.
    pub durable: String,
    /// How long the server waits for an acknowledgement before it
    /// redelivers (default 30 s: several batches' time).
    pub ack_wait: Duration,
    /// Unacknowledged messages the server hands out at once (default
    /// 20,000: at least batch size × consumers).
    pub max_ack_pending: i64,
    /// The dedup scope (default: the stream name).
    pub source: Option<String>,
}

impl Default for ConsumerSettings {
    fn default() -> Self {
        Self {
            durable: "counter-writer".into(),
            ack_wait: Duration::from_secs(30),
            max_ack_pending: 20_000,
            source: None,
        }
    }
}

/// A JetStream stream read by a durable pull consumer with explicit
/// acknowledgements. Deliveries are unlimited (`max_deliver` -1): a message
/// is never dropped because the database was down for a while; bad messages
/// are terminated by the consumer instead.
#[derive(Debug)]
pub struct JetStreamSource {
    js: Context,
    stream: String,
    consumer: PullConsumer,
    source: String,
    /// The last idle reading of the backlog, and when it was taken: an
    /// idle consumer asks the server at most once per
    /// [`IDLE_LAG_AGE`], not after every empty fetch.
    idle_reading: Option<(Instant, Option<u64>)>,
}

impl JetStreamSource {
    /// Binds to `stream` through the durable consumer of `settings`,
    /// creating the consumer if missing.
    pub async fn new(
        js: Context,
        stream: &str,
        settings: ConsumerSettings,
    ) -> Result<Self, MqError> {
        let handle = js
            .get_stream(stream)
            .await
            .map_err(|e| MqError::from(BrokerError::new(format!("stream {stream}"), e)))?;
        let consumer = handle
            .get_or_create_consumer(
                &settings.durable,
                pull::Config {
                    durable_name: Some(settings.durable.clone()),
                    ack_policy: AckPolicy::Explicit,
                    ack_wait: settings.ack_wait,
                    max_deliver: -1,
                    max_ack_pending: settings.max_ack_pending,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| {
                MqError::from(BrokerError::new(
                    format!("consumer {}", settings.durable),
                    e,
                ))
            })?;
        // An existing durable is used as it is: refuse one whose settings
        // break the guarantees (no acknowledgements: a crash loses the
        // batch; a delivery limit: an outage drops good messages).
        let config = &consumer.cached_info().config;
        if config.ack_policy != AckPolicy::Explicit || config.max_deliver > 0 {
            return Err(MqError::InvalidSetting(format!(
                "the existing durable consumer `{}` has ack policy {:?} and max_deliver {}: \
                 counting needs explicit acknowledgements and unlimited deliveries",
                settings.durable, config.ack_policy, config.max_deliver
            )));
        }
        Ok(Self {
            js,
            stream: stream.to_owned(),
            consumer,
            source: settings.source.unwrap_or_else(|| stream.to_owned()),
            idle_reading: None,
        })
    }
}

impl Source for JetStreamSource {
    type Delivery = jetstream::Message;

    fn name(&self) -> &str {
        &self.source
    }

    async fn fetch(&mut self, max: usize, wait: Duration) -> Result<Vec<Self::Delivery>, MqError> {
        // `fetch` returns what is waiting at once (up to `max`), or after
        // `wait` when nothing is. (`batch`, which waits to fill, sometimes
        // gets no expiry notice from nats-server 2.9 and then waits for the
        // client's own timer, `wait` + 5 s: measured by mq-bench.)
        let mut batch = self
            .consumer
            .fetch()
            .max_messages(max)
            .expires(wait)
            .messages()
            .await
            .map_err(|e| MqError::from(BrokerError::new("fetch", e)))?;
        let mut deliveries = Vec::new();
        while let Some(message) = batch.next().await {
            match message {
                Ok(message) => deliveries.push(message),
                // What came before the error is kept: it is processed and
                // acknowledged like any batch.
                Err(e) if deliveries.is_empty() => {
                    return Err(MqError::from(BrokerError::new("fetch", e)));
                }
                Err(_) => break,
            }
        }
        Ok(deliveries)
    }

    fn payload<'a>(&self, delivery: &'a Self::Delivery) -> &'a [u8] {
        &delivery.payload
    }

    fn is_redelivery(&self, delivery: &Self::Delivery) -> bool {
        delivery.info().is_ok_and(|info| info.delivered > 1)
    }

    async fn lag(&mut self, last: &Self::Delivery) -> Option<u64> {
        // The next idle reading asks afresh: this batch's backlog is news.
        self.idle_reading = None;
        // The server says with every delivery: no round trip.
        last.info().ok().map(|info| info.pending)
    }

    async fn idle_lag(&mut self) -> Option<u64> {
        // A fetch that expired empty does not prove the stream drained: on
        // a loaded machine the server may answer a short expiry with
        // nothing while messages wait. The consumer's info says, in one
        // round trip, bounded so a slow server never holds the loop; a
        // recent reading answers in between.
        if let Some((asked, lag)) = self.idle_reading
            && asked.elapsed() < IDLE_LAG_AGE
        {
            return lag;
        }
        let info = tokio::time::timeout(IDLE_LAG_TIMEOUT, self.consumer.get_info()).await;
        let lag = match info {
            Ok(Ok(info)) => Some(info.num_pending),
            Ok(Err(error)) => {
                tracing::debug!(%error, "counter consumer: the stream's backlog is unknown");
                None
            }
            Err(_elapsed) => None,
        };
        self.idle_reading = Some((Instant::now(), lag));
        lag
    }

    async fn ack(&mut self, deliveries: &[Self::Delivery]) -> Result<(), MqError> {
        for delivery in deliveries {
            delivery.ack().await?;
        }
        Ok(())
    }

    async fn reject(&mut self, delivery: &Self::Delivery) -> Result<(), MqError> {
        delivery.ack_with(AckKind::Term).await.map_err(Into::into)
    }

    async fn release(&mut self, deliveries: &[Self::Delivery]) -> Result<(), MqError> {
        for delivery in deliveries {
            delivery.ack_with(AckKind::Nak(None)).await?;
        }
        Ok(())
    }

    async fn redelivery_horizon(&mut self) -> Result<Option<Duration>, MqError> {
        let mut stream =
            self.js.get_stream(&self.stream).await.map_err(|e| {
                MqError::from(BrokerError::new(format!("stream {}", self.stream), e))
            })?;
        let info = stream
            .info()
            .await
            .map_err(|e| MqError::from(BrokerError::new(format!("stream {}", self.stream), e)))?;
        let max_age = info.config.max_age;
        Ok((!max_age.is_zero()).then(|| max_age + HORIZON_MARGIN))
    }
}

/// Publishes counter messages to JetStream, to `<prefix>.<table>`, with the
/// message id as `Nats-Msg-Id` (the stream stores a repeat within its
/// duplicate window once), retrying with the same id until the stream
/// acknowledges or `retry_for` has passed.
#[derive(Debug, Clone)]
pub struct JetStreamPublisher {
    js: Context,
    prefix: String,
    retry_for: Duration,
}

impl JetStreamPublisher {
    /// Publishes to `counters.<table>`, retrying for up to a minute.
    pub fn new(js: Context) -> Self {
        Self {
            js,
            prefix: "counters".into(),
            retry_for: Duration::from_secs(60),
        }
    }

    /// Publishes to `<prefix>.<table>` instead.
    #[must_use]
    pub fn subject_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Gives up (an error; the message may or may not be stored) after
    /// retrying for `retry_for`: at most one hour, the margin the
    /// consumer's retention check adds for a publisher's retries (longer is
    /// cut to it, with a warning).
    #[must_use]
    pub fn retry_for(mut self, retry_for: Duration) -> Self {
        self.retry_for = capped_retry(retry_for);
        self
    }
}

impl Publish for JetStreamPublisher {
    async fn send(&self, message: &CounterMessage) -> Result<Sent, MqError> {
        let payload = bytes_of(message)?;
        let subject = format!("{}.{}", self.prefix, message.table());
        let deadline = Instant::now() + self.retry_for;
        retry_until(deadline, || async {
            let publish = PublishMessage::build()
                .payload(payload.clone())
                .message_id(message.id());
            let ack = self
                .js
                .send_publish(subject.clone(), publish)
                .await
                .map_err(|e| MqError::from(BrokerError::new("publish", e)))?
                .await
                .map_err(|e| MqError::from(BrokerError::new("publish acknowledgement", e)))?;
            Ok(Sent {
                id: message.id().to_owned(),
                duplicate: ack.duplicate,
            })
        })
        .await
    }
}

fn bytes_of(message: &CounterMessage) -> Result<bytes::Bytes, MqError> {
    Ok(bytes::Bytes::from(message.encode()?))
}
