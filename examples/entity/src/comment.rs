//! Comments: rows of their own, counted on their post.
//!
//! A post's `comments` counter is a *counter cache* of this table: it is
//! changed only together with a comment row, in the same transaction, so it
//! always equals `SELECT COUNT(*) FROM comments WHERE post_id = ?` without
//! that query being run on every read.
//!
//! # Writing comments
//!
//! * One comment: `comment::Entity::insert_counted(&db, am)`,
//!   `update_counted` and `delete_counted` (`counter_core::CounterCache`).
//!   Each opens a transaction of its own (a savepoint inside the caller's),
//!   writes the row and its counter in it, and retries deadlocks.
//! * In a transaction of the caller's: the plain `am.insert(&txn)`,
//!   `am.update(&txn)`, `am.delete(&txn)` work too, through the hooks that
//!   `counter_cache_behavior!` installs; the counter commits or rolls back
//!   with the comment.
//! * On the bare pool, `am.insert(&db)` is refused with an error that says
//!   the above: the comment and its counter would be two separate commits, so
//!   a crash between them (or two concurrent deletes of one comment, both
//!   seeing it) would leave the counter off for good.
//! * `Entity::insert_many`, `update_many`, `delete_many` and `delete_by_id`
//!   run no hooks (sea-orm's design): they change rows without changing the
//!   counter. Use `insert_many_counted`, `update_many_counted` and
//!   `delete_many_counted` instead.
//!
//! A delete decrements only if it removed the row: the row is locked and read
//! first, so of two deletes of one comment (a double click), only one counts.
//! Anything written behind the cache's back (raw SQL, an import) is drift,
//! found (and repaired, unless a dry run) by [`recount`].

use counter_core::{CounterCache, CounterError, Reconcile, ReconcileReport, SlottedCounter, Truth};
use sea_orm::entity::prelude::*;
use serde::Serialize;

use super::post;

/// A comment on a post. Each row counts 1 in its post's `comments` counter
/// (`post_counters`).
///
/// Serialized as stored (`{"id", "post_id", "author_id", "body"}`): the
/// blog server answers a new comment with this row, so a column added here
/// reaches the API without a second struct to keep in step.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, CounterCache, Serialize)]
#[sea_orm(table_name = "comments")]
#[counter_cache(parent = super::post::Entity, key = comments, via = post_id)]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    /// The post commented on, and whose `comments` counter this row feeds.
    /// Indexed (the migration), as the recount groups by it. Not a foreign
    /// key: see the migration for why.
    pub post_id: i64,
    /// The user who wrote it (only they delete it, in the demo).
    pub author_id: i64,
    pub body: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

// The hooks that keep `comments` exact on every `insert`, `update`, `save`
// and `delete` of an `ActiveModel`, in place of
// `impl ActiveModelBehavior for ActiveModel {}`. They refuse a bare pool (see
// the module docs).
counter_core::counter_cache_behavior!();

/// Recounts every post's `comments` from the comment rows (the truth comes
/// from this entity's counter-cache declaration) and, unless `dry_run`,
/// repairs the drift it finds.
///
/// One definition for every caller that judges or repairs the cache (the
/// demo, the blog server's tests), so they cannot disagree on the key or
/// the truth they recount from. A dry run takes no lock and writes nothing:
/// the drift stays in the database as evidence.
pub async fn recount(
    db: &DatabaseConnection,
    dry_run: bool,
) -> Result<ReconcileReport<i64>, CounterError> {
    post::Entity::counters()
        .reconcile(
            db,
            post::counters::Key::Comments,
            Truth::counter_cache::<Entity>(),
            &Reconcile::new().dry_run(dry_run),
        )
        .await
}
