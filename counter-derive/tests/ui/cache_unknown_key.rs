// A key the parent does not declare: rustc's error points at the key.
mod post {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_core::SlottedCounter)]
    #[sea_orm(table_name = "posts")]
    #[counter(keys(comments, published_comments))]
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
    #[counter_cache(parent = super::post::Entity, key = coments, via = post_id)]
    #[counter_cache(parent = super::post::Entity, key = published_comments, via = post_id, when = published)]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub post_id: i64,
        pub published: bool,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

fn main() {}
