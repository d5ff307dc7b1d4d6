//! The migration crate and the ready-made companion-table migration.

use blog_migration::{Migrator, MigratorTrait};
use counter_core::{CounterError, CounterTable, Counters, FlushLedger, SlottedCounter};
use counter_tests::{TestDb, backend_test, sql};
use entity::{post, user};

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "migrator_up_down"]
    async fn migrator_up_and_down_create_and_drop_counter_tables(t: TestDb) {
        // The dynamic handles of the derived entities: the same tables.
        let posts = post::Entity::counters().untyped();
        let users = user::Entity::counters().untyped();

        sql::migrate_up::<Migrator>(&t.db).await.unwrap();
        assert!(
            Migrator::get_pending_migrations(&t.sql())
                .await
                .unwrap()
                .is_empty(),
            "[{}]",
            t.backend
        );
        let applied: Vec<String> = Migrator::get_applied_migrations(&t.sql())
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
                "m20261122_000002_create_comments",
                "counter_core_upgrade_post_counters_v2",
                "counter_core_upgrade_user_counters_v2",
                "counter_core_create_counter_flush_ledger",
            ],
            "[{}]",
            t.backend
        );
        // The comments table (no `IF NOT EXISTS` on any backend: the
        // migration runs once) is there after up.
        let schema = sql::schema(&t.db).await;
        assert!(
            schema.has_table("comments").await.unwrap(),
            "[{}] comments after up",
            t.backend
        );
        // Post views are windowed: their bucket table comes with the counters,
        // and every counter table has the key index rankings read through.
        assert!(
            schema.has_table("post_counters_buckets").await.unwrap(),
            "[{}]",
            t.backend
        );
        assert!(
            !schema.has_table("user_counters_buckets").await.unwrap(),
            "[{}]",
            t.backend
        );
        // The ledger a `CounterBuffer` needs.
        assert!(
            schema.has_table(FlushLedger::DEFAULT_TABLE).await.unwrap(),
            "[{}]",
            t.backend
        );
        for table in ["post_counters", "user_counters"] {
            let index = format!("{table}_by_key");
            assert!(
                schema.has_index(table, &index).await.unwrap(),
                "[{}] {index}",
                t.backend
            );
        }
        sql::done(schema).await;
        posts.increment(&t.db, 1, "likes").await.unwrap();
        users.add(&t.db, 1, "followers", 3).await.unwrap();
        assert_eq!(posts.get(&t.db, 1, "likes").await.unwrap(), 1);

        // Running up again changes nothing; down drops the tables and the counts.
        sql::migrate_up::<Migrator>(&t.db).await.unwrap();
        assert_eq!(
            users.get(&t.db, 1, "followers").await.unwrap(),
            3,
            "[{}]",
            t.backend
        );
        sql::migrate_down::<Migrator>(&t.db).await.unwrap();
        let schema = sql::schema(&t.db).await;
        assert!(
            !schema.has_table("comments").await.unwrap(),
            "[{}] comments after down",
            t.backend
        );
        assert!(
            !schema.has_table("post_counters_buckets").await.unwrap(),
            "[{}]",
            t.backend
        );
        assert!(
            !schema.has_table(FlushLedger::DEFAULT_TABLE).await.unwrap(),
            "[{}] the ledger after down",
            t.backend
        );
        sql::done(schema).await;
        let gone = posts.get(&t.db, 1, "likes").await.unwrap_err();
        assert!(
            matches!(gone, CounterError::MissingTable { .. }),
            "[{}] {gone:?}",
            t.backend
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "create_drop_table"]
    async fn create_table_is_idempotent_and_drop_table_removes_counts(t: TestDb) {
        let c = Counters::<i64>::new(CounterTable::new("c").unwrap());
        c.create_table(&t.db).await.unwrap();
        c.add(&t.db, 1, "k", 2).await.unwrap();
        c.create_table(&t.db).await.unwrap();
        assert_eq!(c.get(&t.db, 1, "k").await.unwrap(), 2, "[{}]", t.backend);
        c.drop_table(&t.db).await.unwrap();
        assert!(
            matches!(
                c.get(&t.db, 1, "k").await,
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
    #[label = "upgrade_migration"]
    async fn the_upgrade_migration_brings_an_old_table_up_to_date(t: TestDb) {
        use blog_migration::MigrationTrait;
        let b = t.backend;
        let old = Counters::<i64>::new(CounterTable::new("legacy").unwrap());
        old.create_table(&t.db).await.unwrap();
        old.add(&t.db, 1, "views", 5).await.unwrap();
        // A table created before the key index existed.
        let drop_index = match b {
            counter_tests::Backend::MySql => "DROP INDEX legacy_by_key ON legacy",
            _ => "DROP INDEX legacy_by_key",
        };
        sea_orm::ConnectionTrait::execute_unprepared(&t.db, drop_index)
            .await
            .unwrap();
        let schema = sql::schema(&t.db).await;
        assert!(
            !schema.has_index("legacy", "legacy_by_key").await.unwrap(),
            "[{b}]"
        );

        // Now `views` is windowed: the upgrade adds the index and the buckets.
        let new = Counters::<i64>::new(
            CounterTable::new("legacy")
                .unwrap()
                .with_key_window("views", counter_core::Window::Day)
                .unwrap(),
        );
        let upgrade = new.upgrade_migration();
        assert_eq!(
            blog_migration::MigrationName::name(&upgrade),
            "counter_core_upgrade_legacy_v2"
        );
        upgrade.up(&schema).await.unwrap();
        assert!(
            schema.has_index("legacy", "legacy_by_key").await.unwrap(),
            "[{b}]"
        );
        assert!(schema.has_table("legacy_buckets").await.unwrap(), "[{b}]");
        // Twice is fine, and the counts are untouched.
        upgrade.up(&schema).await.unwrap();
        sql::done(schema).await;
        // The increment lands in the day bucket of some instant between
        // these two clock reads: a midnight in between cannot move it out
        // of the range.
        let before = chrono::Utc::now();
        new.increment(&t.db, 1, "views").await.unwrap();
        let after = chrono::Utc::now();
        assert_eq!(new.get(&t.db, 1, "views").await.unwrap(), 6, "[{b}]");
        let from = counter_core::Window::Day.start_of(before);
        let to = counter_core::Window::Day.start_of(after) + chrono::Duration::days(1);
        assert_eq!(
            new.range(&t.db, 1, "views", from, to).await.unwrap(),
            1,
            "[{b}]"
        );
        t.finish().await;
    }
}
