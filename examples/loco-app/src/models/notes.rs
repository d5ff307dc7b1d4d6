//! Notes and their counters. The counters are declared in the migration
//! crate (`migration::counters`); this binds them to the generated entity,
//! so that `notes::Entity::counters()` and `notes::counters::Key` read as
//! with `#[derive(SlottedCounter)]`.

use sea_orm::entity::prelude::*;

pub use super::_entities::notes::{ActiveModel, Entity, Model};

counter_core::slotted_counter!(Entity, migration::counters::note_counters);

// The behaviour `cargo loco db entities` writes for a table with
// `updated_at`, as generated.
#[async_trait::async_trait]
impl ActiveModelBehavior for ActiveModel {
    async fn before_save<C>(self, _db: &C, insert: bool) -> std::result::Result<Self, DbErr>
    where
        C: ConnectionTrait,
    {
        if !insert && self.updated_at.is_unchanged() {
            let mut this = self;
            this.updated_at = sea_orm::ActiveValue::Set(chrono::Utc::now().into());
            Ok(this)
        } else {
            Ok(self)
        }
    }
}
