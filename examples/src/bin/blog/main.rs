//! The blog demo: many concurrent users liking, unliking, commenting on and
//! viewing posts, a few of which get most of the traffic; then the top posts
//! with all their counts fetched in one batch read, a recount of the
//! comments, and how many SQL statements each phase used.
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
//! database: totals add up across runs), simulates, reads, and checks that
//! every acknowledged write is in the totals: stored counts must equal the
//! counts read just before the simulation plus the deltas the simulated users
//! were told succeeded. Statements are counted with sea-orm's metric callback.
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
mod report;
mod seed;
mod simulate;

use std::{collections::HashMap, error::Error, process::ExitCode};

use clap::Parser;
use counter_core::prelude::*;
use entity::{comment, post, user};
use migration::{Migrator, MigratorTrait};
use sea_orm::{
    ConnectOptions, Database, DatabaseConnection, EntityTrait, PaginatorTrait,
    sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous},
};

use crate::{
    meter::{Meter, Phases},
    seed::seed,
    simulate::simulate,
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
    let posts_before = post::Entity::counts_many(&db, &post_ids).await?;
    let users_before = user::Entity::counts_many(&db, &user_ids).await?;
    phases.end("snapshot");

    let tally = simulate(&db, &post_ids, &user_ids, args.users, args.actions).await?;
    let simulation = phases.end("simulate");

    // Sorting by a counter in SQL (`ORDER BY likes` over the slot sums) comes
    // in a later issue; here every post's counts come in one batch read and
    // are sorted in memory. The posts are the ones `seed` returned: every
    // post in the database, so they need not be queried again.
    let before_load = meter.statements();
    let page = post::Entity::load_counts(&db, seeded.posts).await?;
    let post_reads = meter.statements() - before_load;
    let users_after = user::Entity::counts_many(&db, &user_ids).await?;
    let user_reads = meter.statements() - before_load - post_reads;
    phases.end("read");

    // Every post's comments counter against its rows, in one snapshot
    // statement per 1,000 posts. A dry run: checking must not repair, or a
    // failure would erase its own evidence.
    let recount = comment::recount(&db, true).await?;
    let comment_rows = comment::Entity::find().count(&db).await?;
    phases.end("reconcile");

    report::top_posts(&page, post_reads);
    report::top_users(&seeded.users, &users_after, user_reads);
    report::phases(phases.done());
    report::simulation(&tally, &simulation);

    // Every acknowledged write must be in the totals, no more, no less.
    let posts_after: HashMap<i64, post::counters::Counts> = page
        .iter()
        .map(|(post, counts)| (post.id, *counts))
        .collect();
    let mut mismatches =
        check::mismatches("post", &post_ids, &posts_before, &posts_after, &tally.posts);
    mismatches.extend(check::mismatches(
        "user",
        &user_ids,
        &users_before,
        &users_after,
        &tally.users,
    ));
    let totals = check::verdict(&mismatches, &tally);
    let comments = check::recount(&recount, comment_rows);
    match (totals, comments) {
        (Err(totals), Err(comments)) => Err(format!("{totals}; and {comments}").into()),
        (totals, comments) => Ok(totals.and(comments)?),
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
