//! This instance's region, when several count the same counters
//! (`[region]`, `counter_core::Region`): its heartbeat, and how fresh the
//! other regions' rows are here.
//!
//! Every `beat_ms` the instance records the region's heartbeat (a row of
//! its own, replicated with its counters) and reads the heartbeats the
//! other regions' rows brought: a region's share of any total here is at
//! most as old as its latest heartbeat (a subscription applies a region's
//! transactions in commit order). Answers carry the oldest of those ages,
//! `/metrics` each one, and `/readyz` names a region whose heartbeat is
//! older than `stale_after_ms` (its replication is cut, or it is down).
//! None of it stops counting: a region cut off from the others goes on
//! accepting writes, and its totals catch up when replication resumes.

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

use counter_core::{Region, RegionLag};
use sea_orm::DatabaseConnection;
use tokio::sync::watch;

use crate::{config::RegionConfig, domain::health::Dependency, metrics::REGION_LAG};

/// The region, its settings, and the other regions' ages last measured.
pub(crate) struct Regional {
    pub region: Region,
    beat_every: Duration,
    stale_after: Duration,
    /// The last measurement, when it was taken: the other regions'
    /// heartbeat ages, or why there is none.
    lags: Mutex<(Instant, Result<Vec<RegionLag>, String>)>,
}

impl Regional {
    pub fn new(config: &RegionConfig) -> Result<Self, crate::config::ConfigError> {
        Ok(Self {
            region: config.region()?,
            beat_every: Duration::from_millis(config.beat_ms),
            stale_after: Duration::from_millis(config.stale_after_ms),
            lags: Mutex::new((Instant::now(), Err("not measured yet".into()))),
        })
    }

    /// Records this region's heartbeat, then reads the others'.
    pub async fn beat(&self, db: &DatabaseConnection) {
        if let Err(error) = self.region.beat(db).await {
            tracing::warn!(region = %self.region.name(), %error, "recording the region's heartbeat failed");
        }
        let lags = self.region.lags(db).await.map_err(|e| e.to_string());
        if let Ok(lags) = &lags {
            for lag in lags {
                metrics::gauge!(REGION_LAG, "region" => lag.region.clone())
                    .set(lag.age.as_secs_f64());
            }
        }
        *self.lags.lock().expect("not poisoned") = (Instant::now(), lags);
    }

    /// Beats every `beat_ms` until `stopped` turns true.
    pub async fn keep_beating(&self, db: DatabaseConnection, mut stopped: watch::Receiver<bool>) {
        let mut every = tokio::time::interval(self.beat_every);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => self.beat(&db).await,
                _ = stopped.changed() => return,
            }
            if *stopped.borrow() {
                return;
            }
        }
    }

    /// The oldest of the other regions' heartbeats here, as last measured
    /// (plus the time since): how stale another region's share of a total
    /// may be. `None` until every other region's heartbeat has arrived, or
    /// while the last measurement failed.
    pub fn oldest(&self) -> Option<Duration> {
        let (measured, lags) = &*self.lags.lock().expect("not poisoned");
        let lags = lags.as_ref().ok()?;
        // A region never heard from could be any age behind.
        if lags.len() + 1 < usize::from(self.region.count()) {
            return None;
        }
        let oldest = lags.iter().map(|lag| lag.age).max()?;
        Some(oldest + measured.elapsed())
    }

    /// `/readyz`'s `region`: every other region's heartbeat within
    /// `stale_after_ms`, or which are not.
    pub fn dependency(&self) -> Dependency {
        let guard = self.lags.lock().expect("not poisoned");
        let lags = match &guard.1 {
            Err(error) => {
                return Dependency {
                    ok: false,
                    detail: Some(format!("region {}: {error}", self.region.name())),
                };
            }
            Ok(lags) => lags,
        };
        let stale: Vec<String> = lags
            .iter()
            .filter(|lag| lag.age > self.stale_after)
            .map(|lag| format!("{} {:.1} s behind", lag.region, lag.age.as_secs_f64()))
            .collect();
        let heard = lags.len() + 1;
        let count = usize::from(self.region.count());
        let mut detail = format!("region {}", self.region.name());
        if heard < count {
            detail.push_str(&format!(
                "; {} of {} regions never heard from",
                count - heard,
                count - 1
            ));
        }
        if !stale.is_empty() {
            detail.push_str(&format!("; replication stopped? {}", stale.join(", ")));
        } else if let Some(oldest) = lags.iter().map(|lag| lag.age).max() {
            detail.push_str(&format!("; others within {} ms", oldest.as_millis()));
        }
        Dependency {
            ok: stale.is_empty() && heard == count,
            detail: Some(detail),
        }
    }
}

/// What `migrate` does for a region: the heartbeat table, and the
/// publication of the region's rows of every namespace's tables when
/// `region.publication` names one.
pub(crate) async fn migrate(
    db: &DatabaseConnection,
    config: &RegionConfig,
    namespaces: &std::collections::BTreeMap<String, crate::domain::namespace::Namespace>,
) -> Result<(), String> {
    Region::create_beat_table(db)
        .await
        .map_err(|e| e.to_string())?;
    let Some(publication) = &config.publication else {
        return Ok(());
    };
    let region = config.region().map_err(|e| e.to_string())?;
    let tables: Vec<counter_core::CounterTable> = namespaces
        .values()
        .map(|namespace| crate::dispatch!(&namespace.table, h => h.counters.table().clone()))
        .collect();
    let tables: Vec<&counter_core::CounterTable> = tables.iter().collect();
    region
        .publish(db, publication, &tables)
        .await
        .map_err(|e| e.to_string())
}
