//! Unique keys through the write-behind buffer: members merged in memory,
//! sketches flushed by merging, on every backend. A flush sent twice, a
//! member seen by many writers, a read while a flush runs: each member
//! counts once.

use std::{sync::Arc, time::Duration};

use chrono::{Duration as Days, TimeZone, Utc};
use counter_core::{BufferError, CounterBuffer, CounterError, FlushLedger, unique::Sketch};
use counter_tests::{TestDb, backend_test, figures, members_missing, raw, uniques};

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "buffer_unique"]
    async fn sixty_four_writers_on_one_owner_flush_one_sketch(t: TestDb) {
        const WRITERS: usize = 64;
        const EACH: usize = 400;
        FlushLedger::default().create_table(&t.db).await.unwrap();
        let c = Arc::new(uniques("buffer_unique", 4));
        c.create_table(&t.db).await.unwrap();
        let buffer = CounterBuffer::builder(&t.db)
            .interval(Duration::from_millis(20))
            .start()
            .await
            .unwrap();
        // Writers overlap: writer w sees members w*EACH/2 .. w*EACH/2+EACH.
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (c, buffer) = (c.clone(), buffer.clone());
                tokio::spawn(async move {
                    for i in 0..EACH {
                        let member = format!("user:{}", w * EACH / 2 + i);
                        buffer.observe(&c, 1, "viewers", member.as_str()).unwrap();
                        if i % 100 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.await.unwrap();
        }
        let distinct = (WRITERS - 1) * EACH / 2 + EACH;
        let mut union = Sketch::new();
        for i in 0..distinct {
            union.insert(format!("user:{i}").as_str());
        }
        // Read-your-writes before the flush, whatever is in flight.
        assert_eq!(buffer.unique(&c, 1, "viewers").await.unwrap(), union.estimate());
        tokio::time::timeout(Duration::from_secs(60), buffer.flush())
            .await
            .unwrap()
            .unwrap();
        let stored = c.sketch(&t.db, 1, "viewers").await.unwrap();
        assert!(stored.to_bytes() == union.to_bytes(), "the union, once: {stored:?} {union:?}");
        let rows = raw::slot_rows_of(&t.db, "buffer_unique_sketches", 1, "viewers").await;
        assert!(rows <= 4, "a handful of flushes, a handful of rows: {rows}");

        // The same members again, flushed again: nothing changes.
        let before = raw::sketch_bytes(&t.db, "buffer_unique_sketches", 1, "viewers").await;
        for i in 0..distinct {
            buffer.observe(&c, 1, "viewers", format!("user:{i}").as_str()).unwrap();
        }
        buffer.flush().await.unwrap();
        let after = raw::sketch_bytes(&t.db, "buffer_unique_sketches", 1, "viewers").await;
        let merged_after: Vec<u8> = {
            let mut all = Sketch::new();
            for (_, bytes) in &after {
                all.merge(&Sketch::from_bytes(bytes).unwrap());
            }
            all.to_bytes()
        };
        assert!(merged_after == union.to_bytes(), "unchanged by a second flush");
        assert!(after.len() >= before.len());
        let stats = buffer.shutdown().await.unwrap();
        assert_eq!(stats.committed_members, (WRITERS * EACH + distinct) as u64);
        assert_eq!(stats.pending_sketches, 0);
        let err = buffer.observe(&c, 1, "viewers", "late").unwrap_err();
        assert!(matches!(err, CounterError::Buffer(BufferError::Closed)), "{err}");
        figures(
            "buffer_unique",
            t.backend,
            &[
                ("observes", stats.committed_members),
                ("distinct", distinct as u64),
                ("estimate", stored.estimate()),
                ("sketch_flushes", stats.flushed_sketches),
                ("rows", rows as u64),
                (
                    "members_lost",
                    members_missing(&stored, (0..distinct).map(|i| format!("user:{i}")).collect::<Vec<_>>().iter().map(String::as_str)),
                ),
            ],
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "buffer_unique_misuse"]
    async fn buffered_windows_and_wrong_kinds(t: TestDb) {
        FlushLedger::default().create_table(&t.db).await.unwrap();
        let c = uniques("buffer_unique_misuse", 2);
        c.create_table(&t.db).await.unwrap();
        let buffer = CounterBuffer::start(&t.db).await.unwrap();
        let err = buffer.observe(&c, 1, "likes", "ann").unwrap_err();
        assert!(matches!(err, CounterError::WrongKeyKind { .. }), "{err}");
        let err = buffer.add(&c, 1, "viewers", 1).unwrap_err();
        assert!(matches!(err, CounterError::WrongKeyKind { .. }), "{err}");
        for member in ["ann", "bob", "ann"] {
            buffer.observe(&c, 1, "visitors", member).unwrap();
        }
        buffer.flush().await.unwrap();
        let today = Utc::now();
        let day = Utc
            .with_ymd_and_hms(2000, 1, 1, 0, 0, 0)
            .unwrap()
            .max(today - Days::days(1));
        let week = c
            .unique_over(&t.db, 1, "visitors", day, today + Days::days(1))
            .await
            .unwrap();
        assert_eq!(week, 2, "today's bucket");
        assert_eq!(c.unique(&t.db, 1, "visitors").await.unwrap(), 2);
        buffer.shutdown().await.unwrap();
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "buffer_unique_faults"]
    async fn a_missing_table_or_a_bad_row_holds_nothing_else_back(t: TestDb) {
        use counter_core::WhenFull;
        use sea_orm::{
            ConnectionTrait,
            sea_query::{Alias, Query},
        };
        FlushLedger::default().create_table(&t.db).await.unwrap();
        // A table made before its unique key: no sketch table yet.
        let plain = counter_tests::counters::<i64>("buffer_unique_faults", 2);
        plain.create_table(&t.db).await.unwrap();
        let c = uniques("buffer_unique_faults", 2);
        // Flushed only when asked: every step below is deterministic.
        let buffer = CounterBuffer::builder(&t.db)
            .interval(Duration::from_secs(3_600))
            .sketch_capacity(2)
            .when_full(WhenFull::Fail)
            .start()
            .await
            .unwrap();
        buffer.observe(&c, 1, "viewers", "ann").unwrap();
        buffer.add(&plain, 1, "likes", 3).unwrap();
        tokio::time::timeout(Duration::from_secs(60), buffer.flush())
            .await
            .expect("a missing sketch table does not hang the flush")
            .unwrap();
        assert_eq!(plain.get(&t.db, 1, "likes").await.unwrap(), 3, "deltas flushed");
        let stats = buffer.stats();
        assert_eq!(stats.pending_sketches, 1, "{stats:?}");
        assert!(stats.last_error.is_some(), "{stats:?}");
        // Still read by this process while pending.
        let err = buffer.unique(&c, 1, "viewers").await.unwrap_err();
        assert!(matches!(err, CounterError::MissingTable { .. }), "{err}");
        // Full of sketches: refused at once with the sketches' capacity.
        buffer.observe(&c, 2, "viewers", "bob").unwrap();
        let full = buffer.observe(&c, 3, "viewers", "cy").unwrap_err();
        assert!(
            matches!(full, CounterError::Buffer(BufferError::Full { capacity: 2 })),
            "{full}"
        );
        // The migration runs; the next cycles flush what waited.
        c.create_table(&t.db).await.unwrap();
        // Rows that no sketch format reads, in both of owner 2's slots.
        for slot in [0_i16, 1] {
            let bad = Query::insert()
                .into_table(Alias::new("buffer_unique_faults_sketches"))
                .columns(["owner_id", "count_key", "bucket", "slot", "sketch"].map(Alias::new))
                .values_panic([
                    2_i64.into(),
                    "viewers".into(),
                    i64::MIN.into(),
                    slot.into(),
                    vec![0x11_u8, 0x10, 0x00, 0x01].into(),
                ])
                .to_owned();
            t.sql().execute(&bad).await.unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while buffer.stats().pending_sketches > 0 {
            assert!(std::time::Instant::now() < deadline, "{:?}", buffer.stats());
            buffer.flush().await.unwrap();
        }
        assert_eq!(c.unique(&t.db, 1, "viewers").await.unwrap(), 1);
        let stats = buffer.shutdown().await.unwrap();
        assert_eq!(stats.rejected_sketches, 1, "owner 2's sketch set aside: {stats:?}");
        let err = c.unique(&t.db, 2, "viewers").await.unwrap_err();
        assert!(matches!(err, CounterError::BadSketch { .. }), "{err}");
        t.finish().await;
    }
}
