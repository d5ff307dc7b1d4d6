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
//!
//! `counts` is the post's [`Counts`](entity::post::counters::Counts):
//! `{"likes": 3, "comments": 0, "views": 17}`.
//!
//! Every failure is a JSON body `{"error": {"status": 404, "message": "post 42
//! does not exist"}}` (see [`ApiError`]): an unknown post or route is 404, a
//! malformed id or page 400, a wrong method 405, database trouble 503. No
//! handler unwraps, so no request can take a connection task down.
//!
//! Two simplifications, both deliberate for an example:
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

mod error;
mod routes;

use axum::{
    Router,
    routing::{get, post},
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
        .fallback(routes::no_route)
        .method_not_allowed_fallback(routes::wrong_method)
        .with_state(db)
}
