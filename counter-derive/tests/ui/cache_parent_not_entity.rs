use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_derive::CounterCache)]
#[sea_orm(table_name = "comments")]
#[counter_cache(parent = super::post::Model, key = comments, via = post_id)]
#[counter_cache(parent = super::post, key = likes, via = post_id)]
#[counter_cache(parent = "super::post::Entity", key = views, via = post_id)]
#[counter_cache(parent = super::post::Entity::<i64>, key = shares, via = post_id)]
#[counter_cache(parent = Post, key = reads, via = post_id)]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub post_id: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

fn main() {}
