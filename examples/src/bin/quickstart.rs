//! The quick start: an entity with counters, a few writes, a page of posts
//! with all their counts in one query. `cargo run -p examples --bin quickstart`.

use counter_core::prelude::*;
use sea_orm::{ActiveModelTrait, ConnectionTrait, Database, EntityTrait, Schema, Set};

mod post {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "posts")]
    #[counter(keys(likes, comments, views(slots = 64)))]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub title: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

use post::counters::{Counts, Key};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = Database::connect("sqlite::memory:").await?;
    let schema = Schema::new(db.get_database_backend());
    db.execute(&schema.create_table_from_entity(post::Entity))
        .await?;
    let posts = post::Entity::counters(); // the typed handle: every counter operation
    posts.create_table(&db).await?; // in an app: `Box::new(posts.migration())` in the Migrator

    for title in ["Hello", "Slotted counters"] {
        let post = post::ActiveModel {
            title: Set(title.into()),
            ..Default::default()
        };
        post.insert(&db).await?;
    }
    posts.increment(&db, 1, Key::Likes).await?; // one upsert of one slot row
    posts.add(&db, 1, Key::Views, 100).await?;
    posts
        .add_many(&db, [(2, Key::Likes, 3), (2, Key::Comments, 1)])
        .await?;

    // A page of posts with all their counts: one query for the whole page.
    let page = post::Entity::find().all(&db).await?;
    let counted = posts.load_counts(&db, page).await?;
    for (post, counts) in &counted {
        println!("{} {:<17} {counts:?}", post.id, post.title);
    }
    assert_eq!(
        counted[0].1,
        Counts {
            likes: 1,
            comments: 0,
            views: 100
        }
    );
    assert_eq!(posts.get(&db, 2, Key::Likes).await?, 3);

    // Keys chosen at run time, in the same table.
    posts.untyped().increment(&db, 1, "reaction:heart").await?;
    assert_eq!(posts.untyped().get(&db, 1, "reaction:heart").await?, 1);
    Ok(())
}
