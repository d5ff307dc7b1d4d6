//! What an owner's key holds: all of its counts packed in one string, or
//! the lease of the fill in progress.
//!
//! * `c1|likes=3,comments=12,reaction:heart=1`: complete. Every count key
//!   of the owner is there, so an absent key reads as 0; an owner with no
//!   counts is `c1|`. Count keys are `[A-Za-z0-9_.:-]`, so `=` and `,`
//!   cannot appear in one, and the text reads as is in `redis-cli`.
//! * `l1|<token>`: a fill holds the lease (`SET NX PX`); it replaces the
//!   value only if the lease is still its own (`scripts::FILL`).
//!
//! Why one string and not a hash per owner (the design document's first
//! choice): the 1,000-owner read is one `MGET` instead of a pipeline of
//! 1,000 `HMGET`s, 0.4 ms against 1.8 ms measured here (4.5x, past the 2x
//! the design set for revisiting), and 4 counts take less memory. What a
//! hash offered and this gives up: `HINCRBY` of one field (a write-through
//! mode, not built) and partial reads (the reads want all keys anyway).

use std::collections::HashMap;

/// The prefix of a complete value.
const COMPLETE: &[u8] = b"c1|";
/// The prefix of a lease.
const LEASE: &[u8] = b"l1|";

/// What one owner's key held.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) enum Entry<T> {
    /// Nothing: a miss.
    #[default]
    Missing,
    /// Something this layout did not write: a miss, deleted so that a fill
    /// can lease the key.
    Invalid,
    /// A fill holds the lease.
    Leased,
    /// Every count of the owner (those asked for, when a read names keys),
    /// decoded into the reader's type.
    Complete(T),
}

/// The lease value of `token`.
pub(crate) fn lease(token: &str) -> String {
    format!("l1|{token}")
}

/// The complete value of an owner's counts; `None` if a key holds `,` or
/// `=` (the library's keys cannot; raw SQL could write one).
pub(crate) fn encode(counts: &HashMap<String, i64>) -> Option<String> {
    let mut out = String::with_capacity(4 + counts.len() * 16);
    out.push_str("c1|");
    for (i, (key, total)) in counts.iter().enumerate() {
        if key.contains([',', '=']) {
            return None;
        }
        if i > 0 {
            out.push(',');
        }
        out.push_str(key);
        out.push('=');
        out.push_str(&total.to_string());
    }
    Some(out)
}

/// Reads a value into a `T`, calling `set` for each count kept: those of
/// `wanted`, or all with `None`.
pub(crate) fn decode<T: Default>(
    value: Option<&[u8]>,
    wanted: Option<&[String]>,
    set: impl Fn(&mut T, &str, i64),
) -> Entry<T> {
    let Some(value) = value else {
        return Entry::Missing;
    };
    if value.starts_with(LEASE) {
        return Entry::Leased;
    }
    let Some(body) = value.strip_prefix(COMPLETE) else {
        return Entry::Invalid;
    };
    let Ok(body) = std::str::from_utf8(body) else {
        return Entry::Invalid;
    };
    let mut counts = T::default();
    for pair in body.split(',').filter(|p| !p.is_empty()) {
        let Some((key, total)) = pair.split_once('=') else {
            return Entry::Invalid;
        };
        let Ok(total) = total.parse::<i64>() else {
            return Entry::Invalid;
        };
        if wanted.is_none_or(|w| w.iter().any(|k| k == key)) {
            set(&mut counts, key, total);
        }
    }
    Entry::Complete(counts)
}

/// [`decode`] into totals by key name.
pub(crate) fn decode_map(
    value: Option<&[u8]>,
    wanted: Option<&[String]>,
) -> Entry<HashMap<String, i64>> {
    decode(
        value,
        wanted,
        |map: &mut HashMap<String, i64>, key, total| {
            map.insert(key.to_owned(), total);
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_strangers_are_misses() {
        let counts = HashMap::from([
            ("likes".to_owned(), -3),
            ("reaction:heart".to_owned(), i64::MAX),
        ]);
        let value = encode(&counts).unwrap();
        assert_eq!(encode(&HashMap::from([("x=1,likes".to_owned(), 1)])), None);
        assert_eq!(
            decode_map(Some(value.as_bytes()), None),
            Entry::Complete(counts.clone())
        );
        let only = decode_map(Some(value.as_bytes()), Some(&["likes".to_owned()]));
        assert_eq!(
            only,
            Entry::Complete(HashMap::from([("likes".to_owned(), -3)]))
        );
        assert_eq!(
            decode_map(Some(b"c1|"), None),
            Entry::Complete(HashMap::new())
        );
        assert_eq!(
            decode_map(Some(lease("abc").as_bytes()), None),
            Entry::Leased
        );
        assert_eq!(decode_map(None, None), Entry::Missing);
        for stranger in [&b"hello"[..], b"c1|likes", b"c1|likes=x", b"c1|\xff=1"] {
            assert_eq!(
                decode_map(Some(stranger), None),
                Entry::Invalid,
                "{stranger:?}"
            );
        }
    }
}
