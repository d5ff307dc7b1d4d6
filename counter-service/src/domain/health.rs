//! Whether this instance can serve: the database answers and takes writes,
//! the consumer runs (if configured), the cache answers (reported, not
//! required), and no shutdown has begun. `/readyz` answers it and every
//! scrape of `/metrics` records it.

use std::time::Duration;

use counter_redis::CountCache;
use sea_orm::DatabaseConnection;
use serde::Serialize;
use utoipa::ToSchema;

use crate::{
    domain::feed::FeedStatus,
    metrics::{DEPENDENCY_UP, READY},
};

/// One dependency's state.
#[derive(Debug, Serialize, ToSchema)]
pub struct Dependency {
    /// Whether it answered.
    pub ok: bool,
    /// What went wrong, or a figure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Readiness, per dependency.
#[derive(Debug, Serialize, ToSchema)]
pub struct Readiness {
    /// `ready`; `unready` (a dependency it needs is down, or the database
    /// takes no writes); `draining` (the instance is shutting down: send
    /// requests elsewhere).
    pub status: String,
    /// The database: needed.
    pub database: Dependency,
    /// The cache, if configured: reads fall back to the database without it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<Dependency>,
    /// The queue consumer, if configured: needed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broker: Option<Dependency>,
    /// Replication from the other regions, with `[region]`: reported, not
    /// required (a region cut off keeps counting). `ok` is false while a
    /// region's heartbeat is older than `region.stale_after_ms` or was
    /// never seen here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<Dependency>,
}

/// Each dependency asked once, with its timeout: what `/readyz` answers
/// and each scrape of `/metrics` records. `draining`: a shutdown has begun.
pub(crate) async fn readiness(
    db: &DatabaseConnection,
    cache: Option<&CountCache>,
    feed: Option<&FeedStatus>,
    region: Option<Dependency>,
    draining: bool,
) -> Readiness {
    // A standby answers pings: ask whether it takes writes, which every
    // add needs (a demoted primary in a failover, a replica's address).
    let writable = counter_core::accepts_writes(db);
    let database = match tokio::time::timeout(Duration::from_secs(2), writable).await {
        Ok(Ok(true)) => Dependency {
            ok: true,
            detail: None,
        },
        Ok(Ok(false)) => Dependency {
            ok: false,
            detail: Some("the server takes no writes (a standby, or read-only)".into()),
        },
        Ok(Err(e)) => Dependency {
            ok: false,
            detail: Some(e.to_string()),
        },
        Err(_) => Dependency {
            ok: false,
            detail: Some("no answer within 2 s".into()),
        },
    };
    let cache = match cache {
        None => None,
        Some(cache) => Some(ping_cache(cache).await),
    };
    let broker = feed.map(|feed| {
        let stats = feed.stats();
        Dependency {
            ok: feed.running(),
            detail: Some(format!(
                "{}: {} applied, lag {}",
                feed.broker,
                stats.applied,
                stats
                    .lag
                    .map_or_else(|| "unknown".to_owned(), |l| l.to_string())
            )),
        }
    });
    let ready = database.ok && broker.as_ref().is_none_or(|b| b.ok);
    let status = if draining {
        "draining"
    } else if ready {
        "ready"
    } else {
        "unready"
    };
    Readiness {
        status: status.into(),
        database,
        cache,
        broker,
        region,
    }
}

async fn ping_cache(cache: &CountCache) -> Dependency {
    match cache.ping(Duration::from_secs(1)).await {
        Ok(()) => Dependency {
            ok: true,
            detail: None,
        },
        Err(e) => Dependency {
            ok: false,
            detail: Some(format!("{e}; reads go to the database")),
        },
    }
}

impl Readiness {
    /// Sets the readiness gauges (`counter_service_ready`,
    /// `counter_service_dependency_up`) from this check.
    pub(crate) fn record(&self) {
        metrics::gauge!(READY).set(f64::from(u8::from(self.status == "ready")));
        let dependencies = [
            ("database", Some(&self.database)),
            ("cache", self.cache.as_ref()),
            ("broker", self.broker.as_ref()),
            ("region", self.region.as_ref()),
        ];
        for (name, dependency) in dependencies {
            if let Some(dependency) = dependency {
                metrics::gauge!(DEPENDENCY_UP, "dependency" => name)
                    .set(f64::from(u8::from(dependency.ok)));
            }
        }
    }
}
