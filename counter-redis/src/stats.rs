//! What the cache did, counted: the figures that show it works in
//! production (a hit ratio, fills per invalidation, and the failures that
//! bound staleness).

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a [`CountCache`](crate::CountCache)'s counters since it
/// was built. Owners are counted once per read that asked for them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheStats {
    /// Owners served from Redis.
    pub hits: u64,
    /// Owners not in Redis (or not complete there) when read.
    pub misses: u64,
    /// Owners read from the database and stored under a lease.
    pub fills: u64,
    /// Fills whose compare-and-set lost to a write (or another filler)
    /// that came between lease and fill: the database value was returned,
    /// nothing stored. Each one is a stale value kept out of Redis.
    pub fill_cas_lost: u64,
    /// Owners whose read waited for another filler (in this process or,
    /// through its lease, another).
    pub lease_waits: u64,
    /// Owners read from the database without filling: the wait for another
    /// filler ran out, or the owner had an invalidation pending here.
    pub uncached_reads: u64,
    /// Owners whose hash was deleted after a write, a repair or a call to
    /// `invalidate`.
    pub invalidations: u64,
    /// Owners whose deletion failed and went to the retry set (staleness
    /// bounded by the TTL from here on; retried in the background).
    pub invalidation_failures: u64,
    /// Owners still waiting in the retry set.
    pub invalidations_pending: u64,
    /// Fills whose store is still running in the background (a read
    /// returns its database values without waiting for the store).
    pub fills_in_flight: u64,
    /// Owners written inside a transaction outside any scope, whose commit
    /// the cache cannot see: deleted now and again after the delay.
    pub unscoped_writes: u64,
    /// Owners read from the database because Redis failed, timed out or
    /// was skipped by the open circuit breaker.
    pub db_fallbacks: u64,
    /// Redis operations that failed or timed out.
    pub redis_errors: u64,
    /// Times the circuit breaker opened.
    pub breaker_opens: u64,
    /// Owners `verify` found cached with a value other than the database's
    /// (and deleted).
    pub mismatches: u64,
}

macro_rules! meter {
    ($($field:ident),* $(,)?) => {
        #[derive(Debug, Default)]
        pub(crate) struct Meter { $(pub(crate) $field: AtomicU64,)* }

        impl Meter {
            /// The counters; `invalidations_pending` is the cache's to fill
            /// in (the size of its retry set, not a counter).
            pub(crate) fn snapshot(&self) -> CacheStats {
                CacheStats {
                    $($field: self.$field.load(Ordering::Relaxed),)*
                    ..CacheStats::default()
                }
            }
        }
    };
}

meter!(
    hits,
    misses,
    fills,
    fill_cas_lost,
    lease_waits,
    uncached_reads,
    invalidations,
    invalidation_failures,
    fills_in_flight,
    unscoped_writes,
    db_fallbacks,
    redis_errors,
    breaker_opens,
    mismatches,
);

/// Adds `n` to a counter.
pub(crate) fn bump(counter: &AtomicU64, n: usize) {
    counter.fetch_add(n as u64, Ordering::Relaxed);
}
