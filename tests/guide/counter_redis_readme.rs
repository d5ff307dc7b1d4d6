// counter-redis/README.md: the blog's posts behind a Redis cache.
include!("blog.rs");
pub use counter_redis::{CountCache, RedisTarget};

pub struct World {
    pub db: DatabaseConnection,
    pub id: i64,
    pub models: Vec<post::Model>,
}
