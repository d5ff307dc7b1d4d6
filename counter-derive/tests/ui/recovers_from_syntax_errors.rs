use counter_core::SlottedCounter;
use sea_orm::entity::prelude::*;

// One malformed option does not hide the others, nor invent a missing `keys`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
#[sea_orm(table_name = "posts")]
#[counter(keys(views(slots), likes(slots = 2, slots = 3)), table, slots = 0)]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

fn main() {}
