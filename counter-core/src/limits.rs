//! Every bound the crate enforces, in one place: an argument past one of them
//! is refused with [`CounterError::OutOfRange`](crate::CounterError::OutOfRange)
//! (or, for names, the matching invalid-input error) before any SQL runs.
//! The slot-count bound is [`Slots::MAX`](crate::Slots::MAX).

/// The longest key, in bytes (the width of the `count_key` column).
pub const MAX_KEY_LEN: usize = 64;

/// The longest table name accepted (PostgreSQL truncates identifiers past 63 bytes).
pub const MAX_TABLE_NAME_LEN: usize = 63;

/// The longest string owner id, in characters (`VARCHAR(255)`).
pub const MAX_STRING_OWNER_LEN: usize = 255;

/// Rows per multi-row upsert. Far under every bind limit (4 binds a row), and
/// small enough that one statement never holds many row locks for long.
pub const UPSERT_ROWS_PER_STATEMENT: usize = 1_000;

/// The largest page of a ranking.
pub const MAX_RANK_PAGE: usize = 10_000;

/// The most buckets one series may return (about 11 years of hours).
pub const MAX_SERIES_BUCKETS: usize = 100_000;

/// The most bucket sketches one unique range read may merge: owners x
/// buckets of [`Counters::unique_over_many`](crate::Counters::unique_over_many)
/// (1,000 owners over 100 days, or 100 owners over 1,000 hours). Each
/// sketch is up to 12 kB, so this bounds the read's rows and its merging.
pub const MAX_UNIQUE_RANGE_SKETCHES: usize = 100_000;

/// The largest [`Compact::batch_rows`](crate::Compact::batch_rows).
pub const MAX_COMPACT_BATCH: usize = 10_000;

/// The most distinct counters a buffer may hold pending.
#[cfg(feature = "buffer")]
pub const MAX_BUFFER_CAPACITY: usize = 10_000_000;

/// The largest [`Reconcile::batch_size`](crate::Reconcile::batch_size): a batch's owners may be bound
/// three times in its statement (each side, and the truth query's own
/// filter), which stays under SQLite's 32,766 binds with room for the truth
/// query's.
pub const MAX_RECONCILE_BATCH: usize = 5_000;
