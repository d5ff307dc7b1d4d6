// docs/guide/cache.md: the blog's posts behind a Redis cache.
include!("blog.rs");
pub use counter_redis::{CachedCounters, CountCache, RedisTarget};

pub struct World {
    pub db: DatabaseConnection,
    pub id: i64,
    pub models: Vec<post::Model>,
    pub cache: CountCache,
    pub posts: CachedCounters<i64, post::Entity>,
    pub comment: comment::ActiveModel,
}
