//! Counter caches and recounts: parent counters kept in step with child
//! rows through every write path, and `reconcile` repairing drift without
//! losing a concurrent write, on every backend.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use counter_core::{CounterError, Reconcile, ReconcileReport, Truth, prelude::*};
use counter_tests::{Backend, TestDb, backend_test, raw, sql::Sql};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, Condition, ConnectionTrait, DatabaseConnection, EntityTrait,
    IntoActiveModel, PaginatorTrait, QueryFilter, QuerySelect, Schema, Set, TransactionTrait,
    sea_query::{Expr, ExprTrait},
};
use tokio::sync::Barrier;

/// The parent: shelves, whose counters are fed by their items.
mod shelf {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "shelves")]
    #[counter(
        keys(items, published_items, hidden_items, weight),
        slots = 8,
        table = "shelf_counters"
    )]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// The child: every cache kind at once (a plain count, a condition and its
/// negation, a sum), on a nullable parent id.
mod item {
    use counter_core::CounterCache;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, CounterCache)]
    #[sea_orm(table_name = "items")]
    #[counter_cache(parent = super::shelf::Entity, key = items, via = shelf_id)]
    #[counter_cache(parent = super::shelf::Entity, key = published_items, via = shelf_id, when = published)]
    #[counter_cache(parent = super::shelf::Entity, key = hidden_items, via = shelf_id, when = !published)]
    #[counter_cache(parent = super::shelf::Entity, key = weight, via = shelf_id, sum = weight)]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub shelf_id: Option<i64>,
        pub published: bool,
        pub weight: i32,
        pub label: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    counter_core::counter_cache_behavior!();
}

use shelf::counters::{Counts, Key};

const KEYS: [Key; 4] = [
    Key::Items,
    Key::PublishedItems,
    Key::HiddenItems,
    Key::Weight,
];

async fn setup(t: &TestDb) {
    let schema = Schema::new(t.db.get_database_backend());
    t.sql()
        .execute(&schema.create_table_from_entity(item::Entity))
        .await
        .expect("create items");
    shelf::Entity::counters()
        .create_table(&t.db)
        .await
        .expect("create shelf_counters");
}

fn new_item(shelf: Option<i64>, published: bool, weight: i32) -> item::ActiveModel {
    item::ActiveModel {
        shelf_id: Set(shelf),
        published: Set(published),
        weight: Set(weight),
        label: Set("x".to_owned()),
        ..Default::default()
    }
}

/// The counts the rows say each shelf should have, computed in Rust from
/// every row (independently of the crate's SQL).
async fn truth(db: &DatabaseConnection) -> HashMap<i64, Counts> {
    let mut truth: HashMap<i64, Counts> = HashMap::new();
    for row in item::Entity::find().all(&Sql::new(db)).await.unwrap() {
        let Some(shelf) = row.shelf_id else { continue };
        let c = truth.entry(shelf).or_default();
        c.items += 1;
        if row.published {
            c.published_items += 1;
        } else {
            c.hidden_items += 1;
        }
        c.weight += i64::from(row.weight);
    }
    truth
}

/// Asserts every shelf's stored counts equal the truth.
async fn assert_exact(t: &TestDb, shelves: &[i64], step: &str) {
    let truth = truth(&t.db).await;
    let stored = shelf::Entity::counters()
        .counts_many(&t.db, shelves)
        .await
        .unwrap();
    for shelf in shelves {
        assert_eq!(
            stored[shelf],
            truth.get(shelf).copied().unwrap_or_default(),
            "[{}] {step}: shelf {shelf}",
            t.backend
        );
    }
}

async fn reconcile(
    db: &DatabaseConnection,
    key: Key,
    options: &Reconcile<i64>,
) -> Result<ReconcileReport<i64>, CounterError> {
    shelf::Entity::counters()
        .reconcile(db, key, Truth::counter_cache::<item::Entity>(), options)
        .await
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "cache_follows_writes"]
    async fn cache_follows_inserts_updates_moves_and_deletes(t: TestDb) {
        setup(&t).await;
        let db = &t.db;
        let shelves = [1, 2, 3];

        let a = item::Entity::insert_counted(db, new_item(Some(1), true, 5))
            .await
            .unwrap();
        let b = item::Entity::insert_counted(db, new_item(Some(1), false, 7))
            .await
            .unwrap();
        let c = item::Entity::insert_counted(db, new_item(None, true, 9))
            .await
            .unwrap();
        assert_exact(&t, &shelves, "inserts").await;
        let one = shelf::Entity::counters().counts(db, 1).await.unwrap();
        assert_eq!(
            one,
            Counts {
                items: 2,
                published_items: 1,
                hidden_items: 1,
                weight: 12
            },
            "[{}]",
            t.backend
        );

        // A move: -1 on shelf 1, +1 on shelf 2, in one statement.
        let mut moved = a.clone().into_active_model();
        moved.shelf_id = Set(Some(2));
        let a = item::Entity::update_counted(db, moved).await.unwrap();
        assert_exact(&t, &shelves, "move").await;

        // The condition flips both ways; the amount changes.
        let mut flip = b.clone().into_active_model();
        flip.published = Set(true);
        flip.weight = Set(-3);
        let b = item::Entity::update_counted(db, flip).await.unwrap();
        let mut flip = a.clone().into_active_model();
        flip.published = Set(false);
        let a = item::Entity::update_counted(db, flip).await.unwrap();
        assert_exact(&t, &shelves, "predicate changes").await;

        // Into and out of "no parent".
        let mut orphan = b.clone().into_active_model();
        orphan.shelf_id = Set(None);
        item::Entity::update_counted(db, orphan).await.unwrap();
        let mut adopt = c.clone().into_active_model();
        adopt.shelf_id = Set(Some(3));
        item::Entity::update_counted(db, adopt).await.unwrap();
        assert_exact(&t, &shelves, "orphan and adopt").await;

        // An update of an uncounted column writes no counter at all.
        let before = raw::slot_rows(db, "shelf_counters", 2i64, "items").await;
        let mut relabel = a.clone().into_active_model();
        relabel.label = Set("renamed".to_owned());
        item::Entity::update_counted(db, relabel).await.unwrap();
        assert_eq!(
            raw::slot_rows(db, "shelf_counters", 2i64, "items").await,
            before,
            "[{}]",
            t.backend
        );

        // Deletes, one of them twice.
        let gone = item::Entity::delete_counted(db, a.clone().into_active_model())
            .await
            .unwrap();
        let again = item::Entity::delete_counted(db, a.into_active_model())
            .await
            .unwrap();
        assert_eq!(
            (gone.rows_affected, again.rows_affected),
            (1, 0),
            "[{}]",
            t.backend
        );
        assert_exact(&t, &shelves, "deletes").await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "hooks_transaction"]
    async fn hooks_run_in_the_callers_transaction_and_refuse_a_pool(t: TestDb) {
        setup(&t).await;
        let db = &t.db;

        // On the pool: refused before anything is written, with a typed error
        // inside sea-orm's DbErr.
        let err = new_item(Some(1), true, 1).insert(db).await.unwrap_err();
        assert!(
            matches!(
                CounterError::from(err.clone()),
                CounterError::TransactionRequired { ref table, operation: "insert", call_site: Some(ref at) }
                    if table == "items" && at.contains("caches/counter_cache.rs:")
            ),
            "[{}] {err}",
            t.backend
        );
        assert!(item::Entity::find().all(&t.sql()).await.unwrap().is_empty());

        // In a transaction that rolls back: neither the row nor the count.
        let txn = db.begin().await.unwrap();
        new_item(Some(1), true, 1).insert(&txn).await.unwrap();
        txn.rollback().await.unwrap();
        assert_exact(&t, &[1], "rolled back").await;
        assert_eq!(
            shelf::Entity::counters()
                .get(db, 1, Key::Items)
                .await
                .unwrap(),
            0
        );

        // Committed: both, through the plain ActiveModel methods.
        let txn = db.begin().await.unwrap();
        let kept = new_item(Some(1), true, 4).insert(&txn).await.unwrap();
        let mut moved = kept.into_active_model();
        moved.shelf_id = Set(Some(2));
        let moved = moved.update(&txn).await.unwrap();
        new_item(Some(1), false, 2).save(&txn).await.unwrap();
        txn.commit().await.unwrap();
        assert_exact(&t, &[1, 2], "committed").await;

        // An update that sets no counted column moves no counter: fine on the
        // pool (`t.sql()`: in a transaction behind a transaction pooler).
        let mut relabel = moved.clone().into_active_model();
        relabel.label = Set("relabelled".to_owned());
        relabel.update(&t.sql()).await.unwrap();

        let txn = db.begin().await.unwrap();
        moved.into_active_model().delete(&txn).await.unwrap();
        txn.commit().await.unwrap();
        assert_exact(&t, &[1, 2], "deleted in a transaction").await;
        assert_eq!(
            shelf::Entity::counters()
                .get(db, 1, Key::Items)
                .await
                .unwrap(),
            1
        );

        // A hook's own error comes out of the counted writes typed, and the
        // row it was for is rolled back with it.
        let rows = item::Entity::find().all(&t.sql()).await.unwrap().len();
        shelf::Entity::counters().drop_table(db).await.unwrap();
        let err = item::Entity::insert_counted(db, new_item(Some(1), true, 1))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, CounterError::MissingTable { table, .. } if table == "shelf_counters"),
            "[{}] {err:?}",
            t.backend
        );
        assert_eq!(item::Entity::find().all(&t.sql()).await.unwrap().len(), rows);
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "double_delete"]
    async fn two_concurrent_deletes_of_one_row_decrement_once(t: TestDb) {
        setup(&t).await;
        let db = &t.db;
        let mut removed = 0;
        for round in 0..20 {
            let row = item::Entity::insert_counted(db, new_item(Some(1), true, 3))
                .await
                .unwrap();
            let barrier = Arc::new(Barrier::new(2));
            let deleters: Vec<_> = (0..2)
                .map(|_| {
                    let (db, am, barrier) =
                        (db.clone(), row.clone().into_active_model(), barrier.clone());
                    tokio::spawn(async move {
                        barrier.wait().await;
                        item::Entity::delete_counted(&db, am).await
                    })
                })
                .collect();
            let mut affected = Vec::new();
            for deleter in deleters {
                let result = deleter.await.unwrap();
                affected.push(
                    result
                        .unwrap_or_else(|e| panic!("[{}] round {round}: {e}", t.backend))
                        .rows_affected,
                );
            }
            affected.sort();
            assert_eq!(affected, [0, 1], "[{}] round {round}", t.backend);
            removed += 1;
            let counts = shelf::Entity::counters().counts(db, 1).await.unwrap();
            assert_eq!(
                counts.items, 0,
                "[{}] round {round}: decremented twice?",
                t.backend
            );
            assert_eq!(counts.weight, 0, "[{}] round {round}", t.backend);
        }
        assert_eq!(removed, 20);

        // Deterministic: a delete holds the row in an open transaction; a
        // second delete must wait for it, then find nothing to uncount.
        let row = item::Entity::insert_counted(db, new_item(Some(1), true, 3))
            .await
            .unwrap();
        let txn = db.begin().await.unwrap();
        let first = row.clone().into_active_model().delete(&txn).await.unwrap();
        let second = {
            let (db, am) = (db.clone(), row.into_active_model());
            tokio::spawn(async move { item::Entity::delete_counted(&db, am).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(
            !second.is_finished(),
            "[{}] the second delete did not wait",
            t.backend
        );
        txn.commit().await.unwrap();
        let second = second.await.unwrap().unwrap();
        assert_eq!(
            (first.rows_affected, second.rows_affected),
            (1, 0),
            "[{}]",
            t.backend
        );
        let counts = shelf::Entity::counters().counts(db, 1).await.unwrap();
        assert_eq!((counts.items, counts.weight), (0, 0), "[{}]", t.backend);
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "bulk_helpers"]
    async fn bulk_helpers_count_what_they_change_and_plain_bulk_writes_drift(t: TestDb) {
        setup(&t).await;
        let db = &t.db;
        let shelves = [1, 2, 3, 4];
        // 2,500 rows: three INSERT chunks where RETURNING exists.
        let rows = (0..2_500).map(|i| new_item(Some(1 + i % 3), i % 2 == 0, (i % 7) as i32));
        let models = item::Entity::insert_many_counted(db, rows).await.unwrap();
        assert_eq!(models.len(), 2_500);
        assert_exact(&t, &shelves, "insert_many_counted").await;

        // Move shelf 2's rows to shelf 4 and publish them.
        let changes = item::ActiveModel {
            shelf_id: Set(Some(4)),
            published: Set(true),
            ..Default::default()
        };
        let filter = Condition::all().add(item::Column::ShelfId.eq(2));
        let updated = item::Entity::update_many_counted(db, filter, changes)
            .await
            .unwrap();
        assert_eq!(updated, 833, "[{}]", t.backend);
        assert_exact(&t, &shelves, "update_many_counted").await;

        let filter = Condition::all()
            .add(item::Column::ShelfId.eq(1))
            .add(item::Column::Weight.gt(3));
        let deleted = item::Entity::delete_many_counted(db, filter).await.unwrap();
        assert!(deleted > 0);
        assert_exact(&t, &shelves, "delete_many_counted").await;

        // sea-orm's own bulk delete runs no hook: the counters drift...
        let bypass = item::Entity::delete_many()
            .filter(item::Column::ShelfId.eq(3))
            .exec(&t.sql())
            .await
            .unwrap()
            .rows_affected;
        let stored = shelf::Entity::counters()
            .get(db, 3, Key::Items)
            .await
            .unwrap();
        assert_eq!(stored, bypass as i64, "[{}] the documented gap", t.backend);
        // ...until a recount repairs them.
        for key in KEYS {
            reconcile(db, key, &Reconcile::new()).await.unwrap();
        }
        assert_exact(&t, &shelves, "after reconcile").await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "reconcile_repairs"]
    async fn reconcile_repairs_hand_edits_and_dry_run_changes_nothing(t: TestDb) {
        setup(&t).await;
        let db = &t.db;
        for (shelf, n) in [(1, 3), (2, 2), (3, 1), (5, 4)] {
            for i in 0..n {
                item::Entity::insert_counted(db, new_item(Some(shelf), i % 2 == 0, 10))
                    .await
                    .unwrap();
            }
        }
        // Hand edits: extra slot rows (slots the table never writes), one
        // owner with counters but no rows, and a slot row deleted.
        raw::insert_slot(db, "shelf_counters", 1i64, "items", 900, 7).await;
        raw::insert_slot(db, "shelf_counters", 2i64, "items", 901, -2).await;
        raw::insert_slot(db, "shelf_counters", 9i64, "items", 900, 4).await;
        db.execute_unprepared(
            "DELETE FROM shelf_counters WHERE owner_id = 5 AND count_key = 'items'",
        )
        .await
        .unwrap();
        let shelves = [1, 2, 3, 5, 9];
        let before = shelf::Entity::counters()
            .counts_many(db, &shelves)
            .await
            .unwrap();

        // A dry run reports the drift in owner order and writes nothing.
        let dry = reconcile(db, Key::Items, &Reconcile::new().dry_run(true))
            .await
            .unwrap();
        let found: Vec<(i64, i64, i64, i64)> = dry
            .drifted
            .iter()
            .map(|d| (d.owner, d.truth, d.current, d.drift))
            .collect();
        assert_eq!(
            found,
            [(1, 3, 10, -7), (2, 2, 0, 2), (5, 4, 0, 4), (9, 0, 4, -4)],
            "[{}]",
            t.backend
        );
        assert_eq!(
            (
                dry.owners_checked,
                dry.owners_drifted,
                dry.total_abs_drift,
                dry.dry_run
            ),
            (5, 4, 17, true),
            "[{}]",
            t.backend
        );
        assert_eq!(
            shelf::Entity::counters()
                .counts_many(db, &shelves)
                .await
                .unwrap(),
            before
        );

        // A scoped run touches only the owners asked for (and counts the
        // asked-for owner 7, who has nothing at all).
        let scoped = reconcile(db, Key::Items, &Reconcile::new().owners([2, 7, 2]))
            .await
            .unwrap();
        assert_eq!(
            (
                scoped.owners_checked,
                scoped.owners_drifted,
                scoped.total_abs_drift
            ),
            (2, 1, 2),
            "[{}]",
            t.backend
        );
        assert_eq!(
            shelf::Entity::counters()
                .get(db, 2, Key::Items)
                .await
                .unwrap(),
            2
        );
        assert_eq!(
            shelf::Entity::counters()
                .get(db, 1, Key::Items)
                .await
                .unwrap(),
            10
        );

        // Batches of 2 walk every owner by keyset; the repair is an increment.
        let real = reconcile(db, Key::Items, &Reconcile::new().batch_size(2))
            .await
            .unwrap();
        assert_eq!(
            (
                real.owners_checked,
                real.owners_drifted,
                real.total_abs_drift,
                real.batches
            ),
            (5, 3, 15, 3),
            "[{}]",
            t.backend
        );
        assert_exact(&t, &shelves, "repaired").await;
        let rows = raw::slot_rows(db, "shelf_counters", 1i64, "items").await;
        assert!(
            rows.iter().any(|&(slot, _)| slot == 900),
            "[{}] not an overwrite: {rows:?}",
            t.backend
        );

        let quiet = reconcile(db, Key::Items, &Reconcile::new().batch_size(1))
            .await
            .unwrap();
        assert_eq!(
            (quiet.owners_checked, quiet.owners_drifted),
            (5, 0),
            "[{}]",
            t.backend
        );

        // The other keys were never edited, and a hand-written truth agrees.
        for key in [Key::PublishedItems, Key::HiddenItems, Key::Weight] {
            let report = reconcile(db, key, &Reconcile::new().dry_run(true))
                .await
                .unwrap();
            assert_eq!(report.owners_drifted, 0, "[{}] {key}", t.backend);
        }
        let by_hand = Truth::query(
            item::Entity::find()
                .select_only()
                .column(item::Column::ShelfId)
                .expr(Expr::col(item::Column::Weight).sum())
                .group_by(item::Column::ShelfId),
        );
        let report = shelf::Entity::counters()
            .reconcile(db, Key::Weight, by_hand, &Reconcile::new().dry_run(true))
            .await
            .unwrap();
        assert_eq!(
            (report.owners_checked, report.owners_drifted),
            (4, 0),
            "[{}]",
            t.backend
        );

        // A truth over a table that does not exist is the database's error,
        // not a missing counter table.
        let typo = Truth::statement(
            sea_orm::sea_query::Query::select()
                .column(sea_orm::sea_query::Alias::new("shelf_id"))
                .expr(Expr::val(1))
                .from(sea_orm::sea_query::Alias::new("itemz"))
                .to_owned(),
        );
        let err = shelf::Entity::counters()
            .reconcile(db, Key::Items, typo, &Reconcile::new())
            .await
            .unwrap_err();
        assert!(
            matches!(err, CounterError::Database(_)),
            "[{}] {err:?}",
            t.backend
        );

        // Bad input is a typed error.
        let err = reconcile(db, Key::Items, &Reconcile::new().batch_size(0))
            .await
            .unwrap_err();
        assert!(
            matches!(err, CounterError::OutOfRange { value: 0, .. }),
            "{err}"
        );
        let err = shelf::Entity::counters()
            .untyped()
            .reconcile(
                db,
                "likes",
                Truth::counter_cache::<item::Entity>(),
                &Reconcile::new(),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, CounterError::NoCounterCache { .. }), "{err}");
        t.finish().await;
    }
}

const WRITERS: u64 = 16;
const OPS_PER_WRITER: usize = 60;
const HOT_SHELVES: [i64; 4] = [1, 2, 3, 4];

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "writers_and_reconcile"]
    async fn sixteen_writers_and_a_reconcile_loop_add_up_exactly(t: TestDb) {
        setup(&t).await;
        let db = &t.db;
        // Real drift to repair: some before the writers start, more injected
        // by hand (extra slot rows) while they and the recounts run.
        raw::insert_slot(db, "shelf_counters", 1i64, "items", 900, 5).await;
        raw::insert_slot(db, "shelf_counters", 2i64, "weight", 900, -3).await;
        let mut corruption: HashMap<Key, u128> = [(Key::Items, 5), (Key::Weight, 3)].into();

        let writers: Vec<_> = (0..WRITERS)
            .map(|task| {
                let db = db.clone();
                tokio::spawn(async move { write_randomly(&db, task).await })
            })
            .collect();
        let injector = {
            let db = db.clone();
            tokio::spawn(async move {
                let mut injected: HashMap<Key, u128> = HashMap::new();
                for i in 0..12i16 {
                    tokio::time::sleep(std::time::Duration::from_millis(15)).await;
                    let (key, shelf) = (KEYS[i as usize % KEYS.len()], HOT_SHELVES[i as usize % 4]);
                    raw::insert_slot(&db, "shelf_counters", shelf, key.as_str(), 901 + i, 2).await;
                    *injected.entry(key).or_default() += 2;
                }
                injected
            })
        };
        // Two recount loops at once: their lock must keep them from both
        // correcting the same drift. Each pass that starts after `done` was
        // seen is the loop's last, so every injected drift is before it.
        let done = Arc::new(AtomicBool::new(false));
        let reconcilers: Vec<_> = [2usize, 3]
            .into_iter()
            .map(|batch| {
                let (db, done) = (db.clone(), done.clone());
                tokio::spawn(async move {
                    let mut repaired: HashMap<Key, u128> = HashMap::new();
                    let (mut passes, mut during) = (0, 0);
                    loop {
                        let last = done.load(Ordering::SeqCst);
                        for key in KEYS {
                            let options = Reconcile::new().batch_size(batch);
                            let report = reconcile(&db, key, &options).await?;
                            *repaired.entry(key).or_default() += report.total_abs_drift;
                        }
                        passes += 1;
                        if !done.load(Ordering::SeqCst) {
                            during += 1; // the whole pass ran beside the writers
                        }
                        if last {
                            break;
                        }
                    }
                    Ok::<_, CounterError>((repaired, passes, during))
                })
            })
            .collect();
        for writer in writers {
            writer
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("[{}] writer: {e}", t.backend));
        }
        for (key, drift) in injector.await.unwrap() {
            *corruption.entry(key).or_default() += drift;
        }
        done.store(true, Ordering::SeqCst);
        let mut repaired: HashMap<Key, u128> = HashMap::new();
        let (mut passes, mut during) = (0, 0);
        for reconciler in reconcilers {
            let (found, n, beside) = reconciler
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("[{}] reconcile: {e}", t.backend));
            for (key, drift) in found {
                *repaired.entry(key).or_default() += drift;
            }
            passes += n;
            during += beside;
        }
        assert!(
            during >= 1,
            "[{}] no recount pass overlapped the writers ({passes} passes)",
            t.backend
        );

        // Every counter equals the rows; the loops together repaired exactly
        // the hand edits: a drift corrected twice (no lock) or a phantom one
        // (a torn snapshot) would show up here.
        assert_exact(&t, &HOT_SHELVES, "after the storm").await;
        for key in KEYS {
            assert_eq!(
                repaired.get(&key).copied().unwrap_or(0),
                corruption.get(&key).copied().unwrap_or(0),
                "[{}] {key}: repaired drift over {passes} passes",
                t.backend
            );
            let quiet = reconcile(db, key, &Reconcile::new()).await.unwrap();
            assert_eq!(
                (quiet.owners_drifted, quiet.total_abs_drift),
                (0, 0),
                "[{}] {key}: final quiet pass",
                t.backend
            );
        }
        let rows = item::Entity::find().all(&t.sql()).await.unwrap().len();
        eprintln!(
            "[{}] {WRITERS} writers x {OPS_PER_WRITER} ops, {rows} rows left, {passes} reconcile passes ({during} beside the writers)",
            t.backend
        );
        t.finish().await;
    }
}

/// One writer: creates, deletes, moves and flips its own rows on a few hot
/// shelves, every write through the cache path.
async fn write_randomly(db: &DatabaseConnection, task: u64) -> Result<(), CounterError> {
    let mut rng = StdRng::seed_from_u64(task);
    let mut mine: Vec<item::Model> = Vec::new();
    let pick_shelf = |rng: &mut StdRng| HOT_SHELVES[rng.random_range(0..HOT_SHELVES.len())];
    for _ in 0..OPS_PER_WRITER {
        let roll = rng.random_range(0..10);
        if mine.is_empty() || roll < 4 {
            let row = new_item(
                Some(pick_shelf(&mut rng)),
                rng.random_bool(0.5),
                rng.random_range(-5..20),
            );
            mine.push(item::Entity::insert_counted(db, row).await?);
        } else if roll < 6 {
            let row = mine.swap_remove(rng.random_range(0..mine.len()));
            item::Entity::delete_counted(db, row.into_active_model()).await?;
        } else if roll < 8 {
            let i = rng.random_range(0..mine.len());
            let mut am = mine[i].clone().into_active_model();
            am.shelf_id = Set(Some(pick_shelf(&mut rng)));
            mine[i] = item::Entity::update_counted(db, am).await?;
        } else {
            let i = rng.random_range(0..mine.len());
            let mut am = mine[i].clone().into_active_model();
            am.published = Set(!mine[i].published);
            am.weight = Set(rng.random_range(-5..20));
            mine[i] = item::Entity::update_counted(db, am).await?;
        }
    }
    Ok(())
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "recount_lock"]
    async fn a_second_recount_of_a_counter_waits_for_the_first(t: TestDb) {
        setup(&t).await;
        let db = &t.db;
        for _ in 0..3 {
            item::Entity::insert_counted(db, new_item(Some(1), true, 1))
                .await
                .unwrap();
        }
        raw::insert_slot(db, "shelf_counters", 1i64, "items", 900, 5).await;

        // Hold back every write to shelf 1's `items` slot rows (reads still
        // pass), so both recounts have taken their snapshot, or are waiting
        // for the lock, before either can repair.
        let blocker = db.begin().await.unwrap();
        let hold = match t.backend {
            Backend::Postgres => Some("LOCK TABLE shelf_counters IN SHARE MODE"),
            Backend::MySql => Some(
                "SELECT * FROM shelf_counters WHERE owner_id = 1 AND count_key = 'items' FOR UPDATE",
            ),
            // SQLite's recounts hold the database's write lock: nothing to add.
            Backend::Sqlite => None,
        };
        if let Some(hold) = hold {
            blocker.execute_unprepared(hold).await.unwrap();
        }
        let recounts: Vec<_> = (0..2)
            .map(|_| {
                let db = db.clone();
                tokio::spawn(async move { reconcile(&db, Key::Items, &Reconcile::new()).await })
            })
            .collect();
        if hold.is_some() {
            tokio::time::sleep(std::time::Duration::from_millis(400)).await;
            assert!(
                recounts.iter().all(|r| !r.is_finished()),
                "[{}] a recount repaired past the blocked rows",
                t.backend
            );
        }
        blocker.commit().await.unwrap();
        let mut repaired = 0;
        for recount in recounts {
            repaired += recount.await.unwrap().unwrap().total_abs_drift;
        }
        // Without the lock both would subtract the 5: -10, and 7 stored.
        assert_eq!(repaired, 5, "[{}] drift repaired twice?", t.backend);
        assert_exact(&t, &[1], "after two recounts").await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "recount_lock_schemas"]
    async fn recounts_in_two_schemas_do_not_wait_for_each_other(t: TestDb) {
        // Two scratch spaces per backend (two schemas on PostgreSQL, two
        // databases on MySQL), each with a `shelf_counters` table: a tenant per
        // schema. A recount held up in one must not hold up the other's.
        let other = TestDb::open(t.backend, "recount_lock_other_schema")
            .await
            .expect("a second scratch space on the backend of the first");
        assert_eq!(t.backend, other.backend);
        for t in [&t, &other] {
            setup(t).await;
            for _ in 0..3 {
                item::Entity::insert_counted(&t.db, new_item(Some(1), true, 1))
                    .await
                    .unwrap();
            }
            raw::insert_slot(&t.db, "shelf_counters", 1i64, "items", 900, 5).await;
        }
        // The first tenant's recount takes its lock, then waits on rows a
        // transaction holds (as in `a_second_recount_of_a_counter_waits_for_the_first`).
        let blocker = t.db.begin().await.unwrap();
        let hold = match t.backend {
            Backend::Postgres => Some("LOCK TABLE shelf_counters IN SHARE MODE"),
            Backend::MySql => Some(
                "SELECT * FROM shelf_counters WHERE owner_id = 1 AND count_key = 'items' FOR UPDATE",
            ),
            Backend::Sqlite => None, // two in-memory databases share nothing
        };
        if let Some(hold) = hold {
            blocker.execute_unprepared(hold).await.unwrap();
        }
        let held = {
            let db = t.db.clone();
            tokio::spawn(async move { reconcile(&db, Key::Items, &Reconcile::new()).await })
        };
        if hold.is_some() {
            // Not a sleep: the recount is seen waiting on the blocker's rows,
            // so it holds its lock from here until the blocker commits.
            let id = session_id(&t, &blocker).await;
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while !blocked_by(&t, id).await {
                if held.is_finished() {
                    let outcome = held.await.unwrap();
                    panic!("[{}] the recount ended unblocked: {outcome:?}", t.backend);
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "[{}] the recount was not blocked within 20 s",
                    t.backend
                );
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
        // The same table and key in the other schema: not the same lock.
        let free = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            reconcile(&other.db, Key::Items, &Reconcile::new()),
        )
        .await
        .unwrap_or_else(|_| panic!("[{}] the other schema's recount waited", t.backend))
        .unwrap();
        assert_eq!(free.total_abs_drift, 5, "[{}]", t.backend);
        if hold.is_some() {
            assert!(
                !held.is_finished(),
                "[{}] the held recount ran early",
                t.backend
            );
        }
        blocker.commit().await.unwrap();
        assert_eq!(
            held.await.unwrap().unwrap().total_abs_drift,
            5,
            "[{}]",
            t.backend
        );
        assert_exact(&t, &[1], "first tenant").await;
        assert_exact(&other, &[1], "second tenant").await;
        t.finish().await;
        other.finish().await;
    }
}

/// The server's id of the session `txn` runs on.
async fn session_id(t: &TestDb, txn: &sea_orm::DatabaseTransaction) -> i64 {
    let sql = match t.backend {
        Backend::Postgres => "SELECT pg_backend_pid()::bigint AS id",
        _ => "SELECT CAST(CONNECTION_ID() AS SIGNED) AS id",
    };
    let row = txn
        .query_one_raw(sea_orm::Statement::from_string(
            t.db.get_database_backend(),
            sql,
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get("", "id").unwrap()
}

/// Whether another session waits on a lock that session `id` holds
/// (PostgreSQL's `pg_blocking_pids`), or, on MySQL, is writing the counter
/// table while `id` holds its rows.
async fn blocked_by(t: &TestDb, id: i64) -> bool {
    let sql = match t.backend {
        Backend::Postgres => format!(
            "SELECT COUNT(*)::bigint AS n FROM pg_stat_activity WHERE {id} = ANY(pg_blocking_pids(pid))"
        ),
        // The recount's repair upsert caught behind the blocker's rows
        // (InnoDB's lock-wait tables do not list this wait on MariaDB): it
        // took its lock before its batch began.
        _ => format!(
            "SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST \
             WHERE DB = DATABASE() AND ID <> {id} AND INFO LIKE 'INSERT INTO `shelf_counters`%'"
        ),
    };
    let row = t
        .sql()
        .query_one_raw(sea_orm::Statement::from_string(
            t.db.get_database_backend(),
            sql,
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get::<i64>("", "n").unwrap() > 0
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "cache_slot_cap"]
    async fn a_counted_write_at_the_slot_cap_is_settled_or_refused_whole(t: TestDb) {
        // Every slot of a shelf's `items` at the slot cap (2^53 - 1): the
        // next counted insert meets it on whichever slot it picks.
        const SLOT_CAP: i64 = (1 << 53) - 1;
        setup(&t).await;
        let (db, b) = (&t.db, t.backend);
        let shelves = shelf::Entity::counters();
        for slot in 0..8 {
            raw::insert_slot(db, "shelf_counters", 1i64, "items", slot, SLOT_CAP).await;
        }
        let full = 8 * SLOT_CAP;
        item::Entity::insert_counted(db, new_item(Some(1), true, 1)).await.unwrap();
        let txn = db.begin().await.unwrap();
        item::Entity::insert_counted(&txn, new_item(Some(1), false, 1)).await.unwrap();
        txn.commit().await.unwrap();
        assert_eq!(shelves.get(db, 1, Key::Items).await.unwrap(), full + 2, "[{b}] settled");

        // A shelf whose `items` is i64::MAX: a counted insert is refused with
        // Overflow, and neither the item nor any of its counts is written,
        // alone or inside the caller's transaction, which stays usable.
        shelves.add(db, 2, Key::Items, i64::MAX).await.unwrap();
        let refused = item::Entity::insert_counted(db, new_item(Some(2), true, 3)).await;
        assert!(matches!(&refused, Err(CounterError::Overflow { .. })), "[{b}] {refused:?}");
        let txn = db.begin().await.unwrap();
        let refused = item::Entity::insert_counted(&txn, new_item(Some(2), true, 3)).await;
        assert!(matches!(&refused, Err(CounterError::Overflow { .. })), "[{b}] {refused:?}");
        item::Entity::insert_counted(&txn, new_item(Some(3), true, 4)).await.unwrap();
        txn.commit().await.unwrap();
        let two = shelves.counts(db, 2).await.unwrap();
        assert_eq!(
            (two.items, two.published_items, two.weight),
            (i64::MAX, 0, 0),
            "[{b}] nothing of the refused inserts"
        );
        let on_two = item::Entity::find()
            .filter(item::Column::ShelfId.eq(2))
            .count(&t.sql())
            .await
            .unwrap();
        assert_eq!(on_two, 0, "[{b}] no item row of the refused inserts");
        assert_eq!(shelves.get(db, 3, Key::Items).await.unwrap(), 1, "[{b}] the rest committed");
        t.finish().await;
    }
}
