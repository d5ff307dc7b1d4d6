//! A caller's transaction that counts what the library sends on it: every
//! statement with its SQL, and every transaction opened inside it (a
//! savepoint). The library cannot tell it from a `DatabaseTransaction`: it
//! is not a pool, so it is the caller's transaction.

use std::{
    future::Future,
    pin::Pin,
    sync::{Mutex, MutexGuard, PoisonError},
};

use sea_orm::{
    AccessMode, ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, ExecResult, IsolationLevel,
    QueryResult, Statement, TransactionError, TransactionOptions, TransactionTrait,
};

/// What was sent through a [`Counting`] connection.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Sent {
    /// The SQL of each statement, in order (`SAVEPOINT` and other unprepared
    /// statements included).
    pub statements: Vec<String>,
    /// Transactions opened inside this one: savepoints.
    pub savepoints: usize,
}

/// `txn`, counted (see the module).
pub struct Counting<'t> {
    txn: &'t DatabaseTransaction,
    sent: Mutex<Sent>,
}

impl<'t> Counting<'t> {
    pub fn new(txn: &'t DatabaseTransaction) -> Self {
        Self {
            txn,
            sent: Mutex::new(Sent::default()),
        }
    }

    /// What was sent so far, and a fresh count from here.
    pub fn take(&self) -> Sent {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> MutexGuard<'_, Sent> {
        self.sent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn statement(&self, sql: &str) {
        self.lock().statements.push(sql.to_owned());
    }

    fn savepoint(&self) {
        self.lock().savepoints += 1;
    }
}

#[async_trait::async_trait]
impl ConnectionTrait for Counting<'_> {
    fn get_database_backend(&self) -> DbBackend {
        self.txn.get_database_backend()
    }

    async fn execute_raw(&self, stmt: Statement) -> Result<ExecResult, DbErr> {
        self.statement(&stmt.sql);
        self.txn.execute_raw(stmt).await
    }

    async fn execute_unprepared(&self, sql: &str) -> Result<ExecResult, DbErr> {
        self.statement(sql);
        self.txn.execute_unprepared(sql).await
    }

    async fn query_one_raw(&self, stmt: Statement) -> Result<Option<QueryResult>, DbErr> {
        self.statement(&stmt.sql);
        self.txn.query_one_raw(stmt).await
    }

    async fn query_all_raw(&self, stmt: Statement) -> Result<Vec<QueryResult>, DbErr> {
        self.statement(&stmt.sql);
        self.txn.query_all_raw(stmt).await
    }
}

#[async_trait::async_trait]
impl TransactionTrait for Counting<'_> {
    type Transaction = DatabaseTransaction;

    async fn begin(&self) -> Result<DatabaseTransaction, DbErr> {
        self.savepoint();
        self.txn.begin().await
    }

    async fn begin_with_config(
        &self,
        isolation_level: Option<IsolationLevel>,
        access_mode: Option<AccessMode>,
    ) -> Result<DatabaseTransaction, DbErr> {
        self.savepoint();
        self.txn
            .begin_with_config(isolation_level, access_mode)
            .await
    }

    async fn begin_with_options(
        &self,
        options: TransactionOptions,
    ) -> Result<DatabaseTransaction, DbErr> {
        self.savepoint();
        self.txn.begin_with_options(options).await
    }

    async fn transaction<F, T, E>(&self, callback: F) -> Result<T, TransactionError<E>>
    where
        F: for<'c> FnOnce(
                &'c DatabaseTransaction,
            ) -> Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'c>>
            + Send,
        T: Send,
        E: std::fmt::Display + std::fmt::Debug + Send,
    {
        self.savepoint();
        self.txn.transaction(callback).await
    }

    async fn transaction_with_config<F, T, E>(
        &self,
        callback: F,
        isolation_level: Option<IsolationLevel>,
        access_mode: Option<AccessMode>,
    ) -> Result<T, TransactionError<E>>
    where
        F: for<'c> FnOnce(
                &'c DatabaseTransaction,
            ) -> Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'c>>
            + Send,
        T: Send,
        E: std::fmt::Display + std::fmt::Debug + Send,
    {
        self.savepoint();
        self.txn
            .transaction_with_config(callback, isolation_level, access_mode)
            .await
    }
}
