//! The handlers, and the extractors that turn malformed input into 400s.

use axum::{
    Json,
    extract::{FromRequestParts, Path, Query, State},
    http::{Method, StatusCode, Uri, request::Parts},
};
use counter_core::SlottedCounter;
use entity::post::{
    self,
    counters::{Counts, Key},
};
use sea_orm::{DatabaseConnection, EntityTrait, QueryOrder, QuerySelect};
use serde::Serialize;

use crate::{ApiError, MAX_PAGE, PAGE_SIZE};

/// A post id from the path. Parsed here rather than with `Path<i64>`, whose
/// rejection is a plain-text body: a malformed id must be a 400 in the same
/// JSON shape as every other error.
pub(crate) struct PostId(i64);

impl<S: Send + Sync> FromRequestParts<S> for PostId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| rejected(rejection.status(), rejection.body_text()))?;
        raw.parse().map(PostId).map_err(|_| {
            ApiError::BadRequest(format!(
                "invalid post id {:?}: expected an integer",
                preview(&raw)
            ))
        })
    }
}

/// The page of `GET /posts?page=N`: 1-based, 1 when absent, at most
/// [`MAX_PAGE`]. Parsed by hand for the same reason as [`PostId`].
pub(crate) struct Page(u64);

impl<S: Send + Sync> FromRequestParts<S> for Page {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        // Name/value pairs, not a struct: other parameters are ignored, and
        // a repeated `page` gets a message of ours instead of serde's.
        let Query(params) = Query::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| rejected(rejection.status(), rejection.body_text()))?;
        let mut pages = params.iter().filter(|(name, _)| name == "page");
        let page = match (pages.next(), pages.next()) {
            (None, _) => return Ok(Page(1)),
            (Some((_, raw)), None) => raw,
            (Some(_), Some(_)) => {
                return Err(ApiError::BadRequest(
                    "`page` is given more than once".into(),
                ));
            }
        };
        match page.parse::<u64>() {
            Ok(n) if (1..=MAX_PAGE).contains(&n) => Ok(Page(n)),
            _ => Err(ApiError::BadRequest(format!(
                "invalid page {:?}: expected a whole number from 1 to {MAX_PAGE}",
                preview(page)
            ))),
        }
    }
}

/// An extractor's own rejection in the JSON shape: a client error (a path
/// segment that is not UTF-8, a query that is not `a=b&c=d`) is a 400; any
/// other (a route without `{id}` using [`PostId`]) is our bug, a 500.
fn rejected(status: StatusCode, text: String) -> ApiError {
    if status.is_client_error() {
        ApiError::BadRequest(text)
    } else {
        ApiError::Internal(text)
    }
}

/// A post with its counts: an item of `GET /posts`, and `GET /posts/{id}`.
#[derive(Serialize)]
pub(crate) struct PostBody {
    id: i64,
    title: String,
    counts: Counts,
}

/// `GET /posts?page=N`.
#[derive(Serialize)]
pub(crate) struct PageBody {
    page: u64,
    posts: Vec<PostBody>,
}

/// The answer to a write: the post's counts just after it.
#[derive(Serialize)]
pub(crate) struct CountsBody {
    id: i64,
    counts: Counts,
}

/// `GET /posts?page=N`: one query for the page of posts, one grouped query
/// (`load_counts`) for all their counts, whatever the page size.
pub(crate) async fn list_posts(
    State(db): State<DatabaseConnection>,
    Page(page): Page,
) -> Result<Json<PageBody>, ApiError> {
    // `Page` bounds `page` so that this fits in an i64.
    let offset = (page - 1) * PAGE_SIZE;
    let models = post::Entity::find()
        .order_by_asc(post::Column::Id)
        .offset(offset)
        .limit(PAGE_SIZE)
        .all(&db)
        .await?;
    let posts = post::Entity::load_counts(&db, models)
        .await?
        .into_iter()
        .map(|(model, counts)| PostBody {
            id: model.id,
            title: model.title,
            counts,
        })
        .collect();
    Ok(Json(PageBody { page, posts }))
}

/// `GET /posts/{id}`.
pub(crate) async fn get_post(
    State(db): State<DatabaseConnection>,
    PostId(id): PostId,
) -> Result<Json<PostBody>, ApiError> {
    let model = existing_post(&db, id).await?;
    let counts = post::Entity::counts(&db, &id).await?;
    Ok(Json(PostBody {
        id,
        title: model.title,
        counts,
    }))
}

/// `POST /posts/{id}/likes`.
pub(crate) async fn like(
    State(db): State<DatabaseConnection>,
    PostId(id): PostId,
) -> Result<Json<CountsBody>, ApiError> {
    count(&db, id, Key::Likes, 1).await
}

/// `DELETE /posts/{id}/likes`.
pub(crate) async fn unlike(
    State(db): State<DatabaseConnection>,
    PostId(id): PostId,
) -> Result<Json<CountsBody>, ApiError> {
    count(&db, id, Key::Likes, -1).await
}

/// `POST /posts/{id}/views`.
pub(crate) async fn view(
    State(db): State<DatabaseConnection>,
    PostId(id): PostId,
) -> Result<Json<CountsBody>, ApiError> {
    count(&db, id, Key::Views, 1).await
}

/// Every write endpoint: 404 unless the post exists, then one counter
/// write, then the post's counts, read back.
///
/// The existence check and the write are separate statements, not a
/// transaction. A post deleted in between leaves a counter row for a post
/// that no longer exists, which nothing reads (see the crate docs). The
/// counts read back include other clients' concurrent writes: they are the
/// totals just after ours, not our write's own effect.
async fn count(
    db: &DatabaseConnection,
    id: i64,
    key: Key,
    delta: i64,
) -> Result<Json<CountsBody>, ApiError> {
    existing_post(db, id).await?;
    post::Entity::add(db, id, key, delta).await?;
    let counts = post::Entity::counts(db, &id).await?;
    Ok(Json(CountsBody { id, counts }))
}

/// The post, or a 404 naming the id.
async fn existing_post(db: &DatabaseConnection, id: i64) -> Result<post::Model, ApiError> {
    post::Entity::find_by_id(id)
        .one(db)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("post {id} does not exist")))
}

/// Unknown routes: axum's 404, in the JSON shape.
pub(crate) async fn no_route(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {}", preview(uri.path())))
}

/// Known routes with another method: axum's 405 (its `Allow` header is
/// kept), in the JSON shape.
pub(crate) async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!(
        "{method} is not allowed on {}",
        preview(uri.path())
    ))
}

/// At most 80 characters of client input, so an error message cannot echo
/// a huge path or query back (or into a log).
fn preview(input: &str) -> String {
    const MAX: usize = 80;
    match input.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &input[..cut]),
        None => input.to_owned(),
    }
}
