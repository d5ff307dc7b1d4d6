//! The blog demo: many concurrent users liking, unliking, commenting on and
//! viewing posts, a few of which get most of the traffic; then compaction of
//! the slot rows they wrote, the most liked, viewed and followed ranked in
//! SQL, a daily views chart, a recount of the comments, and how many SQL
//! statements each phase used.
//!
//! Why slots: with a `likes` column, every like of a viral post is
//! `UPDATE posts SET likes = likes + 1 WHERE id = ?` on the same row, so the
//! writers of that post queue on its row lock, one at a time, however many
//! connections the pool has. Here each counter is spread over N slot rows of
//! `post_counters` (16 per key, 64 for views): a write upserts one slot row,
//! and successive writes of one counter take successive slots, so concurrent
//! writers of one post hold different row locks instead of queueing on one.
//! A read is a `SUM` over the slots, for a whole page of posts in one grouped
//! query.
//!
//! ```sh
//! cargo run -p examples --bin blog                 # SQLite file blog.db, created on first run
//! cargo run -p examples --bin blog -- --help       # --users, --actions, --posts
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/blog cargo run -p examples --bin blog
//! cargo run -p examples --bin blog -- --database-url mysql://root@127.0.0.1:3306/blog
//! ```
//!
//! The run migrates, seeds what is missing (so it can be run again on the same
//! database: totals add up across runs), simulates, and checks that every
//! acknowledged write is in the totals: stored counts must equal the counts
//! read just before the simulation plus the deltas the simulated users were
//! told succeeded. Statements are counted with sea-orm's metric callback.
//!
//! Views are counted per UTC day too (`views(window = day)`): each simulated
//! view is dated in the last [`CHART_DAYS`] days, more of them recent, and
//! counted with `add_at`, in its total and in its day's bucket. The check
//! covers the buckets as well: every post's views in those days must have
//! grown by exactly its acknowledged views.
//!
//! Then `compact` folds each counter's slot rows (and each day's bucket rows)
//! into one row, and the same check runs again: compaction must change no
//! total and no bucket. The report ranks posts by likes and views, and users
//! by followers, with `top_models` (the ranking is one grouped statement,
//! whatever the number of posts), charts the most viewed post's daily views
//! (`series`) and the top posts' (`series_many`), and sums their last week
//! (`range_many`).
//!
//! Comments are rows (`entity::comment`), and a post's `comments` counter is
//! their counter cache: a comment is inserted with `insert_counted` and
//! deleted with `delete_counted`, each in one transaction with its counter
//! write. Some deletes are double clicks, the same delete sent twice at
//! once: only one of the two removes the row and decrements. The last phase
//! recounts the comments of every post from the rows as a dry run
//! (`comment::recount`); the run fails unless every counter agrees with its
//! rows, and a failure leaves the drift in the database, untouched, for
//! inspection. Drift found before the run (counters from a version of this
//! demo whose comments had no rows, or left by a failed run) is repaired
//! first, with a warning listing it, so that the final recount judges this
//! run.
//!
//! On SQLite, sea-orm's pool has a single connection and the file has a single
//! writer anyway, so there is no row-lock queue to remove there: SQLite shows
//! the statement counts; PostgreSQL and MariaDB show the concurrency.

mod check;
mod meter;
mod read;
mod report;
mod seed;
mod simulate;

use std::{collections::HashMap, error::Error, process::ExitCode};

use chrono::{DateTime, TimeDelta, Utc};
use clap::Parser;
use counter_core::{Compact, CompactReport, Window, prelude::*};
use entity::{comment, post, user};
use migration::{Migrator, MigratorTrait};
use sea_orm::{
    ConnectOptions, Database, DatabaseConnection, EntityTrait, PaginatorTrait,
    sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous},
};

use crate::{
    meter::{Meter, Phases},
    seed::seed,
    simulate::{Tally, simulate},
};

/// Any failure ends the run; the demo has nothing to recover.
type BoxError = Box<dyn Error>;

/// The blog demo of slotted counters: concurrent users liking, unliking,
/// commenting on and viewing posts, then the top posts read in one batch.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Database URL: SQLite, PostgreSQL or MySQL/MariaDB
    // The value from the environment stays out of `--help`: it may hold a
    // password (see `redact`).
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        default_value = "sqlite://blog.db?mode=rwc"
    )]
    database_url: String,
    /// Concurrent simulated users, one task each
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    users: u64,
    /// Actions per simulated user
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    actions: u64,
    /// Posts to seed (the ones missing are inserted)
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    posts: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("blog: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), BoxError> {
    let meter = Meter::default();
    let db = connect(&args.database_url, &meter).await?;
    println!(
        "blog demo on {} ({:?}): {} users x {} actions",
        redact(&args.database_url),
        db.get_database_backend(),
        args.users,
        args.actions
    );
    let mut phases = Phases::new(&meter);
    let chart = ChartDays::ending_today(Utc::now(), CHART_DAYS);

    Migrator::up(&db, None).await?;
    phases.end("migrate");

    let seeded = seed(&db, args.posts as usize, args.users as usize).await?;
    phases.end("seed");
    println!(
        "seeded {} posts and {} users ({} and {} already there)",
        seeded.new_posts,
        seeded.new_users,
        seeded.posts.len() - seeded.new_posts,
        seeded.users.len() - seeded.new_users
    );

    // Repaired before the counts are read, so the check below starts from
    // counters that agree with the rows; what was repaired is printed.
    let inherited = comment::recount(&db, false).await?;
    check::inherited(&inherited);
    let post_ids: Vec<i64> = seeded.posts.iter().map(|p| p.id).collect();
    let user_ids: Vec<i64> = seeded.users.iter().map(|u| u.id).collect();
    let before = Totals::read(&db, &post_ids, &user_ids, &chart).await?;
    phases.end("snapshot");

    let tally = simulate(&db, &post_ids, &user_ids, args.users, args.actions, &chart).await?;
    let simulation = phases.end("simulate");

    // Every acknowledged write must be in the totals, no more, no less: every
    // post's and user's counts, and the views of the chart's days, each read
    // in one grouped statement per 1,000 owners.
    let simulated = Totals::read(&db, &post_ids, &user_ids, &chart).await?;
    let mismatches = before.mismatches(&simulated, &post_ids, &user_ids, &tally);
    // What the compaction below has to fold in the posts table, counted
    // apart from it, so that a compaction folding nothing cannot pass.
    let foldable = check::foldable_post_counters(&db).await?;
    phases.end("check");

    // Folding the slot rows the simulation wrote into slot 0: the reads
    // below sum fewer rows, and the totals must not change. Checked again,
    // against the same expectations.
    let compacted = Compacted {
        posts: post::Entity::counters()
            .compact(&db, &Compact::new())
            .await?,
        users: user::Entity::counters()
            .compact(&db, &Compact::new())
            .await?,
    };
    phases.end("compact");
    let after_compaction = Totals::read(&db, &post_ids, &user_ids, &chart).await?;
    let compaction_mismatches = before.mismatches(&after_compaction, &post_ids, &user_ids, &tally);
    phases.end("recheck");

    // What the report shows: rankings in SQL (`top`), never by reading every
    // post's counts, and the daily views of the chart's days.
    let reads = read::Reads::read(&db, &meter, &chart).await?;
    phases.end("read");

    // Every post's comments counter against its rows, in one snapshot
    // statement per 1,000 posts. A dry run: checking must not repair, or a
    // failure would erase its own evidence.
    let recount = comment::recount(&db, true).await?;
    let comment_rows = comment::Entity::find().count(&db).await?;
    phases.end("reconcile");

    report::most_liked(&reads.liked);
    report::most_viewed(&reads.viewed, &chart);
    report::daily_views(&reads.viewed, &chart);
    report::top_users(&reads.users);
    report::compaction(&compacted);
    report::phases(phases.done());
    report::simulation(&tally, &simulation);

    let mut failures = Vec::new();
    let checks = [
        ("after the simulation", &mismatches),
        ("after compaction", &compaction_mismatches),
    ];
    for (when, mismatches) in checks {
        if let Err(failure) = check::verdict(when, mismatches, &tally) {
            failures.push(failure);
        }
    }
    if let Err(failure) = check::compaction(&compacted.posts.totals, foldable, &tally) {
        failures.push(failure);
    }
    if let Err(failure) = check::recount(&recount, comment_rows) {
        failures.push(failure);
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; and ").into())
    }
}

/// Days in the daily views chart, today included.
const CHART_DAYS: i64 = 14;

/// The days of the daily views chart: whole UTC days, the last of them
/// today (so far). The simulation dates its views in them, and the check
/// and the chart read their buckets.
pub struct ChartDays {
    /// The start of the first day.
    pub from: DateTime<Utc>,
    /// The start of tomorrow: the end of the chart, exclusive.
    pub to: DateTime<Utc>,
    /// When the run started: no view is dated after it.
    pub now: DateTime<Utc>,
}

impl ChartDays {
    /// The `days` days up to today, in UTC.
    fn ending_today(now: DateTime<Utc>, days: i64) -> Self {
        let today = Window::Day.start_of(now);
        Self {
            from: today - TimeDelta::days(days - 1),
            to: today + TimeDelta::days(1),
            now,
        }
    }

    /// How many days the chart has.
    pub fn days(&self) -> i64 {
        (self.to - self.from).num_days()
    }

    /// The last `days` days of the chart, today included: `[from, to)`.
    pub fn last(&self, days: i64) -> (DateTime<Utc>, DateTime<Utc>) {
        (self.to - TimeDelta::days(days), self.to)
    }
}

/// What one pass of compaction did, per entity.
pub struct Compacted {
    pub posts: CompactReport,
    pub users: CompactReport,
}

/// The counts the check compares: every post's and user's totals, and every
/// post's views in the chart's daily buckets.
struct Totals {
    posts: HashMap<i64, post::counters::Counts>,
    users: HashMap<i64, user::counters::Counts>,
    views_by_day: HashMap<i64, i64>,
}

impl Totals {
    async fn read(
        db: &DatabaseConnection,
        post_ids: &[i64],
        user_ids: &[i64],
        chart: &ChartDays,
    ) -> Result<Self, BoxError> {
        Ok(Self {
            posts: post::Entity::counters().counts_many(db, post_ids).await?,
            users: user::Entity::counters().counts_many(db, user_ids).await?,
            views_by_day: post::Entity::counters()
                .range_many(
                    db,
                    post_ids,
                    post::counters::Key::Views,
                    chart.from,
                    chart.to,
                )
                .await?,
        })
    }

    /// Every counter of `now` that is not these counts plus what `tally`
    /// says was acknowledged since, one line each.
    fn mismatches(
        &self,
        now: &Totals,
        post_ids: &[i64],
        user_ids: &[i64],
        tally: &Tally,
    ) -> Vec<String> {
        let mut mismatches =
            check::mismatches("post", post_ids, &self.posts, &now.posts, &tally.posts);
        mismatches.extend(check::mismatches(
            "user",
            user_ids,
            &self.users,
            &now.users,
            &tally.users,
        ));
        mismatches.extend(check::view_buckets(
            post_ids,
            &self.views_by_day,
            &now.views_by_day,
            &tally.posts,
        ));
        mismatches
    }
}

/// Opens the pool with the meter already installed, so that no statement,
/// the migrations' included, goes uncounted.
async fn connect(url: &str, meter: &Meter) -> Result<DatabaseConnection, BoxError> {
    let mut options = ConnectOptions::new(url);
    // On SQLite, the settings of a write-heavy application: a write-ahead log,
    // synced at checkpoints rather than at every commit (ignored elsewhere).
    options.map_sqlx_sqlite_opts(|sqlite| {
        sqlite
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
    });
    let mut db = Database::connect(options).await?;
    // Set before any clone: clones share the pool and its callback.
    meter.install(&mut db);
    Ok(db)
}

/// The URL with its password, if any, hidden: the banner may end up in a
/// log or a bug report.
fn redact(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://")
        && let Some((userinfo, host)) = rest.rsplit_once('@')
        && let Some((user, _password)) = userinfo.split_once(':')
    {
        return format!("{scheme}://{user}:***@{host}");
    }
    url.to_owned()
}
