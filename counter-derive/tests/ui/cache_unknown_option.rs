use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_derive::CounterCache)]
#[sea_orm(table_name = "comments")]
#[counter_cache(parent = super::post::Entity, key = tips, via = post_id, summ = amount, wen = published)]
// An unknown option is unknown each time it is written, not a duplicate.
#[counter_cache(parent = super::post::Entity, key = comments, via = post_id, colour = "red", colour = "blue")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub post_id: i64,
    pub published: bool,
    pub amount: i32,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

fn main() {}
