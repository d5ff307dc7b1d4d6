//! The example's derived post entity, used next to ordinary entity queries
//! in one transaction.

use blog_migration::Migrator;
use counter_core::SlottedCounter;
use counter_tests::{TestDb, backend_test, sql};
use entity::post::{self, counters::Key as PostKey};
use sea_orm::{ActiveModelTrait, EntityTrait, QueryOrder, Set, TransactionTrait};

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "entity_typed_counters"]
    async fn typed_counters_on_an_entity(t: TestDb) {
        sql::migrate_up::<Migrator>(&t.db).await.unwrap();
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
            post::Entity::counters()
                .increment(&txn, post.id, PostKey::Views)
                .await
                .unwrap();
            ids.push(post.id);
        }
        txn.commit().await.unwrap();

        post::Entity::counters()
            .add(&t.db, ids[0], PostKey::Likes, 10)
            .await
            .unwrap();
        post::Entity::counters()
            .decrement(&t.db, ids[0], PostKey::Likes)
            .await
            .unwrap();
        post::Entity::counters()
            .add_many(&t.db, ids.iter().map(|id| (*id, PostKey::Views, 2)))
            .await
            .unwrap();

        let page = post::Entity::find()
            .order_by_asc(post::Column::Id)
            .all(&t.sql())
            .await
            .unwrap();
        let page_ids: Vec<i64> = page.iter().map(|p| p.id).collect();
        let counts = post::Entity::counters()
            .get_many(&t.db, &page_ids, &[PostKey::Likes, PostKey::Views])
            .await
            .unwrap();
        assert_eq!(counts[&ids[0]].likes, 9, "[{}]", t.backend);
        for id in &ids {
            assert_eq!(counts[id].views, 3, "[{}] post {id}", t.backend);
        }
        assert_eq!(
            post::Entity::counters()
                .get(&t.db, ids[2], PostKey::Likes)
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
