//! Adaptive slots and writer shares: counters that widen only where writes
//! contend, fold back through compaction, and stay exact throughout.

use std::collections::BTreeSet;

use counter_core::{Compact, CounterTable, Counters, SlotPolicy, Writer};
use counter_tests::{Backend, TestDb, backend_test, figures, raw};
use rand::{Rng, SeedableRng, rngs::StdRng};

const TASKS: u64 = 32;
const OPS_PER_TASK: usize = 150;
const HOT: i64 = 42;
const COLD: i64 = 7;

/// An adaptive table named for the backend too: a process follows its
/// counters' heat by table name, and the backends' tests run at once.
fn adaptive(t: &TestDb, table: &str, range: std::ops::RangeInclusive<u16>) -> Counters<i64> {
    let policy = SlotPolicy::adaptive(range).unwrap();
    let name = format!("{table}_{}", t.backend);
    Counters::new(CounterTable::new(name).unwrap().with_slot_policy(policy))
}

/// `TASKS` writers of `owner`'s `likes`, mixed increments and decrements:
/// the sum of what they acknowledged.
async fn hammer(t: &TestDb, counters: &Counters<i64>, owner: i64, seed: u64) -> i64 {
    let writers: Vec<_> = (0..TASKS)
        .map(|task| {
            let (db, counters) = (t.db.clone(), counters.clone());
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed ^ task);
                let mut acknowledged = 0i64;
                for _ in 0..OPS_PER_TASK {
                    let delta = if rng.random_bool(0.7) { 1 } else { -1 };
                    counters.add(&db, owner, "likes", delta).await?;
                    acknowledged += delta;
                }
                Ok::<_, counter_core::CounterError>(acknowledged)
            })
        })
        .collect();
    let mut acknowledged = 0;
    for writer in writers {
        acknowledged += writer
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("[{}] {e}", t.backend));
    }
    acknowledged
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "adaptive_grows"]
    async fn adaptive_counter_widens_under_contention_and_cold_ones_stay_one_row(t: TestDb) {
        let counters = adaptive(&t, "adaptive_grow", 1..=64);
        let table = counters.table().name();
        counters.create_table(&t.db).await.unwrap();

        // One writer at a time: one row, however many writes.
        for _ in 0..200 {
            counters.increment(&t.db, COLD, "likes").await.unwrap();
        }
        let cold = raw::slot_rows(&t.db, table, COLD, "likes").await;
        assert_eq!(cold, [(0, 200)], "[{}] a lone writer's counter", t.backend);

        // 32 writers at once: the counter widens, within its ceiling.
        let acknowledged = hammer(&t, &counters, HOT, 1).await;
        assert_eq!(
            counters.get(&t.db, HOT, "likes").await.unwrap(),
            acknowledged
        );
        let hot = raw::slot_rows(&t.db, table, HOT, "likes").await;
        assert_eq!(hot.iter().map(|(_, v)| v).sum::<i64>(), acknowledged);
        assert!(
            hot.iter().all(|(slot, _)| (0..64).contains(slot)),
            "{hot:?}"
        );
        match t.backend {
            // One write lock for the whole database: more rows never help.
            Backend::Sqlite => assert_eq!(hot.len(), 1, "[sqlite] {hot:?}"),
            _ => assert!(hot.len() >= 4, "[{}] never widened: {hot:?}", t.backend),
        }
        // The cold counter, written again on its own, kept to its row.
        counters.increment(&t.db, COLD, "likes").await.unwrap();
        let cold = raw::slot_rows(&t.db, table, COLD, "likes").await;
        assert_eq!(cold, [(0, 201)], "[{}]", t.backend);
        figures(
            "adaptive_grows",
            t.backend,
            &[
                ("writes", TASKS * OPS_PER_TASK as u64 + 201),
                ("hot_rows", hot.len() as u64),
                ("cold_rows", cold.len() as u64),
                (
                    "lost",
                    acknowledged.abs_diff(hot.iter().map(|(_, v)| v).sum::<i64>()),
                ),
            ],
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "adaptive_region"]
    async fn a_regions_adaptive_counter_widens_over_its_own_slots(t: TestDb) {
        let b = t.backend;
        let region = counter_core::Region::new("eu", 1, 2).unwrap();
        let counters = adaptive(&t, "adaptive_region", 1..=64).in_region(region.clone());
        let table = counters.table().name();
        counters.create_table(&t.db).await.unwrap();
        for _ in 0..50 {
            counters.increment(&t.db, COLD, "likes").await.unwrap();
        }
        let cold = raw::slot_rows(&t.db, table, COLD, "likes").await;
        assert_eq!(cold, [(1, 50)], "[{b}] a lone writer's counter: one row, the region's first");
        let acknowledged = hammer(&t, &counters, HOT, 3).await;
        let hot = raw::slot_rows(&t.db, table, HOT, "likes").await;
        assert_eq!(hot.iter().map(|(_, v)| v).sum::<i64>(), acknowledged, "[{b}]");
        assert!(hot.iter().all(|(slot, _)| region.owns_slot(*slot) && *slot < 64), "[{b}] {hot:?}");
        match b {
            Backend::Sqlite => assert_eq!(hot.len(), 1, "[sqlite] {hot:?}"),
            _ => assert!(hot.len() >= 4, "[{b}] never widened: {hot:?}"),
        }
        figures(
            "adaptive_region",
            b,
            &[
                ("writes", TASKS * OPS_PER_TASK as u64 + 50),
                ("hot_rows", hot.len() as u64),
                ("lost", acknowledged.abs_diff(hot.iter().map(|(_, v)| v).sum::<i64>())),
            ],
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "adaptive_folds"]
    async fn compaction_folds_a_cooled_counter_while_writes_go_on(t: TestDb) {
        let counters = adaptive(&t, "adaptive_fold", 1..=32);
        let table = counters.table().name();
        counters.create_table(&t.db).await.unwrap();
        let first = hammer(&t, &counters, HOT, 2).await;
        let wide = raw::slot_rows(&t.db, table, HOT, "likes").await.len();

        // Compactions while the counter is written again at its width: the
        // writes re-create rows the compaction just folded, and nothing is
        // lost or counted twice.
        let compactor = {
            let (db, counters) = (t.db.clone(), counters.clone());
            tokio::spawn(async move {
                let mut passes = 0u64;
                for _ in 0..5 {
                    counters.compact(&db, &Compact::new()).await?;
                    passes += 1;
                }
                Ok::<_, counter_core::CounterError>(passes)
            })
        };
        let second = hammer(&t, &counters, HOT, 3).await;
        let passes = compactor.await.unwrap().unwrap();
        let total = counters.get(&t.db, HOT, "likes").await.unwrap();
        assert_eq!(total, first + second, "[{}]", t.backend);

        // Quiet: one more pass leaves one row.
        counters.compact(&t.db, &Compact::new()).await.unwrap();
        let folded = raw::slot_rows(&t.db, table, HOT, "likes").await;
        assert_eq!(folded, [(0, first + second)], "[{}]", t.backend);
        figures(
            "adaptive_folds",
            t.backend,
            &[
                ("writes", 2 * TASKS * OPS_PER_TASK as u64),
                ("rows_before", wide as u64),
                ("compactions", passes + 1),
                ("rows_after", folded.len() as u64),
                ("lost", total.abs_diff(first + second)),
            ],
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "writer_shares"]
    async fn writers_keep_to_their_share_of_the_slots(t: TestDb) {
        let base = CounterTable::new("shared_slots")
            .unwrap()
            .with_slots(12)
            .unwrap();
        let writers: Vec<Counters<i64>> = (0..3)
            .map(|i| Counters::new(base.clone().with_writer(Writer::new(i, 3).unwrap())))
            .collect();
        writers[0].create_table(&t.db).await.unwrap();
        // Not a Galera node: no share of its own.
        assert_eq!(
            Writer::of_galera_node(&t.db).await.unwrap(),
            None,
            "[{}]",
            t.backend
        );

        // Each writer alone on its own counter: only its slots.
        for (i, counters) in writers.iter().enumerate() {
            for _ in 0..40 {
                counters.increment(&t.db, i as i64, "likes").await.unwrap();
            }
            let rows = raw::slot_rows(&t.db, "shared_slots", i as i64, "likes").await;
            let slots: BTreeSet<i16> = rows.iter().map(|(s, _)| *s).collect();
            let share: BTreeSet<i16> = (0..12).filter(|s| s % 3 == i as i16).collect();
            assert_eq!(slots, share, "[{}] writer {i}", t.backend);
        }

        // All three on one counter at once: exact.
        let tasks: Vec<_> = writers
            .iter()
            .flat_map(|counters| (0..8).map(move |_| counters.clone()))
            .map(|counters| {
                let db = t.db.clone();
                tokio::spawn(async move {
                    for _ in 0..50 {
                        counters.increment(&db, HOT, "likes").await?;
                    }
                    Ok::<_, counter_core::CounterError>(())
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        assert_eq!(
            counters_total(&t, &writers[1]).await,
            24 * 50,
            "[{}]",
            t.backend
        );
        let rows = raw::slot_rows(&t.db, "shared_slots", HOT, "likes").await;
        assert!(rows.len() <= 12, "[{}] {rows:?}", t.backend);
        t.finish().await;
    }
}

async fn counters_total(t: &TestDb, counters: &Counters<i64>) -> i64 {
    counters.get(&t.db, HOT, "likes").await.unwrap()
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "adaptive_dropped"]
    async fn adaptive_writes_dropped_mid_flight_stay_within_what_was_sent(t: TestDb) {
        let counters = adaptive(&t, "adaptive_drop", 1..=32);
        let table = counters.table().name().to_owned();
        counters.create_table(&t.db).await.unwrap();
        // 16 writers, every other call dropped after 0 to 2 ms, as axum
        // drops a handler whose client left: a dropped write may or may
        // not have committed, an acknowledged one has.
        let writers: Vec<_> = (0..16u64)
            .map(|task| {
                let (db, counters) = (t.db.clone(), counters.clone());
                tokio::spawn(async move {
                    let mut rng = StdRng::seed_from_u64(task);
                    let (mut acknowledged, mut dropped) = (0i64, 0i64);
                    for i in 0..60 {
                        let write = counters.increment(&db, HOT, "likes");
                        if i % 2 == 0 {
                            let wait = std::time::Duration::from_micros(rng.random_range(0..2000));
                            match tokio::time::timeout(wait, write).await {
                                Ok(done) => {
                                    done?;
                                    acknowledged += 1;
                                }
                                Err(_) => dropped += 1,
                            }
                        } else {
                            write.await?;
                            acknowledged += 1;
                        }
                    }
                    Ok::<_, counter_core::CounterError>((acknowledged, dropped))
                })
            })
            .collect();
        let (mut acknowledged, mut dropped) = (0, 0);
        for writer in writers {
            let (a, d) = writer
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("[{}] {e}", t.backend));
            acknowledged += a;
            dropped += d;
        }
        // The dropped writes finish in their own tasks: wait for them to land.
        let mut total = counters.get(&t.db, HOT, "likes").await.unwrap();
        for _ in 0..50 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            total = counters.get(&t.db, HOT, "likes").await.unwrap();
        }
        assert!(
            (acknowledged..=acknowledged + dropped).contains(&total),
            "[{}] total {total}, acknowledged {acknowledged}, dropped {dropped}",
            t.backend
        );
        // The counter still takes writes, and every row is within its ceiling.
        counters.increment(&t.db, HOT, "likes").await.unwrap();
        let rows = raw::slot_rows(&t.db, &table, HOT, "likes").await;
        assert!(
            rows.iter().all(|(slot, _)| (0..32).contains(slot)),
            "{rows:?}"
        );
        assert_eq!(rows.iter().map(|(_, v)| v).sum::<i64>(), total + 1);
        figures(
            "adaptive_dropped",
            t.backend,
            &[
                ("writes", 16 * 60),
                ("acknowledged", acknowledged as u64),
                ("dropped", dropped as u64),
                ("dropped_applied", (total - acknowledged) as u64),
                ("lost", (acknowledged - total).max(0) as u64),
            ],
        );
        t.finish().await;
    }
}
