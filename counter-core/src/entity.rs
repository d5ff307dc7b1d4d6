//! Binding an owner entity to its counters.

use std::future::Future;

use sea_orm::{ConnectionTrait, EntityTrait, TransactionTrait};

use crate::{BatchOutcome, CountMap, CounterKey, Counters, OwnerId, Result};

/// An entity whose rows own counters in a companion table.
///
/// `#[derive(SlottedCounter)]` implements it with a typed key enum, so a
/// misspelt counter is a compile error. It can also be written by hand:
///
/// ```
/// use std::sync::LazyLock;
/// use counter_core::{CounterTable, Counters, SlottedCounter};
///
/// mod post {
///     use sea_orm::entity::prelude::*;
///
///     #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
///     #[sea_orm(table_name = "posts")]
///     pub struct Model {
///         #[sea_orm(primary_key)]
///         pub id: i64,
///     }
///     #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
///     pub enum Relation {}
///     impl ActiveModelBehavior for ActiveModel {}
/// }
///
/// impl SlottedCounter for post::Entity {
///     type OwnerId = i64;
///     type Key = &'static str;
///
///     fn counters() -> &'static Counters<i64> {
///         static COUNTERS: LazyLock<Counters<i64>> = LazyLock::new(|| {
///             Counters::new(CounterTable::new("post_counters").expect("a valid table name"))
///         });
///         &COUNTERS
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let db = sea_orm::Database::connect("sqlite::memory:").await?;
/// # post::Entity::counters().create_table(&db).await?;
/// post::Entity::increment(&db, 1, "likes").await?;
/// assert_eq!(post::Entity::get(&db, &1, "likes").await?, 1);
/// # Ok(())
/// # }
/// ```
pub trait SlottedCounter: EntityTrait {
    /// The owner's primary-key type, also the `owner_id` column's.
    type OwnerId: OwnerId;
    /// The key type: a generated enum, or `&'static str` for free-form keys.
    type Key: CounterKey + Send + Sync;

    /// The counters of this entity.
    fn counters() -> &'static Counters<Self::OwnerId>;

    /// See [`Counters::add`].
    fn add<C: ConnectionTrait>(
        db: &C,
        owner: Self::OwnerId,
        key: Self::Key,
        delta: i64,
    ) -> impl Future<Output = Result<()>> + Send {
        Self::counters().add(db, owner, key, delta)
    }

    /// See [`Counters::increment`].
    fn increment<C: ConnectionTrait>(
        db: &C,
        owner: Self::OwnerId,
        key: Self::Key,
    ) -> impl Future<Output = Result<()>> + Send {
        Self::counters().increment(db, owner, key)
    }

    /// See [`Counters::decrement`].
    fn decrement<C: ConnectionTrait>(
        db: &C,
        owner: Self::OwnerId,
        key: Self::Key,
    ) -> impl Future<Output = Result<()>> + Send {
        Self::counters().decrement(db, owner, key)
    }

    /// See [`Counters::add_many`].
    fn add_many<C, It>(db: &C, deltas: It) -> impl Future<Output = Result<BatchOutcome>> + Send
    where
        C: ConnectionTrait + TransactionTrait,
        It: IntoIterator<Item = (Self::OwnerId, Self::Key, i64)> + Send,
        It::IntoIter: Send,
    {
        Self::counters().add_many(db, deltas)
    }

    /// See [`Counters::get`].
    fn get<'a, C: ConnectionTrait>(
        db: &'a C,
        owner: &'a Self::OwnerId,
        key: Self::Key,
    ) -> impl Future<Output = Result<i64>> + Send + 'a
    where
        Self::Key: 'a,
    {
        Self::counters().get(db, owner, key)
    }

    /// See [`Counters::get_many`].
    fn get_many<'a, C: ConnectionTrait>(
        db: &'a C,
        owners: &'a [Self::OwnerId],
        keys: &'a [Self::Key],
    ) -> impl Future<Output = Result<CountMap<Self::OwnerId>>> + Send + 'a {
        Self::counters().get_many(db, owners, keys)
    }
}
