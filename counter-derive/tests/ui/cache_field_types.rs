// Fields of types a cache cannot read: each error points at the field in
// the attribute. `via` must hold the parent's id type (here `i64`), `when`
// a `bool`, `sum` an integer.
mod post {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_core::SlottedCounter)]
    #[sea_orm(table_name = "posts")]
    #[counter(keys(comments, published_comments, tips))]
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
    #[counter_cache(parent = super::post::Entity, key = comments, via = post_slug)]
    #[counter_cache(parent = super::post::Entity, key = published_comments, via = post_id, when = status)]
    #[counter_cache(parent = super::post::Entity, key = tips, via = post_id, sum = body)]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub post_id: Option<i64>,
        pub post_slug: String,
        pub status: i32,
        pub body: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

fn main() {}
