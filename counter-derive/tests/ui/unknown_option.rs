use counter_core::SlottedCounter;
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
#[sea_orm(table_name = "posts")]
// An unknown option is unknown each time it is written, not a duplicate.
#[counter(keys(likes(slot = 4)), slot = 8, colour = "red", colour = "blue")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

fn main() {}
