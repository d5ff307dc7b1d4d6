//! What a consumer needs from a broker: batches of deliveries, and a way to
//! settle each one. Implemented for JetStream ([`crate::nats`]) and
//! RabbitMQ ([`crate::amqp`]); implement it to count from another broker.

use std::{future::Future, time::Duration};

use crate::error::MqError;

/// A queue of counter messages with at-least-once delivery.
pub trait Source: Send {
    /// One delivered message.
    type Delivery: Send + Sync;

    /// The dedup scope: ids are unique per source. Every consumer of one
    /// stream or queue must use the same name; 1 to 64 printable ASCII
    /// characters.
    fn name(&self) -> &str;

    /// The next deliveries: up to `max`, waiting at most `wait` when none
    /// is there (JetStream hands over what is waiting at once; RabbitMQ's
    /// batch closes `wait` after its first delivery). An empty batch is not
    /// an error.
    fn fetch(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> impl Future<Output = Result<Vec<Self::Delivery>, MqError>> + Send;

    /// The message bytes.
    fn payload<'a>(&self, delivery: &'a Self::Delivery) -> &'a [u8];

    /// Whether the broker delivered this message before.
    fn is_redelivery(&self, delivery: &Self::Delivery) -> bool;

    /// Messages still waiting in the broker after `last` (the last
    /// delivery of a batch), if the broker says. Called once per batch;
    /// an implementation that has to ask the broker may answer from a
    /// recent reading.
    fn lag(&mut self, last: &Self::Delivery) -> impl Future<Output = Option<u64>> + Send;

    /// Messages waiting in the broker after a fetch that brought none,
    /// if the broker says (asked after every empty fetch, so it must be
    /// cheap or answer from a recent reading). `None` by default: the lag
    /// is then reported as unknown while the consumer is idle, rather than
    /// as the last batch's figure.
    fn idle_lag(&mut self) -> impl Future<Output = Option<u64>> + Send {
        async { None }
    }

    /// Acknowledges `deliveries` (in delivery order): the broker forgets
    /// them. Called only after their transaction committed.
    fn ack(
        &mut self,
        deliveries: &[Self::Delivery],
    ) -> impl Future<Output = Result<(), MqError>> + Send;

    /// Refuses `delivery` for good: never delivered again (terminated, or
    /// dead-lettered where the queue has a dead-letter exchange).
    fn reject(
        &mut self,
        delivery: &Self::Delivery,
    ) -> impl Future<Output = Result<(), MqError>> + Send;

    /// Gives `deliveries` back unprocessed (a consumer shutting down in the
    /// middle of a retry): delivered again, to this or another consumer.
    fn release(
        &mut self,
        deliveries: &[Self::Delivery],
    ) -> impl Future<Output = Result<(), MqError>> + Send;

    /// Called once when the consumer stops: gives back whatever the broker
    /// handed out ahead of the batches (a prefetch window) at once rather
    /// than when the connection closes. Nothing by default.
    fn close(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// How long after its first delivery the broker may still deliver a
    /// message (`None`: no bound). The dedup rows must outlive it.
    fn redelivery_horizon(
        &mut self,
    ) -> impl Future<Output = Result<Option<Duration>, MqError>> + Send;
}
