//! Where an owner's counts live in Redis: one key per owner (its value:
//! `value.rs`).
//!
//! Key `sc2:<namespace>:{<table>:<owner>}`. `sc2` is the layout's version
//! (bumped to abandon every old entry at once: `sc1` held a hash per
//! owner, which a string read would not understand); the namespace keeps apps
//! and test runs apart; the `{...}` hash tag keeps an owner's key in the
//! slot of its tag (room for per-owner companions later). Table names are
//! SQL identifiers and cannot hold `:`, so no two (table, owner) pairs
//! share a key.

use sea_orm::Value;

/// The version prefix of every key.
const VERSION: &str = "sc2";

/// The Redis key of one owner.
pub(crate) fn owner_key(namespace: &str, table: &str, owner: &Value) -> Vec<u8> {
    let mut key = Vec::with_capacity(VERSION.len() + namespace.len() + table.len() + 24);
    write_owner_key(namespace, table, owner, &mut key);
    key
}

/// [`owner_key`], appended to `out`.
pub(crate) fn write_owner_key(namespace: &str, table: &str, owner: &Value, out: &mut Vec<u8>) {
    out.extend_from_slice(VERSION.as_bytes());
    out.push(b':');
    out.extend_from_slice(namespace.as_bytes());
    out.extend_from_slice(b":{");
    out.extend_from_slice(table.as_bytes());
    out.push(b':');
    render_owner(owner, out);
    out.push(b'}');
}

/// The pattern matching every key of `table` in `namespace` (for `SCAN`).
pub(crate) fn table_pattern(namespace: &str, table: &str) -> String {
    // Namespaces and table names hold no glob characters (both validated).
    format!("{VERSION}:{namespace}:{{{table}:*")
}

/// An owner id as text, the same whichever integer width bound it: the
/// write paths report `owner_id` values as bound in SQL, the reads build
/// them from the typed id, and both must name the same key.
fn render_owner(owner: &Value, out: &mut Vec<u8>) {
    use std::io::Write;
    // Writing to a `Vec` cannot fail.
    let _ = match owner {
        // The usual owner types, without the formatting machinery: every
        // key of a read of a thousand owners is built here.
        Value::Int(Some(n)) => {
            decimal(i64::from(*n), out);
            Ok(())
        }
        Value::BigInt(Some(n)) => {
            decimal(*n, out);
            Ok(())
        }
        Value::TinyInt(Some(n)) => write!(out, "{n}"),
        Value::SmallInt(Some(n)) => write!(out, "{n}"),
        Value::TinyUnsigned(Some(n)) => write!(out, "{n}"),
        Value::SmallUnsigned(Some(n)) => write!(out, "{n}"),
        Value::Unsigned(Some(n)) => write!(out, "{n}"),
        Value::BigUnsigned(Some(n)) => write!(out, "{n}"),
        // Strings byte for byte: owners compare exactly in every backend
        // (a binary collation on MySQL), so `Alice` and `alice` are two
        // owners here too. Braces inside change which slot the key hashes
        // to, never which key it is.
        Value::String(Some(s)) => out.write_all(s.as_bytes()),
        Value::Uuid(Some(u)) => write!(out, "{}", u.hyphenated()),
        other => write!(out, "{other:?}"),
    };
}

/// `n` in decimal.
fn decimal(n: i64, out: &mut Vec<u8>) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if n < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[at..]);
}

/// Namespaces: 1 to 64 bytes of `[A-Za-z0-9_.-]`.
pub(crate) fn valid_namespace(namespace: &str) -> bool {
    (1..=64).contains(&namespace.len())
        && namespace
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_widths_name_the_same_hash() {
        let wide = owner_key("app", "post_counters", &Value::BigInt(Some(42)));
        let narrow = owner_key("app", "post_counters", &Value::Int(Some(42)));
        assert_eq!(wide, narrow);
        assert_eq!(wide, b"sc2:app:{post_counters:42}");
    }

    #[test]
    fn integers_render_in_decimal() {
        for n in [0, 7, -7, 10, i64::MAX, i64::MIN, -1_000_000] {
            let mut out = Vec::new();
            decimal(n, &mut out);
            assert_eq!(out, n.to_string().into_bytes());
        }
    }

    #[test]
    fn strings_are_exact_and_tables_apart() {
        let alice = owner_key("app", "t", &Value::String(Some("Alice".into())));
        let lower = owner_key("app", "t", &Value::String(Some("alice".into())));
        assert_ne!(alice, lower);
        let other = owner_key("app", "u", &Value::String(Some("Alice".into())));
        assert_ne!(alice, other);
    }

    #[test]
    fn namespaces_are_checked() {
        assert!(valid_namespace("blog-prod.v2_x"));
        assert!(!valid_namespace(""));
        assert!(!valid_namespace("a:b"));
        assert!(!valid_namespace("a*"));
        assert!(!valid_namespace(&"x".repeat(65)));
    }
}
