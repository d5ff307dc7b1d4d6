//! Cached reads: hits, fills, zero-filled and dynamic keys, an owner with
//! no rows cached too, and what an owner costs in Redis.

use counter_core::{SlottedCounter, prelude::*};
use counter_tests::{
    TestDb, backend_test, figures,
    redis::{settled, shared_cache},
};
use entity::post::{self, counters::Key};
use redis::AsyncCommands;

use super::{blog, own_table};

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "cache_reads"]
    async fn reads_fill_once_then_hit_and_match_the_database(t: TestDb) {
        let Some(cache) = shared_cache(t.backend, t.label()).await else {
            return;
        };
        blog(&t).await;
        let db = &t.db;
        // Typed, on the blog's table: the same totals as the database.
        let posts = cache.table(post::Entity::counters());
        posts.add(db, 1, Key::Likes, 3).await.unwrap();
        posts.add(db, 2, Key::Views, 5).await.unwrap();
        let owners = [1, 2, 3];
        for _ in 0..2 {
            let read = posts.counts_many(db, &owners).await.unwrap();
            assert_eq!(
                read,
                post::Entity::counters()
                    .counts_many(db, &owners)
                    .await
                    .unwrap()
            );
            assert_eq!((read[&1].likes, read[&2].views, read[&3].likes), (3, 5, 0));
        }
        assert_eq!(posts.get(db, 1, Key::Likes).await.unwrap(), 3);

        // Counted exactly, on a table of this test's own.
        let own = own_table(&t).await;
        let cache = shared_cache(t.backend, t.label()).await.unwrap();
        let cached = cache.table(&own);
        own.add(db, 1, "likes", 3).await.unwrap();
        own.add(db, 2, "views", 5).await.unwrap();
        own.increment(db, 1, "reaction:heart").await.unwrap();
        let first = cached
            .get_many(db, &owners, &["likes", "views"])
            .await
            .unwrap();
        assert_eq!(
            first,
            own.get_many(db, &owners, &["likes", "views"])
                .await
                .unwrap()
        );
        settled(&cache).await;
        let after_fill = cache.stats();
        assert_eq!(
            (after_fill.misses, after_fill.fills, after_fill.hits),
            (3, 3, 0)
        );
        let second = cached
            .get_many(db, &owners, &["likes", "views"])
            .await
            .unwrap();
        assert_eq!(second, first);
        assert_eq!(
            cache.stats().hits,
            3,
            "the second read is served from Redis"
        );

        // Keys chosen at run time: the fill stored every key of the owner.
        let all = cached.get_all_keys(db, &[1, 3]).await.unwrap();
        settled(&cache).await;
        assert_eq!(all[&1].get("reaction:heart"), Some(&1));
        assert_eq!(all[&1].get("likes"), Some(&3));
        assert!(all[&3].is_empty(), "an owner with no rows reads as no keys");
        let stats = cache.stats();
        assert_eq!(
            (stats.fills, stats.hits),
            (3, 5),
            "every read after the first was a hit: {stats:?}"
        );

        // In Redis: an owner with no rows is cached too, as no counts.
        let client = redis::Client::open(std::env::var("COUNTER_TEST_REDIS_URL").unwrap()).unwrap();
        let mut redis = client.get_multiplexed_async_connection().await.unwrap();
        let table = own.table().name().to_owned();
        let key = |owner: i64| format!("sc2:{}:{{{table}:{owner}}}", cache.namespace());
        let empty: String = redis.get(key(3)).await.unwrap();
        assert_eq!(empty, "c1|");

        // An owner with 4 small counts: one short string.
        for (k, n) in [
            ("likes", 12),
            ("comments", 3),
            ("views", 4_096),
            ("reaction:heart", 7),
        ] {
            own.add(db, 10, k, n).await.unwrap();
        }
        cached.get_all_keys(db, &[10]).await.unwrap();
        settled(&cache).await;
        let bytes: u64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key(10))
            .query_async(&mut redis)
            .await
            .unwrap();
        assert!(
            bytes <= 160,
            "an owner with 4 small counts takes {bytes} bytes (target 160)"
        );
        let ttl: i64 = redis.ttl(key(10)).await.unwrap();
        assert!(
            (3_240..=3_960).contains(&ttl),
            "TTL 1 h ± 10 %, got {ttl} s"
        );

        // A handle taken per request registers the cache once: one write,
        // one deletion.
        for _ in 0..100 {
            let _ = cache.table(&own);
        }
        let before = cache.stats().invalidations;
        own.add(db, 1, "likes", 1).await.unwrap();
        assert_eq!(cache.stats().invalidations - before, 1);

        // A value this layout did not write is replaced, not trusted.
        let _: () = redis.set(key(2), "garbage").await.unwrap();
        let read = cached.get_many(db, &[2], &["views"]).await.unwrap();
        assert_eq!(read[&2]["views"], 5);
        settled(&cache).await;
        let stored: String = redis.get(key(2)).await.unwrap();
        assert!(stored.starts_with("c1|"), "{stored}");

        figures(
            "cache_reads",
            t.backend,
            &[("bytes_per_owner", bytes), ("fills", cache.stats().fills)],
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "cache_bad_input"]
    async fn bad_input_is_refused_as_without_the_cache(t: TestDb) {
        let Some(cache) = shared_cache(t.backend, t.label()).await else {
            return;
        };
        blog(&t).await;
        let posts = post::Entity::counters().untyped();
        let cached = cache.table(&posts);
        let err = cached.get(&t.db, 1, "no spaces allowed").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        let empty = cached.get_many(&t.db, &[], &["likes"]).await.unwrap();
        assert!(empty.is_empty());
        let err = counter_redis::CountCache::builder(counter_redis::RedisTarget::standalone(
            "redis://127.0.0.1:6379",
        ))
        .namespace("a:b")
        .build()
        .await
        .unwrap_err();
        assert!(
            matches!(err, counter_redis::CacheError::InvalidNamespace(_)),
            "{err}"
        );
        let target = counter_redis::RedisTarget::standalone("redis://127.0.0.1:6379");
        for builder in [
            counter_redis::CountCache::builder(target.clone()).ttl(std::time::Duration::MAX),
            counter_redis::CountCache::builder(target.clone()).lease_ttl(std::time::Duration::MAX),
            counter_redis::CountCache::builder(target.clone())
                .unscoped_delay(std::time::Duration::MAX),
            counter_redis::CountCache::builder(target.clone()).max_concurrent_fills(0),
        ] {
            let err = builder.build().await.unwrap_err();
            assert!(
                matches!(err, counter_redis::CacheError::InvalidSetting(_)),
                "{err}"
            );
        }
        t.finish().await;
    }
}
