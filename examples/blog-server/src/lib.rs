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
//! | `GET /posts/{id}/views/daily?days=N` | `200 {"post_id", "days": [{"day": "2026-11-22", "views": 3}, ..]}`: the post's views per UTC day, the last N days (1 to [`MAX_DAILY_DAYS`], default [`DEFAULT_DAILY_DAYS`]) ending today, oldest first, days without views included as 0 |
//! | `GET /posts/most-liked?limit=N&after_likes=L&after_id=I` | `200 {"posts": [{"id", "title", "likes"}, ..], "next": {"after_likes", "after_id"} or null}`: posts by likes, most first, ties by id; N posts (1 to [`MAX_MOST_LIKED`], default [`DEFAULT_MOST_LIKED`]); the next page is asked for with `next` as `after_likes` and `after_id` (both or neither), and `next` is null on the last page. Posts whose likes were never written (liked or unliked) are not listed |
//! | `POST /posts/{id}/likes` | `200 {"id", "counts"}`: likes + 1, then the post's counts |
//! | `DELETE /posts/{id}/likes` | `200 {"id", "counts"}`: likes - 1, then the post's counts |
//! | `POST /posts/{id}/views` | `200 {"id", "counts"}`: views + 1, then the post's counts |
//! | `POST /posts/{id}/comments` | body `{"author_id": 7, "body": "..."}` (1 to [`MAX_COMMENT_CHARS`] characters, no control characters but `\n`, `\r`, `\t`); `201 {"comment": {"id", "post_id", "author_id", "body"}, "counts"}` with `Location: /comments/{id}`: the comment row and its count, then the post's counts |
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
//! 404, a malformed id, page, `days`, `limit`, cursor or comment 400, a
//! comment body not sent as `application/json` 415, one over axum's size
//! limit 413, a wrong method 405, database trouble 503. No handler unwraps,
//! so no request can take a connection task down.
//!
//! Three simplifications, all deliberate for an example:
//!
//! * A write to a post (a counter, or a comment with its count) checks that
//!   the post exists, then writes: two statements, not one transaction. A
//!   post deleted between the two keeps the counted row in `post_counters`,
//!   or the comment; nothing reads either for a post that does not exist, so
//!   they are harmless (declare the counter table with `cascade` to have the
//!   database remove such counter rows). `comments.post_id` has no foreign
//!   key on purpose: it would make every comment insert share-lock its
//!   post's row, the queue the slotted counters avoid.
//! * A like is not tied to a user, so `DELETE .../likes` decrements whatever
//!   the total is, below zero included. A real blog records who liked what
//!   (a `post_likes` table with a unique `(user_id, post_id)`) and counts
//!   only when that row is inserted or deleted.
//! * There is no authentication: `author_id` is taken as given, and anyone
//!   may delete any comment. A real blog takes the author from the session
//!   and lets only them (or a moderator) delete.

mod counts;
mod error;
mod routes;

use axum::{
    Router,
    extract::FromRef,
    routing::{delete, get, post},
};
use sea_orm::DatabaseConnection;

pub use counts::CountReader;
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

/// The days `GET /posts/{id}/views/daily` returns without `?days=`: two
/// weeks, today included.
pub const DEFAULT_DAILY_DAYS: u32 = 14;

/// The most days `GET /posts/{id}/views/daily` returns: a (leap) year.
pub const MAX_DAILY_DAYS: u32 = 366;

/// The posts per page of `GET /posts/most-liked` without `?limit=`.
pub const DEFAULT_MOST_LIKED: usize = 10;

/// The largest page of `GET /posts/most-liked`.
pub const MAX_MOST_LIKED: usize = 100;

/// The posts [`prepare`] adds to an empty database.
pub const SEED_TITLES: [&str; 5] = [
    "Hello, world",
    "Why counters get hot",
    "Slotted counters",
    "Reading a page of counts in one query",
    "Counting under load",
];

/// Migrates the schema (`migration::Migrator::up`), then adds
/// [`SEED_TITLES`] to an empty `posts` table (so the endpoints have
/// something to count at once); returns how many posts it added.
///
/// Behind PgBouncer in transaction pooling (`statement-cache-capacity=0`
/// in the URL), a statement outside a transaction may reach another server
/// connection between its parse and its execution: there both steps run in
/// one transaction. (The counting statements are the crate's, which keeps
/// each in one of its own.)
pub async fn prepare(db: &DatabaseConnection) -> Result<usize, sea_orm::DbErr> {
    use migration::MigratorTrait;
    use sea_orm::TransactionTrait;
    if !counter_core::pooling::is_transaction_pooled(db) {
        migration::Migrator::up(db, None).await?;
        return seed(db).await;
    }
    let txn = db.begin().await?;
    migration::Migrator::up(&txn, None).await?;
    let seeded = seed(&txn).await?;
    txn.commit().await?;
    Ok(seeded)
}

/// Adds [`SEED_TITLES`] to an empty `posts` table.
async fn seed(db: &impl sea_orm::ConnectionTrait) -> Result<usize, sea_orm::DbErr> {
    use sea_orm::{ActiveModelTrait, EntityTrait, PaginatorTrait, Set};
    if entity::post::Entity::find().count(db).await? > 0 {
        return Ok(0);
    }
    for title in SEED_TITLES {
        entity::post::ActiveModel {
            title: Set(title.into()),
            ..Default::default()
        }
        .insert(db)
        .await?;
    }
    Ok(SEED_TITLES.len())
}

/// The whole service, ready for `axum::serve`.
///
/// `db` is a pool (cloning it is cheap); the schema must be migrated
/// ([`prepare`]) first. Taking the connection rather than a
/// URL lets the binary and the tests, which run the same router over real
/// HTTP against SQLite, PostgreSQL and MySQL, each bring their own.
pub fn router(db: DatabaseConnection) -> Router {
    router_with(db, CountReader::Database)
}

/// [`router`], reading counts with `reader` (through a Redis cache, say).
pub fn router_with(db: DatabaseConnection, reader: CountReader) -> Router {
    Router::new()
        .route("/posts", get(routes::list_posts))
        // A static segment wins over `{id}`: this is not post "most-liked".
        .route("/posts/most-liked", get(routes::most_liked))
        .route("/posts/{id}", get(routes::get_post))
        .route(
            "/posts/{id}/likes",
            post(routes::like).delete(routes::unlike),
        )
        .route("/posts/{id}/views", post(routes::view))
        .route("/posts/{id}/views/daily", get(routes::daily_views))
        .route("/posts/{id}/comments", post(routes::add_comment))
        .route("/comments/{id}", delete(routes::delete_comment))
        .fallback(routes::no_route)
        .method_not_allowed_fallback(routes::wrong_method)
        .with_state(AppState { db, reader })
}

/// The router's state: handlers take the part they need.
#[derive(Clone)]
struct AppState {
    db: DatabaseConnection,
    reader: CountReader,
}

impl FromRef<AppState> for DatabaseConnection {
    fn from_ref(state: &AppState) -> Self {
        state.db.clone()
    }
}

impl FromRef<AppState> for CountReader {
    fn from_ref(state: &AppState) -> Self {
        state.reader.clone()
    }
}
