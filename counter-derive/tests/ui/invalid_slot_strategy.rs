/// A misspelt strategy.
mod misspelt {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "posts")]
    #[counter(keys(likes), slot_strategy = "rotatin")]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// A strategy is a string literal, as `table` is, and is set once.
mod unquoted_and_repeated {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "pages")]
    #[counter(keys(views), slot_strategy = random, slot_strategy = "random")]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

fn main() {}
