//! Types that exist for the OpenAPI document only: what a handler reads as
//! a `serde_json::Value` (so that an owner can be a string or a number),
//! described as what it accepts, for clients generated from the document.

use serde::Serialize;
use utoipa::ToSchema;

/// An owner: a string (at most 255 characters; a UUID in a UUID
/// namespace), or in an integer namespace a 64-bit integer, as a number or
/// as its decimal string. Answers always name owners as strings.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum OwnerValue {
    /// The owner as text.
    Text(String),
    /// An integer namespace's owner as a number.
    Integer(i64),
}

/// A member of a unique key: a string or an integer (`42` and `"42"` are
/// one member), at most 1,024 bytes.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum MemberValue {
    /// The member as text.
    Text(String),
    /// The member as an integer.
    Integer(i64),
}
