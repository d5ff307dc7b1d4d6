//! Child writes that open their own transaction, so the hooks can count
//! exactly; and the bulk writes sea-orm runs without hooks, counted here.

use std::{future::Future, marker::PhantomData, sync::Arc};

use sea_orm::{
    ActiveModelTrait, Condition, ConnectionTrait, DbErr, DeleteResult, Iterable, QueryFilter,
    QueryTrait, SqliteTransactionMode, TransactionOptions, TransactionSession, TransactionTrait,
};

use super::{CounterCache, hooks, parents, rows};
use crate::{Result, detach, observe, retry, sql::Dialect};

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

/// A write that runs inside the transaction [`in_own_transaction`] opens.
/// It owns what it writes, so that on a pool the whole transaction can run
/// in a task of its own (see `crate::detach`): a counted write dropped
/// midway commits or rolls back, and never leaves its connection half way.
trait OwnWrite: Send + Sync + 'static {
    type Output: Send + 'static;

    fn run<'t, C: ConnectionTrait>(
        &'t self,
        txn: &'t C,
    ) -> impl Future<Output = Result<Self::Output, DbErr>> + Send + 't;
}

/// Runs `write` in a transaction of its own (see [`begin`]) and commits it.
/// On a pool, a deadlock runs the whole transaction again: it was rolled
/// back, so nothing is counted twice.
async fn in_own_transaction<E, C, W>(db: &C, write: W) -> Result<W::Output>
where
    E: CounterCache,
    C: ConnectionTrait + TransactionTrait,
    W: OwnWrite,
{
    let write = Arc::new(write);
    retry::run_transaction(db, &rows::table_name::<E>(), || {
        let write = write.clone();
        async move {
            match detach::detached(db) {
                Some(pool) => {
                    let work = |pool| async move { committed(&pool, &*write, true).await };
                    pool.run(work).await
                }
                None => committed(db, &*write, retry::is_pool::<C>()).await,
            }
        }
    })
    .await
}

/// `write` in a new transaction on `db`, committed; the parents its hooks
/// counted are then reported (see [`crate::observe`]) as committed when
/// `db` is a pool (`top_level`), else as written in the caller's
/// transaction, which this one is a savepoint of.
async fn committed<C, W>(db: &C, write: &W, top_level: bool) -> Result<W::Output, DbErr>
where
    C: TransactionTrait,
    W: OwnWrite,
{
    let (value, touched) = observe::scope(async {
        let txn = begin(db).await?;
        let value = write.run(&txn).await?;
        txn.commit().await?;
        Ok(value)
    })
    .await;
    // Told whatever the outcome: a failed COMMIT may have committed.
    touched.wrote(top_level).await;
    value
}

/// An insert (`insert`) or update of one row, counted by the hooks.
struct Save<E: CounterCache> {
    am: E::ActiveModel,
    insert: bool,
}

impl<E: CounterCache> OwnWrite for Save<E> {
    type Output = E::Model;

    async fn run<C: ConnectionTrait>(&self, txn: &C) -> Result<E::Model, DbErr> {
        let am = self.am.clone();
        let written = match self.insert {
            true => am.insert(txn).await,
            false => am.update(txn).await,
        };
        written.map_err(|e| parents::refused::<E>(e, [&self.am]))
    }
}

/// Inserts (`insert`) or updates a row, counted by the hooks.
pub(super) async fn save<E, C>(db: &C, am: E::ActiveModel, insert: bool) -> Result<E::Model>
where
    E: CounterCache,
    C: ConnectionTrait + TransactionTrait,
{
    in_own_transaction::<E, C, _>(db, Save::<E> { am, insert }).await
}

/// The delete of one row, if it is there when it is locked.
struct Delete<E: CounterCache> {
    am: E::ActiveModel,
}

impl<E: CounterCache> OwnWrite for Delete<E> {
    type Output = DeleteResult;

    async fn run<C: ConnectionTrait>(&self, txn: &C) -> Result<DeleteResult, DbErr> {
        // The key's lock before the row's, as the hooks take them.
        hooks::lock_key::<E, _>(txn, &self.am).await?;
        // Without its key, sea-orm refuses the delete with its own error.
        if let Some(key) = rows::key_of_active(&self.am)
            && rows::lock::<E, _>(txn, key).await?.is_empty()
        {
            // Nothing is sent: sea-orm's own result of a delete that
            // removed nothing (`DeleteResult` is non-exhaustive; `empty`
            // is how sea-orm itself builds one).
            return Ok(DeleteResult::empty());
        }
        self.am.clone().delete(txn).await
    }
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
    in_own_transaction::<E, C, _>(db, Delete::<E> { am }).await
}

/// Rows inserted and counted as stored.
struct InsertMany<E: CounterCache> {
    rows: Vec<E::ActiveModel>,
    per_statement: usize,
}

impl<E: CounterCache> OwnWrite for InsertMany<E> {
    type Output = Vec<E::Model>;

    async fn run<C: ConnectionTrait>(&self, txn: &C) -> Result<Vec<E::Model>, DbErr> {
        let mut models = Vec::with_capacity(self.rows.len());
        if txn.support_returning() {
            for chunk in self.rows.chunks(self.per_statement) {
                let inserted = E::insert_many(chunk.to_vec())
                    .exec_with_returning(txn)
                    .await
                    .map_err(|e| parents::refused::<E>(e, chunk))?;
                models.extend(inserted);
            }
        } else {
            // No RETURNING (MySQL): one insert and read-back per row.
            for row in &self.rows {
                let inserted = E::insert(row.clone())
                    .exec_with_returning(txn)
                    .await
                    .map_err(|e| parents::refused::<E>(e, [row]))?;
                models.push(inserted);
            }
        }
        hooks::lock_model_keys::<E, _>(txn, &models).await?;
        hooks::count::<E, _>(txn, models.iter().map(|m| (m, 1))).await?;
        Ok(models)
    }
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
    for row in &rows {
        parents::check::<E>(row)?;
    }
    let columns = E::Column::iter().count();
    let per_statement = Dialect::of(db)?.rows_per_statement(columns, rows::KEYS_PER_STATEMENT);
    in_own_transaction::<E, C, _>(
        db,
        InsertMany::<E> {
            rows,
            per_statement,
        },
    )
    .await
}

/// Matching rows locked, updated by key, their contributions moved.
struct UpdateMany<E: CounterCache> {
    filter: Condition,
    changes: E::ActiveModel,
}

impl<E: CounterCache> OwnWrite for UpdateMany<E> {
    type Output = u64;

    async fn run<C: ConnectionTrait>(&self, txn: &C) -> Result<u64, DbErr> {
        let old = rows::lock::<E, _>(txn, self.filter.clone()).await?;
        let new = old
            .iter()
            .map(|model| rows::merged::<E>(model, &self.changes))
            .collect::<Result<Vec<_>, DbErr>>()?;
        let mut updated = 0;
        for keys in rows::key_chunks::<E>(&old) {
            updated += E::update_many()
                .set(self.changes.clone())
                .filter(keys)
                .exec(txn)
                .await
                .map_err(|e| parents::refused::<E>(e, [&self.changes]))?
                .rows_affected;
        }
        let signed = old
            .iter()
            .map(|m| (m, -1))
            .chain(new.iter().map(|m| (m, 1)));
        hooks::count::<E, _>(txn, signed).await?;
        Ok(updated)
    }
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
            let update = E::update_many()
                .set(changes.clone())
                .filter(filter.clone())
                .build(db.get_database_backend());
            detach::execute(db, update)
        })
        .await
        .map(|result| result.rows_affected());
    }
    parents::check::<E>(&changes)?;
    in_own_transaction::<E, C, _>(db, UpdateMany::<E> { filter, changes }).await
}

/// Matching rows locked, deleted by key, exactly they uncounted.
struct DeleteMany<E> {
    filter: Condition,
    entity: PhantomData<fn() -> E>,
}

impl<E: CounterCache> OwnWrite for DeleteMany<E> {
    type Output = u64;

    async fn run<C: ConnectionTrait>(&self, txn: &C) -> Result<u64, DbErr> {
        let old = rows::lock::<E, _>(txn, self.filter.clone()).await?;
        let mut deleted = 0;
        for keys in rows::key_chunks::<E>(&old) {
            deleted += E::delete_many().filter(keys).exec(txn).await?.rows_affected;
        }
        hooks::count::<E, _>(txn, old.iter().map(|m| (m, -1))).await?;
        Ok(deleted)
    }
}

/// Locks the matching rows, deletes them by key and uncounts exactly them.
pub(super) async fn delete_many<E, C>(db: &C, filter: Condition) -> Result<u64>
where
    E: CounterCache,
    C: ConnectionTrait + TransactionTrait,
{
    let write = DeleteMany::<E> {
        filter,
        entity: PhantomData,
    };
    in_own_transaction::<E, C, _>(db, write).await
}
