//! A counted delete uncounts exactly what it deleted: a join table with a
//! natural key (favorites, keyed `(article_id, user_id)`) whose rows are
//! inserted, deleted and moved (made visible or hidden) by many tasks at
//! the same instant, through the `*_counted` helpers and through the hooks
//! in the caller's own transaction, ends with counters equal to its rows,
//! on every backend and at the isolation levels applications run
//! (PostgreSQL's READ COMMITTED, MariaDB's REPEATABLE READ and READ
//! COMMITTED).

use std::{sync::Arc, time::Duration};

use counter_core::{CounterError, prelude::*};
use counter_tests::{Backend, TestDb, backend_test, figures, sql::Sql};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::{
    ActiveModelTrait, ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend,
    DbErr, EntityTrait, IntoActiveModel, Schema, Set, SqliteTransactionMode, TransactionOptions,
    TransactionTrait,
};
use tokio::sync::Barrier;

mod article {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "articles")]
    #[counter(
        keys(favorites, visible_favorites),
        slots = 4,
        table = "article_counters"
    )]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// The join table, keyed by the pair it joins (no surrogate id).
mod favorite {
    use counter_core::CounterCache;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, CounterCache)]
    #[sea_orm(table_name = "favorites")]
    #[counter_cache(parent = super::article::Entity, key = favorites, via = article_id)]
    #[counter_cache(parent = super::article::Entity, key = visible_favorites, via = article_id, when = visible)]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub article_id: i64,
        #[sea_orm(primary_key, auto_increment = false)]
        pub user_id: i64,
        pub visible: bool,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    counter_core::counter_cache_behavior!();
}

use article::counters::Counts;

const ARTICLES: i64 = 2;
const USERS: i64 = 16;
/// Rounds of races per pool; each round races every (article, user) key.
const ROUNDS: u64 = 10;
/// No round waits longer than this for its tasks.
const ROUND_LIMIT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug)]
enum Op {
    Insert,
    Delete,
    Move,
}

/// How a task writes: through the `*_counted` helpers (their own
/// transaction), or with the `ActiveModel` methods in a transaction of its
/// own that runs the hooks.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    Helpers,
    Hooks,
}

#[derive(Default)]
struct Tally {
    races: u64,
    inserted: u64,
    deleted: u64,
    moved: u64,
    refused: u64,
}

fn key(article: i64, user: i64) -> favorite::ActiveModel {
    favorite::ActiveModel {
        article_id: Set(article),
        user_id: Set(user),
        ..Default::default()
    }
}

/// The row of `(article, user)` with its `visible` flag: what an insert
/// writes and a move sets.
fn row(article: i64, user: i64, visible: bool) -> favorite::ActiveModel {
    favorite::ActiveModel {
        visible: Set(visible),
        ..key(article, user)
    }
}

/// One write; `Ok(true)` when it changed a row. Expected refusals (a
/// duplicate insert, a move or delete of a missing row, a deadlock victim)
/// are `Ok(false)`: they changed nothing.
async fn write(
    db: &DatabaseConnection,
    op: Op,
    path: Path,
    article: i64,
    user: i64,
    visible: bool,
) -> bool {
    let result = match path {
        Path::Helpers => helper_write(db, op, article, user, visible).await,
        Path::Hooks => hook_write(db, op, article, user, visible).await,
    };
    match result {
        Ok(changed) => changed,
        Err(e) if refused(&e, db.get_database_backend()) => false,
        Err(e) => panic!("{op:?} through {path:?} of ({article}, {user}): {e}"),
    }
}

async fn helper_write(
    db: &DatabaseConnection,
    op: Op,
    article: i64,
    user: i64,
    visible: bool,
) -> Result<bool, CounterError> {
    let row = row(article, user, visible);
    match op {
        Op::Insert => favorite::Entity::insert_counted(db, row)
            .await
            .map(|_| true),
        Op::Delete => favorite::Entity::delete_counted(db, key(article, user))
            .await
            .map(|done| done.rows_affected == 1),
        Op::Move => favorite::Entity::update_counted(db, row)
            .await
            .map(|_| true),
    }
}

async fn hook_write(
    db: &DatabaseConnection,
    op: Op,
    article: i64,
    user: i64,
    visible: bool,
) -> Result<bool, CounterError> {
    let txn = db
        .begin_with_options(TransactionOptions {
            sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
            ..Default::default()
        })
        .await?;
    let written: Result<bool, DbErr> = match op {
        Op::Insert => row(article, user, visible).insert(&txn).await.map(|_| true),
        Op::Delete => key(article, user)
            .delete(&txn)
            .await
            .map(|done| done.rows_affected == 1),
        Op::Move => row(article, user, visible).update(&txn).await.map(|_| true),
    };
    match written {
        Ok(changed) => {
            txn.commit().await?;
            Ok(changed)
        }
        Err(e) => {
            // The hooks' rule: roll back after any error.
            txn.rollback().await?;
            Err(CounterError::from(e))
        }
    }
}

/// A write that was refused and changed nothing: a duplicate insert, a
/// move of a missing row, or a deadlock victim (counted apart, in
/// [`deadlocks`]).
fn refused(e: &CounterError, backend: DbBackend) -> bool {
    let deadlock = match e {
        CounterError::Conflict { .. } => true,
        CounterError::Database(db) => {
            let message = db.to_string().to_lowercase();
            message.contains("deadlock") || message.contains("could not serialize")
        }
        _ => false,
    };
    if deadlock {
        deadlocks(backend).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return true;
    }
    match e {
        CounterError::Database(DbErr::RecordNotUpdated) => true,
        CounterError::Database(db) => matches!(
            db.sql_err(),
            Some(sea_orm::SqlErr::UniqueConstraintViolation(_))
        ),
        _ => false,
    }
}

/// Writes on `backend` that lost a deadlock or a serialization failure (the
/// database undid them): reported, so that a lock-order regression shows.
/// One count per backend: the backends' tests run in parallel in one process.
fn deadlocks(backend: DbBackend) -> &'static std::sync::atomic::AtomicU64 {
    static DEADLOCKS: [std::sync::atomic::AtomicU64; 3] =
        [const { std::sync::atomic::AtomicU64::new(0) }; 3];
    &DEADLOCKS[match backend {
        DbBackend::Sqlite => 0,
        DbBackend::Postgres => 1,
        _ => 2,
    }]
}

/// Every (article, user) key raced by an insert, a delete and a move at
/// once, `ROUNDS` times, each task on a random path in `paths`.
async fn race(db: &DatabaseConnection, paths: &[Path], seed: u64, tally: &mut Tally) {
    let mut rng = StdRng::seed_from_u64(seed);
    for _ in 0..ROUNDS {
        let tasks = (ARTICLES * USERS * 3) as usize;
        let barrier = Arc::new(Barrier::new(tasks));
        let mut handles = Vec::with_capacity(tasks);
        for article in 1..=ARTICLES {
            for user in 1..=USERS {
                for op in [Op::Insert, Op::Delete, Op::Move] {
                    let (db, barrier) = (db.clone(), barrier.clone());
                    let path = paths[rng.random_range(0..paths.len())];
                    let visible = rng.random_bool(0.5);
                    handles.push(tokio::spawn(async move {
                        barrier.wait().await;
                        (op, write(&db, op, path, article, user, visible).await)
                    }));
                }
            }
        }
        let round = async {
            for handle in handles {
                let (op, changed) = handle.await.expect("a racing task");
                match (op, changed) {
                    (_, false) => tally.refused += 1,
                    (Op::Insert, true) => tally.inserted += 1,
                    (Op::Delete, true) => tally.deleted += 1,
                    (Op::Move, true) => tally.moved += 1,
                }
            }
        };
        tokio::time::timeout(ROUND_LIMIT, round)
            .await
            .expect("a round of races ends in time");
        tally.races += (ARTICLES * USERS) as u64;
    }
}

/// `Σ |stored - rows|` over every article's two counters.
async fn drift(db: &DatabaseConnection) -> i64 {
    let rows = favorite::Entity::find()
        .all(&Sql::new(db))
        .await
        .expect("read favorites");
    let articles: Vec<i64> = (1..=ARTICLES).collect();
    let stored = article::Entity::counters()
        .counts_many(db, &articles)
        .await
        .expect("read counters");
    articles
        .iter()
        .map(|a| {
            let mut truth = Counts::default();
            for row in rows.iter().filter(|r| r.article_id == *a) {
                truth.favorites += 1;
                truth.visible_favorites += i64::from(row.visible);
            }
            let got = stored[a];
            (got.favorites - truth.favorites).abs()
                + (got.visible_favorites - truth.visible_favorites).abs()
        })
        .sum()
}

async fn setup(t: &TestDb) {
    let schema = Schema::new(t.db.get_database_backend());
    t.sql()
        .execute(&schema.create_table_from_entity(favorite::Entity))
        .await
        .expect("create favorites");
    article::Entity::counters()
        .create_table(&t.db)
        .await
        .expect("create article_counters");
}

/// A second pool on MariaDB whose sessions run READ COMMITTED.
async fn read_committed_pool(t: &TestDb) -> DatabaseConnection {
    let url = t.url().expect("a MySQL URL");
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(32)
        .sqlx_logging(false)
        .map_sqlx_mysql_pool_opts(|pool| {
            pool.after_connect(|conn, _| {
                Box::pin(async move {
                    use sea_orm::sqlx::Executor;
                    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .await?;
                    Ok(())
                })
            })
        });
    Database::connect(options)
        .await
        .expect("a READ COMMITTED pool")
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn racing_inserts_deletes_and_moves_of_one_natural_key_stay_exact(t: TestDb) {
        setup(&t).await;
        // A move of a row that is not there moves nothing, and says so.
        let mut row = key(1, 1).into_active_model();
        row.visible = Set(false);
        let missing = favorite::Entity::update_counted(&t.db, row).await;
        assert!(
            matches!(
                missing,
                Err(CounterError::Database(DbErr::RecordNotUpdated))
            ),
            "[{}] a move of a missing row is refused: {missing:?}",
            t.backend
        );
        let mut tally = Tally::default();
        // Every backend at its default isolation, on both paths.
        race(&t.db, &[Path::Helpers, Path::Hooks], 18, &mut tally).await;
        let after_default = drift(&t.db).await;
        assert_eq!(
            after_default, 0,
            "[{}] drift at the default isolation",
            t.backend
        );
        if t.backend == Backend::MySql {
            // MariaDB at READ COMMITTED, through the helpers (the hooks in
            // a caller's READ COMMITTED transaction: see `cache::hooks`).
            let rc = read_committed_pool(&t).await;
            race(&rc, &[Path::Helpers], 19, &mut tally).await;
            rc.close().await.expect("close the READ COMMITTED pool");
            assert_eq!(drift(&t.db).await, 0, "[mysql] drift at READ COMMITTED");
        }
        assert!(
            tally.inserted > 0 && tally.deleted > 0 && tally.moved > 0,
            "[{}] every kind of write won some races: {} inserted, {} deleted, {} moved",
            t.backend,
            tally.inserted,
            tally.deleted,
            tally.moved
        );
        figures(
            "natural_key_races",
            t.backend,
            &[
                ("races", tally.races),
                ("inserted", tally.inserted),
                ("deleted", tally.deleted),
                ("moved", tally.moved),
                ("refused", tally.refused),
                (
                    "deadlock_victims",
                    deadlocks(t.db.get_database_backend())
                        .swap(0, std::sync::atomic::Ordering::Relaxed),
                ),
                ("drift_after", drift(&t.db).await as u64),
            ],
        );
        t.finish().await;
    }
}
