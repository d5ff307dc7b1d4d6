//! Comments, counted in their note's `comments` counter: a counter cache
//! declared beside the generated entity.

pub use super::_entities::comments::{ActiveModel, Entity, Model};

counter_core::counter_cache! {
    #[counter_cache(parent = super::notes::Entity, key = comments, via = note_id)]
    Entity
}

// The hooks that count every `insert`, `update`, `save` and `delete` of an
// `ActiveModel` in a transaction. An app with hooks of its own (Loco's
// `updated_at`) calls `counter_core::hooks` from its `before_save` instead.
counter_core::counter_cache_behavior!(ActiveModel, Entity);
