// docs/guide/regions.md: a region's pool and the app's counters.
include!("common.rs");

pub use counter_core::{Region, RegionLag};

pub struct World {
    pub db: DatabaseConnection,
    pub post_id: i64,
    /// The app's counters, in no region yet.
    pub post_counters: Counters<i64>,
}
