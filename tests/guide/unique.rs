// docs/guide/unique.md: articles with a view count and unique readers.
#[allow(unused_imports)]
use chrono::{DateTime, Duration, Utc};
#[allow(unused_imports)]
use counter_core::{
    CounterBuffer, CounterTable, Counters, DeltaBatch, Window,
    prelude::*,
    unique::{Members, Sketch},
};
#[allow(unused_imports)]
use sea_orm::{DatabaseConnection, DatabaseTransaction};

pub mod article {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "articles")]
    #[counter(keys(views, readers(unique), visitors(unique, window = day)))]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

#[allow(unused_imports)]
use article::counters::{Key, UniqueKey};

pub struct World {
    pub db: DatabaseConnection,
    pub id: i64,
    pub ids: Vec<i64>,
    pub user_id: i64,
    pub buffer: CounterBuffer,
    pub cache: counter_redis::CountCache,
    pub now: DateTime<Utc>,
}
