//! Connections through a transaction pooler (PgBouncer's
//! `pool_mode = transaction`): each transaction may run on another server
//! connection, so nothing may span two transactions.
//!
//! sea-orm sends every statement with values through sqlx's extended
//! protocol as a named prepared statement: `Parse` and `Describe`, a
//! `Sync`, then `Bind` and `Execute`. Outside a transaction the pooler is
//! free to hand the server connection to another client at that `Sync`, so
//! the `Bind` can reach a server connection where the statement does not
//! exist (`prepared statement "sqlx_s_7" does not exist`) or where another
//! client left one of the same name, whose SQL would run with these values.
//! sqlx's statement cache makes it worse: it binds a name prepared in an
//! earlier transaction, on whatever server connection the pooler gives. A
//! statement cache of 0 alone does not help (sqlx still names each
//! statement, never closes it, and the pooler still splits it).
//!
//! So the crate keeps both halves of every statement in one transaction.
//! A PostgreSQL pool whose statement cache is 0 (`statement-cache-capacity=0`
//! in the URL, or [`transaction_pooled`] on its options, the setting sqlx's
//! own PgBouncer advice names) is taken to be behind such a pooler: every
//! statement the crate sends on it outside a transaction runs in a
//! transaction of its own (`BEGIN`, the statement, `COMMIT`), and the
//! crate's own transactions are unchanged. [`query_all`], [`query_one`] and
//! [`execute`] do the same for an application's or a service's own
//! statements. The pooler itself must drop what each transaction prepared
//! (`server_reset_query = DEALLOCATE ALL` with `server_reset_query_always =
//! 1` in PgBouncer 1.18; from 1.21, `max_prepared_statements` tracks them
//! instead): otherwise a name another client left behind makes a `Parse`
//! fail with `already exists`. Session state is never used: recounts and
//! compactions lock with `pg_advisory_xact_lock`, which ends with its
//! transaction.
//!
//! The price is two round trips per statement (`BEGIN`, `COMMIT`) and no
//! statement reuse, paid only where a pooler makes them necessary.

#[cfg(feature = "sqlx-postgres")]
use sea_orm::ConnectOptions;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, ExecResult, QueryResult, Statement};

use crate::detach;

/// `options` for a transaction pooler in front of PostgreSQL: sqlx's
/// statement cache off, which is also what tells the crate to keep each
/// statement in a transaction of its own (see the [module](self)).
/// Equivalent to `statement-cache-capacity=0` in the URL. It sets the
/// options' sqlx PostgreSQL hook (`map_sqlx_postgres_opts`); an
/// application that needs that hook for more sets the cache there.
#[cfg(feature = "sqlx-postgres")]
pub fn transaction_pooled(options: &mut ConnectOptions) -> &mut ConnectOptions {
    options.map_sqlx_postgres_opts(|pg| pg.statement_cache_capacity(0))
}

/// Whether `db` is a PostgreSQL pool behind a transaction pooler: its
/// statement cache is 0 (see the [module](self)).
pub fn is_transaction_pooled(db: &DatabaseConnection) -> bool {
    #[cfg(feature = "sqlx-postgres")]
    if let sea_orm::DatabaseConnectionType::SqlxPostgresPoolConnection(_) = &db.inner {
        use sea_orm::sqlx::ConnectOptions as _;
        let options = db.get_postgres_connection_pool().connect_options();
        return options
            .to_url_lossy()
            .query_pairs()
            .any(|(name, value)| name == "statement-cache-capacity" && value == "0");
    }
    let _ = db;
    false
}

/// One statement's rows, as the crate sends its own: finished even if the
/// caller is dropped, and in a transaction of its own behind a transaction
/// pooler.
pub async fn query_all<C: ConnectionTrait>(
    db: &C,
    stmt: Statement,
) -> Result<Vec<QueryResult>, DbErr> {
    detach::query_all(db, stmt).await
}

/// [`query_all`]'s first row.
pub async fn query_one<C: ConnectionTrait>(
    db: &C,
    stmt: Statement,
) -> Result<Option<QueryResult>, DbErr> {
    detach::query_one(db, stmt).await
}

/// One statement executed as the crate executes its own (see
/// [`query_all`]).
pub async fn execute<C: ConnectionTrait>(db: &C, stmt: Statement) -> Result<ExecResult, DbErr> {
    detach::execute(db, stmt).await
}

/// `pool.$raw(stmt)`, in a transaction of its own if `pool` is transaction
/// pooled (dropped unfinished, the transaction rolls back).
macro_rules! alone {
    ($name:ident, $raw:ident, $out:ty) => {
        pub(crate) async fn $name(
            pool: &DatabaseConnection,
            stmt: Statement,
        ) -> Result<$out, DbErr> {
            use sea_orm::TransactionTrait;
            if !is_transaction_pooled(pool) {
                return pool.$raw(stmt).await;
            }
            let txn = pool.begin().await?;
            let out = txn.$raw(stmt).await?;
            txn.commit().await?;
            Ok(out)
        }
    };
}

alone!(query_all_alone, query_all_raw, Vec<QueryResult>);
alone!(query_one_alone, query_one_raw, Option<QueryResult>);
alone!(execute_alone, execute_raw, ExecResult);
