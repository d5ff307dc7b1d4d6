//! Cached reads: a handle that serves totals from Redis and fills what is
//! missing from one grouped database query, under leases.
//!
//! One read of many owners:
//! 1. One `MGET` (on a cluster, one pipeline of `GET`s per node). A
//!    complete value is a hit, decoded straight into the caller's type.
//! 2. Owners nobody is filling: this process takes them (single flight:
//!    a second reader of the same owner waits for the first), leases them
//!    in Redis, reads all their counts from the database in one grouped
//!    query (on the pool, never a transaction: a fresh snapshot is what the
//!    lease argument needs, see `scripts`), and returns them; the values
//!    are stored in the background if the leases still hold.
//! 3. Owners another filler holds: wait a little and look again; after a
//!    bounded number of rounds, read them from the database unfilled.
//!
//! Owners whose invalidation this process still owes, and every owner while
//! Redis fails, are read from the database.

use std::{collections::HashMap, ops::Deref, sync::Arc};

use counter_core::{
    CountMap, CounterError, Counters, KeyOf, KeySet, KeySpace, OwnerId, Result, SlottedCounter,
    UniqueKeyOf, Untyped, unique::UniqueMap,
};
use rand::Rng;
use sea_orm::DatabaseConnection;
use tokio::sync::watch;

use crate::{
    CountCache,
    cache::Shared,
    keys,
    link::Fill,
    stats::bump,
    value::{self, Entry},
};

/// A counter table's handle read through a [`CountCache`]: what
/// [`CountCache::table`] returns.
///
/// Reads (`get`, `get_many`, `get_all_keys`, and `counts`, `counts_many`,
/// `load_counts` on an entity's handle) take the pool and are served from
/// Redis. Everything else is the wrapped [`Counters`] handle's, through
/// `Deref`: `cached.add(&db, ...)` is the library's write, which deletes the
/// owner after its commit like every write to the table does. To read
/// inside a transaction, read through [`CachedCounters::counters`]: a
/// transaction's snapshot must not be cached.
#[derive(Clone)]
pub struct CachedCounters<I, S = Untyped> {
    cache: CountCache,
    counters: Counters<I, S>,
}

impl<I, S> Deref for CachedCounters<I, S> {
    type Target = Counters<I, S>;

    fn deref(&self) -> &Counters<I, S> {
        &self.counters
    }
}

impl<I: OwnerId, S: KeySpace> std::fmt::Debug for CachedCounters<I, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedCounters")
            .field("table", &self.counters.table().name())
            .field("namespace", &self.cache.namespace())
            .finish()
    }
}

/// An owner and the key of its hash.
type Keyed<I> = (I, Vec<u8>);

/// An owner another read of this process is filling, with a receiver that
/// wakes when that fill ends.
type Followed<I> = (I, Vec<u8>, watch::Receiver<()>);

/// What a fill did with the owners it led.
struct Filled<I> {
    /// Owners read from the database (stored in Redis or not).
    read: CountMap<I>,
    /// Owners whose lease someone else holds: to wait for.
    not_leased: Vec<Keyed<I>>,
    /// Owners Redis failed for: to read uncached.
    failed: Vec<I>,
}

/// The type a read returns per owner, and how to build it: from a cached
/// value count by count (no map in between: a hit of a thousand owners
/// allocates nothing per count for an entity's `Counts`), or from totals
/// by key name read from the database.
struct Shape<T> {
    set: fn(&mut T, &str, i64),
    from_map: fn(HashMap<String, i64>) -> T,
    /// Makes every key asked for present (0 where absent).
    zero_fill: fn(&mut T, &[String]),
}

impl<T> Shape<T> {
    /// What `S` returns: its `Counts`, or totals by key name.
    fn of<S: KeySpace<Totals = T>>() -> Self {
        Shape {
            set: S::set_total,
            from_map: S::totals,
            zero_fill: S::zero_fill,
        }
    }
}

/// Leases or fills per Redis operation, each under the timeout.
const PIPELINE_CHUNK: usize = 1_000;

/// Totals by key name.
fn by_name() -> Shape<HashMap<String, i64>> {
    Shape::of::<Untyped>()
}

/// Owners a read did not find cached: nobody is filling them, or someone
/// holds their lease.
struct Read<I> {
    misses: Vec<Keyed<I>>,
    waiting: Vec<Keyed<I>>,
}

impl<I> Default for Read<I> {
    fn default() -> Self {
        Self {
            misses: Vec::new(),
            waiting: Vec::new(),
        }
    }
}

/// A key in the read's shared buffer, or one of its own.
enum KeyRef<'k> {
    Borrowed(&'k [u8]),
    Owned(Vec<u8>),
}

impl KeyRef<'_> {
    fn into_owned(self) -> Vec<u8> {
        match self {
            KeyRef::Borrowed(key) => key.to_vec(),
            KeyRef::Owned(key) => key,
        }
    }
}

/// Which counts a read wants.
#[derive(Debug, Clone)]
enum Want {
    Keys(Vec<String>),
    All,
}

impl<I: OwnerId, S: KeySpace> CachedCounters<I, S> {
    pub(crate) fn new(cache: CountCache, counters: Counters<I, S>) -> Self {
        Self { cache, counters }
    }

    /// The uncached handle: for reads inside a transaction, and to pass
    /// where a `Counters` is expected.
    pub fn counters(&self) -> &Counters<I, S> {
        &self.counters
    }

    /// The cache this handle reads through.
    pub fn cache(&self) -> &CountCache {
        &self.cache
    }

    /// The total of one counter; 0 if it was never written.
    pub async fn get<K: KeyOf<S>>(&self, db: &DatabaseConnection, owner: I, key: K) -> Result<i64> {
        let key = key.as_key_str().to_owned();
        self.check_counted(&key, "get")?;
        let owners = std::slice::from_ref(&owner);
        let mut totals = self
            .totals(db, owners, Want::Keys(vec![key.clone()]), by_name())
            .await?;
        Ok(totals
            .remove(&owner)
            .and_then(|t| t.get(&key).copied())
            .unwrap_or(0))
    }

    /// The totals of `keys` for each of `owners`, as
    /// [`Counters::get_many`]: every owner and key present, zero-filled.
    pub async fn get_many<K: KeyOf<S>>(
        &self,
        db: &DatabaseConnection,
        owners: &[I],
        keys: &[K],
    ) -> Result<HashMap<I, S::Totals>> {
        let mut names = Vec::with_capacity(keys.len());
        for key in keys {
            self.check_counted(key.as_key_str(), "get_many")?;
            names.push(key.as_key_str().to_owned());
        }
        names.sort();
        names.dedup();
        let shape = Shape::of::<S>();
        self.totals(db, owners, Want::Keys(names), shape).await
    }

    /// Every counter that exists for each of `owners`, as
    /// [`Counters::get_all_keys`] (keys chosen at run time, `reaction:heart`).
    pub async fn get_all_keys(&self, db: &DatabaseConnection, owners: &[I]) -> Result<CountMap<I>> {
        let mut totals = self.totals(db, owners, Want::All, by_name()).await?;
        // The cached value holds the unique keys' estimates too.
        let table = self.counters.table();
        if !table.unique_keys().is_empty() {
            for by_key in totals.values_mut() {
                by_key.retain(|key, _| !table.is_unique(key));
            }
        }
        Ok(totals)
    }

    /// The estimated distinct members of a unique key, as
    /// [`Counters::unique`], served from the owner's cached value: a fill
    /// stores the estimates of the owner's unique keys beside its totals,
    /// and every merge into its sketches deletes it after its commit, like
    /// any write.
    pub async fn unique<K: UniqueKeyOf<S>>(
        &self,
        db: &DatabaseConnection,
        owner: I,
        key: K,
    ) -> Result<u64> {
        let name = key.as_key_str().to_owned();
        let mut all = self
            .unique_many(db, std::slice::from_ref(&owner), &[key])
            .await?;
        let key = name.as_str();
        Ok(all
            .remove(&owner)
            .and_then(|by_key| by_key.get(key).copied())
            .unwrap_or(0))
    }

    /// The estimates of `keys` for each of `owners`, as
    /// [`Counters::unique_many`] (zero-filled), served from Redis.
    pub async fn unique_many<K: UniqueKeyOf<S>>(
        &self,
        db: &DatabaseConnection,
        owners: &[I],
        keys: &[K],
    ) -> Result<UniqueMap<I>> {
        let mut names = Vec::with_capacity(keys.len());
        for key in keys {
            let key = key.as_key_str();
            self.check_kind(key, true, "unique_many")?;
            names.push(key.to_owned());
        }
        names.sort();
        names.dedup();
        let totals = self
            .totals(db, owners, Want::Keys(names), by_name())
            .await?;
        Ok(totals
            .into_iter()
            .map(|(owner, by_key)| {
                let estimates = by_key
                    .into_iter()
                    .map(|(key, estimate)| (key, u64::try_from(estimate).unwrap_or(0)))
                    .collect();
                (owner, estimates)
            })
            .collect())
    }

    /// `Ok` if `key` is valid and counts deltas.
    fn check_counted(&self, key: &str, operation: &'static str) -> Result<()> {
        self.check_kind(key, false, operation)
    }

    /// `Ok` if `key` is valid and is a unique key (`unique`) or counts
    /// deltas, as `operation` needs: the same errors as the handle's.
    fn check_kind(&self, key: &str, unique: bool, operation: &'static str) -> Result<()> {
        counter_core::validate_key(key)?;
        let table = self.counters.table();
        if table.is_unique(key) == unique {
            return Ok(());
        }
        Err(CounterError::WrongKeyKind {
            table: table.name().to_owned(),
            key: key.to_owned(),
            unique: !unique,
            operation,
        })
    }

    /// Every count of `owners` as a fill stores it: the totals of every
    /// key, and the estimates of the unique keys.
    pub(crate) async fn owner_counts(
        &self,
        db: &DatabaseConnection,
        owners: &[I],
    ) -> Result<CountMap<I>> {
        let mut counts = self.counters.get_all_keys(db, owners).await?;
        self.add_estimates(
            db,
            owners,
            &self.counters.table().unique_keys(),
            &mut counts,
        )
        .await?;
        Ok(counts)
    }

    /// Adds the estimates of the unique keys `keys` of `owners` to `counts`.
    async fn add_estimates(
        &self,
        db: &DatabaseConnection,
        owners: &[I],
        keys: &[&str],
        counts: &mut CountMap<I>,
    ) -> Result<()> {
        if keys.is_empty() || owners.is_empty() {
            return Ok(());
        }
        let estimates = self
            .counters
            .untyped()
            .unique_many(db, owners, keys)
            .await?;
        for (owner, by_key) in estimates {
            let totals = counts.entry(owner).or_default();
            for (key, estimate) in by_key {
                totals.insert(key, i64::try_from(estimate).unwrap_or(i64::MAX));
            }
        }
        Ok(())
    }

    /// Deletes `owners`' cached totals: after raw SQL on the counter table
    /// (the library's own writes do it themselves). Never fails: an owner
    /// Redis cannot delete now is retried in the background, and this
    /// process reads it from the database until then.
    pub async fn invalidate(&self, owners: &[I]) {
        let table = self.counters.table().name();
        let keys = owners
            .iter()
            .map(|o| self.shared().key(table, &o.clone().into()))
            .collect();
        self.shared().invalidate(keys).await;
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.cache.shared
    }

    /// Totals for each requested owner (zero-filled for the keys of
    /// `want`), in the caller's type (`shape`).
    async fn totals<T: Default>(
        &self,
        db: &DatabaseConnection,
        owners: &[I],
        want: Want,
        shape: Shape<T>,
    ) -> Result<HashMap<I, T>> {
        let shared = self.shared();
        let table = self.counters.table().name();
        for owner in owners {
            owner.check()?;
        }
        let mut unique = owners.to_vec();
        unique.sort_unstable();
        unique.dedup();
        let names = match &want {
            Want::Keys(names) => Some(names.as_slice()),
            Want::All => None,
        };
        // Every key in one buffer: a hit allocates no key of its own.
        let mut buffer = Vec::with_capacity(unique.len() * 40);
        let mut spans = Vec::with_capacity(unique.len());
        for owner in &unique {
            let start = buffer.len();
            keys::write_owner_key(
                &shared.config.namespace,
                table,
                &owner.clone().into(),
                &mut buffer,
            );
            spans.push(start..buffer.len());
        }
        let mut hits: HashMap<I, T> = HashMap::with_capacity(unique.len());
        let mut read: Read<I> = Read::default();
        let mut uncached: Vec<I> = Vec::new();
        let mut first: Vec<(I, &[u8])> = Vec::with_capacity(unique.len());
        {
            let owed = shared.owed();
            for (owner, span) in unique.into_iter().zip(spans) {
                let key = &buffer[span];
                if owed.contains_key(key) {
                    uncached.push(owner);
                } else {
                    first.push((owner, key));
                }
            }
        }
        bump(&shared.meter.uncached_reads, uncached.len());
        if !first.is_empty() {
            let keys: Vec<&[u8]> = first.iter().map(|(_, k)| *k).collect();
            match shared.redis(shared.link.read(&keys)).await {
                Some(values) => {
                    let first = first.into_iter().map(|(o, k)| (o, KeyRef::Borrowed(k)));
                    self.sort(first, values, names, &shape, &mut hits, &mut read)
                        .await;
                    bump(&shared.meter.hits, hits.len());
                    bump(&shared.meter.misses, read.misses.len() + read.waiting.len());
                }
                None => {
                    bump(&shared.meter.db_fallbacks, first.len());
                    uncached.extend(first.into_iter().map(|(o, _)| o));
                }
            }
        }
        let mut served: CountMap<I> = HashMap::new();
        let rounds = shared.config.fill_wait_rounds;
        let mut round = 0;
        while !read.misses.is_empty() || !read.waiting.is_empty() {
            // Single flight: lead the owners nobody here is filling, follow
            // the others.
            let (lead, followed) = self.join_flights(std::mem::take(&mut read.misses));
            let mut pending = Vec::with_capacity(followed.len() + read.waiting.len());
            let mut wakes = Vec::with_capacity(followed.len());
            for (owner, key, wake) in followed {
                pending.push((owner, key));
                wakes.push(wake);
            }
            let mut waiting = std::mem::take(&mut read.waiting);
            if !lead.is_empty() {
                let filled = self.fill(db, lead).await?;
                served.extend(filled.read);
                waiting.extend(filled.not_leased);
                bump(&shared.meter.db_fallbacks, filled.failed.len());
                uncached.extend(filled.failed);
            }
            pending.extend(waiting);
            round += 1;
            if pending.is_empty() {
                break;
            }
            if round > rounds {
                bump(&shared.meter.uncached_reads, pending.len());
                uncached.extend(pending.into_iter().map(|(o, _)| o));
                break;
            }
            bump(&shared.meter.lease_waits, pending.len());
            // Every followed flight ends within one lease TTL in all; another
            // process's lease is polled.
            let lease_ttl = shared.config.lease_ttl;
            let in_process = tokio::time::timeout(lease_ttl, async {
                for mut wake in wakes {
                    let _ = wake.changed().await;
                }
            });
            let _ = tokio::join!(in_process, tokio::time::sleep(shared.config.fill_wait));
            let keys: Vec<&[u8]> = pending.iter().map(|(_, k)| k.as_slice()).collect();
            let again = shared.redis(shared.link.read(&keys)).await;
            drop(keys);
            match again {
                Some(values) => {
                    let pending = pending.into_iter().map(|(o, k)| (o, KeyRef::Owned(k)));
                    self.sort(pending, values, names, &shape, &mut hits, &mut read)
                        .await;
                }
                None => {
                    bump(&shared.meter.db_fallbacks, pending.len());
                    uncached.extend(pending.into_iter().map(|(o, _)| o));
                }
            }
        }
        if !uncached.is_empty() {
            let from_db = match &want {
                Want::Keys(names) => {
                    let table = self.counters.table();
                    let (unique, counted): (Vec<&str>, Vec<&str>) = names
                        .iter()
                        .map(String::as_str)
                        .partition(|k| table.is_unique(k));
                    let mut from_db = self
                        .counters
                        .untyped()
                        .get_many(db, &uncached, &counted)
                        .await?;
                    self.add_estimates(db, &uncached, &unique, &mut from_db)
                        .await?;
                    from_db
                }
                Want::All => self.owner_counts(db, &uncached).await?,
            };
            served.extend(from_db);
        }
        if let Want::Keys(names) = &want {
            // Fills read all of an owner's keys: keep those asked for.
            for totals in served.values_mut() {
                totals.retain(|k, _| names.binary_search(k).is_ok());
                for name in names {
                    totals.entry(name.clone()).or_insert(0);
                }
            }
        }
        hits.extend(served.into_iter().map(|(o, t)| (o, (shape.from_map)(t))));
        Ok(hits)
    }

    /// Sorts what a read of `owners` found: hits into `hits` (zero-filled
    /// for `names`), the rest into `read` (an invalid value is deleted
    /// first, so that a fill can lease its key).
    async fn sort<'k, T: Default>(
        &self,
        owners: impl Iterator<Item = (I, KeyRef<'k>)>,
        values: Vec<Option<Vec<u8>>>,
        names: Option<&[String]>,
        shape: &Shape<T>,
        hits: &mut HashMap<I, T>,
        read: &mut Read<I>,
    ) {
        let mut invalid = Vec::new();
        for ((owner, key), value) in owners.zip(values) {
            match value::decode(value.as_deref(), names, shape.set) {
                Entry::Complete(mut counts) => {
                    // A hit holds the keys asked for that exist.
                    if let Some(names) = names {
                        (shape.zero_fill)(&mut counts, names);
                    }
                    hits.insert(owner, counts);
                }
                Entry::Leased => read.waiting.push((owner, key.into_owned())),
                Entry::Missing => read.misses.push((owner, key.into_owned())),
                Entry::Invalid => {
                    let key = key.into_owned();
                    invalid.push(key.clone());
                    read.misses.push((owner, key));
                }
            }
        }
        // Not ours (an older layout, a stray write): each would refuse
        // every lease until it expires. Deleted together.
        if !invalid.is_empty() {
            self.shared().invalidate(invalid).await;
        }
    }

    /// Splits `misses` into the owners this read leads the fill of (now
    /// registered as in flight) and those another read of this process is
    /// filling, with a receiver that wakes when that fill ends.
    fn join_flights(&self, misses: Vec<Keyed<I>>) -> (Vec<Keyed<I>>, Vec<Followed<I>>) {
        let mut flights = self
            .shared()
            .flights
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut lead = Vec::new();
        let mut follow = Vec::new();
        for (owner, key) in misses {
            match flights.get(&key) {
                Some(flight) => {
                    let wake = flight.subscribe();
                    follow.push((owner, key, wake));
                }
                None => {
                    flights.insert(key.clone(), watch::channel(()).0);
                    lead.push((owner, key));
                }
            }
        }
        (lead, follow)
    }

    /// Leases and reads the `lead` owners, and stores them in the
    /// background: the caller has its totals one Redis round trip sooner,
    /// and this process's other readers of those owners wait for the store
    /// (their flight ends with it).
    async fn fill(&self, db: &DatabaseConnection, lead: Vec<Keyed<I>>) -> Result<Filled<I>> {
        let shared = self.shared();
        let flights = EndFlights::new(
            self.cache.shared.clone(),
            lead.iter().map(|(_, k)| k.clone()).collect(),
        );
        let token = format!("{:032x}", rand::rng().random::<u128>());
        let keys: Vec<Vec<u8>> = lead.iter().map(|(_, k)| k.clone()).collect();
        // At most 60 s (checked at build).
        let lease_ms = u64::try_from(shared.config.lease_ttl.as_millis()).unwrap_or(60_000);
        // A chunk per Redis operation, each under the timeout; owners past
        // a failed chunk are read uncached.
        let mut taken = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(PIPELINE_CHUNK) {
            match shared
                .redis(shared.link.lease(chunk, &token, lease_ms))
                .await
            {
                Some(flags) => taken.extend(flags),
                None => break,
            }
        }
        let mut leased = Vec::new();
        let mut not_leased = Vec::new();
        let mut failed = Vec::new();
        let mut flags = taken.into_iter();
        for owner_key in lead {
            match flags.next() {
                Some(true) => leased.push(owner_key),
                Some(false) => not_leased.push(owner_key),
                None => failed.push(owner_key.0),
            }
        }
        if leased.is_empty() {
            return Ok(Filled {
                read: HashMap::new(),
                not_leased,
                failed,
            });
        }
        pause::at(&shared.config.namespace, pause::Point::AfterLease).await;
        let owners: Vec<I> = leased.iter().map(|(o, _)| o.clone()).collect();
        let from_db = {
            let _permit = shared.fills.acquire().await;
            self.owner_counts(db, &owners).await?
        };
        let ttl = shared.config.ttl.as_secs().max(1);
        let mut fills = Vec::with_capacity(leased.len());
        for (owner, key) in &leased {
            let counts = from_db.get(owner).cloned().unwrap_or_default();
            // ±10 %: owners filled together do not expire together (`ttl`
            // is at most 30 days: no overflow).
            let jitter = rand::rng().random_range(0..=ttl / 5);
            let ttl = (ttl - ttl / 10 + jitter).max(1);
            // A key written by raw SQL that the layout cannot hold: left
            // uncached (its lease expires).
            if let Some(value) = value::encode(&counts) {
                fills.push(Fill {
                    key: key.clone(),
                    ttl_secs: ttl,
                    value,
                });
            }
        }
        let store = async move {
            let shared = &flights.shared;
            pause::at(&shared.config.namespace, pause::Point::BeforeStore).await;
            let mut fills = fills;
            while !fills.is_empty() {
                let rest = fills.split_off(fills.len().min(PIPELINE_CHUNK));
                let attempted = fills.len();
                if let Some(landed) = shared.redis(shared.link.fill(fills, &token)).await {
                    let stored = landed.iter().filter(|l| **l).count();
                    bump(&shared.meter.fills, stored);
                    bump(&shared.meter.fill_cas_lost, attempted - stored);
                    if stored < attempted {
                        tracing::debug!(
                            lost = attempted - stored,
                            "counter cache: fills lost their lease to a write; the database values were returned, not stored"
                        );
                    }
                }
                fills = rest;
            }
            // The flights end here, after the store.
            drop(flights);
        };
        // In the reader's span, like its own log lines.
        tokio::spawn(tracing::Instrument::instrument(
            store,
            tracing::Span::current(),
        ));
        Ok(Filled {
            read: from_db,
            not_leased,
            failed,
        })
    }
}

/// Ends this process's flights of some owners however the fill ends (an
/// error, a dropped read, the store done): their followers wake and look
/// again. Counted in [`CacheStats::fills_in_flight`](crate::CacheStats::fills_in_flight) while it lives.
struct EndFlights {
    shared: Arc<Shared>,
    keys: Vec<Vec<u8>>,
}

impl EndFlights {
    fn new(shared: Arc<Shared>, keys: Vec<Vec<u8>>) -> Self {
        shared
            .meter
            .fills_in_flight
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self { shared, keys }
    }
}

impl Drop for EndFlights {
    fn drop(&mut self) {
        let mut flights = self
            .shared
            .flights
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for key in &self.keys {
            flights.remove(key);
        }
        drop(flights);
        (self.shared.meter.fills_in_flight).fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl<E: SlottedCounter> CachedCounters<E::OwnerId, E> {
    /// Every counter of one owner, as [`Counters::counts`].
    pub async fn counts(&self, db: &DatabaseConnection, owner: E::OwnerId) -> Result<E::Counts> {
        let mut all = self.counts_many(db, std::slice::from_ref(&owner)).await?;
        Ok(all.remove(&owner).unwrap_or_default())
    }

    /// Every counter of many owners, as [`Counters::counts_many`]: one
    /// Redis round trip when all are cached.
    pub async fn counts_many(
        &self,
        db: &DatabaseConnection,
        owners: &[E::OwnerId],
    ) -> Result<HashMap<E::OwnerId, E::Counts>> {
        self.get_many(db, owners, E::Key::ALL).await
    }

    /// Pairs each model with its counts, as [`Counters::load_counts`].
    pub async fn load_counts<It>(
        &self,
        db: &DatabaseConnection,
        models: It,
    ) -> Result<Vec<(E::Model, E::Counts)>>
    where
        It: IntoIterator<Item = E::Model>,
    {
        let models: Vec<E::Model> = models.into_iter().collect();
        let owners: Vec<E::OwnerId> = models.iter().map(E::owner_id).collect();
        let counts = self.counts_many(db, &owners).await?;
        Ok(models
            .into_iter()
            .zip(owners)
            .map(|(model, owner)| (model, counts.get(&owner).cloned().unwrap_or_default()))
            .collect())
    }
}

/// Pauses inside a fill, for tests that force the races a lease exists
/// for (a write committing in the middle of a fill). Cost one atomic load
/// when unused. Not API.
#[doc(hidden)]
pub mod pause {
    use std::sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    };

    use tokio::sync::oneshot;

    /// Where a fill stops.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Point {
        /// Leases taken, the database not read yet.
        AfterLease,
        /// The database read, nothing stored yet.
        BeforeStore,
    }

    type Hook = (String, Point, oneshot::Sender<()>, oneshot::Receiver<()>);

    static ARMED: AtomicBool = AtomicBool::new(false);
    static HOOKS: Mutex<Vec<Hook>> = Mutex::new(Vec::new());

    /// Makes the next fill of a cache of `namespace` in this process that
    /// reaches `point` stop there: `reached` fires when it does, and it goes
    /// on when `resume` fires or is dropped.
    pub fn next_fill(
        namespace: &str,
        point: Point,
        reached: oneshot::Sender<()>,
        resume: oneshot::Receiver<()>,
    ) {
        let hook = (namespace.to_owned(), point, reached, resume);
        HOOKS.lock().unwrap_or_else(|e| e.into_inner()).push(hook);
        ARMED.store(true, Ordering::Release);
    }

    pub(crate) async fn at(namespace: &str, point: Point) {
        if !ARMED.load(Ordering::Acquire) {
            return;
        }
        let hook = {
            let mut hooks = HOOKS.lock().unwrap_or_else(|e| e.into_inner());
            let found = hooks
                .iter()
                .position(|(ns, wanted, _, _)| ns == namespace && *wanted == point);
            found.map(|i| hooks.swap_remove(i))
        };
        if let Some((_, _, reached, resume)) = hook {
            let _ = reached.send(());
            let _ = resume.await;
        }
    }
}
