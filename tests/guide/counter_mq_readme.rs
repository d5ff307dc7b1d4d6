// counter-mq/README.md: the blog's posts counted from a queue.
include!("blog.rs");
pub use counter_mq::async_nats::jetstream::Context;

pub struct World {
    pub db: DatabaseConnection,
    pub js: Context,
}
