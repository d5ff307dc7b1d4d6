//! Many writers on one hot counter: every acknowledged delta is in the total.

use std::time::Instant;

use counter_core::{CounterTable, Counters};
use counter_tests::{TestDb, backend_test, raw};
use rand::{Rng, SeedableRng, rngs::StdRng};

const TASKS: u64 = 32;
const OPS_PER_TASK: usize = 500;
const HOT_POST: i64 = 42;

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "hot_key_total_is_exact"]
    async fn hot_key_total_is_exact_under_32_concurrent_writers(t: TestDb) {
        let mut timings = Vec::new();
        for slots in [1u16, 16] {
            let counters = Counters::<i64>::new(
                CounterTable::new(format!("hot_{slots}"))
                    .unwrap()
                    .with_slots(slots)
                    .unwrap(),
            );
            counters.create_table(&t.db).await.unwrap();
            let started = Instant::now();
            let writers: Vec<_> = (0..TASKS)
                .map(|task| {
                    let (db, counters) = (t.db.clone(), counters.clone());
                    tokio::spawn(async move {
                        let mut rng = StdRng::seed_from_u64(task);
                        let mut acknowledged = 0i64;
                        for _ in 0..OPS_PER_TASK {
                            if rng.random_bool(0.6) {
                                counters.increment(&db, HOT_POST, "likes").await?;
                                acknowledged += 1;
                            } else {
                                counters.decrement(&db, HOT_POST, "likes").await?;
                                acknowledged -= 1;
                            }
                        }
                        Ok::<_, counter_core::CounterError>(acknowledged)
                    })
                })
                .collect();
            let mut expected = 0;
            for writer in writers {
                expected += writer
                    .await
                    .unwrap()
                    .unwrap_or_else(|e| panic!("[{}] slots={slots}: {e}", t.backend));
            }
            let elapsed = started.elapsed();
            let total = counters.get(&t.db, HOT_POST, "likes").await.unwrap();
            assert_eq!(total, expected, "[{}] slots={slots}", t.backend);

            let rows = raw::slot_rows(&t.db, counters.table().name(), HOT_POST, "likes").await;
            assert!(
                rows.len() <= usize::from(slots),
                "[{}] {} rows for {slots} slots",
                t.backend,
                rows.len()
            );
            assert_eq!(rows.iter().map(|(_, v)| v).sum::<i64>(), expected);
            if slots == 16 {
                assert!(
                    rows.len() > 8,
                    "[{}] writes were not spread: {rows:?}",
                    t.backend
                );
            }
            timings.push(format!("slots={slots}: {:.2}s", elapsed.as_secs_f64()));
        }
        eprintln!(
            "[{}] {TASKS} tasks x {OPS_PER_TASK} mixed increments/decrements on one key: {}",
            t.backend,
            timings.join(", ")
        );
        t.finish().await;
    }
}
