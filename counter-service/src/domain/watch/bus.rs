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
//!
//! A subscription can die without a word: a link cut with no reset, a
//! firewall or NAT that forgot the connection. Nothing arrives, nothing
//! fails, and its watchers would wait for the safety poll. So a listener
//! that has heard nothing for a while sends itself an echo on the bus
//! ([`Echo`]); if it does not come back in time, the subscription is made
//! again and every watched total read again.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::time::Instant;

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
    /// A listener's echo to itself ([`Echo`]): no change, ignored by the
    /// others.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub echo: bool,
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
            echo: false,
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
                match publish(&bus, &db, payload).await {
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

/// Sends `payload` on `bus` (`NOTIFY` on `db`'s pool for PostgreSQL).
async fn publish(bus: &Bus, db: &DatabaseConnection, payload: String) -> Result<(), String> {
    match bus {
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
    }
}

/// Hands a message heard on the bus to `heard`, unless this instance sent
/// it or it is another's echo.
fn take(payload: &[u8], me: &str, heard: &impl Fn(Option<Message>)) {
    metrics::counter!(WATCH_BUS_MESSAGES, "direction" => "received").increment(1);
    match serde_json::from_slice::<Message>(payload) {
        Ok(message) if message.from == me || message.echo => {}
        Ok(message) => heard(Some(message)),
        Err(error) => tracing::warn!(%error, "a message on the watch channel that is not one"),
    }
}

/// How a listener tells a live subscription from one that died without a
/// word: after `quiet` with nothing heard, it sends itself an echo on the
/// bus, and a subscription that does not carry it back (or anything else)
/// within `within` is lost.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Echo {
    pub quiet: Duration,
    pub within: Duration,
}

impl Echo {
    /// An echo after 10 s of silence, lost after 5 more: a dead
    /// subscription costs its watchers at most 15 s of others' changes,
    /// where the safety poll took 30 s; an idle instance sends one small
    /// message every 10 s.
    pub const DEFAULT: Echo = Echo {
        quiet: Duration::from_secs(10),
        within: Duration::from_secs(5),
    };
}

/// One subscription's [`Echo`] state.
struct Watchdog {
    echo: Echo,
    /// When something was last heard (or the subscription made).
    heard_at: Instant,
    /// When the echo still unanswered was sent.
    echo_sent: Option<Instant>,
}

impl Watchdog {
    fn new(echo: Echo) -> Self {
        Self {
            echo,
            heard_at: Instant::now(),
            echo_sent: None,
        }
    }

    /// Anything heard, an echo or not: the subscription is alive.
    fn heard(&mut self) {
        self.heard_at = Instant::now();
        self.echo_sent = None;
    }

    /// When to look again if nothing is heard meanwhile.
    fn deadline(&self) -> Instant {
        match self.echo_sent {
            Some(sent) => sent + self.echo.within,
            None => self.heard_at + self.echo.quiet,
        }
    }

    /// At the deadline: sends the echo and returns true, or, an echo
    /// already unanswered, says the subscription is lost and returns false.
    async fn at_deadline(&mut self, bus: &Bus, db: &DatabaseConnection, me: &str) -> bool {
        if self.echo_sent.is_some() {
            lost_silently(self.echo);
            return false;
        }
        self.echo_sent = Some(Instant::now());
        send_echo(bus, db, me, self.echo.within).await;
        true
    }
}

/// Sends this instance's echo on `bus`, bounded by `within` (a publish
/// that hangs is as good as lost: the echo's deadline tells).
async fn send_echo(bus: &Bus, db: &DatabaseConnection, me: &str, within: Duration) {
    let payload = serde_json::to_string(&Message {
        from: me.to_owned(),
        table: String::new(),
        owners: Vec::new(),
        all: false,
        echo: true,
    })
    .expect("a message serializes");
    match tokio::time::timeout(within, publish(bus, db, payload)).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::warn!(%error, "sending the watch bus its echo failed");
        }
        Err(_) => tracing::warn!("sending the watch bus its echo timed out"),
    }
}

/// Logs and counts a subscription found dead by its [`Echo`].
fn lost_silently(echo: Echo) {
    metrics::counter!(WATCH_BUS_ERRORS).increment(1);
    tracing::warn!(
        silent_ms = (echo.quiet + echo.within).as_millis() as u64,
        "the subscription to other instances' changes carried nothing, not even its echo; \
         making it again"
    );
}

/// Listens on the cache's Redis until `stop`, as [`listen`] does.
pub(super) async fn listen_redis(
    cache: CountCache,
    db: DatabaseConnection,
    me: String,
    heard: impl Fn(Option<Message>) + Send + 'static,
    mut stop: watch::Receiver<bool>,
    echo: Echo,
) {
    let bus = Bus::Redis(cache.clone());
    let mut backoff = Duration::from_millis(100);
    loop {
        // Bounded: a subscribe on a half-open path would wait for TCP.
        let subscribing =
            tokio::time::timeout(echo.quiet + echo.within, cache.subscribe(REDIS_CHANNEL));
        let subscribed = tokio::select! {
            subscribed = subscribing => match subscribed {
                Ok(subscribed) => subscribed.map_err(|e| e.to_string()),
                Err(_) => Err("subscribing timed out".to_owned()),
            },
            _ = stop.changed() => return,
        };
        match subscribed {
            Ok(mut subscription) => {
                backoff = Duration::from_millis(100);
                // Whatever happened while not subscribed is unknown.
                heard(None);
                let mut watchdog = Watchdog::new(echo);
                loop {
                    let message = tokio::select! {
                        // A message ready with the deadline is taken first.
                        biased;
                        message = subscription.next() => Some(message),
                        () = tokio::time::sleep_until(watchdog.deadline()) => None,
                        _ = stop.changed() => return,
                    };
                    match message {
                        Some(Some(payload)) => {
                            watchdog.heard();
                            take(&payload, &me, &heard);
                        }
                        Some(None) => {
                            metrics::counter!(WATCH_BUS_ERRORS).increment(1);
                            tracing::warn!(
                                "the subscription to other instances' changes was lost; subscribing again"
                            );
                            break;
                        }
                        None => {
                            if !watchdog.at_deadline(&bus, &db, &me).await {
                                break;
                            }
                        }
                    }
                }
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
    db: DatabaseConnection,
    me: String,
    heard: impl Fn(Option<Message>) + Send + 'static,
    mut stop: watch::Receiver<bool>,
    echo: Echo,
) {
    use sea_orm::sqlx::postgres::PgListener;
    let bus = Bus::Postgres {
        url: url.clone(),
        channel: channel.clone(),
    };
    let mut backoff = Duration::from_millis(100);
    loop {
        // Bounded: a connect on a half-open path would wait for TCP.
        let connected = async {
            tokio::time::timeout(echo.quiet + echo.within, async {
                let mut listener = PgListener::connect(&url).await?;
                listener.listen(&channel).await?;
                Ok::<_, sea_orm::sqlx::Error>(listener)
            })
            .await
            .unwrap_or(Err(sea_orm::sqlx::Error::PoolTimedOut))
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
        let mut watchdog = Watchdog::new(echo);
        loop {
            let received = tokio::select! {
                // A notification ready with the deadline is taken first.
                biased;
                received = listener.try_recv() => Some(received),
                () = tokio::time::sleep_until(watchdog.deadline()) => None,
                _ = stop.changed() => return,
            };
            match received {
                Some(Ok(Some(notification))) => {
                    watchdog.heard();
                    take(notification.payload().as_bytes(), &me, &heard);
                }
                // Lost and made again: messages may have been missed.
                Some(Ok(None)) => {
                    watchdog.heard();
                    heard(None);
                }
                Some(Err(error)) => {
                    metrics::counter!(WATCH_BUS_ERRORS).increment(1);
                    tracing::warn!(%error, "listening for other instances' changes failed; reconnecting");
                    break;
                }
                None => {
                    if !watchdog.at_deadline(&bus, &db, &me).await {
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use counter_tests::proxy::Proxy;

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

    /// What a listener under test heard: `None` for "may have missed
    /// messages" (made again), `Some(table)` for a change.
    type Heard = tokio::sync::mpsc::UnboundedReceiver<Option<String>>;

    fn recorder() -> (impl Fn(Option<Message>) + Send + 'static, Heard) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (
            move |m: Option<Message>| drop(tx.send(m.map(|m| m.table))),
            rx,
        )
    }

    /// The next thing heard within `within`, if any.
    async fn next(heard: &mut Heard, within: Duration) -> Option<Option<String>> {
        tokio::time::timeout(within, heard.recv())
            .await
            .ok()
            .flatten()
    }

    /// A change of `table` from another instance, sent on `bus`.
    async fn change(bus: &Bus, db: &DatabaseConnection, table: &str) {
        let changed = Changed::Owners(["7".to_owned()].into());
        for payload in encode("other", table, &changed) {
            publish(bus, db, payload).await.expect("published");
        }
    }

    /// Quick, with room for a loaded machine's round trip.
    const QUICK: Echo = Echo {
        quiet: Duration::from_millis(300),
        within: Duration::from_millis(600),
    };

    /// Checks a listener stalled by `proxy`: it hears `bus`'s changes, is
    /// stalled (a link cut without a reset), finds it by its echo within a
    /// bound, and hears changes again on a subscription made anew.
    async fn stalled_and_found(
        proxy: &Proxy,
        bus: &Bus,
        db: &DatabaseConnection,
        heard: &mut Heard,
    ) {
        let bound = QUICK.quiet + QUICK.within + Duration::from_secs(3);
        assert_eq!(next(heard, bound).await, Some(None), "subscribed");
        change(bus, db, "before").await;
        assert_eq!(next(heard, bound).await, Some(Some("before".to_owned())));
        // Quiet for longer than an echo's round: echoes come back, nothing
        // is made again.
        assert_eq!(
            next(heard, QUICK.quiet * 4).await,
            None,
            "a live subscription kept"
        );
        proxy.stall_all();
        let stalled = std::time::Instant::now();
        // The proxy's connections take the stall in before anything more.
        tokio::time::sleep(Duration::from_millis(100)).await;
        change(bus, db, "during").await;
        // Not heard; then the echo goes unanswered and it is made again.
        assert_eq!(
            next(heard, bound).await,
            Some(None),
            "found dead by its echo"
        );
        // When within the bound depends on where the stall fell in the
        // echoes' cycle: printed, not asserted.
        let found = stalled.elapsed();
        // Heard again once the subscription is made anew (a message sent
        // before that is lost to it, as the `None` said).
        let again = std::time::Instant::now();
        loop {
            change(bus, db, "after").await;
            match next(heard, Duration::from_millis(200)).await {
                Some(Some(table)) => {
                    assert_eq!(table, "after", "only changes sent after the stall");
                    break;
                }
                Some(None) | None => {
                    assert!(again.elapsed() < bound, "not heard again within {bound:?}");
                }
            }
        }
        eprintln!("a stalled subscription was made again {found:?} after the stall");
    }

    /// A proxy to the server whose URL `var` holds (`default_port` if it
    /// names none), the URL and the URL through the proxy; `None` when
    /// `var` is not set (the test is skipped, saying so).
    async fn through_a_proxy(
        var: &str,
        default_port: u16,
        test: &str,
    ) -> Option<(Proxy, String, String)> {
        use counter_tests::{servers, split_authority, with_host};
        if !servers::wanted(var, test) {
            return None;
        }
        let url = std::env::var(var).expect("set");
        let (_, server) = split_authority(&url).expect("a server URL");
        let server = if server.contains(':') {
            server.to_owned()
        } else {
            format!("{server}:{default_port}")
        };
        let proxy = Proxy::start(&server).await.expect("a proxy");
        let proxied = with_host(&url, &proxy.addr().to_string()).expect("a URL");
        Some((proxy, url, proxied))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_listen_session_is_found_by_its_echo_and_made_again() {
        let test = "a_stalled_listen_session_is_found_by_its_echo_and_made_again";
        let Some((proxy, url, proxied)) =
            through_a_proxy(counter_tests::POSTGRES_URL_VAR, 5432, test).await
        else {
            return;
        };
        let db = sea_orm::Database::connect(url.as_str())
            .await
            .expect("connect");
        let channel = format!("counter_watch_echo_test_{}", std::process::id());
        let bus = Bus::Postgres {
            url: proxied.clone(),
            channel: channel.clone(),
        };
        let (heard_by, mut heard) = recorder();
        let (stop_tx, stop) = watch::channel(false);
        let listening = tokio::spawn(listen(
            proxied,
            channel,
            db.clone(),
            "me".to_owned(),
            heard_by,
            stop,
            QUICK,
        ));
        stalled_and_found(&proxy, &bus, &db, &mut heard).await;
        stop_tx.send_replace(true);
        listening.await.expect("the listener ends");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_redis_subscription_is_found_by_its_echo_and_made_again() {
        let test = "a_stalled_redis_subscription_is_found_by_its_echo_and_made_again";
        let Some((proxy, url, proxied)) =
            through_a_proxy(counter_tests::redis::REDIS_URL_VAR, 6379, test).await
        else {
            return;
        };
        let namespace = format!("echo-test-{}", std::process::id());
        let cache = |url: String| {
            let namespace = namespace.clone();
            async move {
                CountCache::builder(counter_redis::RedisTarget::standalone(url))
                    .namespace(namespace)
                    .build()
                    .await
                    .expect("a cache")
            }
        };
        // The listener's cache goes through the proxy; the other instance's
        // does not.
        let (listening_cache, other) = (cache(proxied).await, cache(url).await);
        let db = sea_orm::Database::connect("sqlite::memory:")
            .await
            .expect("sqlite");
        let (heard_by, mut heard) = recorder();
        let (stop_tx, stop) = watch::channel(false);
        let listening = tokio::spawn(listen_redis(
            listening_cache,
            db.clone(),
            "me".to_owned(),
            heard_by,
            stop,
            QUICK,
        ));
        stalled_and_found(&proxy, &Bus::Redis(other), &db, &mut heard).await;
        stop_tx.send_replace(true);
        listening.await.expect("the listener ends");
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
