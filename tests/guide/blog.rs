// The example blog's entities (examples/entity): posts with likes,
// comments and daily views, users, comments counted on their post.
include!("common.rs");
pub use entity::{comment, post, user};
pub use post::counters::Key;
