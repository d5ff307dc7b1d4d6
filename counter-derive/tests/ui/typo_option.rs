// One typo'd option in a fresh crate is exactly one error, at the typo: the
// derive still generates `counters()`, `counters::Key` and `counters::Counts`
// (for the keys that parsed), so the code using them compiles.
mod post {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "posts")]
    #[counter(keys(likes), slotz = 4)]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub title: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

async fn count_a_like(
    db: &sea_orm::DatabaseConnection,
) -> counter_core::Result<post::counters::Counts> {
    use counter_core::prelude::*;

    post::Entity::counters()
        .increment(db, 1, post::counters::Key::Likes)
        .await?;
    let counts: post::counters::Counts = post::Entity::counters().counts(db, 1).await?;
    assert_eq!(counts.likes, 1);
    Ok(counts)
}

fn main() {
    let _ = count_a_like;
}
