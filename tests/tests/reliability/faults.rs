//! Faults under direct writes: the server dies, or the connection is cut
//! inside a transaction. No acknowledged increment may be lost, nothing may
//! be half applied, and a call made while the server is down must fail
//! promptly with a typed error instead of hanging.
//!
//! * `restarted_under_direct_writes_*::{postgres,mysql}`: a private
//!   PostgreSQL or MariaDB server ([`counter_tests::servers`]) is crashed
//!   (`pg_ctl -m immediate` / `kill -9`) and later shut down cleanly, each
//!   time kept down for a while, under 16 tasks writing directly
//!   (`Counters::add` on the pool, multi-statement `DeltaBatch::apply`, adds
//!   in the caller's transaction).
//!   Every call is recorded: acknowledged, refused before reaching the
//!   server (a connection error from the pool), or in doubt (cut in flight:
//!   a `COMMIT` may have been applied with its reply lost). Each task has
//!   counters of its own, so every stored total is checked against that
//!   task's calls: at least the acknowledged sum, and the excess exactly
//!   the deltas of some subset of its in-doubt calls. Writers' calls made
//!   wholly while the server was down must all have failed (and there must
//!   be some); a probe's adds made meanwhile must each fail within the
//!   pool's acquire wait ([`WAIT`]) plus 2 s: that promptness comes from the
//!   pool's acquire timeout (`ConnectOptions::acquire_timeout`), which
//!   bounds how long a call waits for a connection to a dead server. After
//!   the last restart the writers run until every one of them has had a
//!   call succeed again. They run when the backend's URL variable is set.
//! * `a_connection_cut_mid_transaction_applies_nothing`: on every backend,
//!   a proxy ([`counter_tests::proxy`]) closes the connection after the
//!   k-th statement of a transaction: a `DeltaBatch` of several statements
//!   (more rows than one upsert takes, two tables, hundreds of owners) and
//!   the caller's own transaction of several adds. The call fails, the
//!   stored state is exactly the one before, and a retry on a healthy
//!   connection applies it once. SQLite has no server to cut: there the
//!   transaction is dropped mid-way (the `apply` future dropped after a few
//!   polls, the caller's `DatabaseTransaction` dropped after some adds), on
//!   a database file of the test's own (see `SqliteFile`).

use std::{
    collections::BTreeMap,
    future::Future,
    path::PathBuf,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering::SeqCst},
    },
    task::Poll,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use counter_core::{CounterError, Counters, DeltaBatch, limits::UPSERT_ROWS_PER_STATEMENT};
use counter_tests::{
    Backend, MYSQL_URL_VAR, POSTGRES_URL_VAR, TestDb, backend_test, counters, figures,
    proxy::Proxy,
    raw,
    servers::{self, PrivateMariaDb, PrivatePostgres, PrivateServer, Stop},
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbErr, TransactionTrait};

const KEYS: [&str; 3] = ["views", "likes", "shares"];

/// A counter: (table, owner, key).
type Counter = (&'static str, i64, &'static str);
/// What a call adds, per counter.
type Deltas = BTreeMap<Counter, i64>;

// ---------------------------------------------------------------------------
// A: the server restarted under direct writes.

const TABLE_A: &str = "fault_a";
const TABLE_B: &str = "fault_b";
const TASKS: usize = 16;
/// Writes run alone before the first fault, between the two and after.
const PHASE: Duration = Duration::from_millis(1500);
/// How long the server stays down each time.
const DOWN: Duration = Duration::from_millis(1500);
/// How long a call waits for a connection: shorter than [`DOWN`], so calls
/// made while the server is down fail while it is still down.
const WAIT: Duration = Duration::from_millis(400);
/// A call made while the server is down must fail within [`WAIT`] plus this.
const PROMPT_SLACK: Duration = Duration::from_secs(2);
/// After a restart, every task must have a call succeed within this long.
const RECOVERY: Duration = Duration::from_secs(30);
/// A call not finished after this long hangs: the test fails.
const CALL_LIMIT: Duration = Duration::from_secs(20);
/// The probe's counter, written by the controlling task.
const PROBE: Counter = (TABLE_A, 9_999, "probe");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `Counters::add` on the pool: one autocommitted upsert.
    Add,
    /// `DeltaBatch::apply` on the pool: two statements in a transaction.
    Batch,
    /// `begin`, three `Counters::add` on the transaction, `commit`.
    Transaction,
}

/// Everything one task did.
#[derive(Debug, Default)]
struct Record {
    acked: Deltas,
    acked_calls: u64,
    /// Failed calls that never reached the server (no connection).
    refused: u64,
    /// Failed calls that may have been applied.
    in_doubt: Vec<Deltas>,
    /// (started, finished, succeeded) per call.
    calls: Vec<(Instant, Instant, bool)>,
    /// Distinct error messages.
    errors: BTreeMap<String, u64>,
}

/// Adds `deltas` into `sum`, counter by counter.
fn accumulate(sum: &mut Deltas, deltas: impl IntoIterator<Item = (Counter, i64)>) {
    for (counter, delta) in deltas {
        *sum.entry(counter).or_insert(0) += delta;
    }
}

/// The `(counter, delta)` pairs of `deltas`.
fn pairs(deltas: &Deltas) -> impl Iterator<Item = (Counter, i64)> + '_ {
    deltas.iter().map(|(counter, delta)| (*counter, *delta))
}

impl Record {
    /// Records a call's outcome; `sent`: whether the failure may have
    /// reached the server with the writes (decided by the caller).
    fn outcome(
        &mut self,
        started: Instant,
        deltas: &Deltas,
        result: Result<(), (CounterError, bool)>,
    ) {
        let ok = result.is_ok();
        self.calls.push((started, Instant::now(), ok));
        match result {
            Ok(()) => {
                accumulate(&mut self.acked, pairs(deltas));
                self.acked_calls += 1;
            }
            Err((err, sent)) => {
                assert!(
                    matches!(err, CounterError::Database(_)),
                    "a call cut by the server's fault must fail with CounterError::Database, got {err:?}"
                );
                let message = err.to_string();
                assert!(
                    connectionish(&message),
                    "the error of a call cut by the server's fault must say the connection \
                     failed: {message}"
                );
                *self.errors.entry(shorten(&message)).or_insert(0) += 1;
                if sent {
                    self.in_doubt.push(deltas.clone());
                } else {
                    self.refused += 1;
                }
            }
        }
    }
}

/// Whether a database error says the connection failed (refused, lost,
/// closed, timed out waiting for one, the server going down).
fn connectionish(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "connect",
        "pool",
        "closed",
        "reset",
        "broken pipe",
        "refused",
        "eof",
        "end of file",
        "terminat",
        "shut",
        "server has gone away",
        "lost",
        "starting up",
        "recovery",
        "timed out",
    ]
    .iter()
    .any(|w| m.contains(w))
}

fn shorten(message: &str) -> String {
    message.chars().take(160).collect()
}

/// Whether a failed pool call never reached the server: the pool had no
/// connection to give (sea-orm maps a failed acquire to these two).
fn refused_by_pool(err: &CounterError) -> bool {
    matches!(
        err,
        CounterError::Database(DbErr::ConnectionAcquire(_) | DbErr::Conn(_))
    )
}

/// When each writer task last had a call succeed.
type Successes = Arc<Mutex<Vec<Option<Instant>>>>;

/// A task's loop of calls of one kind on counters of its own, until `stop`;
/// publishes when each call that succeeds ends in `successes[task]`.
async fn writer(
    task: usize,
    kind: Kind,
    db: DatabaseConnection,
    a: Counters<i64>,
    b: Counters<i64>,
    stop: Arc<AtomicBool>,
    successes: Successes,
) -> Record {
    let mut rng = StdRng::seed_from_u64(task as u64);
    let owners = [task as i64 * 100 + 1, task as i64 * 100 + 2];
    let mut record = Record::default();
    let pick = |rng: &mut StdRng| -> (bool, i64, &'static str, i64) {
        (
            rng.random_bool(0.5),
            owners[rng.random_range(0..owners.len())],
            KEYS[rng.random_range(0..KEYS.len())],
            rng.random_range(1..=3),
        )
    };
    while !stop.load(SeqCst) {
        let started = Instant::now();
        let mut deltas = Deltas::new();
        let result = match kind {
            Kind::Add => {
                let (_, owner, key, delta) = pick(&mut rng);
                deltas.insert((TABLE_A, owner, key), delta);
                bounded(a.add(&db, owner, key, delta)).await.map_err(|e| {
                    let sent = !refused_by_pool(&e);
                    (e, sent)
                })
            }
            Kind::Batch => {
                // Both tables, so two statements in a transaction.
                let mut batch = DeltaBatch::new();
                for table in [TABLE_A, TABLE_B] {
                    for _ in 0..2 {
                        let (_, owner, key, delta) = pick(&mut rng);
                        let counters = if table == TABLE_A { &a } else { &b };
                        batch
                            .add(counters, owner, key, delta)
                            .expect("a valid delta");
                        accumulate(&mut deltas, [((table, owner, key), delta)]);
                    }
                }
                bounded(batch.apply(&db)).await.map(drop).map_err(|e| {
                    let sent = !refused_by_pool(&e);
                    (e, sent)
                })
            }
            Kind::Transaction => {
                let mut adds = Vec::new();
                for _ in 0..3 {
                    let (in_a, owner, key, delta) = pick(&mut rng);
                    let table = if in_a { TABLE_A } else { TABLE_B };
                    accumulate(&mut deltas, [((table, owner, key), delta)]);
                    adds.push((in_a, owner, key, delta));
                }
                bounded(async {
                    // Failures before the COMMIT leave nothing behind; only
                    // a failed COMMIT is in doubt.
                    let txn = db
                        .begin()
                        .await
                        .map_err(|e| (CounterError::from(e), false))?;
                    for (in_a, owner, key, delta) in adds {
                        let counters = if in_a { &a } else { &b };
                        counters
                            .add(&txn, owner, key, delta)
                            .await
                            .map_err(|e| (e, false))?;
                    }
                    txn.commit()
                        .await
                        .map_err(|e| (CounterError::from(e), true))
                })
                .await
            }
        };
        let ok = result.is_ok();
        record.outcome(started, &deltas, result);
        if ok {
            let ended = record.calls.last().map(|(_, end, _)| *end);
            successes.lock().unwrap_or_else(PoisonError::into_inner)[task] = ended;
        }
    }
    record
}

/// `call`, which must finish within [`CALL_LIMIT`].
async fn bounded<T>(call: impl Future<Output = T>) -> T {
    tokio::time::timeout(CALL_LIMIT, call)
        .await
        .unwrap_or_else(|_| panic!("a call hung for {CALL_LIMIT:?}: it must fail or succeed"))
}

/// The non-zero stored totals of `keys` for the given owners of each
/// `(table, counters, owners)`, read with `get_many`.
async fn read_totals(
    db: &DatabaseConnection,
    tables: [(&'static str, &Counters<i64>, &[i64]); 2],
    keys: &[&'static str],
) -> Deltas {
    let mut totals = Deltas::new();
    for (table, counters, owners) in tables {
        let got = counters
            .get_many(db, owners, keys)
            .await
            .expect("read the totals");
        for (owner, by_key) in got {
            for key in keys {
                let total = by_key.get(*key).copied().unwrap_or(0);
                if total != 0 {
                    totals.insert((table, owner, key), total);
                }
            }
        }
    }
    totals
}

/// Indexes of calls in `doubts` whose deltas sum to `excess` exactly.
fn explain(excess: &Deltas, doubts: &[Deltas]) -> Option<Vec<usize>> {
    fn search(left: &Deltas, doubts: &[Deltas], from: usize, chosen: &mut Vec<usize>) -> bool {
        if left.values().all(|v| *v == 0) {
            return true;
        }
        for i in from..doubts.len() {
            let fits = doubts[i]
                .iter()
                .all(|(c, d)| left.get(c).copied().unwrap_or(0) >= *d);
            if !fits {
                continue;
            }
            let mut rest = left.clone();
            for (c, d) in &doubts[i] {
                *rest.get_mut(c).expect("fits") -= d;
            }
            chosen.push(i);
            if search(&rest, doubts, i + 1, chosen) {
                return true;
            }
            chosen.pop();
        }
        false
    }
    let mut chosen = Vec::new();
    search(excess, doubts, 0, &mut chosen).then_some(chosen)
}

/// Test A on `server`, launched at `began`.
async fn restarted_under_direct_writes<S: PrivateServer>(
    server: Arc<S>,
    backend: &str,
    began: Instant,
) {
    let db = servers::pool(&server.url(), TASKS as u32, WAIT).await;
    let a = counters::<i64>(TABLE_A, 8);
    let b = counters::<i64>(TABLE_B, 8);
    a.create_table(&db).await.expect("create table a");
    b.create_table(&db).await.expect("create table b");
    eprintln!(
        "[{backend}] private server on port {} ready in {:.1} s",
        server.port(),
        began.elapsed().as_secs_f64()
    );

    let stop = Arc::new(AtomicBool::new(false));
    let successes: Successes = Arc::new(Mutex::new(vec![None; TASKS]));
    let kinds = [Kind::Add, Kind::Batch, Kind::Transaction];
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let kind = kinds[task % kinds.len()];
            let handle = tokio::spawn(writer(
                task,
                kind,
                db.clone(),
                a.clone(),
                b.clone(),
                stop.clone(),
                successes.clone(),
            ));
            (kind, handle)
        })
        .collect();

    let mut probe = Record::default();
    let probe_deltas: Deltas = [(PROBE, 1)].into();
    // The probe's calls made while the server was down, and the slowest.
    let (mut probe_down_calls, mut probe_slowest) = (0u64, Duration::ZERO);
    // (server gone, restart begun): no call made wholly inside may succeed.
    let mut down = Vec::new();
    let faults = [Stop::Crash, Stop::Graceful];
    let mut back = began;
    for how in faults {
        tokio::time::sleep(PHASE).await;
        servers::stop(&server, how).await;
        let gone = Instant::now();
        // Direct adds fail, promptly (the pool gives up after WAIT), with a
        // typed connection error, for as long as the server is down.
        loop {
            let started = Instant::now();
            let result = bounded(a.add(&db, PROBE.1, PROBE.2, 1)).await;
            let took = started.elapsed();
            if probe_down_calls == 0 {
                eprintln!(
                    "[{backend}] server down ({how:?}): Counters::add -> {result:?} in {:.2} s",
                    took.as_secs_f64()
                );
            }
            assert!(
                matches!(result, Err(CounterError::Database(_))),
                "[{backend}] an add with the server down ({how:?}) must fail with \
                 CounterError::Database, got {result:?}"
            );
            probe_slowest = probe_slowest.max(took);
            assert!(
                took <= WAIT + PROMPT_SLACK,
                "[{backend}] an add with the server down ({how:?}) took {took:?} to fail: more \
                 than the pool's acquire wait {WAIT:?} + {PROMPT_SLACK:?}"
            );
            probe.outcome(
                started,
                &probe_deltas,
                result.map_err(|e| {
                    let sent = !refused_by_pool(&e);
                    (e, sent)
                }),
            );
            probe_down_calls += 1;
            if gone.elapsed() + WAIT >= DOWN {
                break;
            }
        }
        tokio::time::sleep(DOWN.saturating_sub(gone.elapsed())).await;
        let restarting = Instant::now();
        down.push((gone, restarting));
        servers::start(&server).await;
        // Calls succeed again.
        let deadline = Instant::now() + RECOVERY;
        loop {
            let started = Instant::now();
            let result = bounded(a.add(&db, PROBE.1, PROBE.2, 1)).await;
            let ok = result.is_ok();
            probe.outcome(
                started,
                &probe_deltas,
                result.map_err(|e| {
                    let sent = !refused_by_pool(&e);
                    (e, sent)
                }),
            );
            if ok {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "[{backend}] adds still fail {RECOVERY:?} after the restart ({how:?}): {:?}",
                probe.errors
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        back = Instant::now();
        eprintln!(
            "[{backend}] server back ({how:?}) after {:.2} s down",
            (back - gone).as_secs_f64()
        );
    }
    // The writers run until each has had a call succeed since the server
    // came back (or one of them has stopped: its panic is raised below).
    let deadline = Instant::now() + RECOVERY;
    loop {
        let behind: Vec<usize> = successes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .enumerate()
            .filter(|(_, ended)| !ended.is_some_and(|ended| ended > back))
            .map(|(task, _)| task)
            .collect();
        if behind.is_empty() || tasks.iter().any(|(_, handle)| handle.is_finished()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "[{backend}] tasks {behind:?} had no call succeed in the {RECOVERY:?} after the last \
             restart"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "[{backend}] every task succeeded again {:.2} s after the last restart",
        back.elapsed().as_secs_f64()
    );
    stop.store(true, SeqCst);

    let mut records = Vec::new();
    for (kind, handle) in tasks {
        let record = handle
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        records.push((kind, record));
    }
    records.push((Kind::Add, probe));

    // Every task's owners, and the probe's.
    let mut owners: Vec<i64> = (0..TASKS as i64)
        .flat_map(|t| [t * 100 + 1, t * 100 + 2])
        .collect();
    owners.push(PROBE.1);
    let mut keys = KEYS.to_vec();
    keys.push(PROBE.2);
    let totals = read_totals(&db, [(TABLE_A, &a, &owners), (TABLE_B, &b, &owners)], &keys).await;

    let (mut operations, mut acknowledged, mut refused, mut in_doubt) = (0, 0, 0, 0);
    let (mut writers_failed_while_down, mut in_doubt_applied, mut lost) = (0u64, 0u64, 0i64);
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut checked = Deltas::new();
    for (task, (kind, record)) in records.iter().enumerate() {
        operations += record.calls.len() as u64;
        acknowledged += record.acked_calls;
        refused += record.refused;
        in_doubt += record.in_doubt.len() as u64;
        for (message, n) in &record.errors {
            *errors.entry(message.clone()).or_insert(0) += n;
        }
        for &(start, end, ok) in &record.calls {
            let inside = down
                .iter()
                .any(|&(gone, restarting)| start >= gone && end <= restarting);
            if inside {
                assert!(
                    !ok,
                    "[{backend}] task {task} ({kind:?}): a call made while the server was down succeeded"
                );
                // The probe's own are counted apart (probe_down_calls).
                if task < TASKS {
                    writers_failed_while_down += 1;
                }
            }
        }
        // This task's counters: stored = acknowledged + some in-doubt calls.
        let mine: Vec<Counter> = totals
            .keys()
            .chain(record.acked.keys())
            .filter(|c| {
                if task == TASKS {
                    **c == PROBE
                } else {
                    c.1 / 100 == task as i64 && **c != PROBE
                }
            })
            .copied()
            .collect();
        let mut excess = Deltas::new();
        for counter in mine {
            let total = totals.get(&counter).copied().unwrap_or(0);
            let acked = record.acked.get(&counter).copied().unwrap_or(0);
            if total < acked {
                lost += acked - total;
            }
            excess.insert(counter, total - acked);
        }
        assert_eq!(
            lost, 0,
            "[{backend}] task {task} ({kind:?}): acknowledged increments are missing: {excess:?}"
        );
        let mut bound = Deltas::new();
        for doubt in &record.in_doubt {
            accumulate(&mut bound, pairs(doubt));
        }
        for (counter, extra) in &excess {
            let most = bound.get(counter).copied().unwrap_or(0);
            assert!(
                *extra <= most,
                "[{backend}] task {task} ({kind:?}): {counter:?} holds {extra} more than was \
                 acknowledged, but only {most} was in doubt"
            );
        }
        let chosen = explain(&excess, &record.in_doubt).unwrap_or_else(|| {
            panic!(
                "[{backend}] task {task} ({kind:?}): the excess over the acknowledged adds \
                 {excess:?} is no sum of in-doubt calls {:?}",
                record.in_doubt
            )
        });
        in_doubt_applied += chosen.len() as u64;
        for counter in excess.keys() {
            checked.insert(*counter, 0);
        }
    }
    // Nothing stored outside the tasks' counters.
    for counter in totals.keys() {
        assert!(
            checked.contains_key(counter),
            "[{backend}] {counter:?} is stored but was never written"
        );
    }
    eprintln!(
        "[{backend}] {operations} calls: {acknowledged} acknowledged, {refused} refused by the \
         pool, {in_doubt} in doubt ({in_doubt_applied} of them applied); \
         {writers_failed_while_down} writer calls made wholly while the server was down (all \
         failed); {probe_down_calls} probe calls while down, slowest to fail {:.2} s; errors: \
         {errors:#?}; {:.1} s",
        probe_slowest.as_secs_f64(),
        began.elapsed().as_secs_f64()
    );
    assert!(
        writers_failed_while_down > 0,
        "[{backend}] the writer tasks must have made calls wholly while the server was down"
    );
    assert!(acknowledged > 0);
    figures(
        "server_restart",
        backend,
        &[
            ("operations", operations),
            ("acknowledged", acknowledged),
            ("writers_failed_while_down", writers_failed_while_down),
            ("probe_failed_while_down", probe_down_calls),
            ("faults_injected", faults.len() as u64),
            ("in_doubt", in_doubt),
            ("in_doubt_applied", in_doubt_applied),
            ("increments_lost", lost as u64),
        ],
    );
    db.close().await.expect("close the pool");
    drop(server);
}

backend_test! {
    /// Test A on a private PostgreSQL cluster and on a private MariaDB server.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[backends(postgres, mysql)]
    async fn restarted_under_direct_writes_loses_no_acknowledged_increment(backend: Backend) {
        match backend {
            Backend::Postgres => {
                on_a_private_server(POSTGRES_URL_VAR, PrivatePostgres::start, "postgres").await
            }
            Backend::MySql => {
                on_a_private_server(MYSQL_URL_VAR, PrivateMariaDb::start, "mysql").await
            }
            Backend::Sqlite => unreachable!("no private SQLite server"),
        }
    }
}

/// Test A on a private server of the backend whose URL variable is `var`
/// (skipped when it is not set).
async fn on_a_private_server<S: PrivateServer>(var: &str, start: fn() -> S, backend: &str) {
    let test = format!("{backend}: restarted under direct writes");
    if !servers::wanted(var, &test) {
        return;
    }
    let began = Instant::now();
    let server = servers::launch(start).await;
    restarted_under_direct_writes(server, backend, began).await;
}

// ---------------------------------------------------------------------------
// B: a connection cut mid-transaction.

const CUT_A: &str = "cut_a";
const CUT_B: &str = "cut_b";
/// Owners in table `cut_a`: with three keys, more rows than one upsert.
const OWNERS_A: i64 = 400;
const OWNERS_B: i64 = 100;

/// Everything the cut test can see of the two tables: totals and rows.
#[derive(Debug, PartialEq, Eq)]
struct State {
    totals: Deltas,
    rows: (i64, i64),
}

async fn state(db: &DatabaseConnection, a: &Counters<i64>, b: &Counters<i64>) -> State {
    let owners_a: Vec<i64> = (1..=OWNERS_A).collect();
    let owners_b: Vec<i64> = (1..=OWNERS_B).collect();
    State {
        totals: read_totals(db, [(CUT_A, a, &owners_a), (CUT_B, b, &owners_b)], &KEYS).await,
        rows: (
            raw::count_rows(db, CUT_A).await,
            raw::count_rows(db, CUT_B).await,
        ),
    }
}

/// Round `round`'s batch: every owner and key of both tables, so
/// `cut_a` takes two upserts and `cut_b` one.
fn big_batch(a: &Counters<i64>, b: &Counters<i64>, round: i64) -> (DeltaBatch, Deltas) {
    let mut batch = DeltaBatch::new();
    let mut deltas = Deltas::new();
    for (table, counters, owners) in [(CUT_A, a, OWNERS_A), (CUT_B, b, OWNERS_B)] {
        for owner in 1..=owners {
            for (k, key) in KEYS.iter().enumerate() {
                let delta = round * 10 + owner % 7 + k as i64 + 1;
                batch
                    .add(counters, owner, *key, delta)
                    .expect("a valid delta");
                deltas.insert((table, owner, key), delta);
            }
        }
    }
    (batch, deltas)
}

/// Round `round`'s own transaction: four adds over both tables.
fn txn_adds(round: i64) -> Vec<(&'static str, i64, &'static str, i64)> {
    vec![
        (CUT_A, 1, "views", round + 1),
        (CUT_B, 2, "likes", 2),
        (CUT_A, 3, "shares", 3),
        (CUT_B, 1, "views", round + 4),
    ]
}

/// The totals of `before` plus `deltas` (the non-zero ones).
fn plus(before: &State, deltas: &Deltas) -> Deltas {
    let mut totals = before.totals.clone();
    accumulate(&mut totals, pairs(deltas));
    totals.retain(|_, v| *v != 0);
    totals
}

async fn run_txn(
    db: &DatabaseConnection,
    a: &Counters<i64>,
    b: &Counters<i64>,
    adds: &[(&'static str, i64, &'static str, i64)],
) -> Result<(), CounterError> {
    let txn = db.begin().await?;
    for &(table, owner, key, delta) in adds {
        let counters = if table == CUT_A { a } else { b };
        counters.add(&txn, owner, key, delta).await?;
    }
    txn.commit().await?;
    Ok(())
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "cut_mid_transaction"]
    async fn a_connection_cut_mid_transaction_applies_nothing(t: TestDb) {
        let backend = t.backend;
        let began = Instant::now();
        let a = counters::<i64>(CUT_A, 4);
        let b = counters::<i64>(CUT_B, 4);
        let rows_a = OWNERS_A as usize * KEYS.len();
        let rows_b = OWNERS_B as usize * KEYS.len();
        assert!(
            rows_a > UPSERT_ROWS_PER_STATEMENT,
            "cut_a must take two upserts"
        );
        let statements =
            rows_a.div_ceil(UPSERT_ROWS_PER_STATEMENT) + rows_b.div_ceil(UPSERT_ROWS_PER_STATEMENT);
        let rows = rows_a + rows_b;
        let tally = match backend {
            Backend::Sqlite => {
                let file = SqliteFile::open().await;
                a.create_table(&file.db).await.expect("create cut_a");
                b.create_table(&file.db).await.expect("create cut_b");
                let tally = dropped_mid_transaction(&file.db, &a, &b).await;
                file.db
                    .clone()
                    .close()
                    .await
                    .expect("close the SQLite file");
                tally
            }
            _ => {
                a.create_table(&t.db).await.expect("create cut_a");
                b.create_table(&t.db).await.expect("create cut_b");
                cut_through_proxy(&t, &a, &b, statements).await
            }
        };
        eprintln!(
            "[{backend}] {} batches of {rows} rows in {statements} statements, {} cut \
             mid-transaction, {} half applied, {} increments lost, {} dropped after COMMIT (applied \
             whole); {:.1} s",
            tally.batches,
            tally.cuts,
            tally.half_applied,
            tally.lost,
            tally.dropped_after_commit,
            began.elapsed().as_secs_f64()
        );
        figures(
            "cut_mid_transaction",
            backend,
            &[
                ("batches", tally.batches),
                ("cuts", tally.cuts),
                ("half_applied", tally.half_applied),
                ("increments_lost", tally.lost),
            ],
        );
        t.finish().await;
    }
}

/// What the cut test did and found on one backend.
#[derive(Debug, Default)]
struct Tally {
    /// Batch applications tried (cut or not) and retried.
    batches: u64,
    /// Transactions cut (or dropped) mid-way.
    cuts: u64,
    /// Cuts after which the stored state was not the one before.
    half_applied: u64,
    /// Increments missing after the retries.
    lost: u64,
    /// SQLite: `apply` futures dropped after their `COMMIT` was handed to
    /// the database, which applied the batch whole.
    dropped_after_commit: u64,
}

impl Tally {
    /// After a cut: the state must be the one before.
    fn untouched(&mut self, what: &str, before: &State, after: &State) {
        self.cuts += 1;
        if after != before {
            self.half_applied += 1;
        }
        assert!(
            after == before,
            "{what} left something behind: {}",
            difference(before, after)
        );
    }

    /// After a retry: every total is the one before plus `deltas`.
    fn applied_once(&mut self, what: &str, before: &State, deltas: &Deltas, after: &State) {
        let want = plus(before, deltas);
        for (counter, total) in &want {
            let got = after.totals.get(counter).copied().unwrap_or(0);
            self.lost += u64::try_from(total - got).unwrap_or(0);
        }
        assert!(
            after.totals == want,
            "{what}: the retry must apply it once: {}",
            difference(
                &State {
                    totals: want.clone(),
                    rows: after.rows
                },
                after
            )
        );
    }
}

/// How `after` differs from `before`, in a few lines.
fn difference(before: &State, after: &State) -> String {
    let mut changed: Vec<String> = Vec::new();
    let counters: std::collections::BTreeSet<_> =
        before.totals.keys().chain(after.totals.keys()).collect();
    let mut n = 0;
    for counter in counters {
        let (was, is) = (
            before.totals.get(counter).copied().unwrap_or(0),
            after.totals.get(counter).copied().unwrap_or(0),
        );
        if was != is {
            n += 1;
            if changed.len() < 6 {
                changed.push(format!("{counter:?}: {was} -> {is}"));
            }
        }
    }
    format!(
        "rows {:?} -> {:?}; {n} totals changed, e.g. {}",
        before.rows,
        after.rows,
        changed.join(", ")
    )
}

fn txn_deltas(adds: &[(&'static str, i64, &'static str, i64)]) -> Deltas {
    let mut deltas = Deltas::new();
    accumulate(
        &mut deltas,
        adds.iter()
            .map(|&(table, owner, key, delta)| ((table, owner, key), delta)),
    );
    deltas
}

/// PostgreSQL and MySQL: the proxy cuts the batch after each of its
/// statements in turn (and at its `COMMIT`), then the caller's transaction
/// after each of its adds (and at its `COMMIT`).
async fn cut_through_proxy(
    t: &TestDb,
    a: &Counters<i64>,
    b: &Counters<i64>,
    statements: usize,
) -> Tally {
    let backend = t.backend;
    let upstream = t.server_addr().expect("a server address");
    let proxy = Proxy::start(&upstream).await.expect("start the proxy");
    let cut_db = t
        .connect_via(&proxy.addr().to_string(), 1)
        .await
        .expect("connect through the proxy");
    let mut tally = Tally::default();
    let mut round = 0;
    // The batch: BEGIN, `statements` upserts, COMMIT; cut at each command
    // after the BEGIN.
    for commands in 0..=statements as u32 {
        round += 1;
        let what =
            format!("[{backend}] a batch cut after {commands} of its {statements} statements");
        let before = state(&t.db, a, b).await;
        let cuts = proxy.cuts();
        proxy.arm_cut_in_transaction(commands);
        let (batch, deltas) = big_batch(a, b, round);
        let result = bounded(batch.apply(&cut_db)).await;
        tally.batches += 1;
        assert_eq!(proxy.cuts(), cuts + 1, "{what}: the proxy cut it");
        assert!(
            matches!(result, Err(CounterError::Database(_))),
            "{what} must fail with CounterError::Database, got {result:?}"
        );
        tally.untouched(&what, &before, &state(&t.db, a, b).await);
        // A retry on a healthy connection applies it once.
        let (batch, _) = big_batch(a, b, round);
        let outcome = batch.apply(&t.db).await.expect("the retry applies");
        tally.batches += 1;
        assert_eq!(outcome.statements, statements);
        tally.applied_once(&what, &before, &deltas, &state(&t.db, a, b).await);
    }
    // The caller's own transaction: BEGIN, four adds, COMMIT.
    for commands in 1..=txn_adds(0).len() as u32 {
        round += 1;
        let what = format!("[{backend}] a transaction cut after {commands} command(s)");
        let before = state(&t.db, a, b).await;
        let cuts = proxy.cuts();
        proxy.arm_cut_in_transaction(commands);
        let adds = txn_adds(round);
        let result = bounded(run_txn(&cut_db, a, b, &adds)).await;
        assert_eq!(proxy.cuts(), cuts + 1, "{what}: the proxy cut it");
        assert!(
            matches!(result, Err(CounterError::Database(_))),
            "{what} must fail with CounterError::Database, got {result:?}"
        );
        tally.untouched(&what, &before, &state(&t.db, a, b).await);
        run_txn(&t.db, a, b, &adds)
            .await
            .expect("the transaction, retried on a healthy connection");
        tally.applied_once(
            &what,
            &before,
            &txn_deltas(&adds),
            &state(&t.db, a, b).await,
        );
    }
    assert_eq!(tally.cuts, proxy.cuts());
    cut_db.close().await.expect("close the proxied pool");
    tally
}

/// SQLite: the cut test's own database file, on one connection like the
/// harness's in-memory database; deleted on drop. A file, not memory: sqlx
/// pings a connection given back after a dropped call and replaces it if
/// that fails, and an in-memory database dies with its connection (the
/// replacement would find no tables at all). A file outlives the
/// connection, so what a dropped transaction left behind is still there to
/// be checked.
struct SqliteFile {
    db: DatabaseConnection,
    dir: PathBuf,
}

impl SqliteFile {
    async fn open() -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!("counter-cut-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {dir:?}: {e}"));
        let mut options = ConnectOptions::new(format!(
            "sqlite://{}?mode=rwc",
            dir.join("cut.db").display()
        ));
        options
            .max_connections(1)
            .min_connections(1)
            .sqlx_logging(false);
        let db = Database::connect(options)
            .await
            .expect("open the SQLite file");
        Self { db, dir }
    }
}

impl Drop for SqliteFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// SQLite: the `apply` future is dropped after 1, 2, 4, ... polls until one
/// finishes first (each drop leaves nothing, or the whole batch: on a pool
/// the batch runs to its end in a task of its own), and the caller's
/// transaction is dropped after each of its adds, without its `COMMIT`.
async fn dropped_mid_transaction(
    db: &DatabaseConnection,
    a: &Counters<i64>,
    b: &Counters<i64>,
) -> Tally {
    let mut tally = Tally::default();
    let mut round = 0;
    let mut polls = 1;
    loop {
        round += 1;
        let what = format!("[sqlite] a batch whose future was dropped after {polls} polls");
        let before = state(db, a, b).await;
        let (batch, deltas) = big_batch(a, b, round);
        let mut apply = Box::pin(batch.apply(db));
        let mut finished = None;
        for _ in 0..polls {
            let poll = std::future::poll_fn(|cx| Poll::Ready(apply.as_mut().poll(cx))).await;
            if let Poll::Ready(result) = poll {
                finished = Some(result);
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(apply);
        tally.batches += 1;
        let after = state(db, a, b).await;
        if let Some(result) = finished {
            result.expect("a batch left to finish applies");
            tally.applied_once("[sqlite] a batch left to finish", &before, &deltas, &after);
            break;
        }
        if after != before && after.totals == plus(&before, &deltas) {
            // Dropped once its COMMIT was under way (SQLite's worker thread
            // runs what it was handed): applied whole, like a lost reply.
            tally.cuts += 1;
            tally.dropped_after_commit += 1;
            polls *= 2;
            continue;
        }
        tally.untouched(&what, &before, &after);
        // The connection is usable again, and a retry applies it once.
        let (batch, _) = big_batch(a, b, round);
        batch.apply(db).await.expect("the retry applies");
        tally.batches += 1;
        tally.applied_once(&what, &before, &deltas, &state(db, a, b).await);
        polls *= 2;
        assert!(polls < 1 << 20, "the batch never finished");
    }
    // A batch `apply` on a pool runs in a task of its own (counter-core's
    // `detach`): dropping its future stops the wait, not the batch, so each
    // dropped batch is found applied whole, never half.
    assert!(tally.cuts > 0, "[sqlite] no batch was dropped midway");
    for done in 1..=txn_adds(0).len() {
        round += 1;
        let what = format!("[sqlite] a transaction dropped after {done} adds");
        let before = state(db, a, b).await;
        let adds = txn_adds(round);
        {
            let txn = db.begin().await.expect("begin");
            for &(table, owner, key, delta) in &adds[..done] {
                let counters = if table == CUT_A { a } else { b };
                counters.add(&txn, owner, key, delta).await.expect("an add");
            }
            // Dropped without COMMIT.
        }
        tally.untouched(&what, &before, &state(db, a, b).await);
        run_txn(db, a, b, &adds)
            .await
            .expect("the retried transaction");
        tally.applied_once(&what, &before, &txn_deltas(&adds), &state(db, a, b).await);
    }
    tally
}
