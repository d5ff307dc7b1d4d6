//! Binding an owner entity to its counters, and the operations only a typed
//! handle has (they know the entity's models and its `Counts`).

use std::collections::HashMap;

use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, FromQueryResult, Iterable, PrimaryKeyToColumn,
    QueryFilter, QueryTrait,
};

use crate::{
    CountSet, CounterTable, Counters, KeySet, OwnerId, Result, SlotStrategy, Window,
    declaration::{Declaration, DeclaredSlots},
};

/// The typed handle of an entity's counters: `post::Entity::counters()`.
///
/// The same type as the untyped [`Counters`], with the entity as its key
/// space, so it has every operation of [`Counters`] (taking only the
/// entity's `Key` enum) and the typed reads below ([`Counters::counts`],
/// [`Counters::counts_many`], [`Counters::load_counts`],
/// [`Counters::top_models`]). [`Counters::untyped`] gives the same table
/// with keys chosen at run time.
pub type EntityCounters<E> = Counters<<E as SlottedCounter>::OwnerId, E>;

/// An entity whose rows own counters in a companion table.
///
/// `#[derive(SlottedCounter)]` implements it (see the derive for the
/// attribute grammar), with a generated key enum, so a misspelt counter is a
/// compile error, and a generated [`CountSet`] struct with one field per key.
/// The trait only binds: every operation is on the handle that
/// [`SlottedCounter::counters`] returns, [`EntityCounters<Self>`](EntityCounters).
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
/// let posts = post::Entity::counters();
/// posts.increment(&db, 1, Key::Likes).await?;
/// posts.add(&db, 1, Key::Views, 10).await?;
/// let counts = posts.counts(&db, 1).await?;
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
    /// The entity's unique keys (the generated `counters::UniqueKey`):
    /// what [`Counters::observe`] and [`Counters::unique`] take; an enum
    /// with no variant when there is none.
    type UniqueKey: KeySet;

    /// The typed handle of this entity's counters: every counting operation.
    fn counters() -> &'static EntityCounters<Self>;

    /// The owner id of a model: its primary key.
    fn owner_id(model: &Self::Model) -> Self::OwnerId;
}

impl<E: SlottedCounter> Counters<E::OwnerId, E> {
    /// The typed handle of `E` stored in `table`: what an implementation of
    /// [`SlottedCounter::counters`] written by hand keeps in a static (the
    /// derive does this for you).
    pub fn for_entity(table: CounterTable) -> Self {
        Self::with_table(table)
    }

    /// Every counter of one owner, in one query.
    pub async fn counts<C: ConnectionTrait>(&self, db: &C, owner: E::OwnerId) -> Result<E::Counts> {
        let mut all = self.counts_many(db, std::slice::from_ref(&owner)).await?;
        Ok(all.remove(&owner).unwrap_or_default())
    }

    /// Every counter of many owners, in one grouped query per chunk of
    /// owners. Every requested owner is in the map, zero-filled; an empty
    /// list returns an empty map without a query.
    pub async fn counts_many<C: ConnectionTrait>(
        &self,
        db: &C,
        owners: &[E::OwnerId],
    ) -> Result<HashMap<E::OwnerId, E::Counts>> {
        self.get_many(db, owners, E::Key::ALL).await
    }

    /// Pairs each model with its counts: one query for the whole page, not
    /// one per model. Order is kept.
    pub async fn load_counts<C, It>(&self, db: &C, models: It) -> Result<Vec<(E::Model, E::Counts)>>
    where
        C: ConnectionTrait,
        It: IntoIterator<Item = E::Model>,
    {
        let models: Vec<E::Model> = models.into_iter().collect();
        let owners: Vec<E::OwnerId> = models.iter().map(E::owner_id).collect();
        let counts = self.counts_many(db, &owners).await?;
        Ok(models
            .into_iter()
            .zip(owners)
            .map(|(model, owner)| {
                // A model may appear twice in a page: clone, do not take.
                (model, counts.get(&owner).cloned().unwrap_or_default())
            })
            .collect())
    }

    /// [`Counters::top`] with the owners' models, loaded in one more query:
    /// the "most liked posts" list. Owners whose row no longer exists are
    /// left out, so a page may be shorter than `n`.
    pub async fn top_models<C: ConnectionTrait>(
        &self,
        db: &C,
        key: E::Key,
        n: usize,
    ) -> Result<Vec<(E::Model, i64)>>
    where
        E::Model: Send + Sync,
    {
        let ranked = self.top(db, key, n).await?;
        let Some(primary_key) = E::PrimaryKey::iter().next() else {
            return Ok(Vec::new());
        };
        let ids = ranked.iter().map(|r| r.owner.clone());
        // As one statement of the crate's own: detached on a pool, and in a
        // transaction of its own behind a transaction pooler.
        let find = E::find()
            .filter(primary_key.into_column().is_in(ids))
            .build(db.get_database_backend());
        let models = crate::detach::query_all(db, find)
            .await?
            .iter()
            .map(|row| E::Model::from_query_result(row, ""))
            .collect::<Result<Vec<_>, _>>()?;
        let mut by_id: HashMap<E::OwnerId, E::Model> =
            models.into_iter().map(|m| (E::owner_id(&m), m)).collect();
        Ok(ranked
            .into_iter()
            .filter_map(|r| by_id.remove(&r.owner).map(|m| (m, r.total)))
            .collect())
    }
}

/// The typed handle of a derived entity, for the derive's generated code.
/// The derive has already checked every name and slot count at compile
/// time, so this cannot fail. The owner is `E`'s table and its primary-key
/// column `owner_column`, referenced if `cascade`; `key_windows` are the keys also counted in time
/// buckets; `strategy` is the `slot_strategy` option (without it the table
/// keeps [`SlotStrategy::default()`]).
#[doc(hidden)]
// Called by generated code only: one argument per option of the attribute.
#[allow(clippy::too_many_arguments)]
pub fn derived_counters<E: SlottedCounter>(
    table: &'static str,
    slots: DeclaredSlots,
    key_slots: &'static [(&'static str, DeclaredSlots)],
    key_windows: &'static [(&'static str, Window)],
    unique_keys: &'static [&'static str],
    owner_column: &'static str,
    cascade: bool,
    slot_strategy: Option<SlotStrategy>,
) -> EntityCounters<E> {
    let entity = E::default();
    let declaration = Declaration {
        table,
        owner_table: entity.table_name(),
        owner_column,
        slots,
        key_slots,
        key_windows,
        unique_keys,
        cascade,
        slot_strategy,
    };
    let schema = entity.schema_name().map(|s| s.to_owned().into());
    Counters::for_entity(declaration.table_in(schema))
}
