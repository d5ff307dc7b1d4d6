//! The posts and users the simulation writes to, inserted only where
//! missing so that the demo can run again on the same database.

use std::collections::HashSet;

use counter_core::prelude::*;
use entity::{post, user};
use sea_orm::{DatabaseConnection, EntityTrait, QueryOrder, QuerySelect, Set, TransactionTrait};

use crate::BoxError;

/// Rows per `INSERT` when seeding: few statements, yet well under the
/// databases' limits on bind parameters per statement.
const SEED_BATCH: usize = 500;

/// Post titles, cycled, so the tables read like a blog rather than a list of
/// numbers.
const TOPICS: &[&str] = &[
    "Why a hot row is a queue",
    "Counters are rows, not columns",
    "SUM over sixteen slots",
    "One upsert, three databases",
    "A page of posts, one query",
    "New counters without DDL",
    "Backoff with full jitter",
    "Retrying deadlocks safely",
    "Views are the hottest counter",
    "Migrations for companion tables",
];

/// Every post and user in the database, and how many of them this run
/// added, for the "already there" line.
pub struct Seeded {
    pub posts: Vec<post::Model>,
    pub users: Vec<user::Model>,
    pub new_posts: usize,
    pub new_users: usize,
}

/// Inserts the users `user1..=user{users}` and posts `Post 1..=Post {posts}`
/// that are missing, in batches, and counts each new post on its author's
/// `posts` counter: all in one transaction, the counters included, so that
/// an interrupted seed leaves no post uncounted.
pub async fn seed(db: &DatabaseConnection, posts: usize, users: usize) -> Result<Seeded, BoxError> {
    let txn = db.begin().await?;

    let names: HashSet<String> = user::Entity::find()
        .select_only()
        .column(user::Column::Name)
        .into_tuple::<String>()
        .all(&txn)
        .await?
        .into_iter()
        .collect();
    let missing: Vec<String> = (1..=users)
        .map(|n| format!("user{n}"))
        .filter(|name| !names.contains(name))
        .collect();
    let new_users = missing.len();
    for chunk in missing.chunks(SEED_BATCH) {
        user::Entity::insert_many(chunk.iter().map(|name| user::ActiveModel {
            name: Set(name.clone()),
            ..Default::default()
        }))
        .exec_without_returning(&txn)
        .await?;
    }
    let all_users = user::Entity::find()
        .order_by_asc(user::Column::Id)
        .all(&txn)
        .await?;

    let titles: HashSet<String> = post::Entity::find()
        .select_only()
        .column(post::Column::Title)
        .into_tuple::<String>()
        .all(&txn)
        .await?
        .into_iter()
        .collect();
    let missing: Vec<(usize, String)> = (1..=posts)
        .map(|n| (n, format!("Post {n}: {}", TOPICS[(n - 1) % TOPICS.len()])))
        .filter(|(_, title)| !titles.contains(title))
        .collect();
    for chunk in missing.chunks(SEED_BATCH) {
        post::Entity::insert_many(chunk.iter().map(|(_, title)| post::ActiveModel {
            title: Set(title.clone()),
            ..Default::default()
        }))
        .exec_without_returning(&txn)
        .await?;
    }
    // Post n is by the n-th user, round robin: one multi-row upsert for all.
    if !all_users.is_empty() {
        let authors = missing.iter().map(|(n, _)| {
            (
                all_users[(n - 1) % all_users.len()].id,
                user::counters::Key::Posts,
                1,
            )
        });
        user::Entity::counters().add_many(&txn, authors).await?;
    }
    let all_posts = post::Entity::find()
        .order_by_asc(post::Column::Id)
        .all(&txn)
        .await?;

    txn.commit().await?;
    Ok(Seeded {
        posts: all_posts,
        users: all_users,
        new_posts: missing.len(),
        new_users,
    })
}
