//! The `ActiveModelBehavior` hooks of a child entity with counter caches.
//!
//! Every hook runs in the connection sea-orm hands it, which is the caller's:
//! the counter writes commit or roll back with the child row. Each write
//! first locks the child row it reads (`SELECT ... FOR UPDATE`), so of two
//! concurrent deletes of one row only the first finds it and decrements; the
//! second waits for the first to commit, then finds nothing.
//!
//! What the statement after the hook changes is what the hook locked: an
//! update whose row is not there when its hook looks fails with
//! `DbErr::RecordNotUpdated` before it writes (as sea-orm's own update of a
//! missing row does), and a delete whose row is not there removes nothing
//! that is counted. A row of the same key inserted at that instant is kept
//! apart by the row lock on MySQL/MariaDB, by `BEGIN IMMEDIATE` on SQLite
//! and, on PostgreSQL, for entities whose key the application chooses, by a
//! transaction-scoped lock on the key (see `sql::row_key_locks`).
//!
//! One case the hooks cannot close: on MySQL/MariaDB at READ COMMITTED
//! (not its default), `am.delete(&txn)` of a natural-key row that is not
//! there when the hook looks takes no gap lock, and sea-orm's `DELETE` that
//! follows may remove a row of that key inserted and committed in between,
//! uncounted. `delete_counted` (which also takes the caller's transaction)
//! sends no `DELETE` for a row it did not lock, and is exact there too.
//!
//! `before_save` and `before_delete` write the counters before sea-orm
//! writes the row. On PostgreSQL a failed row write aborts the transaction;
//! on MySQL and SQLite it does not, so **after any error, roll the
//! transaction back** (the `*_counted` methods of [`CounterCache`] do):
//! committing anyway would keep a counter change whose row change failed.

use std::any::type_name;

use sea_orm::{ConnectionTrait, DatabaseExecutor, DbErr, EntityTrait};

use super::{CounterCache, parents, rows};
use crate::{
    CounterError, DeltaBatch, retry,
    sql::{self, Dialect},
};

/// The `before_save` hook: on an update that changes a counted column (the
/// parent id, the summed amount or the condition), locks and reads the old
/// row and moves its contribution: `-old`, `+new`, folded (a move within one
/// parent, or a change that keeps the condition's outcome, writes nothing).
/// Inserts are counted in [`after_save`], from the row the database stored.
///
/// An update that sets no counted column changes no counter and runs on any
/// connection. Anything else fails before it writes when `db` is a pool:
/// see [`CounterCache`] for why the hooks need a transaction.
pub async fn before_save<E, C>(
    am: E::ActiveModel,
    db: &C,
    insert: bool,
) -> Result<E::ActiveModel, DbErr>
where
    E: CounterCache,
    C: ConnectionTrait,
{
    if !insert && !rows::sets_counted::<E>(&am) {
        return Ok(am);
    }
    require_transaction::<E, C>(if insert { "insert" } else { "update" })?;
    // Before the row's statement: a parent id its column cannot hold is the
    // caller's error, not the database's.
    parents::check::<E>(&am).map_err(CounterError::into_db_err)?;
    if insert {
        return Ok(am);
    }
    let Some(key) = rows::key_of_active(&am) else {
        return Ok(am);
    };
    lock_key::<E, C>(db, &am).await?;
    let Some(old) = rows::lock::<E, C>(db, key).await?.pop() else {
        // No row to move, so nothing may be updated: sea-orm's `UPDATE`
        // would run under a newer snapshot and could update a row inserted
        // since, whose contribution this hook never moved.
        return Err(DbErr::RecordNotUpdated);
    };
    let new = rows::merged::<E>(&old, &am)?;
    count::<E, C>(db, [(&old, -1), (&new, 1)]).await?;
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
        require_transaction::<E, C>("insert")?;
        lock_model_keys::<E, C>(db, std::slice::from_ref(&model)).await?;
        count::<E, C>(db, [(&model, 1)]).await?;
    }
    Ok(model)
}

/// PostgreSQL, natural keys: the inserted rows' key locks, shared (see
/// `sql::row_key_locks`).
pub(super) async fn lock_model_keys<E, C>(db: &C, models: &[E::Model]) -> Result<(), DbErr>
where
    E: CounterCache,
    C: ConnectionTrait,
{
    if !takes_key_locks::<E, C>(db) {
        return Ok(());
    }
    let keys: Vec<Vec<sea_orm::Value>> = models.iter().map(rows::key_of::<E>).collect();
    lock_values::<E, C>(db, keys.iter().map(Vec::as_slice), false).await
}

/// PostgreSQL, natural keys: the row key lock of a delete or a move,
/// exclusive, taken before the row is read (see `sql::row_key_locks`).
pub(super) async fn lock_key<E, C>(db: &C, am: &E::ActiveModel) -> Result<(), DbErr>
where
    E: CounterCache,
    C: ConnectionTrait,
{
    if !takes_key_locks::<E, C>(db) {
        return Ok(());
    }
    match rows::key_values_of_active(am) {
        Some(key) => lock_values::<E, C>(db, [key.as_slice()], true).await,
        None => Ok(()),
    }
}

/// Whether writes of `E` on `db` take row key locks: a natural key on
/// PostgreSQL. Asked first, so that the other writes (auto-increment keys,
/// the other backends) build no keys at all.
fn takes_key_locks<E: CounterCache, C: ConnectionTrait>(db: &C) -> bool {
    rows::natural_key::<E>() && Dialect::of(db).is_ok_and(sql::takes_row_key_locks)
}

async fn lock_values<'k, E, C>(
    db: &C,
    keys: impl IntoIterator<Item = &'k [sea_orm::Value]>,
    exclusive: bool,
) -> Result<(), DbErr>
where
    E: CounterCache,
    C: ConnectionTrait,
{
    let dialect = Dialect::of(db).map_err(CounterError::into_db_err)?;
    for lock in sql::row_key_locks(dialect, &rows::table_name::<E>(), keys, exclusive) {
        db.execute_raw(lock).await?;
    }
    Ok(())
}

/// The `before_delete` hook: locks and reads the row, and takes its
/// contribution away if it is still there. The delete that follows in the
/// same transaction is then the one that removes it.
pub async fn before_delete<E, C>(am: E::ActiveModel, db: &C) -> Result<E::ActiveModel, DbErr>
where
    E: CounterCache,
    C: ConnectionTrait,
{
    require_transaction::<E, C>("delete")?;
    let Some(key) = rows::key_of_active(&am) else {
        return Ok(am);
    };
    lock_key::<E, C>(db, &am).await?;
    if let Some(old) = rows::lock::<E, C>(db, key).await?.pop() {
        count::<E, C>(db, [(&old, -1)]).await?;
    }
    Ok(am)
}

/// Adds each row's contribution times its sign to the counters, in one
/// sorted statement per counter table, on `db`. The crate's own errors ride
/// in the `DbErr` (see `CounterError::into_db_err`) and come out of the
/// `*_counted` methods typed.
pub(super) async fn count<'m, E, C>(
    db: &C,
    signed: impl IntoIterator<Item = (&'m E::Model, i64)>,
) -> Result<(), DbErr>
where
    E: CounterCache,
    C: ConnectionTrait,
{
    let mut deltas = DeltaBatch::new();
    for (model, sign) in signed {
        E::count_row(model, sign, &mut deltas).map_err(CounterError::into_db_err)?;
    }
    deltas
        .apply_in(db)
        .await
        .map_err(CounterError::into_db_err)?;
    Ok(())
}

/// On a pool, the child write and its counter write would be two separate
/// commits, and two deletes of one row could both see it: refuse, before
/// anything is written, and say what to do instead. sea-orm's
/// `DatabaseExecutor` may wrap a pool, so it is refused too; other
/// connection types (a transaction, an application's own wrapper of one)
/// are trusted to be transactions.
fn require_transaction<E: EntityTrait, C: ConnectionTrait>(
    operation: &'static str,
) -> Result<(), DbErr> {
    let name = type_name::<C>().trim_start_matches('&');
    let executor = name.starts_with(type_name::<DatabaseExecutor<'static>>());
    if !retry::is_pool::<C>() && !executor {
        return Ok(());
    }
    let table = rows::table_name::<E>();
    let call_site = call_site();
    tracing::error!(
        table,
        operation,
        call_site = call_site
            .as_deref()
            .unwrap_or("unknown (build with debug info)"),
        "a counter-cached row was written on a connection pool; refused"
    );
    Err(CounterError::TransactionRequired {
        table,
        operation,
        call_site,
    }
    .into_db_err())
}

/// Where the application called `insert`, `update`, `save` or `delete`:
/// the first frame of the backtrace in the application's own code (not
/// in the standard library, a registry crate or this crate) below SeaORM's
/// `ActiveModelTrait` method that ran the hooks, so an app's own
/// `ActiveModelBehavior` (which calls [`before_save`] from its
/// `before_save`) is passed over too, however its async frames are named.
/// As `path:line:column`. Needs debug info, as in tests and debug builds
/// (line tables are enough); `None` without. Only the refusal pays for the
/// backtrace.
fn call_site() -> Option<String> {
    let trace = std::backtrace::Backtrace::force_capture().to_string();
    // Paths compared with `/` separators, wherever the toolchain and the
    // registry live (`CARGO_HOME`, `RUSTUP_HOME`, Windows).
    let own = concat!(env!("CARGO_MANIFEST_DIR"), "/").replace('\\', "/");
    let foreign = [
        "/rustc/",
        "/rustlib/src/",
        "/registry/src/",
        "/git/checkouts/",
    ];
    let locations: Vec<(&str, String)> = trace
        .lines()
        .filter_map(|line| line.trim().strip_prefix("at "))
        .map(|location| (location, location.replace('\\', "/")))
        .collect();
    // Innermost first: the hooks, the app's behaviour impl, SeaORM's
    // `insert`/`update`/`save`/`delete`, then the caller.
    let ran_hooks =
        |path: &str| path.contains("sea-orm") && path.contains("/src/entity/active_model.rs");
    let below = locations
        .iter()
        .rposition(|(_, path)| ran_hooks(path))
        .map_or(0, |at| at + 1);
    locations[below..]
        .iter()
        .find(|(_, path)| {
            !(foreign.iter().any(|dir| path.contains(dir))
                || path.starts_with(&own)
                || path.contains("counter-core/src/"))
        })
        .map(|(location, _)| (*location).to_owned())
}
