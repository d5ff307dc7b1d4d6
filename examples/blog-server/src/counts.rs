//! Where the server reads posts' counts: the database, or a shared Redis
//! cache in front of it (`counter-redis`, when the binary has `REDIS_URL`).
//!
//! Writes need no switch: the library's writes delete the owners they
//! touched from the cache after their commit, whichever handle made them,
//! so a read after a like (the like endpoint's own answer included) sees it.

use counter_core::{CounterError, SlottedCounter};
use counter_redis::{CachedCounters, CountCache};
use entity::post::{self, counters::Counts};
use sea_orm::DatabaseConnection;

/// How counts are read. Cheap to clone (it is router state).
#[derive(Clone, Debug)]
pub enum CountReader {
    /// One grouped query per read.
    Database,
    /// From Redis, filled from the database on a miss.
    Cached(CachedCounters<i64, post::Entity>),
}

impl CountReader {
    /// Reads through `cache`.
    pub fn cached(cache: &CountCache) -> Self {
        Self::Cached(cache.table(post::Entity::counters()))
    }

    /// One post's counts.
    pub async fn counts(&self, db: &DatabaseConnection, id: i64) -> Result<Counts, CounterError> {
        match self {
            Self::Database => post::Entity::counters().counts(db, id).await,
            Self::Cached(posts) => posts.counts(db, id).await,
        }
    }

    /// A page of posts with their counts, in one read.
    pub async fn load_counts(
        &self,
        db: &DatabaseConnection,
        models: Vec<post::Model>,
    ) -> Result<Vec<(post::Model, Counts)>, CounterError> {
        match self {
            Self::Database => post::Entity::counters().load_counts(db, models).await,
            Self::Cached(posts) => posts.load_counts(db, models).await,
        }
    }
}
