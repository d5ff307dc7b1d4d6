//! Counter caches: a parent's counter kept in step with its child rows.
//!
//! `#[derive(CounterCache)]` on a child entity declares which parent
//! counters its rows feed; the hooks in [`hooks`] (installed with one line,
//! [`counter_cache_behavior!`](crate::counter_cache_behavior)) keep them
//! exact on every `insert`, `update`, `save` and `delete` of an
//! `ActiveModel`, and the `*_many_counted` methods do the same for bulk
//! writes, which sea-orm runs without hooks.

pub mod hooks;
mod parents;
mod rows;
mod values;
mod writes;

#[doc(hidden)]
pub use values::{cache_amount, cache_delta, cache_parent, cache_when};

use std::future::Future;

use sea_orm::{
    Condition, ConnectionTrait, DatabaseConnection, DeleteResult, EntityTrait, IntoActiveModel,
    TransactionTrait, TryIntoModel,
};

use crate::{DeltaBatch, Result, SlottedCounter};

/// A child entity whose rows feed counters of parent entities: comments
/// counted on their post, orders summed on their customer.
///
/// Implemented by `#[derive(CounterCache)]` (see it for the attribute). What
/// the counters are kept in step with, and how:
///
/// | write | counter change |
/// |---|---|
/// | insert | `+1` to the parent's key (or `+amount` with `sum`), if the row meets `when` |
/// | delete | `-1` (or `-amount`), only if this delete removed the row: the row is locked and read first, so two concurrent deletes of one row decrement once, and a row that is not there is not deleted (a row of the same key inserted meanwhile stays, counted) |
/// | update of the parent id, amount or condition | `-old` and `+new` in one sorted statement; updates of other columns cost nothing; a row that is not there when it is locked is `DbErr::RecordNotUpdated` |
///
/// # Transactions
///
/// The counter writes happen in the connection sea-orm gives the hooks: the
/// caller's transaction, so the counter commits or rolls back with the row.
/// On a bare pool a child write and its counter write would be two commits
/// and an exact delete impossible, so the hooks refuse a pool (and sea-orm's
/// `DatabaseExecutor`, which may wrap one) with
/// [`CounterError::TransactionRequired`](crate::CounterError::TransactionRequired)
/// before writing anything; an update that sets no counted column changes
/// no counter and runs anywhere. Either pass a transaction, or use the
/// `*_counted` methods below, which open one (a savepoint inside a caller's
/// transaction; on a SQLite pool `BEGIN IMMEDIATE`, so writers queue instead
/// of failing) and retry deadlocks when they own it.
///
/// In your own transaction:
/// * **roll back after any error.** The hooks write counters before the row
///   is updated or deleted; PostgreSQL aborts the transaction when the row
///   write fails, MySQL and SQLite do not, and a commit would keep the
///   counter change without the row change;
/// * on SQLite, begin it `IMMEDIATE`
///   (`begin_with_options(TransactionOptions { sqlite_transaction_mode: Some(Immediate), .. })`):
///   a deferred transaction that reads and then writes gets `SQLITE_BUSY`
///   when another writer commits in between (counts stay right; the write
///   fails);
/// * a hook's own error (an overflow, a missing counter table) reaches you
///   as the `DbErr` sea-orm's hooks must return; `CounterError::from(db_err)`
///   gets it back typed. The `*_counted` methods return it typed.
///
/// # Writes that bypass the hooks
///
/// sea-orm runs `ActiveModelBehavior` hooks only from the `ActiveModel`
/// methods (`insert`, `update`, `save`, `delete`). **Everything else changes
/// rows without changing counters**: `Entity::insert_many`, `update_many`,
/// `delete_many`, `delete_by_id`, `Entity::insert(am).exec(..)` and its
/// `on_conflict` upserts, `Entity::update(am).exec(..)`, raw SQL, and the
/// database's own `ON DELETE CASCADE` / `SET NULL` (deleting a post that
/// cascades to its comments leaves their authors' counts behind). Use
/// [`insert_many_counted`](Self::insert_many_counted),
/// [`update_many_counted`](Self::update_many_counted) and
/// [`delete_many_counted`](Self::delete_many_counted) for bulk writes, and
/// repair drift from the others with
/// [`Counters::reconcile`](crate::Counters::reconcile).
///
/// A cached key with a time window counts each change in the bucket of the
/// moment it is written: deleting a week-old comment takes 1 from today's
/// bucket, not from last week's. A recount repairs the total only.
///
/// ```
/// mod post {
///     use sea_orm::entity::prelude::*;
///
///     #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_core::SlottedCounter)]
///     #[sea_orm(table_name = "posts")]
///     #[counter(keys(comments, published_comments))]
///     pub struct Model {
///         #[sea_orm(primary_key)]
///         pub id: i64,
///     }
///
///     #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
///     pub enum Relation {}
///
///     impl ActiveModelBehavior for ActiveModel {}
/// }
///
/// mod comment {
///     use sea_orm::entity::prelude::*;
///
///     #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_core::CounterCache)]
///     #[sea_orm(table_name = "comments")]
///     #[counter_cache(parent = super::post::Entity, key = comments, via = post_id)]
///     #[counter_cache(parent = super::post::Entity, key = published_comments, via = post_id, when = published)]
///     pub struct Model {
///         #[sea_orm(primary_key)]
///         pub id: i64,
///         pub post_id: i64,
///         pub published: bool,
///     }
///
///     #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
///     pub enum Relation {}
///
///     // In place of `impl ActiveModelBehavior for ActiveModel {}`.
///     counter_core::counter_cache_behavior!();
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use counter_core::{Reconcile, Truth, prelude::*};
/// use post::counters::Key;
/// use sea_orm::{ActiveModelTrait, ConnectionTrait, IntoActiveModel, Schema, Set, TransactionTrait};
///
/// let db = sea_orm::Database::connect("sqlite::memory:").await?;
/// # let schema = Schema::new(db.get_database_backend());
/// # db.execute(&schema.create_table_from_entity(comment::Entity)).await?;
/// # post::Entity::counters().create_table(&db).await?;
/// let draft = comment::ActiveModel { post_id: Set(1), published: Set(false), ..Default::default() };
/// let draft = comment::Entity::insert_counted(&db, draft).await?; // own transaction
///
/// // Or the ActiveModel methods, in your transaction:
/// let txn = db.begin().await?;
/// let mut publish = draft.into_active_model();
/// publish.published = Set(true);
/// let published = publish.update(&txn).await?; // published_comments: +1
/// txn.commit().await?;
///
/// let counts = post::Entity::counters().counts(&db, 1).await?;
/// assert_eq!((counts.comments, counts.published_comments), (1, 1));
///
/// let gone = comment::Entity::delete_counted(&db, published.clone().into_active_model()).await?;
/// let again = comment::Entity::delete_counted(&db, published.into_active_model()).await?;
/// assert_eq!((gone.rows_affected, again.rows_affected), (1, 0)); // decremented once
/// assert_eq!(post::Entity::counters().get(&db, 1, Key::Comments).await?, 0);
///
/// // The truth, derived from the declaration: nothing to repair.
/// let truth = Truth::counter_cache::<comment::Entity>();
/// let report = post::Entity::counters().reconcile(&db, Key::Comments, truth, &Reconcile::new()).await?;
/// assert_eq!(report.owners_drifted, 0);
/// # Ok(())
/// # }
/// ```
pub trait CounterCache:
    EntityTrait<
        Model: IntoActiveModel<Self::ActiveModel> + Sync,
        ActiveModel: TryIntoModel<Self::Model> + Send + Sync,
    >
{
    /// Adds `sign` (`1` or `-1`) times this row's contribution to each
    /// counter it feeds.
    fn count_row(model: &Self::Model, sign: i64, deltas: &mut DeltaBatch) -> Result<()>;

    /// The columns a contribution depends on (parent ids, amounts,
    /// conditions): an update that sets none of them changes no counter.
    fn counted_columns() -> Vec<Self::Column>;

    /// The declared caches, from which [`Truth::counter_cache`](crate::Truth::counter_cache)
    /// derives the true counts.
    fn cache_rules() -> Vec<CacheRule<Self>>;

    /// Inserts a row and counts it, in one transaction.
    fn insert_counted<C>(
        db: &C,
        am: Self::ActiveModel,
    ) -> impl Future<Output = Result<Self::Model>> + Send
    where
        C: ConnectionTrait + TransactionTrait,
    {
        writes::save::<Self, C>(db, am, true)
    }

    /// Updates a row and moves its contribution if needed, in one transaction.
    fn update_counted<C>(
        db: &C,
        am: Self::ActiveModel,
    ) -> impl Future<Output = Result<Self::Model>> + Send
    where
        C: ConnectionTrait + TransactionTrait,
    {
        writes::save::<Self, C>(db, am, false)
    }

    /// Deletes a row and uncounts it if this delete removed it, in one
    /// transaction. `rows_affected` is 0 when the row was already gone; then
    /// no `DELETE` is sent at all, so a row of the same key inserted at
    /// that instant (a natural key: a favorite toggled twice) is kept and
    /// stays counted. Exact at every isolation level; prefer it to
    /// `am.delete(&txn)` for rows that come and go (see [`hooks`]).
    fn delete_counted<C>(
        db: &C,
        am: Self::ActiveModel,
    ) -> impl Future<Output = Result<DeleteResult>> + Send
    where
        C: ConnectionTrait + TransactionTrait,
    {
        writes::delete::<Self, C>(db, am)
    }

    /// Inserts many rows and counts them, in one transaction; returns them
    /// as stored. One multi-row `INSERT ... RETURNING` per 1,000 rows where
    /// the backend returns rows (PostgreSQL, SQLite), one insert per row on
    /// MySQL/MariaDB; then one sorted upsert per 1,000 touched counters.
    fn insert_many_counted<C, It>(
        db: &C,
        rows: It,
    ) -> impl Future<Output = Result<Vec<Self::Model>>> + Send
    where
        C: ConnectionTrait + TransactionTrait,
        It: IntoIterator<Item = Self::ActiveModel> + Send,
        It::IntoIter: Send,
    {
        writes::insert_many::<Self, C, It>(db, rows)
    }

    /// Sets the `Set` columns of `changes` on every row matching `filter`,
    /// moving contributions, in one transaction. The matching rows are
    /// locked in primary-key order, updated by key, and read again; returns
    /// how many rows were updated.
    fn update_many_counted<C>(
        db: &C,
        filter: Condition,
        changes: Self::ActiveModel,
    ) -> impl Future<Output = Result<u64>> + Send
    where
        C: ConnectionTrait + TransactionTrait,
    {
        writes::update_many::<Self, C>(db, filter, changes)
    }

    /// Deletes every row matching `filter` and uncounts exactly the rows
    /// this call removed, in one transaction; returns how many.
    fn delete_many_counted<C>(db: &C, filter: Condition) -> impl Future<Output = Result<u64>> + Send
    where
        C: ConnectionTrait + TransactionTrait,
    {
        writes::delete_many::<Self, C>(db, filter)
    }

    /// Recounts every counter this entity's caches feed from its rows and
    /// repairs what differs; returns how many (owner, cache) counts were
    /// repaired. One [`Counters::reconcile`](crate::Counters::reconcile)
    /// per cache, exact while the application writes.
    ///
    /// What a test fixture calls after seeding rows with `insert_many`
    /// (which runs no hooks), a task after an import by raw SQL, and a
    /// deploy after adding a cache to a table that has rows.
    fn recount_counters(db: &DatabaseConnection) -> impl Future<Output = Result<u64>> + Send {
        Self::recount_caches(db, true)
    }

    /// How many (owner, cache) counts differ from this entity's rows,
    /// writing nothing: a test's assertion that its fixtures left the
    /// counters exact (`assert_eq!(comment::Entity::check_counters(&db).await?, 0)`).
    fn check_counters(db: &DatabaseConnection) -> impl Future<Output = Result<u64>> + Send {
        Self::recount_caches(db, false)
    }

    /// Recounts each declared cache, repairing if `repair`; returns the
    /// counts that differed. Generated by the derive.
    #[doc(hidden)]
    fn recount_caches(
        db: &DatabaseConnection,
        repair: bool,
    ) -> impl Future<Output = Result<u64>> + Send;
}

/// One cache's recount, for the derive's `recount_caches`: the parent
/// `P`'s `key`, from `E`'s rows.
#[doc(hidden)]
pub async fn recount_cache<E: CounterCache, P: SlottedCounter>(
    db: &DatabaseConnection,
    key: P::Key,
    repair: bool,
) -> Result<u64> {
    let report = P::counters()
        .reconcile(
            db,
            key,
            crate::Truth::counter_cache::<E>(),
            &crate::Reconcile::new().dry_run(!repair),
        )
        .await?;
    Ok(report.owners_drifted)
}

/// One declared counter cache: which parent counter a child's rows feed,
/// and how a row's contribution is decided. The true counts of a cache are
/// `SELECT via, COUNT(*) | SUM(sum) FROM child WHERE via IS NOT NULL [AND when = b] GROUP BY via`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheRule<E: EntityTrait> {
    /// The parent's companion counter table.
    pub parent_table: &'static str,
    /// The parent's counter key.
    pub key: &'static str,
    /// The child column holding the parent id.
    pub via: E::Column,
    /// The column whose value is added instead of 1, if any.
    pub sum: Option<E::Column>,
    /// A boolean column and the value a row must hold to count, if any.
    pub when: Option<(E::Column, bool)>,
}

/// Implements `ActiveModelBehavior` with the counter-cache hooks, in one
/// line: write `counter_core::counter_cache_behavior!();` in the entity's
/// module in place of `impl ActiveModelBehavior for ActiveModel {}`.
///
/// An entity with hooks of its own calls the functions in
/// [`hooks`](crate::hooks) from them instead (after its own
/// changes, so the counted values are the ones written).
///
/// The two-argument form names other types: `counter_cache_behavior!(ActiveModel, Entity)`.
#[macro_export]
macro_rules! counter_cache_behavior {
    () => {
        $crate::counter_cache_behavior!(ActiveModel, Entity);
    };
    ($active_model:ty, $entity:ty) => {
        #[$crate::__private_0_1_0::sea_orm::prelude::async_trait::async_trait]
        impl $crate::__private_0_1_0::sea_orm::ActiveModelBehavior for $active_model {
            async fn before_save<C>(
                self,
                db: &C,
                insert: bool,
            ) -> ::core::result::Result<Self, $crate::__private_0_1_0::sea_orm::DbErr>
            where
                C: $crate::__private_0_1_0::sea_orm::ConnectionTrait,
            {
                $crate::hooks::before_save::<$entity, C>(self, db, insert).await
            }

            async fn after_save<C>(
                model: <$entity as $crate::__private_0_1_0::sea_orm::EntityTrait>::Model,
                db: &C,
                insert: bool,
            ) -> ::core::result::Result<
                <$entity as $crate::__private_0_1_0::sea_orm::EntityTrait>::Model,
                $crate::__private_0_1_0::sea_orm::DbErr,
            >
            where
                C: $crate::__private_0_1_0::sea_orm::ConnectionTrait,
            {
                $crate::hooks::after_save::<$entity, C>(model, db, insert).await
            }

            async fn before_delete<C>(
                self,
                db: &C,
            ) -> ::core::result::Result<Self, $crate::__private_0_1_0::sea_orm::DbErr>
            where
                C: $crate::__private_0_1_0::sea_orm::ConnectionTrait,
            {
                $crate::hooks::before_delete::<$entity, C>(self, db).await
            }
        }
    };
}
