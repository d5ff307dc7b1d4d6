//! The write-behind buffer (`CounterBuffer`) and the typed unit-of-work batch
//! (`DeltaBatch` with typed handles): adds folded in memory and flushed by a background
//! task, exactly once, whatever the flusher meets (concurrent producers, a
//! full buffer, a missing table, connections killed mid-flush).

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering::SeqCst},
    },
    time::Duration,
};

use chrono::{DateTime, TimeZone, Utc};
use counter_core::{
    BufferBuilder, BufferError, CounterBuffer, CounterError, CounterTable, Counters, DeltaBatch,
    FlushLedger, SlottedCounter, WhenFull, Window,
    limits::{MAX_BUFFER_CAPACITY, MAX_STRING_OWNER_LEN},
};
use counter_tests::{Backend, TestDb, backend_test, raw, sql::Sql};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, Statement, TransactionTrait,
    sea_query::{Alias, Expr, ExprTrait, Query},
};

/// Expected totals: (owner, key) -> sum of what the test added.
type Expected = HashMap<(i64, &'static str), i64>;

/// Safety net for waits on the flusher: long enough never to fire on a
/// healthy run, short enough to fail a hung test.
const PATIENCE: Duration = Duration::from_secs(60);

/// Counters in `name` with `slots` slots; `views` is also counted per day.
fn windowed(name: &str, slots: u16) -> Counters<i64> {
    Counters::new(
        CounterTable::new(name.to_owned())
            .and_then(|t| t.with_slots(slots))
            .and_then(|t| t.with_key_window("views", Window::Day))
            .expect("a valid table"),
    )
}

/// `buffer.flush()`, failing the test (with `what`) if it takes longer
/// than [`PATIENCE`] or fails.
async fn flush_within_patience(buffer: &CounterBuffer, what: &str) {
    tokio::time::timeout(PATIENCE, buffer.flush())
        .await
        .unwrap_or_else(|_| panic!("{what}: timed out"))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// A ledger with the default name, created on `t`.
async fn ledger(t: &TestDb) {
    FlushLedger::default().create_table(&t.db).await.unwrap();
}

/// Rows of the default ledger for `writer` (`None`: every writer).
async fn ledger_rows(db: &DatabaseConnection, writer: Option<&str>) -> i64 {
    let mut select = Query::select();
    select
        .expr_as(Expr::cust("COUNT(*)"), Alias::new("n"))
        .from(Alias::new(FlushLedger::DEFAULT_TABLE));
    if let Some(writer) = writer {
        select.and_where(Expr::col(Alias::new("writer_id")).eq(writer));
    }
    let row = Sql::new(db)
        .query_one(&select)
        .await
        .expect("read the ledger")
        .expect("a count");
    row.try_get::<i64>("", "n").expect("the count")
}

/// The ledger's `last_flush` for `writer`, if it has a row.
async fn ledger_last_flush(db: &DatabaseConnection, writer: &str) -> Option<i64> {
    let select = Query::select()
        .column(Alias::new("last_flush"))
        .from(Alias::new(FlushLedger::DEFAULT_TABLE))
        .and_where(Expr::col(Alias::new("writer_id")).eq(writer))
        .to_owned();
    Sql::new(db)
        .query_one(&select)
        .await
        .expect("read the ledger")
        .map(|row| row.try_get::<i64>("", "last_flush").expect("last_flush"))
}

/// Every expected total, read back with one `get_many` per key set.
async fn assert_totals(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    expected: &Expected,
    what: &str,
) {
    let mut owners: Vec<i64> = expected.keys().map(|(o, _)| *o).collect();
    owners.sort_unstable();
    owners.dedup();
    let mut keys: Vec<&str> = expected.keys().map(|(_, k)| *k).collect();
    keys.sort_unstable();
    keys.dedup();
    let stored = counters
        .get_many(db, &owners, &keys)
        .await
        .expect("read the totals");
    let mut wrong = Vec::new();
    for ((owner, key), want) in expected {
        let got = stored[owner][*key];
        if got != *want {
            wrong.push(format!("({owner}, {key}): stored {got}, added {want}"));
        }
    }
    wrong.sort();
    assert!(
        wrong.is_empty(),
        "{what}: {} of {} counters wrong: {:?}",
        wrong.len(),
        expected.len(),
        &wrong[..wrong.len().min(10)]
    );
}

/// The `views` buckets of each owner, from the day `from` starts in to the
/// end of the day `to` is in, must hold exactly the views added.
async fn assert_view_buckets(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    expected: &Expected,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    what: &str,
) {
    let (from, to) = (
        Window::Day.start_of(from),
        Window::Day.start_of(to) + chrono::Duration::days(1),
    );
    for ((owner, key), want) in expected {
        if *key != "views" {
            continue;
        }
        let range = counters
            .range(db, *owner, "views", from, to)
            .await
            .expect("read the buckets");
        assert_eq!(range, *want, "{what}: owner {owner}'s views buckets");
        let series = counters
            .series(db, *owner, "views", from, to)
            .await
            .expect("read the series");
        assert_eq!(
            series.iter().map(|(_, n)| n).sum::<i64>(),
            *want,
            "{what}: owner {owner}'s views series {series:?}"
        );
    }
}

/// Polls `done` until it holds; panics after [`PATIENCE`].
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn merge(into: &mut Expected, from: Expected) {
    for (counter, delta) in from {
        *into.entry(counter).or_insert(0) += delta;
    }
}

// ---------------------------------------------------------------------------

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn thirty_two_tasks_add_while_it_flushes_and_shutdown_leaves_exact_totals(t: TestDb) {
        const TASKS: u64 = 32;
        const ADDS: u64 = 3_000;
        const KEYS: [&str; 3] = ["likes", "views", "shares"];
        let b = t.backend;
        let counters = windowed("hot", 8);
        counters.create_table(&t.db).await.unwrap();
        ledger(&t).await;
        let buffer = CounterBuffer::builder(&t.db)
            .interval(Duration::from_millis(5))
            .flush_at(8)
            .start()
            .await
            .unwrap();
        let started = Utc::now();
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let (buffer, counters) = (buffer.clone(), counters.clone());
                tokio::spawn(async move {
                    let mut rng = StdRng::seed_from_u64(task);
                    let mut mine = Expected::new();
                    for i in 0..ADDS {
                        let owner = rng.random_range(1..=5i64);
                        let key = KEYS[rng.random_range(0..KEYS.len())];
                        let delta = match rng.random_range(0..3) {
                            0 => 1,
                            1 => -1,
                            _ => rng.random_range(2..=9i64),
                        };
                        buffer.add(&counters, owner, key, delta).unwrap();
                        *mine.entry((owner, key)).or_insert(0) += delta;
                        if i % 100 == 99 {
                            tokio::task::yield_now().await;
                        }
                        // Halfway through, task 0 waits for a committed
                        // flush: the rest of its adds come after it, so the
                        // buffer surely flushes during the adds and again.
                        if task == 0 && i == ADDS / 2 {
                            wait_until("a flush during the adds", || buffer.stats().flushes > 0)
                                .await;
                        }
                    }
                    mine
                })
            })
            .collect();
        let mut expected = Expected::new();
        for task in tasks {
            merge(&mut expected, task.await.unwrap());
        }
        let running = buffer.stats();
        assert!(running.flushes >= 1, "[{b}] {running:?}");
        assert_eq!(running.adds, TASKS * ADDS, "[{b}] {running:?}");
        assert_eq!(
            ledger_rows(&t.db, Some(buffer.writer_id())).await,
            1,
            "[{b}] a running buffer that flushed has its ledger row"
        );
        assert!(
            ledger_last_flush(&t.db, buffer.writer_id()).await >= Some(1),
            "[{b}]"
        );

        let stats = buffer.shutdown().await.unwrap();
        let finished = Utc::now();
        eprintln!("[{b}] {stats:?}");
        assert!(stats.flushes > 1, "[{b}] {stats:?}");
        assert_eq!(stats.pending_adds, 0, "[{b}] {stats:?}");
        assert_eq!(stats.pending_counters, 0, "[{b}] {stats:?}");
        assert_eq!(stats.in_flight_counters, 0, "[{b}] {stats:?}");
        assert_eq!(stats.adds, TASKS * ADDS, "[{b}] {stats:?}");
        assert_eq!(stats.failed_attempts, 0, "[{b}] {stats:?}");
        assert_eq!(stats.last_error, None, "[{b}]");
        assert!(stats.last_flush_time.is_some(), "[{b}] {stats:?}");
        assert!(stats.rows_written > 0, "[{b}] {stats:?}");
        assert!(
            stats.peak_pending_counters <= 5 * KEYS.len(),
            "[{b}] {stats:?}"
        );

        assert_totals(&t.db, &counters, &expected, &format!("[{b}]")).await;
        assert_view_buckets(
            &t.db,
            &counters,
            &expected,
            started,
            finished,
            &format!("[{b}]"),
        )
        .await;
        for ((owner, key), want) in &expected {
            assert_eq!(buffer.unflushed(&counters, *owner, *key), 0, "[{b}]");
            assert_eq!(
                buffer.get(&counters, *owner, *key).await.unwrap(),
                *want,
                "[{b}] ({owner}, {key}) read through the stopped buffer"
            );
        }
        assert_eq!(
            ledger_rows(&t.db, Some(buffer.writer_id())).await,
            0,
            "[{b}] a clean shutdown removes the writer's ledger row"
        );
        assert_eq!(ledger_rows(&t.db, None).await, 0, "[{b}]");
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn shutdown_flushes_pending_deltas(t: TestDb) {
        let b = t.backend;
        let counters = windowed("quiet", 4);
        let named = counter_tests::counters::<String>("named", 4);
        counters.create_table(&t.db).await.unwrap();
        named.create_table(&t.db).await.unwrap();
        ledger(&t).await;
        let buffer = CounterBuffer::builder(&t.db)
            .interval(Duration::from_secs(3600))
            .start()
            .await
            .unwrap();

        let started = Utc::now();
        let mut expected = Expected::new();
        let mut adds = 0u64;
        for owner in 1..=4i64 {
            for (key, deltas) in [("likes", vec![1, 1, -1, 5]), ("views", vec![owner; 3])] {
                for delta in deltas {
                    buffer.add(&counters, owner, key, delta).unwrap();
                    *expected.entry((owner, key)).or_insert(0) += delta;
                    adds += 1;
                }
            }
        }
        let mut named_expected: HashMap<String, i64> = HashMap::new();
        for (owner, delta) in [("alice", 3), ("bob", -2), ("alice", 4), ("carol", 1)] {
            buffer
                .add(&named, owner.to_owned(), "stars", delta)
                .unwrap();
            *named_expected.entry(owner.to_owned()).or_insert(0) += delta;
            adds += 1;
        }

        // Nothing stored yet: all of it is held by the buffer.
        for ((owner, key), want) in &expected {
            assert_eq!(counters.get(&t.db, *owner, *key).await.unwrap(), 0, "[{b}]");
            assert_eq!(buffer.unflushed(&counters, *owner, *key), *want, "[{b}]");
            assert_eq!(
                buffer.get(&counters, *owner, *key).await.unwrap(),
                *want,
                "[{b}]"
            );
        }
        for (owner, want) in &named_expected {
            assert_eq!(
                named.get(&t.db, owner.clone(), "stars").await.unwrap(),
                0,
                "[{b}]"
            );
            assert_eq!(
                buffer.unflushed(&named, owner.clone(), "stars"),
                *want,
                "[{b}]"
            );
        }
        assert_eq!(raw::count_rows(&t.db, "quiet").await, 0, "[{b}]");
        assert_eq!(raw::count_rows(&t.db, "quiet_buckets").await, 0, "[{b}]");
        let waiting = buffer.stats();
        let distinct = expected.len() + named_expected.len();
        assert_eq!(
            (waiting.adds, waiting.pending_adds, waiting.flushes),
            (adds, adds, 0),
            "[{b}] {waiting:?}"
        );
        assert_eq!(waiting.pending_counters, distinct, "[{b}] {waiting:?}");
        assert_eq!(waiting.peak_pending_counters, distinct, "[{b}]");
        assert_eq!(ledger_rows(&t.db, None).await, 0, "[{b}] no flush yet");

        let stats = buffer.shutdown().await.unwrap();
        let finished = Utc::now();
        assert_eq!(
            (stats.adds, stats.pending_adds, stats.pending_counters),
            (adds, 0, 0),
            "[{b}] {stats:?}"
        );
        assert_eq!(stats.flushes, 1, "[{b}] one flush took everything");
        // Every counter's total row, plus the views' day bucket (one day,
        // unless the test ran across midnight).
        let views = expected.keys().filter(|(_, k)| *k == "views").count() as u64;
        assert!(
            stats.rows_written >= distinct as u64 + views,
            "[{b}] {stats:?}"
        );
        assert_totals(&t.db, &counters, &expected, &format!("[{b}]")).await;
        assert_view_buckets(
            &t.db,
            &counters,
            &expected,
            started,
            finished,
            &format!("[{b}]"),
        )
        .await;
        for (owner, want) in &named_expected {
            assert_eq!(
                named.get(&t.db, owner.clone(), "stars").await.unwrap(),
                *want,
                "[{b}] {owner}"
            );
        }
        assert_eq!(ledger_rows(&t.db, None).await, 0, "[{b}]");

        // Closed for good: the delta is refused and not taken.
        let err = buffer.add(&counters, 1, "likes", 100).unwrap_err();
        assert!(
            matches!(err, CounterError::Buffer(BufferError::Closed)),
            "[{b}] {err:?}"
        );
        let err = buffer
            .add(&named, "dave".to_owned(), "stars", 1)
            .unwrap_err();
        assert!(
            matches!(err, CounterError::Buffer(BufferError::Closed)),
            "[{b}] {err:?}"
        );
        assert_eq!(buffer.unflushed(&counters, 1, "likes"), 0, "[{b}]");
        let again = buffer.shutdown().await.unwrap();
        assert_eq!((again.adds, again.flushes), (adds, 1), "[{b}] {again:?}");
        assert_eq!(
            counters.get(&t.db, 1, "likes").await.unwrap(),
            expected[&(1, "likes")],
            "[{b}]"
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn reads_through_the_buffer_include_pending_deltas(t: TestDb) {
        const READERS: i64 = 4;
        const ROUNDS: usize = 100;
        let b = t.backend;
        let counters = windowed("reads", 4);
        counters.create_table(&t.db).await.unwrap();
        ledger(&t).await;

        // A stored value (written directly) plus pending adds.
        counters.add(&t.db, 1, "likes", 40).await.unwrap();
        let quiet = CounterBuffer::builder(&t.db)
            .interval(Duration::from_secs(3600))
            .start()
            .await
            .unwrap();
        for delta in [5, -2, 7] {
            quiet.add(&counters, 1, "likes", delta).unwrap();
        }
        quiet.add(&counters, 2, "views", 9).unwrap();
        assert_eq!(counters.get(&t.db, 1, "likes").await.unwrap(), 40, "[{b}]");
        assert_eq!(quiet.unflushed(&counters, 1, "likes"), 10, "[{b}]");
        assert_eq!(quiet.get(&counters, 1, "likes").await.unwrap(), 50, "[{b}]");
        assert_eq!(quiet.get(&counters, 2, "views").await.unwrap(), 9, "[{b}]");
        assert_eq!(quiet.get(&counters, 3, "views").await.unwrap(), 0, "[{b}]");
        quiet.flush().await.unwrap();
        assert_eq!(quiet.stats().flushes, 1, "[{b}]");
        assert_eq!(quiet.unflushed(&counters, 1, "likes"), 0, "[{b}]");
        assert_eq!(quiet.get(&counters, 1, "likes").await.unwrap(), 50, "[{b}]");
        assert_eq!(counters.get(&t.db, 1, "likes").await.unwrap(), 50, "[{b}]");
        assert_eq!(counters.get(&t.db, 2, "views").await.unwrap(), 9, "[{b}]");
        // A flush with nothing pending commits nothing and still returns.
        quiet.flush().await.unwrap();
        assert_eq!(quiet.stats().flushes, 1, "[{b}]");
        quiet.shutdown().await.unwrap();

        // Read-your-writes while a fast flusher drains under the readers.
        let buffer = CounterBuffer::builder(&t.db)
            .interval(Duration::from_millis(5))
            .flush_at(8)
            .start()
            .await
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let noise = {
            let (buffer, counters, stop) = (buffer.clone(), counters.clone(), stop.clone());
            tokio::spawn(async move {
                let mut added = Expected::new();
                let mut i = 0i64;
                while !stop.load(SeqCst) {
                    let owner = 1_000 + i % 20;
                    buffer.add(&counters, owner, "views", 1).unwrap();
                    *added.entry((owner, "views")).or_insert(0) += 1;
                    i += 1;
                    if i % 5 == 0 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                added
            })
        };
        let readers: Vec<_> = (0..READERS)
            .map(|r| {
                let (buffer, counters, db) = (buffer.clone(), counters.clone(), t.db.clone());
                tokio::spawn(async move {
                    let owner = 100 + r;
                    let base = 10 * (r + 1);
                    counters.add(&db, owner, "likes", base).await.unwrap();
                    let mut rng = StdRng::seed_from_u64(r as u64);
                    let mut running = base;
                    for round in 0..ROUNDS {
                        let delta = if rng.random_range(0..4) == 0 {
                            -1
                        } else {
                            rng.random_range(1..=3i64)
                        };
                        buffer.add(&counters, owner, "likes", delta).unwrap();
                        running += delta;
                        // A read that could not settle an in-flight flush in
                        // 5 s is `FlushInDoubt`, to retry (RELIABILITY's known
                        // limits: a loaded single-connection SQLite); the read
                        // that answers must still see every add.
                        let mut tries = 0;
                        let seen = loop {
                            tries += 1;
                            match buffer.get(&counters, owner, "likes").await {
                                Err(CounterError::Buffer(BufferError::FlushInDoubt)) if tries < 5 => continue,
                                other => break other.unwrap(),
                            }
                        };
                        assert_eq!(
                            seen, running,
                            "owner {owner}, round {round}: read-your-writes"
                        );
                    }
                    ((owner, "likes"), running)
                })
            })
            .collect();
        let t0 = std::time::Instant::now();
        let mut expected = Expected::new();
        for reader in readers {
            let (counter, total) = reader.await.unwrap();
            expected.insert(counter, total);
        }
        eprintln!(
            "[{b}] {} reads through the buffer took {:?}",
            READERS as usize * ROUNDS,
            t0.elapsed()
        );
        stop.store(true, SeqCst);
        let noise = noise.await.unwrap();
        let during = buffer.stats();
        assert!(during.flushes > 0, "[{b}] {during:?}");
        flush_within_patience(&buffer, "flush in time").await;
        for (counter, total) in &expected {
            assert_eq!(
                counters.get(&t.db, counter.0, counter.1).await.unwrap(),
                *total,
                "[{b}] {counter:?} after flush()"
            );
        }
        merge(&mut expected, noise);
        let stats = buffer.shutdown().await.unwrap();
        eprintln!("[{b}] {stats:?}");
        assert_eq!(stats.pending_adds, 0, "[{b}]");
        assert_totals(&t.db, &counters, &expected, &format!("[{b}]")).await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_flood_of_new_counters_stays_within_capacity(t: TestDb) {
        const TASKS: i64 = 16;
        const OWNERS: i64 = 1_000;
        const CAPACITY: usize = 200;
        let b = t.backend;
        let counters = counter_tests::counters::<i64>("flood", 4);
        counters.create_table(&t.db).await.unwrap();
        ledger(&t).await;
        let buffer = CounterBuffer::builder(&t.db)
            .interval(Duration::from_millis(5))
            .flush_at(CAPACITY / 2)
            .capacity(CAPACITY)
            .when_full(WhenFull::Block)
            .start()
            .await
            .unwrap();
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let (buffer, counters) = (buffer.clone(), counters.clone());
                tokio::spawn(async move {
                    let mut mine = Expected::new();
                    let mut adds = 0u64;
                    for i in 0..OWNERS {
                        let owner = task * 100_000 + i;
                        let delta = 1 + i % 5 + task;
                        buffer.add(&counters, owner, "hits", delta).unwrap();
                        *mine.entry((owner, "hits")).or_insert(0) += delta;
                        adds += 1;
                        // Every 10th counter twice (a pending one costs no room).
                        if i % 10 == 0 {
                            buffer.add(&counters, owner, "hits", -2).unwrap();
                            *mine.entry((owner, "hits")).or_insert(0) -= 2;
                            adds += 1;
                        }
                    }
                    (mine, adds)
                })
            })
            .collect();
        let (mut expected, mut adds) = (Expected::new(), 0);
        for task in tasks {
            let (mine, n) = task.await.unwrap();
            merge(&mut expected, mine);
            adds += n;
        }
        let stats = buffer.shutdown().await.unwrap();
        eprintln!("[{b}] {stats:?}");
        assert!(stats.peak_pending_counters <= CAPACITY, "[{b}] {stats:?}");
        assert!(stats.full_waits > 0, "[{b}] it was never full: {stats:?}");
        assert_eq!((stats.adds, stats.pending_adds), (adds, 0), "[{b}]");
        let distinct = (TASKS * OWNERS) as u64;
        assert!(
            stats.flushes >= distinct / CAPACITY as u64,
            "[{b}] {distinct} counters in flushes of at most {CAPACITY}: {stats:?}"
        );
        assert_eq!(expected.len() as u64, distinct, "[{b}]");
        assert_totals(&t.db, &counters, &expected, &format!("[{b}]")).await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn when_full_fail_refuses_without_taking_the_delta(t: TestDb) {
        let b = t.backend;
        let counters = counter_tests::counters::<i64>("refused", 4);
        counters.create_table(&t.db).await.unwrap();
        ledger(&t).await;
        let buffer = CounterBuffer::builder(&t.db)
            .interval(Duration::from_secs(3600))
            .capacity(2)
            .flush_at(2)
            .when_full(WhenFull::Fail)
            .start()
            .await
            .unwrap();
        // Flushes fail (and are retried) until the table is back.
        counters.drop_table(&t.db).await.unwrap();

        let mut expected = Expected::new();
        let mut add = |owner: i64, delta: i64| -> Result<(), CounterError> {
            buffer.add(&counters, owner, "likes", delta)?;
            *expected.entry((owner, "likes")).or_insert(0) += delta;
            Ok(())
        };
        add(1, 3).unwrap();
        add(2, 4).unwrap(); // reaches flush_at: the flusher takes both
        wait_until("the first flush to fail", || {
            let s = buffer.stats();
            s.in_flight_counters == 2 && s.failed_attempts > 0
        })
        .await;
        // The failing flush holds 1 and 2; the pending map has room again.
        add(3, 5).unwrap();
        add(4, 6).unwrap();
        let full = add(5, 7).unwrap_err();
        assert!(
            matches!(
                full,
                CounterError::Buffer(BufferError::Full { capacity: 2 })
            ),
            "[{b}] {full:?}"
        );
        // In flight is not pending: 1 would be a new pending counter.
        let full = add(1, 1).unwrap_err();
        assert!(
            matches!(
                full,
                CounterError::Buffer(BufferError::Full { capacity: 2 })
            ),
            "[{b}] {full:?}"
        );
        // A counter already pending takes more without room.
        add(3, 10).unwrap();
        add(4, -1).unwrap();
        expected.insert((5, "likes"), 0);
        let stats = buffer.stats();
        assert_eq!(stats.full_waits, 2, "[{b}] {stats:?}");
        assert_eq!(stats.adds, 6, "[{b}] the refused adds are not counted");
        assert_eq!(stats.pending_adds, 6, "[{b}] {stats:?}");
        assert_eq!(stats.pending_counters, 2, "[{b}] {stats:?}");
        assert_eq!(stats.peak_pending_counters, 2, "[{b}] {stats:?}");
        assert_eq!(stats.flushes, 0, "[{b}] {stats:?}");
        assert_eq!(buffer.unflushed(&counters, 1, "likes"), 3, "[{b}]");
        assert_eq!(buffer.unflushed(&counters, 3, "likes"), 15, "[{b}]");
        assert_eq!(buffer.unflushed(&counters, 5, "likes"), 0, "[{b}]");

        counters.create_table(&t.db).await.unwrap();
        flush_within_patience(&buffer, "the flush recovers once the table is back").await;
        let stats = buffer.stats();
        assert_eq!(stats.last_error, None, "[{b}]");
        assert_eq!(
            (stats.pending_adds, stats.flushes),
            (0, 2),
            "[{b}] {stats:?}"
        );
        assert_totals(&t.db, &counters, &expected, &format!("[{b}]")).await;
        assert_eq!(raw::count_rows(&t.db, "refused").await, 4, "[{b}]");
        // With room again, a new counter is taken.
        buffer.add(&counters, 5, "likes", 7).unwrap();
        buffer.shutdown().await.unwrap();
        assert_eq!(counters.get(&t.db, 5, "likes").await.unwrap(), 7, "[{b}]");
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_failing_flush_keeps_its_deltas_until_it_succeeds(t: TestDb) {
        let b = t.backend;
        let counters = windowed("flaky", 4);
        counters.create_table(&t.db).await.unwrap();
        ledger(&t).await;
        let buffer = CounterBuffer::builder(&t.db)
            .interval(Duration::from_millis(10))
            .start()
            .await
            .unwrap();
        let started = Utc::now();
        let mut expected = Expected::new();
        // Some of it committed before the table goes away.
        for owner in 1..=3i64 {
            buffer.add(&counters, owner, "likes", owner).unwrap();
            *expected.entry((owner, "likes")).or_insert(0) += owner;
        }
        flush_within_patience(&buffer, "flush in time").await;
        counters.drop_table(&t.db).await.unwrap();

        for owner in 1..=3i64 {
            for (key, delta) in [("likes", 2), ("views", 5), ("views", -1)] {
                buffer.add(&counters, owner, key, delta).unwrap();
                *expected.entry((owner, key)).or_insert(0) += delta;
            }
        }
        wait_until("a failed flush attempt", || {
            buffer.stats().failed_attempts > 0
        })
        .await;
        let failing = buffer.stats();
        let error = failing.last_error.clone().expect("the failure is reported");
        assert!(error.contains("flaky"), "[{b}] {error}");
        // More adds fold in while the flush is retried.
        for owner in 1..=3i64 {
            buffer.add(&counters, owner, "likes", 10).unwrap();
            *expected.entry((owner, "likes")).or_insert(0) += 10;
        }
        for owner in 1..=3i64 {
            assert_eq!(
                buffer.unflushed(&counters, owner, "likes"),
                12,
                "[{b}] nothing dropped"
            );
            assert_eq!(buffer.unflushed(&counters, owner, "views"), 4, "[{b}]");
        }
        let read = buffer.get(&counters, 1, "likes").await.unwrap_err();
        assert!(
            matches!(&read, CounterError::MissingTable { table, .. } if table == "flaky"),
            "[{b}] {read:?}"
        );
        assert_eq!(buffer.stats().pending_adds, 12, "[{b}]");
        assert_eq!(buffer.stats().flushes, 1, "[{b}]");

        counters.create_table(&t.db).await.unwrap();
        flush_within_patience(&buffer, "the flush recovers once the table is back").await;
        let stats = buffer.stats();
        eprintln!("[{b}] {stats:?}");
        assert_eq!(stats.last_error, None, "[{b}]");
        assert_eq!(stats.pending_adds, 0, "[{b}]");
        assert!(stats.failed_attempts >= failing.failed_attempts, "[{b}]");
        assert_eq!(stats.replays_skipped, 0, "[{b}] {stats:?}");
        // The recreated table holds exactly what was added since the drop.
        let mut since_drop = expected.clone();
        for owner in 1..=3i64 {
            *since_drop.get_mut(&(owner, "likes")).unwrap() -= owner;
        }
        assert_totals(&t.db, &counters, &since_drop, &format!("[{b}]")).await;
        assert_view_buckets(
            &t.db,
            &counters,
            &since_drop,
            started,
            Utc::now(),
            &format!("[{b}]"),
        )
        .await;
        for owner in 1..=3i64 {
            assert_eq!(
                buffer.get(&counters, owner, "likes").await.unwrap(),
                12,
                "[{b}]"
            );
        }
        buffer.shutdown().await.unwrap();
        assert_eq!(ledger_rows(&t.db, None).await, 0, "[{b}]");
        t.finish().await;
    }
}

/// Polls `start()` once, on a thread without a Tokio runtime.
fn start_without_runtime(db: DatabaseConnection) -> Result<CounterBuffer, CounterError> {
    std::thread::spawn(move || {
        let mut start = std::pin::pin!(CounterBuffer::builder(&db).start());
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match start.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(result) => result,
            std::task::Poll::Pending => panic!("start() waited outside a runtime"),
        }
    })
    .join()
    .expect("the thread ran")
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn bad_settings_and_a_missing_ledger_are_typed_errors(t: TestDb) {
        let b = t.backend;
        let counters = counter_tests::counters::<i64>("typed", 4);
        counters.create_table(&t.db).await.unwrap();

        // No ledger table.
        let err = CounterBuffer::start(&t.db).await.unwrap_err();
        assert!(
            matches!(&err, CounterError::MissingTable { table, .. } if table == "counter_flush_ledger"),
            "[{b}] {err:?}"
        );
        let custom = FlushLedger::new("my_ledger").unwrap();
        assert_eq!(custom.name(), "my_ledger");
        let err = CounterBuffer::builder(&t.db)
            .ledger(custom.clone())
            .start()
            .await
            .unwrap_err();
        assert!(
            matches!(&err, CounterError::MissingTable { table, .. } if table == "my_ledger"),
            "[{b}] {err:?}"
        );
        let err = FlushLedger::new("bad name").unwrap_err();
        assert!(
            matches!(err, CounterError::InvalidTableName { .. }),
            "[{b}] {err:?}"
        );
        ledger(&t).await;
        custom.create_table(&t.db).await.unwrap();

        // Settings out of range: what each names, and the value it reports.
        type Configure = fn(BufferBuilder) -> BufferBuilder;
        let cases: [(Configure, &str, usize); 9] = [
            (|b| b.interval(Duration::ZERO), "interval", 0),
            (|b| b.interval(Duration::from_micros(500)), "interval", 0),
            (
                |b| b.interval(Duration::from_secs(3601)),
                "interval",
                3_601_000,
            ),
            // A retention shorter than an outage could let one buffer prune
            // the row of another that is still retrying.
            (
                |b| b.ledger_retention(Duration::from_secs(60)),
                "retention",
                60,
            ),
            (|b| b.capacity(0), "capacity", 0),
            (
                |b| b.capacity(MAX_BUFFER_CAPACITY + 1),
                "capacity",
                MAX_BUFFER_CAPACITY + 1,
            ),
            (|b| b.capacity(10).flush_at(11), "flush_at", 11),
            (|b| b.flush_at(0), "flush_at", 0),
            // The default flush_at (10,000) does not fit a smaller capacity.
            (|b| b.capacity(100), "flush_at", 10_000),
        ];
        for (configure, what, value) in cases {
            match configure(CounterBuffer::builder(&t.db)).start().await {
                Err(CounterError::OutOfRange {
                    what: w, value: v, ..
                }) => {
                    assert!(
                        w.contains(what) && v == value as i128,
                        "[{b}] {what}: {w} {v}"
                    )
                }
                other => panic!("[{b}] {what} {value}: {other:?}"),
            }
        }
        let err = start_without_runtime(t.db.clone()).unwrap_err();
        assert!(
            matches!(err, CounterError::Buffer(BufferError::NoRuntime)),
            "[{b}] {err:?}"
        );

        // A buffer on the custom ledger, started at the bounds.
        let buffer = CounterBuffer::builder(&t.db)
            .ledger(custom.clone())
            .interval(Duration::from_millis(1))
            .capacity(1)
            .flush_at(1)
            .start()
            .await
            .unwrap();
        buffer.add(&counters, 9, "likes", 2).unwrap();
        flush_within_patience(&buffer, "flush in time").await;
        assert_eq!(counters.get(&t.db, 9, "likes").await.unwrap(), 2, "[{b}]");
        buffer.shutdown().await.unwrap();
        assert_eq!(raw::count_rows(&t.db, "my_ledger").await, 0, "[{b}]");

        let buffer = CounterBuffer::builder(&t.db)
            .interval(Duration::from_secs(3600))
            .start()
            .await
            .unwrap();
        // Bad keys and owners, refused before anything is taken.
        for key in ["", "has space", "quote'", &"k".repeat(65)] {
            let err = buffer.add(&counters, 1, key, 1).unwrap_err();
            assert!(
                matches!(err, CounterError::InvalidKey { .. }),
                "[{b}] {key:?}: {err:?}"
            );
        }
        let strings = counter_tests::counters::<String>("typed_named", 4);
        let long = "x".repeat(MAX_STRING_OWNER_LEN + 1);
        let err = buffer.add(&strings, long, "likes", 1).unwrap_err();
        assert!(
            matches!(err, CounterError::InvalidOwner { .. }),
            "[{b}] {err:?}"
        );
        assert_eq!(buffer.stats().adds, 0, "[{b}] nothing taken");

        // A pending sum that would leave i64: the add is refused, the sum
        // already pending stays.
        buffer.add(&counters, 1, "likes", i64::MAX).unwrap();
        let err = buffer.add(&counters, 1, "likes", 1).unwrap_err();
        assert!(
            matches!(err, CounterError::Overflow { .. }),
            "[{b}] {err:?}"
        );
        assert_eq!(buffer.unflushed(&counters, 1, "likes"), i64::MAX, "[{b}]");
        buffer.add(&counters, 2, "likes", i64::MIN).unwrap();
        let err = buffer.add(&counters, 2, "likes", -1).unwrap_err();
        assert!(
            matches!(err, CounterError::Overflow { .. }),
            "[{b}] {err:?}"
        );
        buffer.add(&counters, 1, "likes", -5).unwrap();
        assert_eq!(
            buffer.unflushed(&counters, 1, "likes"),
            i64::MAX - 5,
            "[{b}]"
        );
        // A read whose stored + pending leaves i64 is an overflow too; a
        // pending delta that nets to zero writes nothing.
        counters.add(&t.db, 3, "likes", 10).await.unwrap();
        buffer.add(&counters, 3, "likes", i64::MAX - 5).unwrap();
        let err = buffer.get(&counters, 3, "likes").await.unwrap_err();
        assert!(
            matches!(err, CounterError::Overflow { .. }),
            "[{b}] {err:?}"
        );
        buffer.add(&counters, 3, "likes", 5 - i64::MAX).unwrap();
        assert_eq!(buffer.get(&counters, 3, "likes").await.unwrap(), 10);
        let stats = buffer.shutdown().await.unwrap();
        assert_eq!((stats.adds, stats.pending_adds), (5, 0), "[{b}] {stats:?}");
        assert_eq!(stats.flushes, 1, "[{b}] {stats:?}");
        assert_eq!(
            stats.rows_written, 2,
            "[{b}] owners 1 and 2 only: {stats:?}"
        );
        assert_eq!(counters.get(&t.db, 3, "likes").await.unwrap(), 10, "[{b}]");
        assert_eq!(
            counters.get(&t.db, 1, "likes").await.unwrap(),
            i64::MAX - 5,
            "[{b}]"
        );
        assert_eq!(
            counters.get(&t.db, 2, "likes").await.unwrap(),
            i64::MIN,
            "[{b}]"
        );
        t.finish().await;
    }
}

/// Where the buffer's connections can be found, and killed, from outside.
enum Target {
    /// PostgreSQL: the buffer's own pool, tagged with an application name.
    Postgres { app: String },
    /// MariaDB/MySQL: every connection to the test's own database.
    MySql { database: String },
}

/// Kills every connection of `target` that is running a statement or is
/// inside a transaction (a flush under way), never the killer's own;
/// returns how many it killed.
async fn kill_busy(killer: &DatabaseConnection, target: &Target) -> u64 {
    let backend = killer.get_database_backend();
    match target {
        Target::Postgres { app } => {
            let sql = format!(
                "SELECT pg_terminate_backend(pid) AS killed FROM pg_stat_activity \
                 WHERE application_name = '{app}' AND pid <> pg_backend_pid() \
                 AND state <> 'idle'"
            );
            let rows = Sql::new(killer)
                .query_all_raw(Statement::from_string(backend, sql))
                .await
                .expect("terminate the buffer's connections");
            rows.iter()
                .filter(|r| r.try_get::<bool>("", "killed").unwrap_or(false))
                .count() as u64
        }
        Target::MySql { database } => {
            let sql = format!(
                "SELECT id FROM information_schema.processlist \
                 WHERE db = '{database}' AND id <> CONNECTION_ID() \
                 AND (command <> 'Sleep' OR id IN \
                      (SELECT trx_mysql_thread_id FROM information_schema.innodb_trx))"
            );
            let rows = killer
                .query_all_raw(Statement::from_string(backend, sql))
                .await
                .expect("list the buffer's connections");
            let mut killed = 0;
            for row in rows {
                let id: i64 = row.try_get("", "id").expect("a connection id");
                // It may have gone by now: "unknown thread id" is fine.
                let kill = Statement::from_string(backend, format!("KILL {id}"));
                if killer.execute_raw(kill).await.is_ok() {
                    killed += 1;
                }
            }
            killed
        }
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_connection_killed_during_flushes_loses_and_doubles_nothing(t: TestDb) {
        const TASKS: u64 = 16;
        const OWNERS: i64 = 20;
        const KEYS: [&str; 2] = ["likes", "views"];
        let b = t.backend;
        let counters = windowed("killbuf", 8);
        counters.create_table(&t.db).await.unwrap();
        ledger(&t).await;

        // The buffer's pool, and a separate one that kills its connections.
        let (pool, killer, target) = match b {
            Backend::Sqlite => (t.db.clone(), None, None),
            Backend::Postgres => {
                // The test's scratch space: its schema, or behind a
                // transaction pooler its own database (no search path).
                let url = t.url().unwrap();
                let app = format!("ctbuf_{}_{}", std::process::id(), rand::random::<u32>());
                let sep = if url.contains('?') { '&' } else { '?' };
                let mut options = ConnectOptions::new(format!("{url}{sep}application_name={app}"));
                options
                    .max_connections(4)
                    .min_connections(0)
                    .sqlx_logging(false);
                if let Some(schema) = t.schema() {
                    options.set_schema_search_path(schema);
                }
                let pool = Database::connect(options).await.unwrap();
                let killer = one_connection(url).await;
                (pool, Some(killer), Some(Target::Postgres { app }))
            }
            Backend::MySql => {
                let url = std::env::var(counter_tests::MYSQL_URL_VAR).unwrap();
                let row =
                    t.db.query_one_raw(Statement::from_string(
                        t.db.get_database_backend(),
                        "SELECT DATABASE() AS d",
                    ))
                    .await
                    .unwrap()
                    .unwrap();
                let database: String = row.try_get("", "d").unwrap();
                let killer = one_connection(&url).await;
                (t.db.clone(), Some(killer), Some(Target::MySql { database }))
            }
        };

        let buffer = CounterBuffer::builder(&pool)
            .interval(Duration::from_millis(2))
            .flush_at(1_000)
            .start()
            .await
            .unwrap();
        let started = Utc::now();
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..TASKS)
            .map(|task| {
                let (buffer, counters, stop) = (buffer.clone(), counters.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut rng = StdRng::seed_from_u64(1_000 + task);
                    let mut mine = Expected::new();
                    let mut adds = 0u64;
                    while !stop.load(SeqCst) {
                        for _ in 0..50 {
                            let owner = rng.random_range(1..=OWNERS);
                            let key = KEYS[rng.random_range(0..KEYS.len())];
                            let delta = rng.random_range(-2..=5i64);
                            buffer.add(&counters, owner, key, delta).unwrap();
                            *mine.entry((owner, key)).or_insert(0) += delta;
                            adds += 1;
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    (mine, adds)
                })
            })
            .collect();
        let kills = Arc::new(AtomicU64::new(0));
        let killing = match (killer, target) {
            (Some(killer), Some(target)) => {
                let (stop, kills, buffer) = (stop.clone(), kills.clone(), buffer.clone());
                Some(tokio::spawn(async move {
                    // Let a flush commit first (so the writer has its
                    // ledger row, and the last flushes retry claims).
                    wait_until("a first flush", || buffer.stats().flushes > 0).await;
                    drop(buffer);
                    while !stop.load(SeqCst) {
                        // Poll until a connection is busy with a flush,
                        // kill it, then let the flushes recover a while.
                        let killed = kill_busy(&killer, &target).await;
                        kills.fetch_add(killed, SeqCst);
                        let pause = if killed > 0 { 100 } else { 2 };
                        tokio::time::sleep(Duration::from_millis(pause)).await;
                    }
                    killer.close().await.unwrap();
                }))
            }
            _ => None,
        };
        // At least 3 s, and on a server until a kill has hit a flush (at
        // most 20 s): on a loaded machine every kill of a short run can
        // land between two flushes, and the run would prove nothing.
        let began = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let hit = killing.is_none() || buffer.stats().failed_attempts > 0;
            let elapsed = began.elapsed();
            if (hit && elapsed >= Duration::from_secs(3)) || elapsed >= Duration::from_secs(20) {
                break;
            }
        }
        stop.store(true, SeqCst);
        let (mut expected, mut adds) = (Expected::new(), 0);
        for writer in writers {
            let (mine, n) = writer.await.unwrap();
            merge(&mut expected, mine);
            adds += n;
        }
        if let Some(killing) = killing {
            killing.await.unwrap();
        }
        let stats = tokio::time::timeout(PATIENCE, buffer.shutdown())
            .await
            .expect("shutdown in time")
            .unwrap();
        let finished = Utc::now();
        eprintln!(
            "[{b}] kills {}, failed attempts {}, replays skipped {}, flushes {}, adds {}, last error {:?}",
            kills.load(SeqCst),
            stats.failed_attempts,
            stats.replays_skipped,
            stats.flushes,
            stats.adds,
            stats.last_error,
        );
        if b != Backend::Sqlite {
            assert!(kills.load(SeqCst) > 0, "[{b}] nothing was killed");
            assert!(
                stats.failed_attempts > 0,
                "[{b}] no kill hit a flush: {stats:?}"
            );
        } else {
            assert_eq!(stats.failed_attempts, 0, "[{b}] {stats:?}");
        }
        assert_eq!((stats.adds, stats.pending_adds), (adds, 0), "[{b}]");
        assert_eq!(stats.last_error, None, "[{b}]");
        assert!(stats.flushes > 1, "[{b}] {stats:?}");
        if b == Backend::Postgres {
            pool.close().await.unwrap();
        }
        assert_totals(&t.db, &counters, &expected, &format!("[{b}]")).await;
        assert_view_buckets(
            &t.db,
            &counters,
            &expected,
            started,
            finished,
            &format!("[{b}]"),
        )
        .await;
        assert_eq!(ledger_rows(&t.db, None).await, 0, "[{b}]");
        counter_tests::figures(
            "buffer_connection_kills",
            b,
            &[
                ("adds", stats.adds),
                ("flushes", stats.flushes),
                ("faults_injected", kills.load(SeqCst)),
                ("failed_attempts", stats.failed_attempts),
                ("replays_skipped", stats.replays_skipped),
                ("increments_lost", 0),
            ],
        );
        t.finish().await;
    }
}

async fn one_connection(url: &str) -> DatabaseConnection {
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(1)
        .min_connections(0)
        .sqlx_logging(false);
    Database::connect(options).await.expect("the killer's pool")
}

mod shop {
    //! Two entities for the typed batch: a windowed key on one, plain keys
    //! on the other.

    pub mod item {
        use counter_core::SlottedCounter;
        use sea_orm::entity::prelude::*;

        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
        #[sea_orm(table_name = "items")]
        #[counter(keys(sales, views(slots = 8, window = day), returns), table = "item_counters")]
        pub struct Model {
            #[sea_orm(primary_key)]
            pub id: i64,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}

        impl ActiveModelBehavior for ActiveModel {}
    }

    pub mod seller {
        use counter_core::SlottedCounter;
        use sea_orm::entity::prelude::*;

        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
        #[sea_orm(table_name = "sellers")]
        #[counter(keys(orders, ratings), slots = 4, table = "seller_counters")]
        pub struct Model {
            #[sea_orm(primary_key)]
            pub id: i32,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}

        impl ActiveModelBehavior for ActiveModel {}
    }
}

use shop::{item, seller};

/// One unit of work across both entities; the noon of `day` for views.
fn shop_batch(day: DateTime<Utc>) -> DeltaBatch {
    use item::counters::Key as I;
    use seller::counters::Key as S;
    let noon = day + chrono::Duration::hours(12);
    let (items, sellers) = (item::Entity::counters(), seller::Entity::counters());
    let mut batch = DeltaBatch::new();
    assert!(batch.is_empty());
    batch
        .add(items, 1, I::Sales, 3)
        .unwrap()
        .increment(items, 2, I::Sales)
        .unwrap()
        .increment(items, 1, I::Sales)
        .unwrap()
        .add_at(items, 1, I::Views, 5, noon)
        .unwrap()
        .add_at(items, 3, I::Views, 2, noon)
        .unwrap()
        .add_at(items, 3, I::Views, 4, noon - chrono::Duration::days(1))
        .unwrap()
        // Nets to zero: no row.
        .increment(items, 2, I::Returns)
        .unwrap()
        .decrement(items, 2, I::Returns)
        .unwrap();
    assert!(!batch.is_empty());
    // One unit of work across both entities, still sent together.
    batch
        .add(sellers, 10, S::Orders, 2)
        .unwrap()
        .decrement(sellers, 10, S::Ratings)
        .unwrap()
        .add(sellers, 11, S::Orders, 7)
        .unwrap();
    batch
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_typed_batch_commits_and_rolls_back_with_the_callers_transaction(t: TestDb) {
        use item::counters::Key as I;
        use seller::counters::Key as S;
        let b = t.backend;
        item::Entity::counters().create_table(&t.db).await.unwrap();
        seller::Entity::counters()
            .create_table(&t.db)
            .await
            .unwrap();
        let day = Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap();
        // item_counters: (1, sales), (2, sales), (1, views), (3, views);
        // item_counters_buckets: 1 and 3 on the day, 3 the day before;
        // seller_counters: (10, orders), (10, ratings), (11, orders).
        let want = (4 + 3 + 3, 3);

        let txn = t.db.begin().await.unwrap();
        let sent = shop_batch(day).apply(&txn).await.unwrap();
        assert_eq!((sent.rows, sent.statements), want, "[{b}] {sent:?}");
        assert_eq!(
            item::Entity::counters()
                .get(&txn, 1, I::Sales)
                .await
                .unwrap(),
            4,
            "[{b}] visible inside the transaction"
        );
        txn.rollback().await.unwrap();
        for table in ["item_counters", "item_counters_buckets", "seller_counters"] {
            assert_eq!(
                raw::count_rows(&t.db, table).await,
                0,
                "[{b}] {table} rolled back"
            );
        }
        assert_eq!(
            item::Entity::counters()
                .get(&t.db, 1, I::Sales)
                .await
                .unwrap(),
            0
        );

        let txn = t.db.begin().await.unwrap();
        let sent = shop_batch(day).apply(&txn).await.unwrap();
        assert_eq!((sent.rows, sent.statements), want, "[{b}] {sent:?}");
        txn.commit().await.unwrap();
        let check = |round: i64| {
            let db = t.db.clone();
            async move {
                let items = item::Entity::counters()
                    .get_many(&db, &[1, 2, 3], &[I::Sales, I::Views, I::Returns])
                    .await
                    .unwrap();
                assert_eq!(items[&1].sales, 4 * round, "[{b}]");
                assert_eq!(items[&2].sales, round, "[{b}]");
                assert_eq!(items[&1].views, 5 * round, "[{b}]");
                assert_eq!(items[&3].views, 6 * round, "[{b}]");
                assert_eq!(items[&2].returns, 0, "[{b}]");
                let next = day + chrono::Duration::days(1);
                let prev = day - chrono::Duration::days(1);
                assert_eq!(
                    item::Entity::counters()
                        .range(&db, 3, I::Views, day, next)
                        .await
                        .unwrap(),
                    2 * round,
                    "[{b}]"
                );
                assert_eq!(
                    item::Entity::counters()
                        .range(&db, 3, I::Views, prev, day)
                        .await
                        .unwrap(),
                    4 * round,
                    "[{b}]"
                );
                assert_eq!(
                    item::Entity::counters()
                        .range(&db, 1, I::Views, prev, next)
                        .await
                        .unwrap(),
                    5 * round,
                    "[{b}]"
                );
                let sellers = seller::Entity::counters()
                    .get_many(&db, &[10, 11], &[S::Orders, S::Ratings])
                    .await
                    .unwrap();
                assert_eq!(sellers[&10].orders, 2 * round, "[{b}]");
                assert_eq!(sellers[&10].ratings, -round, "[{b}]");
                assert_eq!(sellers[&11].orders, 7 * round, "[{b}]");
                assert_eq!(sellers[&11].ratings, 0, "[{b}]");
            }
        };
        check(1).await;

        // On a transaction that cannot nest, `apply_in` sends the same.
        let txn = t.db.begin().await.unwrap();
        let sent = shop_batch(day).apply_in(&txn).await.unwrap();
        assert_eq!((sent.rows, sent.statements), want, "[{b}] {sent:?}");
        txn.commit().await.unwrap();
        check(2).await;
        // ... but not on a pool, where its statements would not be atomic.
        let err = shop_batch(day).apply_in(&t.db).await.unwrap_err();
        assert!(
            matches!(err, CounterError::BatchNeedsTransaction { statements: 3 }),
            "[{b}] {err:?}"
        );
        // On a pool, `apply` opens its own transaction.
        let sent = shop_batch(day).apply(&t.db).await.unwrap();
        assert_eq!((sent.rows, sent.statements), want, "[{b}]");
        check(3).await;
        // An empty batch sends nothing.
        let sent = DeltaBatch::new().apply(&t.db).await.unwrap();
        assert_eq!((sent.rows, sent.statements), (0, 0), "[{b}]");
        t.finish().await;
    }
}

/// Polls the stored totals until they are `expected` (a buffer flushing in
/// the background); panics with the difference after [`PATIENCE`].
async fn eventually_totals(db: &DatabaseConnection, counters: &Counters<i64>, expected: &Expected) {
    let owners: Vec<i64> = expected.keys().map(|(o, _)| *o).collect();
    let keys: Vec<&str> = expected.keys().map(|(_, k)| *k).collect();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let stored = counters.get_many(db, &owners, &keys).await.unwrap();
        if expected.iter().all(|((o, k), want)| stored[o][*k] == *want) {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            assert_totals(db, counters, expected, "never flushed").await;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_buffers_share_a_table_and_a_dropped_one_still_flushes(t: TestDb) {
        const TASKS: u64 = 8;
        const ADDS: u64 = 2_000;
        let b = t.backend;
        let counters = windowed("shared", 4);
        counters.create_table(&t.db).await.unwrap();
        ledger(&t).await;
        let fast = CounterBuffer::builder(&t.db)
            .interval(Duration::from_millis(5))
            .start()
            .await
            .unwrap();
        let slow = CounterBuffer::builder(&t.db)
            .interval(Duration::from_secs(3600))
            .start()
            .await
            .unwrap();
        assert_ne!(fast.writer_id(), slow.writer_id(), "[{b}]");
        let slow_writer = slow.writer_id().to_owned();
        let started = Utc::now();
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                // Even tasks write through the fast buffer, odd ones through
                // the slow one: the same counters, two writers.
                let buffer = if task % 2 == 0 {
                    fast.clone()
                } else {
                    slow.clone()
                };
                let counters = counters.clone();
                tokio::spawn(async move {
                    let mut rng = StdRng::seed_from_u64(500 + task);
                    let mut mine = Expected::new();
                    for i in 0..ADDS {
                        let owner = rng.random_range(1..=6i64);
                        let key = if rng.random_bool(0.5) {
                            "likes"
                        } else {
                            "views"
                        };
                        let delta = rng.random_range(-3..=7i64);
                        buffer.add(&counters, owner, key, delta).unwrap();
                        *mine.entry((owner, key)).or_insert(0) += delta;
                        if i % 100 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                    mine
                })
            })
            .collect();
        let mut expected = Expected::new();
        let mut slow_part = Expected::new();
        for (task, handle) in tasks.into_iter().enumerate() {
            let mine = handle.await.unwrap();
            if task % 2 == 1 {
                merge(&mut slow_part, mine.clone());
            }
            merge(&mut expected, mine);
        }
        let slow_adds = slow.stats();
        assert_eq!(
            (slow_adds.adds, slow_adds.pending_adds, slow_adds.flushes),
            (TASKS / 2 * ADDS, TASKS / 2 * ADDS, 0),
            "[{b}] the slow buffer holds everything it took"
        );
        // The fast one stops cleanly: the totals are its part only.
        let stats = fast.shutdown().await.unwrap();
        assert_eq!(
            (stats.adds, stats.pending_adds),
            (TASKS / 2 * ADDS, 0),
            "[{b}]"
        );
        let mut fast_part = expected.clone();
        for (counter, delta) in &slow_part {
            *fast_part.get_mut(counter).unwrap() -= delta;
        }
        assert_totals(&t.db, &counters, &fast_part, &format!("[{b}] fast only")).await;

        // The slow one is dropped without a shutdown: its flusher drains
        // what it holds, in the background, and removes its ledger row.
        drop(slow);
        eventually_totals(&t.db, &counters, &expected).await;
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while ledger_rows(&t.db, Some(&slow_writer)).await > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "[{b}] ledger row left"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(ledger_rows(&t.db, None).await, 0, "[{b}]");
        assert_view_buckets(
            &t.db,
            &counters,
            &expected,
            started,
            Utc::now(),
            &format!("[{b}]"),
        )
        .await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_ledger_prunes_writers_that_stopped_long_ago(t: TestDb) {
        let b = t.backend;
        let counters = counter_tests::counters::<i64>("pruned", 4);
        counters.create_table(&t.db).await.unwrap();
        ledger(&t).await;
        let now = Utc::now().timestamp();
        // A crashed writer two days ago, and one that flushed a minute ago.
        for (writer, updated_at) in [("ghost", now - 2 * 86_400), ("recent", now - 60)] {
            let insert = Query::insert()
                .into_table(Alias::new(FlushLedger::DEFAULT_TABLE))
                .columns(["writer_id", "last_flush", "updated_at"].map(Alias::new))
                .values_panic([writer.into(), 41_i64.into(), updated_at.into()])
                .to_owned();
            t.sql().execute(&insert).await.unwrap();
        }
        let buffer = CounterBuffer::builder(&t.db)
            .interval(Duration::from_millis(5))
            .ledger_retention(Duration::from_secs(86_400))
            .start()
            .await
            .unwrap();
        buffer.add(&counters, 1, "likes", 3).unwrap();
        flush_within_patience(&buffer, "flush in time").await;
        // The first committed flush prunes (right after it returns).
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while ledger_rows(&t.db, Some("ghost")).await > 0 {
            assert!(tokio::time::Instant::now() < deadline, "[{b}] never pruned");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(ledger_rows(&t.db, Some("recent")).await, 1, "[{b}]");
        assert_eq!(ledger_last_flush(&t.db, buffer.writer_id()).await, Some(1));
        buffer.shutdown().await.unwrap();
        assert_eq!(
            ledger_rows(&t.db, None).await,
            1,
            "[{b}] only `recent` is left"
        );
        assert_eq!(ledger_last_flush(&t.db, "recent").await, Some(41), "[{b}]");
        assert_eq!(counters.get(&t.db, 1, "likes").await.unwrap(), 3, "[{b}]");
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_delta_the_database_refuses_does_not_hold_back_the_others(t: TestDb) {
        let b = t.backend;
        // One slot: the stored slot value is the total, so one more overflows it.
        let counters = counter_tests::counters::<i64>("refused", 1);
        counters.create_table(&t.db).await.unwrap();
        ledger(&t).await;
        counters.add(&t.db, 1, "likes", i64::MAX).await.unwrap();
        let buffer = CounterBuffer::builder(&t.db)
            .interval(Duration::from_millis(5))
            .start()
            .await
            .unwrap();
        // Accepted: the pending sums fit; only the database can tell that
        // owner 1's slot cannot take one more.
        buffer.add(&counters, 1, "likes", 1).unwrap();
        buffer.add(&counters, 2, "likes", 5).unwrap();
        buffer.add(&counters, 3, "views", -2).unwrap();
        flush_within_patience(&buffer, "a refused delta must not stall the flush").await;
        let stats = buffer.stats();
        assert_eq!(stats.rejected_deltas, 1, "[{b}] {stats:?}");
        assert_eq!(stats.pending_adds, 0, "[{b}] {stats:?}");
        assert!(stats.failed_attempts >= 2, "[{b}] {stats:?}");
        assert_eq!(
            counters.get(&t.db, 1, "likes").await.unwrap(),
            i64::MAX,
            "[{b}]"
        );
        assert_eq!(counters.get(&t.db, 2, "likes").await.unwrap(), 5, "[{b}]");
        assert_eq!(counters.get(&t.db, 3, "views").await.unwrap(), -2, "[{b}]");
        // The buffer goes on: later deltas are stored as usual.
        buffer.add(&counters, 2, "likes", 1).unwrap();
        let stats = buffer.shutdown().await.unwrap();
        assert_eq!(
            (stats.rejected_deltas, stats.last_error),
            (1, None),
            "[{b}]"
        );
        assert_eq!(counters.get(&t.db, 2, "likes").await.unwrap(), 6, "[{b}]");
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn one_table_name_has_one_configuration_per_buffer(t: TestDb) {
        let b = t.backend;
        ledger(&t).await;
        let wide = counter_tests::counters::<i64>("shared_name", 4);
        let narrow = counter_tests::counters::<i32>("shared_name", 4);
        let windowed = windowed("shared_name", 4);
        wide.create_table(&t.db).await.unwrap();
        let buffer = CounterBuffer::start(&t.db).await.unwrap();
        buffer.add(&wide, 1, "likes", 1).unwrap();
        // Another owner type, or a window the first handle did not have:
        // refused, rather than bound to the wrong column or bucket-less.
        for err in [
            buffer.add(&narrow, 2, "likes", 1).unwrap_err(),
            buffer.add(&windowed, 3, "views", 1).unwrap_err(),
        ] {
            assert!(
                matches!(&err, CounterError::Buffer(BufferError::TableMismatch { table, .. }) if table == "shared_name"),
                "[{b}] {err:?}"
            );
        }
        let stats = buffer.shutdown().await.unwrap();
        assert_eq!(stats.adds, 1, "[{b}]");
        assert_eq!(wide.get(&t.db, 1, "likes").await.unwrap(), 1, "[{b}]");
        assert_eq!(raw::count_rows(&t.db, "shared_name").await, 1, "[{b}]");
        t.finish().await;
    }
}
