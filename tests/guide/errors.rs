// docs/guide/errors.md: the blog's comments, and an application's error.
include!("blog.rs");

/// An application's own error type.
#[derive(Debug)]
pub enum AppError {
    BadRequest(String),
    Unavailable,
    Internal(CounterError),
}

pub struct World {
    pub db: DatabaseConnection,
    pub comment_am: comment::ActiveModel,
}
