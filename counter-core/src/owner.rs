//! Owner ids: the primary-key types a counted entity may have.

use std::{fmt::Debug, hash::Hash};

use sea_orm::{TryGetable, Value};

/// The SQL type of the `owner_id` column, chosen from the owner's key type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OwnerColumn {
    /// `INTEGER`
    Integer,
    /// `BIGINT`
    BigInteger,
    /// The backend's UUID type (`uuid`, `BINARY(16)`, a blob on SQLite).
    Uuid,
    /// `VARCHAR(255)`, byte-wise compared on every backend.
    String,
}

/// A type that can be an owner's primary key, and so the `owner_id` of its
/// counters: `i32`, `i64`, `Uuid` and `String`.
///
/// `Ord` gives every batch the same row order, hence the same lock order, so
/// two concurrent batches can never deadlock on each other.
pub trait OwnerId:
    Clone + Eq + Hash + Ord + Debug + Send + Sync + Into<Value> + TryGetable + 'static
{
    /// The `owner_id` column type for this key type.
    const COLUMN: OwnerColumn;
}

impl OwnerId for i32 {
    const COLUMN: OwnerColumn = OwnerColumn::Integer;
}

impl OwnerId for i64 {
    const COLUMN: OwnerColumn = OwnerColumn::BigInteger;
}

impl OwnerId for uuid::Uuid {
    const COLUMN: OwnerColumn = OwnerColumn::Uuid;
}

impl OwnerId for String {
    const COLUMN: OwnerColumn = OwnerColumn::String;
}
