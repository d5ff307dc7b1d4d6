// docs/guide/production.md: a pool, as an application holds it.
include!("common.rs");

pub use sea_orm::{DbBackend, Statement};

pub struct World {
    pub db: DatabaseConnection,
}
