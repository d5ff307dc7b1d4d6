//! Counters join the caller's transaction: rolled back means not counted.

use std::time::Duration;

use counter_core::{CounterError, Counters};
use counter_tests::{Backend, TestDb, backend_test, counters};
use sea_orm::TransactionTrait;

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "rollback_and_commit"]
    async fn rollback_discards_and_commit_keeps(t: TestDb) {
        let c = counters::<i64>("c", 16);
        c.create_table(&t.db).await.unwrap();

        let txn = t.db.begin().await.unwrap();
        c.add(&txn, 1, "likes", 5).await.unwrap();
        c.add_many(&txn, (0..1_500).map(|o| (o, "views", 1)))
            .await
            .unwrap(); // several statements: a savepoint
        assert_eq!(
            c.get(&txn, 1, "likes").await.unwrap(),
            5,
            "[{}] visible inside",
            t.backend
        );
        txn.rollback().await.unwrap();
        assert_eq!(
            c.get(&t.db, 1, "likes").await.unwrap(),
            0,
            "[{}] rolled back",
            t.backend
        );
        assert_eq!(
            c.get(&t.db, 1_000, "views").await.unwrap(),
            0,
            "[{}] rolled back",
            t.backend
        );

        let txn = t.db.begin().await.unwrap();
        c.increment(&txn, 1, "likes").await.unwrap();
        c.add_many(&txn, (0..1_500).map(|o| (o, "views", 2)))
            .await
            .unwrap();
        txn.commit().await.unwrap();
        assert_eq!(
            c.get(&t.db, 1, "likes").await.unwrap(),
            1,
            "[{}] committed",
            t.backend
        );
        assert_eq!(
            c.get(&t.db, 1_499, "views").await.unwrap(),
            2,
            "[{}] committed",
            t.backend
        );
        t.finish().await;
    }
}

backend_test! {
    /// Two transactions taking two counters in opposite orders deadlock; the
    /// loser gets a typed `Conflict` at once (no retry inside a transaction),
    /// and after its rollback only the winner's deltas count.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "deadlock_in_transaction"]
    #[backends(postgres, mysql)]
    async fn deadlock_inside_a_transaction_is_returned_not_retried(t: TestDb) {
        let c = two_one_slot_counters(&t).await;

        let first = t.db.begin().await.unwrap();
        let second = t.db.begin().await.unwrap();
        c.increment(&first, 1, "a").await.unwrap();
        c.increment(&second, 1, "b").await.unwrap();
        let (c1, c2) = (c.clone(), c.clone());
        // The victim rolls back as soon as it hears (the other waits for its
        // locks until then: on PostgreSQL the counter write ran under a
        // savepoint, whose failure leaves the transaction's earlier locks).
        let one = tokio::spawn(async move {
            let r = c1.increment(&first, 1, "b").await;
            let first = match r {
                Ok(()) => Some(first),
                Err(_) => {
                    first.rollback().await.unwrap();
                    None
                }
            };
            (r, first)
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let two = tokio::spawn(async move {
            let r = c2.increment(&second, 1, "a").await;
            let second = match r {
                Ok(()) => Some(second),
                Err(_) => {
                    second.rollback().await.unwrap();
                    None
                }
            };
            (r, second)
        });
        let (r1, first) = one.await.unwrap();
        let (r2, second) = two.await.unwrap();
        let (won, lost) = match (r1, r2) {
            (Ok(()), Err(e)) => ((first, 2), (second, e)),
            (Err(e), Ok(())) => ((second, 2), (first, e)),
            other => panic!(
                "[{}] expected exactly one deadlock victim, got {other:?}",
                t.backend
            ),
        };
        assert!(
            matches!(
                &lost.1,
                CounterError::Conflict {
                    in_transaction: true,
                    attempts: 1,
                    ..
                }
            ),
            "[{}] {:?}",
            t.backend,
            lost.1
        );
        // The message says it happened in a transaction (what to do is in
        // the variant's docs); the kind says it is worth retrying.
        assert!(lost.1.to_string().contains("in a transaction"), "{}", lost.1);
        assert_eq!(lost.1.kind(), counter_core::ErrorKind::Transient, "{}", lost.1);
        assert!(lost.0.is_none(), "[{}] the victim rolled back", t.backend);
        won.0.unwrap().commit().await.unwrap();
        let a = c.get(&t.db, 1, "a").await.unwrap();
        let b = c.get(&t.db, 1, "b").await.unwrap();
        assert_eq!(a + b, 2 + won.1, "[{}] a={a} b={b}", t.backend);
        t.finish().await;
    }
}

backend_test! {
    /// A deadlock between the caller's transaction and a batch on the pool: the
    /// pool call is never the one that fails (it is retried when PostgreSQL picks
    /// it as the victim), and every committed delta is counted once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "deadlock_on_pool_is_retried"]
    #[backends(postgres, mysql)]
    async fn deadlock_victim_on_the_pool_is_retried(t: TestDb) {
        let c = two_one_slot_counters(&t).await;

        let txn = t.db.begin().await.unwrap();
        c.increment(&txn, 1, "b").await.unwrap();
        // The pool batch locks a, then waits for b (held by txn) ...
        let (pool, batch) = (t.db.clone(), c.clone());
        let on_pool =
            tokio::spawn(async move { batch.add_many(&pool, [(1, "a", 10), (1, "b", 10)]).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        // ... and txn now wants a: a cycle. The batch waited first, so
        // PostgreSQL's deadlock check runs in (and aborts) the batch.
        let in_txn = c.increment(&txn, 1, "a").await;
        let txn_won = in_txn.is_ok();
        if txn_won {
            txn.commit().await.unwrap();
        } else {
            assert!(
                matches!(
                    in_txn,
                    Err(CounterError::Conflict {
                        in_transaction: true,
                        ..
                    })
                ),
                "{in_txn:?}"
            );
            txn.rollback().await.unwrap();
        }
        on_pool
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("[{}] the pool batch failed: {e}", t.backend));
        let expected = if txn_won { 2 + 20 + 2 } else { 2 + 20 };
        let counts = c.get_many(&t.db, &[1], &["a", "b"]).await.unwrap();
        assert_eq!(
            counts[&1]["a"] + counts[&1]["b"],
            expected,
            "[{}] {counts:?}",
            t.backend
        );
        if t.backend == Backend::Postgres {
            assert!(
                txn_won,
                "PostgreSQL aborts the waiter that checks first: the pool batch"
            );
        }
        t.finish().await;
    }
}

/// Counters `a` and `b` of owner 1, each 1, on one slot each, so that two
/// writers can lock them in opposite orders. The servers only (the deadlock
/// tests are registered for them alone): SQLite's one in-memory connection
/// cannot hold two open write transactions.
async fn two_one_slot_counters(t: &TestDb) -> Counters<i64> {
    let c = counters::<i64>("c", 1);
    c.create_table(&t.db).await.unwrap();
    c.add_many(&t.db, [(1, "a", 1), (1, "b", 1)]).await.unwrap();
    c
}
