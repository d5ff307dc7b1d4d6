// docs/guide/writes.md: the blog's posts and users, in a handler.
include!("blog.rs");

pub struct World {
    pub db: DatabaseConnection,
    pub txn: DatabaseTransaction,
    pub id: i64,
    pub other: i64,
    pub author: i64,
    pub posts: &'static counter_core::EntityCounters<post::Entity>,
    pub comment_am: comment::ActiveModel,
}

/// The handler's own work, in its transaction.
pub async fn notify_subscribers(_txn: &DatabaseTransaction, _comment: &comment::Model) -> Result<(), DbErr> {
    Ok(())
}
