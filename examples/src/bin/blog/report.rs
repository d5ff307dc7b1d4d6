//! The tables the run prints: top posts, top users, statements per phase,
//! and the simulation's throughput.

use std::collections::HashMap;

use entity::{post, user};

use crate::{meter::Phase, simulate::Tally};

/// Posts in the top table: a page, enough to show the skew.
const TOP: usize = 10;
/// Users in the top table: fewer than posts, as only a few are followed
/// much.
const TOP_USERS: usize = 5;

/// The most liked posts. `reads` is the statements the counts of the whole
/// page took, the number batch reads are for.
pub fn top_posts(page: &[(post::Model, post::counters::Counts)], reads: u64) {
    let mut top: Vec<&(post::Model, post::counters::Counts)> = page.iter().collect();
    top.sort_by(|(a, ca), (b, cb)| cb.likes.cmp(&ca.likes).then(a.id.cmp(&b.id)));
    println!(
        "\ntop {TOP} posts by likes (the counts of all {} posts read with {}):",
        page.len(),
        plural(reads, "statement")
    );
    println!(
        "{:>6}  {:<40} {:>7} {:>9} {:>7}",
        "id", "title", "likes", "comments", "views"
    );
    for (post, counts) in top.iter().take(TOP) {
        println!(
            "{:>6}  {:<40} {:>7} {:>9} {:>7}",
            post.id,
            truncate(&post.title, 40),
            counts.likes,
            counts.comments,
            counts.views
        );
    }
}

/// The most followed users, for the counters written two at a time (a
/// follow counts on both users).
pub fn top_users(
    users: &[user::Model],
    by_user: &HashMap<i64, user::counters::Counts>,
    reads: u64,
) {
    let mut top: Vec<&user::Model> = users.iter().collect();
    let followers = |u: &user::Model| by_user.get(&u.id).map_or(0, |c| c.followers);
    top.sort_by(|a, b| followers(b).cmp(&followers(a)).then(a.id.cmp(&b.id)));
    println!(
        "\ntop {TOP_USERS} users by followers (the counts of all {} users read with {}):",
        users.len(),
        plural(reads, "statement")
    );
    println!(
        "{:>6}  {:<16} {:>9} {:>9} {:>6}",
        "id", "name", "followers", "following", "posts"
    );
    for user in top.iter().take(TOP_USERS) {
        let counts = by_user.get(&user.id).copied().unwrap_or_default();
        println!(
            "{:>6}  {:<16} {:>9} {:>9} {:>6}",
            user.id, user.name, counts.followers, counts.following, counts.posts
        );
    }
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
