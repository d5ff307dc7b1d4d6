//! Counting driven by a message queue, applied exactly once.
//!
//! Business services publish "this changed" to NATS JetStream or RabbitMQ;
//! a counting [`Consumer`] applies the changes in batches. Brokers deliver
//! at least once (a consumer that dies after its commit and before its
//! acknowledgement sees the same messages again), so every message carries
//! an idempotency id and the consumer records the ids it applied in the
//! same transaction as their deltas:
//!
//! 1. fetch up to 500 messages (what is waiting, or what arrives within
//!    50 ms);
//! 2. check each against the registered [`Tables`] (a malformed or hostile
//!    message is rejected for good: terminated or dead-lettered, counted);
//! 3. `BEGIN`; one `INSERT` of the batch's ids into
//!    `counter_applied_messages` that returns the new ones; one sorted
//!    multi-row upsert of the new messages' deltas; `COMMIT` (4 statements;
//!    a batch with duplicates also refreshes their dedup rows);
//! 4. tell a cache in front of the tables (`counter-redis`) which owners
//!    changed, then acknowledge the batch.
//!
//! ```no_run
//! # async fn f(db: sea_orm::DatabaseConnection) -> Result<(), Box<dyn std::error::Error>> {
//! use counter_core::{CounterTable, Counters};
//! use counter_mq::{Consumer, Publish, Tables, nats};
//!
//! let posts = Counters::<i64>::new(CounterTable::new("post_counters")?);
//! let js = async_nats::jetstream::new(async_nats::connect("127.0.0.1:4222").await?);
//! nats::ensure_stream(&js, &nats::StreamSettings::default()).await?;
//!
//! // A business service:
//! nats::JetStreamPublisher::new(js.clone()).publish(&posts, 17, "views", 1).await?;
//!
//! // The counting service (shutdown on Ctrl-C: the batch in hand commits and is acknowledged):
//! let source = nats::JetStreamSource::new(js, "COUNTERS", nats::ConsumerSettings::default()).await?;
//! let consumer = Consumer::builder(db, Tables::new().with(&posts)).build(source).await?;
//! consumer.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
//! # Ok(()) }
//! ```
//!
//! # What it guarantees
//!
//! * **Exactly-once effect.** A message whose id is recorded is never
//!   applied again, and a message is acknowledged only after its
//!   transaction committed: a crash at any point leads to a redelivery that
//!   is skipped. This holds for redeliveries within the dedup
//!   [`Retention`], which a consumer checks against the broker's redelivery
//!   horizon at start-up, refusing to start with less.
//! * **Nothing lost.** A message is acknowledged only after its commit; a
//!   batch the database refuses is retried, its messages held, until it
//!   commits (a message the database refuses for good, a slot that would
//!   overflow, is rejected alone and the rest commit).
//! * **Bad messages never stop the consumer**, and never retry forever.
//! * **A confirmed publish is stored.** A RabbitMQ publisher declares its
//!   queue and publishes `mandatory`, so it may start before any consumer;
//!   a message no queue took is an error, sent again once the queue is
//!   declared again. A JetStream publish is confirmed by the stream.
//! * **Retries count once** when they resend the same id: the message of
//!   an [`MqError::Unconfirmed`], or [`Publish::publish_with_id`] (see
//!   [`Publish`]'s "Retrying").
//!
//! The consumer's tests abort its process before the commit, after it and
//! between acknowledgements, kill the broker, cut the database connection,
//! and publish ids twice inside and beyond the broker's duplicate window;
//! RELIABILITY.md has the figures. The guide (`docs/guide/mq.md`) says how
//! to deploy it, how to publish from an outbox, and how to pre-aggregate.

pub mod amqp;
mod apply;
mod buffer_sink;
mod consumer;
mod dedup;
mod error;
mod fault;
pub mod ledger;
pub mod message;
pub mod nats;
mod publish;
mod source;
mod stats;
mod tables;

/// The NATS client, with the features this crate was tested with against
/// nats-server 2.9 (a crate of your own that adds `async-nats` with its
/// default features turns on APIs of servers 2.10+).
pub use async_nats;
pub use buffer_sink::BufferSink;
pub use consumer::{Consumer, ConsumerBuilder, Retention};
pub use dedup::{
    APPLIED_MESSAGES, AppliedMessagesMigration, applied_count, create_table, drop_table,
};
pub use error::{BrokerError, MqError, Rejection};
#[doc(hidden)]
pub use fault::FaultPoint;
/// The RabbitMQ client this crate uses.
pub use lapin;
pub use message::{Change, CounterMessage, Observation};
pub use publish::{Publish, Sent};
pub use source::Source;
pub use stats::{ConsumerStats, StatsHandle};
pub use tables::Tables;
