//! The table that makes buffer flushes exactly-once.

use sea_orm::ConnectionTrait;

use crate::{
    detach,
    error::Result,
    retry,
    sql::{self, Dialect},
    table::validate_table_name,
};

/// The flush ledger: one small row per running [`CounterBuffer`]
/// (`writer_id`, `last_flush`, `updated_at`), written in the same
/// transaction as each flush's counter rows.
///
/// A flush whose `COMMIT` reply never arrived (the connection dropped) may or
/// may not have committed. Its retry claims the same flush number with a
/// compare-and-set on this row; if the number is already taken, the flush had
/// committed and is not applied again. Rows of buffers that stopped cleanly
/// are deleted; rows of crashed ones are pruned after
/// [`BufferBuilder::ledger_retention`](super::BufferBuilder::ledger_retention).
///
/// Create it once per database, with the migration or in code:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use counter_core::FlushLedger;
///
/// let db = sea_orm::Database::connect("sqlite::memory:").await?;
/// FlushLedger::default().create_table(&db).await?;
/// // In a Migrator: `Box::new(FlushLedger::default().migration())`.
/// # Ok(())
/// # }
/// ```
///
/// [`CounterBuffer`]: super::CounterBuffer
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlushLedger {
    name: String,
}

impl FlushLedger {
    /// The ledger's default table name.
    pub const DEFAULT_TABLE: &'static str = "counter_flush_ledger";

    /// A ledger in table `name` (a checked identifier, as for counter tables).
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        validate_table_name(&name)?;
        Ok(Self { name })
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Creates the ledger table if it does not exist.
    pub async fn create_table<C: ConnectionTrait>(&self, db: &C) -> Result<()> {
        let stmt = sql::ledger::create_ledger(Dialect::of(db)?, &self.name);
        retry::run(db, &self.name, || detach::execute(db, stmt.clone())).await?;
        Ok(())
    }

    /// Drops the ledger table if it exists.
    pub async fn drop_table<C: ConnectionTrait>(&self, db: &C) -> Result<()> {
        let stmt = sql::ledger::drop_ledger(Dialect::of(db)?, &self.name);
        retry::run(db, &self.name, || detach::execute(db, stmt.clone())).await?;
        Ok(())
    }

    /// The migration creating the ledger, named
    /// `counter_core_create_<ledger>` (stable: migrations are matched by name).
    #[cfg(feature = "migration")]
    pub fn migration(&self) -> migration::FlushLedgerMigration {
        migration::FlushLedgerMigration {
            name: format!("counter_core_create_{}", self.name),
            ledger: self.clone(),
        }
    }
}

impl Default for FlushLedger {
    fn default() -> Self {
        Self {
            name: Self::DEFAULT_TABLE.to_owned(),
        }
    }
}

#[cfg(feature = "migration")]
pub mod migration {
    //! A `sea-orm-migration` migration for the flush ledger.

    use sea_orm::{ConnectionTrait, DbErr};
    use sea_orm_migration::{
        MigrationName, MigrationTrait, SchemaManager, async_trait::async_trait,
    };

    use super::FlushLedger;
    use crate::sql::{self, Dialect};

    /// Creates (`up`) or drops (`down`) the flush ledger; from
    /// [`FlushLedger::migration`].
    pub struct FlushLedgerMigration {
        pub(super) name: String,
        pub(super) ledger: FlushLedger,
    }

    impl MigrationName for FlushLedgerMigration {
        fn name(&self) -> &str {
            &self.name
        }
    }

    fn dialect(manager: &SchemaManager) -> Result<Dialect, DbErr> {
        Dialect::from_backend(manager.get_database_backend())
            .map_err(|e| DbErr::Migration(e.to_string()))
    }

    #[async_trait]
    impl MigrationTrait for FlushLedgerMigration {
        async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            let stmt = sql::ledger::create_ledger(dialect(manager)?, self.ledger.name());
            manager.get_connection().execute_raw(stmt).await.map(drop)
        }

        async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
            let stmt = sql::ledger::drop_ledger(dialect(manager)?, self.ledger.name());
            manager.get_connection().execute_raw(stmt).await.map(drop)
        }
    }
}
