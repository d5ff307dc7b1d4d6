//! The tables the run prints: the most liked and most viewed posts, the
//! daily views chart, the most followed users, compaction, statements per
//! phase, and the simulation's throughput.

use counter_core::{CompactStats, Series, prelude::*};
use entity::{post, user};

use crate::{
    ChartDays, Compacted,
    meter::Phase,
    read::{MostFollowed, MostLiked, MostViewed, RECENT_DAYS},
    simulate::Tally,
};

/// Width of the daily views chart's longest bar, in characters.
const BAR: usize = 40;

/// The most liked posts, ranked in SQL by `top_models`: the statements it
/// took do not grow with the number of posts.
pub fn most_liked(liked: &MostLiked) {
    println!(
        "\nmost liked posts (`top_models`: {}, the ranking and the posts; their counts and \
         views of the last {RECENT_DAYS} days: {} more):",
        plural(liked.ranked_with, "statement"),
        plural(liked.counts_with, "statement")
    );
    println!(
        "{:>6}  {:<40} {:>7} {:>9} {:>7} {:>7}",
        "id",
        "title",
        "likes",
        "comments",
        "views",
        format!("{RECENT_DAYS} days")
    );
    for (post, likes, counts, recent) in &liked.posts {
        println!(
            "{:>6}  {:<40} {:>7} {:>9} {:>7} {:>7}",
            post.id,
            truncate(&post.title, 40),
            likes,
            counts.comments,
            counts.views,
            recent
        );
    }
}

/// The most viewed posts, each with a sparkline of its daily views (one
/// `series_many` for all of them) and its views over the chart's days.
pub fn most_viewed(viewed: &MostViewed, chart: &ChartDays) {
    let days = chart.days();
    println!(
        "\nmost viewed posts (`top_models`: {}; the daily views of all {}, one `series_many`: {}):",
        plural(viewed.ranked_with, "statement"),
        viewed.posts.len(),
        plural(viewed.series_many_with, "statement")
    );
    println!(
        "{:>6}  {:<40} {:>7}  {:<width$} {:>7}",
        "id",
        "title",
        "views",
        "by day",
        format!("{days} days"),
        width = days as usize
    );
    for (post, views, series) in &viewed.posts {
        println!(
            "{:>6}  {:<40} {:>7}  {:<width$} {:>7}",
            post.id,
            truncate(&post.title, 40),
            views,
            sparkline(series),
            series.iter().map(|(_, n)| n).sum::<i64>(),
            width = days as usize
        );
    }
}

/// The hottest post's views per UTC day, one bar each, scaled to the
/// busiest day.
pub fn daily_views(viewed: &MostViewed, chart: &ChartDays) {
    let Some((post, _, series)) = viewed.posts.first() else {
        println!("\nno views yet: no daily views chart");
        return;
    };
    println!(
        "\ndaily views of post {} {:?}, UTC (its row of the `series_many` above):",
        post.id,
        truncate(&post.title, 40),
    );
    let max = series.iter().map(|&(_, n)| n).max().unwrap_or(0);
    let today = chart.to - chrono::TimeDelta::days(1);
    for &(day, views) in series {
        println!(
            "{}  {:<BAR$} {views:>6}{}",
            day.format("%Y-%m-%d"),
            bar(views, max),
            if day == today {
                "  (today, so far)"
            } else {
                ""
            }
        );
    }
}

/// The most followed users, ranked by `top_models` on their followers, a
/// counter written two at a time (a follow counts on both users).
pub fn top_users(followed: &MostFollowed) {
    println!(
        "\nmost followed users (`top_models` and their counts: {}):",
        plural(followed.read_with, "statement")
    );
    println!(
        "{:>6}  {:<16} {:>9} {:>9} {:>6}",
        "id", "name", "followers", "following", "posts"
    );
    for (user, counts) in &followed.users {
        println!(
            "{:>6}  {:<16} {:>9} {:>9} {:>6}",
            user.id, user.name, counts.followers, counts.following, counts.posts
        );
    }
}

/// Slot rows before and after compaction, per table.
pub fn compaction(compacted: &Compacted) {
    println!("\ncompaction (each counter's slot rows folded into its slot 0, online):");
    println!(
        "{:<22} {:>11} {:>10} {:>8} {:>7}",
        "table", "rows before", "rows after", "folded", "batches"
    );
    let posts = post::Entity::counters().table();
    let users = user::Entity::counters().table();
    let mut tables = vec![(posts.name().to_owned(), compacted.posts.totals)];
    if let Some(buckets) = posts.bucket_table() {
        tables.push((buckets, compacted.posts.buckets));
    }
    tables.push((users.name().to_owned(), compacted.users.totals));
    for (table, stats) in tables {
        let CompactStats {
            rows_before,
            rows_after,
            counters_folded,
            batches,
        } = stats;
        println!(
            "{table:<22} {rows_before:>11} {rows_after:>10} {counters_folded:>8} {batches:>7}"
        );
    }
    println!("(folded: counters, or a day's bucket of one, whose slot rows became one)");
}

/// One character per day, from ' ' (none) to '█' (the busiest day).
fn sparkline(series: &Series) -> String {
    const LEVELS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = series.iter().map(|&(_, n)| n).max().unwrap_or(0);
    series
        .iter()
        .map(|&(_, n)| match n {
            n if n <= 0 || max <= 0 => ' ',
            n => LEVELS[((n * 7 + max / 2) / max).clamp(0, 7) as usize],
        })
        .collect()
}

/// A bar of `value`, [`BAR`] characters for `max`; at least one for any
/// views, so a quiet day is not drawn as none.
fn bar(value: i64, max: i64) -> String {
    let width = match (value, max) {
        (v, m) if v <= 0 || m <= 0 => 0,
        (v, m) => ((v as f64 / m as f64 * BAR as f64).round() as usize).clamp(1, BAR),
    };
    "█".repeat(width)
}

/// Statements, failures and time per phase: where the SQL went.
pub fn phases(done: &[Phase]) {
    println!(
        "\n{:<9} {:>10} {:>7} {:>9}",
        "phase", "statements", "failed", "time"
    );
    for phase in done {
        println!(
            "{:<9} {:>10} {:>7} {:>7.3} s",
            phase.name,
            phase.statements,
            phase.failed,
            phase.elapsed.as_secs_f64()
        );
    }
    println!("(BEGIN and COMMIT are not reported to the metric callback: not counted)");
}

/// The actions by kind and their rate, and the writes refused, which the
/// check must not expect.
pub fn simulation(tally: &Tally, phase: &Phase) {
    let actions = tally.actions.total();
    let seconds = phase.elapsed.as_secs_f64().max(f64::EPSILON);
    println!(
        "\nsimulate: {actions} actions ({} views, {} likes, {} unlikes, {} comments, {} comment deletes, \
         {} follows, {} unfollows) in {seconds:.2} s: {:.0} actions/s, {:.2} statements per action",
        tally.actions.views,
        tally.actions.likes,
        tally.actions.unlikes,
        tally.actions.comments,
        tally.actions.deleted_comments,
        tally.actions.follows,
        tally.actions.unfollows,
        actions as f64 / seconds,
        phase.statements as f64 / actions.max(1) as f64
    );
    if tally.actions.repeated_deletes > 0 {
        println!(
            "{} repeated comment deletes (double clicks) found the comment already gone: \
             no row removed, no counter changed",
            tally.actions.repeated_deletes
        );
    }
    if tally.refused > 0 {
        println!(
            "{} writes refused after retries (conflicts): not acknowledged, not expected in the totals",
            tally.refused
        );
    }
}

/// "1 statement", "2 statements": the count is often 1, the point of batch
/// reads.
pub fn plural(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Cuts `text` to `width` characters, with an ellipsis, so a long title
/// cannot push the columns after it out of line.
fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_owned()
    } else {
        let mut short: String = text.chars().take(width - 1).collect();
        short.push('…');
        short
    }
}
