//! The schema of the examples and tests: a small blog, and its counter tables.
//!
//! A standard sea-orm-migration crate: `cargo run -p migration -- up|down|status`
//! against `DATABASE_URL` (an SQLite file, PostgreSQL or MySQL/MariaDB URL).

pub use sea_orm_migration::prelude::*;

use counter_core::{CounterTable, Counters};

mod m20261122_000001_create_blog;

/// The companion table of `posts`.
pub const POST_COUNTERS: &str = "post_counters";
/// The companion table of `users`.
pub const USER_COUNTERS: &str = "user_counters";

/// The migrations, in order: owner tables first, then their counter tables.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261122_000001_create_blog::Migration),
            Box::new(counters_of(POST_COUNTERS).migration()),
            Box::new(counters_of(USER_COUNTERS).migration()),
        ]
    }
}

fn counters_of(table: &'static str) -> Counters<i64> {
    // Both names are constants above; a typo fails every test at once.
    Counters::new(CounterTable::new(table).expect("the schema's counter table names are valid"))
}
