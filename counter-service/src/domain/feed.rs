//! Queue-fed counting: the service runs `counter-mq`'s consumer over its
//! namespaces' tables, so a business service may publish instead of
//! calling. Queue adds and HTTP adds of one counter land in the same slot
//! rows and sum exactly; each path applies its own ids once.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use counter_mq::{Consumer, ConsumerStats, Source, StatsHandle, Tables, amqp, nats};
use sea_orm::DatabaseConnection;
use tokio::{sync::watch, task::JoinHandle};

use crate::{config::BrokerConfig, dispatch, domain::namespace::Namespace};

/// What `/readyz` and `/metrics` read of the running consumer.
#[derive(Clone)]
pub(crate) struct FeedStatus {
    pub broker: &'static str,
    pub stats: StatsHandle,
    running: Arc<AtomicBool>,
}

impl FeedStatus {
    /// Whether the consumer is still running.
    pub fn running(&self) -> bool {
        self.running.load(Ordering::Relaxed)
    }

    /// Its figures.
    pub fn stats(&self) -> ConsumerStats {
        self.stats.get()
    }
}

/// Connects to the broker and starts the consumer; it stops after its
/// batch in hand when `stop` turns true.
pub(crate) async fn start<'a>(
    config: &BrokerConfig,
    db: DatabaseConnection,
    namespaces: impl Iterator<Item = &'a Namespace>,
    mut stop: watch::Receiver<bool>,
) -> Result<(FeedStatus, JoinHandle<()>), String> {
    let broker_error = |e: counter_mq::MqError| e.to_string();
    let mut tables = Tables::new();
    for namespace in namespaces {
        tables = dispatch!(&namespace.table, h => tables.with(&h.counters));
    }
    let shutdown = async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    let running = Arc::new(AtomicBool::new(true));
    let flag = running.clone();
    let finish = move |result: Result<ConsumerStats, counter_mq::MqError>| {
        flag.store(false, Ordering::Relaxed);
        match result {
            Ok(stats) => tracing::info!(applied = stats.applied, "queue consumer stopped"),
            Err(error) => tracing::error!(%error, "queue consumer failed"),
        }
    };
    let (broker, stats, task) = match config {
        BrokerConfig::Nats {
            url,
            stream,
            consumer,
            subjects,
        } => {
            let client = counter_mq::async_nats::connect(url.as_str())
                .await
                .map_err(|e| format!("cannot connect to NATS at {url}: {e}"))?;
            let js = counter_mq::async_nats::jetstream::new(client);
            let settings = nats::StreamSettings {
                name: stream.clone(),
                subjects: subjects.clone(),
                ..nats::StreamSettings::default()
            };
            nats::ensure_stream(&js, &settings)
                .await
                .map_err(broker_error)?;
            let source = nats::JetStreamSource::new(
                js,
                stream,
                nats::ConsumerSettings {
                    durable: consumer.clone(),
                    ..nats::ConsumerSettings::default()
                },
            )
            .await
            .map_err(broker_error)?;
            let (stats, task) = spawn(db, tables, source, shutdown, finish).await?;
            ("nats", stats, task)
        }
        BrokerConfig::Amqp { url, queue } => {
            let source =
                amqp::AmqpSource::connect(url, amqp::QueueSettings::named(queue.clone()), 1_000)
                    .await
                    .map_err(broker_error)?;
            let (stats, task) = spawn(db, tables, source, shutdown, finish).await?;
            ("amqp", stats, task)
        }
    };
    Ok((
        FeedStatus {
            broker,
            stats,
            running,
        },
        task,
    ))
}

/// Builds the consumer over `source` and runs it in a task of its own until
/// `shutdown`; `finish` is told how it ended.
async fn spawn<S: Source + 'static>(
    db: DatabaseConnection,
    tables: Tables,
    source: S,
    shutdown: impl Future<Output = ()> + Send + 'static,
    finish: impl FnOnce(Result<ConsumerStats, counter_mq::MqError>) + Send + 'static,
) -> Result<(StatsHandle, JoinHandle<()>), String> {
    let consumer = Consumer::builder(db, tables)
        .build(source)
        .await
        .map_err(|e| e.to_string())?;
    let stats = consumer.stats_handle();
    Ok((
        stats,
        tokio::spawn(async move { finish(consumer.run(shutdown).await) }),
    ))
}
