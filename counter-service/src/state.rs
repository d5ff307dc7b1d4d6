//! What every handler shares: the pool, the namespaces, the tokens, the
//! bounds, the cache and the metrics.

use std::{collections::BTreeMap, ops::Deref, sync::Arc, time::Duration};

use metrics_exporter_prometheus::PrometheusHandle;
use sea_orm::DatabaseConnection;

use crate::{
    config::{Scope, ServerConfig},
    domain::auth::{Caller, Tokens},
    domain::feed::FeedStatus,
    domain::namespace::Namespace,
    problem::Problem,
};

/// The shared state; cheap to clone.
#[derive(Clone)]
pub(crate) struct AppState(Arc<Shared>);

pub(crate) struct Shared {
    pub db: DatabaseConnection,
    pub namespaces: BTreeMap<String, Namespace>,
    pub tokens: Tokens,
    pub server: ServerConfig,
    pub cache: Option<counter_redis::CountCache>,
    /// This instance's region, with `[region]`.
    pub region: Option<Arc<crate::domain::regions::Regional>>,
    /// The standbys of lag-tolerant reads, if any are configured.
    pub replicas: Option<Arc<crate::domain::replicas::Replicas>>,
    pub metrics: PrometheusHandle,
    pub feed: Option<FeedStatus>,
    /// How long idempotency keys are kept.
    pub retention: Duration,
    /// The `counts:watch` streams.
    pub watch: crate::domain::watch::Hub,
    /// The maintenance jobs this instance runs and keeps.
    pub jobs: Arc<crate::domain::jobs::Jobs>,
    /// The OpenAPI document, set once the router is built.
    pub openapi: std::sync::OnceLock<String>,
    /// Set when a shutdown begins: `/readyz` answers 503 `draining` and
    /// every answer closes its connection (`server.drain_ms`).
    pub draining: std::sync::atomic::AtomicBool,
}

impl AppState {
    pub fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }

    /// The namespace `name` if `caller` may act on it with `scope`: 404
    /// for no such namespace, 403 outside the caller's token.
    pub fn namespace(
        &self,
        caller: &Caller,
        name: &str,
        scope: Scope,
    ) -> Result<&Namespace, Problem> {
        let namespace = self
            .namespaces
            .get(name)
            .ok_or_else(|| Problem::unknown_namespace(name))?;
        caller.allow(&namespace.name, scope)?;
        Ok(namespace)
    }
}

impl AppState {
    /// This instance's readiness, each dependency asked once.
    pub async fn readiness(&self) -> crate::domain::health::Readiness {
        crate::domain::health::readiness(
            &self.db,
            self.cache.as_ref(),
            self.feed.as_ref(),
            self.region.as_ref().map(|r| r.dependency()),
            self.draining(),
        )
        .await
    }

    /// Whether a shutdown has begun.
    pub fn draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}
