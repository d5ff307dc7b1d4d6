//! `#[derive(SlottedCounter)]` on entities of every supported owner type, in
//! both entity formats, with per-key slots, `slot_strategy` and `cascade`: every
//! generated item, on every configured backend.

use std::{collections::HashSet, fmt::Debug};

use counter_core::{CountSet, CounterError, CounterKey, KeySet, SlotStrategy, prelude::*};
use counter_tests::{TestDb, backend_test, raw, sql};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, Schema, Set,
};
use sea_orm_migration::MigrationTrait;

/// An `i32` owner, with every default: table `tags_counters`, 16 slots.
mod tag {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "tags")]
    #[counter(keys(uses, follows))]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i32,
        pub name: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// A `Uuid` owner, with a table-wide and a per-key slot count.
mod account {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "accounts")]
    #[counter(keys(logins, failed_logins(slots = 2)), slots = 4)]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: Uuid,
        pub email: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// A `String` owner under another field name, a named table, and a key
/// that is a Rust keyword.
mod page {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "pages")]
    #[counter(keys(views, shares, r#ref), table = "page_stats")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub slug: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// The dense format: `#[sea_orm::model]` copies the derive onto `ModelEx`.
mod video {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[sea_orm::model]
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "videos")]
    #[counter(keys(plays, likes(slots = 4), shares(slots = adaptive(1..=64))), slots = 32)]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub title: String,
    }

    impl ActiveModelBehavior for ActiveModel {}
}

/// `cascade`: deleting a category deletes its counters.
mod category {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "categories")]
    #[counter(keys(items), cascade)]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i32,
        pub name: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// `slot_strategy = "random"`; the other entities keep counter-core's default.
mod poll {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "polls")]
    #[counter(keys(votes), slots = 4, slot_strategy = "random")]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// Odd but valid input: keys that are keywords (`type`, and `gen` in edition
/// 2024), a key and a primary-key field whose UpperCamelCase is `Self`, a
/// primary-key type passed through `macro_rules!`, with `cascade`.
macro_rules! odd_entity {
    ($owner:ty) => {
        mod odd {
            use counter_core::SlottedCounter;
            use sea_orm::entity::prelude::*;

            #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
            #[sea_orm(table_name = "odd_owners")]
            #[counter(keys(type, self_, gen), cascade)]
            pub struct Model {
                #[sea_orm(primary_key)]
                pub self_: $owner,
            }

            #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
            pub enum Relation {}

            impl ActiveModelBehavior for ActiveModel {}
        }
    };
}
odd_entity!(i64);

/// Every generated method of `E`, on three models' owners `a`, `b`, `c`.
async fn exercise<E>(t: &TestDb, models: [E::Model; 3])
where
    E: SlottedCounter,
    E::Model: PartialEq + Debug,
{
    let what = format!("[{}] {}", t.backend, std::any::type_name::<E>());
    E::counters().create_table(&t.db).await.unwrap();
    let [a, b, c] = [0, 1, 2].map(|i| E::owner_id(&models[i]));
    let all = E::Key::ALL;
    let (first, last) = (all[0], all[all.len() - 1]);

    for &key in all {
        E::counters()
            .increment(&t.db, a.clone(), key)
            .await
            .unwrap();
        E::counters().add(&t.db, a.clone(), key, 10).await.unwrap();
        E::counters()
            .decrement(&t.db, a.clone(), key)
            .await
            .unwrap();
    }
    let outcome = E::counters()
        .add_many(
            &t.db,
            [
                (b.clone(), first, 5),
                (b.clone(), first, 2),
                (c.clone(), last, -3),
                (c.clone(), first, 0),
            ],
        )
        .await
        .unwrap();
    assert_eq!(outcome.rows, 2, "{what}: folded and net zeros dropped");

    for &key in all {
        assert_eq!(
            E::counters().get(&t.db, a.clone(), key).await.unwrap(),
            10,
            "{what} {key:?}"
        );
    }
    let counts_a = E::counters().counts(&t.db, a.clone()).await.unwrap();
    for &key in all {
        assert_eq!(counts_a.get(key), 10, "{what} {key:?}");
    }

    let many = E::counters()
        .counts_many(&t.db, &[a.clone(), b.clone(), c.clone(), a.clone()])
        .await
        .unwrap();
    assert_eq!(many.len(), 3, "{what}");
    assert_eq!(many[&a], counts_a, "{what}");
    let mut expected_b = E::Counts::default();
    expected_b.set(first, 7);
    assert_eq!(many[&b], expected_b, "{what}");
    assert_eq!(many[&c].get(last), -3, "{what}");

    let paired = E::counters()
        .load_counts(&t.db, models.clone())
        .await
        .unwrap();
    let (page, counts): (Vec<_>, Vec<_>) = paired.into_iter().unzip();
    assert_eq!(page, models.to_vec(), "{what}: order kept");
    assert_eq!(counts, [&a, &b, &c].map(|o| many[o].clone()), "{what}");

    let by_name = E::counters()
        .get_many(&t.db, &[a.clone(), b.clone()], all)
        .await
        .unwrap();
    assert_eq!(by_name[&b].get(first), 7, "{what}");

    // The dynamic handle: a runtime key in the same table, beside the typed ones.
    E::counters()
        .untyped()
        .add(&t.db, a.clone(), "reaction:tada", 4)
        .await
        .unwrap();
    let everything = E::counters()
        .get_all_keys(&t.db, std::slice::from_ref(&a))
        .await
        .unwrap();
    let keys: HashSet<&str> = everything[&a].keys().map(String::as_str).collect();
    let mut expected: HashSet<&str> = all.iter().map(|k| k.as_key_str()).collect();
    expected.insert("reaction:tada");
    assert_eq!(keys, expected, "{what}");
    assert_eq!(everything[&a]["reaction:tada"], 4, "{what}");
    assert_eq!(
        E::counters().counts(&t.db, a.clone()).await.unwrap(),
        counts_a,
        "{what}"
    );

    // No owners: no query, no error.
    assert!(
        E::counters()
            .counts_many(&t.db, &[])
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        E::counters()
            .load_counts(&t.db, Vec::new())
            .await
            .unwrap()
            .is_empty()
    );
}

/// `CREATE TABLE` from an entity definition, as `Schema` builds it.
async fn create_from_entity<E: EntityTrait>(t: &TestDb, entity: E) {
    let schema = Schema::new(t.db.get_database_backend());
    t.sql()
        .execute(&schema.create_table_from_entity(entity))
        .await
        .unwrap();
}

fn tags() -> [tag::Model; 3] {
    [1, 2, 3].map(|id| tag::Model {
        id,
        name: format!("tag {id}"),
    })
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "derive_i32_owner"]
    async fn i32_owner(t: TestDb) {
        exercise::<tag::Entity>(&t, tags()).await;
        assert_eq!(tag::counters::TABLE, "tags_counters");
        assert_eq!(tag::Entity::counters().table().slots().get(), 16);
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "derive_uuid_owner"]
    async fn uuid_owner_with_per_key_slots(t: TestDb) {
        use account::counters::Key;
        let accounts = [1, 2, 3].map(|i| account::Model {
            id: uuid::Uuid::new_v4(),
            email: format!("user{i}@example.com"),
        });
        exercise::<account::Entity>(&t, accounts.clone()).await;

        // 200 single writes spread over every slot a key has, and no more
        // (a batch would fold them into one row).
        let owner = accounts[0].id;
        for key in [Key::Logins, Key::FailedLogins] {
            for _ in 0..200 {
                account::Entity::counters()
                    .increment(&t.db, owner, key)
                    .await
                    .unwrap();
            }
        }
        for (key, slots) in [(Key::Logins, 4), (Key::FailedLogins, 2)] {
            let rows = raw::slot_rows(&t.db, account::counters::TABLE, owner, key.as_str()).await;
            let used: HashSet<i16> = rows.iter().map(|(slot, _)| *slot).collect();
            assert_eq!(used.len(), slots, "[{}] {key} used {used:?}", t.backend);
            assert!(used.iter().all(|s| (0..slots as i16).contains(s)));
            let total: i64 = rows.iter().map(|(_, v)| v).sum();
            assert_eq!(total, 210, "[{}] {key}", t.backend);
        }
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "derive_string_owner"]
    async fn string_owner_named_table_keyword_key(t: TestDb) {
        let pages = ["home", "about/us", "Home"].map(|slug| page::Model { slug: slug.into() });
        exercise::<page::Entity>(&t, pages).await;
        assert_eq!(page::counters::TABLE, "page_stats");
        let counts = page::Entity::counters()
            .counts(&t.db, "home".to_owned())
            .await
            .unwrap();
        assert_eq!(counts.r#ref, 10, "[{}]", t.backend);
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "derive_dense"]
    async fn dense_format_entity(t: TestDb) {
        let videos = [1, 2, 3].map(|id| video::Model {
            id,
            title: format!("video {id}"),
        });
        // `ModelEx` exists beside `Model` and got no second set of items.
        let ex: video::ModelEx = videos[0].clone().into();
        assert_eq!(ex.id, 1);
        exercise::<video::Entity>(&t, videos).await;
        assert_eq!(
            video::Entity::counters().table().slots_for("likes").get(),
            4
        );
        assert_eq!(
            video::Entity::counters().table().slots_for("plays").get(),
            32
        );
        // An adaptive key: one row while its writes come one at a time.
        let shares = video::counters::Key::Shares;
        assert_eq!(
            video::Entity::counters()
                .table()
                .slot_policy_for(shares.as_str()),
            counter_core::SlotPolicy::adaptive(1..=64).unwrap()
        );
        // An owner of this backend's own: a counter's heat is the
        // process's, by table, owner and key, and the three backends' runs
        // of this test write at once in one process (CI: 62 and 63 rows).
        let owner: i64 = match t.backend {
            counter_tests::Backend::Sqlite => 9,
            counter_tests::Backend::Postgres => 10,
            counter_tests::Backend::MySql => 11,
        };
        for _ in 0..100 {
            video::Entity::counters()
                .increment(&t.db, owner, shares)
                .await
                .unwrap();
        }
        let rows = raw::slot_rows(&t.db, video::counters::TABLE, owner, "shares").await;
        assert_eq!(rows, [(0, 100)], "[{}]", t.backend);
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "derive_slot_strategy"]
    async fn slot_strategy_option(t: TestDb) {
        use poll::counters::Key;
        let table = poll::Entity::counters().table();
        assert_eq!(table.slot_strategy(), SlotStrategy::Random);
        assert_eq!(
            tag::Entity::counters().table().slot_strategy(),
            SlotStrategy::Rotating
        );

        poll::Entity::counters().create_table(&t.db).await.unwrap();
        for _ in 0..40 {
            poll::Entity::counters()
                .increment(&t.db, 1, Key::Votes)
                .await
                .unwrap();
        }
        poll::Entity::counters()
            .add_many(&t.db, [(1, Key::Votes, 2), (2, Key::Votes, 3)])
            .await
            .unwrap();
        let rows = raw::slot_rows(&t.db, poll::counters::TABLE, 1, "votes").await;
        assert!(
            rows.iter().all(|(slot, _)| (0..4).contains(slot)),
            "{rows:?}"
        );
        assert_eq!(
            rows.iter().map(|(_, v)| v).sum::<i64>(),
            42,
            "[{}]",
            t.backend
        );
        let many = poll::Entity::counters()
            .counts_many(&t.db, &[1, 2])
            .await
            .unwrap();
        assert_eq!((many[&1].votes, many[&2].votes), (42, 3), "[{}]", t.backend);
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "derive_cascade"]
    async fn cascade_deletes_counters_with_their_owner(t: TestDb) {
        use category::counters::Key;
        create_from_entity(&t, category::Entity).await;
        // The generated migration, run as a Migrator would run it.
        let manager = sql::schema(&t.db).await;
        category::Entity::counters()
            .migration()
            .up(&manager)
            .await
            .unwrap();
        sql::done(manager).await;

        let mut ids = Vec::new();
        for name in ["books", "games"] {
            let row = category::ActiveModel {
                name: Set(name.into()),
                ..Default::default()
            }
            .insert(&t.sql())
            .await
            .unwrap();
            category::Entity::counters()
                .add(&t.db, row.id, Key::Items, 5)
                .await
                .unwrap();
            ids.push(row.id);
        }
        category::Entity::delete_by_id(ids[0])
            .exec(&t.sql())
            .await
            .unwrap();
        let left = category::counters::Entity::find()
            .all(&t.sql())
            .await
            .unwrap();
        assert!(
            left.iter().all(|row| row.owner_id == ids[1]) && !left.is_empty(),
            "[{}] {left:?}",
            t.backend
        );
        assert_eq!(
            category::Entity::counters()
                .counts(&t.db, ids[1])
                .await
                .unwrap()
                .items,
            5
        );

        // The reference is enforced: no counters for an owner that does not exist.
        let orphan = category::Entity::counters()
            .increment(&t.db, 9999, Key::Items)
            .await;
        assert!(
            matches!(orphan, Err(CounterError::Database(_))),
            "[{}] {orphan:?}",
            t.backend
        );

        let manager = sql::schema(&t.db).await;
        category::Entity::counters()
            .migration()
            .down(&manager)
            .await
            .unwrap();
        sql::done(manager).await;
        assert!(
            matches!(
                category::Entity::counters().counts(&t.db, ids[1]).await,
                Err(CounterError::MissingTable { .. })
            ),
            "[{}]",
            t.backend
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "derive_companion_entity"]
    async fn companion_is_a_seaorm_entity(t: TestDb) {
        use tag::counters::{self, Column};
        // Created from the entity definition alone, then used by the counters.
        create_from_entity(&t, counters::Entity).await;
        tag::Entity::counters()
            .add_many(
                &t.db,
                (0..50).map(|i| (1 + i % 2, counters::Key::Uses, 1 + i64::from(i % 3))),
            )
            .await
            .unwrap();
        tag::Entity::counters()
            .increment(&t.db, 1, counters::Key::Follows)
            .await
            .unwrap();

        let rows = counters::Entity::find()
            .filter(Column::OwnerId.eq(1))
            .filter(Column::CountKey.eq(counters::Key::Uses.as_str()))
            .all(&t.sql())
            .await
            .unwrap();
        let summed: i64 = rows.iter().map(|r| r.value).sum();
        let read = tag::Entity::counters()
            .get(&t.db, 1, counters::Key::Uses)
            .await
            .unwrap();
        assert_eq!(summed, read, "[{}]", t.backend);
        assert!(rows.iter().all(|r| (0..16).contains(&r.slot)));
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "derive_odd_names"]
    async fn keyword_keys_and_self_named_fields(t: TestDb) {
        use odd::counters::{Counts, Key};
        assert_eq!(Key::NAMES, ["type", "self_", "gen"]);
        assert_eq!(Key::Self_.as_str(), "self_");
        create_from_entity(&t, odd::Entity).await;
        let manager = sql::schema(&t.db).await;
        odd::Entity::counters()
            .migration()
            .up(&manager)
            .await
            .unwrap();
        sql::done(manager).await;
        odd::ActiveModel { self_: Set(5) }
            .insert(&t.sql())
            .await
            .unwrap();
        odd::Entity::counters()
            .add_many(
                &t.db,
                [(5, Key::Type, 1), (5, Key::Self_, 2), (5, Key::Gen, 3)],
            )
            .await
            .unwrap();
        let counts = odd::Entity::counters().counts(&t.db, 5).await.unwrap();
        let expected = Counts {
            r#type: 1,
            self_: 2,
            r#gen: 3,
        };
        assert_eq!(counts, expected, "[{}]", t.backend);
        t.finish().await;
    }
}

#[test]
fn key_enum() {
    use page::counters::Key;
    assert_eq!(Key::ALL, [Key::Views, Key::Shares, Key::Ref]);
    assert_eq!(Key::NAMES, ["views", "shares", "ref"]);
    assert_eq!(<Key as KeySet>::ALL, &Key::ALL);
    for key in Key::ALL {
        assert_eq!(key.as_str().parse::<Key>().unwrap(), key);
        assert_eq!(key.to_string(), key.as_str());
        assert_eq!(key.as_key_str(), key.as_str());
    }
    let err = "View".parse::<Key>().unwrap_err();
    assert!(matches!(err, CounterError::UnknownKey { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        r#"unknown counter key "View": expected one of views, shares, ref"#
    );
}

#[test]
fn counts_struct_and_serde() {
    use page::counters::{Counts, Key};
    let mut counts = Counts::default();
    assert_eq!((counts.views, counts.shares, counts.r#ref), (0, 0, 0));
    counts.set(Key::Ref, 2);
    counts.views = 1;
    assert_eq!(counts.get(Key::Ref), 2);

    let json = serde_json::to_string(&counts).unwrap();
    assert_eq!(json, r#"{"views":1,"shares":0,"ref":2}"#);
    assert_eq!(serde_json::from_str::<Counts>(&json).unwrap(), counts);
    // A missing key is 0; an unknown one is an error, not silently dropped.
    let partial: Counts = serde_json::from_str(r#"{"shares":5}"#).unwrap();
    assert_eq!(partial.shares, 5);
    assert_eq!(partial.views, 0);
    let unknown = serde_json::from_str::<Counts>(r#"{"likes":5}"#).unwrap_err();
    assert!(
        unknown.to_string().contains("unknown counter key"),
        "{unknown}"
    );

    assert_eq!(serde_json::to_string(&Key::Ref).unwrap(), r#""ref""#);
    assert_eq!(
        serde_json::from_str::<Key>(r#""shares""#).unwrap(),
        Key::Shares
    );
    assert!(serde_json::from_str::<Key>(r#""Shares""#).is_err());
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "derive_schema_sync"]
    async fn schema_sync_creates_owner_and_companion_tables(t: TestDb) {
        // sea-orm's (experimental) schema sync finds the generated companion
        // entity in the registry beside the owner, and creates both. The
        // registry is keyed by module path: `counters::derive::page`.
        let registry = t.db.get_schema_registry(concat!(module_path!(), "::page"));
        sql::sync(&t.db, registry).await.unwrap();
        page::ActiveModel {
            slug: Set("synced".into()),
        }
        .insert(&t.sql())
        .await
        .unwrap();
        page::Entity::counters()
            .add(&t.db, "synced".into(), page::counters::Key::Views, 3)
            .await
            .unwrap();
        let rows = page::counters::Entity::find()
            .all(&t.sql())
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "[{}] {rows:?}", t.backend);
        assert_eq!(rows[0].value, 3);
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "derive_one_query_per_page"]
    async fn a_page_of_models_costs_one_query(t: TestDb) {
        use std::sync::{
            Arc,
            atomic::{AtomicUsize, Ordering},
        };
        tag::Entity::counters().create_table(&t.db).await.unwrap();
        let page: Vec<tag::Model> = (1..=2_000)
            .map(|id| tag::Model {
                id,
                name: format!("tag {id}"),
            })
            .collect();
        tag::Entity::counters()
            .add_many(
                &t.db,
                page.iter()
                    .map(|m| (m.id, tag::counters::Key::Uses, i64::from(m.id))),
            )
            .await
            .unwrap();

        // Every statement the pool runs from here on is counted.
        let statements = Arc::new(AtomicUsize::new(0));
        let mut db = t.db.clone();
        let counter = statements.clone();
        db.set_metric_callback(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        let paired = tag::Entity::counters()
            .load_counts(&db, page)
            .await
            .unwrap();
        assert_eq!(statements.load(Ordering::SeqCst), 1, "[{}]", t.backend);
        assert!(
            paired
                .iter()
                .all(|(m, c)| c.uses == i64::from(m.id) && c.follows == 0),
            "[{}]",
            t.backend
        );
        t.finish().await;
    }
}
