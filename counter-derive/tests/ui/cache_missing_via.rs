use sea_orm::entity::prelude::*;

// Each missing option is reported at its attribute; an option that is
// written but malformed (`parent` below) is not also reported missing.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_derive::CounterCache)]
#[sea_orm(table_name = "comments")]
#[counter_cache(parent = super::post::Entity, key = comments)]
#[counter_cache(parent, via = post_id)]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub post_id: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

fn main() {}
