//! Creating the companion table from code, and the ready-made migration.

use sea_orm::ConnectionTrait;

use crate::{
    Counters,
    error::Result,
    owner::OwnerId,
    retry,
    sql::{self, Dialect},
};

impl<I: OwnerId> Counters<I> {
    /// Creates the companion table if it does not exist. Applications with
    /// migrations use [`Counters::migration`] instead.
    pub async fn create_table<C: ConnectionTrait>(&self, db: &C) -> Result<()> {
        let stmt = sql::create_table(Dialect::of(db)?, self.table(), I::COLUMN);
        retry::run(db, self.table().name(), || db.execute_raw(stmt.clone())).await?;
        Ok(())
    }

    /// Drops the companion table if it exists, and every count in it.
    pub async fn drop_table<C: ConnectionTrait>(&self, db: &C) -> Result<()> {
        let stmt = sql::drop_table(Dialect::of(db)?, self.table().name());
        retry::run(db, self.table().name(), || db.execute_raw(stmt.clone())).await?;
        Ok(())
    }

    /// The migration creating this companion table, for a `Migrator`.
    #[cfg(feature = "migration")]
    pub fn migration(&self) -> migration::CounterTableMigration {
        migration::CounterTableMigration::new(self.clone())
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

        fn dialect(manager: &SchemaManager) -> Result<Dialect, DbErr> {
            Dialect::from_backend(manager.get_database_backend())
                .map_err(|e| DbErr::Migration(e.to_string()))
        }
    }

    impl MigrationName for CounterTableMigration {
        fn name(&self) -> &str {
            &self.name
        }
    }

    #[async_trait]
    impl MigrationTrait for CounterTableMigration {
        async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            let stmt = sql::create_table(Self::dialect(manager)?, &self.table, self.owner);
            manager.get_connection().execute_raw(stmt).await.map(drop)
        }

        async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            let stmt = sql::drop_table(Self::dialect(manager)?, self.table.name());
            manager.get_connection().execute_raw(stmt).await.map(drop)
        }
    }
}
