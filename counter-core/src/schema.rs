//! Creating the companion table from code, and the ready-made migration.

use sea_orm::ConnectionTrait;

use crate::{
    CounterError, Counters, TableDrift, detach,
    error::Result,
    owner::OwnerId,
    retry,
    sql::{self, Dialect, align},
    typed::KeySpace,
};

impl<I: OwnerId, S: KeySpace> Counters<I, S> {
    /// Creates the companion table, its key index and (with a windowed
    /// key) its bucket table, where they do not exist. Applications with
    /// migrations use [`Counters::migration`] instead.
    ///
    /// A table that exists already, made by SeaORM's schema sync from the
    /// companion entity (or by an earlier version), is brought to the same
    /// shape: byte-wise collations on the key and a string owner id (MySQL,
    /// and the owner id on PostgreSQL), and the key index (MySQL). Each
    /// change is logged (`warn`). A change MySQL refuses is
    /// [`CounterError::TableShape`](crate::CounterError::TableShape).
    pub async fn create_table<C: ConnectionTrait>(&self, db: &C) -> Result<()> {
        refuse_cascade_in_region(self.table())?;
        let dialect = Dialect::of(db)?;
        for stmt in sql::create_table(dialect, self.table(), I::COLUMN) {
            retry::run(db, self.table().name(), || {
                detach::execute(db, stmt.clone())
            })
            .await?;
        }
        self.align(db, dialect).await
    }

    /// The part of [`Counters::create_table`] that fixes tables it did not
    /// create: the collations and key index [`Counters::check_table`]
    /// finds missing (see `sql::align`).
    async fn align<C: ConnectionTrait>(&self, db: &C, dialect: Dialect) -> Result<()> {
        for drift in self.check_table(db).await? {
            match drift {
                TableDrift::NotByteWise {
                    table,
                    column,
                    found,
                } => {
                    let Some(wanted) = align::wanted_collation(dialect, column, I::COLUMN) else {
                        continue;
                    };
                    let found = found.unwrap_or_else(|| "the database's default".to_owned());
                    tracing::warn!(%table, column, %found, wanted, "counter table made elsewhere (schema sync?): giving the column its byte-wise collation");
                    let change = align::set_collation(dialect, &table, column, wanted);
                    retry::run(db, &table, || detach::execute(db, change.clone()))
                        .await
                        .map_err(|e| match e {
                            CounterError::Database(source) => CounterError::TableShape {
                                table: table.clone(),
                                column,
                                found: found.clone(),
                                source: Box::new(source),
                            },
                            other => other,
                        })?;
                }
                TableDrift::NoKeyIndex { table } => {
                    tracing::warn!(%table, "counter table made elsewhere (schema sync?): adding its key index");
                    let index = sql::create_key_index(dialect, &table, true);
                    retry::run(db, &table, || detach::execute(db, index.clone())).await?;
                }
                // Made above; references are the cascade migration's.
                _ => {}
            }
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

    /// The migration that creates the sketch table of unique keys
    /// (`<table>_sketches`) beside a companion table created before its
    /// first unique key was declared: append it to the `Migrator` in the
    /// release that adds the key. On a table that [`Counters::migration`]
    /// created with the key already, it changes nothing. Its name,
    /// `counter_core_sketches_<table>`, is stable.
    #[cfg(feature = "migration")]
    pub fn sketch_migration(&self) -> migration::SketchTableMigration {
        migration::SketchTableMigration::new(self.untyped())
    }

    /// The migration that turns an existing table's reference to its owner
    /// on (`on`) or off, when the declaration's `cascade` changes: on, it
    /// deletes the counts of owners that are gone (which the reference
    /// would refuse) and makes `owner_id` reference the owner with
    /// `ON DELETE CASCADE`, replacing any other reference on it (one made
    /// by schema sync or by hand); off, it drops every reference on
    /// `owner_id`. Both for the bucket table too. A table already in that
    /// state is left alone, so it is safe after [`Counters::migration`] on
    /// a new database. `down` does the opposite.
    ///
    /// Like any migration it records a change at one point in history: its
    /// name is `counter_core_cascade_on_<table>` (or `_off_`), and a second
    /// change to the same state needs a name of its own (`.named(...)`).
    /// PostgreSQL adds the reference `NOT VALID`, deletes the orphans and
    /// validates, in the migration's transaction; MySQL alters in place (the
    /// check of existing rows locks the table while it runs); SQLite
    /// rebuilds the tables in the migration's transaction.
    #[cfg(feature = "migration")]
    pub fn cascade_migration(&self, on: bool) -> migration::CascadeMigration {
        migration::CascadeMigration::new(self.untyped(), on)
    }

    /// The migration that fills `key` from `truth` on a table that already
    /// has rows: a recount ([`Counters::reconcile`]), which is exact while
    /// the application writes, so it can run at deploy time on a live
    /// table. For a counter cache added to an existing child table, the
    /// truth is its rows: `Truth::rows_of("comments", "post_id")`.
    ///
    /// Its name is `counter_core_backfill_<table>_<key>`.
    #[cfg(feature = "migration")]
    pub fn backfill_migration<K: crate::KeyOf<S>>(
        &self,
        key: K,
        truth: impl Into<crate::Truth>,
    ) -> migration::BackfillMigration {
        migration::BackfillMigration::new(self.untyped(), key.as_key_str(), truth.into())
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
        CounterTable, Counters, Reconcile, Truth,
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

    /// `named` and `MigrationName` for each migration of this module: every
    /// one has a default name and takes the application's instead.
    macro_rules! named {
        ($($migration:ident),+) => {$(
            impl $migration {
                /// The same migration under the application's own name, such
                /// as `m20260101_000003_create_post_counters`. sea-orm-migration
                /// matches applied migrations by name: choose it once, before
                /// the migration first runs, and never change it.
                pub fn named(mut self, name: impl Into<String>) -> Self {
                    self.name = name.into();
                    self
                }
            }

            impl MigrationName for $migration {
                fn name(&self) -> &str {
                    &self.name
                }
            }
        )+};
    }

    named!(
        CounterTableMigration,
        CounterTableUpgrade,
        CascadeMigration,
        BackfillMigration,
        SketchTableMigration
    );

    /// Creates (`up`) or drops (`down`) a companion table's sketch table
    /// (see [`Counters::sketch_migration`]).
    pub struct SketchTableMigration {
        name: String,
        table: CounterTable,
        owner: OwnerColumn,
    }

    impl SketchTableMigration {
        /// The sketch table migration of `counters`' table.
        pub fn new<I: OwnerId>(counters: Counters<I>) -> Self {
            let table = counters.table().clone();
            Self {
                name: format!("counter_core_sketches_{}", table.name()),
                table,
                owner: I::COLUMN,
            }
        }
    }

    #[async_trait]
    impl MigrationTrait for SketchTableMigration {
        async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            let Some(sketches) = self.table.sketch_table() else {
                return Err(DbErr::Migration(format!(
                    "`{}` has no unique key: nothing for its sketch migration to create",
                    self.table.name()
                )));
            };
            let stmt =
                sql::create_sketch_table(dialect(manager)?, &self.table, &sketches, self.owner);
            manager.get_connection().execute_raw(stmt).await?;
            Ok(())
        }

        async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            if let Some(sketches) = self.table.sketch_table() {
                let drop = sea_orm::sea_query::Table::drop()
                    .table(sea_orm::sea_query::Alias::new(sketches))
                    .if_exists()
                    .to_owned();
                manager.get_connection().execute(&drop).await?;
            }
            Ok(())
        }
    }

    fn dialect(manager: &SchemaManager) -> Result<Dialect, DbErr> {
        Dialect::from_backend(manager.get_database_backend())
            .map_err(|e| DbErr::Migration(e.to_string()))
    }

    #[async_trait]
    impl MigrationTrait for CounterTableMigration {
        async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            super::refuse_cascade_in_region(&self.table)?;
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

    /// Turns an existing table's `cascade` on or off (see
    /// [`Counters::cascade_migration`]).
    pub struct CascadeMigration {
        name: String,
        table: CounterTable,
        owner: OwnerColumn,
        on: bool,
    }

    /// How many times adding the reference is tried on MySQL, where a write
    /// for a just-deleted owner can make a new orphan between the delete of
    /// the orphans and the `ALTER` (each commits on its own).
    const CASCADE_ATTEMPTS: usize = 3;

    impl CascadeMigration {
        /// The migration turning `counters`' reference to its owner on
        /// (`on`) or off.
        pub fn new<I: OwnerId>(counters: Counters<I>, on: bool) -> Self {
            let table = counters.table().clone();
            let state = if on { "on" } else { "off" };
            Self {
                name: format!("counter_core_cascade_{state}_{}", table.name()),
                table,
                owner: I::COLUMN,
                on,
            }
        }

        async fn set(&self, manager: &SchemaManager<'_>, on: bool) -> Result<(), DbErr> {
            let dialect = dialect(manager)?;
            let db = manager.get_connection();
            if self.table.owner().is_none() {
                return Err(crate::CounterError::NoOwnerTable {
                    table: self.table.name().to_owned(),
                }
                .into());
            }
            if on {
                self.table
                    .refuse_in_region("a reference with ON DELETE CASCADE")?;
            }
            for (name, layout) in sql::tables(&self.table) {
                for attempt in 1..=CASCADE_ATTEMPTS {
                    let existing = db
                        .query_all_raw(sql::owner_keys(dialect, &name))
                        .await?
                        .iter()
                        .map(sql::owner_key)
                        .collect::<Result<Vec<_>, _>>()?;
                    let done = if on {
                        existing.len() == 1 && existing[0].cascades
                    } else {
                        existing.is_empty()
                    };
                    if done {
                        break;
                    }
                    let statements = sql::set_cascade(
                        dialect,
                        &self.table,
                        &name,
                        layout,
                        self.owner,
                        &existing,
                        on,
                    )?;
                    let mut result = Ok(());
                    for stmt in statements {
                        result = db.execute_raw(stmt).await.map(drop);
                        if result.is_err() {
                            break;
                        }
                    }
                    match result {
                        Ok(()) => break,
                        Err(e) if dialect != Dialect::MySql || attempt == CASCADE_ATTEMPTS => {
                            return Err(e);
                        }
                        Err(e) => {
                            tracing::warn!(table = name, attempt, error = %e, "retrying the reference")
                        }
                    }
                }
            }
            Ok(())
        }
    }

    #[async_trait]
    impl MigrationTrait for CascadeMigration {
        async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            self.set(manager, self.on).await
        }

        async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            self.set(manager, !self.on).await
        }

        /// All or nothing where the backend's DDL allows it (SQLite's
        /// rebuild, PostgreSQL); MySQL commits each `ALTER` on its own.
        fn use_transaction(&self) -> Option<bool> {
            Some(true)
        }
    }

    /// Fills one key of an existing table from the truth (see
    /// [`Counters::backfill_migration`]).
    pub struct BackfillMigration {
        name: String,
        counters: Box<dyn Backfill>,
    }

    /// The recount of one key, with the table's owner type erased so that
    /// one migration type serves every table.
    #[async_trait]
    trait Backfill: Send + Sync {
        async fn run(&self, db: &sea_orm::DatabaseConnection) -> crate::Result<()>;
    }

    struct Recount<I: OwnerId> {
        counters: Counters<I>,
        key: String,
        truth: Truth,
    }

    #[async_trait]
    impl<I: OwnerId> Backfill for Recount<I> {
        async fn run(&self, db: &sea_orm::DatabaseConnection) -> crate::Result<()> {
            let report = self
                .counters
                .reconcile(db, self.key.as_str(), self.truth.clone(), &Reconcile::new())
                .await?;
            tracing::info!(
                table = self.counters.table().name(),
                key = self.key,
                owners = report.owners_checked,
                filled = report.owners_drifted,
                "backfilled"
            );
            Ok(())
        }
    }

    impl BackfillMigration {
        /// The backfill of `key` in `counters`' table from `truth`.
        pub fn new<I: OwnerId>(counters: Counters<I>, key: &str, truth: Truth) -> Self {
            Self {
                name: format!("counter_core_backfill_{}_{key}", counters.table().name()),
                counters: Box::new(Recount {
                    counters,
                    key: key.to_owned(),
                    truth,
                }),
            }
        }
    }

    /// Recounts on the migration's pool, outside any transaction of the
    /// migrator's: a recount takes its own short transactions, batch by
    /// batch, so that live writes go on.
    #[async_trait]
    impl MigrationTrait for BackfillMigration {
        /// Recounts on a pool of its own connection's database, outside the
        /// migration's transaction: a recount takes its own short
        /// transactions, batch by batch, so that live writes go on.
        async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            match manager.get_connection() {
                sea_orm::DatabaseExecutor::Connection(db) => Ok(self.counters.run(db).await?),
                _ => Err(DbErr::Migration(format!(
                    "{}: a backfill recounts in transactions of its own, and was given one",
                    self.name
                ))),
            }
        }

        /// Nothing to undo: the counts were true.
        async fn down(&self, _manager: &SchemaManager) -> Result<(), DbErr> {
            Ok(())
        }

        fn use_transaction(&self) -> Option<bool> {
            Some(false)
        }
    }
}

/// A reference with `ON DELETE CASCADE` deletes every region's rows of an
/// owner in the region that deletes it, and those deletes of other regions'
/// rows are never replicated: refused in a region (`CrossRegion`).
fn refuse_cascade_in_region(table: &crate::CounterTable) -> Result<()> {
    match table.cascade() {
        Some(_) => table.refuse_in_region("a reference with ON DELETE CASCADE"),
        None => Ok(()),
    }
}
