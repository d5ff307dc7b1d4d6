// docs/guide/adoption.md, `src/models/comments.rs`: the generated entities,
// the declaration, and `src/models/notes.rs` bound to it.
include!("adoption_entities.rs");

pub mod notes {
    pub use super::_entities::notes::{ActiveModel, Entity, Model};
    counter_core::slotted_counter!(Entity, super::migration::counters::note_counters);

    impl sea_orm::ActiveModelBehavior for ActiveModel {}
}
