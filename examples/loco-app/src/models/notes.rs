//! Notes and their counters. The counters are declared in the migration
//! crate (`migration::counters`); this binds them to the generated entity,
//! so that `notes::Entity::counters()` and `notes::counters::Key` read as
//! with `#[derive(SlottedCounter)]`.

pub use super::_entities::notes::{ActiveModel, Entity, Model};

counter_core::slotted_counter!(Entity, migration::counters::note_counters);

impl sea_orm::ActiveModelBehavior for ActiveModel {}
