//! 64 tasks reading and writing through the cache beside compaction and
//! recounts, with FLUSHALL and cut connections on a private Redis: no read
//! misses a write acknowledged before it began, no increment is lost, and
//! a final verify of every owner finds nothing to fix.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use counter_core::{Compact, SlottedCounter};
use counter_redis::RedisTarget;
use counter_tests::{
    TestDb, backend_test, env_number, figures,
    redis::{PrivateRedis, namespace, shared_url, test_cache},
};
use entity::post::{self, counters::Key};
use rand::Rng;

use super::blog;

const OWNERS: i64 = 50;
const TASKS: usize = 64;

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "cache_soak"]
    async fn sixty_four_tasks_through_the_cache_beside_maintenance(t: TestDb) {
        if shared_url(t.backend, t.label()).is_none() {
            return;
        }
        blog(&t).await;
        let db = t.db.clone();
        let server = Arc::new(PrivateRedis::start());
        let cache = test_cache(
            RedisTarget::standalone(server.url()),
            &namespace(t.backend, t.label()),
        )
        .build()
        .await
        .unwrap();
        let posts = Arc::new(cache.table(post::Entity::counters()));
        let acked: Arc<Vec<AtomicI64>> =
            Arc::new((0..=OWNERS).map(|_| AtomicI64::new(0)).collect());
        let (reads, writes, stale) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
        );
        let secs = env_number("COUNTER_SOAK_SECS").unwrap_or(15u64).min(60);
        let stop_at = Instant::now() + Duration::from_secs(secs);
        let done = Arc::new(AtomicBool::new(false));

        let workers: Vec<_> = (0..TASKS)
            .map(|_| {
                let (posts, db, acked) = (posts.clone(), db.clone(), acked.clone());
                let (reads, writes, stale) = (reads.clone(), writes.clone(), stale.clone());
                tokio::spawn(async move {
                    let mut n = 0;
                    while Instant::now() < stop_at && n < 5_000 {
                        n += 1;
                        let owner = rand::rng().random_range(1..=OWNERS);
                        if rand::rng().random_bool(0.3) {
                            posts.add(&db, owner, Key::Likes, 1).await.unwrap();
                            acked[owner as usize].fetch_add(1, Ordering::SeqCst);
                            writes.fetch_add(1, Ordering::Relaxed);
                        } else {
                            // A read begun after a write was acknowledged
                            // must include it.
                            let floor = acked[owner as usize].load(Ordering::SeqCst);
                            let read = posts.counts(&db, owner).await.unwrap().likes;
                            reads.fetch_add(1, Ordering::Relaxed);
                            if read < floor {
                                stale.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                })
            })
            .collect();
        // Maintenance beside them: compaction and recounts of the cached key.
        let maintenance = {
            let (db, done) = (db.clone(), done.clone());
            tokio::spawn(async move {
                let mut passes = 0u64;
                while !done.load(Ordering::Relaxed) {
                    let counters = post::Entity::counters();
                    counters
                        .compact(&db, &Compact::new().min_rows(2))
                        .await
                        .unwrap();
                    passes += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                passes
            })
        };
        // Faults: FLUSHALL and cut connections, alternately.
        let faults = {
            let (server, done) = (server.clone(), done.clone());
            tokio::spawn(async move {
                let mut faults = 0u64;
                while !done.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(700)).await;
                    let server = server.clone();
                    let flush = faults.is_multiple_of(2);
                    tokio::task::spawn_blocking(move || {
                        if flush {
                            server.cli(&["FLUSHALL"]);
                        } else {
                            server.cut_connections();
                        }
                    })
                    .await
                    .unwrap();
                    faults += 1;
                }
                faults
            })
        };
        for worker in workers {
            worker.await.unwrap();
        }
        done.store(true, Ordering::Relaxed);
        let passes = maintenance.await.unwrap();
        let faults = faults.await.unwrap();

        let deadline = Instant::now() + Duration::from_secs(10);
        while cache.stats().invalidations_pending > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let all: Vec<i64> = (1..=OWNERS).collect();
        posts.counts_many(&db, &all).await.unwrap();
        let report = posts.verify(&db, &all).await.unwrap();
        let mut lost = 0i64;
        for owner in 1..=OWNERS {
            let total = post::Entity::counters()
                .get(&db, owner, Key::Likes)
                .await
                .unwrap();
            lost += (acked[owner as usize].load(Ordering::SeqCst) - total).abs();
        }
        let stats = cache.stats();
        assert_eq!(stale.load(Ordering::Relaxed), 0, "{stats:?}");
        assert_eq!(lost, 0);
        assert!(report.mismatched.is_empty(), "{report:?}");
        figures(
            "cache_soak",
            t.backend,
            &[
                ("tasks", TASKS as u64),
                ("reads", reads.load(Ordering::Relaxed)),
                ("writes", writes.load(Ordering::Relaxed)),
                ("compactions", passes),
                ("faults", faults),
                ("stale_reads", stale.load(Ordering::Relaxed)),
                ("fallbacks", stats.db_fallbacks),
                ("hits", stats.hits),
                ("increments_lost", lost as u64),
            ],
        );
        t.finish().await;
    }
}
