// docs/guide/adoption.md, `src/models/notes.rs` of a Loco app: the
// generated entities, the declaration, and the comments model beside it.
include!("adoption_entities.rs");

impl sea_orm::ActiveModelBehavior for _entities::comments::ActiveModel {}
