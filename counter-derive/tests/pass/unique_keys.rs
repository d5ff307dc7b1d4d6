// Unique keys beside plain ones: `Key` and `Counts` hold the plain keys,
// `UniqueKey` the unique ones, and each goes where it belongs.
mod post {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "posts")]
    #[counter(keys(likes, viewers(unique), visitors(unique, window = day, slots = 4)))]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

// A table whose keys are all unique: `Key` has no variant, `Counts` no field.
counter_core::counter_table! {
    #[counter(owner = "pages", owner_id = String, keys(visitors(unique)))]
    pub mod page_counters;
}

use counter_core::SlottedCounter;
use post::counters::{Key, UniqueKey};

#[allow(dead_code)]
async fn usage(db: &sea_orm::DatabaseConnection) -> counter_core::Result<()> {
    let posts = post::Entity::counters();
    posts.add(db, 1, Key::Likes, 1).await?;
    posts.observe(db, 1, UniqueKey::Viewers, "ann").await?;
    let _: u64 = posts.unique(db, 1, UniqueKey::Viewers).await?;
    let _ = posts
        .unique_many(db, &[1, 2], &[UniqueKey::Visitors])
        .await?;
    page_counters::counters()
        .observe(db, "home".to_owned(), "visitors", "ann")
        .await?;
    assert_eq!(page_counters::Key::ALL.len(), 0);
    assert_eq!(UniqueKey::ALL, [UniqueKey::Viewers, UniqueKey::Visitors]);
    Ok(())
}

fn main() {
    let table = post::Entity::counters().table();
    assert!(table.is_unique("viewers") && table.is_unique("visitors"));
    assert!(!table.is_unique("likes"));
    assert_eq!(
        table.sketch_table().as_deref(),
        Some("posts_counters_sketches")
    );
    assert_eq!(table.bucket_table(), None, "only a unique key is windowed");
}
