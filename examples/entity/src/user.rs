//! Users: followed, following, posting.

use counter_core::SlottedCounter;
use sea_orm::entity::prelude::*;

/// A user of the blog. Its counters live in `user_counters`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
#[sea_orm(table_name = "users")]
#[counter(keys(followers, following, posts), table = "user_counters")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub name: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
