// counter-core/README.md: the blog's posts.
include!("blog.rs");

pub struct World {
    pub db: DatabaseConnection,
    pub models: Vec<post::Model>,
}
