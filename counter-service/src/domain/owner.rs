//! Owner ids as they travel: JSON numbers or strings in, strings out.
//!
//! A namespace's owners are 64-bit integers, UUIDs or strings. Integers are
//! accepted as JSON numbers or decimal strings (a 64-bit id does not fit a
//! JavaScript number) and always answered as strings, like the other two
//! types, so a client reads every owner the same way.

use counter_core::{OwnerId, limits::MAX_STRING_OWNER_LEN};
use serde_json::Value;

use crate::problem::{Problem, preview};

/// An owner id type the service serves.
pub(crate) trait ServiceOwner: OwnerId {
    /// From a JSON value of a request body.
    fn from_json(value: &Value) -> Result<Self, Problem> {
        match value {
            Value::String(text) => Self::from_text(text),
            other => Err(Problem::bad_request(format!(
                "an owner is a JSON string here, not {}",
                preview(&other.to_string())
            ))),
        }
    }

    /// From its text (a query string item, a JSON string).
    fn from_text(text: &str) -> Result<Self, Problem>;

    /// As answered: a string.
    fn render(&self) -> String;

    /// An owner of this type, for examples and probes.
    fn example() -> Self;
}

/// Bounds every owner's text before it is parsed: a 10 kB owner is refused
/// by length, naming the bound, whatever the namespace's type.
fn check_length(text: &str) -> Result<(), Problem> {
    let chars = text.chars().count();
    if chars > MAX_STRING_OWNER_LEN {
        return Err(Problem::over_bound(
            "owner length",
            MAX_STRING_OWNER_LEN,
            chars,
        ));
    }
    Ok(())
}

impl ServiceOwner for i64 {
    fn from_json(value: &Value) -> Result<Self, Problem> {
        match value {
            Value::Number(n) => n.as_i64().ok_or_else(|| {
                Problem::bad_request(format!("the owner {n} is not a 64-bit integer"))
            }),
            Value::String(text) => Self::from_text(text),
            other => Err(Problem::bad_request(format!(
                "an owner is an integer or a string of one here, not {}",
                preview(&other.to_string())
            ))),
        }
    }

    fn from_text(text: &str) -> Result<Self, Problem> {
        check_length(text)?;
        text.parse().map_err(|_| {
            Problem::bad_request(format!(
                "the owner `{}` is not a 64-bit integer",
                preview(text)
            ))
        })
    }

    fn render(&self) -> String {
        self.to_string()
    }

    fn example() -> Self {
        1
    }
}

impl ServiceOwner for uuid::Uuid {
    fn from_text(text: &str) -> Result<Self, Problem> {
        check_length(text)?;
        text.parse().map_err(|_| {
            Problem::bad_request(format!("the owner `{}` is not a UUID", preview(text)))
        })
    }

    fn render(&self) -> String {
        self.hyphenated().to_string()
    }

    fn example() -> Self {
        uuid::Uuid::from_u128(0x0192_3f4e_7a1b_7c3d_8e5f_0a1b_2c3d_4e5f)
    }
}

impl ServiceOwner for String {
    fn from_text(text: &str) -> Result<Self, Problem> {
        check_length(text)?;
        let owner = text.to_owned();
        // The library's rules (no trailing space, no NUL), as a 400.
        owner.check()?;
        Ok(owner)
    }

    fn render(&self) -> String {
        self.clone()
    }

    fn example() -> Self {
        "post-1".to_owned()
    }
}

impl crate::config::OwnerType {
    /// An owner of this type as a client writes it: what the service's
    /// start lines and examples use.
    pub fn example(self) -> String {
        match self {
            Self::Integer => i64::example().render(),
            Self::Uuid => uuid::Uuid::example().render(),
            Self::String => String::example(),
        }
    }

    /// Another owner of this type, never added to by the start lines: the
    /// second owner of their batch get, whose 0 shows the zero fill (what
    /// the guide's first steps show).
    pub fn other_example(self) -> String {
        match self {
            Self::Integer => 2.to_string(),
            Self::Uuid => uuid::Uuid::from_u128(0x0192_3f4e_7a1b_7c3d_8e5f_0a1b_2c3d_4e60)
                .hyphenated()
                .to_string(),
            Self::String => "post-2".to_owned(),
        }
    }
}
