//! Redis faults on a private server: FLUSHALL, every connection cut, the
//! script cache flushed, the server SIGKILLed and restarted empty. Reads
//! never fail, writes never fail because of Redis, and no read after an
//! acknowledged write misses it.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use counter_core::SlottedCounter;
use counter_redis::RedisTarget;
use counter_tests::{
    TestDb, backend_test, env_number, figures,
    redis::{PrivateRedis, namespace, shared_url, test_cache},
};
use entity::post::{self, counters::Key};
use rand::Rng;

use super::blog;

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "cache_faults"]
    async fn redis_faults_cost_misses_never_counts_or_errors(t: TestDb) {
        // Runs where the shared Redis tests run (redis-server is installed).
        if shared_url(t.backend, t.label()).is_none() {
            return;
        }
        blog(&t).await;
        let db = &t.db;
        let server = PrivateRedis::start();
        let cache = test_cache(
            RedisTarget::standalone(server.url()),
            &namespace(t.backend, t.label()),
        )
        .timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
        let posts = cache.table(post::Entity::counters());
        let owners: Vec<i64> = (1..=20).collect();
        let mut model: HashMap<i64, i64> = HashMap::new();
        let mut rng = rand::rng();
        let (mut operations, mut faults, mut stale_reads) = (0u64, 0u64, 0u64);
        let limit = Duration::from_secs(env_number("COUNTER_SOAK_SECS").unwrap_or(15).min(20));
        let started = Instant::now();
        while operations < 600 && started.elapsed() < limit {
            operations += 1;
            let owner = owners[rng.random_range(0..owners.len())];
            let delta = rng.random_range(1..=3);
            posts
                .add(db, owner, Key::Likes, delta)
                .await
                .expect("a write never fails because of Redis");
            *model.entry(owner).or_default() += delta;
            // Every read after an acknowledged write sees it.
            let sample: Vec<i64> = (0..5)
                .map(|_| owners[rng.random_range(0..owners.len())])
                .collect();
            let read = posts
                .counts_many(db, &sample)
                .await
                .expect("a read never fails because of Redis");
            for o in &sample {
                if read[o].likes != model.get(o).copied().unwrap_or(0) {
                    stale_reads += 1;
                }
            }
            if operations.is_multiple_of(50) {
                faults += 1;
                match (operations / 50) % 4 {
                    0 => {
                        server.cli(&["FLUSHALL"]);
                    }
                    1 => server.cut_connections(),
                    2 => {
                        server.cli(&["SCRIPT", "FLUSH"]);
                    }
                    _ => {
                        server.kill();
                        // Writes and reads while it is down.
                        for _ in 0..5 {
                            operations += 1;
                            let owner = owners[rng.random_range(0..owners.len())];
                            posts.add(db, owner, Key::Likes, 1).await.unwrap();
                            *model.entry(owner).or_default() += 1;
                            let read = posts.counts(db, owner).await.unwrap();
                            stale_reads += u64::from(read.likes != model[&owner]);
                        }
                        server.restart();
                    }
                }
            }
        }
        // Settled: everything owed is deleted, and a full verify agrees.
        let deadline = Instant::now() + Duration::from_secs(10);
        while cache.stats().invalidations_pending > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let report = posts.verify(db, &owners).await.unwrap();
        let stats = cache.stats();
        for o in &owners {
            let total = post::Entity::counters()
                .get(db, *o, Key::Likes)
                .await
                .unwrap();
            assert_eq!(
                total,
                model.get(o).copied().unwrap_or(0),
                "owner {o}: the database total"
            );
        }
        assert_eq!(stale_reads, 0, "{stats:?}");
        assert!(report.mismatched.is_empty(), "{report:?}");
        assert_eq!(stats.invalidations_pending, 0, "{stats:?}");
        // Felt: reads went to the database, because Redis failed them or
        // because their owner's deletion was still owed.
        assert!(
            stats.db_fallbacks + stats.uncached_reads > 0 && stats.redis_errors > 0,
            "the faults were felt: {stats:?}"
        );
        figures(
            "cache_faults",
            t.backend,
            &[
                ("operations", operations),
                ("faults", faults),
                ("stale_reads", stale_reads),
                ("fallbacks", stats.db_fallbacks + stats.uncached_reads),
                ("invalidation_failures", stats.invalidation_failures),
                ("mismatches_at_end", report.mismatched.len() as u64),
                ("increments_lost", 0),
            ],
        );
        t.finish().await;
    }
}
