//! Errors of the MQ tier: what a caller can get back, and why a message was
//! refused (a [`Rejection`] never stops the consumer).

use std::time::Duration;

use counter_core::{CounterError, ErrorKind};

use crate::message::CounterMessage;

/// What went wrong in a publisher, in setting up a consumer, or in a
/// consumer that stopped. Brokers and databases that fail *while* a
/// consumer runs do not end it: the batch is retried with backoff.
///
/// Callers that only need to know what to do match on [`MqError::kind`],
/// the same [`ErrorKind`] as counter-core's errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MqError {
    /// A setting is out of its range, or an existing stream or durable
    /// consumer is configured in a way that breaks the guarantees.
    #[error("invalid counter-mq setting: {0}")]
    InvalidSetting(String),
    /// The dedup rows would be pruned before the broker stops redelivering:
    /// a message redelivered after its row was pruned would count twice, so
    /// the consumer refuses to start.
    #[error(
        "dedup retention {retention:?} is shorter than the broker's redelivery horizon {}: \
         keep the dedup rows longer (`Retention::keep_for`) or let the broker drop messages sooner",
        horizon.map_or_else(|| "(unbounded: the stream or queue keeps messages forever)".to_owned(), |h| format!("{h:?}"))
    )]
    RetentionTooShort {
        /// The configured retention of the dedup rows.
        retention: Duration,
        /// How long the broker may redeliver a message (`None`: forever).
        horizon: Option<Duration>,
    },
    /// A message could not be built (a bad key, owner or delta).
    #[error("invalid message: {0}")]
    Message(#[from] Rejection),
    /// The broker failed, refused or did not answer in time.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The broker did not confirm a message that
    /// [`Publish::publish`](crate::Publish::publish) built: it may or may not
    /// be stored. Send `message` again with [`Publish::send`](crate::Publish::send)
    /// (its id is applied at most once), never the event anew under a new
    /// id, which would count it twice if the first copy was stored.
    #[error("message {} was not confirmed ({source}): send it again with the same id", message.id())]
    Unconfirmed {
        /// The message, with its id.
        message: Box<CounterMessage>,
        /// What the broker did.
        #[source]
        source: BrokerError,
    },
    /// A table the consumer writes is missing or cannot take a batch: the
    /// dedup table (run [`AppliedMessagesMigration`](crate::AppliedMessagesMigration))
    /// or a registered counter table (run its migration). Checked when the
    /// consumer starts, so it fails by name instead of retrying every batch.
    #[error("the table `{table}` cannot take a batch: {hint} ({source})")]
    SchemaMissing {
        /// The table.
        table: String,
        /// What to do.
        hint: &'static str,
        /// The database's own error.
        #[source]
        source: Box<sea_orm::DbErr>,
    },
    /// The database failed (a connection broke), or refused a counter write.
    #[error(transparent)]
    Counter(#[from] CounterError),
}

impl MqError {
    /// What the caller can do about it: fix the code or the deployment
    /// ([`ErrorKind::Misuse`], [`ErrorKind::SchemaMissing`]), fix the input
    /// ([`ErrorKind::InvalidInput`], [`ErrorKind::Overflow`]), or retry
    /// later ([`ErrorKind::Transient`]: every broker failure).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidSetting(_) | Self::RetentionTooShort { .. } => ErrorKind::Misuse,
            Self::Message(Rejection::Overflow(_)) => ErrorKind::Overflow,
            Self::Message(_) => ErrorKind::InvalidInput,
            Self::Broker(_) | Self::Unconfirmed { .. } => ErrorKind::Transient,
            Self::SchemaMissing { .. } => ErrorKind::SchemaMissing,
            Self::Counter(error) => error.kind(),
        }
    }
}

impl From<sea_orm::DbErr> for MqError {
    fn from(error: sea_orm::DbErr) -> Self {
        Self::Counter(CounterError::from(error))
    }
}

impl From<async_nats::Error> for MqError {
    fn from(error: async_nats::Error) -> Self {
        Self::Broker(BrokerError::new("JetStream", error))
    }
}

impl From<lapin::Error> for MqError {
    fn from(error: lapin::Error) -> Self {
        Self::Broker(BrokerError::new("RabbitMQ", error))
    }
}

/// A broker failed, refused or did not answer in time: what the client
/// was doing, and the client's own error as [`source`](std::error::Error::source)
/// (an `async_nats` or `lapin` error, downcast to inspect it). Always worth
/// retrying later ([`ErrorKind::Transient`]); a publisher has already
/// retried it with the same id until its deadline.
#[derive(Debug, thiserror::Error)]
#[error("broker: {action}: {detail}")]
pub struct BrokerError {
    action: String,
    detail: String,
    timed_out: bool,
    returned: bool,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl BrokerError {
    /// The client failed with `source` while doing `action`.
    pub(crate) fn new(
        action: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        let source = source.into();
        Self {
            action: action.into(),
            detail: source.to_string(),
            timed_out: false,
            returned: false,
            source: Some(source),
        }
    }

    /// No answer to `action` within `after`.
    pub(crate) fn timed_out(action: impl Into<String>, after: Duration) -> Self {
        Self {
            action: action.into(),
            detail: format!("no answer within {after:?}"),
            timed_out: true,
            returned: false,
            source: None,
        }
    }

    /// The broker answered `action` with a refusal the client does not
    /// report as an error (a negative confirm, a closed channel).
    pub(crate) fn refused(action: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            action: action.into(),
            detail: detail.into(),
            timed_out: false,
            returned: false,
            source: None,
        }
    }

    /// RabbitMQ returned a `mandatory` message that no queue took (the
    /// queue `queue` is missing): confirmed, but not stored.
    pub(crate) fn returned(queue: &str) -> Self {
        Self {
            action: "publish".into(),
            detail: format!("RabbitMQ returned the message: no queue `{queue}` took it"),
            timed_out: false,
            returned: true,
            source: None,
        }
    }

    /// What the client was doing: `publish`, `fetch`, `ack`, `connect`,
    /// `stream <name>`, ...
    pub fn action(&self) -> &str {
        &self.action
    }

    /// Whether the broker did not answer in time (rather than answering
    /// with an error).
    pub fn is_timeout(&self) -> bool {
        self.timed_out
    }

    /// Whether the broker returned the message unstored: RabbitMQ found no
    /// queue to route it to (the queue was deleted, or declared by nobody).
    /// Nothing of it is anywhere; the next attempt declares the queue again.
    pub fn is_returned(&self) -> bool {
        self.returned
    }
}

/// Why a message is refused for good: it is terminated (JetStream) or
/// dead-lettered (RabbitMQ), counted in
/// [`ConsumerStats::rejected`](crate::ConsumerStats::rejected) and logged,
/// and the consumer goes on. Nothing of a refused message is applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    /// Larger than [`MAX_MESSAGE_BYTES`](crate::message::MAX_MESSAGE_BYTES).
    #[error("message of {0} bytes is larger than the limit")]
    TooLarge(usize),
    /// Not the JSON of the format (see [`crate::message`]).
    #[error("malformed message: {0}")]
    Malformed(String),
    /// A format version this consumer does not know.
    #[error("unsupported message version {0}")]
    UnsupportedVersion(u64),
    /// The id is empty, too long or not printable ASCII.
    #[error("invalid message id {0:?}: use 1 to 128 printable ASCII characters, no spaces")]
    BadId(String),
    /// No consumer table of that name was registered.
    #[error("unknown counter table {0:?}")]
    UnknownTable(String),
    /// No changes, or more than [`MAX_CHANGES`](crate::message::MAX_CHANGES).
    #[error("a message carries 1 to {max} changes, this one {got}")]
    ChangeCount {
        /// Changes in the message.
        got: usize,
        /// The limit.
        max: usize,
    },
    /// The key is not a valid key, or not one of the entity's keys.
    #[error("bad key {key:?}: {reason}")]
    BadKey {
        /// The key as sent.
        key: String,
        /// Why.
        reason: String,
    },
    /// The owner is not of the table's owner type, or not storable.
    #[error("bad owner {owner}: {reason}")]
    BadOwner {
        /// The owner as sent (JSON).
        owner: String,
        /// Why.
        reason: String,
    },
    /// A time outside the range of the calendar.
    #[error("bad time {0}")]
    BadTime(i64),
    /// The deltas of one counter leave `i64`, in the message or in the
    /// database (a slot that would overflow).
    #[error("overflow: {0}")]
    Overflow(String),
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn every_error_has_the_kind_a_caller_acts_on() {
        let timed_out = MqError::from(BrokerError::timed_out("publish", Duration::from_secs(5)));
        assert_eq!(timed_out.kind(), ErrorKind::Transient);
        assert_eq!(
            timed_out.to_string(),
            "broker: publish: no answer within 5s"
        );
        let MqError::Broker(broker) = &timed_out else {
            unreachable!()
        };
        assert!(broker.is_timeout());
        assert_eq!(broker.action(), "publish");

        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let failed = MqError::from(BrokerError::new("fetch", io));
        assert_eq!(failed.to_string(), "broker: fetch: reset");
        // `Broker` is transparent: its source is the client's error.
        let source = failed.source();
        assert!(
            source.is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some()),
            "the client's own error is kept as the source"
        );

        let missing = MqError::SchemaMissing {
            table: "counter_applied_messages".into(),
            hint: "run `AppliedMessagesMigration`",
            source: Box::new(sea_orm::DbErr::Custom("no such table".into())),
        };
        assert_eq!(missing.kind(), ErrorKind::SchemaMissing);
        assert_eq!(
            MqError::Message(Rejection::Overflow("views".into())).kind(),
            ErrorKind::Overflow
        );
        assert_eq!(
            MqError::Message(Rejection::BadTime(0)).kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            MqError::InvalidSetting("prefetch".into()).kind(),
            ErrorKind::Misuse
        );
        assert_eq!(
            MqError::from(CounterError::UnsupportedBackend("MySQL".into())).kind(),
            ErrorKind::Misuse
        );
    }
}
