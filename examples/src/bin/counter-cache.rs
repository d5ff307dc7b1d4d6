//! A counter cache: a post's `comments` counter kept exact by the comments
//! table itself, a double delete counted once, and a recount that finds no
//! drift. `cargo run -p examples --bin counter-cache`.

use counter_core::{CounterCache, Reconcile, SlottedCounter, Truth};
use sea_orm::{ConnectionTrait, Database, IntoActiveModel, Schema, Set};

mod post {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_core::SlottedCounter)]
    #[sea_orm(table_name = "posts")]
    #[counter(keys(comments))]
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

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, counter_core::CounterCache)]
    #[sea_orm(table_name = "comments")]
    #[counter_cache(parent = super::post::Entity, key = comments, via = post_id)]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub post_id: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    // The hooks: every SeaORM write of a comment in a transaction moves the counter.
    counter_core::counter_cache_behavior!();
}

use post::counters::Key;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = Database::connect("sqlite::memory:").await?;
    let schema = Schema::new(db.get_database_backend());
    db.execute(&schema.create_table_from_entity(comment::Entity))
        .await?;
    let posts = post::Entity::counters();
    posts.create_table(&db).await?;

    // `*_counted` runs the row and its counter in one transaction of its own.
    let mut saved = Vec::new();
    for _ in 0..3 {
        let am = comment::ActiveModel {
            post_id: Set(7),
            ..Default::default()
        };
        saved.push(comment::Entity::insert_counted(&db, am).await?);
    }
    assert_eq!(posts.get(&db, 7, Key::Comments).await?, 3);

    // Two deletes of one row: only the one that removed it decrements.
    let first = saved[0].clone().into_active_model();
    comment::Entity::delete_counted(&db, first.clone()).await?;
    comment::Entity::delete_counted(&db, first).await?;
    assert_eq!(posts.get(&db, 7, Key::Comments).await?, 2);

    // A recount from the declaration finds the counter exact.
    let truth = Truth::counter_cache::<comment::Entity>();
    let report = posts
        .reconcile(&db, Key::Comments, truth, &Reconcile::new())
        .await?;
    assert_eq!(report.owners_drifted, 0);
    let comments = posts.get(&db, 7, Key::Comments).await?;
    println!(
        "post 7: {comments} comments; recount checked {} owners, 0 drifted",
        report.owners_checked
    );
    Ok(())
}
