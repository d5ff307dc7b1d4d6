//! Owner ids: the primary-key types a counted entity may have.

use std::{fmt::Debug, hash::Hash};

use sea_orm::{TryGetable, Value};

use crate::error::{CounterError, Result, preview};

use crate::limits::MAX_STRING_OWNER_LEN;

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
    /// `VARCHAR(255)`; exact comparison on every backend (a binary
    /// collation on MySQL, whose PAD SPACE rule the owner check covers).
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

    /// Rejects ids the column cannot store exactly. Integers and UUIDs
    /// always fit; see the `String` implementation for strings.
    fn check(&self) -> Result<()> {
        Ok(())
    }
}

/// `owners` checked, sorted and without duplicates: the order batches over
/// a list of owners go in.
pub(crate) fn sorted_unique<I: OwnerId>(owners: &[I]) -> Result<Vec<I>> {
    let mut owners = owners.to_vec();
    for owner in &owners {
        owner.check()?;
    }
    owners.sort();
    owners.dedup();
    Ok(owners)
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

/// String ids are at most 255 characters (longer ones would be truncated by
/// MySQL in non-strict mode, merging owners), do not end in a space
/// (MySQL's collations compare `"a"` and `"a "` as equal, so their counts
/// would merge) and contain no NUL character (PostgreSQL text cannot hold
/// one). Every rule holds on every backend, so an id that works on SQLite
/// also works on MySQL and PostgreSQL.
impl OwnerId for String {
    const COLUMN: OwnerColumn = OwnerColumn::String;

    fn check(&self) -> Result<()> {
        let reason = if self.chars().nth(MAX_STRING_OWNER_LEN).is_some() {
            "a string owner id is at most 255 characters long"
        } else if self.ends_with(' ') {
            "a string owner id cannot end in a space (MySQL ignores trailing spaces)"
        } else if self.contains('\0') {
            "a string owner id cannot contain a NUL character (PostgreSQL cannot store it)"
        } else {
            return Ok(());
        };
        Err(CounterError::InvalidOwner {
            owner: preview(self),
            reason,
        })
    }
}

/// An owner id in the order its typed form sorts in (integers numerically,
/// UUIDs by bytes, strings by bytes): every batch, [`Counters::add_many`]'s
/// included, locks rows in the same order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum SortOwner {
    Int(i64),
    Uuid(uuid::Uuid),
    Str(String),
}

impl SortOwner {
    pub(crate) fn of(value: &Value) -> Self {
        match value {
            Value::Int(Some(v)) => Self::Int(i64::from(*v)),
            Value::BigInt(Some(v)) => Self::Int(*v),
            Value::Uuid(Some(v)) => Self::Uuid(*v),
            Value::String(Some(v)) => Self::Str(v.clone()),
            // OwnerId is only implemented for the four types above.
            other => Self::Str(format!("{other:?}")),
        }
    }

    /// [`SortOwner::of`], taking the value: a string id is moved, not copied.
    #[cfg_attr(not(feature = "buffer"), allow(dead_code))]
    pub(crate) fn from_value(value: Value) -> Self {
        match value {
            Value::String(Some(v)) => Self::Str(v),
            other => Self::of(&other),
        }
    }

    /// The id as the value its column binds: the inverse of
    /// [`SortOwner::of`] for an id of a `column` owner.
    #[cfg_attr(not(feature = "buffer"), allow(dead_code))]
    pub(crate) fn to_value(&self, column: OwnerColumn) -> Value {
        match (self, column) {
            // An `Integer` owner came from an `i32`, so it fits; were it
            // not to, it is bound as it is and the database refuses it.
            (Self::Int(v), OwnerColumn::Integer) => match i32::try_from(*v) {
                Ok(v) => Value::Int(Some(v)),
                Err(_) => Value::BigInt(Some(*v)),
            },
            (Self::Int(v), _) => Value::BigInt(Some(*v)),
            (Self::Uuid(v), _) => Value::Uuid(Some(*v)),
            (Self::Str(v), _) => Value::String(Some(v.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_owners_that_would_merge_on_mysql_are_rejected() {
        assert!("alice".to_owned().check().is_ok());
        assert!(
            "Zoë 🚀"
                .repeat(30)
                .chars()
                .take(255)
                .collect::<String>()
                .check()
                .is_ok()
        );
        assert!("a ".to_owned().check().is_err());
        assert!("x".repeat(256).check().is_err());
        assert!(" a\t".to_owned().check().is_ok());
        assert!("a\0b".to_owned().check().is_err());
    }
}
