use sea_orm::entity::prelude::*;

// The same counter twice, and the same option twice in one cache.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_derive::CounterCache)]
#[sea_orm(table_name = "comments")]
#[counter_cache(parent = super::post::Entity, key = comments, via = post_id)]
#[counter_cache(parent = super::user::Entity, key = comments, via = author_id)]
#[counter_cache(parent = super::post::Entity, key = comments, via = post_id, when = published)]
#[counter_cache(parent = super::post::Entity, key = tips, via = post_id, via = post_id)]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub post_id: i64,
    pub author_id: i64,
    pub published: bool,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

fn main() {}
