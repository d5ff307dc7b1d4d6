// The documented example compiles against counter-core, hooks included, and
// its generated rules, columns and row deltas are the declared ones.
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

    #[derive(
        Clone,
        Debug,
        PartialEq,
        Eq,
        DeriveEntityModel,
        counter_core::SlottedCounter,
        counter_derive::CounterCache,
    )]
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

/// `deltas` as `Debug` shows it, to compare with a batch built by hand:
/// `DeltaBatch` has no other way to look inside.
fn shown(deltas: &counter_core::DeltaBatch) -> String {
    format!("{deltas:?}")
}

fn main() {
    use counter_core::{CacheRule, CounterCache, DeltaBatch, SlottedCounter};

    /// A rule as `(parent table, key, via, sum, when)`, columns as `Debug`
    /// shows them: `Column` has no `PartialEq`.
    fn rule<E: sea_orm::EntityTrait>(
        r: CacheRule<E>,
    ) -> (&'static str, &'static str, String, String, String) {
        (
            r.parent_table,
            r.key,
            format!("{:?}", r.via),
            format!("{:?}", r.sum),
            format!("{:?}", r.when),
        )
    }
    let s = String::from;

    let rules: Vec<_> = comment::Entity::cache_rules()
        .into_iter()
        .map(rule)
        .collect();
    assert_eq!(
        rules,
        [
            (
                "posts_counters",
                "comments",
                s("PostId"),
                s("None"),
                s("None")
            ),
            (
                "posts_counters",
                "published_comments",
                s("PostId"),
                s("None"),
                s("Some((Published, true))"),
            ),
            (
                "users_counters",
                "hidden_comments",
                s("AuthorId"),
                s("None"),
                s("Some((Published, false))"),
            ),
            (
                "posts_counters",
                "tips",
                s("PostId"),
                s("Some(Amount)"),
                s("None")
            ),
        ]
    );
    assert_eq!(
        format!("{:?}", comment::Entity::counted_columns()),
        "[PostId, Published, AuthorId, Amount]"
    );

    // Unpublished, without an author: +1 comments and +5 tips on post 7;
    // not published_comments (`when = published`), and not hidden_comments
    // either, though `when = !published` holds: it has no author to count on.
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
    let mut expected = DeltaBatch::new();
    expected
        .add(
            post::Entity::counters(),
            7,
            post::counters::Key::Comments,
            1,
        )
        .unwrap();
    expected
        .add(post::Entity::counters(), 7, post::counters::Key::Tips, 5)
        .unwrap();
    assert_eq!(shown(&deltas), shown(&expected));
    let debug = shown(&deltas);
    assert!(debug.contains(r#""comments")"#), "{debug}");
    assert!(debug.contains(r#""tips")"#), "{debug}");
    assert!(!debug.contains("published_comments"), "{debug}");
    assert!(!debug.contains("hidden_comments"), "{debug}");

    // Published, with an author and a negative sign (the row counted out):
    // -1 on every post counter, -5 tips, nothing hidden on the author.
    let row = comment::Model {
        author_id: Some(3),
        published: true,
        ..row
    };
    let mut deltas = DeltaBatch::new();
    comment::Entity::count_row(&row, -1, &mut deltas).unwrap();
    let mut expected = DeltaBatch::new();
    for (key, delta) in [
        (post::counters::Key::Comments, -1),
        (post::counters::Key::PublishedComments, -1),
        (post::counters::Key::Tips, -5),
    ] {
        expected
            .add(post::Entity::counters(), 7, key, delta)
            .unwrap();
    }
    assert_eq!(shown(&deltas), shown(&expected));
    // Counted in and out again, the row nets to nothing.
    comment::Entity::count_row(&row, 1, &mut deltas).unwrap();
    assert!(deltas.is_empty(), "{deltas:?}");

    // The tree: `Option<i32>` via, `Option<bool>` when.
    let rules: Vec<_> = category::Entity::cache_rules()
        .into_iter()
        .map(rule)
        .collect();
    assert_eq!(
        rules,
        [
            (
                "categories_counters",
                "children",
                s("Parent"),
                s("None"),
                s("None")
            ),
            (
                "categories_counters",
                "type",
                s("Parent"),
                s("None"),
                s("Some((Type, true))"),
            ),
        ]
    );
    assert_eq!(
        format!("{:?}", category::Entity::counted_columns()),
        "[Parent, Type]"
    );
    let child = category::Model {
        id: 2,
        parent: Some(1),
        r#type: Some(true),
    };
    let mut deltas = DeltaBatch::new();
    category::Entity::count_row(&child, 1, &mut deltas).unwrap();
    let mut expected = DeltaBatch::new();
    expected
        .add(
            category::Entity::counters(),
            1,
            category::counters::Key::Children,
            1,
        )
        .unwrap();
    expected
        .add(
            category::Entity::counters(),
            1,
            category::counters::Key::Type,
            1,
        )
        .unwrap();
    assert_eq!(shown(&deltas), shown(&expected));
    // `NULL` never counts for `when`, but the row is still a child.
    let untyped = category::Model {
        r#type: None,
        ..child.clone()
    };
    let mut deltas = DeltaBatch::new();
    category::Entity::count_row(&untyped, 1, &mut deltas).unwrap();
    let mut expected = DeltaBatch::new();
    expected
        .add(
            category::Entity::counters(),
            1,
            category::counters::Key::Children,
            1,
        )
        .unwrap();
    assert_eq!(shown(&deltas), shown(&expected));
    // A root has no parent: it counts nowhere.
    let root = category::Model {
        id: 1,
        parent: None,
        r#type: Some(true),
    };
    let mut deltas = DeltaBatch::new();
    category::Entity::count_row(&root, 1, &mut deltas).unwrap();
    assert_eq!(shown(&deltas), shown(&DeltaBatch::new()));
}
