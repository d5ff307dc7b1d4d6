//! The hub: which streams watch which owners, what changed, the reads that
//! refresh them, and the bounds of it all.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::{
        Arc, Mutex, PoisonError, Weak,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use counter_core::{
    CounterError,
    observe::{CommitObserver, ObserverFuture},
};
use sea_orm::DatabaseConnection;
use tokio::{sync::watch, task::JoinHandle};

use super::{
    Event, Interest, Link, Payload, RankingInterest, Reason, WatchedRanking,
    bus::{self, Bus, Changed, Changes},
    mailbox::{Mailbox, ReadSpan, Total, Value},
    read,
};
use crate::{
    config::{BusSetting, Config, Pooler, WatchConfig},
    dispatch,
    domain::namespace::Namespace,
    domain::owner::ServiceOwner,
    metrics::{WATCH_CLOSED, WATCH_EVENTS, WATCH_STREAMS},
    problem::Problem,
};

/// Changed owners kept per table before the whole table is read again.
const MAX_CHANGED_OWNERS: usize = 10_000;
/// The longest pause between two refreshes of changed totals.
const REFRESH_GAP: Duration = Duration::from_millis(25);
/// How long a stream the service ended may take to send its last event
/// before its connection is closed.
const HANG_UP_AFTER: Duration = Duration::from_secs(1);

/// The watch streams of this instance; cheap to clone.
#[derive(Clone)]
pub(crate) struct Hub {
    inner: Arc<Inner>,
}

struct Inner {
    db: DatabaseConnection,
    /// The namespaces, by table.
    tables: HashMap<String, Namespace>,
    settings: WatchConfig,
    bus: Bus,
    registry: Mutex<Registry>,
    /// Watched owners changed since the last refresh.
    dirty: Changes,
    /// Tables whose watched rankings may have changed since.
    ranked: Mutex<HashSet<String>>,
    /// This instance's changes for the others, when there is a bus.
    outbox: Option<Arc<Changes>>,
    /// The clock of reads' spans ([`ReadSpan`]), ticked as each read is
    /// sent and as its rows come back.
    clock: AtomicU64,
    /// Set once the instance drains: new streams are refused, and one
    /// registering meanwhile is ended at once.
    closing: std::sync::atomic::AtomicBool,
    /// Streams at most: `watch.max_streams`, within nine tenths of
    /// `server.max_connections` (a stream's connection is never evicted,
    /// so streams must leave room for every other caller).
    max_streams: usize,
    /// Kept alive here: the library's registry holds it weakly.
    _observer: Mutex<Option<Arc<dyn CommitObserver>>>,
}

#[derive(Default)]
struct Registry {
    next: u64,
    streams: HashMap<u64, Arc<Mailbox>>,
    /// Stream ids by table, then by owner watched.
    watching: HashMap<String, HashMap<String, Vec<u64>>>,
    /// Ranking streams by table.
    rankings: HashMap<String, Vec<u64>>,
    per_token: HashMap<String, usize>,
    /// Streams the service ended, and when their connection is closed if
    /// they are still sending then.
    hanging_up: Vec<(Weak<Mailbox>, Instant)>,
}

/// What one refresh of a table reads.
#[derive(Default)]
struct Plan {
    owners: Vec<String>,
    counted: Vec<String>,
    unique: Vec<String>,
}

impl Registry {
    /// The watched owners of `changed` in `table`, and every key any of
    /// their streams watches.
    fn plan(&self, table: &str, changed: &Changed) -> Plan {
        let Some(owners) = self.watching.get(table) else {
            return Plan::default();
        };
        let mut plan = Plan::default();
        let (mut counted, mut unique) = (HashSet::new(), HashSet::new());
        let mut add = |owner: &String, ids: &Vec<u64>| {
            plan.owners.push(owner.clone());
            for id in ids {
                if let Some(stream) = self.streams.get(id) {
                    counted.extend(stream.interest.counted.iter().cloned());
                    unique.extend(stream.interest.unique.iter().cloned());
                }
            }
        };
        match changed {
            Changed::All => owners.iter().for_each(|(owner, ids)| add(owner, ids)),
            Changed::Owners(changed) => {
                for owner in changed {
                    if let Some(ids) = owners.get(owner) {
                        add(owner, ids);
                    }
                }
            }
        }
        plan.counted = counted.into_iter().collect();
        plan.unique = unique.into_iter().collect();
        plan
    }
}

impl Inner {
    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks the watched ones of `owners` of `table` (`None`: every owner)
    /// for a refresh.
    fn mark(&self, table: &str, owners: Option<Vec<String>>) {
        let registry = self.registry();
        // Any change of the table may move its rankings.
        if registry.rankings.contains_key(table) {
            self.ranked
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(table.to_owned());
            self.dirty.wake.notify_one();
        }
        let Some(watched) = registry.watching.get(table) else {
            return;
        };
        let owners = match owners {
            None => None,
            Some(owners) => {
                let owners: Vec<String> = owners
                    .into_iter()
                    .filter(|owner| watched.contains_key(owner))
                    .collect();
                if owners.is_empty() {
                    return;
                }
                Some(owners)
            }
        };
        drop(registry);
        self.dirty.add(table, owners);
    }

    /// Marks every watched owner for a refresh.
    fn mark_all(&self) {
        let (tables, ranked): (Vec<String>, Vec<String>) = {
            let registry = self.registry();
            (
                registry.watching.keys().cloned().collect(),
                registry.rankings.keys().cloned().collect(),
            )
        };
        for table in tables {
            self.dirty.add(&table, None);
        }
        if !ranked.is_empty() {
            self.ranked
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend(ranked);
            self.dirty.wake.notify_one();
        }
    }

    /// The rankings to read again: each watched (key, limit) of each table
    /// marked, with the streams that watch it.
    fn rankings_to_read(&self) -> Vec<(String, RankingInterest, Vec<Arc<Mailbox>>)> {
        let tables =
            std::mem::take(&mut *self.ranked.lock().unwrap_or_else(PoisonError::into_inner));
        let registry = self.registry();
        let mut reads: HashMap<(String, RankingInterest), Vec<Arc<Mailbox>>> = HashMap::new();
        for table in tables {
            for id in registry.rankings.get(&table).into_iter().flatten() {
                if let Some(stream) = registry.streams.get(id)
                    && let Some(ranking) = &stream.interest.ranking
                {
                    reads
                        .entry((table.clone(), ranking.clone()))
                        .or_default()
                        .push(stream.clone());
                }
            }
        }
        reads
            .into_iter()
            .map(|((table, ranking), streams)| (table, ranking, streams))
            .collect()
    }

    /// A write of this instance committed: its watchers here, and the
    /// other instances through the bus.
    fn committed(&self, table: &str, owners: Option<Vec<String>>) {
        if let Some(outbox) = &self.outbox {
            outbox.add(table, owners.clone());
        }
        self.mark(table, owners);
    }

    /// Runs `read`, and says over which span of the clock it ran.
    async fn timed<T>(&self, read: impl Future<Output = T>) -> (ReadSpan, T) {
        let began = self.clock.fetch_add(1, Ordering::SeqCst);
        let rows = read.await;
        let ended = self.clock.fetch_add(1, Ordering::SeqCst);
        (ReadSpan { began, ended }, rows)
    }

    /// `owners` × `counted` and `unique` of `namespace`, timed.
    async fn read_values(
        &self,
        namespace: &Namespace,
        owners: &[String],
        counted: &[String],
        unique: &[String],
    ) -> (ReadSpan, Result<Vec<(Total, Value)>, CounterError>) {
        self.timed(read::values(&self.db, namespace, owners, counted, unique))
            .await
    }

    /// `ranking` of `namespace`, timed.
    async fn read_ranking(
        &self,
        namespace: &Namespace,
        ranking: &RankingInterest,
    ) -> (ReadSpan, Result<WatchedRanking, CounterError>) {
        self.timed(read::ranking(
            &self.db,
            namespace,
            &ranking.key,
            ranking.limit,
        ))
        .await
    }

    /// Owners of `table` whose values came from reads in no known order:
    /// read again, after both.
    fn read_again(&self, table: &str, owners: BTreeSet<String>) {
        if !owners.is_empty() {
            self.dirty.add(table, Some(owners.into_iter().collect()));
        }
    }

    /// The rankings of `table` again, for the same reason.
    fn read_rankings_again(&self, table: &str) {
        self.ranked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(table.to_owned());
        self.dirty.wake.notify_one();
    }

    /// Hands the values read over `span` to the streams that watch them.
    fn deliver(&self, table: &str, span: ReadSpan, values: Vec<(Total, Value)>) {
        let mut by_owner: HashMap<&str, Vec<(&Total, Value)>> = HashMap::new();
        for (total, value) in &values {
            by_owner
                .entry(total.0.as_str())
                .or_default()
                .push((total, *value));
        }
        let mut offers = Vec::new();
        {
            let registry = self.registry();
            let Some(watched) = registry.watching.get(table) else {
                return;
            };
            for (owner, values) in by_owner {
                for id in watched.get(owner).into_iter().flatten() {
                    if let Some(stream) = registry.streams.get(id) {
                        offers.push((stream.clone(), values.clone()));
                    }
                }
            }
        }
        let mut unsure = BTreeSet::new();
        for (stream, values) in offers {
            unsure.append(&mut stream.offer(span, values));
        }
        self.read_again(table, unsure);
    }

    fn remove(&self, id: u64) {
        let mut registry = self.registry();
        let Some(stream) = registry.streams.remove(&id) else {
            return;
        };
        let table = self.table_of(&stream.interest.namespace);
        if let Some(ids) = registry.rankings.get_mut(&table) {
            ids.retain(|other| *other != id);
            if ids.is_empty() {
                registry.rankings.remove(&table);
            }
        }
        if let Some(owners) = registry.watching.get_mut(&table) {
            for owner in &stream.interest.owners {
                if let Some(ids) = owners.get_mut(owner) {
                    ids.retain(|other| *other != id);
                    if ids.is_empty() {
                        owners.remove(owner);
                    }
                }
            }
            if owners.is_empty() {
                registry.watching.remove(&table);
            }
        }
        if let Some(count) = registry.per_token.get_mut(&stream.token) {
            *count -= 1;
            if *count == 0 {
                registry.per_token.remove(&stream.token);
            }
        }
        metrics::gauge!(WATCH_STREAMS).set(registry.streams.len() as f64);
    }

    fn table_of(&self, namespace: &str) -> String {
        self.tables
            .iter()
            .find(|(_, ns)| ns.name == namespace)
            .map(|(table, _)| table.clone())
            .unwrap_or_default()
    }

    /// Ends `stream` for `reason`; its connection is closed if it has not
    /// sent its last event within [`HANG_UP_AFTER`].
    fn end(&self, stream: &Arc<Mailbox>, reason: Reason) {
        if stream.close(reason) {
            metrics::counter!(WATCH_CLOSED, "reason" => reason.as_str()).increment(1);
            self.registry()
                .hanging_up
                .push((Arc::downgrade(stream), Instant::now() + HANG_UP_AFTER));
        }
    }
}

impl Hub {
    /// The hub of `namespaces` on `db`, its bus chosen from `config`, its
    /// tasks running until `stop`.
    pub fn start(
        db: DatabaseConnection,
        namespaces: &std::collections::BTreeMap<String, Namespace>,
        cache: Option<&counter_redis::CountCache>,
        config: &Config,
        stop: watch::Receiver<bool>,
    ) -> (Self, Vec<JoinHandle<()>>) {
        let settings = config.watch.clone();
        let database = &config.database;
        let bus = match (settings.bus, cache) {
            (BusSetting::Auto, Some(cache)) => Bus::Redis(cache.clone()),
            (BusSetting::Auto, None)
                if database.url.starts_with("postgres")
                    && database.pooler != Pooler::Transaction =>
            {
                Bus::Postgres {
                    url: database.url.clone(),
                    channel: Bus::channel(database.schema.as_deref()),
                }
            }
            _ => Bus::Poll,
        };
        let instance = format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        let inner = Arc::new(Inner {
            tables: namespaces
                .values()
                .map(|ns| (ns.table_name().to_owned(), ns.clone()))
                .collect(),
            db: db.clone(),
            settings,
            outbox: (!matches!(bus, Bus::Poll)).then(|| Arc::new(Changes::new(MAX_CHANGED_OWNERS))),
            bus: bus.clone(),
            registry: Mutex::default(),
            dirty: Changes::new(MAX_CHANGED_OWNERS),
            ranked: Mutex::default(),
            closing: Default::default(),
            max_streams: config
                .watch
                .max_streams
                .min(config.server.max_connections * 9 / 10)
                .max(1),
            clock: AtomicU64::new(0),
            _observer: Mutex::default(),
        });
        let observer: Arc<dyn CommitObserver> = Arc::new(Observer(Arc::downgrade(&inner)));
        for table in inner.tables.keys() {
            counter_core::observe::register(table, &observer);
        }
        *inner
            ._observer
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(observer);
        let mut tasks = vec![
            tokio::spawn(refresh(inner.clone(), stop.clone())),
            tokio::spawn(sweep(inner.clone(), stop.clone())),
        ];
        if let Some(outbox) = &inner.outbox {
            tasks.push(tokio::spawn(bus::send(
                bus.clone(),
                db.clone(),
                instance.clone(),
                outbox.clone(),
                stop.clone(),
            )));
            let heard = Arc::downgrade(&inner);
            let heard = move |message: Option<bus::Message>| {
                let Some(inner) = heard.upgrade() else { return };
                match message {
                    Some(m) => inner.mark(&m.table, (!m.all).then_some(m.owners)),
                    None => inner.mark_all(),
                }
            };
            match &bus {
                Bus::Redis(cache) => tasks.push(tokio::spawn(bus::listen_redis(
                    cache.clone(),
                    db,
                    instance,
                    heard,
                    stop,
                    bus::Echo::DEFAULT,
                ))),
                Bus::Postgres { url, channel } => tasks.push(tokio::spawn(bus::listen(
                    url.clone(),
                    channel.clone(),
                    db,
                    instance,
                    heard,
                    stop,
                    bus::Echo::DEFAULT,
                ))),
                Bus::Poll => {}
            }
        }
        tracing::info!(
            bus = bus.name(),
            "watch streams: other instances' changes by {}",
            bus.name()
        );
        (Self { inner }, tasks)
    }

    /// Owners a stream may watch (`watch.max_owners`).
    pub fn max_owners(&self) -> usize {
        self.inner.settings.max_owners
    }

    /// How often a quiet stream gets a comment line.
    pub fn keep_alive(&self) -> Duration {
        Duration::from_millis(self.inner.settings.keep_alive_ms)
    }

    /// The owners and keys asked of `namespace`, checked: 1 to
    /// `max_owners` owners of its type (duplicates dropped), 1 to
    /// `max_keys` of its keys, counted or unique.
    pub fn interest(
        &self,
        namespace: &Namespace,
        owners: &[String],
        keys: &[String],
        max_keys: usize,
    ) -> Result<Interest, Problem> {
        let max_owners = self.inner.settings.max_owners;
        if owners.is_empty() || owners.len() > max_owners {
            return Err(Problem::out_of_range(
                "watched owners",
                1,
                max_owners,
                owners.len(),
            ));
        }
        if keys.is_empty() || keys.len() > max_keys {
            return Err(Problem::out_of_range(
                "watched keys",
                1,
                max_keys,
                keys.len(),
            ));
        }
        let mut seen = HashSet::new();
        let mut rendered = Vec::with_capacity(owners.len());
        for owner in owners {
            let owner = dispatch!(&namespace.table, h => render(h, owner))?;
            if seen.insert(owner.clone()) {
                rendered.push(owner);
            }
        }
        let (mut counted, mut unique) = (Vec::new(), Vec::new());
        for key in keys {
            let key = namespace.key(key)?.to_owned();
            let list = match namespace.is_unique(&key) {
                true => &mut unique,
                false => &mut counted,
            };
            if !list.contains(&key) {
                list.push(key);
            }
        }
        Ok(Interest {
            namespace: namespace.name.clone(),
            owners: rendered,
            counted,
            unique,
            ranking: None,
        })
    }

    /// The first `limit` owners of `key`'s ranking in `namespace`,
    /// checked: a counted key, 1 to `watch.max_owners` owners.
    pub fn ranking_interest(
        &self,
        namespace: &Namespace,
        key: &str,
        limit: usize,
    ) -> Result<Interest, Problem> {
        let max = self.inner.settings.max_owners;
        if !(1..=max).contains(&limit) {
            return Err(Problem::out_of_range(
                "watched ranking limit",
                1,
                max,
                limit,
            ));
        }
        let key = namespace.counted_key(key)?.to_owned();
        Ok(Interest {
            namespace: namespace.name.clone(),
            owners: Vec::new(),
            counted: Vec::new(),
            unique: Vec::new(),
            ranking: Some(RankingInterest { key, limit }),
        })
    }

    /// Opens a stream of `interest` for `token` (`None`: an open service,
    /// bounded by the instance's streams only), sent on `link`: its first
    /// event, the snapshot, read already. 429 past the token's streams, 503
    /// past the instance's.
    pub async fn watch(
        &self,
        token: Option<&str>,
        interest: Interest,
        link: Option<Arc<dyn Link>>,
    ) -> Result<Watch, Problem> {
        let inner = &self.inner;
        let settings = &inner.settings;
        let table = inner.table_of(&interest.namespace);
        let namespace = inner
            .tables
            .get(&table)
            .ok_or_else(|| Problem::unknown_namespace(&interest.namespace))?;
        if inner.closing.load(Ordering::SeqCst) {
            return Err(Problem::overloaded(
                "watch streams: this instance is draining",
            ));
        }
        let stream = {
            let mut registry = inner.registry();
            if registry.streams.len() >= inner.max_streams {
                return Err(Problem::overloaded("watch streams"));
            }
            let token = token.unwrap_or_default();
            let held = registry.per_token.get(token).copied().unwrap_or(0);
            if !token.is_empty() && held >= settings.max_streams_per_token {
                return Err(Problem::too_many_streams(settings.max_streams_per_token));
            }
            registry.next += 1;
            let id = registry.next;
            let stream = Arc::new(Mailbox::new(id, token.to_owned(), interest, link));
            registry.streams.insert(id, stream.clone());
            if stream.interest.ranking.is_some() {
                registry.rankings.entry(table.clone()).or_default().push(id);
            } else {
                let watching = registry.watching.entry(table.clone()).or_default();
                for owner in &stream.interest.owners {
                    watching.entry(owner.clone()).or_default().push(id);
                }
            }
            *registry.per_token.entry(token.to_owned()).or_default() += 1;
            metrics::gauge!(WATCH_STREAMS).set(registry.streams.len() as f64);
            stream
        };
        // A drain that began while it registered ends it at once.
        if inner.closing.load(Ordering::SeqCst) {
            inner.end(&stream, Reason::Draining);
        }
        // Registered first: a change committed from here on marks it.
        let watch = Watch {
            hub: inner.clone(),
            stream,
            first: true,
            ended: false,
            next_at: Instant::now(),
        };
        // Refreshes may reach the stream while this read waits: they are
        // in no known order with it (`ReadSpan`).
        let interest = &watch.stream.interest;
        match &interest.ranking {
            Some(ranking) => {
                let (span, read) = inner.read_ranking(namespace, ranking).await;
                if watch.stream.offer_ranking(span, &read?) {
                    inner.read_rankings_again(&table);
                }
            }
            None => {
                let (span, values) = inner
                    .read_values(
                        namespace,
                        &interest.owners,
                        &interest.counted,
                        &interest.unique,
                    )
                    .await;
                let values = values?;
                let unsure = watch
                    .stream
                    .offer(span, values.iter().map(|(t, v)| (t, *v)));
                inner.read_again(&table, unsure);
            }
        }
        Ok(watch)
    }

    /// Ends every stream for `reason` (the instance is draining).
    pub fn close_all(&self, reason: Reason) {
        self.inner.closing.store(true, Ordering::SeqCst);
        let streams: Vec<Arc<Mailbox>> = self.inner.registry().streams.values().cloned().collect();
        for stream in &streams {
            self.inner.end(stream, reason);
        }
    }
}

/// `owner` as answers render it, if it is one of the namespace's type.
fn render<I: ServiceOwner>(
    _: &crate::domain::namespace::Handle<I>,
    owner: &str,
) -> Result<String, Problem> {
    Ok(I::from_text(owner)?.render())
}

/// One open stream: its events, in order, until it ends. Dropping it
/// unregisters it.
pub(crate) struct Watch {
    hub: Arc<Inner>,
    stream: Arc<Mailbox>,
    first: bool,
    ended: bool,
    /// No event before this (`watch.min_interval_ms` after the last).
    next_at: Instant,
}

impl Watch {
    /// The next event: the snapshot first, then changes at most one per
    /// `min_interval_ms`, then the end if the service ends the stream;
    /// `None` after that.
    pub async fn next(&mut self) -> Option<Event> {
        let interval = Duration::from_millis(self.hub.settings.min_interval_ms);
        loop {
            if let Some(reason) = self.stream.closed() {
                if self.ended {
                    return None;
                }
                self.ended = true;
                return Some(self.counted(Event::Closed(reason)));
            }
            if self.first {
                self.first = false;
                self.next_at = Instant::now() + interval;
                let values = self
                    .stream
                    .take(true)
                    .unwrap_or(Payload::Totals(Default::default()));
                return Some(self.counted(Event::Snapshot(values)));
            }
            if !self.stream.has_changes() {
                self.stream.ready().await;
                continue;
            }
            let now = Instant::now();
            if now < self.next_at {
                tokio::select! {
                    () = tokio::time::sleep_until(self.next_at.into()) => {}
                    () = self.stream.ready() => {}
                }
                continue;
            }
            if let Some(values) = self.stream.take(false) {
                self.next_at = now + interval;
                return Some(self.counted(Event::Change(values)));
            }
        }
    }

    fn counted(&self, event: Event) -> Event {
        let kind = match &event {
            Event::Snapshot(_) => "snapshot",
            Event::Change(_) => "change",
            Event::Closed(_) => "closed",
        };
        metrics::counter!(WATCH_EVENTS, "kind" => kind).increment(1);
        event
    }

    /// Counts `bytes` of an event handed to the connection: what its
    /// client is measured by (see `watch.slow_after_ms`).
    pub fn handed(&self, bytes: u64) {
        self.stream.handed(bytes);
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.hub.remove(self.stream.id);
    }
}

/// Refreshes what changed, until `stop`: one grouped read per table, and
/// every watched total every `poll_ms`.
async fn refresh(inner: Arc<Inner>, mut stop: watch::Receiver<bool>) {
    let default_poll = match inner.bus {
        Bus::Poll => 1_000,
        _ => 30_000,
    };
    let poll = Duration::from_millis(inner.settings.poll_ms.unwrap_or(default_poll));
    let mut tick = tokio::time::interval(poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Reads closer together than a quarter of the events' spacing would
    // be wasted on the database: changes meanwhile join the next read.
    let gap = Duration::from_millis(inner.settings.min_interval_ms / 4).min(REFRESH_GAP);
    loop {
        tokio::select! {
            () = inner.dirty.wake.notified() => {}
            _ = tick.tick() => inner.mark_all(),
            _ = stop.changed() => return,
        }
        tokio::select! {
            () = tokio::time::sleep(gap) => {}
            _ = stop.changed() => return,
        }
        for (table, changed) in inner.dirty.take() {
            let Some(namespace) = inner.tables.get(&table) else {
                continue;
            };
            let plan = inner.registry().plan(&table, &changed);
            if plan.owners.is_empty() {
                continue;
            }
            let (span, values) = inner
                .read_values(namespace, &plan.owners, &plan.counted, &plan.unique)
                .await;
            match values {
                Ok(values) => inner.deliver(&table, span, values),
                Err(error) => {
                    tracing::warn!(namespace = %namespace.name, %error, "reading watched totals failed; retrying");
                    inner.dirty.add(
                        &table,
                        match changed {
                            Changed::All => None,
                            Changed::Owners(owners) => Some(owners.into_iter().collect()),
                        },
                    );
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(500)) => {}
                        _ = stop.changed() => return,
                    }
                }
            }
        }
        for (table, ranking, streams) in inner.rankings_to_read() {
            let Some(namespace) = inner.tables.get(&table) else {
                continue;
            };
            let (span, read) = inner.read_ranking(namespace, &ranking).await;
            match read {
                Ok(read) => {
                    let mut unsure = false;
                    for stream in &streams {
                        unsure |= stream.offer_ranking(span, &read);
                    }
                    if unsure {
                        inner.read_rankings_again(&table);
                    }
                }
                Err(error) => {
                    tracing::warn!(namespace = %namespace.name, %error, "reading a watched ranking failed; retrying");
                    inner
                        .ranked
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(table);
                    inner.dirty.wake.notify_one();
                }
            }
        }
    }
}

/// Closes streams whose client does not keep up, and the connections of
/// streams that did not end when told to, until `stop`.
async fn sweep(inner: Arc<Inner>, mut stop: watch::Receiver<bool>) {
    let slow_after = Duration::from_millis(inner.settings.slow_after_ms);
    let every = (slow_after / 4).clamp(Duration::from_millis(25), Duration::from_secs(1));
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let now = Instant::now();
        let streams: Vec<Arc<Mailbox>> = inner.registry().streams.values().cloned().collect();
        for stream in &streams {
            if stream.closed().is_none()
                && !stream.keeps_up(now, slow_after, inner.settings.max_backlog_bytes)
            {
                inner.end(stream, Reason::SlowConsumer);
            }
        }
        let due: Vec<Arc<Mailbox>> = {
            let mut registry = inner.registry();
            let mut due = Vec::new();
            let hanging_up = std::mem::take(&mut registry.hanging_up);
            // Only a stream still registered is still being sent: one that
            // ended left its connection to its next request.
            registry.hanging_up = hanging_up
                .into_iter()
                .filter(|(stream, at)| match stream.upgrade() {
                    Some(stream) if registry.streams.contains_key(&stream.id) => {
                        if *at <= now {
                            due.push(stream);
                            return false;
                        }
                        true
                    }
                    _ => false,
                })
                .collect();
            due
        };
        for stream in due {
            stream.hang_up();
        }
    }
}

/// This instance's commits, as the library reports them.
struct Observer(Weak<Inner>);

impl Observer {
    fn tell_later(&self, table: &str, owners: Option<Vec<sea_orm::Value>>) {
        let (me, table) = (Observer(self.0.clone()), table.to_owned());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                me.tell(&table, owners.as_deref());
            });
        }
    }

    fn tell(&self, table: &str, owners: Option<&[sea_orm::Value]>) {
        let Some(inner) = self.0.upgrade() else {
            return;
        };
        // An owner that cannot be rendered: every owner of the table.
        let owners = owners.and_then(|owners| owners.iter().map(render_value).collect());
        inner.committed(table, owners);
    }
}

impl CommitObserver for Observer {
    fn committed<'a>(&'a self, table: &'a str, owners: &'a [sea_orm::Value]) -> ObserverFuture<'a> {
        self.tell(table, Some(owners));
        Box::pin(std::future::ready(()))
    }

    /// A caller's transaction that commits later: told now, and again a
    /// second later (a read now may come before the commit).
    fn uncommitted(&self, table: &str, owners: &[sea_orm::Value]) {
        self.tell(table, Some(owners));
        self.tell_later(table, Some(owners.to_vec()));
    }

    fn cleared<'a>(&'a self, table: &'a str) -> ObserverFuture<'a> {
        self.tell(table, None);
        Box::pin(std::future::ready(()))
    }

    fn uncommitted_clear(&self, table: &str) {
        self.tell(table, None);
        self.tell_later(table, None);
    }
}

/// An owner as bound in SQL, rendered as answers render it.
fn render_value(value: &sea_orm::Value) -> Option<String> {
    use sea_orm::Value as V;
    match value {
        V::BigInt(Some(n)) => Some(n.to_string()),
        V::Int(Some(n)) => Some(n.to_string()),
        V::String(Some(s)) => Some(s.clone()),
        V::Uuid(Some(u)) => Some(u.hyphenated().to_string()),
        _ => None,
    }
}
