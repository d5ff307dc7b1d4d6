//! Adoption in the layout sea-orm-cli and Loco give an app: counters
//! declared in a migration crate (`counter_table!`), entities generated
//! into `_entities` and left untouched, the counters and a counter cache
//! bound in hand-written `models` modules (`slotted_counter!`,
//! `counter_cache!`). Here the three crates are three modules; the Loco
//! example (`examples/loco-app`) is the same in real crates.

use std::sync::{Arc, Mutex};

use counter_core::{
    CounterCache, CounterError, CounterTable, Counters, ErrorKind, OwnerTable, SlottedCounter,
    TableDrift, Truth,
};
use counter_tests::{
    Backend, TestDb, backend_test, figures,
    sql::{self, Sql},
};
use sea_orm::{
    ActiveModelTrait, ConnectionTrait, DatabaseConnection, EntityTrait, PaginatorTrait, Schema,
    Set, TransactionTrait,
};
use sea_orm_migration::{MigrationName, MigrationTrait, SchemaManager};

/// The migration crate: the declaration, and nothing of the app.
mod migration_crate {
    counter_core::counter_table! {
        /// Notes' counters, as the app has them now.
        #[counter(owner = "notes", owner_id = i32, keys(likes, comments, views(window = day)), cascade)]
        pub mod note_counters;
    }

    counter_core::counter_table! {
        /// Counters of owners keyed by a string, for an app on schema sync.
        #[counter(owner = "tags", owner_column = "slug", owner_id = String, keys(uses))]
        pub mod tag_counters;
    }

    counter_core::counter_table! {
        /// The same, with `cascade`: schema sync gives it a reference.
        #[counter(owner = "tags", owner_column = "slug", owner_id = String, keys(uses), cascade, table = "tag_refs")]
        pub mod tag_refs;
    }

    counter_core::counter_table! {
        /// The same table as first declared, before `cascade`.
        #[counter(owner = "notes", owner_id = i32, keys(likes, comments, views(window = day)))]
        pub mod note_counters_v1;
    }
}

/// What sea-orm-cli generates (Loco strips the empty behaviour impls).
mod _entities {
    pub mod notes {
        use sea_orm::entity::prelude::*;

        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
        #[sea_orm(table_name = "notes")]
        pub struct Model {
            #[sea_orm(primary_key)]
            pub id: i32,
            pub title: String,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}
    }

    pub mod comments {
        use sea_orm::entity::prelude::*;

        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
        #[sea_orm(table_name = "comments")]
        pub struct Model {
            #[sea_orm(primary_key)]
            pub id: i32,
            pub note_id: i32,
            pub body: String,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}
    }
}

/// Owners keyed by a string, in a table SeaORM's schema builder makes (on
/// MariaDB: a case-insensitive collation).
mod tags {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "tags")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub slug: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// The app's hand-written modules beside the generated ones.
mod models {
    pub mod notes {
        pub use super::super::_entities::notes::{ActiveModel, Entity};
        counter_core::slotted_counter!(Entity, super::super::migration_crate::note_counters);

        impl sea_orm::ActiveModelBehavior for ActiveModel {}
    }

    pub mod comments {
        pub use super::super::_entities::comments::{ActiveModel, Entity};

        counter_core::counter_cache! {
            #[counter_cache(parent = super::notes::Entity, key = comments, via = note_id)]
            Entity
        }
        counter_core::counter_cache_behavior!(ActiveModel, Entity);
    }

    /// The same counters declared the other way, by the derive on an
    /// entity the app owns: for the DDL comparison.
    pub mod derived_notes {
        use counter_core::SlottedCounter;
        use sea_orm::entity::prelude::*;

        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
        #[sea_orm(table_name = "notes")]
        #[counter(keys(likes, comments, views(window = day)), cascade)]
        pub struct Model {
            #[sea_orm(primary_key)]
            pub id: i32,
            pub title: String,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}

        impl ActiveModelBehavior for ActiveModel {}
    }
}

use models::{comments, notes};
use notes::counters::Key;

/// The app's own tables, made by SeaORM's schema builder from the
/// generated entities, as a migration or schema sync would.
async fn app_tables(db: &DatabaseConnection) {
    let schema = Schema::new(db.get_database_backend());
    Sql::new(db)
        .execute(&schema.create_table_from_entity(notes::Entity))
        .await
        .unwrap();
    Sql::new(db)
        .execute(&schema.create_table_from_entity(comments::Entity))
        .await
        .unwrap();
}

async fn up(db: &DatabaseConnection, migration: &dyn MigrationTrait) {
    let schema = sql::schema(db).await;
    migration.up(&schema).await.unwrap();
    sql::done(schema).await;
}

/// `up` in a transaction, as sea-orm-migration runs a migration whose
/// `use_transaction` is `Some(true)`.
async fn up_in_transaction(db: &DatabaseConnection, migration: &dyn MigrationTrait) {
    assert_eq!(migration.use_transaction(), Some(true));
    let txn = db.begin().await.unwrap();
    migration.up(&SchemaManager::new(&txn)).await.unwrap();
    txn.commit().await.unwrap();
}

async fn new_note(db: &DatabaseConnection, id: i32) {
    notes::ActiveModel {
        id: Set(id),
        title: Set(format!("note {id}")),
    }
    .insert(&Sql::new(db))
    .await
    .unwrap();
}

fn new_comment(note_id: i32) -> comments::ActiveModel {
    comments::ActiveModel {
        note_id: Set(note_id),
        body: Set("hi".into()),
        ..Default::default()
    }
}

/// Every statement a connection sends, in order.
fn record(db: &mut DatabaseConnection) -> Arc<Mutex<Vec<String>>> {
    let sent = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&sent);
    db.set_metric_callback(move |info| log.lock().unwrap().push(info.statement.sql.clone()));
    sent
}

/// The DDL of one side's migration, on a fresh scratch database that has
/// the owner table.
async fn migration_ddl(
    backend: Backend,
    label: &str,
    migration: &dyn MigrationTrait,
) -> Option<Vec<String>> {
    let mut t = TestDb::open(backend, label).await?;
    app_tables(&t.db).await;
    let sent = record(&mut t.db);
    up(&t.db, migration).await;
    let ddl = sent.lock().unwrap().clone();
    t.finish().await;
    Some(ddl)
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "adoption_ddl_identity"]
    async fn migration_side_entity_side_and_derive_make_the_same_ddl(b: Backend) {
        let declared = migration_crate::note_counters::counters().migration();
        let bound = notes::Entity::counters().migration();
        let derived = models::derived_notes::Entity::counters().migration();
        let Some(declared_ddl) = migration_ddl(b, "adoption_ddl_declared", &declared).await else {
            return;
        };
        let bound_ddl = migration_ddl(b, "adoption_ddl_bound", &bound)
            .await
            .unwrap();
        let derived_ddl = migration_ddl(b, "adoption_ddl_derived", &derived)
            .await
            .unwrap();
        let creates = declared_ddl.iter().filter(|s| s.contains("CREATE")).count();
        // The table, its key index (inline on MySQL) and the bucket table.
        assert!(creates >= 2, "[{b}] {declared_ddl:#?}");
        assert!(
            declared_ddl.iter().any(|s| s.contains("ON DELETE CASCADE")),
            "[{b}] {declared_ddl:#?}"
        );
        assert_eq!(declared_ddl, bound_ddl, "[{b}] migration crate vs app");
        assert_eq!(
            declared_ddl, derived_ddl,
            "[{b}] counter_table! vs the derive"
        );
        assert_eq!(declared.name(), derived.name());
        figures(
            "adoption_ddl_identity",
            b,
            &[("statements", declared_ddl.len() as u64)],
        );
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "adoption_declared"]
    async fn declared_counters_and_cache_count_exactly(t: TestDb) {
        let db = &t.db;
        app_tables(db).await;
        up(db, &migration_crate::note_counters::counters().migration()).await;
        new_note(db, 1).await;

        let counters = notes::Entity::counters();
        counters.increment(db, 1, Key::Likes).await.unwrap();
        comments::Entity::insert_counted(db, new_comment(1))
            .await
            .unwrap();
        let txn = db.begin().await.unwrap();
        new_comment(1).insert(&txn).await.unwrap();
        txn.commit().await.unwrap();

        // A plain insert on the pool: refused before anything is written,
        // with an error that says what to do.
        let refused = new_comment(1).insert(db).await.unwrap_err();
        let refused = CounterError::from(refused);
        assert_eq!(
            refused.kind(),
            ErrorKind::Misuse,
            "[{}] {refused}",
            t.backend
        );
        // The message names this file: the call to find and fix.
        assert!(
            refused.to_string().contains("adoption.rs:"),
            "[{}] {refused}",
            t.backend
        );
        eprintln!("[{}] plain insert on the pool: {refused}", t.backend);
        assert_eq!(comments::Entity::find().count(&t.sql()).await.unwrap(), 2);

        let counts = counters.counts(db, 1).await.unwrap();
        assert_eq!((counts.likes, counts.comments), (1, 2), "[{}]", t.backend);
        assert_eq!(comments::Entity::check_counters(db).await.unwrap(), 0);
        // The migration crate's handle reads the same table.
        let from_migration = migration_crate::note_counters::counters();
        assert_eq!(from_migration.get(db, 1, Key::Comments).await.unwrap(), 2);
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "adoption_schema_sync"]
    async fn schema_sync_creates_the_declared_table(t: TestDb) {
        // An app on SeaORM 2's entity-first schema sync registers the
        // declared companion entity beside its own; its reference to the
        // owner is the one the migration makes.
        let db = &t.db;
        let builder = Schema::new(db.get_database_backend())
            .builder()
            .register(notes::Entity)
            .register(migration_crate::note_counters::Entity);
        sql::sync(db, builder).await.unwrap();
        new_note(db, 1).await;
        // The key index and the bucket table are what an entity cannot
        // describe: `create_table` adds them (and skips what exists).
        notes::Entity::counters().create_table(db).await.unwrap();
        let counters = notes::Entity::counters();
        counters.add(db, 1, Key::Views, 3).await.unwrap();
        assert_eq!(
            counters.get(db, 1, Key::Views).await.unwrap(),
            3,
            "[{}]",
            t.backend
        );
        notes::Entity::delete_by_id(1).exec(&t.sql()).await.unwrap();
        assert_eq!(
            counters.get(db, 1, Key::Views).await.unwrap(),
            0,
            "[{}] cascade",
            t.backend
        );
        assert!(
            counters.increment(db, 2, Key::Likes).await.is_err(),
            "[{}] no owner 2",
            t.backend
        );
        t.finish().await;
    }
}

/// `(column, type, collation, nullable)` of `table`'s columns, as the
/// database describes them, and how many indexes it has.
async fn columns(db: &DatabaseConnection, table: &str) -> Vec<String> {
    use sea_orm::{DbBackend, Statement};
    let backend = db.get_database_backend();
    let indexes = match backend {
        DbBackend::MySql => format!(
            "SELECT CONCAT('indexes ', COUNT(DISTINCT INDEX_NAME)) FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{table}'"
        ),
        DbBackend::Postgres => format!(
            "SELECT concat('indexes ', COUNT(*)) FROM pg_indexes \
             WHERE schemaname = current_schema() AND tablename = '{table}'"
        ),
        _ => format!("SELECT 'indexes ' || COUNT(*) FROM pragma_index_list('{table}')"),
    };
    let sql = match backend {
        DbBackend::MySql => format!(
            "SELECT CONCAT_WS(' ', COLUMN_NAME, COLUMN_TYPE, COALESCE(COLLATION_NAME, '-'), IS_NULLABLE) \
             FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{table}' \
             ORDER BY COLUMN_NAME"
        ),
        DbBackend::Postgres => format!(
            "SELECT concat_ws(' ', column_name, data_type, character_maximum_length, \
             COALESCE(collation_name, '-'), is_nullable) FROM information_schema.columns \
             WHERE table_schema = current_schema() AND table_name = '{table}' ORDER BY column_name"
        ),
        _ => format!(
            "SELECT name || ' ' || lower(type) || ' ' || \"notnull\" FROM pragma_table_info('{table}') ORDER BY name"
        ),
    };
    let mut described = Vec::new();
    for sql in [sql, indexes] {
        for row in Sql::new(db)
            .query_all_raw(Statement::from_string(backend, sql))
            .await
            .unwrap()
        {
            described.push(row.try_get_by_index::<String>(0).unwrap());
        }
    }
    described
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "adoption_sync_collations"]
    async fn schema_sync_tables_get_the_collations_of_create_table(t: TestDb) {
        // Schema sync makes the companion table from its entity, which
        // cannot say a collation: on MariaDB `Flag:A` and `flag:a` (and
        // string owners differing in case) would be one counter.
        // `create_table` then gives the columns the byte-wise collations
        // of a table it creates itself.
        use migration_crate::tag_counters;
        let db = &t.db;
        let builder = Schema::new(db.get_database_backend())
            .builder()
            .register(tags::Entity)
            .register(tag_counters::Entity);
        sql::sync(db, builder).await.unwrap();
        let synced = tag_counters::counters().untyped();
        let before = synced.check_table(db).await.unwrap();
        let not_byte_wise = before
            .iter()
            .filter(|d| matches!(d, TableDrift::NotByteWise { .. }))
            .count();
        let expected = match t.backend {
            Backend::MySql => 2,
            Backend::Postgres => 1,
            Backend::Sqlite => 0,
        };
        assert_eq!(not_byte_wise, expected, "[{}] {before:?}", t.backend);
        synced.create_table(db).await.unwrap();
        assert_eq!(synced.check_table(db).await.unwrap(), [], "[{}]", t.backend);
        synced.create_table(db).await.unwrap();
        let fresh = Counters::<String>::new(CounterTable::new("tag_counters_fresh").unwrap());
        fresh.create_table(db).await.unwrap();
        let renamed = columns(db, "tag_counters_fresh").await;
        let synced_columns = columns(db, synced.table().name()).await;
        assert_eq!(
            synced_columns.len(),
            5,
            "[{}] {synced_columns:?}",
            t.backend
        );
        assert_eq!(synced_columns, renamed, "[{}]", t.backend);

        for (owner, key, delta) in [
            ("Ann", "Flag:A", 1),
            ("ann", "flag:a", 2),
            ("ann", "Flag:A", 4),
        ] {
            synced.add(db, owner.into(), key, delta).await.unwrap();
        }
        for (owner, key, want) in [
            ("Ann", "Flag:A", 1),
            ("ann", "flag:a", 2),
            ("ann", "Flag:A", 4),
            ("Ann", "flag:a", 0),
        ] {
            let got = synced.get(db, owner.into(), key).await.unwrap();
            assert_eq!(got, want, "[{}] {owner} {key}", t.backend);
        }
        let ranked = synced.top(db, "Flag:A", 10).await.unwrap();
        assert_eq!(ranked.len(), 2, "[{}] {ranked:?}", t.backend);
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "adoption_sync_referenced"]
    async fn a_synced_reference_that_mysql_cannot_change_is_a_typed_error(t: TestDb) {
        // With `cascade`, schema sync also makes the reference to the
        // owner; MySQL refuses to change a referencing column, so a string
        // owner id that compares case-insensitively stays as it is and
        // `create_table` says so by name. PostgreSQL changes it in place.
        use migration_crate::tag_refs;
        let db = &t.db;
        let builder = Schema::new(db.get_database_backend())
            .builder()
            .register(tags::Entity)
            .register(tag_refs::Entity);
        sql::sync(db, builder).await.unwrap();
        let counters = tag_refs::counters().untyped();
        let created = counters.create_table(db).await;
        if t.backend == Backend::MySql {
            let err = created.unwrap_err();
            assert!(
                matches!(&err, CounterError::TableShape { table, column: "owner_id", .. } if table == "tag_refs"),
                "{err}"
            );
            assert_eq!(err.kind(), ErrorKind::Misuse);
            eprintln!("[mysql] {err}");
        } else {
            created.unwrap();
            tags::ActiveModel {
                slug: Set("Ann".into()),
            }
            .insert(&t.sql())
            .await
            .unwrap();
            counters.add(db, "Ann".into(), "uses", 2).await.unwrap();
            assert_eq!(
                counters.get(db, "Ann".into(), "uses").await.unwrap(),
                2,
                "[{}]",
                t.backend
            );
            tags::Entity::delete_by_id("Ann").exec(&t.sql()).await.unwrap();
            assert_eq!(
                counters.get(db, "Ann".into(), "uses").await.unwrap(),
                0,
                "[{}] cascade",
                t.backend
            );
        }
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "adoption_cascade_migration"]
    async fn cascade_migration_turns_the_reference_on_and_off(t: TestDb) {
        let db = &t.db;
        app_tables(db).await;
        // An owner declared with a column the table does not have.
        let misnamed = CounterTable::new("notes_counters")
            .unwrap()
            .with_owner(OwnerTable {
                schema: None,
                table: "notes".into(),
                column: "note_id".into(),
            });
        let drifts = Counters::<i32>::new(misnamed)
            .check_table(db)
            .await
            .unwrap();
        assert_eq!(
            drifts.first(),
            Some(&TableDrift::OwnerNotFound {
                table: "notes".into(),
                column: "note_id".into()
            }),
            "[{}] {drifts:?}",
            t.backend
        );
        let counters = notes::Entity::counters();
        let table = || counters.table().name().to_owned();
        let buckets = || counters.table().bucket_table().unwrap();
        assert_eq!(
            counters.check_table(db).await.unwrap(),
            [
                TableDrift::Missing { table: table() },
                TableDrift::Missing { table: buckets() }
            ],
            "[{}]",
            t.backend
        );
        // The table as first declared: no reference to its owner.
        let v1 = migration_crate::note_counters_v1::counters();
        up(db, &v1.migration()).await;
        assert_eq!(v1.check_table(db).await.unwrap(), [], "[{}]", t.backend);
        // The declaration now says `cascade`; the migration that ran did
        // not: the check says what to run.
        let drifts = counters.check_table(db).await.unwrap();
        assert_eq!(
            drifts,
            [
                TableDrift::CascadeMissing { table: table() },
                TableDrift::CascadeMissing { table: buckets() }
            ],
            "[{}]",
            t.backend
        );
        eprintln!("[{}] {}", t.backend, drifts[0]);
        new_note(db, 1).await;
        new_note(db, 2).await;
        for owner in [1, 2, 3] {
            // Owner 3 has no row: its counts are orphans.
            v1.add(db, owner, Key::Likes, 5).await.unwrap();
            v1.add(db, owner, Key::Views, 7).await.unwrap();
        }

        let cascade = notes::Entity::counters().cascade_migration(true);
        assert_eq!(cascade.name(), "counter_core_cascade_on_notes_counters");
        up_in_transaction(db, &cascade).await;
        // Applying it again changes nothing (the state already matches).
        up_in_transaction(db, &cascade).await;
        assert_eq!(
            counters.check_table(db).await.unwrap(),
            [],
            "[{}]",
            t.backend
        );
        assert_eq!(
            v1.check_table(db).await.unwrap(),
            [
                TableDrift::CascadeUndeclared { table: table() },
                TableDrift::CascadeUndeclared { table: buckets() }
            ],
            "[{}]",
            t.backend
        );
        assert_eq!(
            counters.get(db, 3, Key::Likes).await.unwrap(),
            0,
            "[{}] orphan",
            t.backend
        );
        assert_eq!(
            counters.get(db, 1, Key::Likes).await.unwrap(),
            5,
            "[{}]",
            t.backend
        );
        assert_eq!(
            counters.get(db, 2, Key::Views).await.unwrap(),
            7,
            "[{}]",
            t.backend
        );
        // The reference works: deleting an owner deletes its counts, in
        // both tables, and a write for a missing owner is refused.
        notes::Entity::delete_by_id(1).exec(&t.sql()).await.unwrap();
        assert_eq!(
            counters.get(db, 1, Key::Likes).await.unwrap(),
            0,
            "[{}]",
            t.backend
        );
        let day = counters
            .range(
                db,
                1,
                Key::Views,
                chrono::DateTime::UNIX_EPOCH,
                chrono::Utc::now() + chrono::Duration::days(1),
            )
            .await
            .unwrap();
        assert_eq!(day, 0, "[{}] buckets", t.backend);
        assert!(
            counters.increment(db, 9, Key::Likes).await.is_err(),
            "[{}]",
            t.backend
        );

        // `down` takes it away again: counts outlive their owner.
        let schema = sql::schema(db).await;
        cascade.down(&schema).await.unwrap();
        sql::done(schema).await;
        notes::Entity::delete_by_id(2).exec(&t.sql()).await.unwrap();
        assert_eq!(
            counters.get(db, 2, Key::Views).await.unwrap(),
            7,
            "[{}]",
            t.backend
        );
        counters.increment(db, 9, Key::Likes).await.unwrap();
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "adoption_purge"]
    async fn truncate_and_seed_never_inherit_counts(t: TestDb) {
        let db = &t.db;
        app_tables(db).await;
        let v1 = migration_crate::note_counters_v1::counters();
        up(db, &v1.migration()).await;
        for id in [1, 2, 3] {
            new_note(db, id).await;
            v1.add(db, id, Key::Likes, id.into()).await.unwrap();
        }
        // Loco's `truncate`: `delete_many`, no hooks, no cascade here.
        notes::Entity::delete_many().exec(&t.sql()).await.unwrap();
        new_note(db, 2).await;
        // The purge the truncate hook calls: owner 2 is back, 1 and 3 are gone.
        let purged = v1.purge_orphans(db).await.unwrap();
        assert!(purged >= 2, "[{}] {purged}", t.backend);
        assert_eq!(v1.get(db, 1, Key::Likes).await.unwrap(), 0);
        // Owner 2 exists again, so purge_orphans keeps its counts; the
        // seed starts it from zero with `purge` (or `clear` for all).
        assert_eq!(v1.get(db, 2, Key::Likes).await.unwrap(), 2);
        v1.purge(db, &[2]).await.unwrap();
        assert_eq!(v1.get(db, 2, Key::Likes).await.unwrap(), 0);
        v1.add(db, 3, Key::Views, 1).await.unwrap();
        assert!(v1.clear(db).await.unwrap() >= 2, "[{}]", t.backend);
        assert_eq!(v1.get(db, 3, Key::Views).await.unwrap(), 0);
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "adoption_purge_string_owners"]
    async fn purge_orphans_tells_string_owners_apart_in_any_collation(t: TestDb) {
        let db = &t.db;
        let schema = Schema::new(db.get_database_backend());
        t.sql()
            .execute(&schema.create_table_from_entity(tags::Entity))
            .await
            .unwrap();
        tags::ActiveModel {
            slug: Set("ABC".into()),
        }
        .insert(&t.sql())
        .await
        .unwrap();
        let owner = OwnerTable {
            schema: None,
            table: "tags".into(),
            column: "slug".into(),
        };
        let tag_counters =
            Counters::<String>::new(CounterTable::new("tag_counters").unwrap().with_owner(owner));
        tag_counters.create_table(db).await.unwrap();
        for slug in ["ABC", "abc", "Abc"] {
            tag_counters.add(db, slug.into(), "uses", 3).await.unwrap();
        }
        // Only "ABC" has a row, however the owner table compares strings.
        assert_eq!(
            tag_counters.purge_orphans(db).await.unwrap(),
            2,
            "[{}]",
            t.backend
        );
        for (slug, uses) in [("ABC", 3), ("abc", 0), ("Abc", 0)] {
            let got = tag_counters.get(db, slug.into(), "uses").await.unwrap();
            assert_eq!(got, uses, "[{}] {slug}", t.backend);
        }
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "adoption_backfill"]
    async fn backfill_migration_fills_existing_rows_while_writes_run(t: TestDb) {
        let db = &t.db;
        app_tables(db).await;
        up(db, &notes::Entity::counters().migration()).await;
        for id in 1..=20 {
            new_note(db, id).await;
        }
        // Existing rows, or fixtures seeded with `insert_many`: no hooks ran.
        let seeded: Vec<_> = (0..200).map(|i| new_comment(i % 20 + 1)).collect();
        comments::Entity::insert_many(seeded)
            .exec(&t.sql())
            .await
            .unwrap();
        assert_eq!(
            comments::Entity::check_counters(db).await.unwrap(),
            20,
            "[{}]",
            t.backend
        );

        // The backfill runs while the app keeps adding comments.
        let writer = {
            let db = db.clone();
            tokio::spawn(async move {
                for i in 0..60 {
                    comments::Entity::insert_counted(&db, new_comment(i % 20 + 1))
                        .await
                        .unwrap();
                }
            })
        };
        let backfill = notes::Entity::counters()
            .backfill_migration(Key::Comments, Truth::rows_of("comments", "note_id"));
        assert_eq!(
            backfill.name(),
            "counter_core_backfill_notes_counters_comments"
        );
        // On the pool itself: a backfill recounts in short transactions of
        // its own, and refuses to run in the migrator's.
        backfill.up(&SchemaManager::new(db)).await.unwrap();
        writer.await.unwrap();

        let drift_after = comments::Entity::check_counters(db).await.unwrap();
        let counts = notes::Entity::counters()
            .counts_many(db, &(1..=20).collect::<Vec<_>>())
            .await
            .unwrap();
        let total: i64 = counts.values().map(|c| c.comments).sum();
        figures(
            "adoption_backfill",
            t.backend,
            &[
                ("rows_before", 200),
                ("rows_written_during", 60),
                ("counted_after", total as u64),
                ("drift_after", drift_after),
                ("increments_lost", (260 - total).unsigned_abs()),
            ],
        );
        assert_eq!(drift_after, 0, "[{}]", t.backend);
        assert_eq!(total, 260, "[{}]", t.backend);

        // The fixture helper: seed more behind the hooks, then repair.
        comments::Entity::insert_many([new_comment(1), new_comment(2)])
            .exec(&t.sql())
            .await
            .unwrap();
        assert_eq!(comments::Entity::recount_counters(db).await.unwrap(), 2);
        assert_eq!(comments::Entity::check_counters(db).await.unwrap(), 0);
        t.finish().await;
    }
}

/// Statements sent by `op`, with the connection's own bookkeeping
/// (`SAVEPOINT`, `BEGIN`, `COMMIT`) counted too: what the database sees.
async fn statements<F, Fut>(sent: &Arc<Mutex<Vec<String>>>, op: F) -> u64
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    sent.lock().unwrap().clear();
    op().await;
    sent.lock().unwrap().len() as u64
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "adoption_statements"]
    async fn statements_per_counted_write(t: TestDb) {
        let mut t = t;
        app_tables(&t.db).await;
        up(&t.db, &notes::Entity::counters().migration()).await;
        new_note(&t.db, 1).await;
        let sent = record(&mut t.db);
        let db = &t.db;
        let counters = notes::Entity::counters();
        let increment = statements(&sent, || async {
            counters.increment(db, 1, Key::Likes).await.unwrap();
        })
        .await;
        let windowed = statements(&sent, || async {
            counters.increment(db, 1, Key::Views).await.unwrap();
        })
        .await;
        let insert = statements(&sent, || async {
            comments::Entity::insert_counted(db, new_comment(1))
                .await
                .unwrap();
        })
        .await;
        let row = comments::Entity::insert_counted(db, new_comment(1))
            .await
            .unwrap();
        let delete = statements(&sent, || async {
            let gone = comments::Entity::delete_counted(db, row.clone().into())
                .await
                .unwrap();
            assert_eq!(gone.rows_affected, 1);
        })
        .await;
        // The same row again: locked and found missing, no `DELETE` sent.
        let delete_missing = statements(&sent, || async {
            let gone = comments::Entity::delete_counted(db, row.into())
                .await
                .unwrap();
            assert_eq!(gone.rows_affected, 0);
        })
        .await;
        let deletes_sent = sent
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.trim_start().to_uppercase().starts_with("DELETE"))
            .count();
        // The metric callback sees the statements of sea-orm's own
        // statements; `BEGIN` and `COMMIT` go through the driver unseen.
        figures(
            "adoption_statements",
            t.backend,
            &[
                ("increment", increment),
                ("increment_windowed", windowed),
                ("insert_counted", insert),
                ("delete_counted", delete),
                ("delete_counted_missing", delete_missing),
            ],
        );
        assert_eq!(increment, 1, "[{}] {:#?}", t.backend, sent.lock().unwrap());
        assert_eq!(windowed, 2, "[{}]", t.backend);
        // Exactly the adoption guide's table ("What a counted write costs").
        let insert_expected = if t.backend == Backend::MySql { 3 } else { 2 };
        assert_eq!(insert, insert_expected, "[{}]", t.backend);
        assert_eq!(delete, 4, "[{}]", t.backend);
        assert_eq!(deletes_sent, 0, "[{}] {:#?}", t.backend, sent.lock().unwrap());
        assert_eq!(delete_missing, 1, "[{}] the lock's read alone", t.backend);
        t.finish().await;
    }
}
