//! Errors of the MQ tier: what a caller can get back, and why a message was
//! refused (a [`Rejection`] never stops the consumer).

use std::time::Duration;

use counter_core::CounterError;

/// What went wrong in a publisher, in setting up a consumer, or in a
/// consumer that stopped. Brokers and databases that fail *while* a
/// consumer runs do not end it: the batch is retried with backoff.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MqError {
    /// A setting is out of its range.
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
    /// The broker refused or did not confirm in time.
    #[error("broker: {0}")]
    Broker(String),
    /// The database failed (the dedup table is missing, a connection broke).
    #[error(transparent)]
    Counter(#[from] CounterError),
}

impl From<sea_orm::DbErr> for MqError {
    fn from(error: sea_orm::DbErr) -> Self {
        Self::Counter(CounterError::from(error))
    }
}

impl From<async_nats::Error> for MqError {
    fn from(error: async_nats::Error) -> Self {
        Self::Broker(error.to_string())
    }
}

impl From<lapin::Error> for MqError {
    fn from(error: lapin::Error) -> Self {
        Self::Broker(error.to_string())
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
