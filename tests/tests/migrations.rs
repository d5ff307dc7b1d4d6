//! The migration crate and the ready-made companion-table migration.

use counter_core::{CounterError, CounterTable, Counters, SlottedCounter};
use counter_tests::backends;
use entity::{post, user};
use migration::{Migrator, MigratorTrait, SchemaManager};

#[tokio::test(flavor = "multi_thread")]
async fn migrator_up_and_down_create_and_drop_counter_tables() {
    for t in backends("migrator_up_down").await {
        // The dynamic handles of the derived entities: the same tables.
        let posts = post::Entity::counters();
        let users = user::Entity::counters();

        Migrator::up(&t.db, None).await.unwrap();
        assert!(
            Migrator::get_pending_migrations(&t.db)
                .await
                .unwrap()
                .is_empty(),
            "[{}]",
            t.backend
        );
        let applied: Vec<String> = Migrator::get_applied_migrations(&t.db)
            .await
            .unwrap()
            .iter()
            .map(|m| m.name().to_owned())
            .collect();
        assert_eq!(
            applied,
            [
                "m20261122_000001_create_blog",
                "counter_core_create_post_counters",
                "counter_core_create_user_counters",
                "m20261122_000002_create_comments"
            ],
            "[{}]",
            t.backend
        );
        // The comments table (no `IF NOT EXISTS` on any backend: the
        // migration runs once) is there after up.
        let schema = SchemaManager::new(&t.db);
        assert!(
            schema.has_table("comments").await.unwrap(),
            "[{}] comments after up",
            t.backend
        );
        posts.increment(&t.db, 1, "likes").await.unwrap();
        users.add(&t.db, 1, "followers", 3).await.unwrap();
        assert_eq!(posts.get(&t.db, &1, "likes").await.unwrap(), 1);

        // Running up again changes nothing; down drops the tables and the counts.
        Migrator::up(&t.db, None).await.unwrap();
        assert_eq!(
            users.get(&t.db, &1, "followers").await.unwrap(),
            3,
            "[{}]",
            t.backend
        );
        Migrator::down(&t.db, None).await.unwrap();
        assert!(
            !schema.has_table("comments").await.unwrap(),
            "[{}] comments after down",
            t.backend
        );
        let gone = posts.get(&t.db, &1, "likes").await.unwrap_err();
        assert!(
            matches!(gone, CounterError::MissingTable { .. }),
            "[{}] {gone:?}",
            t.backend
        );
        t.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn create_table_is_idempotent_and_drop_table_removes_counts() {
    for t in backends("create_drop_table").await {
        let c = Counters::<i64>::new(CounterTable::new("c").unwrap());
        c.create_table(&t.db).await.unwrap();
        c.add(&t.db, 1, "k", 2).await.unwrap();
        c.create_table(&t.db).await.unwrap();
        assert_eq!(c.get(&t.db, &1, "k").await.unwrap(), 2, "[{}]", t.backend);
        c.drop_table(&t.db).await.unwrap();
        assert!(
            matches!(
                c.get(&t.db, &1, "k").await,
                Err(CounterError::MissingTable { .. })
            ),
            "[{}]",
            t.backend
        );
        t.finish().await;
    }
}
