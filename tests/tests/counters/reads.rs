//! Batch reads: one grouped query per chunk, every requested pair zero-filled.

use std::collections::HashMap;

use counter_tests::{TestDb, backend_test, counters};

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "batch_read_100k"]
    async fn batch_read_of_100_000_owners_is_zero_filled(t: TestDb) {
        let c = counters::<i64>("post_counters", 4);
        c.create_table(&t.db).await.unwrap();
        let mut model: HashMap<(i64, &str), i64> = HashMap::new();
        let mut deltas = Vec::new();
        for owner in (0..100_000).step_by(997) {
            for (key, delta) in [("likes", owner % 13 + 1), ("views", -(owner % 5) - 1)] {
                deltas.push((owner, key, delta));
                *model.entry((owner, key)).or_default() += delta;
            }
        }
        c.add_many(&t.db, deltas.clone()).await.unwrap();
        c.add_many(&t.db, deltas.iter().map(|(o, k, d)| (*o, *k, *d)))
            .await
            .unwrap();

        let mut owners: Vec<i64> = (0..100_000).collect();
        owners.extend([5, 5, 997]); // duplicates are fine
        let counts = c
            .get_many(
                &t.db,
                &owners,
                &["likes", "views", "likes", "never_written"],
            )
            .await
            .unwrap();

        assert_eq!(counts.len(), 100_000, "[{}]", t.backend);
        for owner in 0..100_000i64 {
            let keys = &counts[&owner];
            assert_eq!(keys.len(), 3, "[{}] owner {owner}: {keys:?}", t.backend);
            for key in ["likes", "views"] {
                let expected = 2 * model.get(&(owner, key)).copied().unwrap_or(0);
                assert_eq!(keys[key], expected, "[{}] owner {owner} {key}", t.backend);
            }
            assert_eq!(keys["never_written"], 0);
        }
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "batch_write_chunks"]
    async fn batches_fold_duplicates_and_span_several_statements_atomically(t: TestDb) {
        let c = counters::<i64>("c", 4);
        c.create_table(&t.db).await.unwrap();
        // 2,500 distinct counters -> 3 statements in one transaction; the
        // duplicates of owner 0 fold into one row; the net zero is dropped.
        let mut deltas: Vec<(i64, String, i64)> =
            (0..2_500).map(|o| (o, "likes".to_owned(), o + 1)).collect();
        deltas.extend([
            (0, "likes".into(), 10),
            (0, "likes".into(), -3),
            (9_999, "views".into(), 4),
            (9_999, "views".into(), -4),
        ]);
        let outcome = c.add_many(&t.db, deltas).await.unwrap();
        assert_eq!(
            (outcome.rows, outcome.statements),
            (2_500, 3),
            "[{}]",
            t.backend
        );

        let owners: Vec<i64> = (0..2_500).chain([9_999]).collect();
        let counts = c
            .get_many(&t.db, &owners, &["likes", "views"])
            .await
            .unwrap();
        assert_eq!(counts[&0]["likes"], 1 + 10 - 3, "[{}]", t.backend);
        for o in 1..2_500 {
            assert_eq!(counts[&o]["likes"], o + 1, "[{}] owner {o}", t.backend);
        }
        assert_eq!(counts[&9_999]["views"], 0);
        let all = c.get_all_keys(&t.db, &[9_999]).await.unwrap();
        assert!(
            all[&9_999].is_empty(),
            "[{}] a net-zero batch entry wrote a row: {all:?}",
            t.backend
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "all_keys"]
    async fn all_keys_of_owners_for_runtime_keys(t: TestDb) {
        let reactions = counters::<i64>("post_reactions", 4);
        reactions.create_table(&t.db).await.unwrap();
        for (post, reaction, n) in [
            (1, "reaction:heart", 3),
            (1, "reaction:rocket", 1),
            (2, "reaction:heart", -1),
        ] {
            reactions.add(&t.db, post, reaction, n).await.unwrap();
        }
        let all = reactions.get_all_keys(&t.db, &[1, 2, 3]).await.unwrap();
        assert_eq!(
            all[&1],
            HashMap::from([("reaction:heart".into(), 3), ("reaction:rocket".into(), 1)]),
            "[{}]",
            t.backend
        );
        assert_eq!(all[&2], HashMap::from([("reaction:heart".into(), -1)]));
        assert!(all[&3].is_empty());
        assert!(
            reactions
                .get_many(&t.db, &[], &["x"])
                .await
                .unwrap()
                .is_empty()
        );
        let no_keys: [&str; 0] = [];
        assert!(reactions.get_many(&t.db, &[1], &no_keys).await.unwrap()[&1].is_empty());
        t.finish().await;
    }
}

backend_test! {
    /// More keys than half a statement's bind limit: keys are chunked too.
    #[tokio::test(flavor = "multi_thread")]
    #[label = "many_keys"]
    async fn reads_of_40_000_keys_are_chunked(t: TestDb) {
        let c = counters::<i64>("c", 2);
        c.create_table(&t.db).await.unwrap();
        let keys: Vec<String> = (0..40_000).map(|n| format!("flag:{n}")).collect();
        c.add_many(
            &t.db,
            [(1, "flag:0", 1), (2, "flag:39999", 2), (3, "flag:20000", 3)],
        )
        .await
        .unwrap();
        let counts = c.get_many(&t.db, &[1, 2, 3], &keys).await.unwrap();
        assert!(
            counts.values().all(|k| k.len() == 40_000),
            "[{}]",
            t.backend
        );
        assert_eq!(counts[&1]["flag:0"], 1, "[{}]", t.backend);
        assert_eq!(counts[&2]["flag:39999"], 2, "[{}]", t.backend);
        assert_eq!(counts[&3]["flag:20000"], 3, "[{}]", t.backend);
        assert_eq!(
            counts.values().flat_map(|k| k.values()).sum::<i64>(),
            6,
            "[{}]",
            t.backend
        );
        t.finish().await;
    }
}
