//! Regions on one database: every write of a table placed in a region
//! takes only the region's slots (counters, buckets, sketches, narrow and
//! adaptive counters, batches), reads sum every region's rows, maintenance
//! touches only the region's own rows, and what would change or depend on
//! another region's rows is refused with a typed error. (Replication
//! between regions: `tests/tests/reliability/regions.rs`.)

use chrono::{TimeZone, Utc};
use counter_core::{
    Compact, CounterError, CounterTable, Counters, DeltaBatch, ErrorKind, Reconcile, Region,
    SlotPolicy, Truth, Window,
};
use counter_tests::{TestDb, backend_test, raw};
use sea_orm::{ConnectionTrait, Statement, TransactionTrait};

/// The most one slot row holds (2^53 - 1): an add beyond it is settled.
const SLOT_CAP: i64 = (1 << 53) - 1;

/// Region 1 of 3 ("eu"): slots 1, 4, 7, ...
fn eu() -> Region {
    Region::new("eu", 1, 3).expect("a valid region")
}

fn table(name: &str) -> Counters<i64> {
    let table = CounterTable::new(name.to_owned())
        .and_then(|t| t.with_slots(8))
        .and_then(|t| t.with_key_slots("stars", 1))
        .and_then(|t| t.with_key_slot_policy("hot", SlotPolicy::adaptive(1..=64)?))
        .and_then(|t| t.with_key_window("views", Window::Hour))
        .and_then(|t| t.with_unique_key("viewers"))
        .expect("a valid table");
    Counters::new(table)
}

/// Every `slot` of `table` (any layout).
async fn slots_of(t: &TestDb, table: &str) -> Vec<i16> {
    let sql = format!("SELECT slot FROM {table}");
    let statement = Statement::from_string(t.db.get_database_backend(), sql);
    t.sql()
        .query_all_raw(statement)
        .await
        .expect("read slots")
        .iter()
        .map(|row| row.try_get_by_index::<i16>(0).expect("a slot"))
        .collect()
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_region_writes_and_folds_only_its_own_slots(t: TestDb) {
        let b = t.backend;
        let name = "regional";
        let everywhere = table(name);
        everywhere.create_table(&t.db).await.unwrap();
        let counters = everywhere.in_region(eu());
        assert_eq!(counters.table().region(), Some(eu()), "[{b}]");
        assert_eq!(everywhere.table().region(), None, "[{b}]");

        // Rows of the other two regions, as replication brings them.
        for (slot, value) in [(0, 100), (2, 20), (5, 3)] {
            raw::insert_slot(&t.db, name, 1_i64, "likes", slot, value).await;
        }
        raw::insert_slot(&t.db, name, 1_i64, "stars", 0, 7).await;

        // Every write path: single adds, a one-slot key, an adaptive key,
        // batches, windowed adds, unique observes.
        let hour = Utc.timestamp_opt(1_790_000_000 / 3600 * 3600, 0).unwrap();
        for i in 0..40 {
            counters.increment(&t.db, 1, "likes").await.unwrap();
            counters.increment(&t.db, 1, "stars").await.unwrap();
            counters.increment(&t.db, 1 + i % 4, "hot").await.unwrap();
            counters.add_at(&t.db, 1, "views", 2, hour).await.unwrap();
            counters.observe(&t.db, 1, "viewers", &format!("member-{i}")).await.unwrap();
        }
        let mut batch = DeltaBatch::new();
        for owner in 1..=20_i64 {
            batch.add(&counters, owner, "likes", 5).unwrap();
            batch.add_at(&counters, owner, "views", 1, hour).unwrap();
        }
        batch.apply(&t.db).await.unwrap();

        let region = eu();
        for table in [name.to_owned(), format!("{name}_buckets"), format!("{name}_sketches")] {
            let slots = slots_of(&t, &table).await;
            let foreign: Vec<i16> = slots.iter().copied().filter(|s| !region.owns_slot(*s)).collect();
            // Only the four rows written by hand above are another region's.
            let expected = if table == name { 4 } else { 0 };
            assert_eq!(foreign.len(), expected, "[{b}] {table}: {slots:?}");
        }
        // The one-slot key still got a row of its own: slot 1.
        let stars = raw::slot_rows(&t.db, name, 1_i64, "stars").await;
        assert_eq!(stars, vec![(0, 7), (1, 40)], "[{b}]");

        // Reads sum every region's rows.
        assert_eq!(counters.get(&t.db, 1, "likes").await.unwrap(), 123 + 40 + 5, "[{b}]");
        assert_eq!(everywhere.get(&t.db, 1, "likes").await.unwrap(), 168, "[{b}]");
        let unique = counters.unique(&t.db, 1, "viewers").await.unwrap();
        assert!((38..=42).contains(&unique), "[{b}] {unique}");

        // Compaction folds the region's rows into its first slot and leaves
        // the others' alone.
        let report = counters.compact(&t.db, &Compact::new()).await.unwrap();
        assert_eq!(report.share.map(|w| (w.index(), w.count())), Some((1, 3)), "[{b}]");
        let likes = raw::slot_rows(&t.db, name, 1_i64, "likes").await;
        assert_eq!(likes, vec![(0, 100), (1, 45), (2, 20), (5, 3)], "[{b}]");
        assert_eq!(counters.get(&t.db, 1, "likes").await.unwrap(), 168, "[{b}]");
        let sketch_slots = slots_of(&t, &format!("{name}_sketches")).await;
        assert!(sketch_slots.iter().all(|s| region.owns_slot(*s)), "[{b}] {sketch_slots:?}");
        assert_eq!(counters.unique(&t.db, 1, "viewers").await.unwrap(), unique, "[{b}]");

        // Refused, typed, naming the region; nothing changed.
        let refused: Vec<CounterError> = vec![
            counters.compact(&t.db, &Compact::new().all_slots()).await.unwrap_err(),
            counters.reset(&t.db, &[1], "likes").await.unwrap_err(),
            counters
                .reconcile(&t.db, "likes", Truth::rows_of("nowhere", "owner"), &Reconcile::new())
                .await
                .unwrap_err(),
        ];
        for err in &refused {
            assert!(matches!(err, CounterError::CrossRegion { region, .. } if region == "eu"), "[{b}] {err}");
            assert_eq!(err.kind(), ErrorKind::Misuse, "[{b}] {err}");
        }
        assert_eq!(counters.get(&t.db, 1, "likes").await.unwrap(), 168, "[{b}]");

        // An add at the slot cap would be settled by spreading the total
        // over every slot, other regions' included: refused. A delta beyond
        // the cap, in a batch on the pool: nothing written.
        let mut capped = DeltaBatch::new();
        capped.add(&counters, 2, "likes", 1).unwrap();
        capped.add(&counters, 3, "likes", i64::MAX / 2).unwrap();
        let err = capped.apply(&t.db).await.unwrap_err();
        assert!(matches!(err, CounterError::CrossRegion { .. }), "[{b}] {err}");
        assert_eq!(counters.get(&t.db, 2, "likes").await.unwrap(), 5, "[{b}]");
        // Every slot of the region's at the cap: a single add meets it.
        for slot in [1, 4, 7] {
            raw::insert_slot(&t.db, name, 99_i64, "likes", slot, SLOT_CAP).await;
        }
        let err = counters.increment(&t.db, 99, "likes").await.unwrap_err();
        assert!(matches!(err, CounterError::CrossRegion { .. }), "[{b}] {err}");
        // In the caller's transaction, a batch whose second counter meets
        // it: refused, the first counter's add taken back, and the
        // transaction goes on.
        let txn = t.db.begin().await.unwrap();
        let mut batch = DeltaBatch::new();
        batch.add(&counters, 2, "likes", 1).unwrap();
        batch.add(&counters, 99, "likes", 1).unwrap();
        let err = batch.apply_in(&txn).await.unwrap_err();
        assert!(matches!(err, CounterError::CrossRegion { .. }), "[{b}] {err}");
        counters.increment(&txn, 3, "likes").await.unwrap();
        txn.commit().await.unwrap();
        assert_eq!(counters.get(&t.db, 2, "likes").await.unwrap(), 5, "[{b}]");
        assert_eq!(counters.get(&t.db, 99, "likes").await.unwrap(), 3 * SLOT_CAP, "[{b}]");
        assert_eq!(counters.get(&t.db, 3, "likes").await.unwrap(), 6, "[{b}]");
        counters.purge(&t.db, &[99]).await.unwrap();

        // A batch that mixes the region's handle and another of the same
        // table is refused before anything is sent.
        let mut mixed = DeltaBatch::new();
        mixed.add(&counters, 2, "likes", 1).unwrap();
        let err = mixed.add(&everywhere, 2, "likes", 1).unwrap_err();
        assert!(matches!(err, CounterError::CrossRegion { .. }), "[{b}] {err}");

        // Retention and purges delete the region's own rows only.
        let foreign_bucket = format!(
            "INSERT INTO {name}_buckets (owner_id, count_key, bucket, slot, value) \
             VALUES (1, 'views', {}, 0, 9)",
            hour.timestamp()
        );
        let statement = Statement::from_string(t.db.get_database_backend(), foreign_bucket);
        t.sql().execute_raw(statement).await.expect("a bucket row of another region");
        let pruned = counters.prune(&t.db, hour + chrono::Duration::hours(2)).await.unwrap();
        assert!(pruned > 0, "[{b}]");
        let bucket_rows = raw::count_rows(&t.db, &format!("{name}_buckets")).await;
        assert_eq!(bucket_rows, 1, "[{b}] the other region's bucket stays");
        counters.purge(&t.db, &[1]).await.unwrap();
        assert_eq!(counters.get(&t.db, 1, "likes").await.unwrap(), 123, "[{b}]");
        assert_eq!(counters.get(&t.db, 1, "stars").await.unwrap(), 7, "[{b}]");
        // Clearing the table clears the region's rows: the others stay.
        counters.clear(&t.db).await.unwrap();
        let left = slots_of(&t, name).await;
        assert!(!left.is_empty() && left.iter().all(|s| !region.owns_slot(*s)), "[{b}] {left:?}");
        assert_eq!(everywhere.get(&t.db, 1, "likes").await.unwrap(), 123, "[{b}]");
        // A table with a cascading reference to its owner cannot be in a
        // region: the owner's delete would delete every region's rows.
        let cascading = Counters::<i64>::new(
            CounterTable::new("regional_cascade")
                .unwrap()
                .with_cascade(counter_core::OwnerTable {
                    schema: None,
                    table: "posts".into(),
                    column: "id".into(),
                })
                .with_region(eu()),
        );
        let err = cascading.create_table(&t.db).await.unwrap_err();
        assert!(matches!(err, CounterError::CrossRegion { .. }), "[{b}] {err}");
        t.finish().await;
    }
}

#[test]
fn region_names_and_shares_are_checked() {
    assert!(Region::new("us-east_1", 0, 2).is_ok());
    for (name, index, count) in [
        ("", 0, 2),
        ("a b", 0, 2),
        ("eu", 2, 2),
        ("eu", 0, 0),
        ("eu", 0, 65),
    ] {
        let err = Region::new(name, index, count).unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::InvalidInput,
            "{name:?} {index} {count}: {err}"
        );
    }
    let long = "x".repeat(65);
    assert!(matches!(
        Region::new(long, 0, 1),
        Err(CounterError::InvalidRegion { .. })
    ));
    let region = Region::new("ap", 2, 3).unwrap();
    assert!(
        region.owns_slot(2) && region.owns_slot(5) && !region.owns_slot(3) && !region.owns_slot(-1)
    );
}
