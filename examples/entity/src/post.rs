//! Posts: liked, commented on and viewed.

use counter_core::SlottedCounter;
use sea_orm::entity::prelude::*;

/// A blog post. Its counters live in `post_counters`; `comments` is the
/// counter cache of [`super::comment`], written only with comment rows.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
#[sea_orm(table_name = "posts")]
// Views are the hottest counter: spread them over more slots, and count
// them per day too, for the daily views chart.
#[counter(
    keys(likes, comments, views(slots = 64, window = day)),
    table = "post_counters"
)]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub title: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
