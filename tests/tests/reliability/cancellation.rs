//! A dropped call never blocks a later one.
//!
//! axum drops a handler's future when its client goes away, so any call of
//! the library may stop at any `.await`. This torture run drops a share of
//! every kind of call (direct writes, batches, writes in the caller's
//! transaction, counted child writes, buffer flushes and reads, compaction,
//! recounts) after a random 50 µs to 20 ms, for a few seconds, with 64
//! writers on one hot counter. Then every kind of call runs again, each
//! bounded by a timeout, on the old pool and on a fresh one: none may hang
//! or fail. The hot counter must lie within what was acknowledged plus what
//! was in doubt (a dropped write may or may not have committed), and the
//! counter cache must equal its rows exactly: a counted child write commits
//! with its counter or not at all.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering::SeqCst},
    },
    time::{Duration, Instant},
};

use counter_core::{
    BufferError, Compact, CounterBuffer, DeltaBatch, FlushLedger, Reconcile, ReconcileReport,
    Truth, prelude::*,
};
use counter_tests::{Backend, TestDb, backend_test, env_number, figures, sql::Sql};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::{
    ColumnTrait, Condition, ConnectOptions, ConnectionTrait, Database, DatabaseConnection,
    DbBackend, EntityTrait, IntoActiveModel, QueryFilter, Schema, Set, SqliteTransactionMode,
    TransactionOptions, TransactionTrait,
};

mod owner {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "torture_owners")]
    #[counter(keys(hot, views(window = day), children), slots = 8, table = "torture_counters")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

mod child {
    use counter_core::CounterCache;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, CounterCache)]
    #[sea_orm(table_name = "torture_children")]
    #[counter_cache(parent = super::owner::Entity, key = children, via = owner_id)]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub owner_id: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    counter_core::counter_cache_behavior!();
}

use owner::counters::Key;

const HOT: i64 = 7;
/// Owners of the counted children (the hot one among them).
const PARENTS: [i64; 3] = [7, 8, 9];
const WRITERS: usize = 64;
const CHILD_WRITERS: usize = 4;
/// The share of calls dropped mid-flight.
const DROP_SHARE: f64 = 0.3;
/// A call not dropped on purpose must end within this: past it, it hung.
const PATIENCE: Duration = Duration::from_secs(30);

/// Seconds of torture per backend: `COUNTER_TORTURE_SECS`, default 6.
fn torture_secs() -> u64 {
    env_number("COUNTER_TORTURE_SECS").unwrap_or(6)
}

/// What the run saw, shared by its tasks.
#[derive(Default)]
struct Tally {
    calls: AtomicU64,
    dropped: AtomicU64,
    hung: AtomicU64,
    /// Calls not dropped that returned an error.
    failed: AtomicU64,
    /// Of those, all but a buffered read that could not be made exact in
    /// time (`FlushInDoubt`, documented: retry it).
    unexpected: AtomicU64,
    /// Owners a recount found drifted: counted child writes commit with
    /// their counter, so any drift is a bug (a write or a recount that
    /// counted twice).
    recount_drift: AtomicU64,
    /// The hot counter: acknowledged, and the positive and negative sums of
    /// the writes whose outcome is unknown (dropped or failed).
    hot: Mutex<Bounds>,
    errors: Mutex<Vec<String>>,
}

#[derive(Default, Clone, Copy, Debug)]
struct Bounds {
    acknowledged: i64,
    doubt_up: i64,
    doubt_down: i64,
}

/// How one call ended.
enum Ended<T> {
    Done(T),
    Dropped,
}

impl Tally {
    /// Runs `call`, dropped after a random 50 µs to 20 ms with probability
    /// `DROP_SHARE` (`dropping`), or else bounded by `PATIENCE`. An error
    /// of a call not dropped is recorded (it must not happen, unless
    /// `may_fail`).
    async fn call<T, E: std::fmt::Debug>(
        &self,
        what: &str,
        rng: &mut StdRng,
        dropping: bool,
        call: impl Future<Output = Result<T, E>>,
    ) -> Ended<Result<T, E>> {
        self.calls.fetch_add(1, SeqCst);
        if dropping && rng.random_bool(DROP_SHARE) {
            let after = Duration::from_micros(rng.random_range(50..20_000));
            return match tokio::time::timeout(after, call).await {
                Ok(done) => Ended::Done(done),
                Err(_) => {
                    self.dropped.fetch_add(1, SeqCst);
                    Ended::Dropped
                }
            };
        }
        match tokio::time::timeout(PATIENCE, call).await {
            Ok(Ok(value)) => Ended::Done(Ok(value)),
            Ok(Err(e)) => {
                self.failed.fetch_add(1, SeqCst);
                let error = format!("{e:?}");
                // The one failure documented as "retry it": a buffered read
                // in doubt (its `Debug` form, since calls of every type end
                // here).
                if error != format!("{:?}", CounterError::from(BufferError::FlushInDoubt)) {
                    self.unexpected.fetch_add(1, SeqCst);
                }
                self.note(format!("{what} failed: {error}"));
                Ended::Done(Err(e))
            }
            Err(_) => {
                self.hung.fetch_add(1, SeqCst);
                self.note(format!("{what} hung for {PATIENCE:?}"));
                Ended::Dropped
            }
        }
    }

    /// A hot-counter write of `delta` ended so.
    fn hot<T, E>(&self, delta: i64, ended: &Ended<Result<T, E>>) {
        let mut hot = self.hot.lock().unwrap();
        match ended {
            Ended::Done(Ok(_)) => hot.acknowledged += delta,
            _ if delta > 0 => hot.doubt_up += delta,
            _ => hot.doubt_down += delta,
        }
    }

    /// A recount ended so: the drift it found.
    fn drift_found<E>(&self, ended: &Ended<Result<ReconcileReport<i64>, E>>) {
        if let Ended::Done(Ok(report)) = ended {
            self.recount_drift.fetch_add(report.owners_drifted, SeqCst);
        }
    }

    fn note(&self, error: String) {
        let mut errors = self.errors.lock().unwrap();
        if errors.len() < 20 {
            errors.push(error);
        }
    }
}

async fn setup(t: &TestDb) {
    let schema = Schema::new(t.db.get_database_backend());
    t.sql()
        .execute(&schema.create_table_from_entity(child::Entity))
        .await
        .expect("create children");
    owner::Entity::counters()
        .create_table(&t.db)
        .await
        .expect("create the counter table");
    FlushLedger::default()
        .create_table(&t.db)
        .await
        .expect("create the flush ledger");
}

/// One hot-counter write of a random kind; some are dropped.
async fn hot_write(
    db: &DatabaseConnection,
    buffer: &CounterBuffer,
    tally: &Tally,
    rng: &mut StdRng,
) {
    let delta = rng.random_range(1..=5);
    match rng.random_range(0..7) {
        0 => {
            let ended = tally
                .call(
                    "increment",
                    rng,
                    true,
                    owner::Entity::counters().increment(db, HOT, Key::Hot),
                )
                .await;
            tally.hot(1, &ended);
        }
        1 => {
            let ended = tally
                .call(
                    "decrement",
                    rng,
                    true,
                    owner::Entity::counters().decrement(db, HOT, Key::Hot),
                )
                .await;
            tally.hot(-1, &ended);
        }
        2 => {
            let ended = tally
                .call(
                    "add",
                    rng,
                    true,
                    owner::Entity::counters().add(db, HOT, Key::Hot, -delta),
                )
                .await;
            tally.hot(-delta, &ended);
        }
        3 => {
            let deltas = [(HOT, Key::Hot, delta), (HOT, Key::Views, 1)];
            let ended = tally
                .call(
                    "add_many",
                    rng,
                    true,
                    owner::Entity::counters().add_many(db, deltas),
                )
                .await;
            tally.hot(delta, &ended);
        }
        4 => {
            let owners = owner::Entity::counters();
            let mut batch = DeltaBatch::new();
            let built = batch
                .add(owners, HOT, Key::Hot, delta)
                .and_then(|b| b.add(owners, 9, Key::Views, 1));
            built.expect("a valid batch");
            let ended = tally.call("batch", rng, true, batch.apply(db)).await;
            tally.hot(delta, &ended);
        }
        5 => {
            // In the caller's own transaction, committed. The crate cannot
            // own that transaction's connection, so the caller runs it in a
            // task of its own, as the docs say to where a handler may be
            // dropped (`sea_orm`/sqlx transactions are not safe to drop
            // mid-statement, transact-rs/sqlx#563); what is dropped is the
            // wait for it.
            let db = db.clone();
            let write = tokio::spawn(async move {
                let txn = db
                    .begin_with_options(TransactionOptions {
                        sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
                        ..Default::default()
                    })
                    .await?;
                owner::Entity::counters()
                    .add(&txn, HOT, Key::Hot, delta)
                    .await?;
                txn.commit().await?;
                Ok::<_, counter_core::CounterError>(())
            });
            let joined = async { write.await.expect("the transaction task") };
            let ended = tally.call("add in a transaction", rng, true, joined).await;
            tally.hot(delta, &ended);
        }
        _ => {
            // Through the buffer: the add is taken at once; a flush or a
            // read may be dropped.
            match buffer.add(owner::Entity::counters(), HOT, Key::Hot, delta) {
                Ok(()) => tally.hot::<(), ()>(delta, &Ended::Done(Ok(()))),
                Err(e) => {
                    tally.failed.fetch_add(1, SeqCst);
                    tally.note(format!("buffer add: {e:?}"));
                }
            }
            if rng.random_bool(0.2) {
                tally.call("buffer flush", rng, true, buffer.flush()).await;
            } else if rng.random_bool(0.1) {
                let read = buffer.get(owner::Entity::counters(), HOT, Key::Hot);
                tally.call("buffer read", rng, true, read).await;
            }
        }
    }
}

/// One counted child write of a random kind; some are dropped.
async fn child_write(db: &DatabaseConnection, tally: &Tally, rng: &mut StdRng) {
    let parent = PARENTS[rng.random_range(0..PARENTS.len())];
    let some_child = || async {
        let sql = Sql::new(db);
        let find = child::Entity::find()
            .filter(child::Column::OwnerId.eq(parent))
            .one(&sql);
        match tally
            .call("find a child", &mut StdRng::seed_from_u64(0), false, find)
            .await
        {
            Ended::Done(found) => found,
            Ended::Dropped => Ok(None),
        }
    };
    match rng.random_range(0..5) {
        0 | 1 => {
            let row = child::ActiveModel {
                owner_id: Set(parent),
                ..Default::default()
            };
            tally
                .call(
                    "insert_counted",
                    rng,
                    true,
                    child::Entity::insert_counted(db, row),
                )
                .await;
        }
        2 => {
            let rows = (0..3).map(|_| child::ActiveModel {
                owner_id: Set(parent),
                ..Default::default()
            });
            let rows: Vec<_> = rows.collect();
            tally
                .call(
                    "insert_many_counted",
                    rng,
                    true,
                    child::Entity::insert_many_counted(db, rows),
                )
                .await;
        }
        3 => {
            if let Ok(Some(row)) = some_child().await {
                let gone = child::Entity::delete_counted(db, row.into_active_model());
                tally.call("delete_counted", rng, true, gone).await;
            }
        }
        _ => {
            if let Ok(Some(row)) = some_child().await {
                let filter = Condition::all()
                    .add(child::Column::OwnerId.eq(parent))
                    .add(child::Column::Id.lte(row.id + 2));
                let gone = child::Entity::delete_many_counted(db, filter);
                tally.call("delete_many_counted", rng, true, gone).await;
            }
        }
    }
}

/// A compaction pass or a recount; some are dropped. Recounts may find the
/// counter busy (another recount holds it): that is not a failure.
async fn maintenance(db: &DatabaseConnection, tally: &Tally, rng: &mut StdRng) {
    if rng.random_bool(0.5) {
        let options = Compact::new()
            .min_rows(2)
            .batch_rows(rng.random_range(1..=8));
        tally
            .call(
                "compact",
                rng,
                true,
                owner::Entity::counters().compact(db, &options),
            )
            .await;
    } else {
        let options = Reconcile::new()
            .batch_size(rng.random_range(1..=3))
            .dry_run(rng.random_bool(0.3));
        let truth = Truth::counter_cache::<child::Entity>();
        let recount = owner::Entity::counters().reconcile(db, Key::Children, truth, &options);
        let ended = tally.call("reconcile", rng, true, recount).await;
        tally.drift_found(&ended);
    }
}

/// Every kind of call once, none dropped, each bounded: the calls after
/// the torture. Returns how many ran.
async fn every_call(db: &DatabaseConnection, tally: &Tally, rng: &mut StdRng) -> u64 {
    let before = tally.calls.load(SeqCst);
    let ended = tally
        .call(
            "later increment",
            rng,
            false,
            owner::Entity::counters().increment(db, HOT, Key::Hot),
        )
        .await;
    tally.hot(1, &ended);
    tally
        .call(
            "later get",
            rng,
            false,
            owner::Entity::counters().get(db, HOT, Key::Hot),
        )
        .await;
    tally
        .call(
            "later counts",
            rng,
            false,
            owner::Entity::counters().counts(db, HOT),
        )
        .await;
    let today = chrono::Utc::now();
    let range = owner::Entity::counters().range(
        db,
        HOT,
        Key::Views,
        today - chrono::Duration::days(1),
        today,
    );
    tally.call("later range", rng, false, range).await;
    let ended = tally
        .call(
            "later add_many",
            rng,
            false,
            owner::Entity::counters().add_many(db, [(HOT, Key::Hot, 2)]),
        )
        .await;
    tally.hot(2, &ended);
    let row = child::ActiveModel {
        owner_id: Set(HOT),
        ..Default::default()
    };
    if let Ended::Done(Ok(row)) = tally
        .call(
            "later insert_counted",
            rng,
            false,
            child::Entity::insert_counted(db, row),
        )
        .await
    {
        let gone = child::Entity::delete_counted(db, row.into_active_model());
        tally.call("later delete_counted", rng, false, gone).await;
    }
    let quiet = Compact::new().min_rows(2);
    tally
        .call(
            "later compact",
            rng,
            false,
            owner::Entity::counters().compact(db, &quiet),
        )
        .await;
    for dry_run in [true, false] {
        let truth = Truth::counter_cache::<child::Entity>();
        let options = Reconcile::new().batch_size(2).dry_run(dry_run);
        let recount = owner::Entity::counters().reconcile(db, Key::Children, truth, &options);
        let ended = tally.call("later reconcile", rng, false, recount).await;
        tally.drift_found(&ended);
    }
    let write = async {
        let txn = db.begin().await?;
        owner::Entity::counters()
            .add(&txn, HOT, Key::Views, 1)
            .await?;
        txn.commit().await?;
        Ok::<_, counter_core::CounterError>(())
    };
    tally.call("later transaction", rng, false, write).await;
    tally.calls.load(SeqCst) - before
}

/// Connections the pool counts as its own that do not come back to it
/// within 10 s of the last call: stranded by a dropped call.
async fn stranded_connections(db: &DatabaseConnection) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (size, idle) = match db.get_database_backend() {
            DbBackend::MySql => {
                let pool = db.get_mysql_connection_pool();
                (pool.size(), pool.num_idle() as u32)
            }
            DbBackend::Postgres => {
                let pool = db.get_postgres_connection_pool();
                (pool.size(), pool.num_idle() as u32)
            }
            _ => {
                let pool = db.get_sqlite_connection_pool();
                (pool.size(), pool.num_idle() as u32)
            }
        };
        if size == idle || Instant::now() >= deadline {
            return u64::from(size - idle);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Asserts each parent's counter cache equals its rows.
async fn assert_children_exact(db: &DatabaseConnection, backend: Backend, step: &str) {
    for parent in PARENTS {
        let rows = child::Entity::find()
            .filter(child::Column::OwnerId.eq(parent))
            .all(&Sql::new(db))
            .await
            .unwrap()
            .len() as i64;
        let stored = owner::Entity::counters()
            .get(db, parent, Key::Children)
            .await
            .unwrap();
        assert_eq!(stored, rows, "[{backend}] {step}: children of {parent}");
    }
}

/// A pool like the test's, opened anew.
async fn fresh_pool(t: &TestDb) -> DatabaseConnection {
    match t.url() {
        Some(url) => {
            let mut options = ConnectOptions::new(url);
            options.max_connections(8).sqlx_logging(false);
            if let Some(schema) = t.schema() {
                options.set_schema_search_path(schema);
            }
            Database::connect(options).await.expect("a fresh pool")
        }
        // In-memory SQLite lives in its one connection: the same pool.
        None => t.db.clone(),
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn dropped_calls_never_block_later_ones(t: TestDb) {
        let secs = torture_secs();
        setup(&t).await;
        let buffer = CounterBuffer::builder(&t.db)
            .interval(Duration::from_millis(20))
            .start()
            .await
            .expect("a buffer");
        let tally = Arc::new(Tally::default());
        let deadline = Instant::now() + Duration::from_secs(secs);
        let mut tasks = Vec::new();
        for task in 0..WRITERS + CHILD_WRITERS + 2 {
            let (db, buffer, tally) = (t.db.clone(), buffer.clone(), tally.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(task as u64);
                while Instant::now() < deadline {
                    match task {
                        _ if task < WRITERS => hot_write(&db, &buffer, &tally, &mut rng).await,
                        _ if task < WRITERS + CHILD_WRITERS => {
                            child_write(&db, &tally, &mut rng).await
                        }
                        _ => maintenance(&db, &tally, &mut rng).await,
                    }
                }
            }));
        }
        eprintln!("[{}] torture started", t.backend);
        for task in tasks {
            tokio::time::timeout(PATIENCE * 2, task)
                .await
                .expect("a torture task ends")
                .expect("a torture task does not panic");
        }
        let flushed = tokio::time::timeout(PATIENCE, buffer.shutdown()).await;
        assert!(
            matches!(flushed, Ok(Ok(_))),
            "[{}] the buffer flushes everything it took: {flushed:?}",
            t.backend
        );
        eprintln!("[{}] torture ended", t.backend);
        let during = tally.calls.load(SeqCst);
        let failed_during = tally.failed.load(SeqCst);
        for error in tally.errors.lock().unwrap().drain(..) {
            eprintln!("[{}] during the torture: {error}", t.backend);
        }

        assert_children_exact(&t.db, t.backend, "after the torture").await;

        // Every kind of call, on the old pool, then on a fresh one.
        let mut rng = StdRng::seed_from_u64(99);
        let mut later = every_call(&t.db, &tally, &mut rng).await;
        eprintln!("[{}] later calls on the old pool ended", t.backend);
        let fresh = fresh_pool(&t).await;
        later += every_call(&fresh, &tally, &mut rng).await;

        let errors = tally.errors.lock().unwrap().clone();
        assert_eq!(
            tally.hung.load(SeqCst),
            0,
            "[{}] calls hung: {errors:#?}",
            t.backend
        );
        assert_eq!(
            tally.failed.load(SeqCst),
            failed_during,
            "[{}] a later call failed: {errors:#?}",
            t.backend
        );

        // The hot counter lies within what was acknowledged and in doubt.
        let bounds = *tally.hot.lock().unwrap();
        let total = owner::Entity::counters()
            .get(&fresh, HOT, Key::Hot)
            .await
            .unwrap();
        let (low, high) = (
            bounds.acknowledged + bounds.doubt_down,
            bounds.acknowledged + bounds.doubt_up,
        );
        assert!(
            (low..=high).contains(&total),
            "[{}] hot total {total} outside [{low}, {high}] ({bounds:?})",
            t.backend
        );
        // The counter cache equals its rows, and no recount ever found drift.
        assert_children_exact(&fresh, t.backend, "after the later calls").await;
        let drift = tally.recount_drift.load(SeqCst);
        assert_eq!(drift, 0, "[{}] owners a recount found drifted", t.backend);
        assert_eq!(
            tally.unexpected.load(SeqCst),
            0,
            "[{}] calls failed (see the errors above)",
            t.backend
        );
        // Every connection the old pool lent out comes back: none is left
        // stranded by a dropped call (waiting for an answer that never
        // comes, holding its place in the pool), and the pool closes.
        let stranded = stranded_connections(&t.db).await;
        let closed = tokio::time::timeout(PATIENCE, t.db.clone().close()).await;
        if !matches!(closed, Ok(Ok(()))) {
            tally.hung.fetch_add(1, SeqCst);
            tally.note(format!("closing the old pool: {closed:?}"));
        }
        later += 1;
        assert_eq!(
            stranded, 0,
            "[{}] connections stranded in the old pool",
            t.backend
        );
        assert_eq!(
            tally.hung.load(SeqCst),
            0,
            "[{}] {:#?}",
            t.backend,
            tally.errors.lock().unwrap()
        );
        if t.backend != Backend::Sqlite {
            let closed = tokio::time::timeout(PATIENCE, fresh.close()).await;
            assert!(
                matches!(closed, Ok(Ok(()))),
                "[{}] the fresh pool closes",
                t.backend
            );
        }
        figures(
            "dropped_calls",
            t.backend,
            &[
                ("stranded_connections", stranded),
                ("seconds", secs),
                ("calls", during),
                ("dropped", tally.dropped.load(SeqCst)),
                ("failed_during", failed_during),
                ("recount_drift", drift),
                ("later_calls", later),
                ("later_hung", tally.hung.load(SeqCst)),
                ("in_doubt", (bounds.doubt_up - bounds.doubt_down) as u64),
                ("increments_lost", (low - total).max(0) as u64),
            ],
        );
        t.finish().await;
    }
}
