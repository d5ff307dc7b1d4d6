//! Comments, counted in their note's `comments` counter: a counter cache
//! declared beside the generated entity, and the model's own behaviour
//! (Loco's `updated_at`) calling the counter cache's hooks.

use sea_orm::entity::prelude::*;

pub use super::_entities::comments::{ActiveModel, Entity, Model};

counter_core::counter_cache! {
    #[counter_cache(parent = super::notes::Entity, key = comments, via = note_id)]
    Entity
}

// The behaviour `cargo loco db entities` writes for a table with
// `updated_at` (its `before_save`), with the counter cache's hooks added:
// what `counter_core::counter_cache_behavior!(ActiveModel, Entity)` would
// implement, called after the model's own changes so the counts see the
// row as it is written. The hooks count every `insert`, `update`, `save`
// and `delete` of an `ActiveModel` in a transaction (`insert_counted`,
// `update_counted`, `delete_counted` open one); an update that sets no
// counted column (`note_id`) runs on the pool too.
#[async_trait::async_trait]
impl ActiveModelBehavior for ActiveModel {
    async fn before_save<C>(self, db: &C, insert: bool) -> std::result::Result<Self, DbErr>
    where
        C: ConnectionTrait,
    {
        // Loco's, as generated.
        let this = if !insert && self.updated_at.is_unchanged() {
            let mut this = self;
            this.updated_at = sea_orm::ActiveValue::Set(chrono::Utc::now().into());
            this
        } else {
            self
        };
        // The counter cache's: moves the count of an update that changes
        // `note_id` (inserts are counted in `after_save`).
        counter_core::hooks::before_save::<Entity, C>(this, db, insert).await
    }

    async fn after_save<C>(model: Model, db: &C, insert: bool) -> std::result::Result<Model, DbErr>
    where
        C: ConnectionTrait,
    {
        counter_core::hooks::after_save::<Entity, C>(model, db, insert).await
    }

    async fn before_delete<C>(self, db: &C) -> std::result::Result<Self, DbErr>
    where
        C: ConnectionTrait,
    {
        counter_core::hooks::before_delete::<Entity, C>(self, db).await
    }
}
