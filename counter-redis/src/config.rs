//! Building a cache: where Redis is, the namespace, and the few timings
//! that bound what a reader or writer can wait for.

use std::time::Duration;

use redis::{
    aio::{ConnectionManager, ConnectionManagerConfig},
    cluster::ClusterClientBuilder,
};

use crate::{CountCache, link::Link};

/// Where the cache lives: one Redis server, the master Redis Sentinel names
/// (followed across failovers), or a Redis Cluster (its seed nodes; the
/// client discovers the rest).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisTarget {
    /// A standalone server, e.g. `redis://127.0.0.1:6379`.
    Standalone(String),
    /// The master named `master` by the Sentinels at `sentinels`
    /// (`redis://host:26379` each). Every key carries the master's epoch,
    /// so a promoted replica's copy of a value the old master had deleted
    /// is never read: see the cache guide's "Redis Sentinel".
    Sentinel {
        /// The Sentinels, any of which may answer.
        sentinels: Vec<String>,
        /// The master's name in their configuration (`sentinel monitor`).
        master: String,
    },
    /// A cluster's seed nodes.
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// A standalone server.
    pub fn standalone(url: impl Into<String>) -> Self {
        Self::Standalone(url.into())
    }

    /// A cluster, from any of its nodes.
    pub fn cluster<U: Into<String>>(nodes: impl IntoIterator<Item = U>) -> Self {
        Self::Cluster(nodes.into_iter().map(Into::into).collect())
    }

    /// The master `master` of the Sentinels at `sentinels`.
    pub fn sentinel<U: Into<String>>(
        sentinels: impl IntoIterator<Item = U>,
        master: impl Into<String>,
    ) -> Self {
        Self::Sentinel {
            sentinels: sentinels.into_iter().map(Into::into).collect(),
            master: master.into(),
        }
    }
}

/// Why a cache could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// The namespace is not 1 to 64 bytes of `[A-Za-z0-9_.-]`.
    #[error(
        "invalid cache namespace {0:?}: use 1 to 64 bytes of letters, digits, `_`, `.` and `-`"
    )]
    InvalidNamespace(String),
    /// A setting is out of its range.
    #[error("invalid cache setting: {0}")]
    InvalidSetting(&'static str),
    /// The URL is not a Redis URL, or a cluster's nodes could not be reached
    /// to learn its slots (a standalone server is connected lazily: one that
    /// is down does not fail here).
    #[error("cannot reach Redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// [`CountCache::flush_invalidations`](crate::CountCache::flush_invalidations)
    /// ran out of time: these owners' deletions have not reached Redis, and
    /// other processes may read their old totals until they do (they are
    /// retried in the background) or the TTL ends.
    #[error("{owners} owners' cache deletions did not reach Redis within {within:?}")]
    InvalidationsOwed {
        /// Owners still owed.
        owners: usize,
        /// How long the flush waited.
        within: Duration,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) namespace: String,
    pub(crate) ttl: Duration,
    pub(crate) lease_ttl: Duration,
    pub(crate) timeout: Duration,
    pub(crate) fill_wait: Duration,
    pub(crate) fill_wait_rounds: u32,
    pub(crate) max_concurrent_fills: usize,
    pub(crate) breaker_failures: u32,
    pub(crate) breaker_open: Duration,
    pub(crate) unscoped_delay: Duration,
}

/// Settings of a [`CountCache`]; see [`CountCache::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct CacheBuilder {
    target: RedisTarget,
    config: Config,
}

impl CacheBuilder {
    pub(crate) fn new(target: RedisTarget) -> Self {
        Self {
            target,
            config: Config {
                namespace: "app".into(),
                ttl: Duration::from_secs(3600),
                lease_ttl: Duration::from_secs(2),
                timeout: Duration::from_millis(100),
                fill_wait: Duration::from_millis(20),
                fill_wait_rounds: 2,
                max_concurrent_fills: 8,
                breaker_failures: 5,
                breaker_open: Duration::from_secs(1),
                unscoped_delay: Duration::from_secs(1),
            },
        }
    }

    /// The namespace of every key (default `app`): one per application and
    /// environment sharing a Redis, one per test.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.config.namespace = namespace.into();
        self
    }

    /// How long a filled owner stays cached (default 1 h; each fill gets
    /// ±10 % jitter so that owners filled together do not expire together).
    /// This is the bound on staleness when an invalidation cannot reach
    /// Redis.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.config.ttl = ttl;
        self
    }

    /// How long a fill's lease lives (default 2 s): a filler that dies
    /// holds its owners back from others for this long at most.
    pub fn lease_ttl(mut self, lease_ttl: Duration) -> Self {
        self.config.lease_ttl = lease_ttl;
        self
    }

    /// How long one Redis operation may take before the read falls back to
    /// the database (default 100 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = timeout;
        self
    }

    /// How long a read waits, per round, for another process's fill of
    /// the same owner before trying Redis again (default 20 ms), and how
    /// many rounds (default 2) before it reads the database itself.
    pub fn fill_wait(mut self, wait: Duration, rounds: u32) -> Self {
        self.config.fill_wait = wait;
        self.config.fill_wait_rounds = rounds;
        self
    }

    /// Database fill queries this process runs at once (default 8).
    pub fn max_concurrent_fills(mut self, fills: usize) -> Self {
        self.config.max_concurrent_fills = fills;
        self
    }

    /// Consecutive Redis failures that open the circuit breaker (default
    /// 5), and how long it stays open (default 1 s).
    pub fn breaker(mut self, failures: u32, open_for: Duration) -> Self {
        self.config.breaker_failures = failures;
        self.config.breaker_open = open_for;
        self
    }

    /// For writes in a transaction outside any scope (see
    /// [`counter_core::observe`]): how long after the write the owners are
    /// deleted again, to catch a commit the cache cannot see (default 1 s).
    pub fn unscoped_delay(mut self, delay: Duration) -> Self {
        self.config.unscoped_delay = delay;
        self
    }

    /// Connects and starts the cache's background task (retrying failed
    /// invalidations). A standalone server is connected lazily: a Redis that
    /// is down at start only makes reads fall back to the database.
    pub async fn build(self) -> Result<CountCache, CacheError> {
        let config = self.config;
        if !crate::keys::valid_namespace(&config.namespace) {
            return Err(CacheError::InvalidNamespace(config.namespace));
        }
        let within = |d: Duration, low: Duration, high: Duration| (low..=high).contains(&d);
        let (ms, secs) = (Duration::from_millis, Duration::from_secs);
        let checks = [
            (
                within(config.ttl, secs(1), secs(30 * 86_400)),
                "ttl must be 1 s to 30 days",
            ),
            (
                within(config.lease_ttl, ms(1), secs(60)),
                "lease_ttl must be 1 ms to 60 s",
            ),
            (
                within(config.timeout, ms(1), secs(60)),
                "timeout must be 1 ms to 60 s",
            ),
            (
                within(config.fill_wait, Duration::ZERO, secs(10)),
                "fill_wait must be at most 10 s",
            ),
            (
                config.fill_wait_rounds <= 100,
                "fill_wait rounds must be at most 100",
            ),
            (
                within(config.breaker_open, Duration::ZERO, secs(3_600)),
                "the breaker opens for at most 1 h",
            ),
            (
                within(config.unscoped_delay, Duration::ZERO, secs(3_600)),
                "unscoped_delay must be at most 1 h",
            ),
            (
                (1..=1_024).contains(&config.max_concurrent_fills),
                "max_concurrent_fills must be 1 to 1,024",
            ),
        ];
        if let Some((_, why)) = checks.iter().find(|(ok, _)| !ok) {
            return Err(CacheError::InvalidSetting(why));
        }
        let target = self.target.clone();
        let link = match self.target {
            RedisTarget::Standalone(url) => {
                let client = redis::Client::open(url)?;
                let manager = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(config.timeout))
                    .set_connection_timeout(Some(config.timeout.max(Duration::from_millis(250))))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_millis(500));
                Link::Standalone(ConnectionManager::new_lazy_with_config(client, manager)?)
            }
            RedisTarget::Sentinel { sentinels, master } => {
                if sentinels.is_empty() || master.is_empty() {
                    return Err(CacheError::InvalidSetting(
                        "a Sentinel target needs at least one Sentinel and the master's name",
                    ));
                }
                Link::Sentinel(std::sync::Arc::new(crate::sentinel::Followed::new(
                    sentinels,
                    &master,
                    config.timeout,
                )?))
            }
            RedisTarget::Cluster(nodes) => {
                let client = ClusterClientBuilder::new(nodes)
                    .response_timeout(config.timeout)
                    .connection_timeout(config.timeout.max(Duration::from_millis(250)))
                    .retries(2)
                    .build()?;
                Link::cluster(client.get_async_connection().await?)
            }
        };
        Ok(CountCache::start(link, target, config))
    }
}
