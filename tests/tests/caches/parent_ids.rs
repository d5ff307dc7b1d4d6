//! Parent ids a child row carries that their column cannot hold: the
//! caller's error (`InvalidOwner`, kind `InvalidInput`, a handler's 400),
//! never a bare database error, and nothing written. Checked before any
//! statement where the bound is known (the rules of a string owner id, the
//! entity's declared column length); recognised from the database's
//! refusal where only the database knows it (a column a hand-written
//! migration made narrower than the entity says).

use counter_core::{CounterError, ErrorKind, prelude::*};
use counter_tests::{Backend, TestDb, backend_test, figures, sql::Sql};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, Condition, ConnectionTrait, DatabaseConnection, EntityTrait,
    PaginatorTrait, Schema, Set, TransactionTrait,
};

/// The parent: pages with string ids.
mod page {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "pages")]
    #[counter(keys(visits, short_visits), slots = 2, table = "page_counters")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// A child whose parent column is a plain `String` (VARCHAR(255) on
/// MySQL by the schema builder, unbounded elsewhere).
mod visit {
    use counter_core::CounterCache;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, CounterCache)]
    #[sea_orm(table_name = "visits")]
    #[counter_cache(parent = super::page::Entity, key = visits, via = page_id)]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub page_id: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    counter_core::counter_cache_behavior!();
}

/// A child whose entity says a plain `String` for its parent column, whose
/// table a hand-written migration made `VARCHAR(20)`.
mod narrow_visit {
    use counter_core::CounterCache;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, CounterCache)]
    #[sea_orm(table_name = "narrow_visits")]
    #[counter_cache(parent = super::page::Entity, key = visits, via = page_id)]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub page_id: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    counter_core::counter_cache_behavior!();
}

/// A child whose entity declares its parent column 40 characters long.
mod short_visit {
    use counter_core::CounterCache;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, CounterCache)]
    #[sea_orm(table_name = "short_visits")]
    #[counter_cache(parent = super::page::Entity, key = short_visits, via = page_id)]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        #[sea_orm(column_type = "String(StringLen::N(40))")]
        pub page_id: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    counter_core::counter_cache_behavior!();
}

fn invalid_owner(result: Result<impl std::fmt::Debug, CounterError>, what: &str) {
    match result {
        Err(e @ CounterError::InvalidOwner { .. }) => {
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{what}: {e}");
        }
        other => panic!("{what}: expected InvalidOwner, got {other:?}"),
    }
}

async fn rows<E>(db: &DatabaseConnection) -> u64
where
    E: EntityTrait,
    E::Model: Sync,
{
    E::find()
        .count(&Sql::new(db))
        .await
        .expect("count the child rows")
}

fn visit(page: &str) -> visit::ActiveModel {
    visit::ActiveModel {
        page_id: Set(page.to_owned()),
        ..Default::default()
    }
}

backend_test! {
    /// A 256-character id and an id with a NUL through every counted write
    /// of a child whose column is the entity's plain `String`; a 41-character
    /// id through a child whose entity says 40; and a 30-character id through
    /// a child the entity calls a plain `String` whose table a migration made
    /// `VARCHAR(20)`. Each is `InvalidOwner` (the last on the servers, which
    /// enforce the length; SQLite stores it, and counts it), nothing is
    /// written, and the counters stay exact.
    #[label = "parent_ids"]
    async fn parent_ids_their_column_cannot_hold_are_invalid_input(t: TestDb) {
        let db = &t.db;
        let schema = Schema::new(db.get_database_backend());
        t.sql().execute(&schema.create_table_from_entity(visit::Entity))
            .await
            .expect("create visits");
        t.sql().execute(&schema.create_table_from_entity(short_visit::Entity))
            .await
            .expect("create short_visits");
        page::Entity::counters().create_table(db).await.expect("create page_counters");

        let long = "p".repeat(256);
        let nul = "a\0b".to_owned();
        let mut refused = 0u64;
        for bad in [&long, &nul] {
            invalid_owner(visit::Entity::insert_counted(db, visit(bad)).await, "insert_counted");
            invalid_owner(
                visit::Entity::insert_many_counted(db, [visit("ok"), visit(bad)]).await,
                "insert_many_counted",
            );
            // The hooks, in the caller's transaction: typed again from the DbErr.
            let txn = db.begin().await.expect("begin");
            let hooked = visit(bad).insert(&txn).await.map_err(CounterError::from);
            txn.rollback().await.expect("rollback");
            invalid_owner(hooked, "ActiveModel::insert in a transaction");
            refused += 3;
        }
        // A move to an id too long, of one row and of many.
        let kept = visit::Entity::insert_counted(db, visit("home")).await.expect("a good row");
        let mut moved: visit::ActiveModel = kept.clone().into();
        moved.page_id = Set(long.clone());
        invalid_owner(visit::Entity::update_counted(db, moved).await, "update_counted");
        let changes = visit::ActiveModel {
            page_id: Set(nul.clone()),
            ..Default::default()
        };
        invalid_owner(
            visit::Entity::update_many_counted(db, Condition::all().add(visit::Column::PageId.eq("home")), changes)
                .await,
            "update_many_counted",
        );
        refused += 2;
        // The entity's declared length, checked before anything is sent.
        let over = "s".repeat(41);
        let short = short_visit::ActiveModel {
            page_id: Set(over),
            ..Default::default()
        };
        invalid_owner(short_visit::Entity::insert_counted(db, short).await, "a declared VARCHAR(40)");
        refused += 1;
        assert_eq!(rows::<visit::Entity>(db).await, 1, "[{}] only the good row", t.backend);
        assert_eq!(rows::<short_visit::Entity>(db).await, 0);
        let counts = page::Entity::counters()
            .counts(db, "home".to_owned())
            .await
            .expect("read");
        assert_eq!(counts.visits, 1);

        // A column narrower than the entity says: only the database knows.
        db.execute_unprepared(match t.backend {
            Backend::MySql => "CREATE TABLE narrow_visits (id BIGINT AUTO_INCREMENT PRIMARY KEY, page_id VARCHAR(20) NOT NULL)",
            Backend::Postgres => "CREATE TABLE narrow_visits (id BIGSERIAL PRIMARY KEY, page_id VARCHAR(20) NOT NULL)",
            Backend::Sqlite => "CREATE TABLE narrow_visits (id INTEGER PRIMARY KEY AUTOINCREMENT, page_id VARCHAR(20) NOT NULL)",
        })
        .await
        .expect("a narrower table than its entity says");
        let thirty = "w".repeat(30);
        let narrow = |page: &str| narrow_visit::ActiveModel {
            page_id: Set(page.to_owned()),
            ..Default::default()
        };
        let one = narrow_visit::Entity::insert_counted(db, narrow(&thirty)).await;
        let many =
            narrow_visit::Entity::insert_many_counted(db, [narrow("ok"), narrow(&thirty)]).await;
        let visits_of_thirty = page::Entity::counters()
            .counts(db, thirty.clone())
            .await
            .expect("read")
            .visits;
        match t.backend {
            Backend::Sqlite => {
                // SQLite stores any length: written and counted, exactly.
                one.expect("stored");
                many.expect("stored");
                assert_eq!(visits_of_thirty, 2);
                assert_eq!(rows::<narrow_visit::Entity>(db).await, 3);
            }
            _ => {
                invalid_owner(one, "a column narrower than the entity");
                invalid_owner(many, "a column narrower than the entity, many rows");
                refused += 2;
                assert_eq!(visits_of_thirty, 0, "[{}] nothing counted", t.backend);
                assert_eq!(
                    rows::<narrow_visit::Entity>(db).await,
                    0,
                    "[{}] nothing written",
                    t.backend
                );
            }
        }
        figures("parent_ids", t.backend, &[("refused", refused), ("written_bad", 0)]);
        t.finish().await;
    }
}
