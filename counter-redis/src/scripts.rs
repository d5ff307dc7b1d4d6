//! The compare-and-set of a fill. A fill must never store a total that a
//! write committed before it can have missed: the writer deletes the key
//! after its commit, and the fill only lands if its lease is still there.
//!
//! A fill takes its lease with `SET key l1|<token> NX PX <lease>` (only
//! where nothing is cached), reads the database, then runs [`FILL`]. Why
//! that is enough: a write's `UNLINK` follows its commit. If it lands
//! before the lease, the filler reads the database after the commit and
//! sees the write. If it lands after the lease, it deletes the lease, and
//! the compare-and-set finds no lease (or another filler's) and stores
//! nothing. Tokens are random 128-bit values, so a restarted Redis or an
//! evicted lease only makes fills fail.

use std::sync::LazyLock;

use redis::Script;

/// `KEYS[1]` the owner's key; `ARGV` the lease value, the complete value,
/// TTL seconds. Stores the value if the lease is still this one; returns 1
/// if it did, 0 if a write (or another filler) came first.
pub(crate) static FILL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
return 1",
    )
});
