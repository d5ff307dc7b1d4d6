//! The demo's proofs: every write the simulated users were told succeeded is
//! in the stored totals, no more, no less, and every view in the daily
//! bucket of its day, both after the simulation and after compaction; that
//! the compaction after the simulation folded the posts table's counters;
//! and every post's `comments` counter equals its comment rows.

use std::collections::HashMap;

use counter_core::{CompactStats, ReconcileReport, prelude::*};
use entity::post::{self, counters::Key as PostKey};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Statement};

use crate::{report::plural, simulate::Tally};

/// How many mismatches are printed before the run fails: enough to see a
/// pattern, not a screenful.
const SHOWN: usize = 10;

/// Every counter of `owners` whose total is not `before + acknowledged`,
/// one line each. Totals from before the simulation, not zero, so that the
/// check holds on a database earlier runs have already written to.
pub fn mismatches<C: CountSet>(
    owner_kind: &str,
    owners: &[i64],
    before: &HashMap<i64, C>,
    after: &HashMap<i64, C>,
    deltas: &HashMap<(i64, C::Key), i64>,
) -> Vec<String> {
    let mut mismatches = Vec::new();
    for owner in owners {
        let (start, end) = (
            before.get(owner).cloned().unwrap_or_default(),
            after.get(owner).cloned().unwrap_or_default(),
        );
        for &key in C::Key::ALL {
            let delta = deltas.get(&(*owner, key)).copied().unwrap_or(0);
            let expected = start.get(key) + delta;
            if end.get(key) != expected {
                mismatches.push(format!(
                    "{owner_kind} {owner} {}: {} stored, {} before + {delta} acknowledged = {expected}",
                    key.as_key_str(),
                    end.get(key),
                    start.get(key)
                ));
            }
        }
    }
    mismatches
}

/// Every post whose views in the chart's daily buckets are not `before`
/// plus its acknowledged views: each view was dated in one of the chart's
/// days, so it must be in one of their buckets, as well as in the total.
pub fn view_buckets(
    posts: &[i64],
    before: &HashMap<i64, i64>,
    after: &HashMap<i64, i64>,
    deltas: &HashMap<(i64, PostKey), i64>,
) -> Vec<String> {
    let mut mismatches = Vec::new();
    for post in posts {
        let start = before.get(post).copied().unwrap_or(0);
        let end = after.get(post).copied().unwrap_or(0);
        let delta = deltas.get(&(*post, PostKey::Views)).copied().unwrap_or(0);
        if end != start + delta {
            mismatches.push(format!(
                "post {post} views in the chart's daily buckets: {end} stored, {start} before + \
                 {delta} acknowledged = {}",
                start + delta
            ));
        }
    }
    mismatches
}

/// Prints the outcome of the check `when` (after the simulation, after
/// compaction); an error message when any counter is off, so the run exits
/// non-zero and a CI job running the demo fails.
pub fn verdict(when: &str, mismatches: &[String], tally: &Tally) -> Result<(), String> {
    let (increments, decrements) = tally.writes();
    let writes = increments + decrements;
    if !mismatches.is_empty() {
        for line in mismatches.iter().take(SHOWN) {
            eprintln!("mismatch {when}: {line}");
        }
        return Err(format!(
            "{when}, {} counters are not their value before plus the {writes} acknowledged \
             writes (was another run writing to this database at the same time?)",
            mismatches.len()
        ));
    }
    println!(
        "{when}: {writes} counter writes acknowledged ({increments} increments, {decrements} \
         decrements), all {writes} are in the totals, and the {} views in their days' buckets",
        tally.actions.views
    );
    Ok(())
}

/// The post counters with two or more slot rows: what a compaction of the
/// posts table must fold. Counted in SQL of its own, not taken from the
/// compaction's report.
pub async fn foldable_post_counters(db: &DatabaseConnection) -> Result<i64, DbErr> {
    let table = post::Entity::counters().table().name().to_owned();
    let sql = format!(
        "SELECT COUNT(*) AS n FROM (SELECT owner_id FROM {table} \
         GROUP BY owner_id, count_key HAVING COUNT(*) >= 2) foldable"
    );
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await?
        .ok_or_else(|| DbErr::Custom("no row from COUNT(*)".into()))?;
    row.try_get("", "n")
}

/// The compaction's verdict on the posts table: when the simulation left
/// `foldable` counters with more than one slot row (see
/// [`foldable_post_counters`]), the compaction must have folded them, so
/// the table has fewer rows after it than before. A run so short that every
/// counter it wrote still has one row has nothing to fold.
pub fn compaction(posts: &CompactStats, foldable: i64, tally: &Tally) -> Result<(), String> {
    let (increments, decrements) = tally.writes();
    if foldable == 0 {
        println!(
            "compaction: after {} counter writes no post counter had more than one slot row: \
             nothing to fold",
            increments + decrements
        );
        return Ok(());
    }
    if posts.rows_after < posts.rows_before {
        println!(
            "compaction: {} post counters had more than one slot row; the posts table went \
             from {} to {} rows",
            foldable, posts.rows_before, posts.rows_after
        );
        return Ok(());
    }
    Err(format!(
        "the compaction after the simulation folded nothing: {} post counters had more than \
         one slot row, and the posts table has {} rows after it, {} before",
        foldable, posts.rows_after, posts.rows_before
    ))
}

/// The recount's verdict on the `comments` counter cache. A comment and its
/// counter change in one transaction, so the counters must agree with the
/// rows, even while another run writes to the same database (its writes move
/// the rows and the counters together). `report` is a dry run's, so a
/// failure leaves the drift in the database as found; the next run repairs
/// it (see [`inherited`]). `rows` is the comment rows in the database, for
/// the summary line.
pub fn recount(report: &ReconcileReport<i64>, rows: u64) -> Result<(), String> {
    println!(
        "reconcile: {} owners checked, {} drifted, total abs drift {}",
        report.owners_checked, report.owners_drifted, report.total_abs_drift
    );
    if report.owners_drifted == 0 {
        println!("comments: {rows} rows, counters agree");
        return Ok(());
    }
    print_drift("drift", report);
    Err(format!(
        "the comments counters of {} disagree with their comment rows after the run \
         (total abs drift {}; left as found, for inspection): a comment was written \
         without its counter, or a counter without its comment",
        plural(report.owners_drifted, "post"),
        report.total_abs_drift
    ))
}

/// The drift found and repaired before the run: counters written without
/// comment rows by something else, such as a version of this demo from
/// before comments were rows, or drift a failed run left for inspection.
/// A warning, not an error: the run's own check starts from repaired
/// counters, and an old database must keep working; but it says what was
/// repaired, post by post, so a real bug is not hidden by the next run.
pub fn inherited(report: &ReconcileReport<i64>) {
    if report.owners_drifted == 0 {
        return;
    }
    eprintln!(
        "warning: before the run, the comments counters of {} disagreed with their comment \
         rows (total abs drift {}), left by an earlier version of this demo or a failed \
         run; repaired to the row counts:",
        plural(report.owners_drifted, "post"),
        report.total_abs_drift
    );
    print_drift("warning: repaired", report);
}

/// The first [`SHOWN`] drifted posts of `report`, one line each, and how
/// many more there are.
fn print_drift(prefix: &str, report: &ReconcileReport<i64>) {
    for drift in report.drifted.iter().take(SHOWN) {
        eprintln!(
            "{prefix}: post {} has {} comment rows, its comments counter {} (drift {:+})",
            drift.owner, drift.truth, drift.current, drift.drift
        );
    }
    if report.drifted.len() > SHOWN {
        eprintln!("{prefix}: ... and {} more", report.drifted.len() - SHOWN);
    }
}
