//! Every write path of the library deletes the owners it touched after its
//! commit, so that a cached read right after it returns sees it.

use std::time::Duration;

use futures_util::FutureExt;

use counter_core::{
    CounterBuffer, CounterCache, DeltaBatch, Reconcile, ReconcileReport, SlottedCounter, Truth,
};
use counter_tests::{TestDb, backend_test, figures, redis::shared_cache};
use entity::{
    comment,
    post::{self, counters::Key},
};
use sea_orm::{ActiveModelTrait, ConnectionTrait, DatabaseTransaction, Set, TransactionTrait};

use super::{blog, own_table, stale, stale_keys};

fn new_comment(post_id: i64) -> comment::ActiveModel {
    comment::ActiveModel {
        post_id: Set(post_id),
        author_id: Set(1),
        body: Set("hello".into()),
        ..Default::default()
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "cache_writes"]
    async fn every_write_path_deletes_after_its_commit(t: TestDb) {
        let Some(cache) = shared_cache(t.backend, t.label()).await else {
            return;
        };
        blog(&t).await;
        let db = &t.db;
        let posts = cache.table(post::Entity::counters());
        let owners = [1, 2, 3];
        let mut stale_reads = 0;
        let mut steps = 0;
        // Warms the cache, then runs a write and checks the cached read.
        macro_rules! step {
            ($name:literal, $write:expr) => {{
                posts.counts_many(db, &owners).await.unwrap();
                $write;
                let stale_now = stale(&posts, db, &owners).await;
                assert_eq!(stale_now, 0, "[{}] stale after {}", t.backend, $name);
                stale_reads += stale_now;
                steps += 1;
            }};
        }
        step!("add", posts.add(db, 1, Key::Likes, 2).await.unwrap());
        step!(
            "add (windowed key)",
            posts.add(db, 2, Key::Views, 7).await.unwrap()
        );
        step!(
            "add_many",
            posts
                .add_many(db, [(1, Key::Likes, 1), (3, Key::Likes, 4)])
                .await
                .unwrap()
        );
        step!("a DeltaBatch of two tables", {
            let mut batch = DeltaBatch::new();
            batch.add(posts.counters(), 1, Key::Likes, 1).unwrap();
            batch.add(posts.counters(), 2, Key::Views, 1).unwrap();
            batch
                .add(
                    entity::user::Entity::counters(),
                    9,
                    entity::user::counters::Key::Posts,
                    1,
                )
                .unwrap();
            batch.apply(db).await.unwrap();
        });
        step!("insert_counted (counter cache)", {
            comment::Entity::insert_counted(db, new_comment(1))
                .await
                .unwrap();
        });
        let doomed = comment::Entity::insert_counted(db, new_comment(2))
            .await
            .unwrap();
        step!("delete_counted (counter cache)", {
            let am: comment::ActiveModel = doomed.clone().into();
            comment::Entity::delete_counted(db, am).await.unwrap();
        });
        step!("hooks inside CountCache::transaction", {
            cache
                .transaction(db, |txn: &DatabaseTransaction| {
                    Box::pin(async move {
                        new_comment(3).insert(txn).await?;
                        new_comment(3).insert(txn).await?;
                        Ok::<_, sea_orm::DbErr>(())
                    })
                })
                .await
                .unwrap();
        });
        step!("a rolled-back transaction", {
            let outcome: Result<(), sea_orm::DbErr> = cache
                .transaction(db, |txn: &DatabaseTransaction| {
                    Box::pin(async move {
                        new_comment(3).insert(txn).await?;
                        Err(sea_orm::DbErr::Custom("changed my mind".into()))
                    })
                })
                .await;
            assert!(outcome.is_err());
        });
        step!("a buffer flush", {
            let buffer = CounterBuffer::builder(db)
                .interval(Duration::from_secs(3600))
                .start()
                .await
                .unwrap();
            buffer.add(posts.counters(), 2, Key::Likes, 5).unwrap();
            buffer.add(posts.counters(), 3, Key::Likes, 1).unwrap();
            buffer.flush().await.unwrap();
            buffer.shutdown().await.unwrap();
        });
        step!("purge", posts.purge(db, &[3]).await.unwrap());
        step!("reset", posts.reset(db, &[1, 2], Key::Likes).await.unwrap());

        // Hooks in the caller's own transaction, outside any scope: the
        // cache cannot see the commit, so this process reads those owners
        // from the database until the delayed delete.
        step!("hooks in a plain transaction", {
            let txn = db.begin().await.unwrap();
            new_comment(1).insert(&txn).await.unwrap();
            txn.commit().await.unwrap();
        });
        assert!(cache.stats().unscoped_writes >= 1);
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(
            stale(&posts, db, &owners).await,
            0,
            "after the delayed delete"
        );

        // Raw SQL is not seen: the cache serves the old total until told
        // (on a table of this test's own, which no other test's writes
        // invalidate).
        let own = own_table(&t).await;
        let cached = cache.table(&own);
        own.add(db, 1, "likes", 1).await.unwrap();
        cached.get_all_keys(db, &owners).await.unwrap();
        let table = own.table().name();
        let raw = format!(
            "UPDATE {table} SET value = value + 100 WHERE owner_id = 1 AND count_key = 'likes'"
        );
        db.execute_unprepared(&raw).await.unwrap();
        assert_eq!(
            stale_keys(&cached, db, &owners).await,
            1,
            "raw SQL is invisible to the cache"
        );
        let report = cached.verify(db, &owners).await.unwrap();
        assert_eq!(
            report.mismatched,
            vec![1],
            "verify finds and deletes the stale owner"
        );
        assert_eq!(stale_keys(&cached, db, &owners).await, 0);
        db.execute_unprepared(&raw).await.unwrap();
        cached.invalidate(&[1]).await;
        assert_eq!(
            stale_keys(&cached, db, &owners).await,
            0,
            "after invalidate"
        );

        // A recount repair: comments damaged by raw SQL, repaired, deleted.
        posts.counts_many(db, &owners).await.unwrap();
        let table = posts.table().name();
        let damage = format!("UPDATE {table} SET value = value + 7 WHERE count_key = 'comments'");
        let damage = match t.backend {
            counter_tests::Backend::MySql => damage,
            _ => damage.replace(table, &format!("\"{table}\"")),
        };
        db.execute_unprepared(&damage).await.unwrap();
        let report: ReconcileReport<i64> = post::Entity::counters()
            .reconcile(
                db,
                Key::Comments,
                Truth::counter_cache::<comment::Entity>(),
                &Reconcile::new(),
            )
            .await
            .unwrap();
        assert!(report.owners_drifted > 0, "{report:?}");
        assert_eq!(stale(&posts, db, &owners).await, 0, "after the recount");

        let stats = cache.stats();
        assert_eq!(stats.invalidation_failures, 0);
        assert_eq!(stats.mismatches, 1);
        figures(
            "cache_writes",
            t.backend,
            &[
                ("write_paths", steps),
                ("stale_reads", stale_reads),
                ("invalidations", stats.invalidations),
            ],
        );
        t.finish().await;
    }
}

backend_test! {
    /// Writes dropped mid-flight (axum drops a handler whose client left):
    /// a write that committed anyway still deletes its owner, because the
    /// deletion runs in the statement's own detached task.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "cache_dropped_writes"]
    async fn a_dropped_write_that_commits_still_deletes(t: TestDb) {
        let Some(cache) = shared_cache(t.backend, t.label()).await else {
            return;
        };
        let db = &t.db;
        let own = own_table(&t).await;
        let cached = cache.table(&own);
        let mut dropped = 0;
        for round in 0..20u64 {
            cached.get_all_keys(db, &[1]).await.unwrap();
            let write = own.add(db, 1, "likes", 1);
            // Dropped at some point of its flight. Every fourth round right
            // after its first poll (mid statement, whatever the timer's
            // granularity: a timeout shorter than the timer's millisecond
            // tick lets a fast SQLite write finish); the others after a
            // growing patience: mid statement, or after the commit.
            let finished = if round % 4 == 0 {
                write.now_or_never().is_some()
            } else {
                let patience = Duration::from_micros(50 * round);
                tokio::time::timeout(patience, write).await.is_ok()
            };
            if !finished {
                dropped += 1;
            }
            // The detached statement and its deletion finish on their own:
            // usually within 100 ms, longer on a loaded machine (a CI run's
            // other tests share the server), so waited for, bounded.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            let mut stale = stale_keys(&cached, db, &[1]).await;
            while stale > 0 && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
                stale = stale_keys(&cached, db, &[1]).await;
            }
            assert_eq!(stale, 0, "[{}] round {round}", t.backend);
        }
        assert!(dropped > 0, "no write was dropped: lower the patience");
        figures(
            "cache_dropped_writes",
            t.backend,
            &[("writes", 20), ("dropped", dropped), ("stale_reads", 0)],
        );
        t.finish().await;
    }
}

backend_test! {
    /// String owners that differ only in case are two owners in the
    /// database (an exact comparison on every backend, MariaDB's default
    /// case-insensitive collation included) and two entries in the cache.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "cache_string_owners"]
    async fn string_owners_differing_in_case_are_cached_apart(t: TestDb) {
        let Some(cache) = shared_cache(t.backend, t.label()).await else {
            return;
        };
        let db = &t.db;
        let own = counter_tests::counters::<String>(&format!("{}_{}", t.label(), t.backend), 4);
        own.create_table(db).await.unwrap();
        let cached = cache.table(&own);
        let owners = ["Alice".to_owned(), "alice".to_owned(), "ALICE".to_owned()];
        own.add(db, owners[0].clone(), "likes", 1).await.unwrap();
        own.add(db, owners[1].clone(), "likes", 10).await.unwrap();
        for _ in 0..2 {
            let read = cached.get_many(db, &owners, &["likes"]).await.unwrap();
            assert_eq!(
                (
                    read[&owners[0]]["likes"],
                    read[&owners[1]]["likes"],
                    read[&owners[2]]["likes"]
                ),
                (1, 10, 0),
                "[{}]",
                t.backend
            );
        }
        own.add(db, owners[1].clone(), "likes", 5).await.unwrap();
        let read = cached.get_many(db, &owners, &["likes"]).await.unwrap();
        assert_eq!(
            (read[&owners[0]]["likes"], read[&owners[1]]["likes"]),
            (1, 15)
        );
        t.finish().await;
    }
}
