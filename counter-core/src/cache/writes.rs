//! Child writes that open their own transaction, so the hooks can count
//! exactly; and the bulk writes sea-orm runs without hooks, counted here.

use sea_orm::{
    ActiveModelTrait, Condition, ConnectionTrait, DbErr, DeleteResult, EntityName, QueryFilter,
    SqliteTransactionMode, TransactionOptions, TransactionSession, TransactionTrait,
};

use super::{CounterCache, rows};
use crate::{CounterError, DeltaBatch, Result, retry};

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

fn table<E: EntityName>() -> String {
    E::default().table_name().to_owned()
}

/// Inserts (`insert`) or updates a row in a transaction of its own, so the
/// hooks count it exactly; on a pool, a deadlock runs the whole transaction
/// again (it was rolled back, so nothing is counted twice).
pub(super) async fn save<E, C>(db: &C, am: E::ActiveModel, insert: bool) -> Result<E::Model>
where
    E: CounterCache,
    C: ConnectionTrait + TransactionTrait,
{
    retry::run(db, &table::<E>(), || {
        let am = am.clone();
        async move {
            let txn = begin(db).await?;
            let model = match insert {
                true => am.insert(&txn).await?,
                false => am.update(&txn).await?,
            };
            txn.commit().await?;
            Ok(model)
        }
    })
    .await
}

/// [`save`] for a delete.
pub(super) async fn delete<E, C>(db: &C, am: E::ActiveModel) -> Result<DeleteResult>
where
    E: CounterCache,
    C: ConnectionTrait + TransactionTrait,
{
    retry::run(db, &table::<E>(), || {
        let am = am.clone();
        async move {
            let txn = begin(db).await?;
            let result = am.delete(&txn).await?;
            txn.commit().await?;
            Ok(result)
        }
    })
    .await
}

/// Counts `signed` rows and applies the deltas in `txn`. The crate's own
/// errors ride in the `DbErr` (see `CounterError::into_db_err`) and come
/// out of `retry::run` typed.
async fn count_in<'m, E, C>(
    txn: &C,
    signed: impl Iterator<Item = (&'m E::Model, i64)>,
) -> Result<(), DbErr>
where
    E: CounterCache,
    C: ConnectionTrait,
{
    let mut deltas = DeltaBatch::new();
    for (model, sign) in signed {
        E::count_row(model, sign, &mut deltas).map_err(CounterError::into_db_err)?;
    }
    deltas.apply(txn).await.map_err(CounterError::into_db_err)?;
    Ok(())
}

pub(super) async fn insert_many<E, C, It>(db: &C, rows: It) -> Result<Vec<E::Model>>
where
    E: CounterCache,
    C: ConnectionTrait + TransactionTrait,
    It: IntoIterator<Item = E::ActiveModel>,
{
    let rows: Vec<E::ActiveModel> = rows.into_iter().collect();
    retry::run(db, &table::<E>(), || {
        let rows = rows.clone();
        async move {
            let txn = begin(db).await?;
            let mut models = Vec::with_capacity(rows.len());
            if txn.support_returning() {
                let mut rows = rows.into_iter().peekable();
                while rows.peek().is_some() {
                    let chunk: Vec<_> = rows.by_ref().take(rows::KEYS_PER_STATEMENT).collect();
                    models.extend(E::insert_many(chunk).exec_with_returning(&txn).await?);
                }
            } else {
                for row in rows {
                    models.push(E::insert(row).exec_with_returning(&txn).await?);
                }
            }
            count_in::<E, _>(&txn, models.iter().map(|m| (m, 1))).await?;
            txn.commit().await?;
            Ok(models)
        }
    })
    .await
}

pub(super) async fn update_many<E, C>(
    db: &C,
    filter: Condition,
    changes: E::ActiveModel,
) -> Result<u64>
where
    E: CounterCache,
    C: ConnectionTrait + TransactionTrait,
{
    retry::run(db, &table::<E>(), || {
        let (filter, changes) = (filter.clone(), changes.clone());
        async move {
            let txn = begin(db).await?;
            let old = rows::lock::<E, _>(&txn, filter).await?;
            let keys: Vec<_> = old.iter().map(rows::key_of::<E>).collect();
            let mut updated = 0;
            let mut new = Vec::with_capacity(old.len());
            for chunk in keys.chunks(rows::KEYS_PER_STATEMENT) {
                let by_key = rows::keys_in::<E>(chunk);
                updated += E::update_many()
                    .set(changes.clone())
                    .filter(by_key.clone())
                    .exec(&txn)
                    .await?
                    .rows_affected;
                new.extend(E::find().filter(by_key).all(&txn).await?);
            }
            let signed = old
                .iter()
                .map(|m| (m, -1))
                .chain(new.iter().map(|m| (m, 1)));
            count_in::<E, _>(&txn, signed).await?;
            txn.commit().await?;
            Ok(updated)
        }
    })
    .await
}

pub(super) async fn delete_many<E, C>(db: &C, filter: Condition) -> Result<u64>
where
    E: CounterCache,
    C: ConnectionTrait + TransactionTrait,
{
    retry::run(db, &table::<E>(), || {
        let filter = filter.clone();
        async move {
            let txn = begin(db).await?;
            let old = rows::lock::<E, _>(&txn, filter).await?;
            let keys: Vec<_> = old.iter().map(rows::key_of::<E>).collect();
            let mut deleted = 0;
            for chunk in keys.chunks(rows::KEYS_PER_STATEMENT) {
                deleted += E::delete_many()
                    .filter(rows::keys_in::<E>(chunk))
                    .exec(&txn)
                    .await?
                    .rows_affected;
            }
            count_in::<E, _>(&txn, old.iter().map(|m| (m, -1))).await?;
            txn.commit().await?;
            Ok(deleted)
        }
    })
    .await
}
