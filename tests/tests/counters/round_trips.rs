//! What an add costs in the caller's transaction, counted statement by
//! statement (issue 48): one upsert, and no savepoint, on every backend,
//! while the rare add that meets the slot cap is still settled in it, and a
//! refused one leaves the transaction usable with nothing of it applied.

use counter_core::{CounterTable, Counters, DeltaBatch, ErrorKind, Window};
use counter_tests::{Backend, TestDb, backend_test, counters, counting::Counting};
use sea_orm::TransactionTrait;

/// Room left below the slot cap (2^53 - 1) after `near_cap`.
const ROOM: i64 = 10;
const SLOT_CAP: i64 = (1 << 53) - 1;

/// Statements whose SQL starts with `SAVEPOINT`, however the crate sent them.
fn savepoint_statements(statements: &[String]) -> usize {
    statements
        .iter()
        .filter(|s| s.trim_start().to_ascii_uppercase().starts_with("SAVEPOINT"))
        .count()
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "txn_round_trips"]
    async fn an_add_in_a_transaction_is_one_statement(t: TestDb) {
        let b = t.backend;
        let c = counters::<i64>("trips", 16);
        c.create_table(&t.db).await.unwrap();
        let w = Counters::<i64>::new(
            CounterTable::new("trips_w")
                .and_then(|t| t.with_slots(4))
                .and_then(|t| t.with_key_window("views", Window::Day))
                .unwrap(),
        );
        w.create_table(&t.db).await.unwrap();
        // Rows already there, as in a running application.
        c.add_many(&t.db, (1..=8).flat_map(|o| [(o, "likes", 1), (o, "shares", 1)]))
            .await
            .unwrap();

        let txn = t.db.begin().await.unwrap();
        let counted = Counting::new(&txn);

        c.increment(&counted, 1, "likes").await.unwrap();
        c.add(&counted, 9, "likes", -3).await.unwrap(); // a new row
        let sent = counted.take();
        assert_eq!(sent.statements.len(), 2, "[{b}] an add is one statement: {sent:?}");
        assert_eq!(sent.savepoints, 0, "[{b}] {sent:?}");

        c.add_many(&counted, [(1, "likes", 1), (2, "likes", 2), (3, "shares", 5)])
            .await
            .unwrap();
        let sent = counted.take();
        assert_eq!((sent.statements.len(), sent.savepoints), (1, 0), "[{b}] add_many: {sent:?}");

        let mut batch = DeltaBatch::new();
        batch.add(&c, 4, "likes", 1).unwrap().add(&c, 10, "likes", 1).unwrap();
        batch.apply_in(&counted).await.unwrap();
        let sent = counted.take();
        assert_eq!((sent.statements.len(), sent.savepoints), (1, 0), "[{b}] apply_in: {sent:?}");

        // A windowed key writes its total and its bucket: two statements,
        // which PostgreSQL runs in the transaction (a failure aborts it
        // whole); MySQL and SQLite keep a savepoint, since they would keep
        // the first statement if the second failed.
        w.increment(&counted, 1, "views").await.unwrap();
        let sent = counted.take();
        assert_eq!(savepoint_statements(&sent.statements), 0, "[{b}] {sent:?}");
        match b {
            Backend::Postgres => {
                assert_eq!((sent.statements.len(), sent.savepoints), (2, 0), "[{b}] {sent:?}")
            }
            Backend::Sqlite | Backend::MySql => {
                assert_eq!((sent.statements.len(), sent.savepoints), (0, 1), "[{b}] {sent:?}")
            }
        }
        txn.commit().await.unwrap();

        let page = c.get_many(&t.db, &[1, 2, 3, 4, 9, 10], &["likes", "shares"]).await.unwrap();
        assert_eq!(
            [(1, "likes"), (2, "likes"), (3, "shares"), (4, "likes"), (9, "likes"), (10, "likes")]
                .map(|(o, k)| page[&o][k]),
            [3, 3, 6, 2, -3, 1],
            "[{b}] every add committed"
        );
        assert_eq!(w.get(&t.db, 1, "views").await.unwrap(), 1, "[{b}]");
        t.finish().await;
    }
}

/// A counter of one slot holding `SLOT_CAP - ROOM`: the next add beyond
/// `ROOM` meets the cap and is settled (spread over a second slot).
async fn near_cap(t: &TestDb, c: &Counters<i64>, owner: i64) {
    c.add(&t.db, owner, "likes", SLOT_CAP - ROOM).await.unwrap();
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "txn_cap_settled"]
    async fn the_cap_is_settled_inside_the_transaction(t: TestDb) {
        let b = t.backend;
        let c = counters::<i64>("trips_cap", 1);
        c.create_table(&t.db).await.unwrap();
        near_cap(&t, &c, 1).await;
        near_cap(&t, &c, 2).await;
        c.add(&t.db, 1, "far", 1).await.unwrap();

        // Single adds and a batch in which one counter meets the cap, the
        // other does not: all settled or written in the transaction, which
        // stays usable.
        let txn = t.db.begin().await.unwrap();
        let counted = Counting::new(&txn);
        // `add` settles in a transaction of its own, a savepoint: the rare
        // case pays for it, after its one fast statement.
        c.add(&counted, 1, "likes", ROOM + 5).await.unwrap();
        let sent = counted.take();
        assert_eq!((sent.statements.len(), sent.savepoints), (1, 1), "[{b}] settled: {sent:?}");
        // `apply_in` cannot open one: it settles in the transaction itself.
        let mut batch = DeltaBatch::new();
        batch.add(&c, 1, "far", 2).unwrap().add(&c, 2, "likes", ROOM + 7).unwrap();
        batch.apply_in(&counted).await.unwrap();
        let sent = counted.take();
        assert!(sent.statements.len() > 1, "[{b}] the batch met the cap: {sent:?}");
        assert_eq!(savepoint_statements(&sent.statements), 0, "[{b}] {sent:?}");
        assert_eq!(sent.savepoints, 0, "[{b}] {sent:?}");
        c.add_many(&counted, [(1, "far", 3), (2, "likes", 1)]).await.unwrap();
        txn.commit().await.unwrap();
        let page = c.get_many(&t.db, &[1, 2], &["likes", "far"]).await.unwrap();
        assert_eq!(
            (page[&1]["likes"], page[&2]["likes"], page[&1]["far"]),
            (SLOT_CAP + 5, SLOT_CAP + 8, 6),
            "[{b}] settled exactly"
        );

        // A batch with one counter whose total would leave i64: refused with
        // Overflow; what the batch wrote before the refusal is taken back, in
        // a transaction that stays usable and commits what came before.
        c.add(&t.db, 3, "likes", i64::MAX).await.unwrap();
        for apply_in in [false, true] {
            let txn = t.db.begin().await.unwrap();
            c.increment(&txn, 5, "kept").await.unwrap();
            // Owner 3's total is refused; the others are written (before
            // it, or in the same statement) and taken back.
            let mut batch = DeltaBatch::new();
            batch
                .add(&c, 1, "far", 100).unwrap()
                .add(&c, 4, "likes", 100).unwrap()
                .add(&c, 3, "likes", 1).unwrap()
                .add(&c, 2, "likes", ROOM).unwrap();
            let refused = match apply_in {
                true => batch.apply_in(&txn).await,
                false => batch.apply(&txn).await,
            };
            assert!(
                matches!(&refused, Err(e) if e.kind() == ErrorKind::Overflow),
                "[{b}] apply_in={apply_in}: {refused:?}"
            );
            // Still usable: a read and a write in it, then the commit.
            assert_eq!(c.get(&txn, 1, "far").await.unwrap(), 6, "[{b}] apply_in={apply_in}");
            c.increment(&txn, 5, "kept").await.unwrap();
            txn.commit().await.unwrap();
            let page = c.get_many(&t.db, &[1, 2, 3, 4], &["likes", "far"]).await.unwrap();
            assert_eq!(
                (page[&1]["far"], page[&2]["likes"], page[&3]["likes"], page[&4]["likes"]),
                (6, SLOT_CAP + 8, i64::MAX, 0),
                "[{b}] apply_in={apply_in}: nothing of the refused batch"
            );
        }
        assert_eq!(c.get(&t.db, 5, "kept").await.unwrap(), 4, "[{b}] the rest committed");
        t.finish().await;
    }
}
