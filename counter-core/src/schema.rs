//! Creating the companion table from code, and the ready-made migration.

use sea_orm::ConnectionTrait;

use crate::{
    Counters, detach,
    error::Result,
    owner::OwnerId,
    retry,
    sql::{self, Dialect},
    typed::KeySpace,
};

impl<I: OwnerId, S: KeySpace> Counters<I, S> {
    /// Creates the companion table, its key index and (with a windowed
    /// key) its bucket table, where they do not exist (on MySQL the key
    /// index comes with a new table only: an older table gets it from
    /// [`Counters::upgrade_migration`]). Applications with migrations use
    /// [`Counters::migration`] instead.
    pub async fn create_table<C: ConnectionTrait>(&self, db: &C) -> Result<()> {
        for stmt in sql::create_table(Dialect::of(db)?, self.table(), I::COLUMN) {
            retry::run(db, self.table().name(), || {
                detach::execute(db, stmt.clone())
            })
            .await?;
        }
        Ok(())
    }

    /// Drops the companion table and its bucket table if they exist, and
    /// every count in them.
    pub async fn drop_table<C: ConnectionTrait>(&self, db: &C) -> Result<()> {
        for (table, stmt) in sql::drop_table(Dialect::of(db)?, self.table()) {
            retry::run(db, &table, || detach::execute(db, stmt.clone())).await?;
        }
        Ok(())
    }

    /// The migration creating this companion table (and its bucket table,
    /// if a key is windowed), for a `Migrator`.
    #[cfg(feature = "migration")]
    pub fn migration(&self) -> migration::CounterTableMigration {
        migration::CounterTableMigration::new(self.untyped())
    }

    /// The migration that brings a companion table created by an earlier
    /// version up to date: it adds the key index that rankings read
    /// through and, if a key is windowed now, the bucket table. Append it to
    /// the `Migrator` after [`Counters::migration`] when a table already
    /// exists; on a table that [`Counters::migration`] just created it
    /// changes nothing. Its name, `counter_core_upgrade_<table>_v2`, is
    /// stable. On PostgreSQL, building the index blocks writes to the table
    /// while it runs (seconds per million rows); on a large live table,
    /// create it beforehand with `CREATE INDEX CONCURRENTLY` under the same
    /// name (`<table>_by_key`, columns `count_key, owner_id`) and the
    /// migration skips it.
    #[cfg(feature = "migration")]
    pub fn upgrade_migration(&self) -> migration::CounterTableUpgrade {
        migration::CounterTableUpgrade::new(self.untyped())
    }
}

#[cfg(feature = "migration")]
pub mod migration {
    //! A `sea-orm-migration` migration for a companion table.

    use sea_orm::{ConnectionTrait, DbErr};
    use sea_orm_migration::{
        MigrationName, MigrationTrait, SchemaManager, async_trait::async_trait,
    };

    use crate::{
        CounterTable, Counters,
        owner::{OwnerColumn, OwnerId},
        sql::{self, Dialect},
    };

    /// Creates (`up`) or drops (`down`) one companion table.
    ///
    /// Its name, `counter_core_create_<table>`, is stable and unique per
    /// table: sea-orm-migration matches applied migrations by name, so it
    /// must never change. Add it to a `Migrator` after the owner's table:
    ///
    /// ```
    /// use counter_core::{CounterTable, Counters};
    /// use sea_orm_migration::{MigrationName, MigrationTrait};
    ///
    /// let counters = Counters::<i64>::new(CounterTable::new("post_counters")?);
    /// let migrations: Vec<Box<dyn MigrationTrait>> = vec![Box::new(counters.migration())];
    /// assert_eq!(migrations[0].name(), "counter_core_create_post_counters");
    /// # Ok::<(), counter_core::CounterError>(())
    /// ```
    pub struct CounterTableMigration {
        name: String,
        table: CounterTable,
        owner: OwnerColumn,
    }

    impl CounterTableMigration {
        /// The migration for `counters`' table.
        pub fn new<I: OwnerId>(counters: Counters<I>) -> Self {
            let table = counters.table().clone();
            Self {
                name: format!("counter_core_create_{}", table.name()),
                table,
                owner: I::COLUMN,
            }
        }
    }

    fn dialect(manager: &SchemaManager) -> Result<Dialect, DbErr> {
        Dialect::from_backend(manager.get_database_backend())
            .map_err(|e| DbErr::Migration(e.to_string()))
    }

    impl MigrationName for CounterTableMigration {
        fn name(&self) -> &str {
            &self.name
        }
    }

    #[async_trait]
    impl MigrationTrait for CounterTableMigration {
        async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            for stmt in sql::create_table(dialect(manager)?, &self.table, self.owner) {
                manager.get_connection().execute_raw(stmt).await?;
            }
            Ok(())
        }

        async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            for (_, stmt) in sql::drop_table(dialect(manager)?, &self.table) {
                manager.get_connection().execute_raw(stmt).await?;
            }
            Ok(())
        }
    }

    /// Brings a companion table created by an earlier version up to date
    /// (see [`Counters::upgrade_migration`]).
    pub struct CounterTableUpgrade {
        name: String,
        table: CounterTable,
        owner: OwnerColumn,
    }

    impl CounterTableUpgrade {
        /// The upgrade of `counters`' table.
        pub fn new<I: OwnerId>(counters: Counters<I>) -> Self {
            let table = counters.table().clone();
            Self {
                name: format!("counter_core_upgrade_{}_v2", table.name()),
                table,
                owner: I::COLUMN,
            }
        }
    }

    impl MigrationName for CounterTableUpgrade {
        fn name(&self) -> &str {
            &self.name
        }
    }

    #[async_trait]
    impl MigrationTrait for CounterTableUpgrade {
        async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            let dialect = dialect(manager)?;
            let table = self.table.name();
            let db = manager.get_connection();
            if !manager
                .has_index(table, &sql::key_index_name(table))
                .await?
            {
                db.execute_raw(sql::create_key_index(dialect, table, false))
                    .await?;
            }
            if let Some(buckets) = self.table.bucket_table() {
                let stmt = sql::create_bucket_table(dialect, &self.table, &buckets, self.owner);
                db.execute_raw(stmt).await?;
            }
            Ok(())
        }

        /// Leaves the index and the bucket table: the counter table's own
        /// migration drops them with it.
        async fn down(&self, _manager: &SchemaManager) -> Result<(), DbErr> {
            Ok(())
        }
    }
}
