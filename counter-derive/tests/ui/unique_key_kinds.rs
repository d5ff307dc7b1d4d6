use counter_core::SlottedCounter;
use sea_orm::entity::prelude::*;

// `viewers` counts distinct members: it is a `UniqueKey`, not a `Key`, so
// adding to it or observing a plain key does not compile.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
#[sea_orm(table_name = "posts")]
#[counter(keys(likes, viewers(unique, window = day)))]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

async fn misuse(db: &DatabaseConnection) {
    let posts = Entity::counters();
    let _ = posts.add(db, 1, counters::UniqueKey::Viewers, 1).await;
    let _ = posts.observe(db, 1, counters::Key::Likes, "ann").await;
    let _ = posts.unique(db, 1, "viewers").await;
}

fn main() {}
