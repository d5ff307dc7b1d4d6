//! Unique counts through the Redis cache: estimates filled with the
//! owner's totals, served from Redis, and deleted after every merge into
//! the owner's sketches (direct, batched, buffered), on every backend.

use counter_core::{CounterBuffer, CounterTable, Counters, DeltaBatch, FlushLedger};
use counter_tests::{
    TestDb, backend_test, figures,
    redis::{settled, shared_cache},
};

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "cache_unique"]
    async fn estimates_are_cached_and_forgotten_after_each_merge(t: TestDb) {
        let Some(cache) = shared_cache(t.backend, t.label()).await else {
            return;
        };
        let db = &t.db;
        let table = CounterTable::new(format!("cache_unique_{}", t.backend))
            .and_then(|t| t.with_slots(4))
            .and_then(|t| t.with_unique_key("viewers"))
            .unwrap();
        let own = Counters::<i64>::new(table);
        own.create_table(db).await.unwrap();
        FlushLedger::default().create_table(db).await.unwrap();
        let cached = cache.table(&own);
        for member in ["ann", "bob", "ann"] {
            own.observe(db, 1, "viewers", member).await.unwrap();
        }
        own.add(db, 1, "likes", 4).await.unwrap();
        assert_eq!(cached.unique(db, 1, "viewers").await.unwrap(), 2);
        settled(&cache).await;
        let before = cache.stats();
        assert_eq!(cached.unique(db, 1, "viewers").await.unwrap(), 2);
        assert_eq!(cached.get(db, 1, "likes").await.unwrap(), 4);
        let many = cached.unique_many(db, &[1, 2], &["viewers"]).await.unwrap();
        assert_eq!((many[&1]["viewers"], many[&2]["viewers"]), (2, 0));
        assert!(cache.stats().hits > before.hits, "served from Redis");
        // The totals of every key read around the estimates stay clean.
        let all = cached.get_all_keys(db, &[1]).await.unwrap();
        assert_eq!(all[&1].get("likes"), Some(&4));
        assert!(!all[&1].contains_key("viewers"));

        // Every write path deletes the cached value after its commit.
        own.observe(db, 1, "viewers", "cy").await.unwrap();
        assert_eq!(cached.unique(db, 1, "viewers").await.unwrap(), 3, "direct");
        settled(&cache).await;
        let mut batch = DeltaBatch::new();
        batch.observe(&own, 1, "viewers", "dee").unwrap();
        batch.apply(db).await.unwrap();
        assert_eq!(cached.unique(db, 1, "viewers").await.unwrap(), 4, "batch");
        settled(&cache).await;
        let buffer = CounterBuffer::start(db).await.unwrap();
        buffer.observe(&own, 1, "viewers", "eve").unwrap();
        buffer.flush().await.unwrap();
        assert_eq!(cached.unique(db, 1, "viewers").await.unwrap(), 5, "buffer");
        buffer.shutdown().await.unwrap();
        let err = cached.unique_many(db, &[1], &["likes"]).await.unwrap_err();
        assert!(matches!(err, counter_core::CounterError::WrongKeyKind { .. }), "{err}");
        let err = cached.get(db, 1, "viewers").await.unwrap_err();
        assert!(matches!(err, counter_core::CounterError::WrongKeyKind { .. }), "{err}");
        let err = cached.get_many(db, &[1], &["likes", "viewers"]).await.unwrap_err();
        assert!(matches!(err, counter_core::CounterError::WrongKeyKind { .. }), "{err}");
        let verify = cached.verify(db, &[1, 2]).await.unwrap();
        figures(
            "cache_unique",
            t.backend,
            &[("hits", cache.stats().hits), ("verify_drift", verify.mismatched.len() as u64)],
        );
        assert!(verify.mismatched.is_empty() && verify.cached > 0, "{verify:?}");
        t.finish().await;
    }
}
