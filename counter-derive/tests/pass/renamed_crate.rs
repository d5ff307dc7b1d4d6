// `crate = "..."`: every path the derives generate starts from the given
// root, here a re-export standing in for a renamed dependency. It is also
// resolved inside the generated `counters` module, and names the serde
// hook macro.
pub mod deps {
    pub use counter_core as counters;
}

mod post {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_core::SlottedCounter)]
    #[sea_orm(table_name = "posts")]
    #[counter(
        keys(comments, views(window = day)),
        slot_strategy = "random",
        cascade,
        crate = "crate::deps::counters"
    )]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: Uuid,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

mod comment {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_derive::CounterCache)]
    #[sea_orm(table_name = "comments")]
    #[counter_cache(crate = "crate::deps::counters")]
    #[counter_cache(parent = super::post::Entity, key = comments, via = post_id, sum = weight, when = published)]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub post_id: Option<Uuid>,
        pub weight: i32,
        pub published: bool,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    crate::deps::counters::counter_cache_behavior!();
}

fn main() {
    use counter_core::{CounterCache, SlotStrategy, SlottedCounter};
    use post::counters::Key;

    let table = post::Entity::counters().table();
    assert_eq!(table.name(), "posts_counters");
    assert_eq!(table.slot_strategy(), SlotStrategy::Random);
    assert!(table.cascade().is_some());
    assert_eq!(
        table.bucket_table().as_deref(),
        Some("posts_counters_buckets")
    );
    assert_eq!("views".parse::<Key>().unwrap(), Key::Views);

    let rules = comment::Entity::cache_rules();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        (rules[0].parent_table, rules[0].key),
        ("posts_counters", "comments")
    );
}
