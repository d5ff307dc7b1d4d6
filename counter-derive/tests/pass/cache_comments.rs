// The documented example compiles against counter-core, hooks included, and
// its generated rules and columns are the declared ones.
mod post {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_core::SlottedCounter)]
    #[sea_orm(table_name = "posts")]
    #[counter(keys(comments, published_comments, tips))]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

mod user {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_core::SlottedCounter)]
    #[sea_orm(table_name = "users")]
    #[counter(keys(hidden_comments))]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

mod comment {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_derive::CounterCache)]
    #[sea_orm(table_name = "comments")]
    #[counter_cache(parent = super::post::Entity, key = comments, via = post_id)]
    #[counter_cache(parent = super::post::Entity, key = published_comments, via = post_id, when = published)]
    #[counter_cache(parent = super::user::Entity, key = hidden_comments, via = author_id, when = !published)]
    #[counter_cache(parent = super::post::Entity, key = tips, via = post_id, sum = amount)]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub post_id: i64,
        pub author_id: Option<i64>,
        pub published: bool,
        pub amount: i32,
        pub body: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    counter_core::counter_cache_behavior!();
}

// A tree: categories counting their subcategories, with a raw field name.
mod category {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_core::SlottedCounter)]
    #[derive(counter_derive::CounterCache)]
    #[sea_orm(table_name = "categories")]
    #[counter(keys(children, r#type))]
    #[counter_cache(parent = Entity, key = children, via = r#parent)]
    #[counter_cache(parent = self::Entity, key = r#type, via = parent, when = r#type)]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i32,
        pub parent: Option<i32>,
        pub r#type: Option<bool>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    counter_core::counter_cache_behavior!();
}

fn main() {
    use counter_core::{CounterCache, DeltaBatch};

    let rules = comment::Entity::cache_rules();
    let keys: Vec<_> = rules.iter().map(|r| (r.parent_table, r.key)).collect();
    assert_eq!(
        keys,
        [
            ("posts_counters", "comments"),
            ("posts_counters", "published_comments"),
            ("users_counters", "hidden_comments"),
            ("posts_counters", "tips"),
        ]
    );
    // `Column` has no `PartialEq`: compare what `Debug` shows.
    assert_eq!(format!("{:?}", rules[2].when), "Some((Published, false))");
    assert_eq!(format!("{:?}", rules[3].sum), "Some(Amount)");
    assert_eq!(
        format!("{:?}", comment::Entity::counted_columns()),
        "[PostId, Published, AuthorId, Amount]"
    );

    let row = comment::Model {
        id: 1,
        post_id: 7,
        author_id: None,
        published: false,
        amount: 5,
        body: String::new(),
    };
    let mut deltas = DeltaBatch::new();
    comment::Entity::count_row(&row, 1, &mut deltas).unwrap();
    assert!(!deltas.is_empty());

    assert_eq!(
        format!("{:?}", category::Entity::counted_columns()),
        "[Parent, Type]"
    );
}
