//! The two Lua scripts of a fill. A fill must never store a total that a
//! write committed before it can have missed: the writer deletes the hash
//! after its commit, and the fill only lands if its lease is still there.
//!
//! Why that is enough: a write's `UNLINK` follows its commit. If it lands
//! before the filler's `LEASE`, the filler reads the database after the
//! commit and sees the write. If it lands after the `LEASE`, it deletes the
//! lease with the hash, and the filler's compare-and-set in `FILL` finds no
//! token (or another filler's) and stores nothing. Tokens are random 128-bit
//! values, so a restarted Redis or an evicted lease only make fills fail.
//!
//! Counts travel as strings and the scripts do no arithmetic (Lua numbers
//! are doubles, exact only to 2^53).

use std::sync::LazyLock;

use redis::Script;

/// `KEYS[1]` the owner's hash; `ARGV` token, lease milliseconds. Returns 1
/// if the lease was taken: the hash did not exist (a complete hash, or
/// another filler's lease, is left alone and 0 returned).
pub(crate) static LEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], '!l', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1",
    )
});

/// `KEYS[1]` the owner's hash; `ARGV` token, TTL seconds, then field and
/// value pairs. Stores the complete hash if the lease is still this
/// token's; returns 1 if it did, 0 if a write (or another filler) came
/// first.
pub(crate) static FILL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"if redis.call('HGET', KEYS[1], '!l') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], '!c', '1', unpack(ARGV, 3))
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1",
    )
});

/// Fields a fill may carry: Lua's `unpack` stops near 8,000 values, and two
/// go to `!c`. An owner with more count keys is served from the database,
/// uncached.
pub(crate) const MAX_FILL_FIELDS: usize = 3_000;
