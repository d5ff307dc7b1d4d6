use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_derive::CounterCache)]
#[sea_orm(table_name = "comments")]
#[counter_cache(parent = super::post::Entity, key = comments, via = post_idd)]
#[counter_cache(parent = super::post::Entity, key = hidden_comments, via = post_id, when = !publishd)]
#[counter_cache(parent = super::post::Entity, key = tips, via = post_id, sum = tip)]
#[counter_cache(parent = super::post::Entity, key = score, via = post_id, sum = score)]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub post_id: i64,
    pub published: bool,
    pub amount: i32,
    // Not a column: sea-orm fills it with its default.
    #[sea_orm(ignore)]
    pub score: i32,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

fn main() {}
