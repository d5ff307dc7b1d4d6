//! Child writes that open their own transaction, so the hooks can count
//! exactly; and the bulk writes sea-orm runs without hooks, counted here.

use std::{future::Future, pin::Pin};

use sea_orm::{
    ActiveModelTrait, Condition, ConnectionTrait, DbErr, DeleteResult, Iterable, QueryFilter,
    SqliteTransactionMode, TransactionOptions, TransactionSession, TransactionTrait,
    sea_query::{Expr, ExprTrait},
};

use super::{CounterCache, hooks, rows};
use crate::{Result, retry, sql::Dialect};

/// Begins the transaction a counted write runs in: a savepoint inside the
/// caller's, `BEGIN IMMEDIATE` on a SQLite pool (a deferred transaction
/// that reads, then writes, fails with SQLITE_BUSY when another writer
/// commits in between; an immediate one waits for the write lock instead).
async fn begin<C: TransactionTrait>(db: &C) -> Result<C::Transaction, DbErr> {
    db.begin_with_options(TransactionOptions {
        sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
        ..Default::default()
    })
    .await
}

/// A write inside the transaction [`in_own_transaction`] opened.
type Write<'t, T> = Pin<Box<dyn Future<Output = Result<T, DbErr>> + Send + 't>>;

/// Runs `write` in a transaction of its own (see [`begin`]) and commits it.
/// On a pool, a deadlock runs the whole transaction again: it was rolled
/// back, so nothing is counted twice.
async fn in_own_transaction<E, C, T, F>(db: &C, write: F) -> Result<T>
where
    E: CounterCache,
    C: ConnectionTrait + TransactionTrait,
    F: for<'t> Fn(&'t C::Transaction) -> Write<'t, T> + Sync,
    T: Send,
{
    retry::run_transaction(db, &rows::table_name::<E>(), || async {
        let txn = begin(db).await?;
        let value = write(&txn).await?;
        txn.commit().await?;
        Ok(value)
    })
    .await
}

/// Inserts (`insert`) or updates a row, counted by the hooks.
pub(super) async fn save<E, C>(db: &C, am: E::ActiveModel, insert: bool) -> Result<E::Model>
where
    E: CounterCache,
    C: ConnectionTrait + TransactionTrait,
{
    in_own_transaction::<E, C, _, _>(db, |txn| {
        let am = am.clone();
        Box::pin(async move {
            match insert {
                true => am.insert(txn).await,
                false => am.update(txn).await,
            }
        })
    })
    .await
}

/// Deletes a row, uncounted by the hooks, if it is there when it is locked.
/// A row that is not there is not deleted at all: a `DELETE` sent anyway
/// would run under a newer snapshot (READ COMMITTED) and could remove a row
/// of the same key inserted and committed since, which nothing uncounted.
pub(super) async fn delete<E, C>(db: &C, am: E::ActiveModel) -> Result<DeleteResult>
where
    E: CounterCache,
    C: ConnectionTrait + TransactionTrait,
{
    let key = rows::key_of_active(&am);
    in_own_transaction::<E, C, _, _>(db, |txn| {
        let (am, key) = (am.clone(), key.clone());
        Box::pin(async move {
            // Without its key, sea-orm refuses the delete with its own error.
            if let Some(key) = key
                && rows::lock::<E, _>(txn, key).await?.is_empty()
            {
                // A statement that matches nothing: the only way to make
                // sea-orm's `DeleteResult` (non-exhaustive) of 0 rows.
                return E::delete_many().filter(Expr::val(1).eq(2)).exec(txn).await;
            }
            am.delete(txn).await
        })
    })
    .await
}

/// Inserts the rows and counts them as stored. Rows per statement stay
/// under the backend's bind limit whatever the number of columns.
pub(super) async fn insert_many<E, C, It>(db: &C, rows: It) -> Result<Vec<E::Model>>
where
    E: CounterCache,
    C: ConnectionTrait + TransactionTrait,
    It: IntoIterator<Item = E::ActiveModel>,
{
    let rows: Vec<E::ActiveModel> = rows.into_iter().collect();
    let columns = E::Column::iter().count().max(1);
    let per_statement = (Dialect::of(db)?.max_binds() / columns).clamp(1, rows::KEYS_PER_STATEMENT);
    in_own_transaction::<E, C, _, _>(db, |txn| {
        let rows = rows.clone();
        Box::pin(async move {
            let mut models = Vec::with_capacity(rows.len());
            if txn.support_returning() {
                let mut rows = rows.into_iter().peekable();
                while rows.peek().is_some() {
                    let chunk: Vec<_> = rows.by_ref().take(per_statement).collect();
                    models.extend(E::insert_many(chunk).exec_with_returning(txn).await?);
                }
            } else {
                // No RETURNING (MySQL): one insert and read-back per row.
                for row in rows {
                    models.push(E::insert(row).exec_with_returning(txn).await?);
                }
            }
            for model in &models {
                hooks::lock_model_key::<E, _>(txn, model).await?;
            }
            hooks::count::<E, _>(txn, models.iter().map(|m| (m, 1))).await?;
            Ok(models)
        })
    })
    .await
}

/// Locks the matching rows, updates them by key and moves their
/// contributions, each row's new state computed from the old one and
/// `changes` (see `rows::merged`). Changes that set no counted column are one
/// plain `UPDATE`.
pub(super) async fn update_many<E, C>(
    db: &C,
    filter: Condition,
    changes: E::ActiveModel,
) -> Result<u64>
where
    E: CounterCache,
    C: ConnectionTrait + TransactionTrait,
{
    if !rows::sets_counted::<E>(&changes) {
        return retry::run_transaction(db, &rows::table_name::<E>(), || {
            E::update_many()
                .set(changes.clone())
                .filter(filter.clone())
                .exec(db)
        })
        .await
        .map(|result| result.rows_affected);
    }
    in_own_transaction::<E, C, _, _>(db, |txn| {
        let (filter, changes) = (filter.clone(), changes.clone());
        Box::pin(async move {
            let old = rows::lock::<E, _>(txn, filter).await?;
            let new = old
                .iter()
                .map(|model| rows::merged::<E>(model, &changes))
                .collect::<Result<Vec<_>, DbErr>>()?;
            let mut updated = 0;
            for keys in rows::key_chunks::<E>(&old) {
                updated += E::update_many()
                    .set(changes.clone())
                    .filter(keys)
                    .exec(txn)
                    .await?
                    .rows_affected;
            }
            let signed = old
                .iter()
                .map(|m| (m, -1))
                .chain(new.iter().map(|m| (m, 1)));
            hooks::count::<E, _>(txn, signed).await?;
            Ok(updated)
        })
    })
    .await
}

/// Locks the matching rows, deletes them by key and uncounts exactly them.
pub(super) async fn delete_many<E, C>(db: &C, filter: Condition) -> Result<u64>
where
    E: CounterCache,
    C: ConnectionTrait + TransactionTrait,
{
    in_own_transaction::<E, C, _, _>(db, |txn| {
        let filter = filter.clone();
        Box::pin(async move {
            let old = rows::lock::<E, _>(txn, filter).await?;
            let mut deleted = 0;
            for keys in rows::key_chunks::<E>(&old) {
                deleted += E::delete_many().filter(keys).exec(txn).await?.rows_affected;
            }
            hooks::count::<E, _>(txn, old.iter().map(|m| (m, -1))).await?;
            Ok(deleted)
        })
    })
    .await
}
