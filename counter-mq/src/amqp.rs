//! RabbitMQ (AMQP 0-9-1): a quorum queue read with a prefetch window and
//! manual acknowledgements, and a publisher with publisher confirms.
//!
//! Tested with lapin 4.12 against RabbitMQ 3.10.8. RabbitMQ has no
//! duplicate detection of its own: the consumer's dedup table is the only
//! one, so a message published twice is applied once.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::sync::Mutex;

use futures_util::StreamExt;
use lapin::{
    BasicProperties, Channel, Connection, ConnectionProperties, Consumer,
    message::Delivery,
    options::{
        BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions,
        BasicQosOptions, BasicRejectOptions, ConfirmSelectOptions, QueueDeclareOptions,
    },
    types::{AMQPValue, FieldTable, ShortString},
};

use crate::{
    error::{BrokerError, MqError},
    message::CounterMessage,
    publish::{HORIZON_MARGIN, Publish, Sent, capped_retry, retry_until},
    source::Source,
};

/// The longest one publish waits for its confirm before it is sent again.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a reading of the queue's length serves as the lag.
const LAG_READING_AGE: Duration = Duration::from_secs(1);

/// How long the consumer waits for the queue's length before it goes on
/// without.
const LAG_READING_TIMEOUT: Duration = Duration::from_millis(500);

/// The queue counter messages go through.
#[derive(Debug, Clone)]
pub struct QueueSettings {
    /// The queue name (default `counters`); publishers send to it through
    /// the default exchange.
    pub name: String,
    /// Messages older than this are dropped (dead-lettered) by RabbitMQ
    /// (default 24 h). `None` keeps them forever, which requires
    /// [`Retention::forever`](crate::Retention::forever).
    pub message_ttl: Option<Duration>,
    /// Where rejected (poison) and expired messages go, a queue declared
    /// beside it (default `<name>.dead`); `None` drops them.
    pub dead_letter_queue: Option<String>,
    /// Deliveries after which RabbitMQ dead-letters a message (quorum
    /// queues' `x-delivery-limit`; default none). A consumer crashing over
    /// and over on one message is the only case it helps; a limit also
    /// dead-letters good messages during a long database outage, which are
    /// then missing from the totals until re-published.
    pub delivery_limit: Option<u32>,
}

impl QueueSettings {
    /// The defaults for a queue named `name`.
    pub fn named(name: impl Into<String>) -> Self {
        let name = name.into();
        Self {
            dead_letter_queue: Some(format!("{name}.dead")),
            name,
            message_ttl: Some(Duration::from_secs(24 * 3600)),
            delivery_limit: None,
        }
    }
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self::named("counters")
    }
}

/// A queue name with the defaults (see [`QueueSettings::named`]).
impl From<&str> for QueueSettings {
    fn from(name: &str) -> Self {
        Self::named(name)
    }
}

/// A queue name with the defaults (see [`QueueSettings::named`]).
impl From<String> for QueueSettings {
    fn from(name: String) -> Self {
        Self::named(name)
    }
}

/// Declares the queue of `settings` (a durable quorum queue) and its
/// dead-letter queue on `channel`; both must match if they exist (a queue
/// of that name declared with other arguments is
/// [`MqError::InvalidSetting`], and closes `channel`).
pub async fn declare_queue(channel: &Channel, settings: &QueueSettings) -> Result<(), MqError> {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    if let Some(ttl) = settings.message_ttl {
        let millis = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(millis));
    }
    if let Some(limit) = settings.delivery_limit {
        args.insert("x-delivery-limit".into(), AMQPValue::LongUInt(limit));
    }
    if let Some(dead) = &settings.dead_letter_queue {
        channel
            .queue_declare(dead.as_str().into(), durable(), quorum())
            .await
            .map_err(|e| declare_error(dead, e))?;
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(dead.as_str().into()),
        );
    }
    channel
        .queue_declare(settings.name.as_str().into(), durable(), args)
        .await
        .map_err(|e| declare_error(&settings.name, e))?;
    Ok(())
}

/// A refused declaration: a queue of that name with other arguments is a
/// deployment to fix (retrying cannot help), anything else the broker's.
fn declare_error(queue: &str, error: lapin::Error) -> MqError {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    match error.kind() {
        lapin::ErrorKind::ProtocolError(amqp)
            if matches!(
                amqp.kind(),
                AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED)
            ) =>
        {
            MqError::InvalidSetting(format!(
                "the RabbitMQ queue `{queue}` exists with other arguments than its QueueSettings \
                 (a durable quorum queue, its TTL, delivery limit and dead-letter queue): {amqp}"
            ))
        }
        _ => MqError::from(BrokerError::new(format!("declaring queue {queue}"), error)),
    }
}

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

fn quorum() -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    args
}

/// A RabbitMQ queue read with manual acknowledgements: a batch is
/// acknowledged with one `basic.ack` (`multiple`) per half after its commit.
///
/// It owns its connection and makes a new one when the old one is lost (a
/// broker restart, a network cut, RabbitMQ's `consumer_timeout` after a
/// long database outage): the broker requeues what the old channel held,
/// and the dedup table skips what was applied already.
#[derive(Debug)]
pub struct AmqpSource {
    uri: String,
    settings: QueueSettings,
    prefetch: u16,
    source: String,
    link: Option<Link>,
    /// The queue's ready messages, when they were asked, and whether that
    /// was while idle.
    lag: Option<(Instant, u64, bool)>,
}

/// One connection's channel and consumer.
#[derive(Debug)]
struct Link {
    connection: Connection,
    channel: Channel,
    consumer: Consumer,
}

impl Link {
    async fn open(uri: &str, settings: &QueueSettings, prefetch: u16) -> Result<Self, MqError> {
        let connection = Connection::connect(uri, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        declare_queue(&channel, settings).await?;
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await?;
        let consumer = channel
            .basic_consume(
                settings.name.as_str().into(),
                ShortString::from(format!("counter-consumer-{}", uuid::Uuid::new_v4())),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(Self {
            connection,
            channel,
            consumer,
        })
    }
}

impl AmqpSource {
    /// Connects to `uri`, declares the queue of `settings` and consumes it
    /// with `prefetch` unacknowledged messages in flight (at least the
    /// consumer's batch size; 100 to 65,535).
    pub async fn connect(
        uri: &str,
        settings: QueueSettings,
        prefetch: u16,
    ) -> Result<Self, MqError> {
        if prefetch < 100 {
            return Err(MqError::InvalidSetting(format!(
                "prefetch {prefetch} is below 100: batches could not fill"
            )));
        }
        let link = Link::open(uri, &settings, prefetch).await?;
        Ok(Self {
            uri: uri.to_owned(),
            source: settings.name.clone(),
            settings,
            prefetch,
            link: Some(link),
            lag: None,
        })
    }

    /// Uses `source` as the dedup scope instead of the queue name.
    #[must_use]
    pub fn source_name(mut self, source: impl Into<String>) -> Self {
        self.source = source.into();
        self
    }

    /// Closes the channel and connection, bounded: the broker requeues at
    /// once every delivery left unsettled on them. The next fetch connects
    /// again.
    async fn hang_up(&mut self, reason: &str) {
        if let Some(link) = self.link.take() {
            let close = async {
                let _ = link.channel.close(200, reason.into()).await;
                let _ = link.connection.close(200, reason.into()).await;
            };
            let _ = tokio::time::timeout(ATTEMPT_TIMEOUT, close).await;
        }
    }

    /// The queue's ready messages (those not handed to any consumer yet):
    /// a passive declare, one round trip at most once per
    /// `LAG_READING_AGE` (a recent reading answers in between), bounded so
    /// a slow broker never holds a batch; `None` when the broker does not
    /// answer. The first reading `idle` asks afresh: a reading taken with
    /// the last batch would report its backlog after the queue drained.
    async fn ready_messages(&mut self, idle: bool) -> Option<u64> {
        if let Some((asked, lag, while_idle)) = self.lag
            && asked.elapsed() < LAG_READING_AGE
            && (while_idle || !idle)
        {
            return Some(lag);
        }
        let channel = &self.link.as_ref()?.channel;
        let declare = channel.queue_declare(
            self.settings.name.as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        );
        match tokio::time::timeout(LAG_READING_TIMEOUT, declare).await {
            Ok(Ok(queue)) => {
                let lag = u64::from(queue.message_count());
                self.lag = Some((Instant::now(), lag, idle));
                Some(lag)
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, "counter consumer: the queue's length is unknown");
                None
            }
            Err(_) => None,
        }
    }

    /// The live link, made again if it was lost.
    async fn link(&mut self) -> Result<&mut Link, MqError> {
        let link = match self.link.take() {
            Some(link) if link.channel.status().connected() => link,
            lost => {
                if lost.is_some() {
                    tracing::warn!(queue = %self.settings.name, "counter consumer: the RabbitMQ channel was lost; connecting again");
                }
                let open = Link::open(&self.uri, &self.settings, self.prefetch);
                bounded("connect", open).await?
            }
        };
        Ok(self.link.insert(link))
    }
}

/// Runs one exchange with the broker, bounded: a cut connection is not
/// always noticed at once, and a wait on it would stall the consumer.
async fn bounded<T>(
    what: &str,
    work: impl std::future::Future<Output = Result<T, MqError>>,
) -> Result<T, MqError> {
    tokio::time::timeout(ATTEMPT_TIMEOUT, work)
        .await
        .unwrap_or_else(|_| Err(MqError::from(BrokerError::timed_out(what, ATTEMPT_TIMEOUT))))
}

/// Settles a delivery, bounded; `Ok(false)` from lapin's acker means the
/// channel is gone and nothing was sent (the broker requeues the delivery).
async fn settle(
    what: &str,
    work: impl std::future::Future<Output = lapin::Result<bool>>,
) -> Result<(), MqError> {
    if bounded(what, async { Ok(work.await?) }).await? {
        Ok(())
    } else {
        Err(MqError::from(BrokerError::refused(
            what,
            "the channel is closed (the broker requeues it)",
        )))
    }
}

impl Source for AmqpSource {
    type Delivery = Delivery;

    fn name(&self) -> &str {
        &self.source
    }

    async fn fetch(&mut self, max: usize, wait: Duration) -> Result<Vec<Self::Delivery>, MqError> {
        let link = self.link().await?;
        let mut deliveries = Vec::new();
        let mut deadline = Instant::now() + wait;
        let mut lost = None;
        while deliveries.len() < max {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, link.consumer.next()).await {
                Err(_elapsed) => break,
                Ok(Some(Ok(delivery))) => {
                    if deliveries.is_empty() {
                        // The batch closes `wait` after its first message.
                        deadline = Instant::now() + wait;
                    }
                    deliveries.push(delivery);
                }
                Ok(Some(Err(e))) => {
                    lost = Some(MqError::from(e));
                    break;
                }
                Ok(None) => {
                    lost = Some(MqError::from(BrokerError::refused(
                        "fetch",
                        "the consumer was cancelled",
                    )));
                    break;
                }
            }
        }
        match lost {
            // What came before is processed; its acknowledgements fail and
            // the broker delivers it again, to be skipped.
            Some(error) => {
                self.link = None;
                if deliveries.is_empty() {
                    return Err(error);
                }
                Ok(deliveries)
            }
            None => Ok(deliveries),
        }
    }

    fn payload<'a>(&self, delivery: &'a Self::Delivery) -> &'a [u8] {
        &delivery.data
    }

    fn is_redelivery(&self, delivery: &Self::Delivery) -> bool {
        delivery.redelivered
    }

    async fn lag(&mut self, _last: &Self::Delivery) -> Option<u64> {
        self.ready_messages(false).await
    }

    async fn idle_lag(&mut self) -> Option<u64> {
        self.ready_messages(true).await
    }

    async fn ack(&mut self, deliveries: &[Self::Delivery]) -> Result<(), MqError> {
        // Every earlier delivery of this channel is settled already
        // (batches are processed in delivery order), so one `multiple`
        // acknowledgement covers exactly these.
        match deliveries.last() {
            Some(last) => settle("ack", last.ack(BasicAckOptions { multiple: true })).await,
            None => Ok(()),
        }
    }

    async fn reject(&mut self, delivery: &Self::Delivery) -> Result<(), MqError> {
        let rejected = settle(
            "reject",
            delivery.reject(BasicRejectOptions { requeue: false }),
        )
        .await;
        if rejected.is_err() {
            // The next `multiple` acknowledgement would cover this delivery
            // and settle it as done instead of dead-lettered.
            self.hang_up("a rejection failed").await;
        }
        rejected
    }

    async fn release(&mut self, deliveries: &[Self::Delivery]) -> Result<(), MqError> {
        match deliveries.last() {
            Some(last) => {
                settle(
                    "release",
                    last.nack(BasicNackOptions {
                        multiple: true,
                        requeue: true,
                    }),
                )
                .await
            }
            None => Ok(()),
        }
    }

    async fn close(&mut self) {
        self.hang_up("counter consumer stopped").await;
    }

    async fn redelivery_horizon(&mut self) -> Result<Option<Duration>, MqError> {
        Ok(self.settings.message_ttl.map(|ttl| ttl + HORIZON_MARGIN))
    }
}

/// Publishes counter messages to a RabbitMQ queue (through the default
/// exchange), persistent and `mandatory`, and waits for the broker's
/// confirm; retries with the same id until confirmed or `retry_for` has
/// passed, connecting again when the connection was lost.
///
/// A confirm means the message is in the queue. The publisher declares the
/// queue (as its [`QueueSettings`] say, the same the consumer declares)
/// on every connection it makes, so it can start before any consumer ever
/// ran; a message RabbitMQ returns because no queue took it (the queue was
/// deleted meanwhile) is not a success: the attempt fails
/// ([`BrokerError::is_returned`]) and the next one, on a new connection,
/// declares the queue again.
#[derive(Debug, Clone)]
pub struct AmqpPublisher {
    uri: String,
    queue: QueueSettings,
    retry_for: Duration,
    /// The connection and its confirm-mode channel, shared by clones.
    link: Arc<Mutex<Option<(Connection, Channel)>>>,
    /// Messages RabbitMQ returned unrouted, shared by clones.
    returned: Arc<AtomicU64>,
}

impl AmqpPublisher {
    /// A publisher to `queue` (a name, or [`QueueSettings`]) on a
    /// connection of its own to `uri`, in confirm mode; declares the queue.
    /// Give it the settings the consumer uses: a queue that exists with
    /// other arguments is refused ([`MqError::InvalidSetting`]).
    pub async fn connect(uri: &str, queue: impl Into<QueueSettings>) -> Result<Self, MqError> {
        let publisher = Self {
            uri: uri.to_owned(),
            queue: queue.into(),
            retry_for: Duration::from_secs(60),
            link: Arc::default(),
            returned: Arc::default(),
        };
        publisher.channel().await?;
        Ok(publisher)
    }

    /// Gives up after retrying for `retry_for` (default one minute; at most
    /// one hour, the margin the consumer's retention check adds for a
    /// publisher's retries: longer is cut to it, with a warning).
    #[must_use]
    pub fn retry_for(mut self, retry_for: Duration) -> Self {
        self.retry_for = capped_retry(retry_for);
        self
    }

    /// Messages RabbitMQ returned because no queue took them, since the
    /// publisher was made (each was sent again, after the queue was
    /// declared again): for a metric; nonzero means something deleted the
    /// queue under a running publisher.
    pub fn returned(&self) -> u64 {
        self.returned.load(Ordering::Relaxed)
    }

    /// The live channel (a clone; publishes do not hold the lock), made
    /// again if it was lost, with the queue declared.
    async fn channel(&self) -> Result<Channel, MqError> {
        let mut link = self.link.lock().await;
        if let Some((_, channel)) = link.as_ref().filter(|(_, c)| c.status().connected()) {
            return Ok(channel.clone());
        }
        let (connection, channel) = bounded("connect", async {
            let connection =
                Connection::connect(&self.uri, ConnectionProperties::default()).await?;
            let channel = connection.create_channel().await?;
            declare_queue(&channel, &self.queue).await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            Ok((connection, channel))
        })
        .await?;
        *link = Some((connection, channel.clone()));
        Ok(channel)
    }
}

impl Publish for AmqpPublisher {
    async fn send(&self, message: &CounterMessage) -> Result<Sent, MqError> {
        let payload = message.encode()?;
        let deadline = Instant::now() + self.retry_for;
        retry_until(deadline, || async {
            let channel = self.channel().await?;
            let sent = self.publish_on(&channel, message, &payload).await;
            if sent.is_err() {
                // Whatever failed, the next attempt starts on a new
                // connection (a cut socket is not always noticed at once),
                // which declares the queue again.
                self.link.lock().await.take();
            }
            sent
        })
        .await
    }
}

impl AmqpPublisher {
    async fn publish_on(
        &self,
        channel: &Channel,
        message: &CounterMessage,
        payload: &[u8],
    ) -> Result<Sent, MqError> {
        // A confirm takes milliseconds on a healthy broker; one that has not
        // come in this long is abandoned and the message sent again.
        let confirm = tokio::time::timeout(ATTEMPT_TIMEOUT, async {
            channel
                .basic_publish(
                    "".into(),
                    self.queue.name.as_str().into(),
                    // Unroutable (no queue of that name): returned, not
                    // confirmed as if stored.
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    payload,
                    BasicProperties::default()
                        .with_delivery_mode(2)
                        .with_message_id(message.id().into())
                        .with_content_type("application/json".into()),
                )
                .await?
                .await
        })
        .await
        .map_err(|_| BrokerError::timed_out("publish", ATTEMPT_TIMEOUT))??;
        if !confirm.is_ack() {
            return Err(
                BrokerError::refused("publish", "the broker did not confirm the message").into(),
            );
        }
        if confirm.take_message().is_some() {
            self.returned.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(queue = %self.queue.name, id = message.id(), "counter publisher: RabbitMQ returned the message (no such queue); declaring the queue again");
            return Err(BrokerError::returned(&self.queue.name).into());
        }
        Ok(Sent {
            id: message.id().to_owned(),
            duplicate: false,
        })
    }
}
