//! `SlottedCounter` implemented by hand on a SeaORM entity, with typed keys,
//! used next to ordinary entity queries in one transaction.

use std::sync::LazyLock;

use counter_core::{CounterKey, CounterTable, Counters, SlottedCounter};
use counter_tests::backends;
use migration::{Migrator, MigratorTrait, POST_COUNTERS};
use sea_orm::{ActiveModelTrait, EntityTrait, QueryOrder, Set, TransactionTrait};

mod post {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "posts")]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub title: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostKey {
    Likes,
    Views,
}

impl CounterKey for PostKey {
    fn as_key_str(&self) -> &str {
        match self {
            PostKey::Likes => "likes",
            PostKey::Views => "views",
        }
    }
}

impl SlottedCounter for post::Entity {
    type OwnerId = i64;
    type Key = PostKey;

    fn counters() -> &'static Counters<i64> {
        static COUNTERS: LazyLock<Counters<i64>> = LazyLock::new(|| {
            let table =
                CounterTable::new(POST_COUNTERS).and_then(|t| t.with_key_slots("views", 64));
            Counters::new(table.expect("valid counter table"))
        });
        &COUNTERS
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn typed_counters_on_an_entity() {
    for t in backends("entity_typed_counters").await {
        Migrator::up(&t.db, None).await.unwrap();
        let txn = t.db.begin().await.unwrap();
        let mut ids = Vec::new();
        for title in ["first", "second", "third"] {
            let post = post::ActiveModel {
                title: Set(title.into()),
                ..Default::default()
            }
            .insert(&txn)
            .await
            .unwrap();
            post::Entity::increment(&txn, post.id, PostKey::Views)
                .await
                .unwrap();
            ids.push(post.id);
        }
        txn.commit().await.unwrap();

        post::Entity::add(&t.db, ids[0], PostKey::Likes, 10)
            .await
            .unwrap();
        post::Entity::decrement(&t.db, ids[0], PostKey::Likes)
            .await
            .unwrap();
        post::Entity::add_many(&t.db, ids.iter().map(|id| (*id, PostKey::Views, 2)))
            .await
            .unwrap();

        let page = post::Entity::find()
            .order_by_asc(post::Column::Id)
            .all(&t.db)
            .await
            .unwrap();
        let page_ids: Vec<i64> = page.iter().map(|p| p.id).collect();
        let counts = post::Entity::get_many(&t.db, &page_ids, &[PostKey::Likes, PostKey::Views])
            .await
            .unwrap();
        assert_eq!(counts[&ids[0]]["likes"], 9, "[{}]", t.backend);
        for id in &ids {
            assert_eq!(counts[id]["views"], 3, "[{}] post {id}", t.backend);
        }
        assert_eq!(
            post::Entity::get(&t.db, &ids[2], PostKey::Likes)
                .await
                .unwrap(),
            0
        );
        assert_eq!(
            post::Entity::counters().table().slots_for("views").get(),
            64
        );
        t.finish().await;
    }
}
