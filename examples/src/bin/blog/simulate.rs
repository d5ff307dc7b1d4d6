//! The simulated users: concurrent tasks liking, unliking, commenting on,
//! deleting their comments, viewing and following, with the traffic skewed
//! towards a few hot posts and users, and a tally of every write they were
//! told succeeded. Views are dated over the days of the daily views chart
//! ([`CHART_DAYS`](crate::CHART_DAYS)), so it has a history after one run.

use std::{
    collections::{HashMap, HashSet},
    error::Error,
    fmt,
    ops::AddAssign,
    sync::Arc,
    time::Duration,
};

use chrono::{DateTime, TimeDelta, Utc};
use counter_core::prelude::*;
use entity::{comment, post, user};
use indicatif::{ProgressBar, ProgressState, ProgressStyle};
use rand::{
    Rng, SeedableRng,
    distr::{Distribution, weighted::WeightedIndex},
    rngs::StdRng,
    seq::SliceRandom,
};
use sea_orm::{DatabaseConnection, Set};

use crate::{BoxError, ChartDays};

type PostKey = post::counters::Key;
type UserKey = user::counters::Key;

/// A simulated user's failure: a write error, or a delete whose outcome
/// contradicts the counter cache's guarantee. `Send`, unlike [`BoxError`],
/// since it leaves a spawned task.
type TaskError = Box<dyn Error + Send + Sync>;

/// The skew of the traffic: the post (or user) of rank r gets a share
/// proportional to 1 / r^ZIPF_EXPONENT, so a handful get most of it, as on
/// a real site, and their counters are the hot rows slots are for.
const ZIPF_EXPONENT: f64 = 1.0;

/// Who gets the traffic: ids in a random order, picked with a Zipf-like
/// skew. Shuffled so that the hot ones are not simply the lowest ids, and
/// differ from run to run.
struct Hot {
    ids: Vec<i64>,
    weights: WeightedIndex<f64>,
}

impl Hot {
    fn new(ids: &[i64], rng: &mut impl Rng) -> Result<Self, BoxError> {
        let mut ids = ids.to_vec();
        ids.shuffle(rng);
        let weights = WeightedIndex::new(
            (1..=ids.len()).map(|rank| 1.0 / (rank as f64).powf(ZIPF_EXPONENT)),
        )?;
        Ok(Self { ids, weights })
    }

    fn pick(&self, rng: &mut impl Rng) -> i64 {
        self.ids[self.weights.sample(rng)]
    }
}

/// How much less a view is dated on each earlier day than on the day
/// after it: most views are recent, as on a real site, and the chart shows
/// the decay.
const VIEWS_DAY_DECAY: f64 = 0.85;

/// When the simulated views happened: a time in the chart's days, from the
/// start of its first day up to now, skewed towards the recent days. A view
/// is counted with `add_at` at that time, as an import of a day's access log
/// would: in its all-time total, and in the daily bucket of its time.
struct ViewTimes {
    first_day: DateTime<Utc>,
    now: DateTime<Utc>,
    /// Day index (0 = the first day) by weight.
    days: WeightedIndex<f64>,
}

impl ViewTimes {
    fn new(chart: &ChartDays) -> Result<Self, BoxError> {
        let days = chart.days();
        let weights = (0..days).map(|day| VIEWS_DAY_DECAY.powi((days - 1 - day) as i32));
        Ok(Self {
            first_day: chart.from,
            now: chart.now,
            days: WeightedIndex::new(weights)?,
        })
    }

    /// A time in the picked day; today's, not after now.
    fn pick(&self, rng: &mut impl Rng) -> DateTime<Utc> {
        let day = self.first_day + TimeDelta::days(self.days.sample(rng) as i64);
        let end = (day + TimeDelta::days(1)).min(self.now);
        let span = (end - day).num_milliseconds().max(1);
        day + TimeDelta::milliseconds(rng.random_range(0..span))
    }
}

/// Comment bodies, picked at random: the rows are real, so they read like
/// comments.
const BODIES: &[&str] = &[
    "Great post!",
    "Does this work on MariaDB too?",
    "We hit exactly this hot row last week.",
    "How many slots do you use for views?",
    "Bookmarked.",
];

/// One in this many comment deletes is a double click: the same delete sent
/// twice at once. Only one of the two may remove the row and decrement.
const DOUBLE_CLICK_ONE_IN: u32 = 3;

/// Acknowledged actions by kind, for the summary line and for the number of
/// counter writes the check expects.
#[derive(Default)]
pub struct ActionCounts {
    pub views: u64,
    pub likes: u64,
    pub unlikes: u64,
    /// Comment rows inserted (`insert_counted`).
    pub comments: u64,
    /// Comment deletes that removed the row, so decremented the post's
    /// `comments`: one per comment deleted, double clicks included.
    pub deleted_comments: u64,
    /// Deletes that found their comment already gone (the second delete of a
    /// double click) and so changed no counter. Not an action of their own:
    /// the delete they repeated is counted in `deleted_comments`.
    pub repeated_deletes: u64,
    pub follows: u64,
    pub unfollows: u64,
}

impl ActionCounts {
    pub fn total(&self) -> u64 {
        self.views
            + self.likes
            + self.unlikes
            + self.comments
            + self.deleted_comments
            + self.follows
            + self.unfollows
    }
}

impl AddAssign for ActionCounts {
    fn add_assign(&mut self, other: Self) {
        // Destructured, so that a field added later cannot be left out.
        let ActionCounts {
            views,
            likes,
            unlikes,
            comments,
            deleted_comments,
            repeated_deletes,
            follows,
            unfollows,
        } = other;
        self.views += views;
        self.likes += likes;
        self.unlikes += unlikes;
        self.comments += comments;
        self.deleted_comments += deleted_comments;
        self.repeated_deletes += repeated_deletes;
        self.follows += follows;
        self.unfollows += unfollows;
    }
}

/// What the simulated users were told succeeded: the deltas the stored
/// counts must show, since an acknowledged write that went missing (or an
/// unacknowledged one that landed) is exactly the bug the check is for.
#[derive(Default)]
pub struct Tally {
    pub posts: HashMap<(i64, PostKey), i64>,
    pub users: HashMap<(i64, UserKey), i64>,
    pub actions: ActionCounts,
    /// Writes that still conflicted after the library's retries.
    pub refused: u64,
}

impl Tally {
    /// Each task keeps its own tally, so the tasks share nothing but the
    /// pool; they are added up once all have finished.
    fn merge(&mut self, other: Tally) {
        for (counter, delta) in other.posts {
            *self.posts.entry(counter).or_default() += delta;
        }
        for (counter, delta) in other.users {
            *self.users.entry(counter).or_default() += delta;
        }
        self.actions += other.actions;
        self.refused += other.refused;
    }

    /// Acknowledged counter writes: (increments, decrements). A follow is two
    /// (the follower's `following`, the followee's `followers`); a comment
    /// insert is one, and so is a delete that removed its row (a delete that
    /// found the row gone writes no counter).
    pub fn writes(&self) -> (u64, u64) {
        let a = &self.actions;
        (
            a.views + a.likes + a.comments + 2 * a.follows,
            a.unlikes + a.deleted_comments + 2 * a.unfollows,
        )
    }
}

/// Runs `users` tasks of `actions` actions each, concurrently, so that the
/// hot posts see concurrent writers: the case slots are for. Views are dated
/// in `chart`'s days.
pub async fn simulate(
    db: &DatabaseConnection,
    post_ids: &[i64],
    user_ids: &[i64],
    users: u64,
    actions: u64,
    chart: &ChartDays,
) -> Result<Tally, BoxError> {
    let mut rng = StdRng::from_rng(&mut rand::rng());
    let hot_posts = Arc::new(Hot::new(post_ids, &mut rng)?);
    let hot_users = Arc::new(Hot::new(user_ids, &mut rng)?);
    let view_times = Arc::new(ViewTimes::new(chart)?);

    let bar = progress_bar(users * actions);
    let tasks: Vec<_> = user_ids
        .iter()
        .take(users as usize)
        .map(|&me| {
            let user = SimulatedUser {
                db: db.clone(),
                me,
                posts: hot_posts.clone(),
                users: hot_users.clone(),
                view_times: view_times.clone(),
                rng: StdRng::from_rng(&mut rng),
                bar: bar.clone(),
            };
            tokio::spawn(user.run(actions))
        })
        .collect();
    let mut tally = Tally::default();
    for task in tasks {
        // A task that panicked or was cancelled, or a write error: either
        // ends the run, with the bar left where it stopped.
        let joined = task.await.map_err(BoxError::from);
        match joined.and_then(|part| part.map_err(|err| err as BoxError)) {
            Ok(part) => tally.merge(part),
            Err(err) => {
                bar.abandon();
                return Err(err);
            }
        }
    }
    bar.finish_and_clear();
    Ok(tally)
}

/// A bar over all the actions, so a long run on a slow database shows it is
/// moving and how fast; cleared at the end so it leaves no trace in the
/// output.
fn progress_bar(actions: u64) -> ProgressBar {
    let bar = ProgressBar::new(actions);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} actions, {rate}, eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .with_key("rate", |state: &ProgressState, out: &mut dyn fmt::Write| {
                let _ = write!(out, "{:.0}/s", state.per_sec());
            })
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

/// One simulated user. This demo keeps no table of who liked or follows
/// what (an application would insert that row in the same transaction as the
/// counter write); each task remembers its own likes and follows instead, so
/// it only unlikes what it liked and counts never go negative. Comments are
/// real rows, counted by the `comments` counter cache: a comment and its
/// counter are written in one transaction by `insert_counted` and
/// `delete_counted`, never with `increment`.
struct SimulatedUser {
    db: DatabaseConnection,
    me: i64,
    posts: Arc<Hot>,
    users: Arc<Hot>,
    view_times: Arc<ViewTimes>,
    /// Its own generator, seeded from the run's: the thread-local one is not
    /// `Send`, and a task may move between threads at any `.await`.
    rng: StdRng,
    bar: ProgressBar,
}

impl SimulatedUser {
    async fn run(mut self, actions: u64) -> Result<Tally, TaskError> {
        let db = &self.db;
        let mut tally = Tally::default();
        let mut liked = HashSet::new();
        let mut following = HashSet::new();
        // My comments still there: (comment id, post id).
        let mut mine: Vec<(i64, i64)> = Vec::new();
        for _ in 0..actions {
            let post = self.posts.pick(&mut self.rng);
            let roll = self.rng.random_range(0..100u32);
            let them = self.users.pick(&mut self.rng);
            match roll {
                // Like, or unlike a post liked before: the like button toggles.
                60..85 => {
                    let like = !liked.contains(&post);
                    let written = if like {
                        post::Entity::counters()
                            .increment(db, post, PostKey::Likes)
                            .await
                    } else {
                        post::Entity::counters()
                            .decrement(db, post, PostKey::Likes)
                            .await
                    };
                    if acknowledged(written, &mut tally.refused)?.is_some() {
                        if like {
                            liked.insert(post);
                            tally.actions.likes += 1;
                        } else {
                            liked.remove(&post);
                            tally.actions.unlikes += 1;
                        }
                        *tally.posts.entry((post, PostKey::Likes)).or_default() +=
                            if like { 1 } else { -1 };
                    }
                }
                // Delete one of my earlier comments, when I have one.
                92..95 if !mine.is_empty() => {
                    let at = self.rng.random_range(0..mine.len());
                    let (id, on) = mine[at];
                    let double_click = self.rng.random_ratio(1, DOUBLE_CLICK_ONE_IN);
                    let (removed, found_gone, acked) =
                        delete_comment(db, id, double_click, &mut tally.refused).await?;
                    tally.actions.deleted_comments += removed;
                    tally.actions.repeated_deletes += found_gone;
                    // The post's counter moves once per row removed, however
                    // many deletes were sent.
                    *tally.posts.entry((on, PostKey::Comments)).or_default() -= removed as i64;
                    if acked {
                        // Removed now, or already gone: not mine to delete any more.
                        mine.swap_remove(at);
                    }
                }
                // Comment: a row in `comments`, counted with it.
                85..95 => {
                    let body = BODIES[self.rng.random_range(0..BODIES.len())];
                    let row = comment::ActiveModel {
                        post_id: Set(post),
                        author_id: Set(self.me),
                        body: Set(body.to_owned()),
                        ..Default::default()
                    };
                    let written = comment::Entity::insert_counted(db, row).await;
                    if let Some(stored) = acknowledged(written, &mut tally.refused)? {
                        mine.push((stored.id, post));
                        tally.actions.comments += 1;
                        *tally.posts.entry((post, PostKey::Comments)).or_default() += 1;
                    }
                }
                // Follow or unfollow: both users' counters in one atomic
                // statement (a two-row upsert).
                95.. if them != self.me => {
                    let delta = if following.contains(&them) { -1 } else { 1 };
                    let written = user::Entity::counters()
                        .add_many(
                            db,
                            [
                                (self.me, UserKey::Following, delta),
                                (them, UserKey::Followers, delta),
                            ],
                        )
                        .await;
                    if acknowledged(written, &mut tally.refused)?.is_some() {
                        if delta > 0 {
                            following.insert(them);
                            tally.actions.follows += 1;
                        } else {
                            following.remove(&them);
                            tally.actions.unfollows += 1;
                        }
                        *tally
                            .users
                            .entry((self.me, UserKey::Following))
                            .or_default() += delta;
                        *tally.users.entry((them, UserKey::Followers)).or_default() += delta;
                    }
                }
                // A view: the most frequent action, dated in the chart's
                // days (its all-time total counts it too).
                _ => {
                    let at = self.view_times.pick(&mut self.rng);
                    let written = post::Entity::counters()
                        .add_at(db, post, PostKey::Views, 1, at)
                        .await;
                    if acknowledged(written, &mut tally.refused)?.is_some() {
                        tally.actions.views += 1;
                        *tally.posts.entry((post, PostKey::Views)).or_default() += 1;
                    }
                }
            }
            self.bar.inc(1);
        }
        Ok(tally)
    }
}

/// Deletes my comment `id` with `delete_counted`; on a double click, sends
/// the same delete twice at once, as a browser would.
///
/// Returns (deletes that removed the row, deletes that found it gone,
/// whether any delete was acknowledged). Each delete locks and reads the row
/// before deleting it, in one transaction with the decrement, so of two
/// concurrent deletes only the first finds the row: the second waits for it
/// to commit, finds nothing, and neither decrements nor removes anything
/// (`rows_affected` 0). The check and the recount prove the counter moved
/// once per row removed.
///
/// Any other outcome is an error that ends the run. The comment is mine and
/// still there (I drop it from my list once a delete of it is
/// acknowledged, and nobody else deletes my comments), so an acknowledged
/// delete means the row was removed exactly once in this call: never two
/// removals, never a single delete that found it gone (for one delete,
/// `removed == 1` leaves no room for `found_gone`), and never a double
/// click where both found it gone. A delete refused after the retries was
/// rolled back, so it removed nothing; the other one of its pair must then
/// have removed the row if it was acknowledged.
async fn delete_comment(
    db: &DatabaseConnection,
    id: i64,
    double_click: bool,
    refused: &mut u64,
) -> Result<(u64, u64, bool), TaskError> {
    let delete = || {
        let row = comment::ActiveModel {
            id: Set(id),
            ..Default::default()
        };
        comment::Entity::delete_counted(db, row)
    };
    let sent = if double_click {
        let (first, second) = tokio::join!(delete(), delete());
        vec![first, second]
    } else {
        vec![delete().await]
    };
    let (mut removed, mut found_gone, mut acked) = (0, 0, false);
    for written in sent {
        if let Some(result) = acknowledged(written, refused)? {
            acked = true;
            if result.rows_affected > 0 {
                removed += result.rows_affected;
            } else {
                found_gone += 1;
            }
        }
    }
    let expected_removals = u64::from(acked);
    if removed != expected_removals {
        return Err(format!(
            "deleting my comment {id} ({}): {removed} deletes removed it and {found_gone} \
             found it gone; expected {expected_removals} removal{}, since it was there \
             and only I delete it",
            if double_click {
                "two deletes at once"
            } else {
                "one delete"
            },
            if expected_removals == 1 { "" } else { "s" },
        )
        .into());
    }
    Ok((removed, found_gone, acked))
}

/// The write's value if it was acknowledged. A conflict still there after
/// the library's retries was rolled back by the database: not acknowledged
/// (`None`), not expected in the totals. Any other error ends the run.
fn acknowledged<T>(
    written: Result<T, CounterError>,
    refused: &mut u64,
) -> Result<Option<T>, CounterError> {
    match written {
        Ok(value) => Ok(Some(value)),
        Err(CounterError::Conflict { .. }) => {
            *refused += 1;
            Ok(None)
        }
        Err(err) => Err(err),
    }
}
