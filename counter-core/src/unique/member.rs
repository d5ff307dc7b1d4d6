//! What can be counted once: any value with a stable byte form.

use std::borrow::Cow;

/// A member of a unique count (a user id, an IP address, a session): its
/// bytes are hashed. Integers and UUIDs hash as their text (`42`,
/// `67e55044-10b1-426f-9247-bb680e5fe0c8`), so a member counts once whether
/// a Rust caller passes `42_i64` or another language sends `"42"`, and a
/// sketch agrees with Redis `PFADD` of the same strings.
pub trait Member {
    /// Calls `f` with the member's bytes.
    fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R;
}

impl Member for str {
    fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(self.as_bytes())
    }
}

impl Member for String {
    fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(self.as_bytes())
    }
}

impl Member for [u8] {
    fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(self)
    }
}

impl Member for Cow<'_, str> {
    fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(self.as_bytes())
    }
}

impl<M: Member + ?Sized> Member for &M {
    fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        (**self).with_bytes(f)
    }
}

macro_rules! as_text {
    ($($t:ty),*) => {$(
        impl Member for $t {
            fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
                f(self.to_string().as_bytes())
            }
        }
    )*};
}

as_text!(i32, i64, u32, u64, uuid::Uuid, std::net::IpAddr);

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(member: &impl Member) -> Vec<u8> {
        member.with_bytes(<[u8]>::to_vec)
    }

    #[test]
    fn integers_and_uuids_are_their_text() {
        assert_eq!(bytes(&42_i64), bytes(&"42"));
        assert_eq!(bytes(&-7_i32), b"-7");
        let id: uuid::Uuid = "67e55044-10b1-426f-9247-bb680e5fe0c8".parse().unwrap();
        assert_eq!(bytes(&id), b"67e55044-10b1-426f-9247-bb680e5fe0c8");
        let ip: std::net::IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(bytes(&ip), b"10.0.0.1");
        assert_eq!(bytes(&String::from("é")), "é".as_bytes());
    }
}
