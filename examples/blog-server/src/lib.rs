//! `blog-server`: the example blog's counters behind real HTTP endpoints.
//!
//! The README's quick start shows the API; this crate shows what a service built on it
//! looks like, with the parts a service needs and a snippet leaves out:
//! request validation, a status code for every failure, and a page of posts
//! whose counts come from one batch read instead of one query per post.
//!
//! | request | response |
//! |---|---|
//! | `GET /posts?page=N` | `200 {"page": N, "posts": [{"id", "title", "counts"}, ..]}`: [`PAGE_SIZE`] posts by id, page 1-based (default 1); a page past the end is empty |
//! | `GET /posts/{id}` | `200 {"id", "title", "counts"}` |
//! | `POST /posts/{id}/likes` | `200 {"id", "counts"}`: likes + 1, then the post's counts |
//! | `DELETE /posts/{id}/likes` | `200 {"id", "counts"}`: likes - 1, then the post's counts |
//! | `POST /posts/{id}/views` | `200 {"id", "counts"}`: views + 1, then the post's counts |
//! | `POST /posts/{id}/comments` | body `{"author_id": 7, "body": "..."}` (1 to [`MAX_COMMENT_CHARS`] characters); `201 {"comment": {"id", "post_id", "author_id", "body"}, "counts"}`: the comment row and its count, then the post's counts |
//! | `DELETE /comments/{id}` | `204`, no body, if this request removed the comment (comments - 1); `404` if it does not exist or was already removed |
//!
//! `counts` is the post's [`Counts`](entity::post::counters::Counts):
//! `{"likes": 3, "comments": 0, "views": 17}`. `comments` is the counter
//! cache of the `comments` table ([`entity::comment`]): it changes only with
//! a comment row, in the same transaction, so it always equals the post's
//! rows, and reading it is the same batch read as the other counts.
//!
//! Every failure is a JSON body `{"error": {"status": 404, "message": "post 42
//! does not exist"}}` (see [`ApiError`]): an unknown post, comment or route is
//! 404, a malformed id, page or comment 400, a wrong method 405, database
//! trouble 503. No handler unwraps, so no request can take a connection task
//! down.
//!
//! Three simplifications, all deliberate for an example:
//!
//! * The writes check that the post exists, then count: two statements, not
//!   one transaction. A post deleted between the two keeps the counted row
//!   in `post_counters`; nothing reads counters of a post that does not
//!   exist, so the row is harmless (declare the counter table with
//!   `cascade` to have the database remove such rows).
//! * A like is not tied to a user, so `DELETE .../likes` decrements whatever
//!   the total is, below zero included. A real blog records who liked what
//!   (a `post_likes` table with a unique `(user_id, post_id)`) and counts
//!   only when that row is inserted or deleted.
//! * Comments are not tied to a logged-in user: `author_id` is taken as
//!   given, and anyone may delete any comment. As in the first point, the
//!   post is checked, then the comment inserted (with its count, in one
//!   transaction): a post deleted in between keeps a comment, which nothing
//!   reads. `comments.post_id` has no foreign key, which would make every
//!   comment insert share-lock its post's row.

mod error;
mod routes;

use axum::{
    Router,
    routing::{delete, get, post},
};
use sea_orm::DatabaseConnection;

pub use error::ApiError;

/// Posts per page of `GET /posts`: fixed, so a page number always names the
/// same slice of the posts and a client cannot ask for a million rows.
pub const PAGE_SIZE: u64 = 20;

/// The largest page `GET /posts` accepts: its offset, `(page - 1) *
/// PAGE_SIZE`, must fit in the `i64` every backend's `OFFSET` takes. Larger
/// pages are 400, not a database error.
pub const MAX_PAGE: u64 = i64::MAX as u64 / PAGE_SIZE;

/// The longest comment body `POST /posts/{id}/comments` accepts, in
/// characters (not bytes); an empty body is refused too. Both are 400.
pub const MAX_COMMENT_CHARS: usize = 2_000;

/// The whole service, ready for `axum::serve`.
///
/// `db` is a pool (cloning it is cheap); the schema must be migrated
/// (`migration::Migrator::up`) first. Taking the connection rather than a
/// URL lets the binary and the tests, which run the same router over real
/// HTTP against SQLite, PostgreSQL and MySQL, each bring their own.
pub fn router(db: DatabaseConnection) -> Router {
    Router::new()
        .route("/posts", get(routes::list_posts))
        .route("/posts/{id}", get(routes::get_post))
        .route(
            "/posts/{id}/likes",
            post(routes::like).delete(routes::unlike),
        )
        .route("/posts/{id}/views", post(routes::view))
        .route("/posts/{id}/comments", post(routes::add_comment))
        .route("/comments/{id}", delete(routes::delete_comment))
        .fallback(routes::no_route)
        .method_not_allowed_fallback(routes::wrong_method)
        .with_state(db)
}
