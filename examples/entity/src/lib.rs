//! The example blog's entities, as an application lays them out: an
//! `entity` crate that the `migration` crate and the application both use.

pub mod comment;
pub mod post;
pub mod user;
