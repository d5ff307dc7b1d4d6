// docs/guide/adoption.md, a test helper of the app: its migrations, models
// and fixtures.
include!("adoption_comments.rs");
pub use migration::counters::note_counters;
pub use sea_orm_migration::{MigrationTrait, SchemaManager};

pub mod comments {
    pub use super::_entities::comments::{ActiveModel, Entity, Model};
    counter_core::counter_cache! {
        #[counter_cache(parent = super::notes::Entity, key = comments, via = note_id)]
        Entity
    }
    counter_core::counter_cache_behavior!(ActiveModel, Entity);
}

/// The app's migrations, one module each.
pub mod m20220101_000001_create_notes {
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

pub mod m20220101_000002_create_comments {
    pub use super::m20220101_000001_create_notes::Migration;
}

/// The app's fixtures, loaded with `insert_many`.
pub async fn seed(_db: &DatabaseConnection) -> Result<(), DbErr> {
    Ok(())
}

pub struct World {}
