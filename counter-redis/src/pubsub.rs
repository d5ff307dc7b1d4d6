//! Messages between the processes that share a cache's Redis: `PUBLISH` on
//! the cache's own connection, and a subscription on a connection of its
//! own (a subscribed connection can do nothing else).
//!
//! Channels are named inside the cache's namespace (`<namespace>:<channel>`),
//! so two applications on one Redis never hear each other. Redis Pub/Sub
//! delivers at most once: a message sent while a subscriber is
//! disconnected is lost to it, which its stream's end tells it. On a
//! cluster a message published on any node reaches the subscribers of
//! every node; under Sentinel the subscription follows the master the
//! Sentinels name when it is made.

use std::pin::Pin;

use futures_util::{Stream, StreamExt};
use redis::RedisResult;

use crate::{CountCache, RedisTarget, config::CacheError, link::Link};

/// The messages of one channel as Redis delivers them (in the order they
/// were published through one server; on a cluster, messages published
/// through different nodes may cross); the stream ends when the connection
/// is lost.
pub struct Subscription {
    messages: Pin<Box<dyn Stream<Item = Vec<u8>> + Send>>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").finish_non_exhaustive()
    }
}

impl Subscription {
    /// The next message's payload; `None` once the connection is lost
    /// (subscribe again: what was published meanwhile is not delivered).
    pub async fn next(&mut self) -> Option<Vec<u8>> {
        self.messages.next().await
    }
}

impl CountCache {
    /// The channel `channel` inside this cache's namespace.
    fn channel(&self, channel: &str) -> String {
        format!("{}:{channel}", self.shared.config.namespace)
    }

    /// Sends `payload` to every process subscribed to `channel` on this
    /// cache's Redis; how many received it (on a cluster, those of the node
    /// it was sent to).
    ///
    /// Errors: [`CacheError::Redis`] when Redis did not take it.
    pub async fn publish(&self, channel: &str, payload: &[u8]) -> Result<u64, CacheError> {
        let mut command = redis::cmd("PUBLISH");
        command.arg(self.channel(channel)).arg(payload);
        let received: RedisResult<u64> = match &self.shared.link {
            Link::Standalone(con) => command.query_async(&mut con.clone()).await,
            Link::Sentinel(followed) => {
                let master = followed.master().await?;
                let sent = command.query_async(&mut master.con.clone()).await;
                followed.settle(sent)
            }
            Link::Cluster(cluster) => cluster.publish(&command).await,
        };
        Ok(received?)
    }

    /// Subscribes to `channel` on a connection of its own: every message a
    /// process publishes there from now on, until the connection is lost.
    ///
    /// Errors: [`CacheError::Redis`] when no connection could be made.
    pub async fn subscribe(&self, channel: &str) -> Result<Subscription, CacheError> {
        let client = match &self.shared.target {
            RedisTarget::Standalone(url) => redis::Client::open(url.as_str())?,
            RedisTarget::Sentinel { .. } => match &self.shared.link {
                Link::Sentinel(followed) => followed.master_client().await?,
                _ => unreachable!("a Sentinel target has a Sentinel link"),
            },
            // Any node: Pub/Sub messages reach every node of a cluster.
            RedisTarget::Cluster(nodes) => {
                let mut last = None;
                let mut connected = None;
                for node in nodes {
                    let client = redis::Client::open(node.as_str())?;
                    match client.get_async_pubsub().await {
                        Ok(pubsub) => {
                            connected = Some(pubsub);
                            break;
                        }
                        Err(e) => last = Some(e),
                    }
                }
                let mut pubsub = match (connected, last) {
                    (Some(pubsub), _) => pubsub,
                    (None, Some(e)) => return Err(e.into()),
                    (None, None) => {
                        return Err(CacheError::InvalidSetting("a cluster target without nodes"));
                    }
                };
                pubsub.subscribe(self.channel(channel)).await?;
                return Ok(Subscription::of(pubsub));
            }
        };
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(self.channel(channel)).await?;
        Ok(Subscription::of(pubsub))
    }
}

impl Subscription {
    fn of(pubsub: redis::aio::PubSub) -> Self {
        Self {
            messages: Box::pin(
                pubsub
                    .into_on_message()
                    .map(|message| message.get_payload_bytes().to_vec()),
            ),
        }
    }
}
