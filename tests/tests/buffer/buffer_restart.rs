//! Fault injection: the PostgreSQL server behind a write-behind buffer is
//! restarted (once cutting every connection at once, once cleanly) while the
//! buffer flushes every few milliseconds and producers keep adding. Every
//! acknowledged add must end up stored exactly once.
//!
//! PostgreSQL only, by nature: the test runs a private server of its own
//! ([`counter_tests::servers::PrivatePostgres`]: initdb + pg_ctl, in a
//! temporary directory, on a free port) so it can stop and start it without
//! touching the shared one. It runs when `COUNTER_TEST_POSTGRES_URL` is set
//! (the sign of a PostgreSQL-capable machine; its URL is not used) and fails
//! if the private server cannot be set up.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering::SeqCst},
    },
    time::{Duration, Instant},
};

use counter_core::{CounterBuffer, CounterError, Counters, FlushLedger};
use counter_tests::{
    POSTGRES_URL_VAR, counters, raw,
    servers::{self, PrivatePostgres, PrivateServer, Stop},
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::DatabaseConnection;

const TABLE: &str = "restart_counters";
const KEYS: [&str; 3] = ["views", "likes", "shares"];
const OWNERS: i64 = 6;
const ADDERS: u64 = 16;
/// Adds run alone before the first restart, between the two and after.
const PHASE: Duration = Duration::from_secs(2);
/// The least time the server stays down at each restart.
const DOWN: Duration = Duration::from_secs(1);

/// What one adder had acknowledged: the sum per counter, and how many adds.
type Acked = (HashMap<(i64, &'static str), i64>, u64);

/// Adds to random counters through the buffer until `stop`, keeping only
/// the adds that returned `Ok`.
async fn adder(
    buffer: CounterBuffer,
    counters: Counters<i64>,
    seed: u64,
    stop: Arc<AtomicBool>,
    acked_total: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
) -> Acked {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut sums = HashMap::new();
    let mut acked = 0u64;
    let mut n = 0u64;
    while !stop.load(SeqCst) {
        let owner = rng.random_range(1..=OWNERS);
        let key = KEYS[rng.random_range(0..KEYS.len())];
        let delta = if rng.random_ratio(1, 8) { -1 } else { 1 };
        match buffer.add(&counters, owner, key, delta) {
            Ok(()) => {
                *sums.entry((owner, key)).or_insert(0) += delta;
                acked += 1;
                acked_total.fetch_add(1, SeqCst);
            }
            Err(e) => {
                refused.fetch_add(1, SeqCst);
                eprintln!("adder {seed}: buffer.add refused: {e}");
            }
        }
        n += 1;
        // Continuous, but leaving the CPU to the flusher and the server.
        if n.is_multiple_of(32) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    (sums, acked)
}

/// Stops the server, checks it is really unusable (a direct write fails
/// with a typed database error) while buffered adds go on, and starts it
/// again: down for at least [`DOWN`], and until a flush attempt has failed.
async fn restart(
    pg: &Arc<PrivatePostgres>,
    mode: Stop,
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    buffer: &CounterBuffer,
    acked_total: &AtomicU64,
) {
    servers::stop(pg, mode).await;
    let down_at = Instant::now();
    let acked_before = acked_total.load(SeqCst);
    let failed_before = buffer.stats().failed_attempts;

    let direct = counters.add(db, 1, "direct", 1).await;
    eprintln!("server down ({mode:?}): direct Counters::add -> {direct:?}");
    assert!(
        matches!(direct, Err(CounterError::Database(_))),
        "a direct add with the server down ({mode:?}) must fail with CounterError::Database, got {direct:?}"
    );
    // The buffer does not wait on the database: it takes adds meanwhile.
    buffer
        .add(counters, 1, "during_outage", 1)
        .expect("buffer.add while the server is down");

    // Stay down until a flush attempt has failed on the outage (bounded,
    // so a flusher that never tries fails the test instead of hanging it).
    let deadline = Instant::now() + Duration::from_secs(30);
    while buffer.stats().failed_attempts <= failed_before {
        assert!(
            Instant::now() < deadline,
            "no flush attempt failed while the server was down ({mode:?}): {:?}",
            buffer.stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "server down ({mode:?}): flush failing: {:?}",
        buffer.stats().last_error
    );
    let rest = DOWN.saturating_sub(down_at.elapsed());
    tokio::time::sleep(rest).await;
    let acked_down = acked_total.load(SeqCst) - acked_before;
    assert!(
        acked_down > 0,
        "the adders' buffer.add calls must keep succeeding while the server is down ({mode:?})"
    );
    servers::start(pg).await;
    eprintln!(
        "server back after {:.2} s down ({mode:?}); {acked_down} buffered adds acknowledged meanwhile",
        down_at.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restarted_during_a_flush_loop_loses_and_doubles_nothing() {
    if !servers::wanted(
        POSTGRES_URL_VAR,
        "postgres_restarted_during_a_flush_loop_loses_and_doubles_nothing",
    ) {
        return;
    }
    let began = Instant::now();
    let pg = servers::launch(PrivatePostgres::start).await;
    eprintln!("private PostgreSQL on port {} in {:?}", pg.port(), pg.dir());

    let db = servers::pool(&pg.url(), 16, Duration::from_secs(2)).await;
    let counters = counters::<i64>(TABLE, 16);
    counters.create_table(&db).await.expect("create the table");
    let ledger = FlushLedger::default();
    ledger.create_table(&db).await.expect("create the ledger");
    let buffer = CounterBuffer::builder(&db)
        .interval(Duration::from_millis(5))
        .start()
        .await
        .expect("start the buffer");

    let stop = Arc::new(AtomicBool::new(false));
    let acked_total = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let adders: Vec<_> = (0..ADDERS)
        .map(|seed| {
            tokio::spawn(adder(
                buffer.clone(),
                counters.clone(),
                seed,
                stop.clone(),
                acked_total.clone(),
                refused.clone(),
            ))
        })
        .collect();

    let mut restarts = 0;
    for mode in [Stop::Crash, Stop::Graceful] {
        tokio::time::sleep(PHASE).await;
        restart(&pg, mode, &db, &counters, &buffer, &acked_total).await;
        restarts += 1;
    }
    tokio::time::sleep(PHASE).await;

    stop.store(true, SeqCst);
    let mut expected: HashMap<(i64, &str), i64> = HashMap::new();
    let mut acked = 0u64;
    for adder in adders {
        let (sums, n) = adder.await.expect("an adder task");
        acked += n;
        for (counter, sum) in sums {
            *expected.entry(counter).or_insert(0) += sum;
        }
    }
    // The two adds made by `restart` while the server was down.
    expected.insert((1, "during_outage"), restarts);
    acked += restarts as u64;

    let stats = tokio::time::timeout(Duration::from_secs(60), buffer.shutdown())
        .await
        .expect("shutdown() must finish once the server is back")
        .expect("shutdown() succeeds once the server is back");
    eprintln!(
        "adds acknowledged: {acked}; refused: {}; flushes: {}; failed attempts: {}; \
         replays skipped: {}; statements: {}; rows written: {}; restarts: {restarts}; \
         last error: {:?}; {:.1} s so far",
        refused.load(SeqCst),
        stats.flushes,
        stats.failed_attempts,
        stats.replays_skipped,
        stats.statements,
        stats.rows_written,
        stats.last_error,
        began.elapsed().as_secs_f64(),
    );

    assert_eq!(refused.load(SeqCst), 0, "no buffer.add may be refused");
    assert_eq!(stats.adds, acked, "every acknowledged add is counted once");
    assert_eq!(stats.pending_adds, 0, "nothing left unflushed: {stats:?}");
    assert!(
        stats.failed_attempts > 0,
        "the restarts must have made flushes fail: {stats:?}"
    );
    assert!(stats.flushes > 0, "{stats:?}");

    // Every stored total is exactly the sum of the acknowledged adds: none
    // lost, none applied twice.
    let owners: Vec<i64> = (1..=OWNERS).collect();
    let stored = counters
        .get_many(&db, &owners, &KEYS)
        .await
        .expect("read the totals");
    for owner in 1..=OWNERS {
        for key in KEYS {
            let want = expected.get(&(owner, key)).copied().unwrap_or(0);
            let got = stored.get(&owner).and_then(|k| k.get(key)).copied();
            assert_eq!(
                got.unwrap_or(0),
                want,
                "counter ({owner}, {key}): stored total vs acknowledged adds"
            );
        }
    }
    assert_eq!(
        counters.get(&db, 1, "during_outage").await.unwrap(),
        restarts,
        "the adds made while the server was down"
    );
    assert_eq!(
        counters.get(&db, 1, "direct").await.unwrap(),
        0,
        "the direct adds failed while the server was down: nothing stored"
    );
    assert_eq!(
        raw::count_rows(&db, ledger.name()).await,
        0,
        "a clean shutdown removes the buffer's ledger row"
    );
    counter_tests::figures(
        "buffer_server_restart",
        "postgres",
        &[
            ("adds", stats.adds),
            ("flushes", stats.flushes),
            ("faults_injected", restarts as u64),
            ("failed_attempts", stats.failed_attempts),
            ("replays_skipped", stats.replays_skipped),
            ("increments_lost", 0),
        ],
    );
    let total: i64 = expected.values().sum();
    eprintln!(
        "{} counters, net total {total}, all exact; test took {:.1} s",
        expected.len(),
        began.elapsed().as_secs_f64()
    );

    db.close().await.expect("close the pool");
    drop(pg);
}
