//! A shared Redis cache in front of slotted counters.
//!
//! The database stays the only source of truth: Redis holds copies of
//! totals, one value per owner with every count key of that owner, so losing
//! Redis costs misses, never counts.
//!
//! ```no_run
//! # mod post { pub use counter_core::Untyped as Entity; }
//! # async fn f(db: sea_orm::DatabaseConnection) -> Result<(), Box<dyn std::error::Error>> {
//! use counter_core::{CounterTable, Counters};
//! use counter_redis::{CountCache, RedisTarget};
//!
//! let cache = CountCache::builder(RedisTarget::standalone("redis://127.0.0.1:6379"))
//!     .namespace("blog")
//!     .build()
//!     .await?;
//! let posts = cache.table(&Counters::<i64>::new(CounterTable::new("post_counters")?));
//! posts.increment(&db, 7, "likes").await?; // the library's write; post 7 is deleted after COMMIT
//! let totals = posts.get_many(&db, &[7, 8, 9], &["likes", "views"]).await?; // one round trip when cached
//! # let _ = totals; Ok(()) }
//! ```
//!
//! # What it guarantees
//!
//! * **Truth.** Totals are the database's; no cache state changes one.
//! * **Read your writes, across processes.** Once a write of the library
//!   (single writes, batches, counter-cache hooks and `*_counted`, buffer
//!   flushes, recount repairs, purges) has returned `Ok`, and its deletion
//!   reached Redis, every cached read from any process includes it. Writes
//!   in your own transaction need [`CountCache::transaction`] (or
//!   [`counter_core::observe::scope`] and `committed()` after your commit).
//! * **No stale fill.** A fill whose database read began before a write's
//!   commit never survives that write's deletion: the fill is a
//!   compare-and-set on a lease the deletion removes (see `scripts.rs`).
//! * **Bounded staleness when Redis fails.** A write never fails because
//!   Redis did: the owner is retried in the background, counted in
//!   [`CacheStats::invalidation_failures`], read from the database by this
//!   process until deleted, and stale elsewhere for at most the TTL.
//! * **Redis never fails a read.** Errors and timeouts fall back to the
//!   database (counted), and a circuit breaker skips Redis for a while
//!   after a run of failures.
//!
//! Not covered: deletes the library does not make (raw SQL: call
//! [`CachedCounters::invalidate`]; an owner deleted by `ON DELETE CASCADE`
//! keeps its cached totals until the TTL, harmless unless its id is reused;
//! `clear` on a cluster) and writes from processes without the cache.

#![warn(missing_docs)]

mod breaker;
mod cache;
mod config;
mod keys;
mod link;
mod pubsub;
mod read;
mod scripts;
mod sentinel;
mod stats;
mod value;
mod verify;

pub use cache::CountCache;
pub use config::{CacheBuilder, CacheError, RedisTarget};
pub use pubsub::Subscription;
pub use read::{CachedCounters, pause};
pub use stats::CacheStats;
pub use verify::VerifyReport;
