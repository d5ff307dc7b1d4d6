//! No total ever leaves `i64`: an add that would take a counter's total out
//! of range is refused with `Overflow`, nothing written, while its slots
//! each still fit; adds far from the limit keep their one upsert, and adds
//! near it stay exact under concurrency (RELIABILITY.md 47).

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use counter_core::{Compact, CounterError, CounterTable, Counters, DeltaBatch, ErrorKind, Window};
use counter_tests::{TestDb, backend_test, counters, figures, raw};
use sea_orm::TransactionTrait;

fn is_overflow<T: std::fmt::Debug>(r: &Result<T, CounterError>) -> bool {
    matches!(r, Err(e) if e.kind() == ErrorKind::Overflow)
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "overflow_totals"]
    async fn a_total_never_leaves_i64(t: TestDb) {
        let b = t.backend;
        let c = counters::<i64>("ovf", 16);
        c.create_table(&t.db).await.unwrap();
        c.add(&t.db, 2, "likes", 5).await.unwrap();

        // The reproduction of issue 39: two adds of i64::MAX land on two
        // slots that each fit. The first is the whole range; the second is
        // refused and the counter stays readable, with its neighbours.
        c.add(&t.db, 1, "likes", i64::MAX).await.unwrap();
        let second = c.add(&t.db, 1, "likes", i64::MAX).await;
        assert!(is_overflow(&second), "[{b}] {second:?}");
        let message = second.unwrap_err().to_string();
        assert!(message.contains("`likes` of owner 1"), "[{b}] {message}");
        assert_eq!(c.get(&t.db, 1, "likes").await.unwrap(), i64::MAX, "[{b}]");
        let page = c.get_many(&t.db, &[1, 2], &["likes"]).await.unwrap();
        assert_eq!((page[&1]["likes"], page[&2]["likes"]), (i64::MAX, 5), "[{b}]");
        assert!(is_overflow(&c.increment(&t.db, 1, "likes").await), "[{b}]");
        // Down again, then up by what is left: exactly i64::MAX once more.
        c.add(&t.db, 1, "likes", -10).await.unwrap();
        c.add(&t.db, 1, "likes", 10).await.unwrap();
        assert_eq!(c.get(&t.db, 1, "likes").await.unwrap(), i64::MAX, "[{b}]");

        // The other way: i64::MIN, then -1.
        c.add(&t.db, 3, "likes", i64::MIN).await.unwrap();
        assert!(is_overflow(&c.add(&t.db, 3, "likes", -1).await), "[{b}]");
        assert_eq!(c.get(&t.db, 3, "likes").await.unwrap(), i64::MIN, "[{b}]");

        // A batch with one counter that would leave i64: refused whole.
        let batch = c
            .add_many(&t.db, [(1, "likes", 1), (2, "likes", 1), (4, "likes", 1)])
            .await;
        assert!(is_overflow(&batch), "[{b}] {batch:?}");
        let page = c.get_many(&t.db, &[1, 2, 4], &["likes"]).await.unwrap();
        assert_eq!(
            (page[&1]["likes"], page[&2]["likes"], page[&4]["likes"]),
            (i64::MAX, 5, 0),
            "[{b}] nothing of the refused batch was written"
        );

        // In the caller's transaction: a refusal leaves it usable (on
        // PostgreSQL too), and an add that crosses the slot cap without
        // leaving i64 is settled inside it.
        let txn = t.db.begin().await.unwrap();
        assert!(is_overflow(&c.add(&txn, 1, "likes", 1).await), "[{b}] in a transaction");
        c.add(&txn, 5, "likes", i64::MAX / 3).await.unwrap();
        c.add(&txn, 5, "likes", i64::MAX / 3).await.unwrap();
        c.add(&txn, 2, "likes", 1).await.unwrap();
        txn.commit().await.unwrap();
        let page = c.get_many(&t.db, &[2, 5], &["likes"]).await.unwrap();
        assert_eq!((page[&2]["likes"], page[&5]["likes"]), (6, i64::MAX / 3 * 2), "[{b}]");

        // A windowed key: the total and its bucket refused together.
        let w = Counters::<i64>::new(
            CounterTable::new("ovf_w")
                .and_then(|t| t.with_slots(4))
                .and_then(|t| t.with_key_window("views", Window::Day))
                .unwrap(),
        );
        w.create_table(&t.db).await.unwrap();
        w.add(&t.db, 1, "views", i64::MAX - 1).await.unwrap();
        assert!(is_overflow(&w.add(&t.db, 1, "views", 2).await), "[{b}] windowed");
        w.increment(&t.db, 1, "views").await.unwrap();
        assert_eq!(w.get(&t.db, 1, "views").await.unwrap(), i64::MAX, "[{b}]");

        // Compaction keeps a total near the limit spread (one slot would
        // pass the cap) and folds the others; every total unchanged.
        c.compact(&t.db, &Compact::new()).await.unwrap();
        let page = c.get_many(&t.db, &[1, 2, 3, 5], &["likes"]).await.unwrap();
        assert_eq!(
            [1, 2, 3, 5].map(|o| page[&o]["likes"]),
            [i64::MAX, 6, i64::MIN, i64::MAX / 3 * 2],
            "[{b}] after compaction"
        );
        assert!(is_overflow(&c.increment(&t.db, 1, "likes").await), "[{b}] after compaction");

        // A counter put out of range by hand (direct SQL): its read names it.
        raw::insert_slot(&t.db, "ovf", 9i64, "hand", 0, i64::MAX).await;
        raw::insert_slot(&t.db, "ovf", 9i64, "hand", 1, 1).await;
        let read = c.get_many(&t.db, &[2, 9], &["likes", "hand"]).await;
        assert!(is_overflow(&read), "[{b}] {read:?}");
        let message = read.unwrap_err().to_string();
        assert!(message.contains("`hand` of owner 9"), "[{b}] {message}");
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "overflow_concurrency"]
    async fn adds_near_the_limit_are_exact_under_concurrency(t: TestDb) {
        let b = t.backend;
        let c = counters::<i64>("ovf_race", 8);
        c.create_table(&t.db).await.unwrap();
        // Room for exactly ROOM more; WRITERS × EACH adds of 1 race for it,
        // with a second counter far from the limit written beside it.
        const ROOM: u64 = 150;
        const WRITERS: u64 = 6;
        const EACH: u64 = 40;
        c.add(&t.db, 1, "near", i64::MAX - ROOM as i64).await.unwrap();
        let (ok, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut tasks = Vec::new();
        for w in 0..WRITERS {
            let (db, c, ok, refused) = (t.db.clone(), c.clone(), ok.clone(), refused.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..EACH {
                    // A conflict the pool's retries could not resolve is
                    // tried again: every add ends applied or refused.
                    let mut tries = 0;
                    let result = loop {
                        tries += 1;
                        let result = if (w + i) % 3 == 0 {
                            let mut batch = DeltaBatch::new();
                            batch.add(&c, 1, "near", 1).unwrap();
                            batch.add(&c, 2, "far", 1).unwrap();
                            batch.apply(&db).await.map(drop)
                        } else {
                            c.add(&db, 1, "near", 1).await
                        };
                        match result {
                            Err(e) if e.kind() == ErrorKind::Transient && tries < 50 => continue,
                            result => break result,
                        }
                    };
                    match result {
                        Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                        Err(e) if e.kind() == ErrorKind::Overflow => {
                            refused.fetch_add(1, Ordering::Relaxed)
                        }
                        Err(e) => panic!("[{w}] {e:?}"),
                    };
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let (ok, refused) = (ok.load(Ordering::Relaxed), refused.load(Ordering::Relaxed));
        let near = c.get(&t.db, 1, "near").await.unwrap();
        let far = c.get(&t.db, 2, "far").await.unwrap();
        assert_eq!(ok, ROOM, "[{b}] every add that fit was applied, no more");
        assert_eq!(near, i64::MAX, "[{b}]");
        assert!(refused > 0, "[{b}] some adds were refused");
        assert!(far <= ok as i64, "[{b}] the refused batches wrote nothing: far={far}");
        let lost = (i64::MAX - ROOM as i64 + ok as i64).abs_diff(near);
        figures(
            "overflow_concurrency",
            b,
            &[("adds", WRITERS * EACH), ("applied", ok), ("refused", refused), ("increments_lost", lost)],
        );
        t.finish().await;
    }
}
