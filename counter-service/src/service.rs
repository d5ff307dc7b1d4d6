//! Starting, migrating and stopping the service.

use std::{
    future::Future,
    sync::{Arc, OnceLock, atomic::Ordering},
    time::{Duration, Instant},
};

use axum::Router;
use counter_redis::CountCache;
use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbBackend};
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};

use crate::{
    api,
    api::connections,
    config::{Config, ConfigError, redact_url},
    dispatch,
    domain::auth::Tokens,
    domain::check,
    domain::feed,
    domain::idempotency,
    domain::namespace::Namespace,
    domain::regions::{self, Regional},
    domain::replicas::Replicas,
    domain::watch::{Hub, Reason},
    state::{AppState, Shared},
};

/// Why the service did not start: each names what to fix.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The database could not be reached.
    #[error("cannot connect to the database: {0}")]
    Database(String),
    /// A namespace's table is missing or differs from its declaration.
    #[error(
        "namespace `{namespace}`: {problem}; run `counter-service migrate` (with the same configuration)"
    )]
    Schema {
        /// The namespace.
        namespace: String,
        /// What is wrong.
        problem: String,
    },
    /// A check's truth table or one of its columns cannot be read.
    #[error(
        "namespace `{namespace}`, key `{key}`: its check cannot read its truth table `{table}` ({problem}); \
         create the table, or fix `[namespaces.{namespace}.keys.{key}.check]` (table, via, sum, when)"
    )]
    Check {
        /// The namespace.
        namespace: String,
        /// The checked key.
        key: String,
        /// The truth table configured.
        table: String,
        /// What the database said.
        problem: String,
    },
    /// The idempotency tables are missing.
    #[error("the idempotency tables are missing ({0}); run `counter-service migrate`")]
    Ledger(String),
    /// The cache could not be set up.
    #[error("cache: {0}")]
    Cache(String),
    /// The broker could not be reached, or its consumer not started.
    #[error("broker: {0}")]
    Broker(String),
    /// The region's heartbeat table is missing, or its publication could
    /// not be made.
    #[error("region: {0}")]
    Region(String),
}

/// A started service: its state checked, its background tasks running.
pub struct Service {
    state: AppState,
    stop: watch::Sender<bool>,
    background: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field(
                "namespaces",
                &self.state.namespaces.keys().collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// Opens the configured database: SQLite on one connection (its one
/// writer), the others on a pool of `max_connections`.
async fn connect(config: &Config) -> Result<DatabaseConnection, StartError> {
    let mut options = pool_options(config, &config.database.url);
    if config.database.pooler == crate::config::Pooler::Transaction {
        counter_core::pooling::transaction_pooled(&mut options);
    }
    let db = Database::connect(options)
        .await
        .map_err(|e| StartError::Database(e.to_string()))?;
    if config.database.schema.is_some() && db.get_database_backend() != DbBackend::Postgres {
        return Err(ConfigError::invalid("database.schema", "only PostgreSQL has schemas").into());
    }
    Ok(db)
}

/// How long a pooled connection may sit idle before it is pinged on its
/// next acquire.
const IDLE_BEFORE_PING: Duration = Duration::from_secs(1);

/// The pool settings the service opens `url` with, the database's or a
/// replica's (`pooler` is the database's: a replica behind a transaction
/// pooler says so in its own URL, `statement-cache-capacity=0`). Public so
/// that a bench's raw statements meet the database on the same pool.
pub fn pool_options(config: &Config, url: &str) -> ConnectOptions {
    let mut options = ConnectOptions::new(url.to_owned());
    let sqlite = url.starts_with("sqlite:");
    options
        .max_connections(if sqlite {
            1
        } else {
            config.database.max_connections.max(1)
        })
        .min_connections(0)
        .connect_timeout(Duration::from_secs(10))
        .acquire_timeout(Duration::from_secs(10))
        // sqlx pings a connection on every acquire by default: a round trip
        // before each statement or transaction. Only one idle long enough
        // for a server, proxy or firewall to have dropped it is pinged; a
        // hot connection that died fails its statement, which is retried
        // or answered 503 `transient` like any lost connection.
        .test_before_acquire_if_idle_for(IDLE_BEFORE_PING)
        .sqlx_logging(false);
    if let Some(schema) = &config.database.schema {
        options.set_schema_search_path(schema.clone());
    }
    options
}

/// The standbys of `database.replica_urls`, connected lazily: one that is
/// down at the start is measured as down, and the start goes on.
async fn connect_replicas(config: &Config) -> Result<Option<Replicas>, StartError> {
    if config.database.replica_urls.is_empty() {
        return Ok(None);
    }
    let mut members = Vec::new();
    for url in &config.database.replica_urls {
        let mut options = pool_options(config, url);
        // A standby that stopped answering is passed over by its probe;
        // its pool does not hold a read for ten seconds meanwhile.
        options
            .connect_lazy(true)
            .connect_timeout(Duration::from_secs(2))
            .acquire_timeout(Duration::from_secs(2));
        let db = Database::connect(options)
            .await
            .map_err(|e| StartError::Database(format!("replica {}: {e}", redact_url(url))))?;
        members.push((replica_name(url), db));
    }
    Ok(Some(Replicas::new(
        members,
        Duration::from_millis(config.database.replica_max_lag_ms),
    )))
}

/// A replica's `host:port`, the label of its metrics (no credentials).
fn replica_name(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host)
        .to_owned()
}

impl Service {
    /// Creates what is missing: each namespace's tables (and bucket
    /// tables), the idempotency ledger and the replies table. Idempotent;
    /// returns the namespaces' table names.
    pub async fn migrate(config: &Config) -> Result<Vec<String>, StartError> {
        let namespaces = Namespace::build_all(config)?;
        let db = connect(config).await?;
        let mut done = Vec::new();
        for namespace in namespaces.values() {
            dispatch!(&namespace.table, h => h.counters.create_table(&db).await).map_err(|e| {
                StartError::Schema {
                    namespace: namespace.name.clone(),
                    problem: e.to_string(),
                }
            })?;
            done.push(namespace.table_name().to_owned());
        }
        idempotency::create_tables(&db)
            .await
            .map_err(|e| StartError::Ledger(e.to_string()))?;
        if let Some(settings) = &config.region {
            regions::migrate(&db, settings, &namespaces)
                .await
                .map_err(|e| StartError::Region(e.to_string()))?;
        }
        db.close()
            .await
            .map_err(|e| StartError::Database(e.to_string()))?;
        Ok(done)
    }

    /// Checks the configuration, connects, checks every table
    /// (`check_table`: a missing or drifted table refuses the start), and
    /// starts the cache, the queue consumer and the scheduled checks.
    pub async fn start(config: Config) -> Result<Self, StartError> {
        // Every rule that needs no network, all refusals at once, before
        // anything is connected (what `check-config` runs).
        config.check()?;
        let mut namespaces = Namespace::build_all(&config)?;
        let tokens = Tokens::build(
            config.server.open,
            &config.tokens,
            &config.namespaces,
            |var| std::env::var(var).ok(),
        )?;
        let db = connect(&config).await?;
        for namespace in namespaces.values() {
            let drift = dispatch!(&namespace.table, h => h.counters.check_table(&db).await)
                .map_err(|e| StartError::Schema {
                    namespace: namespace.name.clone(),
                    problem: e.to_string(),
                })?;
            if !drift.is_empty() {
                let problems: Vec<String> = drift.iter().map(ToString::to_string).collect();
                return Err(StartError::Schema {
                    namespace: namespace.name.clone(),
                    problem: problems.join("; "),
                });
            }
        }
        for namespace in namespaces.values() {
            for (key, check) in &namespace.checks {
                dispatch!(&namespace.table, h => check::probe(&db, &h.counters, key, check).await)
                    .map_err(|e| StartError::Check {
                        namespace: namespace.name.clone(),
                        key: key.clone(),
                        table: check.table.clone(),
                        problem: e,
                    })?;
            }
        }
        idempotency::check_tables(&db)
            .await
            .map_err(|e| StartError::Ledger(e.to_string()))?;
        counter_mq::ledger::probe(&db, "counter-service")
            .await
            .map_err(|e| StartError::Ledger(e.to_string()))?;
        let cache = match &config.cache {
            None => None,
            Some(settings) => {
                let cache = CountCache::builder(settings.target()?)
                    .namespace(settings.namespace.clone())
                    .ttl(Duration::from_secs(settings.ttl_seconds.max(1)))
                    .build()
                    .await
                    .map_err(|e| StartError::Cache(e.to_string()))?;
                for namespace in namespaces.values_mut() {
                    namespace.use_cache(&cache);
                }
                Some(cache)
            }
        };
        // The recorder first: the queues resolve their metric handles once,
        // at start (a handle taken before it is installed records nothing).
        let metrics = crate::metrics::handle();
        for namespace in namespaces.values_mut() {
            namespace.start_queues(&db, &config.server);
        }
        let replicas = connect_replicas(&config).await?.map(Arc::new);
        let region = match &config.region {
            None => None,
            Some(settings) => {
                let region = Regional::new(settings)?;
                region.region.lags(&db).await.map_err(|e| {
                    StartError::Region(format!(
                        "the heartbeat table cannot be read ({e}); run `counter-service migrate`"
                    ))
                })?;
                Some(Arc::new(region))
            }
        };
        let (stop, stopped) = watch::channel(false);
        let mut background = Vec::new();
        let feed = match &config.broker {
            None => None,
            Some(broker) => {
                let (status, task) =
                    feed::start(broker, db.clone(), namespaces.values(), stopped.clone())
                        .await
                        .map_err(StartError::Broker)?;
                background.push(task);
                Some(status)
            }
        };
        let (watch, watching) = Hub::start(
            db.clone(),
            &namespaces,
            cache.as_ref(),
            &config,
            stopped.clone(),
        );
        background.extend(watching);
        let state = AppState::new(Shared {
            db,
            watch,
            namespaces,
            tokens,
            server: config.server.clone(),
            cache,
            region,
            replicas,
            metrics,
            feed,
            retention: Duration::from_secs(config.idempotency.retention_hours * 3_600),
            jobs: Default::default(),
            openapi: Default::default(),
            draining: Default::default(),
        });
        if let Some(replicas) = &state.replicas {
            let (replicas, primary, stopped) =
                (replicas.clone(), state.db.clone(), stopped.clone());
            background.push(tokio::spawn(async move {
                replicas.keep_measuring(primary, stopped).await;
            }));
        }
        if let Some(region) = &state.region {
            let (region, db, stopped) = (region.clone(), state.db.clone(), stopped.clone());
            // The first heartbeat before the first answer.
            region.beat(&db).await;
            background.push(tokio::spawn(async move {
                region.keep_beating(db, stopped).await;
            }));
        }
        background.push(tokio::spawn(check::schedule(
            state.db.clone(),
            state.namespaces.values().cloned().collect(),
            stopped.clone(),
        )));
        background.push(tokio::spawn(crate::metrics::upkeep(
            state.metrics.clone(),
            stopped.clone(),
        )));
        background.push(tokio::spawn(prune(state.clone(), stopped)));
        Ok(Self {
            state,
            stop,
            background,
        })
    }

    /// The service's write path in process, without HTTP (see
    /// [`Local`](crate::Local)).
    pub fn local(&self) -> crate::Local {
        crate::Local::new(self.state.clone())
    }

    /// The router, for serving it on a listener of your own (or testing).
    pub fn router(&self) -> Router {
        api::router(self.state.clone())
    }

    /// Serves on `listener` until `shutdown` completes, then stops
    /// gracefully: it drains for `drain_ms` (still serving, `/readyz` 503,
    /// every answer closing its connection), then takes no new
    /// connections, lets requests in flight finish (for at most
    /// `shutdown_grace_ms`), stops the queue consumer after its batch
    /// (committed and acknowledged) and flushes owed cache deletions. Each
    /// step is logged at INFO.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let router = self.router();
        let limits = connections::Limits::of(&self.state.server, connections::raise_file_limit());
        tracing::info!(
            max_connections = limits.max_connections,
            header_read_timeout_ms = limits.header_read_timeout.as_millis() as u64,
            idle_timeout_ms = limits.idle_timeout.as_millis() as u64,
            "serving"
        );
        let began = Arc::new(OnceLock::new());
        let drained = drain_after(shutdown, self.state.clone(), began.clone());
        let served = connections::serve(listener, router, limits, drained).await;
        self.stop().await;
        let took = began
            .get()
            .map(|at: &Instant| at.elapsed().as_millis() as u64);
        tracing::info!(took_ms = took, "stopped");
        served
    }

    /// Stops the background tasks: the consumer after its batch, the
    /// scheduled checks between runs; then flushes owed cache deletions.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.background {
            let _ = task.await;
        }
        if let Some(cache) = &self.state.cache
            && let Err(e) = cache.flush_invalidations(Duration::from_secs(5)).await
        {
            tracing::warn!(error = %e, "cache deletions still owed at shutdown");
        }
    }
}

/// Waits for `shutdown`, then drains for `server.drain_ms`: `/readyz`
/// answers 503 `draining` and every answer closes its connection, while
/// everything is still served. When it returns the listener closes.
/// `began` records when the shutdown began, for the last log line.
async fn drain_after(
    shutdown: impl Future<Output = ()>,
    state: AppState,
    began: Arc<OnceLock<Instant>>,
) {
    shutdown.await;
    let _ = began.set(Instant::now());
    state.draining.store(true, Ordering::Relaxed);
    // Watchers reconnect now, to an instance that stays.
    state.watch.close_all(Reason::Draining);
    let drain = Duration::from_millis(state.server.drain_ms);
    tracing::info!(
        drain_ms = drain.as_millis() as u64,
        "shutting down: draining (/readyz answers 503, every answer closes its connection)"
    );
    tokio::time::sleep(drain).await;
    tracing::info!(
        grace_ms = state.server.shutdown_grace_ms,
        "shutting down: no new connections; requests in flight finish"
    );
}

/// Forgets idempotency keys older than the retention, hourly.
async fn prune(state: AppState, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(3_600));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        for namespace in state.namespaces.values() {
            // Each caller's keys (see `Namespace::source_for`).
            let tokens = std::iter::once(None).chain(state.tokens.names().map(Some));
            for token in tokens {
                let source = namespace.source_for(token);
                if let Err(e) = idempotency::prune(&state.db, &source, state.retention).await {
                    tracing::warn!(namespace = %namespace.name, %source, error = %e, "pruning idempotency keys failed");
                }
            }
        }
    }
}
