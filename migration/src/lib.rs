//! The schema of the examples and tests: a small blog, and its counter tables.
//!
//! A standard sea-orm-migration crate: `cargo run -p migration -- up|down|status`
//! against `DATABASE_URL` (an SQLite file, PostgreSQL or MySQL/MariaDB URL).

pub use sea_orm_migration::prelude::*;

use counter_core::{FlushLedger, SlottedCounter};
use entity::{post, user};

mod m20261122_000001_create_blog;
mod m20261122_000002_create_comments;

/// The migrations, in order: owner tables first, then their counter tables,
/// each added with one line from its entity's `#[derive(SlottedCounter)]`;
/// later migrations are appended, never inserted (their names are stored in
/// every database that ran them).
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261122_000001_create_blog::Migration),
            Box::new(post::Entity::counters().migration()),
            Box::new(user::Entity::counters().migration()),
            // The child table of the `comments` counter cache (entity::comment).
            Box::new(m20261122_000002_create_comments::Migration),
            // Post views got a daily window, and rankings a key index: this
            // brings `post_counters` of databases migrated before up to date
            // (and changes nothing on new ones).
            Box::new(post::Entity::counters().upgrade_migration()),
            Box::new(user::Entity::counters().upgrade_migration()),
            // The ledger that makes `CounterBuffer` flushes exactly-once
            // (one row per running buffer).
            Box::new(FlushLedger::default().migration()),
        ]
    }
}
