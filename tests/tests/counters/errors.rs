//! Bad input and missing tables give typed errors, never panics or wrong counts.

use counter_core::{CounterError, CounterTable, Slots};
use counter_tests::{TestDb, backend_test, counters, raw};

fn is_invalid_key<T: std::fmt::Debug>(r: Result<T, CounterError>) -> bool {
    matches!(r, Err(CounterError::InvalidKey { .. }))
}

fn is_overflow<T: std::fmt::Debug>(r: &Result<T, CounterError>) -> bool {
    matches!(r, Err(CounterError::Overflow { .. }))
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "invalid_keys"]
    async fn invalid_keys_are_rejected_before_any_sql(t: TestDb) {
        let huge = "k".repeat(10_000);
        let bad_keys = [
            "",
            "likes'; DROP TABLE c; --",
            "a b",
            "x\0y",
            "\u{430}",
            &huge,
        ];
        let c = counters::<i64>("c", 4);
        c.create_table(&t.db).await.unwrap();
        for key in bad_keys {
            assert!(
                is_invalid_key(c.add(&t.db, 1, key, 1).await),
                "[{}] add {key:?}",
                t.backend
            );
            assert!(
                is_invalid_key(c.get(&t.db, 1, key).await),
                "[{}] get {key:?}",
                t.backend
            );
            assert!(
                is_invalid_key(c.get_many(&t.db, &[1], &["ok", key]).await),
                "[{}] get_many {key:?}",
                t.backend
            );
            assert!(
                is_invalid_key(c.add_many(&t.db, [(1, "ok", 1), (2, key, 1)]).await),
                "[{}] add_many {key:?}",
                t.backend
            );
            let zero_delta = c.add(&t.db, 1, key, 0).await;
            assert!(
                is_invalid_key(zero_delta),
                "[{}] a zero delta still validates",
                t.backend
            );
        }
        let all = c.get_all_keys(&t.db, &[1, 2]).await.unwrap();
        assert!(
            all.values().all(|keys| keys.is_empty()),
            "[{}] a rejected batch wrote rows: {all:?}",
            t.backend
        );
        t.finish().await;
    }
}

#[test]
fn slot_counts_and_table_names_are_checked() {
    for slots in [0i64, -1, 1025, i64::MAX] {
        assert!(
            matches!(Slots::new(slots), Err(CounterError::OutOfRange { value, .. }) if value == i128::from(slots))
        );
        assert!(CounterTable::new("t").unwrap().with_slots(slots).is_err());
        assert!(
            CounterTable::new("t")
                .unwrap()
                .with_key_slots("views", slots)
                .is_err()
        );
    }
    let err = CounterTable::new("t; DROP TABLE posts").unwrap_err();
    assert!(
        matches!(err, CounterError::InvalidTableName { .. }),
        "{err}"
    );
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "overflow"]
    async fn overflow_is_an_error_never_a_wrapped_or_clamped_count(t: TestDb) {
        let c = counters::<i64>("c", 1);
        c.create_table(&t.db).await.unwrap();

        // A slot value leaving the i64 range, both ways.
        c.add(&t.db, 1, "up", i64::MAX).await.unwrap();
        assert!(
            is_overflow(&c.add(&t.db, 1, "up", 1).await),
            "[{}] slot overflow",
            t.backend
        );
        assert_eq!(
            c.get(&t.db, 1, "up").await.unwrap(),
            i64::MAX,
            "[{}] unchanged",
            t.backend
        );
        c.add(&t.db, 1, "down", i64::MIN).await.unwrap();
        assert!(
            is_overflow(&c.decrement(&t.db, 1, "down").await),
            "[{}] slot underflow",
            t.backend
        );
        assert_eq!(c.get(&t.db, 1, "down").await.unwrap(), i64::MIN);

        // A batch whose folded delta overflows is rejected whole.
        let r = c
            .add_many(&t.db, [(2, "k", i64::MAX), (2, "k", 1), (3, "k", 1)])
            .await;
        assert!(is_overflow(&r), "[{}] folded overflow: {r:?}", t.backend);
        assert_eq!(
            c.get_many(&t.db, &[2, 3], &["k"]).await.unwrap()[&3]["k"],
            0
        );

        // Slots that each fit but whose total does not.
        raw::insert_slot(&t.db, "c", 4i64, "sum", 0, i64::MAX).await;
        raw::insert_slot(&t.db, "c", 4i64, "sum", 1, 1).await;
        assert!(
            is_overflow(&c.get(&t.db, 4, "sum").await),
            "[{}] total overflow",
            t.backend
        );
        assert!(
            is_overflow(&c.get_many(&t.db, &[1, 4], &["sum"]).await),
            "[{}] batch total overflow",
            t.backend
        );
        raw::insert_slot(&t.db, "c", 5i64, "sum", 0, i64::MIN).await;
        raw::insert_slot(&t.db, "c", 5i64, "sum", 1, -1).await;
        assert!(
            is_overflow(&c.get(&t.db, 5, "sum").await),
            "[{}] negative total overflow",
            t.backend
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "missing_table"]
    async fn a_missing_table_is_named_and_classified(t: TestDb) {
        let c = counters::<i64>("never_migrated", 4);
        let errors = [
            c.add(&t.db, 1, "likes", 1).await.unwrap_err(),
            c.get(&t.db, 1, "likes").await.unwrap_err(),
            c.add_many(&t.db, [(1, "likes", 1)]).await.unwrap_err(),
        ];
        for err in errors {
            assert!(
                matches!(&err, CounterError::MissingTable { table, .. } if table == "never_migrated"),
                "[{}] {err:?}",
                t.backend
            );
            // One line naming the table; the fix (run the migration) is in
            // the variant's docs, and the kind says what class it is.
            assert_eq!(
                err.to_string(),
                "counter table `never_migrated` does not exist",
                "{err}"
            );
            assert_eq!(err.kind(), counter_core::ErrorKind::SchemaMissing, "{err}");
        }
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "negative_slots"]
    async fn slots_can_go_negative_while_the_total_is_exact(t: TestDb) {
        let c = counters::<i64>("c", 4);
        c.create_table(&t.db).await.unwrap();
        for _ in 0..40 {
            c.increment(&t.db, 7, "score").await.unwrap();
        }
        for _ in 0..100 {
            c.decrement(&t.db, 7, "score").await.unwrap();
        }
        assert_eq!(
            c.get(&t.db, 7, "score").await.unwrap(),
            -60,
            "[{}]",
            t.backend
        );
        let rows = raw::slot_rows(&t.db, "c", 7i64, "score").await;
        assert!(rows.iter().any(|(_, v)| *v < 0), "[{}] {rows:?}", t.backend);
        assert_eq!(rows.iter().map(|(_, v)| v).sum::<i64>(), -60);
        t.finish().await;
    }
}

backend_test! {
    /// A table of the right name but the wrong shape: the database's own error,
    /// passed through unchanged rather than guessed at.
    #[tokio::test(flavor = "multi_thread")]
    #[label = "database_error"]
    async fn other_database_errors_pass_through(t: TestDb) {
        use sea_orm::ConnectionTrait;
        t.db.execute_unprepared(
            "CREATE TABLE wrong_shape (owner_id BIGINT, count_key VARCHAR(64))",
        )
        .await
        .unwrap();
        // A row, so that SQLite cannot answer with an empty result: it reads
        // an unknown "value" column as the string 'value' (its legacy
        // double-quoted-string rule), whose sum is not an integer total.
        t.db.execute_unprepared(
            "INSERT INTO wrong_shape (owner_id, count_key) VALUES (1, 'likes')",
        )
        .await
        .unwrap();
        let c = counters::<i64>("wrong_shape", 4);
        let err = c.add(&t.db, 1, "likes", 1).await.unwrap_err();
        assert!(
            matches!(err, CounterError::Database(_)),
            "[{}] {err:?}",
            t.backend
        );
        let err = c.get(&t.db, 1, "likes").await.unwrap_err();
        assert!(
            matches!(err, CounterError::Database(_)),
            "[{}] {err:?}",
            t.backend
        );
        t.finish().await;
    }
}

backend_test! {
    /// String owners MySQL would merge with another ("a" and "a ") or truncate
    /// (over 255 characters) are refused on every backend, before any SQL.
    #[tokio::test(flavor = "multi_thread")]
    #[label = "invalid_string_owner"]
    async fn string_owners_that_cannot_be_stored_exactly_are_rejected(t: TestDb) {
        let c = counters::<String>("user_counters", 4);
        c.create_table(&t.db).await.unwrap();
        for bad in ["alice ".to_owned(), "x".repeat(256)] {
            let invalid =
                |r: &Result<_, CounterError>| matches!(r, Err(CounterError::InvalidOwner { .. }));
            assert!(
                invalid(&c.add(&t.db, bad.clone(), "likes", 1).await.map(drop)),
                "[{}] add",
                t.backend
            );
            assert!(
                invalid(&c.get(&t.db, bad.clone(), "likes").await.map(drop)),
                "[{}] get",
                t.backend
            );
            let batch = c
                .add_many(
                    &t.db,
                    [("ok".to_owned(), "likes", 1), (bad.clone(), "likes", 1)],
                )
                .await;
            assert!(invalid(&batch.map(drop)), "[{}] add_many", t.backend);
        }
        c.add(&t.db, "x".repeat(255), "likes", 2).await.unwrap();
        assert_eq!(
            c.get(&t.db, "x".repeat(255), "likes").await.unwrap(),
            2,
            "[{}]",
            t.backend
        );
        assert_eq!(
            c.get(&t.db, "ok".to_owned(), "likes").await.unwrap(),
            0,
            "[{}] batch was applied",
            t.backend
        );
        t.finish().await;
    }
}
