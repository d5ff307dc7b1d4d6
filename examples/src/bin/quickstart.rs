//! Quickstart: many concurrent readers liking and viewing a few hot posts,
//! then one batch read of every post's counts.
//!
//! `cargo run -p examples --bin quickstart` uses an SQLite file,
//! `quickstart.db`; set `DATABASE_URL` for PostgreSQL or MySQL/MariaDB.

use std::time::Instant;

use counter_core::prelude::*;
use entity::post::{self, counters::Key};
use migration::{Migrator, MigratorTrait};
use rand::Rng;
use sea_orm::{ActiveModelTrait, Database, EntityTrait, PaginatorTrait, QueryOrder, Set};

const WRITERS: usize = 16;
const WRITES_PER_WRITER: usize = 250;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url =
        std::env::var("DATABASE_URL").unwrap_or_else(|_| "sqlite://quickstart.db?mode=rwc".into());
    let db = Database::connect(&url).await?;
    Migrator::up(&db, None).await?;

    if post::Entity::find().count(&db).await? == 0 {
        for i in 1..=10 {
            post::ActiveModel {
                title: Set(format!("Post number {i}")),
                ..Default::default()
            }
            .insert(&db)
            .await?;
        }
    }
    let posts = post::Entity::find()
        .order_by_asc(post::Column::Id)
        .all(&db)
        .await?;
    let ids: Vec<i64> = posts.iter().map(|p| p.id).collect();
    println!("{} posts in {url}", posts.len());

    let before = grand_total(&db, &ids).await?;

    // Every writer hammers the first three posts: the hot rows of a naive design.
    let started = Instant::now();
    let writers: Vec<_> = (0..WRITERS)
        .map(|_| {
            let (db, hot) = (db.clone(), ids[..3.min(ids.len())].to_vec());
            tokio::spawn(async move {
                for _ in 0..WRITES_PER_WRITER {
                    let (post, like) = {
                        let mut rng = rand::rng();
                        (hot[rng.random_range(0..hot.len())], rng.random_bool(0.2))
                    };
                    let key = if like { Key::Likes } else { Key::Views };
                    post::Entity::increment(&db, post, key).await?;
                }
                Ok::<_, counter_core::CounterError>(())
            })
        })
        .collect();
    for writer in writers {
        writer.await??;
    }
    let writes = WRITERS * WRITES_PER_WRITER;
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "{writes} increments from {WRITERS} concurrent writers in {elapsed:.2}s ({:.0}/s), one statement each",
        writes as f64 / elapsed
    );

    // The page of posts with every counter of each: one grouped query.
    let page = post::Entity::load_counts(&db, posts).await?;
    println!(
        "\n{:<4} {:<16} {:>8} {:>8} {:>8}",
        "id", "title", "likes", "comments", "views"
    );
    for (post, counts) in &page {
        println!(
            "{:<4} {:<16} {:>8} {:>8} {:>8}",
            post.id, post.title, counts.likes, counts.comments, counts.views
        );
    }
    let added = grand_total(&db, &ids).await? - before;
    println!(
        "\n(all {} posts' counts read with 1 query; {added} added this run, {writes} acknowledged)",
        page.len()
    );
    if added != writes as i64 {
        return Err(
            format!("lost or doubled increments: {added} counted, {writes} acknowledged").into(),
        );
    }
    Ok(())
}

async fn grand_total(
    db: &sea_orm::DatabaseConnection,
    ids: &[i64],
) -> Result<i64, counter_core::CounterError> {
    let counts = post::Entity::counts_many(db, ids).await?;
    Ok(counts
        .values()
        .map(|c| c.likes + c.comments + c.views)
        .sum())
}
