// A mistake in an attribute is one error, at the mistake: beside it, each
// derive generates stand-ins for its items (`counters()`, `Key`, `Counts`,
// the `CounterCache` impl), so the code using them still compiles.
mod post {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_core::SlottedCounter)]
    #[sea_orm(table_name = "posts")]
    #[counter(keys(comments, likes), slotz = 4)]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

mod comment {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_derive::CounterCache)]
    #[sea_orm(table_name = "comments")]
    #[counter_cache(parent = super::post::Entity, key = comments, via = post_id, summ = weight)]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub post_id: i64,
        pub weight: i32,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    counter_core::counter_cache_behavior!();
}

async fn uses(db: &sea_orm::DatabaseConnection) -> Result<(), counter_core::CounterError> {
    use counter_core::{CounterCache, SlottedCounter};
    use post::counters::{Counts, Key};

    let posts = post::Entity::counters();
    posts.increment(db, 1, Key::Likes).await?;
    let counts: Counts = posts.counts(db, 1).await?;
    assert_eq!(counts.likes, 1);
    assert_eq!("comments".parse::<Key>()?, Key::Comments);
    assert_eq!(comment::Entity::cache_rules().len(), 1);
    Ok(())
}

fn main() {
    let _ = uses;
}
