//! The demo's proof: every write the simulated users were told succeeded is
//! in the stored totals, no more, no less.

use std::collections::HashMap;

use counter_core::prelude::*;

use crate::simulate::Tally;

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

/// Prints the outcome; an error message when any counter is off, so the run
/// exits non-zero and a CI job running the demo fails.
pub fn verdict(mismatches: &[String], tally: &Tally) -> Result<(), String> {
    let (increments, decrements) = tally.writes();
    let writes = increments + decrements;
    if !mismatches.is_empty() {
        for line in mismatches.iter().take(SHOWN) {
            eprintln!("mismatch: {line}");
        }
        return Err(format!(
            "{} counters are not their value before plus the {writes} acknowledged writes \
             (was another run writing to this database at the same time?)",
            mismatches.len()
        ));
    }
    println!(
        "{writes} counter writes acknowledged ({increments} increments, {decrements} decrements), \
         all {writes} are in the totals"
    );
    Ok(())
}
