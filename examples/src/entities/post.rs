//! Posts, with likes and views counted in `post_counters`.

use std::sync::LazyLock;

use counter_core::{CounterKey, CounterTable, Counters, SlottedCounter};
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "posts")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub title: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// The counters of a post.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Likes,
    Views,
}

impl CounterKey for Key {
    fn as_key_str(&self) -> &str {
        match self {
            Key::Likes => "likes",
            Key::Views => "views",
        }
    }
}

impl SlottedCounter for Entity {
    type OwnerId = i64;
    type Key = Key;

    fn counters() -> &'static Counters<i64> {
        static COUNTERS: LazyLock<Counters<i64>> = LazyLock::new(|| {
            // Views are the hottest counter: spread them wider.
            let table = CounterTable::new(migration::POST_COUNTERS)
                .and_then(|t| t.with_key_slots("views", 64));
            Counters::new(table.expect("a valid counter table"))
        });
        &COUNTERS
    }
}
