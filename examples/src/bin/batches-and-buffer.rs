//! Batches and the buffer: a unit of work's deltas across two entities in one
//! sorted statement, and write-behind views flushed exactly once.
//! `cargo run -p examples --bin batches-and-buffer`.

use counter_core::{CounterBuffer, DeltaBatch, FlushLedger, SlottedCounter};
use sea_orm::{Database, TransactionTrait};

mod post {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_core::SlottedCounter)]
    #[sea_orm(table_name = "posts")]
    #[counter(keys(likes, comments, views))]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

mod user {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_core::SlottedCounter)]
    #[sea_orm(table_name = "users")]
    #[counter(keys(followers, posts_liked))]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

use post::counters::Key as PostKey;
use user::counters::Key as UserKey;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = Database::connect("sqlite::memory:").await?;
    let (posts, users) = (post::Entity::counters(), user::Entity::counters());
    posts.create_table(&db).await?;
    users.create_table(&db).await?;
    FlushLedger::default().create_table(&db).await?; // the buffer's exactly-once ledger

    // A request's counter changes, collected, then sent together in the
    // caller's transaction: one sorted upsert per table, all or nothing.
    let txn = db.begin().await?;
    let mut batch = DeltaBatch::new();
    batch
        .increment(posts, 1, PostKey::Likes)?
        .increment(users, 9, UserKey::PostsLiked)?
        .increment(posts, 1, PostKey::Comments)?
        .add(users, 4, UserKey::Followers, 2)?;
    let sent = batch.apply(&txn).await?;
    txn.commit().await?;
    assert_eq!((sent.rows, sent.statements), (4, 2));

    // Views at a high rate: in memory now, in the database at the next flush.
    let buffer = CounterBuffer::start(&db).await?;
    for _ in 0..10_000 {
        buffer.add(posts, 1, PostKey::Views, 1)?; // sync, no database
    }
    assert_eq!(buffer.get(posts, 1, PostKey::Views).await?, 10_000); // read-your-writes
    let stats = buffer.shutdown().await?; // flushes everything, then stops
    assert_eq!(posts.get(&db, 1, PostKey::Views).await?, 10_000);
    println!(
        "batch: {sent:?}; buffer: {} adds in {} flushes",
        stats.adds, stats.flushes
    );
    Ok(())
}
