//! A private 3-master Redis Cluster: the same reads, spread over the nodes;
//! a master SIGKILLed under 32 readers (0 read errors, fallbacks counted),
//! then restarted empty (no stale value). Run with and without
//! `cluster-require-full-coverage`.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use counter_redis::RedisTarget;
use counter_tests::{
    TestDb, backend_test, figures,
    redis::{RedisCluster, namespace, settled, shared_url, test_cache},
};

use super::{own_table, stale_keys};

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "cache_cluster"]
    async fn a_cluster_serves_reads_through_a_dead_master(t: TestDb) {
        if shared_url(t.backend, t.label()).is_none() {
            return;
        }
        let db = t.db.clone();
        let own = own_table(&t).await;
        let owners: Vec<i64> = (1..=300).collect();
        let batch: Vec<(i64, &str, i64)> = owners
            .iter()
            .flat_map(|&o| [(o, "likes", o), (o, "comments", 1)])
            .collect();
        own.add_many(&db, batch).await.unwrap();
        for full_coverage in [false, true] {
            let cluster = RedisCluster::start(full_coverage);
            let cache = test_cache(
                RedisTarget::cluster(cluster.urls()),
                &namespace(t.backend, t.label()),
            )
            .timeout(Duration::from_millis(300))
            .build()
            .await
            .unwrap();
            // A message published through any node reaches a subscriber of
            // another.
            super::pubsub::heard_through(&cache, "[cluster]").await;
            let posts = Arc::new(cache.table(&own));
            assert_eq!(stale_keys(&posts, &db, &owners).await, 0);
            settled(&cache).await;
            assert_eq!(stale_keys(&posts, &db, &owners).await, 0);
            let warm = cache.stats();
            assert_eq!(
                warm.hits,
                owners.len() as u64,
                "the second read is all hits: {warm:?}"
            );
            for node in &cluster.nodes {
                let keys: u64 = node.cli(&["DBSIZE"]).unwrap().parse().unwrap();
                assert!(keys > 50, "every master holds owners ({keys})");
            }

            // A master dies under 32 readers.
            let errors = Arc::new(AtomicU64::new(0));
            let wrong = Arc::new(AtomicU64::new(0));
            let reads = Arc::new(AtomicU64::new(0));
            let stop = Instant::now() + Duration::from_secs(4);
            let readers: Vec<_> = (0..32)
                .map(|i| {
                    let (posts, db, owners) = (posts.clone(), db.clone(), owners.clone());
                    let (errors, wrong, reads) = (errors.clone(), wrong.clone(), reads.clone());
                    tokio::spawn(async move {
                        let mut n = 0;
                        while Instant::now() < stop && n < 2_000 {
                            n += 1;
                            let sample: Vec<i64> =
                                owners.iter().copied().skip(i * 7 % 250).take(50).collect();
                            match posts.get_many(&db, &sample, &["likes", "comments"]).await {
                                Ok(counts) => {
                                    reads.fetch_add(1, Ordering::Relaxed);
                                    let bad = sample
                                        .iter()
                                        .filter(|o| {
                                            counts[o]["likes"] != **o || counts[o]["comments"] != 1
                                        })
                                        .count();
                                    wrong.fetch_add(bad as u64, Ordering::Relaxed);
                                }
                                Err(_) => {
                                    errors.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                    })
                })
                .collect();
            tokio::time::sleep(Duration::from_millis(500)).await;
            cluster.nodes[1].kill();
            for reader in readers {
                reader.await.unwrap();
            }
            let during = cache.stats();
            assert_eq!(errors.load(Ordering::Relaxed), 0, "no read failed");
            assert_eq!(wrong.load(Ordering::Relaxed), 0, "no read was wrong");
            assert!(
                during.db_fallbacks > 0,
                "the dead master was felt: {during:?}"
            );

            // Back, empty: a write, then every read is exact again.
            cluster.nodes[1].restart();
            cluster.wait_ok(Duration::from_secs(30));
            posts.add(&db, 5, "likes", 1).await.unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            while cache.stats().invalidations_pending > 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(
                stale_keys(&posts, &db, &owners).await,
                0,
                "after the restart"
            );
            own.add(&db, 5, "likes", -1).await.unwrap();
            let after = cache.stats();
            figures(
                if full_coverage {
                    "cache_cluster_full_coverage"
                } else {
                    "cache_cluster"
                },
                t.backend,
                &[
                    ("reads", reads.load(Ordering::Relaxed)),
                    ("read_errors", errors.load(Ordering::Relaxed)),
                    ("stale_reads", wrong.load(Ordering::Relaxed)),
                    ("fallbacks", after.db_fallbacks),
                    ("faults", 1),
                ],
            );
        }
        t.finish().await;
    }
}
