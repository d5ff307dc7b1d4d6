//! The demo's proofs: every write the simulated users were told succeeded is
//! in the stored totals, no more, no less, and every view in the daily
//! bucket of its day, both after the simulation and after compaction; and
//! every post's `comments` counter equals its comment rows.

use std::collections::HashMap;

use counter_core::{ReconcileReport, prelude::*};
use entity::post::counters::Key as PostKey;

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
