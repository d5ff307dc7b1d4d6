// docs/guide/counter-caches.md: the parents and the child of its entity
// block, written through the counter cache.
include!("counter_caches_parents.rs");
pub use post::counters::Key;

pub mod comment {
    use counter_core::CounterCache;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, CounterCache)]
    #[sea_orm(table_name = "comments")]
    #[counter_cache(parent = super::post::Entity, key = comments, via = post_id)]
    #[counter_cache(parent = super::post::Entity, key = published_comments, via = post_id, when = published)]
    #[counter_cache(parent = super::user::Entity, key = tips_received, via = author_id, sum = tip)]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub post_id: i64,
        pub author_id: Option<i64>,
        pub published: bool,
        pub tip: i32,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    counter_core::counter_cache_behavior!();
}

pub struct World {
    pub db: DatabaseConnection,
    pub am: comment::ActiveModel,
}
