//! Counter caches on every backend: the cache following row writes, counted
//! deletes of natural keys, and recounts in any collation. One test binary,
//! one module per area; each test is registered per backend.

mod collation;
mod counter_cache;
mod natural_keys;
mod parent_ids;
