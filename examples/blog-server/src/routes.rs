//! The handlers, and the extractors that turn malformed input into client
//! errors (400, 413, 415) in the JSON shape.

use std::{collections::HashMap, marker::PhantomData};

use axum::{
    Json,
    extract::{FromRequest, FromRequestParts, Path, Query, Request, State},
    http::{HeaderName, Method, StatusCode, Uri, header, request::Parts},
};
use chrono::{TimeDelta, Utc};
use counter_core::{CounterCache, CounterError, Ranked, SlottedCounter, Window};
use entity::{
    comment,
    post::{
        self,
        counters::{Counts, Key},
    },
};
use sea_orm::{
    ColumnTrait, DatabaseConnection, DatabaseExecutor, DbErr, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, Set, TransactionTrait,
};
use serde::{Deserialize, Serialize};

use crate::{
    ApiError, CountReader, DEFAULT_DAILY_DAYS, DEFAULT_MOST_LIKED, MAX_COMMENT_CHARS,
    MAX_DAILY_DAYS, MAX_MOST_LIKED, MAX_PAGE, PAGE_SIZE,
};

/// An id from the path, of a `K`. Parsed here rather than with `Path<i64>`,
/// whose rejection is a plain-text body: a malformed id must be a 400 in the
/// same JSON shape as every other error, naming what the id was for.
pub(crate) struct Id<K>(i64, PhantomData<K>);

/// What an [`Id`] names, for its error message.
pub(crate) trait IdOf {
    /// `post` in "invalid post id".
    const NAME: &'static str;
}

/// The kind of a post id.
pub(crate) enum Post {}

impl IdOf for Post {
    const NAME: &'static str = "post";
}

/// The kind of a comment id.
pub(crate) enum Comment {}

impl IdOf for Comment {
    const NAME: &'static str = "comment";
}

pub(crate) type PostId = Id<Post>;
pub(crate) type CommentId = Id<Comment>;

impl<K: IdOf, S: Send + Sync> FromRequestParts<S> for Id<K> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        path_id(parts, state, K::NAME)
            .await
            .map(|id| Id(id, PhantomData))
    }
}

/// The one `{id}` of the path as an `i64`, or a 400 naming `what`.
async fn path_id<S: Send + Sync>(
    parts: &mut Parts,
    state: &S,
    what: &str,
) -> Result<i64, ApiError> {
    let Path(raw) = Path::<String>::from_request_parts(parts, state)
        .await
        .map_err(|rejection| rejected(rejection.status(), rejection.body_text()))?;
    raw.parse().map_err(|_| {
        ApiError::BadRequest(format!(
            "invalid {what} id {:?}: expected an integer",
            preview(&raw)
        ))
    })
}

/// The body of `POST /posts/{id}/comments`: `{"author_id": 7, "body": "..."}`,
/// with 1 to [`MAX_COMMENT_CHARS`] characters of body, none of them a
/// control character other than newline, carriage return and tab. Parsed
/// with axum's `Json`, whose rejections keep their meaning (see
/// [`rejected`]): 415 without an `application/json` content type, 413 for a
/// body over axum's limit, 400 for malformed JSON, a missing field or a
/// wrong type.
#[derive(Deserialize)]
pub(crate) struct NewComment {
    author_id: i64,
    body: String,
}

impl<S: Send + Sync> FromRequest<S> for NewComment {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let Json(comment) = Json::<NewComment>::from_request(req, state)
            .await
            .map_err(|rejection| rejected(rejection.status(), rejection.body_text()))?;
        let chars = comment.body.chars().count();
        if !(1..=MAX_COMMENT_CHARS).contains(&chars) {
            return Err(ApiError::BadRequest(format!(
                "a comment body has 1 to {MAX_COMMENT_CHARS} characters, not {chars}"
            )));
        }
        // Refused here, not by the database: PostgreSQL cannot store U+0000
        // in text (SQLSTATE 22021), which would be a 503 telling the client
        // to retry what can never succeed; and no comment needs the other
        // control characters, which only garble whatever displays it.
        if let Some((at, c)) = comment
            .body
            .chars()
            .enumerate()
            .find(|&(_, c)| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
        {
            return Err(ApiError::BadRequest(format!(
                "a comment body has no control characters but newline, carriage return and \
                 tab: U+{:04X} at character {}",
                u32::from(c),
                at + 1
            )));
        }
        Ok(comment)
    }
}

/// The page of `GET /posts?page=N`: 1-based, 1 when absent, at most
/// [`MAX_PAGE`]. Parsed by hand for the same reason as [`Id`].
pub(crate) struct Page(u64);

impl<S: Send + Sync> FromRequestParts<S> for Page {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let params = query_params(parts, state).await?;
        let Some(page) = single(&params, "page")? else {
            return Ok(Page(1));
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

/// The days of `GET /posts/{id}/views/daily?days=N`: 1 to
/// [`MAX_DAILY_DAYS`], [`DEFAULT_DAILY_DAYS`] when absent.
pub(crate) struct Days(u32);

impl<S: Send + Sync> FromRequestParts<S> for Days {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let params = query_params(parts, state).await?;
        let Some(days) = single(&params, "days")? else {
            return Ok(Days(DEFAULT_DAILY_DAYS));
        };
        match days.parse::<u32>() {
            Ok(n) if (1..=MAX_DAILY_DAYS).contains(&n) => Ok(Days(n)),
            _ => Err(ApiError::BadRequest(format!(
                "invalid days {:?}: expected a whole number from 1 to {MAX_DAILY_DAYS}",
                preview(days)
            ))),
        }
    }
}

/// A page of `GET /posts/most-liked?limit=N&after_likes=L&after_id=I`:
/// `limit` is 1 to [`MAX_MOST_LIKED`] ([`DEFAULT_MOST_LIKED`] when absent);
/// `after_likes` and `after_id`, the `next` of the page before, come
/// together or not at all (the first page).
pub(crate) struct RankPage {
    limit: usize,
    after: Option<Ranked<i64>>,
}

impl<S: Send + Sync> FromRequestParts<S> for RankPage {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let params = query_params(parts, state).await?;
        let limit = match single(&params, "limit")? {
            None => DEFAULT_MOST_LIKED,
            Some(raw) => match raw.parse::<usize>() {
                Ok(n) if (1..=MAX_MOST_LIKED).contains(&n) => n,
                _ => {
                    return Err(ApiError::BadRequest(format!(
                        "invalid limit {:?}: expected a whole number from 1 to {MAX_MOST_LIKED}",
                        preview(raw)
                    )));
                }
            },
        };
        let integer = |name: &str, raw: &str| {
            raw.parse::<i64>().map_err(|_| {
                ApiError::BadRequest(format!(
                    "invalid {name} {:?}: expected an integer",
                    preview(raw)
                ))
            })
        };
        let after = match (
            single(&params, "after_likes")?,
            single(&params, "after_id")?,
        ) {
            (None, None) => None,
            (Some(likes), Some(id)) => Some(Ranked {
                owner: integer("after_id", id)?,
                total: integer("after_likes", likes)?,
            }),
            _ => {
                return Err(ApiError::BadRequest(
                    "`after_likes` and `after_id` go together: give both (the `next` of the \
                     page before) or neither (the first page)"
                        .into(),
                ));
            }
        };
        Ok(RankPage { limit, after })
    }
}

/// The query's name/value pairs, in order. Pairs rather than a struct, so
/// that other parameters are ignored and a repeated one gets a message of
/// ours (see [`single`]) instead of serde's.
async fn query_params<S: Send + Sync>(
    parts: &mut Parts,
    state: &S,
) -> Result<Vec<(String, String)>, ApiError> {
    let Query(params) = Query::<Vec<(String, String)>>::from_request_parts(parts, state)
        .await
        .map_err(|rejection| rejected(rejection.status(), rejection.body_text()))?;
    Ok(params)
}

/// The value of the parameter `name`, if given; a 400 if it is given more
/// than once, since which one counts would be a guess.
fn single<'a>(params: &'a [(String, String)], name: &str) -> Result<Option<&'a str>, ApiError> {
    let mut values = params.iter().filter(|(n, _)| n == name);
    match (values.next(), values.next()) {
        (None, _) => Ok(None),
        (Some((_, value)), None) => Ok(Some(value)),
        (Some(_), Some(_)) => Err(ApiError::BadRequest(format!(
            "`{name}` is given more than once"
        ))),
    }
}

/// An extractor's own rejection in the JSON shape, with its status where
/// that tells the client something it can act on: 415 (the body is not
/// declared `application/json`: fix the header) and 413 (the body is over
/// axum's limit: send less). Any other client error is a 400: a path
/// segment that is not UTF-8, a query that is not `a=b&c=d`, JSON that does
/// not parse, and also axum's 422 for JSON that parses but has a missing
/// field or a wrong type. That one is folded into 400 on purpose: the
/// checks this crate makes of the same body (empty, too long, control
/// characters) are 400s, and a client should not have to tell "`body` is a
/// number" from "`body` is empty" by status when both are a malformed
/// comment, fixed the same way. A server error (a route without `{id}`
/// using [`Id`]) is our bug, a 500.
fn rejected(status: StatusCode, text: String) -> ApiError {
    match status {
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::UnsupportedMediaType(text),
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge(text),
        status if status.is_client_error() => ApiError::BadRequest(text),
        _ => ApiError::Internal(text),
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

/// `GET /posts/{id}/views/daily`: one entry per UTC day, oldest first.
#[derive(Serialize)]
pub(crate) struct DailyViewsBody {
    post_id: i64,
    days: Vec<DayViews>,
}

/// A day of [`DailyViewsBody`]: `{"day": "2026-11-22", "views": 3}`.
#[derive(Serialize)]
pub(crate) struct DayViews {
    day: String,
    views: i64,
}

/// `GET /posts/most-liked`.
#[derive(Serialize)]
pub(crate) struct MostLikedBody {
    posts: Vec<LikedPost>,
    /// The cursor of the next page, `None` (null) on the last.
    next: Option<LikesCursor>,
}

/// An item of [`MostLikedBody`].
#[derive(Serialize)]
pub(crate) struct LikedPost {
    id: i64,
    title: String,
    likes: i64,
}

/// Where the next page of `GET /posts/most-liked` starts: after this
/// post's place in the ranking. Sent back as the query parameters of the
/// same names.
#[derive(Serialize)]
pub(crate) struct LikesCursor {
    after_likes: i64,
    after_id: i64,
}

/// The answer to a write: the post's counts just after it.
#[derive(Serialize)]
pub(crate) struct CountsBody {
    id: i64,
    counts: Counts,
}

/// The answer to `POST /posts/{id}/comments`: the comment as stored (the
/// row itself, see [`comment::Model`]), and its post's counts just after it
/// (`counts.comments` includes it).
#[derive(Serialize)]
pub(crate) struct CreatedComment {
    comment: comment::Model,
    counts: Counts,
}

/// The response of `POST /posts/{id}/comments`: 201, the `Location` of the
/// new comment, and the body.
type Created = (StatusCode, [(HeaderName, String); 1], Json<CreatedComment>);

/// `GET /posts?page=N`: one query for the page of posts, one grouped query
/// (`load_counts`) for all their counts, whatever the page size.
pub(crate) async fn list_posts(
    State(db): State<DatabaseConnection>,
    State(reader): State<CountReader>,
    Page(page): Page,
) -> Result<Json<PageBody>, ApiError> {
    // `Page` bounds `page` so that this fits in an i64.
    let offset = (page - 1) * PAGE_SIZE;
    let models = query(&db, async |db| {
        post::Entity::find()
            .order_by_asc(post::Column::Id)
            .offset(offset)
            .limit(PAGE_SIZE)
            .all(db)
            .await
    })
    .await?;
    let posts = reader
        .load_counts(&db, models)
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
    State(reader): State<CountReader>,
    Id(id, _): PostId,
) -> Result<Json<PostBody>, ApiError> {
    let model = existing_post(&db, id).await?;
    let counts = reader.counts(&db, id).await?;
    Ok(Json(PostBody {
        id,
        title: model.title,
        counts,
    }))
}

/// `GET /posts/{id}/views/daily?days=N`: the post's views in each of the
/// last N UTC days, today (so far) last, zero-filled; 404 for a post that
/// does not exist. Two statements: the post, and the days' buckets
/// (`series`), whatever N.
pub(crate) async fn daily_views(
    State(db): State<DatabaseConnection>,
    Id(id, _): PostId,
    Days(days): Days,
) -> Result<Json<DailyViewsBody>, ApiError> {
    existing_post(&db, id).await?;
    let today = Window::Day.start_of(Utc::now());
    let from = today - TimeDelta::days(i64::from(days) - 1);
    let to = today + TimeDelta::days(1);
    let series = post::Entity::counters()
        .series(&db, id, Key::Views, from, to)
        .await?;
    let days = series
        .into_iter()
        .map(|(day, views)| DayViews {
            day: day.format("%Y-%m-%d").to_string(),
            views,
        })
        .collect();
    Ok(Json(DailyViewsBody { post_id: id, days }))
}

/// `GET /posts/most-liked?limit=N&after_likes=L&after_id=I`: a page of the
/// posts ranked by likes (most first, ties by id), and the cursor of the
/// next. Two statements whatever the page: the ranking (`top`, or
/// `top_after` the cursor: keyset pagination, so a deep page costs what the
/// first does and every post is listed once while likes stand still) and
/// the page's titles.
///
/// `next` is null when the ranking had fewer than `limit` posts left. A
/// post deleted after it was liked is ranked but has no title to show: it
/// is left out of `posts`, and `next` still steps over it, so such a page
/// may be short without being the last.
pub(crate) async fn most_liked(
    State(db): State<DatabaseConnection>,
    RankPage { limit, after }: RankPage,
) -> Result<Json<MostLikedBody>, ApiError> {
    let ranked = match &after {
        None => post::Entity::counters().top(&db, Key::Likes, limit).await?,
        Some(last) => {
            post::Entity::counters()
                .top_after(&db, Key::Likes, last, limit)
                .await?
        }
    };
    let next = match ranked.last() {
        Some(last) if ranked.len() == limit => Some(LikesCursor {
            after_likes: last.total,
            after_id: last.owner,
        }),
        _ => None,
    };
    let mut titles: HashMap<i64, String> = if ranked.is_empty() {
        HashMap::new()
    } else {
        let ids = ranked.iter().map(|r| r.owner);
        query(&db, async |db| {
            post::Entity::find()
                .select_only()
                .columns([post::Column::Id, post::Column::Title])
                .filter(post::Column::Id.is_in(ids))
                .into_tuple::<(i64, String)>()
                .all(db)
                .await
        })
        .await?
        .into_iter()
        .collect()
    };
    let posts = ranked
        .into_iter()
        .filter_map(|r| {
            let title = titles.remove(&r.owner)?;
            Some(LikedPost {
                id: r.owner,
                title,
                likes: r.total,
            })
        })
        .collect();
    Ok(Json(MostLikedBody { posts, next }))
}

/// `POST /posts/{id}/likes`.
pub(crate) async fn like(
    State(db): State<DatabaseConnection>,
    State(reader): State<CountReader>,
    Id(id, _): PostId,
) -> Result<Json<CountsBody>, ApiError> {
    count(&db, &reader, id, Key::Likes, 1).await
}

/// `DELETE /posts/{id}/likes`.
pub(crate) async fn unlike(
    State(db): State<DatabaseConnection>,
    State(reader): State<CountReader>,
    Id(id, _): PostId,
) -> Result<Json<CountsBody>, ApiError> {
    count(&db, &reader, id, Key::Likes, -1).await
}

/// `POST /posts/{id}/views`.
pub(crate) async fn view(
    State(db): State<DatabaseConnection>,
    State(reader): State<CountReader>,
    Id(id, _): PostId,
) -> Result<Json<CountsBody>, ApiError> {
    count(&db, &reader, id, Key::Views, 1).await
}

/// `POST /posts/{id}/comments`: 201 with the comment and the post's counts,
/// and `Location: /comments/{id}`, the comment's URL in this API (the one
/// `DELETE` takes).
///
/// The comment is inserted with `insert_counted`: the row and the post's
/// `comments` counter in one transaction (retried on deadlock), so the
/// counter is exact even when the request fails halfway. The post's
/// existence is checked first, as for the counter writes (see
/// [`write_post`]). The author is taken as given: this example has no
/// authentication.
pub(crate) async fn add_comment(
    State(db): State<DatabaseConnection>,
    State(reader): State<CountReader>,
    Id(id, _): PostId,
    NewComment { author_id, body }: NewComment,
) -> Result<Created, ApiError> {
    let row = comment::ActiveModel {
        post_id: Set(id),
        author_id: Set(author_id),
        body: Set(body),
        ..Default::default()
    };
    let (comment, counts) = write_post(&db, &reader, id, || {
        comment::Entity::insert_counted(&db, row)
    })
    .await?;
    let location = format!("/comments/{}", comment.id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(CreatedComment { comment, counts }),
    ))
}

/// `DELETE /comments/{id}`: 204 if this request removed the comment (and
/// decremented its post's `comments`), 404 if there was no such comment.
///
/// `delete_counted` locks and reads the row before deleting it, in one
/// transaction with the decrement, so of two concurrent deletes of one
/// comment (a double click) exactly one removes it and decrements: the other
/// finds nothing, `rows_affected` is 0, and it is a 404.
pub(crate) async fn delete_comment(
    State(db): State<DatabaseConnection>,
    Id(id, _): CommentId,
) -> Result<StatusCode, ApiError> {
    let row = comment::ActiveModel {
        id: Set(id),
        ..Default::default()
    };
    match comment::Entity::delete_counted(&db, row)
        .await?
        .rows_affected
    {
        0 => Err(ApiError::NotFound(format!("comment {id} does not exist"))),
        _ => Ok(StatusCode::NO_CONTENT),
    }
}

/// The counter write endpoints: one counter write through [`write_post`],
/// answered with the post's counts.
async fn count(
    db: &DatabaseConnection,
    reader: &CountReader,
    id: i64,
    key: Key,
    delta: i64,
) -> Result<Json<CountsBody>, ApiError> {
    let ((), counts) = write_post(db, reader, id, || {
        post::Entity::counters().add(db, id, key, delta)
    })
    .await?;
    Ok(Json(CountsBody { id, counts }))
}

/// Every write to a post (a counter, a comment): 404 unless the post
/// exists, then `write`, then the post's counts, read back.
///
/// The existence check and the write are separate statements, not a
/// transaction. A post deleted in between leaves a counter row (or a
/// comment) for a post that no longer exists, which nothing reads (see the
/// crate docs). The counts read back include other clients' concurrent
/// writes: they are the totals just after ours, not our write's own effect.
async fn write_post<T, W>(
    db: &DatabaseConnection,
    reader: &CountReader,
    id: i64,
    write: impl FnOnce() -> W,
) -> Result<(T, Counts), ApiError>
where
    W: Future<Output = Result<T, CounterError>>,
{
    existing_post(db, id).await?;
    let written = write().await?;
    let counts = reader.counts(db, id).await?;
    Ok((written, counts))
}

/// The post, or a 404 naming the id.
async fn existing_post(db: &DatabaseConnection, id: i64) -> Result<post::Model, ApiError> {
    query(db, async |db| post::Entity::find_by_id(id).one(db).await)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("post {id} does not exist")))
}

/// Runs one of the app's own queries (the counter calls see to theirs).
///
/// Behind a transaction pooler (PgBouncer with `pool_mode = transaction`,
/// see `counter_core::pooling`), a statement sent on the pool outside a
/// transaction can be split between two server connections (`prepared
/// statement "sqlx_s_1" does not exist`): there the query runs in a
/// transaction of its own. Anywhere else it runs on the pool, as usual.
async fn query<T>(
    db: &DatabaseConnection,
    run: impl AsyncFnOnce(&DatabaseExecutor<'_>) -> Result<T, DbErr>,
) -> Result<T, DbErr> {
    if !counter_core::pooling::is_transaction_pooled(db) {
        return run(&db.into()).await;
    }
    let txn = db.begin().await?;
    let out = run(&(&txn).into()).await?;
    txn.commit().await?;
    Ok(out)
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
