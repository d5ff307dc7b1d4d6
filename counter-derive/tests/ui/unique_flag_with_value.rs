use counter_core::SlottedCounter;
use sea_orm::entity::prelude::*;

// `unique` is a flag: it takes no value.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
#[sea_orm(table_name = "posts")]
#[counter(keys(likes, viewers(unique = true)))]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

fn main() {}
