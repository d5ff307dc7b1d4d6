//! The configuration: one TOML file, every value of which an environment
//! variable or a flag can override, checked whole before anything starts.
//!
//! ```toml
//! [server]
//! listen = "0.0.0.0:8080"
//!
//! [database]
//! url = "postgres://counter@db/counts"
//!
//! [[tokens]]
//! name = "web"
//! secret_env = "COUNTER_TOKEN_WEB"   # or `secret = "..."`
//! scopes = ["read", "write"]
//! namespaces = ["posts"]
//!
//! [namespaces.posts]
//! table = "post_counters"
//! owner = "integer"                   # integer | uuid | string
//! keys.likes = {}
//! keys.views = { slots = "adaptive", window = "day" }
//! key_patterns = ["reaction:*"]       # an open key set: a new key is a new row
//! ```
//!
//! Overrides, applied to the file's values in this order: environment
//! variables `COUNTER_SERVICE__<PATH>` (path segments joined by `__`, e.g.
//! `COUNTER_SERVICE__DATABASE__URL`, `COUNTER_SERVICE__TOKENS__0__SECRET`),
//! then `--set path=value` flags (`--set server.listen=0.0.0.0:9000`). A
//! value is read as TOML (`32`, `true`, `["read"]`) and as a string when it
//! is not TOML.
//!
//! Every file error names its line; every value error names its path.

use std::{
    collections::BTreeMap,
    fmt,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};

/// The prefix of the environment variables that override configuration values.
pub const ENV_PREFIX: &str = "COUNTER_SERVICE__";

/// The configuration the service runs with when it is given none: the demo
/// namespace on an embedded SQLite file, open (no tokens), on 127.0.0.1.
pub const DEMO: &str = include_str!("../counter-service.example.toml");

/// Why a configuration was refused: what is wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the configuration file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML, or a value has the wrong type or an
    /// unknown name: the message names the line and column.
    #[error("{origin}: {message}")]
    Parse {
        /// The file, or the override, the error is in.
        origin: String,
        /// toml's message, with the line, the column and the text around it.
        message: String,
    },
    /// A value is well formed but refused: the path names it.
    #[error("configuration value `{path}`: {reason}")]
    Invalid {
        /// Where, e.g. `namespaces.posts.keys.views.slots`.
        path: String,
        /// Why.
        reason: String,
    },
    /// Several values refused at once ([`Config::check`]), one per line.
    #[error("{} configuration errors:\n  {}", .0.len(), lines(.0))]
    Several(Vec<ConfigError>),
}

fn lines(errors: &[ConfigError]) -> String {
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    lines.join("\n  ")
}

impl ConfigError {
    pub(crate) fn invalid(path: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid {
            path: path.into(),
            reason: reason.into(),
        }
    }

    /// `errors` as one result: `Ok` for none, the error itself for one,
    /// [`ConfigError::Several`] for more (nested lists flattened, so that
    /// `check-config` prints one line per refusal).
    pub(crate) fn all(errors: Vec<ConfigError>) -> Result<(), ConfigError> {
        let mut flat = Vec::with_capacity(errors.len());
        for error in errors {
            match error {
                ConfigError::Several(inner) => flat.extend(inner),
                one => flat.push(one),
            }
        }
        match flat.len() {
            0 => Ok(()),
            1 => Err(flat.remove(0)),
            _ => Err(ConfigError::Several(flat)),
        }
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The HTTP listener and its bounds.
    #[serde(default)]
    pub server: ServerConfig,
    /// The database holding the counters.
    #[serde(default)]
    pub database: DatabaseConfig,
    /// An optional Redis cache in front of batch gets (`counter-redis`).
    pub cache: Option<CacheConfig>,
    /// An optional broker whose messages the service counts (`counter-mq`).
    pub broker: Option<BrokerConfig>,
    /// Idempotency-Key handling.
    #[serde(default)]
    pub idempotency: IdempotencyConfig,
    /// `counts:watch`: streams of totals pushed as they change.
    #[serde(default)]
    pub watch: WatchConfig,
    /// The region this instance counts in, when several databases count
    /// the same counters (guide: "Regions").
    pub region: Option<RegionConfig>,
    /// Bearer tokens; none at all only with `server.open = true`.
    #[serde(default)]
    pub tokens: Vec<TokenConfig>,
    /// The namespaces, by name.
    #[serde(default)]
    pub namespaces: BTreeMap<String, NamespaceConfig>,
    /// A file of `KEY=value` lines (`#` comments, optional quotes) read as
    /// if they were in the environment, the process's own environment
    /// winning: the variables tokens' `secret_env` name, and
    /// `COUNTER_SERVICE__*` overrides. Every command that reads this
    /// configuration reads it, so `check-config` and `migrate` run by hand
    /// as the service's user see the secrets `serve` sees under its unit
    /// (the Debian package names `/etc/default/counter-service`, the file
    /// its unit's `EnvironmentFile` reads, readable by the service's group).
    /// A top-level key: in the file, before any `[section]`.
    pub env_file: Option<PathBuf>,
}

/// `[server]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// The address to listen on (default `127.0.0.1:8080`).
    pub listen: SocketAddr,
    /// Serve without tokens: every caller may do everything. Only when set
    /// explicitly; such a service should listen on a loopback address.
    pub open: bool,
    /// A request that takes longer is answered 503 (default 10,000 ms).
    pub request_timeout_ms: u64,
    /// The largest request body (default 1 MiB): larger is 413.
    pub max_body_bytes: usize,
    /// The most items of one `counters:batchAdd` (default 1,000).
    pub max_batch_items: usize,
    /// The most owners of one `counts:batchGet` (default 1,000).
    pub max_batch_owners: usize,
    /// The most keys of one `counts:batchGet` (default 32).
    pub max_batch_keys: usize,
    /// Log lines as `text` (default) or `json`.
    pub log_format: LogFormat,
    /// How long a shutdown waits for requests in flight (default 10,000 ms).
    pub shutdown_grace_ms: u64,
    /// How long a stopping instance drains before it stops taking
    /// connections (default 0): `/readyz` answers 503 `draining`, every
    /// request is still served, and each answer closes its connection, so a
    /// load balancer that checks `/readyz` moves its traffic away before a
    /// connection is refused or an idle one closed under a request. Set it
    /// to the balancer's time to mark an instance down (HAProxy's
    /// `inter` × `fall`) and a little more; 0 when nothing balances.
    pub drain_ms: u64,
    /// Add groups of a namespace committed at once, 1 to 64 (default 2),
    /// and as many observe groups. Each takes every add (observe) waiting
    /// and commits it as one transaction, so
    /// fewer workers make larger groups and fewer transactions: on a
    /// database the service shares a machine with, 1 to 2 measured best
    /// (see the performance guide); more overlap the round trips of a
    /// distant database.
    pub add_workers: usize,
    /// A request whose head has not fully arrived this long after its
    /// first byte (or after the connection opened) is dropped with its
    /// connection (default 10,000 ms; nginx's `client_header_timeout`).
    pub header_read_timeout_ms: u64,
    /// A connection with no request in flight that has sent nothing for
    /// this long is closed (default 60,000 ms; nginx's `keepalive_timeout`).
    pub idle_timeout_ms: u64,
    /// Open connections at most (default 10,000). The service raises its
    /// open-files soft limit to the hard one at start and keeps this below
    /// it (less a reserve for the database, the cache and the broker); at
    /// the cap, the connection that has sent the least of those with no
    /// request in flight is closed to make room, so a new caller is served
    /// whatever idle or partial connections others hold.
    pub max_connections: usize,
    /// API requests (`/v1/...`) served at once (default 512). One more is
    /// answered 503 `overloaded` with `Retry-After` at once, before its
    /// token or body is read (axum's `load_shed` over a concurrency
    /// limit); the probes and `/metrics` are never refused. With
    /// `max_body_bytes`, this bounds the memory of bodies being read.
    pub max_concurrent_requests: usize,
    /// Add items a namespace admits at once, waiting or being committed
    /// (default 20,000), and as many observations. An add or observe that
    /// would pass it is answered 503
    /// `overloaded` with `Retry-After`, nothing applied: the queue is
    /// bounded by work (items), not by requests. At least
    /// `max_batch_items`.
    pub max_queued_items: usize,
    /// How long an admitted add or observe may be expected to wait for
    /// its answer (default 250 ms, 10 ms to 60 s): the items ahead of it
    /// and its own over the rate the queue's workers are measured to drain
    /// them. A request that would wait longer is answered 503 `overloaded`
    /// at once, nothing applied, with `Retry-After` the time the queue
    /// needs to make room; an idle queue admits any request.
    pub max_queue_wait_ms: u64,
    /// Serve the browser console at `/ui` (default true): static files
    /// embedded in the binary, which call the API with the token typed
    /// into the page. `false`: `/ui` is a 404 like any unknown route.
    pub console: bool,
    /// Origins whose pages may call the API from a browser (CORS), each
    /// `scheme://host[:port]`, or `["*"]` for any (default none: a page of
    /// another origin cannot call the service). Credentials are never
    /// allowed: a token travels in `Authorization`, which the page sets.
    pub cors_origins: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8080),
            open: false,
            request_timeout_ms: 10_000,
            max_body_bytes: 1 << 20,
            max_batch_items: 1_000,
            max_batch_owners: 1_000,
            max_batch_keys: 32,
            log_format: LogFormat::Text,
            shutdown_grace_ms: 10_000,
            drain_ms: 0,
            add_workers: 2,
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            max_connections: 10_000,
            max_concurrent_requests: 512,
            max_queued_items: 20_000,
            max_queue_wait_ms: 250,
            console: true,
            cors_origins: Vec::new(),
        }
    }
}

impl ServerConfig {
    /// `Ok` if the values a type cannot bound are in range; otherwise
    /// every value out of range, not only the first (an operator fixing a
    /// file should not meet its mistakes one run at a time).
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        let bounded = [
            ("server.add_workers", self.add_workers as u64, 1, 64),
            (
                "server.request_timeout_ms",
                self.request_timeout_ms,
                10,
                3_600_000,
            ),
            (
                "server.max_body_bytes",
                self.max_body_bytes as u64,
                1_024,
                1 << 30,
            ),
            (
                "server.max_batch_items",
                self.max_batch_items as u64,
                1,
                100_000,
            ),
            (
                "server.max_batch_owners",
                self.max_batch_owners as u64,
                1,
                100_000,
            ),
            (
                "server.max_batch_keys",
                self.max_batch_keys as u64,
                1,
                1_000,
            ),
            (
                "server.shutdown_grace_ms",
                self.shutdown_grace_ms,
                0,
                3_600_000,
            ),
            ("server.drain_ms", self.drain_ms, 0, 600_000),
            (
                "server.header_read_timeout_ms",
                self.header_read_timeout_ms,
                100,
                600_000,
            ),
            (
                "server.idle_timeout_ms",
                self.idle_timeout_ms,
                100,
                86_400_000,
            ),
            (
                "server.max_connections",
                self.max_connections as u64,
                16,
                1_000_000,
            ),
            (
                "server.max_concurrent_requests",
                self.max_concurrent_requests as u64,
                1,
                100_000,
            ),
            (
                "server.max_queue_wait_ms",
                self.max_queue_wait_ms,
                10,
                60_000,
            ),
            (
                "server.max_queued_items",
                self.max_queued_items as u64,
                self.max_batch_items as u64,
                10_000_000,
            ),
        ];
        let mut errors: Vec<ConfigError> = bounded
            .into_iter()
            .filter(|&(_, value, min, max)| !(min..=max).contains(&value))
            .map(|(path, value, min, max)| {
                ConfigError::invalid(path, format!("{value} is not {min} to {max}"))
            })
            .collect();
        errors.extend(self.check_cors());
        ConfigError::all(errors)
    }

    /// `cors_origins`: `*` alone, or origins without a path.
    fn check_cors(&self) -> Vec<ConfigError> {
        let origins = &self.cors_origins;
        if origins.iter().any(|o| o == "*") {
            return match origins.len() {
                1 => Vec::new(),
                _ => vec![ConfigError::invalid(
                    "server.cors_origins",
                    "`*` allows every origin: list it alone",
                )],
            };
        }
        origins
            .iter()
            .filter(|origin| {
                let rest = origin
                    .strip_prefix("https://")
                    .or_else(|| origin.strip_prefix("http://"));
                !rest.is_some_and(|host| {
                    !host.is_empty()
                        && host
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
                })
            })
            .map(|origin| {
                ConfigError::invalid(
                    "server.cors_origins",
                    format!(
                        "`{origin}` is not an origin: `https://host` or `http://host:port`, no path"
                    ),
                )
            })
            .collect()
    }

    /// `request_timeout_ms` as a duration.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `[database]`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// A SeaORM URL: `sqlite://file.db?mode=rwc`, `postgres://...`,
    /// `mysql://...` (default: the demo's SQLite file).
    pub url: String,
    /// PostgreSQL only: the schema to work in (the connection's search path).
    pub schema: Option<String>,
    /// Pool size (default 32; SQLite uses one connection, its one writer).
    pub max_connections: u32,
    /// What stands between the service and PostgreSQL: `none` (default: a
    /// server, or a pooler in session mode) or `transaction` (PgBouncer's
    /// `pool_mode = transaction`: no prepared statement kept between
    /// transactions, each of the service's statements in a transaction of
    /// its own; see `counter_core::pooling`). `schema` needs a session, so
    /// it is refused with `transaction`: set the role's `search_path`.
    pub pooler: Pooler,
    /// PostgreSQL standbys for reads that accept a bounded lag (uncached
    /// `counts:batchGet`, `top`, `series`, `uniques:batchGet`), each one
    /// server's own address (not a load balancer's: a standby is trusted by
    /// what that server has replayed). Reads go there only when asked
    /// (`Counter-Read-From: replica`, or a namespace's `replica_reads`),
    /// and only to a standby within `replica_max_lag_ms`; every other read
    /// takes `url`. A node of the list that is not a standby (Patroni's
    /// leader) is passed over, so all of a cluster's nodes may be listed.
    /// `pooler` is `url`'s: a replica behind PgBouncer in transaction
    /// pooling has `?statement-cache-capacity=0` in its URL.
    pub replica_urls: Vec<String>,
    /// The most a replica read may lag (default 1,000 ms, 100 ms to 1 h):
    /// it sees every add acknowledged longer ago than this.
    pub replica_max_lag_ms: u64,
}

/// `[region]`: this instance's region of several, each counting into its
/// own database and its own share of every counter's slots, the databases
/// joined by PostgreSQL's logical replication or MariaDB's replication
/// (`counter_core::Region`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionConfig {
    /// The region's name: 1 to 64 ASCII letters, digits, `_` or `-`; the
    /// same in every instance of the region, different in each region.
    pub name: String,
    /// Its index among the regions, 0 to `count - 1`: the slots `s` with
    /// `s % count == index` are its own.
    pub index: u16,
    /// How many regions there are (at most 64); the same everywhere.
    pub count: u16,
    /// The PostgreSQL publication of this region's rows, created or
    /// updated by `migrate` (with the heartbeat table); unset, `migrate`
    /// creates the heartbeat table only and the publication is yours.
    /// PostgreSQL only: MariaDB's servers replicate by their own options.
    #[serde(default)]
    pub publication: Option<String>,
    /// How often this instance records the region's heartbeat and reads
    /// the others' (default 1,000 ms, 100 ms to 60 s).
    #[serde(default = "default_beat_ms")]
    pub beat_ms: u64,
    /// Another region whose heartbeat is older than this is reported as
    /// not replicating (`/readyz`'s `region`; default 10,000 ms). Counting
    /// goes on: a region cut off keeps accepting writes.
    #[serde(default = "default_stale_after_ms")]
    pub stale_after_ms: u64,
}

fn default_beat_ms() -> u64 {
    1_000
}

fn default_stale_after_ms() -> u64 {
    10_000
}

impl RegionConfig {
    /// The region, checked.
    pub fn region(&self) -> Result<counter_core::Region, ConfigError> {
        counter_core::Region::new(self.name.clone(), self.index, self.count)
            .map_err(|e| ConfigError::invalid("region", e.to_string()))
    }

    fn check(&self, database_url: &str) -> Vec<ConfigError> {
        let mut errors: Vec<ConfigError> = self.region().err().into_iter().collect();
        let postgres = database_url.starts_with("postgres");
        if !postgres && !database_url.starts_with("mysql") {
            errors.push(ConfigError::invalid(
                "region",
                "regions replicate with PostgreSQL logical replication or MariaDB's: \
                 database.url is neither",
            ));
        }
        if self.publication.is_some() && !postgres {
            errors.push(ConfigError::invalid(
                "region.publication",
                "a publication is PostgreSQL's: MariaDB's servers replicate by their own \
                 options (the guide's \"Regions\")",
            ));
        }
        if !(100..=60_000).contains(&self.beat_ms) {
            errors.push(ConfigError::invalid(
                "region.beat_ms",
                format!("{} is not 100 to 60000", self.beat_ms),
            ));
        }
        if self.stale_after_ms < 2 * self.beat_ms || self.stale_after_ms > 3_600_000 {
            errors.push(ConfigError::invalid(
                "region.stale_after_ms",
                format!(
                    "{} is not at least twice beat_ms ({}) and at most an hour",
                    self.stale_after_ms, self.beat_ms
                ),
            ));
        }
        if let Some(publication) = &self.publication
            && counter_core::validate_table_name(publication).is_err()
        {
            errors.push(ConfigError::invalid(
                "region.publication",
                "a publication name is 1 to 63 ASCII letters, digits or `_`, not starting with a digit",
            ));
        }
        errors
    }
}

/// `database.pooler`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooler {
    /// Direct, or a pooler that keeps sessions.
    #[default]
    None,
    /// A pooler that hands each transaction any server connection.
    Transaction,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: "sqlite://counter-service.db?mode=rwc".into(),
            schema: None,
            max_connections: 32,
            pooler: Pooler::None,
            replica_urls: Vec::new(),
            replica_max_lag_ms: 1_000,
        }
    }
}

/// `[cache]`: batch gets through `counter-redis`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    /// A standalone server, `redis://host:port`.
    #[serde(default)]
    pub redis_url: Option<String>,
    /// A Redis Cluster: some of its nodes (`redis://host:port` each), from
    /// which the rest are learned. Either this or `redis_url`.
    #[serde(default)]
    pub cluster_urls: Vec<String>,
    /// Redis under Sentinel: the Sentinels (`redis://host:26379` each),
    /// with `sentinel_master`. The master they name is followed across
    /// failovers, and no value a failed master had deleted is read from
    /// the replica promoted in its place (the cache guide's "Redis
    /// Sentinel").
    #[serde(default)]
    pub sentinel_urls: Vec<String>,
    /// The master's name in the Sentinels' configuration.
    #[serde(default)]
    pub sentinel_master: Option<String>,
    /// The key prefix of this service's entries (default `counter-service`).
    #[serde(default = "default_cache_namespace")]
    pub namespace: String,
    /// How long an entry lives without a write (default 3,600 s).
    #[serde(default = "default_cache_ttl")]
    pub ttl_seconds: u64,
}

impl CacheConfig {
    /// Where the cache is: `redis_url`, `sentinel_urls` (with
    /// `sentinel_master`) or `cluster_urls`, exactly one.
    pub fn target(&self) -> Result<counter_redis::RedisTarget, ConfigError> {
        const CHOICES: &str = "`redis_url` (a standalone server), `sentinel_urls` with \
                               `sentinel_master` (Redis under Sentinel) or `cluster_urls` (a Redis \
                               Cluster's nodes)";
        let chosen = usize::from(self.redis_url.is_some())
            + usize::from(!self.sentinel_urls.is_empty())
            + usize::from(!self.cluster_urls.is_empty());
        if chosen != 1 {
            let how = if chosen == 0 {
                "set one of"
            } else {
                "set only one of"
            };
            return Err(ConfigError::invalid("cache", format!("{how} {CHOICES}")));
        }
        if let Some(url) = &self.redis_url {
            return Ok(counter_redis::RedisTarget::standalone(url.clone()));
        }
        if !self.cluster_urls.is_empty() {
            return Ok(counter_redis::RedisTarget::cluster(
                self.cluster_urls.clone(),
            ));
        }
        match self.sentinel_master.as_deref() {
            Some(master) if !master.is_empty() => Ok(counter_redis::RedisTarget::sentinel(
                self.sentinel_urls.clone(),
                master,
            )),
            _ => Err(ConfigError::invalid(
                "cache",
                "`sentinel_urls` needs `sentinel_master`: the master's name in the Sentinels' configuration",
            )),
        }
    }
}

fn default_cache_namespace() -> String {
    "counter-service".into()
}

fn default_cache_ttl() -> u64 {
    3_600
}

/// `[broker]`: count what business services publish, with `counter-mq`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "lowercase", tag = "kind")]
pub enum BrokerConfig {
    /// NATS JetStream.
    Nats {
        /// `nats://host:port`.
        url: String,
        /// The stream (default `COUNTERS`, created if missing).
        #[serde(default = "default_stream")]
        stream: String,
        /// The durable consumer's name (default `counter-service`).
        #[serde(default = "default_consumer")]
        consumer: String,
        /// The subjects the stream captures when the service creates it
        /// (default `["counters.>"]`; publishers send to
        /// `<prefix>.<table>`, `JetStreamPublisher::subject_prefix`). A
        /// stream that exists already is used as it is.
        #[serde(default = "default_subjects")]
        subjects: Vec<String>,
    },
    /// RabbitMQ.
    Amqp {
        /// `amqp://user:pass@host:port/vhost`.
        url: String,
        /// The queue (default `counters`, declared if missing).
        #[serde(default = "default_queue")]
        queue: String,
    },
}

fn default_stream() -> String {
    "COUNTERS".into()
}

fn default_subjects() -> Vec<String> {
    vec!["counters.>".into()]
}

fn default_consumer() -> String {
    "counter-service".into()
}

fn default_queue() -> String {
    "counters".into()
}

/// `[idempotency]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdempotencyConfig {
    /// How long a key is remembered, in hours (default 24, at least 1): a
    /// retry within it gets the first answer.
    pub retention_hours: u64,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        Self {
            retention_hours: 24,
        }
    }
}

/// `[watch]`: the bounds and rhythm of `counts:watch` streams.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WatchConfig {
    /// Streams open at once on this instance (default 10,000); more is
    /// 503 `overloaded`.
    pub max_streams: usize,
    /// Streams one token may hold open at once on this instance (default
    /// 100); more is 429. An open service (no tokens) has only
    /// `max_streams`.
    pub max_streams_per_token: usize,
    /// Owners one stream may watch (default 100).
    pub max_owners: usize,
    /// The shortest time between two events of one stream (default 100
    /// ms): changes meanwhile are sent together, as their latest totals.
    pub min_interval_ms: u64,
    /// How other instances' changes arrive: `auto` (default: Redis
    /// pub/sub with `[cache]`, else PostgreSQL `LISTEN`/`NOTIFY` unless
    /// `database.pooler = "transaction"`, else polling) or `poll` (every
    /// watched total read again every `poll_ms`).
    pub bus: BusSetting,
    /// How often every watched total is read again (default 1,000 ms when
    /// polling, and 30,000 ms as a safety net behind a bus: a message the
    /// bus lost, a write made outside the service).
    pub poll_ms: Option<u64>,
    /// A stream whose client has not taken what it was sent for this long
    /// is closed (default 10,000 ms)...
    pub slow_after_ms: u64,
    /// ...as is one with more than this many bytes sent to it and not
    /// taken (default 262,144).
    pub max_backlog_bytes: u64,
    /// A comment line sent on a quiet stream this often, so proxies keep
    /// it open (default 15,000 ms).
    pub keep_alive_ms: u64,
}

/// `watch.bus`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BusSetting {
    /// The best the configuration offers.
    #[default]
    Auto,
    /// No bus: every watched total read again every `poll_ms`.
    Poll,
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self {
            max_streams: 10_000,
            max_streams_per_token: 100,
            max_owners: 100,
            min_interval_ms: 100,
            bus: BusSetting::Auto,
            poll_ms: None,
            slow_after_ms: 10_000,
            max_backlog_bytes: 256 * 1024,
            keep_alive_ms: 15_000,
        }
    }
}

impl WatchConfig {
    fn check(&self) -> Vec<ConfigError> {
        let bounded = [
            ("watch.max_streams", self.max_streams as u64, 1, 1_000_000),
            (
                "watch.max_streams_per_token",
                self.max_streams_per_token as u64,
                1,
                1_000_000,
            ),
            ("watch.max_owners", self.max_owners as u64, 1, 1_000),
            ("watch.min_interval_ms", self.min_interval_ms, 10, 60_000),
            (
                "watch.poll_ms",
                self.poll_ms.unwrap_or(1_000),
                100,
                3_600_000,
            ),
            ("watch.slow_after_ms", self.slow_after_ms, 100, 600_000),
            (
                "watch.max_backlog_bytes",
                self.max_backlog_bytes,
                4_096,
                1 << 30,
            ),
            ("watch.keep_alive_ms", self.keep_alive_ms, 1_000, 600_000),
        ];
        bounded
            .into_iter()
            .filter(|(_, value, min, max)| !(*min..=*max).contains(value))
            .map(|(name, value, min, max)| {
                ConfigError::invalid(name, format!("{value} is not {min} to {max}"))
            })
            .collect()
    }
}

/// `[[tokens]]`: one bearer token.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// The name logs and metrics use (the secret never appears anywhere).
    pub name: String,
    /// The secret itself, at least 16 characters...
    pub secret: Option<String>,
    /// ...or the environment variable that holds it.
    pub secret_env: Option<String>,
    /// What it may do: `read`, `write`, `admin`.
    pub scopes: Vec<Scope>,
    /// The namespaces it may touch; `["*"]` (the default) for all.
    #[serde(default = "all_namespaces")]
    pub namespaces: Vec<String>,
    /// Requests per second allowed on average (default: unlimited).
    pub rate_per_second: Option<f64>,
    /// Requests allowed at once above the rate (default: one second's worth).
    pub burst: Option<f64>,
}

fn all_namespaces() -> Vec<String> {
    vec!["*".into()]
}

/// Secrets stay out of `Debug`, hence out of logs and panics.
impl fmt::Debug for TokenConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenConfig")
            .field("name", &self.name)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("secret_env", &self.secret_env)
            .field("scopes", &self.scopes)
            .field("namespaces", &self.namespaces)
            .field("rate_per_second", &self.rate_per_second)
            .field("burst", &self.burst)
            .finish()
    }
}

/// What a token may do.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Deserialize,
    Serialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Batch gets, rankings, series, key lists.
    Read,
    /// Adds.
    Write,
    /// Check-and-fix and compaction on demand.
    Admin,
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scope::Read => "read",
            Scope::Write => "write",
            Scope::Admin => "admin",
        })
    }
}

/// `[namespaces.<name>]`: one companion table and its keys.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceConfig {
    /// The companion table `(owner_id, count_key, slot, value)`.
    pub table: String,
    /// The owner id type.
    pub owner: OwnerType,
    /// Slots of keys that set none (default 16): a number or `"adaptive"`.
    #[serde(default)]
    pub slots: Option<SlotsSetting>,
    /// The declared keys.
    #[serde(default)]
    pub keys: BTreeMap<String, KeyConfig>,
    /// Open key sets: `prefix*` admits every valid key starting with
    /// `prefix` (a new key is a new row: no DDL, no restart).
    #[serde(default)]
    pub key_patterns: Vec<String>,
    /// Serve this namespace's lag-tolerant reads from `database.replica_urls`
    /// unless a request says `Counter-Read-From: primary` (default false:
    /// only requests that say `replica` go there).
    #[serde(default)]
    pub replica_reads: bool,
}

/// The owner id type of a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OwnerType {
    /// A 64-bit signed integer; JSON numbers or decimal strings.
    Integer,
    /// A UUID, as a string.
    Uuid,
    /// A string of at most 255 characters.
    String,
}

/// A key's slots: a count or `"adaptive"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum SlotsSetting {
    /// A fixed count, 1 to 1,024.
    Fixed(u16),
    /// `"adaptive"`: one row until writes contend.
    Named(SlotsName),
}

/// The named slot settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotsName {
    /// `SlotPolicy::adaptive(1..=256)`.
    Adaptive,
}

/// `keys.<name>`: one declared key.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// Its slots (default: the namespace's).
    pub slots: Option<SlotsSetting>,
    /// Also counted per `hour` or per `day`.
    pub window: Option<WindowSetting>,
    /// Check and fix against a truth in the business database.
    pub check: Option<CheckConfig>,
    /// Counts distinct members (`counters:observe`, `uniques:batchGet`)
    /// instead of deltas: see the guide's unique counts.
    #[serde(default)]
    pub unique: bool,
}

/// A key's time buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WindowSetting {
    /// Per hour.
    Hour,
    /// Per day.
    Day,
}

/// `keys.<name>.check`: the truth a key is checked and fixed against, the
/// rows of a business table counted by owner (`SELECT via, COUNT(*) FROM
/// table GROUP BY via`), in the counters' database.
///
/// Names, not SQL text: the library builds the query, quoting the names and
/// grouping string owners in the companion table's exact collation (a
/// hand-written `GROUP BY` in MySQL's default collation merges `abc` and
/// `ABC`, and the recount would move counts between them).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckConfig {
    /// The business table, e.g. `comments`.
    pub table: String,
    /// Its column holding the owner id, e.g. `post_id`.
    pub via: String,
    /// Add up this integer column instead of counting rows.
    pub sum: Option<String>,
    /// Count only rows whose boolean column is true (`"!column"`: false).
    pub when: Option<String>,
    /// Run every this many seconds (default: only on demand, by
    /// `POST /v1/{ns}/admin:check`).
    pub every_seconds: Option<u64>,
}

/// `url` with its password, if any, replaced by `***`: URLs are shown
/// (`check-config`, `Debug`) without the secrets they may hold.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let authority_end = url[scheme_end..]
        .find('/')
        .map_or(url.len(), |i| scheme_end + i);
    let Some(at) = url[scheme_end..authority_end]
        .rfind('@')
        .map(|i| scheme_end + i)
    else {
        return url.to_owned();
    };
    match url[scheme_end..at].find(':') {
        Some(colon) => format!("{}:***{}", &url[..scheme_end + colon], &url[at..]),
        None => url.to_owned(),
    }
}

impl DatabaseConfig {
    /// The replica settings' refusals.
    fn check_replicas(&self) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        if self.replica_urls.is_empty() {
            return errors;
        }
        if !self.url.starts_with("postgres") {
            errors.push(ConfigError::invalid(
                "database.replica_urls",
                "replica reads are PostgreSQL's (a standby is trusted by its replayed WAL position)",
            ));
        }
        for (i, url) in self.replica_urls.iter().enumerate() {
            if !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
                errors.push(ConfigError::invalid(
                    format!("database.replica_urls[{i}]"),
                    format!("`{}` is not a postgres:// URL", redact_url(url)),
                ));
            }
        }
        if !(100..=3_600_000).contains(&self.replica_max_lag_ms) {
            errors.push(ConfigError::invalid(
                "database.replica_max_lag_ms",
                format!("{} is not 100 to 3600000", self.replica_max_lag_ms),
            ));
        }
        errors
    }
}

impl fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseConfig")
            .field("url", &redact_url(&self.url))
            .field("schema", &self.schema)
            .field("max_connections", &self.max_connections)
            .field("pooler", &self.pooler)
            .field(
                "replica_urls",
                &self
                    .replica_urls
                    .iter()
                    .map(|u| redact_url(u))
                    .collect::<Vec<_>>(),
            )
            .field("replica_max_lag_ms", &self.replica_max_lag_ms)
            .finish()
    }
}

impl fmt::Debug for CacheConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheConfig")
            .field("redis_url", &self.redis_url.as_deref().map(redact_url))
            .field(
                "cluster_urls",
                &self
                    .cluster_urls
                    .iter()
                    .map(|u| redact_url(u))
                    .collect::<Vec<_>>(),
            )
            .field(
                "sentinel_urls",
                &self
                    .sentinel_urls
                    .iter()
                    .map(|u| redact_url(u))
                    .collect::<Vec<_>>(),
            )
            .field("sentinel_master", &self.sentinel_master)
            .field("namespace", &self.namespace)
            .field("ttl_seconds", &self.ttl_seconds)
            .finish()
    }
}

impl fmt::Debug for BrokerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BrokerConfig::Nats {
                url,
                stream,
                consumer,
                subjects,
            } => f
                .debug_struct("Nats")
                .field("url", &redact_url(url))
                .field("stream", stream)
                .field("consumer", consumer)
                .field("subjects", subjects)
                .finish(),
            BrokerConfig::Amqp { url, queue } => f
                .debug_struct("Amqp")
                .field("url", &redact_url(url))
                .field("queue", queue)
                .finish(),
        }
    }
}

impl Config {
    /// The rules of the file alone beyond `[server]`'s, every refusal: the
    /// database pool and its replicas, the idempotency retention, the
    /// cache's and the broker's settings. [`Config::check`] adds the
    /// namespaces' and the tokens' (`preflight`).
    pub(crate) fn check_own(&self) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        if !(1..=10_000).contains(&self.database.max_connections) {
            errors.push(ConfigError::invalid(
                "database.max_connections",
                format!("{} is not 1 to 10000", self.database.max_connections),
            ));
        }
        if self.database.pooler == Pooler::Transaction {
            if !self.database.url.starts_with("postgres") {
                errors.push(ConfigError::invalid(
                    "database.pooler",
                    "`transaction` is for a pooler in front of PostgreSQL (PgBouncer)",
                ));
            }
            if self.database.schema.is_some() {
                errors.push(ConfigError::invalid(
                    "database.schema",
                    "a transaction pooler keeps no session's search_path: \
                     set the role's (ALTER ROLE ... SET search_path) and leave this out",
                ));
            }
        }
        errors.extend(self.database.check_replicas());
        errors.extend(self.watch.check());
        if let Some(region) = &self.region {
            errors.extend(region.check(&self.database.url));
        }
        if self.database.replica_urls.is_empty() {
            for (name, namespace) in &self.namespaces {
                if namespace.replica_reads {
                    errors.push(ConfigError::invalid(
                        format!("namespaces.{name}.replica_reads"),
                        "there is no replica to read from: list them in database.replica_urls",
                    ));
                }
            }
        }
        if !(1..=24 * 365).contains(&self.idempotency.retention_hours) {
            errors.push(ConfigError::invalid(
                "idempotency.retention_hours",
                format!("{} is not 1 to 8760", self.idempotency.retention_hours),
            ));
        }
        if let Some(cache) = &self.cache {
            errors.extend(cache.target().err());
            if cache.ttl_seconds == 0 {
                errors.push(ConfigError::invalid("cache.ttl_seconds", "at least 1"));
            }
        }
        if let Some(BrokerConfig::Nats { subjects, .. }) = &self.broker
            && subjects.is_empty()
        {
            errors.push(ConfigError::invalid(
                "broker.subjects",
                "name at least one subject (default `counters.>`)",
            ));
        }
        errors
    }

    /// The configuration in `path` with the process's overrides applied:
    /// `COUNTER_SERVICE__*` variables, then `overrides` (`path=value`).
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_text(
            &text,
            &path.display().to_string(),
            std::env::vars(),
            overrides,
        )
    }

    /// The demo configuration ([`DEMO`]) with the process's overrides.
    pub fn demo(overrides: &[String]) -> Result<Self, ConfigError> {
        Self::from_text(
            DEMO,
            "the built-in demo configuration",
            std::env::vars(),
            overrides,
        )
    }

    /// A configuration from TOML text, `origin` naming it in errors, with
    /// `env`'s `COUNTER_SERVICE__*` variables and then `overrides` applied.
    /// With `env_file`, that file's variables are read too (`env`'s win),
    /// and a token's `secret_env` found only there becomes its secret.
    pub fn from_text(
        text: &str,
        origin: &str,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: &[String],
    ) -> Result<Self, ConfigError> {
        let env: BTreeMap<String, String> = env.into_iter().collect();
        let config = Self::from_text_once(text, origin, env.clone(), overrides)?;
        let Some(path) = config.env_file.clone() else {
            return Ok(config);
        };
        let from_file = read_env_file(&path)?;
        let mut merged = from_file.clone();
        merged.extend(env.clone());
        let mut config = Self::from_text_once(text, origin, merged, overrides)?;
        config.env_file = Some(path);
        // The service reads `secret_env` from its process's environment
        // when it starts; a variable only the file holds is given to the
        // token as its secret here (still redacted in `Debug`).
        for token in &mut config.tokens {
            if let (None, Some(var)) = (&token.secret, &token.secret_env)
                && !env.contains_key(var)
                && let Some(value) = from_file.get(var)
            {
                token.secret = Some(value.clone());
                token.secret_env = None;
            }
        }
        Ok(config)
    }

    fn from_text_once(
        text: &str,
        origin: &str,
        env: BTreeMap<String, String>,
        overrides: &[String],
    ) -> Result<Self, ConfigError> {
        // Parsed typed first, so that a mistake in the file itself (a typo
        // in a name, a string for a number) is reported with its line.
        toml::from_str::<Config>(text).map_err(|e| ConfigError::Parse {
            origin: origin.to_owned(),
            message: e.to_string(),
        })?;
        let mut table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Parse {
            origin: origin.to_owned(),
            message: e.to_string(),
        })?;
        let mut from_env: Vec<(String, String)> = env
            .into_iter()
            .filter_map(|(name, value)| {
                let path = name.strip_prefix(ENV_PREFIX)?;
                Some((
                    path.split("__")
                        .map(str::to_lowercase)
                        .collect::<Vec<_>>()
                        .join("."),
                    value,
                ))
            })
            .collect();
        from_env.sort();
        for (path, value) in &from_env {
            set_path(
                &mut table,
                path,
                value,
                &format!("{ENV_PREFIX}{}", path.to_uppercase().replace('.', "__")),
            )?;
        }
        for assignment in overrides {
            let (path, value) = assignment.split_once('=').ok_or_else(|| {
                ConfigError::invalid(
                    assignment,
                    "an override is `path=value`, e.g. `server.listen=0.0.0.0:8080`",
                )
            })?;
            set_path(&mut table, path.trim(), value, &format!("--set {path}"))?;
        }
        let config: Config =
            toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| ConfigError::Parse {
                    origin: format!("{origin} with its overrides"),
                    message: e.to_string(),
                })?;
        Ok(config)
    }
}

/// The variables of an environment file, as systemd's `EnvironmentFile`
/// reads the simple form: `KEY=value` lines, blank lines and lines starting
/// with `#` or `;` skipped, a value in matching single or double quotes
/// unquoted. A line of another shape is refused with its number, not
/// skipped: a secret that silently went missing would surface later as a
/// 401 nobody can explain.
fn read_env_file(path: &Path) -> Result<BTreeMap<String, String>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mut vars = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let parsed = line.split_once('=').and_then(|(name, value)| {
            let name = name.trim();
            let valid = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            valid.then(|| (name.to_owned(), unquote(value.trim()).to_owned()))
        });
        let Some((name, value)) = parsed else {
            return Err(ConfigError::Parse {
                origin: format!("{}, line {}", path.display(), i + 1),
                message: "not a `NAME=value` line".into(),
            });
        };
        vars.insert(name, value);
    }
    Ok(vars)
}

/// `value` without one pair of matching surrounding quotes.
fn unquote(value: &str) -> &str {
    for quote in ['"', '\''] {
        if let Some(inner) = value
            .strip_prefix(quote)
            .and_then(|v| v.strip_suffix(quote))
        {
            return inner;
        }
    }
    value
}

/// Sets `path` (`a.b.0.c`) in `table` to `value`, read as TOML when it is.
/// Missing tables on the way are created; array items must exist.
fn set_path(
    table: &mut toml::Table,
    path: &str,
    value: &str,
    origin: &str,
) -> Result<(), ConfigError> {
    let segments: Vec<&str> = path.split('.').map(str::trim).collect();
    if segments.iter().any(|s| s.is_empty()) {
        return Err(ConfigError::invalid(
            origin,
            format!("`{path}` is not a configuration path"),
        ));
    }
    let mut root = toml::Value::Table(std::mem::take(table));
    let result = assign(&mut root, &segments, parse_value(value), path, origin);
    if let toml::Value::Table(t) = root {
        *table = t;
    }
    result
}

/// Walks `segments` from `node`, creating missing tables, and sets the last.
fn assign(
    node: &mut toml::Value,
    segments: &[&str],
    value: toml::Value,
    path: &str,
    origin: &str,
) -> Result<(), ConfigError> {
    let Some((first, rest)) = segments.split_first() else {
        *node = value;
        return Ok(());
    };
    let next = step(node, first, path, origin)?;
    assign(next, rest, value, path, origin)
}

fn step<'a>(
    value: &'a mut toml::Value,
    segment: &str,
    path: &str,
    origin: &str,
) -> Result<&'a mut toml::Value, ConfigError> {
    match value {
        toml::Value::Table(t) => Ok(t
            .entry(segment.to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))),
        toml::Value::Array(items) => segment
            .parse::<usize>()
            .ok()
            .and_then(|i| items.get_mut(i))
            .ok_or_else(|| {
                ConfigError::invalid(origin, format!("`{path}`: no array item `{segment}`"))
            }),
        _ => Err(ConfigError::invalid(
            origin,
            format!("`{path}`: `{segment}`'s parent is not a table"),
        )),
    }
}

/// `value` as TOML (`32`, `true`, `["a"]`, `"quoted"`), else as a string.
fn parse_value(value: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn check_lists_every_refusal_at_once() {
        let text = format!(
            "[server]\nmax_connections = 0\nmax_batch_items = 0\n[idempotency]\nretention_hours = 0\n\
             [database]\nurl = \"sqlite::memory:\"\n{}\n[[tokens]]\nname = \"t\"\nsecret = \"short\"\nscopes = [\"read\"]\n",
            "[namespaces.posts]\ntable = \"post_counters\"\nowner = \"integer\"\n[namespaces.posts.keys.likes]"
        );
        let config = Config::from_text(&text, "svc.toml", env(&[]), &[]).unwrap();
        let error = config.check().unwrap_err();
        let ConfigError::Several(errors) = &error else {
            panic!("one error only: {error}");
        };
        let message = error.to_string();
        // Two of the server's bounds: a section's refusals are all listed
        // too, not its first.
        for path in [
            "server.max_connections",
            "server.max_batch_items",
            "tokens.0.secret",
            "idempotency.retention_hours",
        ] {
            assert!(message.contains(path), "{path} missing from: {message}");
        }
        assert_eq!(errors.len(), 4, "{message}");
        Config::from_text(DEMO, "demo", env(&[]), &[])
            .unwrap()
            .check()
            .unwrap();
    }

    #[test]
    fn an_env_file_is_read_as_systemd_reads_one() {
        let dir = std::env::temp_dir().join(format!("counter-env-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("secrets");
        std::fs::write(
            &file,
            "# comment\n; comment\n\nA=plain\nB = \"double quoted\"\nC='single'\nD=\n",
        )
        .unwrap();
        let vars = read_env_file(&file).unwrap();
        let expected: BTreeMap<String, String> = [
            ("A", "plain"),
            ("B", "double quoted"),
            ("C", "single"),
            ("D", ""),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(vars, expected);
        for bad in ["export A=1\n", "=1\n", "1A=1\n", "no equals sign\n"] {
            std::fs::write(&file, bad).unwrap();
            let error = read_env_file(&file).unwrap_err().to_string();
            assert!(error.contains("line 1"), "{bad:?}: {error}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_demo_configuration_is_valid() {
        let config = Config::from_text(DEMO, "demo", env(&[]), &[]).unwrap();
        assert!(config.server.open);
        assert!(config.server.listen.ip().is_loopback());
        assert_eq!(config.namespaces["demo"].keys.len(), 3);
        assert!(config.namespaces["demo"].keys["viewers"].unique);
    }

    #[test]
    fn a_bad_file_names_its_line() {
        let text = "[server]\nlisten = \"127.0.0.1:8080\"\nopen = \"yes\"\n";
        let error = Config::from_text(text, "svc.toml", env(&[]), &[])
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("svc.toml: "), "{error}");
        assert!(error.contains("line 3"), "{error}");
        let typo = "[server]\nlisten_on = \"127.0.0.1:8080\"\n";
        let error = Config::from_text(typo, "svc.toml", env(&[]), &[])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("line 2") && error.contains("listen_on"),
            "{error}"
        );
        let broken = "[namespaces.posts\ntable = 1\n";
        let error = Config::from_text(broken, "svc.toml", env(&[]), &[])
            .unwrap_err()
            .to_string();
        assert!(error.contains("line 1"), "{error}");
    }

    #[test]
    fn environment_then_flags_override_the_file() {
        let vars = env(&[
            ("COUNTER_SERVICE__SERVER__LISTEN", "0.0.0.0:9000"),
            ("COUNTER_SERVICE__DATABASE__MAX_CONNECTIONS", "8"),
            (
                "COUNTER_SERVICE__NAMESPACES__DEMO__KEYS__LIKES__SLOTS",
                "64",
            ),
            ("UNRELATED", "x"),
        ]);
        let config = Config::from_text(DEMO, "demo", vars.clone(), &[]).unwrap();
        assert_eq!(config.server.listen.to_string(), "0.0.0.0:9000");
        assert_eq!(config.database.max_connections, 8);
        assert_eq!(
            config.namespaces["demo"].keys["likes"].slots,
            Some(SlotsSetting::Fixed(64))
        );
        let flags = [
            "server.listen=127.0.0.1:7000".to_owned(),
            "database.url=postgres://db/counts".to_owned(),
        ];
        let config = Config::from_text(DEMO, "demo", vars, &flags).unwrap();
        assert_eq!(config.server.listen.to_string(), "127.0.0.1:7000");
        assert_eq!(config.database.url, "postgres://db/counts");
    }

    #[test]
    fn a_bad_override_names_itself() {
        let error = Config::from_text(
            DEMO,
            "demo",
            env(&[("COUNTER_SERVICE__SERVER__OPEN", "maybe")]),
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("open"), "{error}");
        let error = Config::from_text(DEMO, "demo", env(&[]), &["server.listen".to_owned()])
            .unwrap_err()
            .to_string();
        assert!(error.contains("path=value"), "{error}");
        let error = Config::from_text(DEMO, "demo", env(&[]), &["server.listen.port=1".to_owned()])
            .unwrap_err()
            .to_string();
        assert!(error.contains("server.listen.port"), "{error}");
    }

    #[test]
    fn passwords_in_urls_stay_out_of_debug() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/counts"),
            "postgres://app:***@db:5432/counts"
        );
        assert_eq!(
            redact_url("amqp://guest:guest@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(
            redact_url("mysql://root@127.0.0.1/x"),
            "mysql://root@127.0.0.1/x"
        );
        assert_eq!(
            redact_url("sqlite://file.db?mode=rwc"),
            "sqlite://file.db?mode=rwc"
        );
        let text = "[database]\nurl = \"postgres://app:s3cret@db/counts\"\n[cache]\nredis_url = \"redis://:pw@cache:6379\"\n";
        let shown = format!("{:?}", Config::from_text(text, "t", env(&[]), &[]).unwrap());
        assert!(
            !shown.contains("s3cret") && !shown.contains(":pw@"),
            "{shown}"
        );
    }

    #[test]
    fn a_cache_is_a_server_or_a_cluster_not_both() {
        let cache = |section: &str| {
            let text = format!("[database]\nurl = \"sqlite::memory:\"\n[cache]\n{section}\n");
            let config = Config::from_text(&text, "t", env(&[]), &[]).unwrap();
            config.cache.unwrap().target().map_err(|e| e.to_string())
        };
        assert!(matches!(
            cache("redis_url = \"redis://a:6379\""),
            Ok(counter_redis::RedisTarget::Standalone(_))
        ));
        let nodes = cache("cluster_urls = [\"redis://a:7000\", \"redis://:pw@b:7001\"]");
        assert!(matches!(nodes, Ok(counter_redis::RedisTarget::Cluster(ref n)) if n.len() == 2));
        let both = cache("redis_url = \"redis://a\"\ncluster_urls = [\"redis://b\"]").unwrap_err();
        assert!(
            both.contains("only one of") && both.contains("`cache`"),
            "{both}"
        );
        let sentinel = cache(
            "sentinel_urls = [\"redis://s1:26379\", \"redis://s2:26379\"]\nsentinel_master = \"cache\"",
        );
        assert!(
            matches!(sentinel, Ok(counter_redis::RedisTarget::Sentinel { ref sentinels, ref master }) if sentinels.len() == 2 && master == "cache"),
            "{sentinel:?}"
        );
        let nameless = cache("sentinel_urls = [\"redis://s1:26379\"]").unwrap_err();
        assert!(nameless.contains("sentinel_master"), "{nameless}");
        let neither = cache("ttl_seconds = 5").unwrap_err();
        assert!(
            neither.contains("cluster_urls") && neither.contains("sentinel_urls"),
            "{neither}"
        );
        let text = "[database]\nurl = \"sqlite::memory:\"\n[cache]\ncluster_urls = [\"redis://:pw@b:7001\"]\n";
        let shown = format!("{:?}", Config::from_text(text, "t", env(&[]), &[]).unwrap());
        assert!(!shown.contains(":pw@"), "{shown}");
    }

    #[test]
    fn regions_need_a_replicating_backend_and_publish_on_postgres_only() {
        let region = |url: &str, publication: &str| {
            let text = format!(
                "[server]\nopen = true\n[database]\nurl = \"{url}\"\n\
                 [region]\nname = \"eu\"\nindex = 0\ncount = 2\n{publication}"
            );
            let errors = Config::from_text(&text, "t", env(&[]), &[])
                .expect("a config")
                .check_own();
            if errors.is_empty() {
                Ok(())
            } else {
                Err(errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "))
            }
        };
        let published = "publication = \"counters_eu\"\n";
        assert!(region("postgres://h/app", published).is_ok());
        assert!(region("mysql://h/app", "").is_ok());
        let sqlite = region("sqlite::memory:", "").unwrap_err();
        assert!(sqlite.contains("neither"), "{sqlite}");
        let mariadb = region("mysql://h/app", published).unwrap_err();
        assert!(
            mariadb.contains("region.publication") && mariadb.contains("PostgreSQL's"),
            "{mariadb}"
        );
    }

    #[test]
    fn token_secrets_stay_out_of_debug() {
        let text =
            "[[tokens]]\nname = \"web\"\nsecret = \"very-secret-value-123\"\nscopes = [\"read\"]\n";
        let config = Config::from_text(text, "t", env(&[]), &[]).unwrap();
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("very-secret-value-123") && shown.contains("<redacted>"),
            "{shown}"
        );
    }
}
