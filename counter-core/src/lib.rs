//! Slotted counters for SeaORM: counters (likes, views, followers) that stay
//! fast under concurrent writes and cheap to read in bulk.
//!
//! `UPDATE posts SET likes = likes + 1` makes every writer of a hot post wait
//! on one row lock. Here a counter lives in a companion table
//! `(owner_id, count_key, slot, value)`: each increment upserts one of N slot
//! rows (successive writers take successive slots, see [`SlotStrategy`]),
//! so writers spread over N locks, and a read is
//! `SUM(value)`. A batch read of many owners and keys is one grouped query.
//! Counters are rows, not columns: a new counter needs no DDL.
//!
//! * [`Counters`] is the runtime API over one companion table, with keys
//!   chosen at run time ([`CounterKey`] is implemented for `str`/`String`).
//! * [`SlottedCounter`] binds an owner entity to its counters, with typed keys;
//!   `#[derive(SlottedCounter)]` implements it for you.
//! * Every counting call takes a pool or the caller's transaction, with
//!   which the counter then commits or rolls back; maintenance
//!   ([`Counters::compact`], [`Counters::reconcile`]) takes the pool and
//!   runs batch transactions of its own.
//! * Around the core: counter caches ([`CounterCache`]) and recounts
//!   ([`Counters::reconcile`]); lossless online compaction
//!   ([`Counters::compact`]); per-hour or per-day buckets of a key with range
//!   sums and zero-filled series ([`Window`], [`Counters::series`]); exact
//!   rankings ([`Counters::top`]).
//! * Coalesced writes: a unit of work's deltas sent together in one sorted
//!   upsert per chunk ([`DeltaBatch`], typed as `post::Entity::batch()`:
//!   [`EntityBatch`]), and a process-wide write-behind buffer
//!   ([`CounterBuffer`], feature `buffer`, on by default) whose flushes are
//!   exactly-once through a [`FlushLedger`].
//!
//! SQLite, PostgreSQL and MySQL/MariaDB are supported alike; enable the
//! matching `sqlx-*` feature as you would on sea-orm.
//!
//! # Dropped calls
//!
//! Any call may be dropped at any `.await` (axum drops a handler's future
//! when its client goes away) without leaving a lock, a connection, a
//! session setting or an in-process flag behind that would block, slow or
//! corrupt a later call. On a pool (`DatabaseConnection`), every statement
//! and every transaction the crate opens runs in a Tokio task of its own, so a dropped call only
//! stops waiting: its write commits or rolls back as it would have (like a
//! write whose reply was lost, its outcome is unknown to the caller), and
//! its connection goes back to the pool in step. This works around sqlx's
//! connections, which a future dropped mid-statement can leave waiting
//! forever for an answer (transact-rs/sqlx#563, #4349); on MySQL/MariaDB
//! that strands the connection and, call after call, empties the pool.
//! The crate's own waits are bounded: retries (10 attempts, backoff at
//! most 200 ms), recount locks (60 s), the lock waits of compaction and
//! recount batches (60 s on PostgreSQL; MySQL/MariaDB's
//! `innodb_lock_wait_timeout`, 50 s by default), pool acquisition (the
//! pool's `acquire_timeout`, 30 s by default). A single write waits for a
//! row lock as long as the database lets it: on PostgreSQL, whose default
//! is forever, set `lock_timeout` on the pool's connections to bound it.
//! What the crate cannot own is the caller's transaction: where a handler
//! may be dropped, run the transaction in a task of its own
//! (`tokio::spawn`) and await the task.

#![warn(missing_docs)]

mod batch;
mod buckets;
#[cfg(feature = "buffer")]
mod buffer;
pub mod cache;
mod compact;
mod detach;
mod entity;
mod entity_batch;
mod error;
pub mod key;
mod owner;
mod rank;
mod read;
pub mod reconcile;
mod retry;
mod schema;
#[cfg(feature = "serde")]
mod serde_support;
mod slots;
mod sql;
mod strategy;
mod table;
mod typed;
mod walk;
mod window;
mod write;

pub use batch::DeltaBatch;
pub use buckets::Series;
#[cfg(all(feature = "buffer", feature = "migration"))]
pub use buffer::FlushLedgerMigration;
#[cfg(feature = "buffer")]
pub use buffer::{
    BufferBuilder, BufferStats, CounterBuffer, FlushLedger, MAX_BUFFER_CAPACITY, WhenFull,
};
pub use cache::{CacheRule, CounterCache};
pub use compact::{Compact, CompactReport, CompactStats, MAX_COMPACT_BATCH};
pub use entity::SlottedCounter;
pub use entity_batch::EntityBatch;
pub use error::{CounterError, Result};
pub use key::{CounterKey, MAX_KEY_LEN, validate_key};
pub use owner::{MAX_STRING_OWNER_LEN, OwnerColumn, OwnerId};
pub use rank::{MAX_RANK_PAGE, Ranked};
pub use read::CountMap;
pub use reconcile::{Drift, MAX_RECONCILE_BATCH, Reconcile, ReconcileReport, Truth};
#[cfg(feature = "migration")]
pub use schema::migration::{CounterTableMigration, CounterTableUpgrade};
pub use slots::Slots;
pub use sql::UPSERT_ROWS_PER_STATEMENT;
pub use strategy::SlotStrategy;
pub use table::{CounterTable, Counters, MAX_TABLE_NAME_LEN, OwnerTable, validate_table_name};
pub use typed::{CountSet, KeySet};
pub use window::{MAX_SERIES_BUCKETS, Window};
pub use write::BatchOutcome;

/// ```
/// mod post {
///     use counter_core::SlottedCounter;
///     use sea_orm::entity::prelude::*;
///
///     #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
///     #[sea_orm(table_name = "posts")]
///     #[counter(keys(likes, comments, views(slots = 64)))]
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
/// use counter_core::prelude::*;
/// use post::counters::{Counts, Key};
///
/// let db = sea_orm::Database::connect("sqlite::memory:").await?;
/// // In an application: `Box::new(post::Entity::counter_migration())` in the Migrator.
/// post::Entity::counters().create_table(&db).await?;
///
/// post::Entity::increment(&db, 1, Key::Likes).await?;
/// post::Entity::add(&db, 1, Key::Views, 100).await?;
/// post::Entity::add_many(&db, [(2, Key::Likes, 5), (2, Key::Comments, 1)]).await?;
///
/// let one: Counts = post::Entity::counts(&db, &1).await?;
/// assert_eq!(one, Counts { likes: 1, comments: 0, views: 100 });
/// let many = post::Entity::counts_many(&db, &[1, 2, 3]).await?;
/// assert_eq!((many[&2].likes, many[&3].likes), (5, 0)); // zero-filled
///
/// // The same table, with keys chosen at run time:
/// post::Entity::counters().increment(&db, 1, "reaction:heart").await?;
/// assert_eq!(post::Entity::counters().get(&db, &1, "reaction:heart").await?, 1);
///
/// // Keys round-trip through their stored names.
/// assert_eq!("views".parse::<Key>()?, Key::Views);
/// assert!("veiws".parse::<Key>().is_err());
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "derive")]
pub use counter_derive::SlottedCounter;

/// `#[derive(CounterCache)]`: a child entity keeping its parents' counters
/// in step with its rows. See the [`CounterCache`](trait@CounterCache) trait for
/// what is kept exact and how, and the derive's own documentation for the
/// attribute.
#[cfg(feature = "derive")]
pub use counter_derive::CounterCache;

/// Without the `serde` feature, the derive's serde hook expands to nothing.
#[cfg(not(feature = "serde"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __derive_serde {
    ($key:ident, $counts:ident) => {};
}

/// The traits needed to call counter methods on an entity, and the derive:
/// `use counter_core::prelude::*;`.
pub mod prelude {
    pub use crate::{
        CountSet, CounterCache, CounterError, CounterKey, Counters, KeySet, SlottedCounter,
    };
}

/// Paths used by code that `#[derive(SlottedCounter)]` generates. Not public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::cache::{cache_amount, cache_delta, cache_parent, cache_when};
    #[cfg(feature = "serde")]
    pub use crate::serde_support::{
        deserialize_counts, deserialize_key, serialize_counts, serialize_key,
    };
    pub use sea_orm;
    #[cfg(feature = "serde")]
    pub use serde;

    use crate::{
        CounterError, CounterTable, Counters, OwnerId, OwnerTable, Result, SlotStrategy,
        error::preview,
    };

    /// The error of parsing a string that is none of `expected`.
    pub fn unknown_key(key: &str, expected: &'static [&'static str]) -> CounterError {
        CounterError::UnknownKey {
            key: preview(key),
            expected,
        }
    }

    /// The counters of a derived entity. The derive has already checked
    /// every name and slot count at compile time, so this cannot fail.
    /// With `cascade_column`, the table references the owner entity `E`.
    /// `key_windows` are the keys also counted in time buckets.
    /// `strategy` is the `slot_strategy` option; without it the table keeps
    /// [`SlotStrategy::default()`].
    pub fn derived_counters<I: OwnerId, E: sea_orm::EntityName>(
        table: &'static str,
        slots: u16,
        key_slots: &[(&str, u16)],
        key_windows: &[(&str, crate::Window)],
        cascade_column: Option<&'static str>,
        strategy: Option<SlotStrategy>,
    ) -> Counters<I> {
        let build = || -> Result<CounterTable> {
            let mut config = CounterTable::new(table)?.with_slots(slots)?;
            for &(key, slots) in key_slots {
                config = config.with_key_slots(key, slots)?;
            }
            for &(key, window) in key_windows {
                config = config.with_key_window(key, window)?;
            }
            if let Some(column) = cascade_column {
                let owner = E::default();
                config = config.with_cascade(OwnerTable {
                    schema: owner.schema_name().map(|s| s.to_owned().into()),
                    table: owner.table_name().into(),
                    column: column.into(),
                });
            }
            if let Some(strategy) = strategy {
                config = config.with_slot_strategy(strategy);
            }
            Ok(config)
        };
        match build() {
            Ok(config) => Counters::new(config),
            Err(e) => {
                unreachable!("#[derive(SlottedCounter)] checked `{table}` at compile time: {e}")
            }
        }
    }
}
