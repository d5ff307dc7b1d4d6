//! The reads behind the report: rankings computed in SQL with `top` (never
//! by reading every post's counts), and daily views from the buckets with
//! `series`, `series_many` and `range_many`. Each read is metered, so the
//! report can say how many statements it took.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use counter_core::{Series, prelude::*};
use entity::{post, user};
use sea_orm::DatabaseConnection;

use crate::{BoxError, ChartDays, meter::Meter};

/// Posts in the "most liked" list.
const MOST_LIKED: usize = 5;
/// Posts in the "most viewed" list, each with its daily views.
const MOST_VIEWED: usize = 5;
/// Users in the "most followed" list.
const MOST_FOLLOWED: usize = 5;
/// The recent views column of the "most liked" list, in days.
pub const RECENT_DAYS: i64 = 7;

/// Everything the report prints, read after the simulation.
pub struct Reads {
    pub liked: MostLiked,
    pub viewed: MostViewed,
    pub users: MostFollowed,
}

/// The most liked posts, with their other counts and recent views.
pub struct MostLiked {
    /// (post, likes, its counts, its views of the last [`RECENT_DAYS`] days).
    pub posts: Vec<(post::Model, i64, post::counters::Counts, i64)>,
    /// Statements of `top_models`: the ranking and the posts' rows.
    pub ranked_with: u64,
    /// Statements of the posts' counts and recent views.
    pub counts_with: u64,
}

/// The most viewed posts and their daily views over the chart's days.
pub struct MostViewed {
    /// (post, all-time views, its daily views), most viewed first.
    pub posts: Vec<(post::Model, i64, Series)>,
    /// Statements of `top_models`.
    pub ranked_with: u64,
    /// Statements of the series of all of them (`series_many`).
    pub series_many_with: u64,
}

/// The most followed users, with their other counts.
pub struct MostFollowed {
    pub users: Vec<(user::Model, user::counters::Counts)>,
    /// Statements of `top_models` and of the users' counts.
    pub read_with: u64,
}

impl Reads {
    pub async fn read(
        db: &DatabaseConnection,
        meter: &Meter,
        chart: &ChartDays,
    ) -> Result<Self, BoxError> {
        Ok(Self {
            liked: most_liked(db, meter, chart.last(RECENT_DAYS)).await?,
            viewed: most_viewed(db, meter, chart).await?,
            users: most_followed(db, meter).await?,
        })
    }
}

/// `top_models` by likes, then the page's other counts and recent views:
/// two grouped statements for the whole page.
async fn most_liked(
    db: &DatabaseConnection,
    meter: &Meter,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
) -> Result<MostLiked, BoxError> {
    use post::counters::Key;

    let start = meter.statements();
    let top = post::Entity::counters()
        .top_models(db, Key::Likes, MOST_LIKED)
        .await?;
    let ranked_with = meter.statements() - start;

    let ids: Vec<i64> = top.iter().map(|(post, _)| post.id).collect();
    let start = meter.statements();
    let mut counts = post::Entity::counters().counts_many(db, &ids).await?;
    let mut recent = post::Entity::counters()
        .range_many(db, &ids, Key::Views, from, to)
        .await?;
    let counts_with = meter.statements() - start;

    let posts = top
        .into_iter()
        .map(|(post, likes)| {
            let id = post.id;
            (
                post,
                likes,
                counts.remove(&id).unwrap_or_default(),
                recent.remove(&id).unwrap_or(0),
            )
        })
        .collect();
    Ok(MostLiked {
        posts,
        ranked_with,
        counts_with,
    })
}

/// `top_models` by views, and the daily views of all of them in one
/// `series_many`.
async fn most_viewed(
    db: &DatabaseConnection,
    meter: &Meter,
    chart: &ChartDays,
) -> Result<MostViewed, BoxError> {
    use post::counters::Key;

    let start = meter.statements();
    let top = post::Entity::counters()
        .top_models(db, Key::Views, MOST_VIEWED)
        .await?;
    let ranked_with = meter.statements() - start;

    let ids: Vec<i64> = top.iter().map(|(post, _)| post.id).collect();
    let start = meter.statements();
    let mut series: HashMap<i64, Series> = post::Entity::counters()
        .series_many(db, &ids, Key::Views, chart.from, chart.to)
        .await?;
    let series_many_with = meter.statements() - start;

    let posts = top
        .into_iter()
        .map(|(post, views)| {
            let days = series.remove(&post.id).unwrap_or_default();
            (post, views, days)
        })
        .collect();
    Ok(MostViewed {
        posts,
        ranked_with,
        series_many_with,
    })
}

/// `top_models` by followers, then the page's other counts.
async fn most_followed(db: &DatabaseConnection, meter: &Meter) -> Result<MostFollowed, BoxError> {
    let start = meter.statements();
    let top = user::Entity::counters()
        .top_models(db, user::counters::Key::Followers, MOST_FOLLOWED)
        .await?;
    let ids: Vec<i64> = top.iter().map(|(user, _)| user.id).collect();
    let mut counts = user::Entity::counters().counts_many(db, &ids).await?;
    let users = top
        .into_iter()
        .map(|(user, _)| {
            let counts = counts.remove(&user.id).unwrap_or_default();
            (user, counts)
        })
        .collect();
    Ok(MostFollowed {
        users,
        read_with: meter.statements() - start,
    })
}
