//! `reset`: one counter of some owners back to zero (its total, its time
//! buckets, or a unique key's sketches), and nothing else; adds racing it
//! are either erased with it or counted from zero, never lost once the
//! reset returned.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use chrono::{DateTime, TimeZone, Utc};
use counter_core::{CounterError, CounterTable, Counters, Window};
use counter_tests::{TestDb, backend_test, figures};

fn day(d: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, d, 12, 0, 0).unwrap()
}

fn table(name: &str) -> Counters<i64> {
    let table = CounterTable::new(name.to_owned())
        .and_then(|t| t.with_slots(8))
        .and_then(|t| t.with_key_window("views", Window::Day))
        .and_then(|t| t.with_unique_key("viewers"));
    Counters::new(table.expect("a valid table"))
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 8)]
    #[label = "counter_reset"]
    async fn a_reset_sets_one_counter_to_zero_and_nothing_else(t: TestDb) {
        let c = table("resets");
        c.create_table(&t.db).await.unwrap();
        let db = &t.db;
        for owner in [1_i64, 2, 3] {
            for _ in 0..5 {
                c.add(db, owner, "likes", 1).await.unwrap(); // over several slots
            }
            c.add_at(db, owner, "views", 3, day(2)).await.unwrap();
            c.add_at(db, owner, "views", 4, day(3)).await.unwrap();
            for member in ["ann", "bob", "cy"] {
                c.observe(db, owner, "viewers", member).await.unwrap();
            }
        }
        let likes_rows = c.reset(db, &[1, 2], "likes").await.unwrap();
        assert!(likes_rows >= 2, "[{}] {likes_rows}", t.backend);
        let likes = c.get_many(db, &[1, 2, 3], &["likes"]).await.unwrap();
        assert_eq!([likes[&1]["likes"], likes[&2]["likes"], likes[&3]["likes"]], [0, 0, 5]);
        // A windowed key loses its buckets with its total.
        let views_rows = c.reset(db, &[1], "views").await.unwrap();
        assert!(views_rows >= 3, "[{}] total and two buckets: {views_rows}", t.backend);
        assert_eq!(c.get(db, 1, "views").await.unwrap(), 0);
        assert_eq!(c.range(db, 1, "views", day(1), day(5)).await.unwrap(), 0);
        assert_eq!(c.range(db, 2, "views", day(1), day(5)).await.unwrap(), 7);
        assert_eq!(c.get(db, 1, "likes").await.unwrap(), 0, "likes stays reset");
        // A unique key: its sketches.
        let sketch_rows = c.reset_unique(db, &[2], "viewers").await.unwrap();
        assert!(sketch_rows >= 1, "[{}] {sketch_rows}", t.backend);
        assert_eq!(c.unique(db, 2, "viewers").await.unwrap(), 0);
        assert_eq!(c.unique(db, 1, "viewers").await.unwrap(), 3);
        assert_eq!(c.unique(db, 3, "viewers").await.unwrap(), 3);
        // Counting starts again from zero.
        c.add(db, 1, "likes", 2).await.unwrap();
        assert_eq!(c.get(db, 1, "likes").await.unwrap(), 2);
        // Wrong kinds and bad keys: typed errors, nothing deleted.
        let wrong = c.reset(db, &[3], "viewers").await.unwrap_err();
        assert!(matches!(wrong, CounterError::WrongKeyKind { .. }), "{wrong}");
        let wrong = c.reset_unique(db, &[3], "likes").await.unwrap_err();
        assert!(matches!(wrong, CounterError::WrongKeyKind { .. }), "{wrong}");
        let bad = c.reset(db, &[3], "").await.unwrap_err();
        assert!(matches!(bad, CounterError::InvalidKey { .. }), "{bad}");
        assert_eq!(c.get(db, 3, "likes").await.unwrap(), 5);
        assert_eq!(c.reset(db, &[], "likes").await.unwrap(), 0);

        // 8 writers add to owner 9 while it is reset: an add that started
        // after the reset returned is always counted, and the total is
        // never more than the adds.
        const WRITERS: u64 = 8;
        const ADDS: u64 = 150;
        let after_reset = Arc::new(AtomicU64::new(0));
        let reset_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let writers: Vec<_> = (0..WRITERS)
            .map(|_| {
                let (c, db) = (c.clone(), t.db.clone());
                let (after_reset, reset_done, done) = (after_reset.clone(), reset_done.clone(), done.clone());
                tokio::spawn(async move {
                    for _ in 0..ADDS {
                        let after = reset_done.load(Ordering::SeqCst);
                        c.add(&db, 9, "likes", 1).await.unwrap();
                        if after {
                            after_reset.fetch_add(1, Ordering::Relaxed);
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let wait = std::time::Instant::now();
        while done.load(Ordering::Relaxed) < WRITERS * ADDS / 3 {
            assert!(wait.elapsed() < std::time::Duration::from_secs(60), "the writers did not start");
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        let raced_rows = c.reset(db, &[9], "likes").await.unwrap();
        reset_done.store(true, Ordering::SeqCst);
        for writer in writers {
            writer.await.unwrap();
        }
        let total = c.get(db, 9, "likes").await.unwrap() as u64;
        let after = after_reset.load(Ordering::Relaxed);
        figures(
            "counter_reset",
            t.backend,
            &[
                ("likes_rows", likes_rows),
                ("views_rows", views_rows),
                ("sketch_rows", sketch_rows),
                ("raced_rows", raced_rows),
                ("adds", WRITERS * ADDS),
                ("adds_after_reset", after),
                ("total_after", total),
                ("lost", after.saturating_sub(total)),
            ],
        );
        assert!(raced_rows >= 1, "[{}] the reset found rows to delete", t.backend);
        assert!(after > 0, "[{}] no add ran after the reset", t.backend);
        assert!(
            (after..=WRITERS * ADDS).contains(&total),
            "[{}] total {total}: {after} adds started after the reset",
            t.backend
        );
        t.finish().await;
    }
}
