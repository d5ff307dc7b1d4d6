//! The Redis cache tier (`counter-redis`) on every backend: cached reads,
//! every write path deleting after its commit, the races a lease exists
//! for, Redis faults on private servers and clusters, and a soak. Each test
//! is registered per backend; the Redis ones skip (saying so) without
//! `COUNTER_TEST_REDIS_URL`, and `.ci/run` requires their figures.

mod cluster;
mod faults;
mod flush;
mod pubsub;
mod races;
mod reads;
mod sentinel;
mod soak;
mod unique;
mod writes;

use blog_migration::Migrator;
use counter_core::{Counters, SlottedCounter};
use counter_redis::CachedCounters;
use counter_tests::{TestDb, counters, sql};
use entity::post;
use sea_orm::DatabaseConnection;

/// The blog schema (posts, `post_counters`, comments).
pub async fn blog(t: &TestDb) {
    sql::migrate_up::<Migrator>(&t.db)
        .await
        .expect("migrate the blog schema");
}

/// Cached reads of `owners` that differ from the database's totals, read
/// right after: 0 unless the cache served a stale value.
pub async fn stale(
    posts: &CachedCounters<i64, post::Entity>,
    db: &DatabaseConnection,
    owners: &[i64],
) -> u64 {
    let cached = posts.counts_many(db, owners).await.expect("a cached read");
    let truth = post::Entity::counters()
        .counts_many(db, owners)
        .await
        .expect("a database read");
    owners.iter().filter(|o| cached[o] != truth[o]).count() as u64
}

/// A counter table of this test and backend alone. Cache observers are
/// process-wide per table name (`counter_core::observe`), so tests sharing
/// `post_counters` in parallel delete each other's owners: harmless for
/// correctness, but a test that counts hits and fills exactly needs a table
/// no other test writes.
pub async fn own_table(t: &TestDb) -> Counters<i64> {
    let own = counters::<i64>(&format!("{}_{}", t.label(), t.backend), 8);
    own.create_table(&t.db)
        .await
        .expect("create the test's counter table");
    own
}

/// [`stale`] for an untyped handle: owners whose cached keys differ from
/// the database's.
pub async fn stale_keys(
    cached: &CachedCounters<i64>,
    db: &DatabaseConnection,
    owners: &[i64],
) -> u64 {
    let read = cached
        .get_all_keys(db, owners)
        .await
        .expect("a cached read");
    let truth = cached
        .counters()
        .get_all_keys(db, owners)
        .await
        .expect("a database read");
    let differs = |o: &i64| {
        let nonzero = |m: &std::collections::HashMap<String, i64>| {
            let mut v: Vec<(String, i64)> = m
                .iter()
                .filter(|(_, n)| **n != 0)
                .map(|(k, n)| (k.clone(), *n))
                .collect();
            v.sort();
            v
        };
        nonzero(&read[o]) != nonzero(&truth[o])
    };
    owners.iter().filter(|o| differs(o)).count() as u64
}
