//! Slotted counters for SeaORM: counters (likes, views, followers) that stay
//! fast under concurrent writes and cheap to read in bulk.
//!
//! `UPDATE posts SET likes = likes + 1` makes every writer of a hot post wait
//! on one row lock. Here a counter lives in a companion table
//! `(owner_id, count_key, slot, value)`: each increment upserts one of N slot
//! rows chosen at random, so writers spread over N locks, and a read is
//! `SUM(value)`. A batch read of many owners and keys is one grouped query.
//! Counters are rows, not columns: a new counter needs no DDL.
//!
//! * [`Counters`] is the runtime API over one companion table, with keys
//!   chosen at run time ([`CounterKey`] is implemented for `str`/`String`).
//! * [`SlottedCounter`] binds an owner entity to its counters, with typed keys;
//!   `#[derive(SlottedCounter)]` implements it for you.
//! * Every function takes any `&C: ConnectionTrait`: a pool, or the caller's
//!   transaction, with which the counter then commits or rolls back.
//!
//! SQLite, PostgreSQL and MySQL/MariaDB are supported alike; enable the
//! matching `sqlx-*` feature as you would on sea-orm.

#![warn(missing_docs)]

mod entity;
mod error;
pub mod key;
mod owner;
mod read;
mod retry;
mod schema;
mod slots;
mod sql;
mod table;
mod write;

pub use entity::SlottedCounter;
pub use error::{CounterError, Result};
pub use key::{CounterKey, MAX_KEY_LEN, validate_key};
pub use owner::{MAX_STRING_OWNER_LEN, OwnerColumn, OwnerId};
pub use read::CountMap;
#[cfg(feature = "migration")]
pub use schema::migration::CounterTableMigration;
pub use slots::Slots;
pub use sql::UPSERT_ROWS_PER_STATEMENT;
pub use table::{CounterTable, Counters, MAX_TABLE_NAME_LEN, validate_table_name};
pub use write::BatchOutcome;

/// `#[derive(SlottedCounter)]`, behind the default `derive` feature.
#[cfg(feature = "derive")]
pub use counter_derive::SlottedCounter;

/// Paths used by code that `#[derive(SlottedCounter)]` generates. Not public API.
#[doc(hidden)]
pub mod __private {
    pub use sea_orm;
}
