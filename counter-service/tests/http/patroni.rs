//! A Patroni failover under load, on `deploy/ha/`: keyed adds through
//! HAProxy to the service's instances (PgBouncer in transaction pooling,
//! HAProxy to the leader), and the library's own paths (`increment`,
//! `DeltaBatch`, a `CounterBuffer`'s flush) on PgBouncer beside them, while
//! the leader's PostgreSQL is SIGKILLed and, later, switched over by plan.
//!
//! With `synchronous_mode`, every add answered 200 is in the totals on the
//! new leader and every resent key is applied once (`load`). Nothing is
//! answered 500: a failover is a 503 with `Retry-After`, and the library's
//! errors are `Transient`. The window (the longest time no add was answered
//! 200, from the event to the next) is measured. Without it (asynchronous
//! standbys), what a failover loses is measured, not asserted: the guide's
//! case for the setting. Last, the cache's Redis master is SIGKILLed under
//! the same load: the instances follow the master the Sentinels promote,
//! and no client reads its own total below what it was answered 200 for.
//! Through all of it, `counts:watch` streams on each instance and through
//! HAProxy follow the clients' owners: with `synchronous_mode` every stream
//! stays open, none shows a total lower than one it showed before, and once
//! the load stops every stream shows the totals stored on the new leader.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use counter_core::{CounterBuffer, CounterTable, Counters, DeltaBatch, ErrorKind, FlushLedger};
use counter_tests::figures;
use hyper::Method;
use sea_orm::{ConnectOptions, Database, DatabaseConnection};

use crate::{
    load::{Load, percentile},
    support::Api,
    topology::Topology,
    watchers::{self, Watchers},
};

/// Clients sending keyed adds, each its own owner.
const CLIENTS: u64 = 8;
/// How long a cluster may take to heal after an event.
const HEAL: Duration = Duration::from_secs(90);
/// How long the watchers may take to show the stored totals once the load
/// stops: a lost change is caught by the 30 s read of every watched total.
const WATCH_CONVERGE: Duration = Duration::from_secs(40);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ha_patroni_failover_keeps_every_add() {
    failovers("ha_patroni_failover", 17200, true).await;
}

/// Asynchronous standbys, where `COUNTER_TEST_HA_ASYNC` is set as well (a
/// measurement for the guide, not a promise: it may lose adds).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ha_patroni_async_failover_measured() {
    if std::env::var_os("COUNTER_TEST_HA_ASYNC").is_none() {
        eprintln!("ha_patroni_async_failover_measured: skipped, COUNTER_TEST_HA_ASYNC is not set");
        return;
    }
    failovers("ha_patroni_async_failover", 17400, false).await;
}

/// Kills and switches over the leader `COUNTER_TEST_HA_ROUNDS` times each
/// (default 1) under load, with Patroni's `synchronous_mode` `sync`.
async fn failovers(test: &str, port_base: u16, sync: bool) {
    let Some(ha) = Topology::up(test, port_base, 2, sync) else {
        return;
    };
    let rounds: usize = std::env::var("COUNTER_TEST_HA_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1);
    let load = Load::start(Api::new(ha.front()), CLIENTS);
    let watchers = Watchers::start(&[ha.instances(), vec![ha.front()]].concat(), CLIENTS);
    let stop = Arc::new(AtomicBool::new(false));
    let library = Library::start(&ha.pooler_url()).await;
    let library_task = tokio::spawn(library.run(stop.clone()));
    let readiness = tokio::spawn(watch_readiness(ha.instances(), stop.clone()));

    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut events = Vec::new();
    for round in 0..rounds {
        // Unplanned: the leader's postmaster SIGKILLed.
        let leader = ha.leader().expect("a leader");
        let at = Instant::now();
        ha.kill_postgres(&leader);
        await_new_leader(&ha, &leader).await;
        events.push(("kill", at));
        let ha = &ha;
        tokio::task::block_in_place(|| ha.await_healthy(sync, HEAL));
        tokio::time::sleep(Duration::from_secs(2)).await;
        // Planned: a switchover to the synchronous standby.
        let at = Instant::now();
        let (from, to) = tokio::task::block_in_place(|| ha.switchover());
        eprintln!("{test} round {round}: killed {leader}, switched over {from} -> {to}");
        events.push(("switchover", at));
        tokio::task::block_in_place(|| ha.await_healthy(sync, HEAL));
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // The cache's Redis master SIGKILLed: the Sentinels promote a replica,
    // every instance follows it, and no read is older than its add.
    let redis = ha.kill_redis_master();
    let at = Instant::now();
    let deadline = at + HEAL;
    while ha.redis_master().is_none_or(|m| m == redis) {
        assert!(
            Instant::now() < deadline,
            "no new Redis master within {HEAL:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let redis_promoted = at.elapsed();
    events.push(("redis", at));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let outcome = load.stop().await;
    stop.store(true, Ordering::Relaxed);
    let library = library_task.await.expect("the library's task");
    let unready = readiness.await.expect("the readiness watch");

    let primary = Database::connect(ha.primary_url())
        .await
        .expect("the new leader");
    let stored = scalar(
        &primary,
        "SELECT COALESCE(SUM(value), 0)::bigint FROM post_counters WHERE count_key = 'likes'",
    )
    .await;
    let (increments, buffered) = library.totals(&primary).await;
    let watch_converged = watchers.converge(stored, WATCH_CONVERGE).await;
    let watched = watchers.stop().await;
    for seen in &watched {
        eprintln!("{test}: {seen}");
    }

    let mut windows = [Vec::new(), Vec::new(), Vec::new()];
    for (i, (what, at)) in events.iter().enumerate() {
        let until = events
            .get(i + 1)
            .map_or(*at + Duration::from_secs(60), |next| next.1);
        let ms = outcome.window_ms(*at, until);
        eprintln!("{test}: {what}: no add answered 200 for {ms} ms");
        windows[match *what {
            "kill" => 0,
            "switchover" => 1,
            _ => 2,
        }]
        .push(ms);
    }
    for w in &mut windows {
        w.sort_unstable();
    }
    let failed = outcome.failed();
    let library_lost = (library.ok as i64 - increments).max(0) as u64;
    figures(
        test,
        "postgres",
        &[
            ("kills", rounds as u64),
            ("switchovers", rounds as u64),
            ("acked", outcome.acked),
            ("lost", outcome.lost + library_lost),
            ("doubled", outcome.doubled),
            ("stale", outcome.stale),
            (
                "answered_500",
                failed.iter().filter(|s| **s >= 500).count() as u64,
            ),
            ("unanswered", outcome.unanswered()),
            ("bare_503", outcome.bare_503()),
            ("retries", outcome.retries()),
            ("kill_window_p50_ms", percentile(&windows[0], 50)),
            ("kill_window_max_ms", percentile(&windows[0], 100)),
            ("switchover_window_p50_ms", percentile(&windows[1], 50)),
            ("switchover_window_max_ms", percentile(&windows[1], 100)),
            ("redis_kills", 1),
            ("redis_promoted_ms", redis_promoted.as_millis() as u64),
            ("redis_window_ms", percentile(&windows[2], 100)),
            ("readyz_503_seen", unready),
            ("library_ok", library.ok),
            ("library_in_doubt", library.in_doubt),
            ("buffer_accepted", library.buffered),
        ]
        .into_iter()
        .chain(watchers::figures(&watched, watch_converged))
        .collect::<Vec<_>>(),
    );
    assert!(
        failed.is_empty(),
        "answers other than 200 and 503: {failed:?}"
    );
    assert_eq!(outcome.unanswered(), 0, "a request cut without an answer");
    assert_eq!(
        outcome.bare_503(),
        0,
        "503s without problem+json and Retry-After (the balancer's own)"
    );
    assert!(
        library.wrong_kinds.is_empty(),
        "library errors a retry cures, not classed Transient: {:?}",
        library.wrong_kinds
    );
    for instance in ha.instances() {
        let ready = Api::new(instance.clone()).get("/readyz", None).await;
        assert_eq!(ready.status, 200, "{instance} ready again: {}", ready.text);
    }
    if !sync {
        return;
    }
    assert_eq!(
        (outcome.lost, outcome.doubled, outcome.stale, stored),
        (0, 0, 0, outcome.acked as i64),
        "every add answered 200 counted once, on the new leader too"
    );
    // The streams stay open through both failovers (the service retries
    // its reads and subscribes again), and never step back.
    assert!(
        watched
            .iter()
            .all(|w| w.stepped_back == 0 && w.events > 0 && w.ended.is_empty()),
        "a watch stream ended, or showed a total lower than one it showed before: {watched:?}"
    );
    assert!(
        watch_converged.is_some(),
        "the watch streams did not show the stored totals ({stored}) within {WATCH_CONVERGE:?} of the load's end: {watched:?}"
    );
    // Plain increments and batches whose COMMIT reply was lost may have
    // counted (in doubt); the buffer's ledger applies each flush once.
    assert!(
        increments >= library.ok as i64 && increments <= (library.ok + library.in_doubt) as i64,
        "library adds: {increments} counted, {} answered Ok, {} in doubt",
        library.ok,
        library.in_doubt
    );
    assert_eq!(
        buffered, library.buffered as i64,
        "every buffered add flushed once"
    );
}

/// Polls every instance's `/readyz` until `stop`; returns how many polls
/// answered 503 (an instance that said it could not write).
async fn watch_readiness(instances: Vec<String>, stop: Arc<AtomicBool>) -> u64 {
    let apis: Vec<Api> = instances.into_iter().map(Api::new).collect();
    let mut unready = 0;
    while !stop.load(Ordering::Relaxed) {
        for api in &apis {
            if let Ok(reply) = api.try_call(Method::GET, "/readyz", None, &[], None).await
                && reply.status == 503
            {
                unready += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    unready
}

/// Waits until a member other than `old` leads.
async fn await_new_leader(ha: &Topology, old: &str) {
    let deadline = Instant::now() + HEAL;
    loop {
        if ha.leader().is_some_and(|l| l != old) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no new leader within {HEAL:?}\n{}",
            ha.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn scalar(db: &DatabaseConnection, sql: &str) -> i64 {
    let statement = sea_orm::Statement::from_string(sea_orm::DbBackend::Postgres, sql);
    counter_core::pooling::query_one(db, statement)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .expect("a row")
        .try_get_by_index(0)
        .unwrap()
}

/// The library's paths on PgBouncer: `increment` and `DeltaBatch` (whose
/// errors must be `Transient`, and whose lost `COMMIT` replies leave them
/// in doubt) and a `CounterBuffer` (whose ledger applies each flush once).
struct Library {
    db: DatabaseConnection,
    counters: Counters<i64>,
    buffer: CounterBuffer,
}

/// What the library's task saw.
struct LibraryRun {
    ok: u64,
    in_doubt: u64,
    buffered: u64,
    wrong_kinds: Vec<String>,
}

impl LibraryRun {
    /// The totals on the leader: increments and batches (owner 1), the
    /// buffer's (owner 2).
    async fn totals(&self, db: &DatabaseConnection) -> (i64, i64) {
        let sum = |owner| {
            format!(
                "SELECT COALESCE(SUM(value), 0)::bigint FROM ha_library WHERE owner_id = {owner}"
            )
        };
        (scalar(db, &sum(1)).await, scalar(db, &sum(2)).await)
    }
}

impl Library {
    async fn start(pooler_url: &str) -> Library {
        let mut options = ConnectOptions::new(pooler_url.to_owned());
        options
            .max_connections(4)
            .connect_timeout(Duration::from_secs(5));
        let db = Database::connect(options).await.expect("PgBouncer");
        let counters = Counters::<i64>::new(CounterTable::new("ha_library").unwrap());
        counters
            .create_table(&db)
            .await
            .expect("the library's table");
        FlushLedger::default()
            .create_table(&db)
            .await
            .expect("the ledger");
        let buffer = CounterBuffer::builder(&db)
            .interval(Duration::from_millis(200))
            .start()
            .await
            .expect("a buffer");
        Library {
            db,
            counters,
            buffer,
        }
    }

    async fn run(self, stop: Arc<AtomicBool>) -> LibraryRun {
        let mut run = LibraryRun {
            ok: 0,
            in_doubt: 0,
            buffered: 0,
            wrong_kinds: Vec::new(),
        };
        let mut turn = 0u64;
        while !stop.load(Ordering::Relaxed) {
            turn += 1;
            let result = if turn.is_multiple_of(2) {
                self.counters.increment(&self.db, 1, "taps").await
            } else {
                let mut batch = DeltaBatch::new();
                batch.increment(&self.counters, 1, "taps").unwrap();
                batch.apply(&self.db).await.map(drop)
            };
            match result {
                Ok(()) => run.ok += 1,
                Err(e) => {
                    run.in_doubt += 1;
                    if e.kind() != ErrorKind::Transient {
                        run.wrong_kinds.push(format!("{:?}: {e}", e.kind()));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            match self.buffer.add(&self.counters, 2, "taps", 1) {
                Ok(()) => run.buffered += 1,
                Err(e) => run.wrong_kinds.push(format!("buffer add: {e}")),
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if let Err(e) = self.buffer.shutdown().await {
            run.wrong_kinds.push(format!("buffer shutdown: {e}"));
        }
        run
    }
}
