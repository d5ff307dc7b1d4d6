//! Exactly-once buffer flushes: the flush ledger keeps a retried flush
//! whose `COMMIT` reply was lost from being applied twice, and a flush whose
//! connection died before `COMMIT` is retried and applied once.

use std::{collections::BTreeMap, time::Duration};

use counter_core::{BufferStats, CounterBuffer, Counters, FlushLedger};
use counter_tests::{
    Backend, TestDb, backend_test, counters,
    proxy::{Fault, Proxy},
    raw,
    sql::Sql,
};
use sea_orm::{
    ConnectionTrait, DatabaseConnection,
    sea_query::{Alias, Expr, ExprTrait, Query},
};

const LEDGER: &str = "counter_flush_ledger";
/// Long enough that only `flush()` starts a flush.
const INTERVAL: Duration = Duration::from_secs(3600);
/// A flush that takes longer is stuck, not slow.
const FLUSH_LIMIT: Duration = Duration::from_secs(30);

/// The ledger's `last_flush` for `writer`, if it has a row.
async fn last_flush(db: &DatabaseConnection, writer: &str) -> Option<i64> {
    let select = Query::select()
        .column(Alias::new("last_flush"))
        .from(Alias::new(LEDGER))
        .and_where(Expr::col(Alias::new("writer_id")).eq(writer))
        .to_owned();
    Sql::new(db)
        .query_one(&select)
        .await
        .expect("read the ledger")
        .map(|row| row.try_get("", "last_flush").expect("last_flush"))
}

/// The stored totals of owners `1..=owners`' `views`, read directly.
async fn stored(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    owners: i64,
) -> BTreeMap<i64, i64> {
    let mut totals = BTreeMap::new();
    for owner in 1..=owners {
        let total = counters
            .get(db, owner, "views")
            .await
            .expect("read a total");
        totals.insert(owner, total);
    }
    totals
}

/// Adds `n` deltas spread over owners `1..=owners` (a multi-row flush) and
/// counts them into `expected`.
fn add_spread(
    buffer: &CounterBuffer,
    counters: &Counters<i64>,
    owners: i64,
    n: i64,
    expected: &mut BTreeMap<i64, i64>,
) {
    for i in 0..n {
        let owner = i % owners + 1;
        let delta = i % 3 + 1;
        buffer
            .add(counters, owner, "views", delta)
            .expect("add a delta");
        *expected.entry(owner).or_insert(0) += delta;
    }
}

async fn flush(buffer: &CounterBuffer, b: Backend, what: &str) -> BufferStats {
    tokio::time::timeout(FLUSH_LIMIT, buffer.flush())
        .await
        .unwrap_or_else(|_| panic!("[{b}] {what}: flush still not done after {FLUSH_LIMIT:?}"))
        .unwrap_or_else(|e| panic!("[{b}] {what}: flush failed: {e}"));
    buffer.stats()
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_flush_the_ledger_shows_committed_is_not_applied_again(t: TestDb) {
        let b = t.backend;
        let counters = counters::<i64>("ledger_seen", 4);
        counters.create_table(&t.db).await.unwrap();
        FlushLedger::default().create_table(&t.db).await.unwrap();
        let buffer = CounterBuffer::builder(&t.db)
            .interval(INTERVAL)
            .start()
            .await
            .unwrap();
        let writer = buffer.writer_id().to_owned();
        assert_eq!(last_flush(&t.db, &writer).await, None, "[{b}]");

        // As if this buffer's flush 1 had committed and its reply was lost.
        let insert = Query::insert()
            .into_table(Alias::new(LEDGER))
            .columns(["writer_id", "last_flush", "updated_at"].map(Alias::new))
            .values_panic([writer.as_str().into(), 1_i64.into(), 0_i64.into()])
            .to_owned();
        t.sql()
            .execute(&insert)
            .await
            .expect("insert a ledger row");

        let mut first = BTreeMap::new();
        add_spread(&buffer, &counters, 3, 30, &mut first);
        assert_eq!(buffer.unflushed(&counters, 1, "views"), first[&1], "[{b}]");
        let stats = flush(&buffer, b, "flush 1").await;
        eprintln!("[{b}] after flush 1 (ledger at 1): {stats:?}");
        assert_eq!(
            (stats.flushes, stats.replays_skipped, stats.failed_attempts),
            (1, 1, 0),
            "[{b}] {stats:?}"
        );
        assert_eq!((stats.pending_adds, stats.rows_written), (0, 0), "[{b}]");
        assert_eq!(raw::count_rows(&t.db, "ledger_seen").await, 0, "[{b}]");
        assert_eq!(
            stored(&t.db, &counters, 3).await,
            BTreeMap::from([(1, 0), (2, 0), (3, 0)]),
            "[{b}] flush 1 was taken as committed already"
        );
        assert_eq!(buffer.unflushed(&counters, 1, "views"), 0, "[{b}]");
        assert_eq!(buffer.get(&counters, 1, "views").await.unwrap(), 0, "[{b}]");
        assert_eq!(last_flush(&t.db, &writer).await, Some(1), "[{b}]");

        // Flush 2 is new: applied, exactly.
        let mut second = BTreeMap::new();
        add_spread(&buffer, &counters, 3, 20, &mut second);
        let stats = flush(&buffer, b, "flush 2").await;
        eprintln!("[{b}] after flush 2: {stats:?}");
        assert_eq!(
            (stats.flushes, stats.replays_skipped, stats.failed_attempts),
            (2, 1, 0),
            "[{b}] {stats:?}"
        );
        assert_eq!(stats.pending_adds, 0, "[{b}]");
        assert_eq!(stored(&t.db, &counters, 3).await, second, "[{b}]");
        assert_eq!(
            buffer.get(&counters, 2, "views").await.unwrap(),
            second[&2],
            "[{b}]"
        );
        assert_eq!(last_flush(&t.db, &writer).await, Some(2), "[{b}]");

        let stats = buffer.shutdown().await.unwrap();
        assert_eq!((stats.flushes, stats.replays_skipped), (2, 1), "[{b}]");
        assert_eq!(
            last_flush(&t.db, &writer).await,
            None,
            "[{b}] a clean shutdown removes the row"
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_lost_commit_reply_is_not_applied_twice(t: TestDb) {
        let b = t.backend;
        let counters = counters::<i64>("lost_reply", 4);
        counters.create_table(&t.db).await.unwrap();
        FlushLedger::default().create_table(&t.db).await.unwrap();
        if b == Backend::Sqlite {
            // No network to cut: a_flush_the_ledger_shows_committed_is_not_
            // applied_again covers SQLite's ledger. Here a plain flush must
            // be exact, with no failure and no replay.
            let buffer = CounterBuffer::builder(&t.db)
                .interval(INTERVAL)
                .start()
                .await
                .unwrap();
            let mut expected = BTreeMap::new();
            add_spread(&buffer, &counters, 3, 40, &mut expected);
            let stats = flush(&buffer, b, "plain flush").await;
            eprintln!("[{b}] plain flush: {stats:?}");
            assert_eq!(stored(&t.db, &counters, 3).await, expected, "[{b}]");
            assert_eq!(
                (stats.flushes, stats.replays_skipped, stats.failed_attempts),
                (1, 0, 0),
                "[{b}] {stats:?}"
            );
            assert_eq!(
                last_flush(&t.db, buffer.writer_id()).await,
                Some(1),
                "[{b}]"
            );
            buffer.shutdown().await.unwrap();
            t.finish().await;
            return;
        }
        lost_commits_through_a_proxy(&t, &counters).await;
        t.finish().await;
    }
}

/// Cuts flush connections around their `COMMIT` and checks every flush is
/// stored exactly once.
async fn lost_commits_through_a_proxy(t: &TestDb, counters: &Counters<i64>) {
    const OWNERS: i64 = 5;
    let b = t.backend;
    let upstream = t.server_addr().expect("a server address");
    let proxy = Proxy::start(&upstream).await.expect("start the proxy");
    let proxied = t
        .connect_via(&proxy.addr().to_string(), 4)
        .await
        .expect("connect through the proxy");
    let buffer = CounterBuffer::builder(&proxied)
        .interval(INTERVAL)
        .start()
        .await
        .unwrap();
    let writer = buffer.writer_id().to_owned();
    eprintln!(
        "[{b}] proxy {} -> {upstream}; writer {writer}",
        proxy.addr()
    );

    let mut expected = BTreeMap::new();
    let mut flushes = 0u64;
    let rounds = [
        Fault::CutAfterCommit,
        Fault::CutInsteadOfCommit,
        Fault::CutAfterCommit,
        Fault::CutAfterCommit,
        Fault::CutAfterCommit,
        Fault::CutAfterCommit,
        Fault::CutInsteadOfCommit,
    ];
    for (round, fault) in rounds.into_iter().enumerate() {
        let before = buffer.stats();
        let fired = proxy.fired();
        let n = 25 + 7 * round as i64;
        proxy.arm(fault);
        add_spread(&buffer, counters, OWNERS, n, &mut expected);
        let after = flush(&buffer, b, &format!("round {round} ({fault:?})")).await;
        flushes += 1;
        let total: i64 = expected.values().sum();
        let got = stored(&t.db, counters, OWNERS).await;
        eprintln!(
            "[{b}] round {round} {fault:?}: +{n} adds, stored sum {} (expected {total}), \
             failed_attempts {} -> {}, replays_skipped {} -> {}, flushes {}, \
             proxy fired {} commits seen {} connections {}",
            got.values().sum::<i64>(),
            before.failed_attempts,
            after.failed_attempts,
            before.replays_skipped,
            after.replays_skipped,
            after.flushes,
            proxy.fired(),
            proxy.commits_seen(),
            proxy.connections(),
        );
        assert_eq!(
            proxy.fired(),
            fired + 1,
            "[{b}] round {round}: the fault fired"
        );
        assert!(!proxy.is_armed(), "[{b}] round {round}");
        assert_eq!(got, expected, "[{b}] round {round} {fault:?}: stored once");
        assert!(
            after.failed_attempts > before.failed_attempts,
            "[{b}] round {round}: the cut attempt failed: {after:?}"
        );
        let replays = match fault {
            // The retry found its number in the ledger.
            Fault::CutAfterCommit => before.replays_skipped + 1,
            // Nothing committed: the retry applied it.
            Fault::CutInsteadOfCommit => before.replays_skipped,
        };
        assert_eq!(
            after.replays_skipped, replays,
            "[{b}] round {round} {fault:?}: {after:?}"
        );
        assert_eq!(after.flushes, flushes, "[{b}] round {round}");
        assert_eq!(after.pending_adds, 0, "[{b}] round {round}");
        assert_eq!(
            last_flush(&t.db, &writer).await,
            Some(flushes as i64),
            "[{b}] round {round}: the ledger is at this flush"
        );
        for owner in [1, OWNERS] {
            assert_eq!(
                buffer.get(counters, owner, "views").await.unwrap(),
                expected[&owner],
                "[{b}] round {round}: read-your-writes"
            );
        }
    }

    // With nothing armed, a flush goes through on its first attempt.
    let before = buffer.stats();
    add_spread(&buffer, counters, OWNERS, 10, &mut expected);
    let after = flush(&buffer, b, "unfaulted").await;
    assert_eq!(stored(&t.db, counters, OWNERS).await, expected, "[{b}]");
    assert_eq!(
        (after.failed_attempts, after.replays_skipped),
        (before.failed_attempts, before.replays_skipped),
        "[{b}] {after:?}"
    );
    let stats = buffer.shutdown().await.unwrap();
    eprintln!(
        "[{b}] final: stored sum {}, {stats:?}",
        expected.values().sum::<i64>()
    );
    assert_eq!(
        stats.replays_skipped,
        rounds
            .iter()
            .filter(|f| **f == Fault::CutAfterCommit)
            .count() as u64,
        "[{b}]"
    );
    assert_eq!(last_flush(&t.db, &writer).await, None, "[{b}]");
    counter_tests::figures(
        "buffer_lost_commit_replies",
        b,
        &[
            ("adds", stats.adds),
            ("flushes", stats.flushes),
            ("faults_injected", rounds.len() as u64),
            ("replays_skipped", stats.replays_skipped),
            ("increments_lost", 0),
        ],
    );
    proxied.close().await.expect("close the proxied pool");
}
