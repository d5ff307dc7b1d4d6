//! The app's migrations, in Loco's layout: this crate knows tables, not
//! the app's entities (the app depends on it, so it cannot depend on
//! the app). The counters are declared here, once, in [`counters`]: the
//! migrations below build their tables from that declaration, and the
//! app binds the same declaration to its generated entity.

pub use sea_orm_migration::prelude::*;

pub mod counters;
mod m20261126_000001_notes;
mod m20261126_000002_comments;

use counter_core::Truth;
use counters::note_counters::{self, Key};

pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261126_000001_notes::Migration),
            Box::new(m20261126_000002_comments::Migration),
            // The counter tables, named in the app's own convention.
            Box::new(
                note_counters::counters()
                    .migration()
                    .named("m20261126_000003_note_counters"),
            ),
            // The comments counter cache, added to a table that may already
            // have rows: filled from them, exactly, while the app writes.
            Box::new(
                note_counters::counters()
                    .backfill_migration(Key::Comments, Truth::rows_of("comments", "note_id"))
                    .named("m20261126_000004_backfill_note_comments"),
            ),
        ]
    }
}
