//! Read-your-write across instances, through the cache.
//!
//! A write deletes its owners' cached values after its commit (see
//! `counter-redis`). If Redis does not confirm the deletion within the
//! cache's timeout (a connection cut, a slow moment on a busy machine), the
//! library still returns `Ok`, since the write has committed, and owes the
//! deletion: this process stops serving those owners from the cache, but
//! another instance would read the old total until the deletion is retried.
//! That was the service's one stale read under load (issue 39). So an
//! answer to a write waits until the deletions owed are confirmed, for at
//! most [`CONFIRM_WITHIN`]; only a Redis that stays unreachable that long
//! lets an answer go first, counted and logged.

use std::time::Duration;

use counter_redis::CountCache;

use crate::metrics::UNCONFIRMED;

/// The longest an answer waits for Redis to confirm deletions owed.
pub(crate) const CONFIRM_WITHIN: Duration = Duration::from_millis(500);

/// Waits until the deletions `cache` owes now have reached Redis (nothing
/// to wait for, the common case, costs one lock), for at most
/// [`CONFIRM_WITHIN`].
pub(crate) async fn confirm_deletions(cache: Option<&CountCache>) {
    let Some(cache) = cache else { return };
    if let Err(owed) = cache.flush_invalidations(CONFIRM_WITHIN).await {
        metrics::counter!(UNCONFIRMED).increment(1);
        tracing::warn!(%owed, "answering before Redis confirmed a deletion: other instances may read the old total until it is retried");
    }
}
