//! A fleet of three instances behind HAProxy (`deploy/ha/`), restarted one
//! at a time under keyed adds and reads (`deploy/ha/roll`), `migrate` run
//! from two processes at once while the old instances serve: 0 lost, 0
//! doubled, 0 stale, and every request answered 200 (a draining instance
//! says so on `/readyz` and closes each connection after its answer, so
//! HAProxy moves away before a connection is refused or cut), each
//! instance's shutdown logged. Three `counts:watch` streams through
//! HAProxy follow the adds' owners: each is ended with `draining` when its
//! instance stops, opened again on another, never shows a total lower than
//! one it showed, and ends on the stored totals (every acknowledged add,
//! as asserted before).

use std::time::{Duration, Instant};

use counter_tests::figures;

use crate::{
    load::Load,
    support::Api,
    topology::Topology,
    watchers::{self, Watchers},
};

/// How long the watchers may take to show every acknowledged add once the
/// load stops.
const WATCH_CONVERGE: Duration = Duration::from_secs(40);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ha_fleet_rolling_restart() {
    let Some(ha) = Topology::up("ha_fleet", 17300, 3, true) else {
        return;
    };
    let rounds: usize = std::env::var("COUNTER_TEST_HA_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1);
    let load = Load::start(Api::new(ha.front()), 8);
    let watchers = Watchers::start(&vec![ha.front(); 3], 8);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let started = Instant::now();
    let mut printed = String::new();
    for _ in 0..rounds {
        // The next release's `migrate`, twice at once, while the old serve.
        let migrations: Vec<_> = (0..2)
            .map(|_| {
                tokio::process::Command::new(env!("CARGO_BIN_EXE_counter-service"))
                    .arg("--config")
                    .arg(ha.service_config())
                    .arg("migrate")
                    .output()
            })
            .collect();
        for migration in migrations {
            let output = migration.await.expect("run migrate");
            assert!(
                output.status.success(),
                "migrate beside another, the old instances serving: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let ha = &ha;
        printed.push_str(&tokio::task::block_in_place(|| ha.roll()));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let rolled = started.elapsed();
    let outcome = load.stop().await;
    let watch_converged = watchers
        .converge(outcome.stored as i64, WATCH_CONVERGE)
        .await;
    let watched = watchers.stop().await;
    eprint!("{printed}");
    for seen in &watched {
        eprintln!("ha_fleet: {seen}");
    }
    let stops: Vec<u64> = printed
        .lines()
        .filter_map(|l| l.split("stopped in ").nth(1))
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect();
    let refused = outcome
        .answers
        .iter()
        .filter(|a| a.status != Some(200))
        .count() as u64;
    figures(
        "ha_fleet_restart",
        "postgres",
        &[
            ("restarts", stops.len() as u64),
            ("acked", outcome.acked),
            ("lost", outcome.lost),
            ("doubled", outcome.doubled),
            ("stale", outcome.stale),
            ("unanswered", outcome.unanswered()),
            ("not_200", refused),
            ("stop_max_ms", stops.iter().copied().max().unwrap_or(0)),
            ("rolled_ms", rolled.as_millis() as u64),
        ]
        .into_iter()
        .chain(watchers::figures(&watched, watch_converged))
        .collect::<Vec<_>>(),
    );
    assert_eq!(
        stops.len(),
        3 * rounds,
        "every instance restarted: {printed}"
    );
    assert_eq!(
        (
            outcome.lost,
            outcome.doubled,
            outcome.stale,
            outcome.unanswered(),
            refused
        ),
        (0, 0, 0, 0, 0),
        "lost, doubled, stale, cut, refused"
    );
    // Every instance stopped, so every watcher's first stream ended, with
    // `draining` (a stream cut without it would be a connection).
    for seen in &watched {
        assert!(
            !seen.ended.is_empty() && seen.ended.iter().all(|why| why == "closed: draining"),
            "a watcher's streams ended by draining only, at least once: {seen:?}"
        );
        assert_eq!(
            seen.stepped_back, 0,
            "a watch stream stepped back: {seen:?}"
        );
    }
    assert!(
        watch_converged.is_some(),
        "the watch streams did not show the stored totals ({}) within {WATCH_CONVERGE:?}: {watched:?}",
        outcome.stored
    );
    for i in 0..3 {
        let log = ha.log(&format!("service{i}"));
        for line in [
            "shutting down: draining",
            "shutting down: no new connections",
            "stopped",
        ] {
            assert!(log.contains(line), "instance {i} logged '{line}':\n{log}");
        }
    }
}
