use counter_core::SlottedCounter;
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
#[sea_orm(table_name = "posts")]
// An adaptive range is `adaptive(MIN..=MAX)`, 1 <= MIN <= MAX <= 1024:
// each mistake is reported where it is.
#[counter(
    keys(
        likes(slots = adaptive(0..=8)),
        views(slots = adaptive(9..=8)),
        plays(slots = adaptive(1..64)),
        shares(slots = adaptive(1, 64)),
        saves(slots = adaptive(1..=2048)),
    ),
    slots = adaptive(1..=256)
)]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

fn main() {}
