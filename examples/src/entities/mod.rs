//! The blog's entities, backed by the `migration` crate's schema.

pub mod post;
