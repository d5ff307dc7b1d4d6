//! Owners keyed by i32, Uuid and String work like i64 ones.

use std::{fmt::Debug, hash::Hash};

use counter_core::{CounterTable, Counters, OwnerId};
use counter_tests::{TestDb, backend_test};

async fn exercise<I: OwnerId>(t: &TestDb, table: &str, a: I, b: I) {
    let c = Counters::<I>::new(
        CounterTable::new(table.to_owned())
            .unwrap()
            .with_slots(8)
            .unwrap(),
    );
    c.create_table(&t.db).await.unwrap();
    c.add(&t.db, a.clone(), "likes", 3).await.unwrap();
    c.decrement(&t.db, a.clone(), "likes").await.unwrap();
    c.add_many(
        &t.db,
        [
            (b.clone(), "likes", 5),
            (a.clone(), "views", 7),
            (b.clone(), "likes", 1),
        ],
    )
    .await
    .unwrap();
    assert_eq!(
        c.get(&t.db, a.clone(), "likes").await.unwrap(),
        2,
        "[{}] {table}",
        t.backend
    );
    let counts = c
        .get_many(&t.db, &[a.clone(), b.clone()], &["likes", "views"])
        .await
        .unwrap();
    assert_eq!(counts[&a]["views"], 7, "[{}] {table}", t.backend);
    assert_eq!(counts[&b]["likes"], 6, "[{}] {table}", t.backend);
    assert_eq!(counts[&b]["views"], 0, "[{}] {table}", t.backend);
    let all = c
        .get_all_keys(&t.db, std::slice::from_ref(&a))
        .await
        .unwrap();
    assert_eq!(all[&a].len(), 2, "[{}] {table}: {all:?}", t.backend);
}

fn pair<T: Clone + Debug + Eq + Hash>(a: T, b: T) -> (T, T) {
    (a, b)
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "owner_types"]
    async fn every_supported_owner_key_type(t: TestDb) {
        let (a, b) = pair(1i32, i32::MAX);
        exercise(&t, "i32_counters", a, b).await;
        let (a, b) = pair(i64::MIN, i64::MAX);
        exercise(&t, "i64_counters", a, b).await;
        let (a, b) = pair(uuid::Uuid::new_v4(), uuid::Uuid::nil());
        exercise(&t, "uuid_counters", a, b).await;
        let (a, b) = pair("alice".to_owned(), "Zoë 🚀 o'brien".to_owned());
        exercise(&t, "string_counters", a, b).await;
        t.finish().await;
    }
}

backend_test! {
    /// String owners compare byte-wise on every backend, MySQL included (whose
    /// default collations would merge "Alice" and "alice", and so their counts).
    #[tokio::test(flavor = "multi_thread")]
    #[label = "case_sensitive"]
    async fn string_owners_and_keys_are_case_sensitive_everywhere(t: TestDb) {
        let c = Counters::<String>::new(CounterTable::new("user_counters").unwrap());
        c.create_table(&t.db).await.unwrap();
        c.add(&t.db, "Alice".into(), "likes", 1).await.unwrap();
        c.add(&t.db, "alice".into(), "likes", 10).await.unwrap();
        c.add(&t.db, "alice".into(), "Likes", 100).await.unwrap();
        let counts = c
            .get_many(
                &t.db,
                &["Alice".into(), "alice".into()],
                &["likes", "Likes"],
            )
            .await
            .unwrap();
        assert_eq!(counts["Alice"]["likes"], 1, "[{}] {counts:?}", t.backend);
        assert_eq!(counts["alice"]["likes"], 10, "[{}] {counts:?}", t.backend);
        assert_eq!(counts["alice"]["Likes"], 100, "[{}] {counts:?}", t.backend);
        t.finish().await;
    }
}
