// docs/guide/mq.md: the blog's posts and users, counted from a queue.
include!("blog.rs");
pub use counter_mq::{
    Change, CounterMessage, MqError, Publish, async_nats,
    async_nats::jetstream::Context,
    nats::{JetStreamPublisher, StreamSettings},
};
pub use sea_orm_migration::{MigrationTrait, MigratorTrait};

/// An application's migrator.
pub struct Migrator;

/// An application's first migration.
pub mod m20220101_000001_create_post {
    use sea_orm_migration::prelude::*;

    #[derive(DeriveMigrationName)]
    pub struct Migration;

    #[async_trait::async_trait]
    impl MigrationTrait for Migration {
        async fn up(&self, _manager: &SchemaManager) -> Result<(), DbErr> {
            Ok(())
        }
    }
}

/// An outbox table: a message per row, relayed to the broker.
pub mod outbox {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "outbox")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        pub body: Vec<u8>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub struct World {
    pub db: DatabaseConnection,
    pub js: Context,
    pub publisher: JetStreamPublisher,
    pub post_id: i64,
    pub request_id: String,
    pub comment: comment::ActiveModel,
}
