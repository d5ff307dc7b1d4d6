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
//! * [`Counters`] is the one handle to a companion table: every operation
//!   lives there, once. `post::Entity::counters()` gives the typed handle of
//!   an entity with `#[derive(SlottedCounter)]` ([`EntityCounters`]: its
//!   `Key` enum, its `Counts` record); [`Counters::untyped`] or
//!   [`Counters::new`] one with keys chosen at run time.
//! * Every counting call takes a pool or the caller's transaction, with
//!   which the counter then commits or rolls back; maintenance
//!   ([`Counters::compact`], [`Counters::reconcile`]) takes the pool and
//!   runs batch transactions of its own.
//! * Around the core: counter caches ([`CounterCache`]) and recounts
//!   ([`Counters::reconcile`]); lossless online compaction
//!   ([`Counters::compact`]); per-hour or per-day buckets of a key with range
//!   sums and zero-filled series ([`Window`], [`Counters::series`]); exact
//!   rankings ([`Counters::top`]).
//! * Unique counts: distinct members (readers, visitors) of an owner in a
//!   HyperLogLog sketch per counter, 0.81 % standard error in at most 12 kB
//!   ([`Counters::observe`], [`Counters::unique_many`],
//!   [`Counters::unique_over`] for unions of day buckets; the [`unique`]
//!   module).
//! * Coalesced writes: a unit of work's deltas sent together in one sorted
//!   upsert per chunk ([`DeltaBatch`], across tables, typed or not), and a
//!   process-wide write-behind buffer
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
mod cache;
mod chunks;
mod cluster;
mod compact;
mod declaration;
mod detach;
mod entity;
mod error;
mod heat;
mod key;
pub mod limits;
#[cfg(feature = "loco")]
mod loco;
pub mod observe;
mod owner;
pub mod pooling;
mod purge;
mod rank;
mod read;
mod reconcile;
mod region;
mod retry;
mod schema;
#[cfg(feature = "serde")]
mod serde_support;
mod settle;
mod slots;
mod sql;
mod strategy;
mod table;
mod table_check;
mod typed;
pub mod unique;
mod walk;
mod window;
mod writable;
mod write;

pub use batch::DeltaBatch;
pub use buckets::Series;
#[cfg(all(feature = "buffer", feature = "migration"))]
pub use buffer::FlushLedgerMigration;
#[cfg(feature = "buffer")]
pub use buffer::{
    BufferBuilder, BufferStats, CounterBuffer, Flush, FlushLedger, FlushSink, FlushedDelta,
    SinkFuture, WhenFull,
};
pub use cache::{CacheRule, CounterCache, hooks};
pub use compact::{Compact, CompactReport, CompactStats};
pub use entity::{EntityCounters, SlottedCounter};
#[cfg(feature = "buffer")]
pub use error::BufferError;
pub use error::{CounterError, ErrorKind, Result};
pub use key::{CounterKey, validate_key};
pub use owner::{OwnerColumn, OwnerId};
pub use rank::Ranked;
pub use read::CountMap;
pub use reconcile::{Drift, Reconcile, ReconcileReport, RowsOf, Truth};
pub use region::{Region, RegionLag};
#[cfg(feature = "migration")]
pub use schema::migration::{
    BackfillMigration, CascadeMigration, CounterTableMigration, CounterTableUpgrade,
    SketchTableMigration,
};
pub use slots::{SlotPolicy, Slots};
pub use strategy::{SlotStrategy, Writer};
pub use table::{CounterTable, Counters, OwnerTable, validate_table_name};
pub use table_check::TableDrift;
pub use typed::{CountSet, KeyOf, KeySet, KeySpace, UniqueKeyOf, Untyped};
pub use window::Window;
pub use writable::accepts_writes;
pub use write::BatchReport;

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
/// let posts = post::Entity::counters();
/// // In an application: `Box::new(posts.migration())` in the Migrator.
/// posts.create_table(&db).await?;
///
/// posts.increment(&db, 1, Key::Likes).await?;
/// posts.add(&db, 1, Key::Views, 100).await?;
/// posts.add_many(&db, [(2, Key::Likes, 5), (2, Key::Comments, 1)]).await?;
///
/// let one: Counts = posts.counts(&db, 1).await?;
/// assert_eq!(one, Counts { likes: 1, comments: 0, views: 100 });
/// let many = posts.counts_many(&db, &[1, 2, 3]).await?;
/// assert_eq!((many[&2].likes, many[&3].likes), (5, 0)); // zero-filled
///
/// // The same table, with keys chosen at run time:
/// posts.untyped().increment(&db, 1, "reaction:heart").await?;
/// assert_eq!(posts.untyped().get(&db, 1, "reaction:heart").await?, 1);
///
/// // Keys round-trip through their stored names.
/// assert_eq!("views".parse::<Key>()?, Key::Views);
/// assert!("veiws".parse::<Key>().is_err());
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "derive")]
pub use counter_derive::SlottedCounter;

/// The counters of an owner declared apart from its entity, in a module of
/// their own: the form for entity files that a generator owns (sea-orm-cli,
/// Loco's `models/_entities/`) and for a migration crate that cannot depend
/// on the entities. [`slotted_counter!`] binds the module to the entity.
///
/// ```
/// // The migration crate (or a crate both it and the app depend on):
/// mod migration {
///     counter_core::counter_table! {
///         /// The counters of notes.
///         #[counter(owner = "notes", owner_id = i32, keys(likes, views(slots = 64)), cascade)]
///         pub mod note_counters;
///     }
///     // In its `Migrator`, after the migration creating `notes`:
///     // `Box::new(note_counters::counters().migration())`.
/// }
///
/// // The app: the generated entity, left as sea-orm-cli wrote it...
/// mod _entities {
///     pub mod notes {
///         use sea_orm::entity::prelude::*;
///
///         #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
///         #[sea_orm(table_name = "notes")]
///         pub struct Model {
///             #[sea_orm(primary_key)]
///             pub id: i32,
///             pub title: String,
///         }
///
///         #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
///         pub enum Relation {}
///
///         impl ActiveModelBehavior for ActiveModel {}
///     }
/// }
///
/// // ...and a hand-written module beside it binds the declaration.
/// mod notes {
///     pub use super::_entities::notes::{ActiveModel, Entity, Model};
///     counter_core::slotted_counter!(Entity, crate::migration::note_counters);
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use counter_core::prelude::*;
/// use sea_orm::{ConnectionTrait, Statement};
///
/// let db = sea_orm::Database::connect("sqlite::memory:").await?;
/// db.execute_unprepared("CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT NOT NULL)").await?;
/// db.execute_unprepared("INSERT INTO notes (id, title) VALUES (1, 'hello')").await?;
/// // The migration crate's view: no entity needed.
/// migration::note_counters::counters().create_table(&db).await?;
///
/// let notes = notes::Entity::counters();
/// notes.increment(&db, 1, notes::counters::Key::Likes).await?;
/// assert_eq!(notes.counts(&db, 1).await?.likes, 1);
/// // Both views are one table.
/// assert_eq!(notes.table().name(), migration::note_counters::TABLE);
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "derive")]
pub use counter_derive::counter_table;

/// A counter cache declared beside a child entity whose file a generator
/// owns: `#[derive(CounterCache)]`'s attributes, then the child's entity
/// type. See the [`CounterCache`](trait@CounterCache) trait for what is
/// kept exact, and the guide's adoption chapter for the Loco layout.
///
/// ```text
/// counter_core::counter_cache! {
///     #[counter_cache(parent = super::notes::Entity, key = comments, via = note_id)]
///     super::_entities::comments::Entity
/// }
/// counter_core::counter_cache_behavior!(ActiveModel, Entity);
/// ```
#[cfg(feature = "derive")]
pub use counter_derive::counter_cache;

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
        CountSet, CounterCache, CounterError, CounterKey, Counters, ErrorKind, KeySet,
        SlottedCounter,
    };
}

/// Paths used by the code the derives generate: re-exports only, versioned
/// with the crate so that a derive of another version fails to compile
/// instead of misbehaving. Not public API.
#[doc(hidden)]
pub mod __private_0_1_0 {
    pub use crate::cache::{cache_amount, cache_delta, cache_parent, cache_when, recount_cache};
    pub use crate::declaration::{
        Declaration, DeclaredSlots, declared_counters, owner_relation, primary_key_of,
    };
    pub use crate::entity::derived_counters;
    pub use crate::error::unknown_key;
    #[cfg(feature = "serde")]
    pub use crate::serde_support::{
        deserialize_counts, deserialize_key, serialize_counts, serialize_key,
    };
    pub use sea_orm;
    #[cfg(feature = "serde")]
    pub use serde;
}
