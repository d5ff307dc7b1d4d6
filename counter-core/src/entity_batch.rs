//! A unit of work's deltas with an entity's typed keys.

use std::marker::PhantomData;

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, TransactionTrait};

use crate::{BatchOutcome, DeltaBatch, SlottedCounter, error::Result};

/// A [`DeltaBatch`] that takes `P`'s typed keys and owner ids: from
/// `post::Entity::batch()`.
///
/// Collect a request's counter changes, across any owners and keys (and,
/// through [`EntityBatch::with`], other entities), then send them at the end
/// with one sorted multi-row upsert per table and chunk, inside the caller's
/// transaction when given one, so they commit or roll back with its other
/// writes:
///
/// ```
/// # mod post {
/// #     use counter_core::SlottedCounter;
/// #     use sea_orm::entity::prelude::*;
/// #     #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
/// #     #[sea_orm(table_name = "posts")]
/// #     #[counter(keys(likes, views))]
/// #     pub struct Model {
/// #         #[sea_orm(primary_key)]
/// #         pub id: i64,
/// #     }
/// #     #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
/// #     pub enum Relation {}
/// #     impl ActiveModelBehavior for ActiveModel {}
/// # }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use counter_core::prelude::*;
/// use post::counters::Key;
/// use sea_orm::TransactionTrait;
///
/// let db = sea_orm::Database::connect("sqlite::memory:").await?;
/// post::Entity::counters().create_table(&db).await?;
///
/// let txn = db.begin().await?;
/// let mut batch = post::Entity::batch();
/// for post in [3, 1, 2, 1] {
///     batch.increment(post, Key::Views)?;
/// }
/// batch.add(1, Key::Likes, 2)?;
/// let sent = batch.apply(&txn).await?; // 4 counters, 1 statement
/// txn.commit().await?;
/// assert_eq!((sent.rows, sent.statements), (4, 1));
/// assert_eq!(post::Entity::get(&db, &1, Key::Views).await?, 2);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct EntityBatch<P> {
    batch: DeltaBatch,
    entity: PhantomData<fn() -> P>,
}

impl<P: SlottedCounter> Default for EntityBatch<P> {
    fn default() -> Self {
        Self::from(DeltaBatch::new())
    }
}

impl<P: SlottedCounter> From<DeltaBatch> for EntityBatch<P> {
    fn from(batch: DeltaBatch) -> Self {
        Self {
            batch,
            entity: PhantomData,
        }
    }
}

impl<P> From<EntityBatch<P>> for DeltaBatch {
    fn from(batch: EntityBatch<P>) -> Self {
        batch.batch
    }
}

impl<P: SlottedCounter> EntityBatch<P> {
    /// Adds `delta` to `key` of `owner` (see [`DeltaBatch::add`]).
    pub fn add(&mut self, owner: P::OwnerId, key: P::Key, delta: i64) -> Result<&mut Self> {
        self.batch.add_to::<P>(owner, key, delta)?;
        Ok(self)
    }

    /// Adds 1.
    pub fn increment(&mut self, owner: P::OwnerId, key: P::Key) -> Result<&mut Self> {
        self.add(owner, key, 1)
    }

    /// Subtracts 1.
    pub fn decrement(&mut self, owner: P::OwnerId, key: P::Key) -> Result<&mut Self> {
        self.add(owner, key, -1)
    }

    /// Adds `delta` as of `at`: a windowed key counts it in the bucket of
    /// `at` (see [`DeltaBatch::add_at`]).
    pub fn add_at(
        &mut self,
        owner: P::OwnerId,
        key: P::Key,
        delta: i64,
        at: DateTime<Utc>,
    ) -> Result<&mut Self> {
        self.batch.add_at(P::counters(), owner, key, delta, at)?;
        Ok(self)
    }

    /// The same batch, now taking `Q`'s keys: one unit of work across
    /// entities, still sent together.
    pub fn with<Q: SlottedCounter>(self) -> EntityBatch<Q> {
        EntityBatch::from(self.batch)
    }

    /// Whether no counter would change.
    pub fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }

    /// Sends the batch, all or nothing (see [`DeltaBatch::apply`]).
    pub async fn apply<C: ConnectionTrait + TransactionTrait>(
        self,
        db: &C,
    ) -> Result<BatchOutcome> {
        self.batch.apply(db).await
    }

    /// Sends the batch on a connection that is inside a transaction but
    /// cannot open one (see [`DeltaBatch::apply_in`]).
    pub async fn apply_in<C: ConnectionTrait>(self, txn: &C) -> Result<BatchOutcome> {
        self.batch.apply_in(txn).await
    }
}
