//! Time buckets and rankings: views per UTC day with a zero-filled chart,
//! the most viewed posts with their models, and a lossless compaction.
//! `cargo run -p examples --bin buckets-and-rankings`.

use chrono::{Duration, TimeZone, Utc};
use counter_core::{Compact, SlottedCounter};
use sea_orm::{ActiveModelTrait, ConnectionTrait, Database, Schema, Set};

mod post {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_core::SlottedCounter)]
    #[sea_orm(table_name = "posts")]
    #[counter(keys(likes, views(window = day)))]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub title: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

use post::counters::Key;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = Database::connect("sqlite::memory:").await?;
    let schema = Schema::new(db.get_database_backend());
    db.execute(&schema.create_table_from_entity(post::Entity))
        .await?;
    let posts = post::Entity::counters();
    posts.create_table(&db).await?; // and the bucket table, since `views` has a window
    for (id, title) in [(1, "Rust"), (2, "SQL"), (3, "Counters")] {
        let post = post::ActiveModel {
            id: Set(id),
            title: Set(title.into()),
        };
        post.insert(&db).await?;
    }

    // Views of three days, written as of when they happened (a backfill).
    let nov_1 = Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).unwrap();
    for (id, day, views) in [(1, 0, 5), (1, 2, 7), (2, 1, 3), (3, 0, 1), (3, 1, 1)] {
        posts
            .add_at(
                &db,
                id,
                Key::Views,
                views,
                nov_1 + Duration::days(day) + Duration::hours(9),
            )
            .await?;
    }
    let to = nov_1 + Duration::days(3);
    let chart = posts.series(&db, 1, Key::Views, nov_1, to).await?;
    let daily: Vec<i64> = chart.iter().map(|(_, n)| *n).collect();
    assert_eq!(daily, [5, 0, 7]); // zero-filled
    let first_two_days = posts
        .range_many(
            &db,
            &[1, 2, 3],
            Key::Views,
            nov_1,
            nov_1 + Duration::days(2),
        )
        .await?;
    assert_eq!(
        (first_two_days[&1], first_two_days[&2], first_two_days[&3]),
        (5, 3, 2)
    );

    // The most viewed posts, with their models, exact, ties by id.
    let top = posts.top_models(&db, Key::Views, 2).await?;
    let titles: Vec<(&str, i64)> = top.iter().map(|(m, n)| (m.title.as_str(), *n)).collect();
    assert_eq!(titles, [("Rust", 12), ("SQL", 3)]);

    // Compaction folds slot rows while writes go on; no total changes.
    let before = posts.counts_many(&db, &[1, 2, 3]).await?;
    let report = posts.compact(&db, &Compact::new()).await?;
    assert_eq!(posts.counts_many(&db, &[1, 2, 3]).await?, before);
    println!("views per day of post 1: {daily:?}; top: {titles:?}; compaction: {report:?}");
    Ok(())
}
