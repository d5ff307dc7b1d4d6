//! A test's own statements on its pool, safe behind a transaction pooler.
//!
//! Through PgBouncer in transaction mode (the harness's PostgreSQL URL with
//! `statement-cache-capacity=0`), a statement sent on a pool outside a
//! transaction can have its `Parse` and its `Bind` reach two server
//! connections (`prepared statement "sqlx_s_1" does not exist`): see
//! `counter_core::pooling`. The crate keeps its own statements in a
//! transaction there; a test's own statements, entity queries, migrations
//! and schema sync go through this module to do the same. Everywhere else
//! (direct PostgreSQL, MySQL, SQLite) they run on the pool exactly as
//! before: a transaction is added only behind a transaction pooler.

use counter_core::pooling::{self, is_transaction_pooled};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseExecutor, DbBackend, DbErr, ExecResult,
    QueryResult, SchemaBuilder, Statement, TransactionTrait,
};
use sea_orm_migration::{MigratorTrait, SchemaManager};

/// A pool for a test's own statements and entity queries (`find().all`,
/// `insert` of an entity without counter hooks, `query_all`): each one
/// alone in a transaction behind a transaction pooler, on the pool as it
/// is otherwise. Get one with [`TestDb::sql`](crate::TestDb::sql) or
/// [`Sql::new`].
///
/// Not for the crate's own calls (`Counters::add(&t.db, ..)`): they take the
/// pool itself, which they recognise by its type, and this wrapper would
/// pass for a caller's transaction. Nor for a hooked entity's write that a
/// test expects to be refused on a pool.
#[derive(Clone, Copy)]
pub struct Sql<'a> {
    pool: &'a DatabaseConnection,
}

impl<'a> Sql<'a> {
    /// `pool`'s statements, safe behind a transaction pooler.
    pub fn new(pool: &'a DatabaseConnection) -> Self {
        Self { pool }
    }
}

#[async_trait::async_trait]
impl ConnectionTrait for Sql<'_> {
    fn get_database_backend(&self) -> DbBackend {
        self.pool.get_database_backend()
    }

    async fn execute_raw(&self, stmt: Statement) -> Result<ExecResult, DbErr> {
        if is_transaction_pooled(self.pool) {
            return pooling::execute(self.pool, stmt).await;
        }
        self.pool.execute_raw(stmt).await
    }

    /// Sent as a simple query, which a transaction pooler cannot split.
    async fn execute_unprepared(&self, sql: &str) -> Result<ExecResult, DbErr> {
        self.pool.execute_unprepared(sql).await
    }

    async fn query_one_raw(&self, stmt: Statement) -> Result<Option<QueryResult>, DbErr> {
        if is_transaction_pooled(self.pool) {
            return pooling::query_one(self.pool, stmt).await;
        }
        self.pool.query_one_raw(stmt).await
    }

    async fn query_all_raw(&self, stmt: Statement) -> Result<Vec<QueryResult>, DbErr> {
        if is_transaction_pooled(self.pool) {
            return pooling::query_all(self.pool, stmt).await;
        }
        self.pool.query_all_raw(stmt).await
    }

    fn support_returning(&self) -> bool {
        self.pool.support_returning()
    }
}

/// A `SchemaManager` on `pool` for a run of DDL or schema probes (a
/// migration's `up`, `has_table`, schema sync on
/// [`get_connection`](SchemaManager::get_connection)): behind a transaction
/// pooler, in a transaction of its own (PostgreSQL's DDL is transactional),
/// which [`done`] commits; on the pool itself otherwise (MySQL's DDL is
/// never wrapped). Call [`done`] before the crate uses what it made: until
/// then, another connection waits for its locks.
pub async fn schema(pool: &DatabaseConnection) -> SchemaManager<'_> {
    let schema = SchemaManager::new(pool);
    if !is_transaction_pooled(pool) {
        return schema;
    }
    schema
        .begin()
        .await
        .expect("begin the schema's transaction")
}

/// Commits the transaction [`schema`] opened, if it opened one.
pub async fn done(schema: SchemaManager<'_>) {
    if let DatabaseExecutor::OwnedTransaction(_) = schema.get_connection() {
        schema
            .commit()
            .await
            .expect("commit the schema's transaction");
    }
}

/// `builder.sync(pool)`: SeaORM's schema sync, in a transaction behind a
/// transaction pooler (see [`schema`]).
pub async fn sync(pool: &DatabaseConnection, builder: SchemaBuilder) -> Result<(), DbErr> {
    if !is_transaction_pooled(pool) {
        return builder.sync(pool).await;
    }
    let txn = pool.begin().await?;
    builder.sync(&txn).await?;
    txn.commit().await
}

/// `M::up(pool, None)`: all of `M`'s pending migrations, in one
/// transaction behind a transaction pooler (each still in a savepoint of
/// its own, as sea-orm-migration runs them on PostgreSQL).
pub async fn migrate_up<M: MigratorTrait>(pool: &DatabaseConnection) -> Result<(), DbErr> {
    if !is_transaction_pooled(pool) {
        return M::up(pool, None).await;
    }
    let txn = pool.begin().await?;
    M::up(&txn, None).await?;
    txn.commit().await
}

/// `M::down(pool, None)`, as [`migrate_up`].
pub async fn migrate_down<M: MigratorTrait>(pool: &DatabaseConnection) -> Result<(), DbErr> {
    if !is_transaction_pooled(pool) {
        return M::down(pool, None).await;
    }
    let txn = pool.begin().await?;
    M::down(&txn, None).await?;
    txn.commit().await
}
