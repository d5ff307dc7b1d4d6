//! The `ActiveModelBehavior` hooks of a child entity with counter caches.
//!
//! Every hook runs in the connection sea-orm hands it, which is the caller's:
//! the counter writes commit or roll back with the child row. Each write
//! first locks the child row it reads (`SELECT ... FOR UPDATE`), so of two
//! concurrent deletes of one row only the first finds it and decrements; the
//! second waits for the first to commit, then finds nothing.
//!
//! `before_save` and `before_delete` write the counters before sea-orm
//! writes the row: if that write then fails, roll the transaction back (the
//! `*_counted` methods of [`CounterCache`] do).

use sea_orm::{
    ActiveModelTrait, ActiveValue, ConnectionTrait, DbErr, EntityTrait, IntoActiveModel, Iterable,
    TryIntoModel,
};

use super::{CounterCache, rows};
use crate::{CounterError, DeltaBatch, retry};

/// The `before_save` hook: on an update that changes a counted column (the
/// parent id, the summed amount or the condition), locks and reads the old
/// row and moves its contribution: `-old`, `+new`, folded (a move within one
/// parent, or a change that keeps the condition's outcome, writes nothing).
/// Inserts are counted in [`after_save`], from the row the database stored.
///
/// Fails before anything is written when `db` is a connection pool: see
/// [`CounterCache`] for why the hooks need a transaction.
pub async fn before_save<E, C>(
    am: E::ActiveModel,
    db: &C,
    insert: bool,
) -> Result<E::ActiveModel, DbErr>
where
    E: CounterCache,
    C: ConnectionTrait,
{
    require_transaction::<E, C>()?;
    if insert || !E::counted_columns().into_iter().any(|c| am.get(c).is_set()) {
        return Ok(am);
    }
    let Some(key) = rows::key_of_active(&am) else {
        return Ok(am);
    };
    let Some(old) = rows::lock::<E, C>(db, key).await?.pop() else {
        // No such row: sea-orm's update fails with RecordNotUpdated.
        return Ok(am);
    };
    let mut merged = old.clone().into_active_model();
    for col in E::Column::iter() {
        if let ActiveValue::Set(v) = am.get(col) {
            merged.try_set(col, v)?;
        }
    }
    let new = merged.try_into_model()?;
    let mut deltas = DeltaBatch::new();
    E::count_row(&old, -1, &mut deltas).map_err(CounterError::into_db_err)?;
    E::count_row(&new, 1, &mut deltas).map_err(CounterError::into_db_err)?;
    deltas.apply(db).await.map_err(CounterError::into_db_err)?;
    Ok(am)
}

/// The `after_save` hook: counts an inserted row, as stored (database
/// defaults included).
pub async fn after_save<E, C>(model: E::Model, db: &C, insert: bool) -> Result<E::Model, DbErr>
where
    E: CounterCache,
    C: ConnectionTrait,
{
    if insert {
        let mut deltas = DeltaBatch::new();
        E::count_row(&model, 1, &mut deltas).map_err(CounterError::into_db_err)?;
        deltas.apply(db).await.map_err(CounterError::into_db_err)?;
    }
    Ok(model)
}

/// The `before_delete` hook: locks and reads the row, and takes its
/// contribution away if it is still there. The delete that follows in the
/// same transaction is then the one that removes it.
pub async fn before_delete<E, C>(am: E::ActiveModel, db: &C) -> Result<E::ActiveModel, DbErr>
where
    E: CounterCache,
    C: ConnectionTrait,
{
    require_transaction::<E, C>()?;
    let Some(key) = rows::key_of_active(&am) else {
        return Ok(am);
    };
    if let Some(old) = rows::lock::<E, C>(db, key).await?.pop() {
        let mut deltas = DeltaBatch::new();
        E::count_row(&old, -1, &mut deltas).map_err(CounterError::into_db_err)?;
        deltas.apply(db).await.map_err(CounterError::into_db_err)?;
    }
    Ok(am)
}

/// On a pool, the child write and its counter write would be two separate
/// commits, and two deletes of one row could both see it: refuse, before
/// anything is written, and say what to do instead.
fn require_transaction<E: EntityTrait, C: ConnectionTrait>() -> Result<(), DbErr> {
    if !retry::is_pool::<C>() {
        return Ok(());
    }
    let table = E::default().table_name().to_owned();
    Err(CounterError::TransactionRequired { table }.into_db_err())
}
