//! Binding an owner entity to its counters.

use std::{collections::HashMap, future::Future};

use chrono::{DateTime, Utc};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, EntityTrait, Iterable, PrimaryKeyToColumn,
    QueryFilter, TransactionTrait,
};

use crate::{
    BatchOutcome, Compact, CompactReport, CountMap, CountSet, Counters, EntityBatch, KeySet,
    OwnerId, Ranked, Reconcile, ReconcileReport, Result, Series, Truth, key::CounterKey,
};

/// An entity whose rows own counters in a companion table.
///
/// `#[derive(SlottedCounter)]` implements it (see the derive for the
/// attribute grammar), with a generated key enum, so a misspelt counter is a
/// compile error, and a generated [`CountSet`] struct with one field per key.
/// Every method is provided; an implementation only says where the counters
/// live and how to get a model's primary key.
///
/// Methods take any `&C: ConnectionTrait`: a pool, or the caller's
/// transaction, with which the counter commits or rolls back.
///
/// ```
/// use counter_core::prelude::*;
///
/// mod post {
///     use counter_core::SlottedCounter;
///     use sea_orm::entity::prelude::*;
///
///     #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
///     #[sea_orm(table_name = "posts")]
///     #[counter(keys(likes, views(slots = 64)))]
///     pub struct Model {
///         #[sea_orm(primary_key)]
///         pub id: i64,
///         pub title: String,
///     }
///
///     #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
///     pub enum Relation {}
///
///     impl ActiveModelBehavior for ActiveModel {}
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let db = sea_orm::Database::connect("sqlite::memory:").await?;
/// # post::Entity::counters().create_table(&db).await?;
/// use post::counters::Key;
///
/// post::Entity::increment(&db, 1, Key::Likes).await?;
/// post::Entity::add(&db, 1, Key::Views, 10).await?;
/// let counts = post::Entity::counts(&db, &1).await?;
/// assert_eq!((counts.likes, counts.views), (1, 10));
/// # Ok(())
/// # }
/// ```
pub trait SlottedCounter: EntityTrait {
    /// The owner's primary-key type, also the `owner_id` column's.
    type OwnerId: OwnerId;
    /// The entity's counter keys (the generated `counters::Key`).
    type Key: KeySet;
    /// One total per key (the generated `counters::Counts`).
    type Counts: CountSet<Key = Self::Key>;

    /// The counters of this entity: also the dynamic API, for keys chosen at
    /// run time (per-emoji reactions, say) in the same table.
    fn counters() -> &'static Counters<Self::OwnerId>;

    /// The owner id of a model: its primary key.
    fn owner_id(model: &Self::Model) -> Self::OwnerId;

    /// Adds `delta` (which may be negative). See [`Counters::add`].
    fn add<C: ConnectionTrait + TransactionTrait>(
        db: &C,
        owner: Self::OwnerId,
        key: Self::Key,
        delta: i64,
    ) -> impl Future<Output = Result<()>> + Send {
        Self::counters().add(db, owner, key, delta)
    }

    /// Adds 1. See [`Counters::increment`].
    fn increment<C: ConnectionTrait + TransactionTrait>(
        db: &C,
        owner: Self::OwnerId,
        key: Self::Key,
    ) -> impl Future<Output = Result<()>> + Send {
        Self::counters().increment(db, owner, key)
    }

    /// Subtracts 1. See [`Counters::decrement`].
    fn decrement<C: ConnectionTrait + TransactionTrait>(
        db: &C,
        owner: Self::OwnerId,
        key: Self::Key,
    ) -> impl Future<Output = Result<()>> + Send {
        Self::counters().decrement(db, owner, key)
    }

    /// Applies many deltas at once, all or nothing: folded, sorted and sent
    /// as multi-row upserts. See [`Counters::add_many`].
    fn add_many<C, It>(db: &C, deltas: It) -> impl Future<Output = Result<BatchOutcome>> + Send
    where
        C: ConnectionTrait + TransactionTrait,
        It: IntoIterator<Item = (Self::OwnerId, Self::Key, i64)> + Send,
        It::IntoIter: Send,
    {
        Self::counters().add_many(db, deltas)
    }

    /// Adds `delta` as of `at`: a windowed key counts it in the bucket of
    /// `at`. See [`Counters::add_at`].
    fn add_at<C: ConnectionTrait + TransactionTrait>(
        db: &C,
        owner: Self::OwnerId,
        key: Self::Key,
        delta: i64,
        at: DateTime<Utc>,
    ) -> impl Future<Output = Result<()>> + Send {
        Self::counters().add_at(db, owner, key, delta, at)
    }

    /// The total of one counter. See [`Counters::get`].
    fn get<'a, C: ConnectionTrait>(
        db: &'a C,
        owner: &'a Self::OwnerId,
        key: Self::Key,
    ) -> impl Future<Output = Result<i64>> + Send + 'a {
        Self::counters().get(db, owner, key)
    }

    /// Chosen counters of many owners, by key name. See [`Counters::get_many`].
    fn get_many<'a, C: ConnectionTrait>(
        db: &'a C,
        owners: &'a [Self::OwnerId],
        keys: &'a [Self::Key],
    ) -> impl Future<Output = Result<CountMap<Self::OwnerId>>> + Send + 'a {
        Self::counters().get_many(db, owners, keys)
    }

    /// Every counter of one owner, in one query.
    fn counts<'a, C: ConnectionTrait>(
        db: &'a C,
        owner: &'a Self::OwnerId,
    ) -> impl Future<Output = Result<Self::Counts>> + Send + 'a {
        async move {
            let mut all = Self::counts_many(db, std::slice::from_ref(owner)).await?;
            Ok(all.remove(owner).unwrap_or_default())
        }
    }

    /// Every counter of many owners, in one grouped query per chunk of
    /// owners. Every requested owner is in the map, zero-filled; an empty
    /// list returns an empty map without a query.
    fn counts_many<'a, C: ConnectionTrait>(
        db: &'a C,
        owners: &'a [Self::OwnerId],
    ) -> impl Future<Output = Result<HashMap<Self::OwnerId, Self::Counts>>> + Send + 'a {
        async move {
            let totals = Self::counters()
                .get_many(db, owners, Self::Key::ALL)
                .await?;
            Ok(totals
                .into_iter()
                .map(|(owner, by_key)| {
                    let mut counts = Self::Counts::default();
                    for &key in Self::Key::ALL {
                        let total = by_key.get(key.as_key_str()).copied().unwrap_or(0);
                        counts.set(key, total);
                    }
                    (owner, counts)
                })
                .collect())
        }
    }

    /// Pairs each model with its counts: one query for the whole page, not
    /// one per model. Order is kept.
    fn load_counts<'a, C, It>(
        db: &'a C,
        models: It,
    ) -> impl Future<Output = Result<Vec<(Self::Model, Self::Counts)>>> + Send + 'a
    where
        C: ConnectionTrait,
        It: IntoIterator<Item = Self::Model> + Send + 'a,
    {
        async move {
            let models: Vec<Self::Model> = models.into_iter().collect();
            let owners: Vec<Self::OwnerId> = models.iter().map(Self::owner_id).collect();
            let counts = Self::counts_many(db, &owners).await?;
            Ok(models
                .into_iter()
                .zip(owners)
                .map(|(model, owner)| {
                    // A model may appear twice in a page: clone, do not take.
                    (model, counts.get(&owner).cloned().unwrap_or_default())
                })
                .collect())
        }
    }

    /// A windowed key's count over the buckets starting in `[from, to)`.
    /// See [`Counters::range`].
    fn range<'a, C: ConnectionTrait>(
        db: &'a C,
        owner: &'a Self::OwnerId,
        key: Self::Key,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> impl Future<Output = Result<i64>> + Send + 'a {
        Self::counters().range(db, owner, key, from, to)
    }

    /// [`SlottedCounter::range`] of many owners, zero-filled, one query per
    /// chunk. See [`Counters::range_many`].
    fn range_many<'a, C: ConnectionTrait>(
        db: &'a C,
        owners: &'a [Self::OwnerId],
        key: Self::Key,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> impl Future<Output = Result<HashMap<Self::OwnerId, i64>>> + Send + 'a {
        Self::counters().range_many(db, owners, key, from, to)
    }

    /// A windowed key's zero-filled count per bucket in `[from, to)`. See
    /// [`Counters::series`].
    fn series<'a, C: ConnectionTrait>(
        db: &'a C,
        owner: &'a Self::OwnerId,
        key: Self::Key,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> impl Future<Output = Result<Series>> + Send + 'a {
        Self::counters().series(db, owner, key, from, to)
    }

    /// [`SlottedCounter::series`] of many owners, one query per chunk. See
    /// [`Counters::series_many`].
    fn series_many<'a, C: ConnectionTrait>(
        db: &'a C,
        owners: &'a [Self::OwnerId],
        key: Self::Key,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> impl Future<Output = Result<HashMap<Self::OwnerId, Series>>> + Send + 'a {
        Self::counters().series_many(db, owners, key, from, to)
    }

    /// The `n` owners with the highest totals of `key`, ties by id. See
    /// [`Counters::top`].
    fn top<'a, C: ConnectionTrait>(
        db: &'a C,
        key: Self::Key,
        n: usize,
    ) -> impl Future<Output = Result<Vec<Ranked<Self::OwnerId>>>> + Send + 'a {
        Self::counters().top(db, key, n)
    }

    /// The page of [`SlottedCounter::top`] after `last`. See
    /// [`Counters::top_after`].
    fn top_after<'a, C: ConnectionTrait>(
        db: &'a C,
        key: Self::Key,
        last: &'a Ranked<Self::OwnerId>,
        n: usize,
    ) -> impl Future<Output = Result<Vec<Ranked<Self::OwnerId>>>> + Send + 'a {
        Self::counters().top_after(db, key, last, n)
    }

    /// [`SlottedCounter::top`] with the owners' models, loaded in one more
    /// query: the "most liked posts" list. Owners whose row no longer
    /// exists are left out, so a page may be shorter than `n`.
    fn top_models<'a, C: ConnectionTrait>(
        db: &'a C,
        key: Self::Key,
        n: usize,
    ) -> impl Future<Output = Result<Vec<(Self::Model, i64)>>> + Send + 'a
    where
        Self::Model: Send + Sync,
    {
        async move {
            let ranked = Self::counters().top(db, key, n).await?;
            let Some(primary_key) = Self::PrimaryKey::iter().next() else {
                return Ok(Vec::new());
            };
            let ids = ranked.iter().map(|r| r.owner.clone());
            let find = Self::find().filter(primary_key.into_column().is_in(ids));
            let models = match crate::detach::detached(db) {
                Some(pool) => {
                    pool.run(|pool| async move { find.all(&pool).await })
                        .await?
                }
                None => find.all(db).await?,
            };
            let mut by_id: HashMap<Self::OwnerId, Self::Model> = models
                .into_iter()
                .map(|m| (Self::owner_id(&m), m))
                .collect();
            Ok(ranked
                .into_iter()
                .filter_map(|r| by_id.remove(&r.owner).map(|m| (m, r.total)))
                .collect())
        }
    }

    /// Deletes the time buckets that ended by `before`; totals stay. See
    /// [`Counters::prune`].
    fn prune<C: ConnectionTrait>(
        db: &C,
        before: DateTime<Utc>,
    ) -> impl Future<Output = Result<u64>> + Send {
        Self::counters().prune(db, before)
    }

    /// Folds each counter's slot rows into slot 0 while writes go on. See
    /// [`Counters::compact`].
    fn compact<'a>(
        db: &'a DatabaseConnection,
        options: &'a Compact<Self::OwnerId>,
    ) -> impl Future<Output = Result<CompactReport>> + Send + 'a {
        Self::counters().compact(db, options)
    }

    /// Recounts `key` from `truth` and repairs each owner's drift. See
    /// [`Counters::reconcile`].
    ///
    /// For a counter kept by a counter cache, the truth is derived from the
    /// declaration: `post::Entity::reconcile(&db, Key::Comments,
    /// Truth::counter_cache::<comment::Entity>(), &Reconcile::new())`.
    fn reconcile<'a>(
        db: &'a DatabaseConnection,
        key: Self::Key,
        truth: impl Into<Truth>,
        options: &'a Reconcile<Self::OwnerId>,
    ) -> impl Future<Output = Result<ReconcileReport<Self::OwnerId>>> + Send + 'a {
        let truth = truth.into();
        Self::counters().reconcile(db, key, truth, options)
    }

    /// An empty unit-of-work batch with this entity's typed keys: collect
    /// deltas, then apply them together in one sorted upsert per chunk,
    /// inside the caller's transaction if given one. See [`EntityBatch`].
    fn batch() -> EntityBatch<Self>
    where
        Self: Sized,
    {
        EntityBatch::default()
    }

    /// The migration creating this entity's companion table, for a
    /// `Migrator` (after the migration of the owner's table):
    /// `Box::new(post::Entity::counter_migration())`.
    #[cfg(feature = "migration")]
    fn counter_migration() -> crate::CounterTableMigration {
        Self::counters().migration()
    }
}
