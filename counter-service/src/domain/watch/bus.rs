//! How instances tell each other which owners changed: Redis Pub/Sub on
//! the cache's Redis, PostgreSQL `LISTEN`/`NOTIFY`, or nothing (every
//! watched total is then read again every `watch.poll_ms`).
//!
//! A message names a table and owners, never a value: the instance that
//! hears it reads the totals itself. Messages are merged while one is
//! being sent (an instance under load sends a few a second, not one per
//! add), and a table with too many changed owners is sent as "all of
//! them". `NOTIFY` is sent on the pool; `LISTEN` needs a session of its
//! own, so it is not offered behind a transaction pooler, which shares
//! sessions (`database.pooler = "transaction"`).

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, watch};

use counter_redis::CountCache;

use crate::metrics::{WATCH_BUS_ERRORS, WATCH_BUS_MESSAGES};

/// The channel on the cache's Redis (inside its namespace).
const REDIS_CHANNEL: &str = "watch";

/// Which bus this instance uses.
#[derive(Clone)]
pub(crate) enum Bus {
    /// Redis Pub/Sub on the cache's Redis (`[cache]`), on a channel of the
    /// cache's namespace.
    Redis(CountCache),
    /// PostgreSQL `LISTEN`/`NOTIFY` on `channel`, listened to on a
    /// connection of its own to `url`.
    Postgres { url: String, channel: String },
    /// None: every watched total is read again every `watch.poll_ms`.
    Poll,
}

impl Bus {
    /// The name `/readyz` and the log give it.
    pub fn name(&self) -> &'static str {
        match self {
            Bus::Redis(_) => "redis",
            Bus::Postgres { .. } => "postgres",
            Bus::Poll => "poll",
        }
    }

    /// The channel of a database (and schema): instances counting into
    /// the same tables hear each other, others do not.
    pub fn channel(schema: Option<&str>) -> String {
        let channel = format!("counter_watch_{}", schema.unwrap_or("public"));
        if channel.len() <= 63 {
            return channel;
        }
        let hash = schema
            .unwrap_or_default()
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
        format!("counter_watch_{hash:016x}")
    }
}

/// What changed in one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Changed {
    /// Every owner may have changed (a clear, a lost message).
    All,
    Owners(HashSet<String>),
}

impl Changed {
    /// Merges `owners` in, becoming [`Changed::All`] past `max` owners.
    pub fn add(&mut self, owners: impl IntoIterator<Item = String>, max: usize) {
        if let Changed::Owners(set) = self {
            set.extend(owners);
            if set.len() > max {
                *self = Changed::All;
            }
        }
    }
}

/// Changed owners by table, merged until taken; bounded by `max` owners
/// per table.
pub(super) struct Changes {
    tables: Mutex<HashMap<String, Changed>>,
    max: usize,
    pub wake: Notify,
}

impl Changes {
    pub fn new(max: usize) -> Self {
        Self {
            tables: Mutex::default(),
            max,
            wake: Notify::new(),
        }
    }

    fn tables(&self) -> std::sync::MutexGuard<'_, HashMap<String, Changed>> {
        self.tables.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `owners` of `table` (`None`: all of them) and wakes the
    /// taker.
    pub fn add(&self, table: &str, owners: Option<Vec<String>>) {
        let mut tables = self.tables();
        let entry = tables
            .entry(table.to_owned())
            .or_insert_with(|| Changed::Owners(HashSet::new()));
        match owners {
            Some(owners) => entry.add(owners, self.max),
            None => *entry = Changed::All,
        }
        drop(tables);
        self.wake.notify_one();
    }

    pub fn take(&self) -> HashMap<String, Changed> {
        std::mem::take(&mut *self.tables())
    }
}

/// One message on the bus.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub(super) struct Message {
    /// The instance that sent it (it ignores its own).
    pub from: String,
    pub table: String,
    /// The owners changed, unless `all`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owners: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all: bool,
}

/// `NOTIFY` payloads stay under PostgreSQL's 8,000 bytes.
const MAX_PAYLOAD: usize = 7_000;

/// The payloads telling `changed` of `table`: as many as its owners need.
pub(super) fn encode(from: &str, table: &str, changed: &Changed) -> Vec<String> {
    let message = |owners: Vec<String>, all: bool| {
        serde_json::to_string(&Message {
            from: from.to_owned(),
            table: table.to_owned(),
            owners,
            all,
        })
        .expect("a message serializes")
    };
    let Changed::Owners(owners) = changed else {
        return vec![message(Vec::new(), true)];
    };
    let mut payloads = Vec::new();
    let mut batch = Vec::new();
    let mut size = 0;
    for owner in owners {
        // An owner's JSON string: quotes, escapes at most doubling it.
        let cost = serde_json::to_string(owner).map_or(owner.len() * 6, |s| s.len()) + 1;
        if !batch.is_empty() && size + cost > MAX_PAYLOAD - 200 {
            payloads.push(message(std::mem::take(&mut batch), false));
            size = 0;
        }
        size += cost;
        batch.push(owner.clone());
    }
    if !batch.is_empty() {
        payloads.push(message(batch, false));
    }
    payloads
}

/// The shortest pause between two rounds of sends: changes meanwhile are
/// merged into the next.
const SEND_GAP: Duration = Duration::from_millis(5);

/// Sends this instance's changes on `bus` until `stop`.
pub(super) async fn send(
    bus: Bus,
    db: DatabaseConnection,
    from: String,
    outbox: Arc<Changes>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            () = outbox.wake.notified() => {}
            _ = stop.changed() => return,
        }
        for (table, changed) in outbox.take() {
            for payload in encode(&from, &table, &changed) {
                let sent = match &bus {
                    Bus::Redis(cache) => cache
                        .publish(REDIS_CHANNEL, payload.as_bytes())
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string()),
                    Bus::Postgres { channel, .. } => {
                        let statement = Statement::from_sql_and_values(
                            DbBackend::Postgres,
                            "SELECT pg_notify($1, $2)",
                            [channel.clone().into(), payload.into()],
                        );
                        db.execute_raw(statement)
                            .await
                            .map(drop)
                            .map_err(|e| e.to_string())
                    }
                    Bus::Poll => Ok(()),
                };
                match sent {
                    Ok(()) => {
                        metrics::counter!(WATCH_BUS_MESSAGES, "direction" => "sent").increment(1)
                    }
                    Err(error) => {
                        metrics::counter!(WATCH_BUS_ERRORS).increment(1);
                        tracing::warn!(%error, "telling other instances of changes failed; their watchers catch up at their next poll");
                    }
                }
            }
        }
        tokio::time::sleep(SEND_GAP).await;
    }
}

/// Hands a message heard on the bus to `heard`, unless this instance sent
/// it.
fn take(payload: &[u8], me: &str, heard: &impl Fn(Option<Message>)) {
    metrics::counter!(WATCH_BUS_MESSAGES, "direction" => "received").increment(1);
    match serde_json::from_slice::<Message>(payload) {
        Ok(message) if message.from == me => {}
        Ok(message) => heard(Some(message)),
        Err(error) => tracing::warn!(%error, "a message on the watch channel that is not one"),
    }
}

/// Listens on the cache's Redis until `stop`, as [`listen`] does.
pub(super) async fn listen_redis(
    cache: CountCache,
    me: String,
    heard: impl Fn(Option<Message>) + Send + 'static,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let subscribed = tokio::select! {
            subscribed = cache.subscribe(REDIS_CHANNEL) => subscribed,
            _ = stop.changed() => return,
        };
        match subscribed {
            Ok(mut subscription) => {
                backoff = Duration::from_millis(100);
                // Whatever happened while not subscribed is unknown.
                heard(None);
                loop {
                    let message = tokio::select! {
                        message = subscription.next() => message,
                        _ = stop.changed() => return,
                    };
                    match message {
                        Some(payload) => take(&payload, &me, &heard),
                        None => break,
                    }
                }
                metrics::counter!(WATCH_BUS_ERRORS).increment(1);
                tracing::warn!(
                    "the subscription to other instances' changes was lost; subscribing again"
                );
                heard(None);
            }
            Err(error) => {
                metrics::counter!(WATCH_BUS_ERRORS).increment(1);
                tracing::warn!(%error, "cannot subscribe to other instances' changes; retrying");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Listens on PostgreSQL's `channel` until `stop`, handing each other
/// instance's message to `heard`, and `None` whenever messages may have
/// been missed (the connection was lost and made again).
pub(super) async fn listen(
    url: String,
    channel: String,
    me: String,
    heard: impl Fn(Option<Message>) + Send + 'static,
    mut stop: watch::Receiver<bool>,
) {
    use sea_orm::sqlx::postgres::PgListener;
    let mut backoff = Duration::from_millis(100);
    loop {
        let connected = async {
            let mut listener = PgListener::connect(&url).await?;
            listener.listen(&channel).await?;
            Ok::<_, sea_orm::sqlx::Error>(listener)
        };
        let mut listener = tokio::select! {
            connected = connected => match connected {
                Ok(listener) => listener,
                Err(error) => {
                    metrics::counter!(WATCH_BUS_ERRORS).increment(1);
                    tracing::warn!(%error, "cannot listen for other instances' changes; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        _ = stop.changed() => return,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        backoff = Duration::from_millis(100);
        // Whatever happened while not listening is unknown.
        heard(None);
        loop {
            let received = tokio::select! {
                received = listener.try_recv() => received,
                _ = stop.changed() => return,
            };
            match received {
                Ok(Some(notification)) => take(notification.payload().as_bytes(), &me, &heard),
                // Lost and made again: messages may have been missed.
                Ok(None) => heard(None),
                Err(error) => {
                    metrics::counter!(WATCH_BUS_ERRORS).increment(1);
                    tracing::warn!(%error, "listening for other instances' changes failed; reconnecting");
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_stay_under_notify_s_limit_and_name_every_owner() {
        let owners: HashSet<String> = (0..5_000).map(|i| format!("owner-\"{i}\"")).collect();
        let payloads = encode("me", "post_counters", &Changed::Owners(owners.clone()));
        assert!(payloads.len() > 1);
        let mut heard = HashSet::new();
        for payload in &payloads {
            assert!(payload.len() < 8_000, "{}", payload.len());
            let message: Message = serde_json::from_str(payload).unwrap();
            assert_eq!((message.from.as_str(), message.all), ("me", false));
            heard.extend(message.owners);
        }
        assert_eq!(heard, owners);
        let all = encode("me", "t", &Changed::All);
        let message: Message = serde_json::from_str(&all[0]).unwrap();
        assert!(message.all && message.owners.is_empty());
    }

    #[test]
    fn too_many_owners_become_all_and_channels_fit_an_identifier() {
        let changes = Changes::new(3);
        changes.add("t", Some(vec!["1".into(), "2".into()]));
        changes.add("t", Some(vec!["2".into(), "3".into()]));
        assert_eq!(
            changes.take()["t"],
            Changed::Owners(["1", "2", "3"].map(String::from).into())
        );
        changes.add("t", Some((0..4).map(|i| i.to_string()).collect()));
        assert_eq!(changes.take()["t"], Changed::All);
        assert_eq!(Bus::channel(None), "counter_watch_public");
        assert_eq!(Bus::channel(Some("s1")), "counter_watch_s1");
        let long = Bus::channel(Some(&"x".repeat(60)));
        assert!(long.len() <= 63, "{long}");
        assert_ne!(long, Bus::channel(Some(&"y".repeat(60))));
    }
}
