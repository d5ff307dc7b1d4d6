//! The suite's scenarios, each on tables of its own, each returning its
//! figures.

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use counter_core::{
    Compact, CounterBuffer, CounterError, CounterTable, Counters, DeltaBatch, ErrorKind,
    FlushLedger, Reconcile, SlotPolicy, Truth, Writer, prelude::*,
};
use counter_tests::galera::GaleraCluster;
use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, EntityTrait, IntoActiveModel, Schema, Set,
    sea_query::{Alias, Query},
};

type Figures = Vec<(&'static str, u64)>;

/// Waits until every node reads `want` from `read` (a node applies the
/// others' commits a moment after they return), at most 20 s. Returns
/// how far the first node's first read was from it: the writes it had
/// not applied yet when the writers returned (a lost or doubled write
/// fails the wait instead).
async fn same_on_every_node<F, Fut>(
    nodes: &[DatabaseConnection],
    what: &str,
    want: i64,
    read: F,
) -> u64
where
    F: Fn(DatabaseConnection) -> Fut,
    Fut: Future<Output = i64>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut first = None;
    for (i, node) in nodes.iter().enumerate() {
        loop {
            let got = read(node.clone()).await;
            first.get_or_insert(got.abs_diff(want));
            if got == want {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: node {i} reads {got}, want {want}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    first.unwrap_or(0)
}

/// `per_node` tasks on each node, each running `rounds` of `write`; the
/// sum of what they acknowledged.
async fn on_every_node<F, Fut>(nodes: &[DatabaseConnection], per_node: usize, write: F) -> i64
where
    F: Fn(usize, DatabaseConnection, StdRng) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<i64, CounterError>> + Send + 'static,
{
    let mut tasks = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        for task in 0..per_node {
            let (write, db) = (write.clone(), node.clone());
            let rng = StdRng::seed_from_u64((i * 1000 + task) as u64);
            tasks.push(tokio::spawn(async move { write(i, db, rng).await }));
        }
    }
    let mut acknowledged = 0;
    for task in tasks {
        acknowledged += task
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("a writer: {e}"));
    }
    acknowledged
}

/// One hot counter written from all three nodes, three ways: 16 fixed
/// slots, adaptive slots, and 48 slots shared out by writer (node `i` is
/// writer `i` of 3).
pub async fn hot_counter_on_every_node(nodes: &[DatabaseConnection]) -> Figures {
    let tables = [
        ("g_fixed", CounterTable::new("g_fixed").unwrap()),
        (
            "g_adaptive",
            CounterTable::new("g_adaptive")
                .unwrap()
                .with_slot_policy(SlotPolicy::adaptive(1..=64).unwrap()),
        ),
        (
            "g_shares",
            CounterTable::new("g_shares")
                .unwrap()
                .with_slots(48)
                .unwrap(),
        ),
    ];
    // Each node's share, as the node itself reports it: writers 0, 1 and 2 of 3.
    let mut shares = Vec::new();
    for node in nodes {
        shares.push(
            Writer::of_galera_node(node)
                .await
                .unwrap()
                .expect("a Galera node"),
        );
    }
    let mut indexes: Vec<u16> = shares.iter().map(|w| w.index()).collect();
    indexes.sort();
    assert_eq!(indexes, [0, 1, 2], "{shares:?}");
    assert!(shares.iter().all(|w| w.count() == 3), "{shares:?}");
    let mut figures = Figures::new();
    let mut off = 0;
    for (name, table) in tables {
        Counters::<i64>::new(table.clone())
            .create_table(&nodes[0])
            .await
            .unwrap();
        let share = (name == "g_shares").then(|| shares.clone());
        let given_up = Arc::new(AtomicU64::new(0));
        let gave_up = given_up.clone();
        let acknowledged = on_every_node(nodes, 8, move |node, db, mut rng| {
            let mut table = table.clone();
            if let Some(shares) = &share {
                table = table.with_writer(shares[node]);
            }
            let (counters, given_up) = (Counters::<i64>::new(table), gave_up.clone());
            async move {
                let mut sum = 0;
                for _ in 0..60 {
                    let delta = if rng.random_bool(0.8) { 1 } else { -1 };
                    match counters.add(&db, 1, "likes", delta).await {
                        Ok(()) => sum += delta,
                        // Lost certification on every retry: not counted.
                        Err(CounterError::Conflict { .. }) => {
                            given_up.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => return Err(e),
                    }
                }
                Ok(sum)
            }
        })
        .await;
        let counters = Counters::<i64>::new(CounterTable::new(name).unwrap());
        off += same_on_every_node(nodes, name, acknowledged, |db| {
            let counters = counters.clone();
            async move { counters.get(&db, 1, "likes").await.unwrap() }
        })
        .await;
        let label = match name {
            "g_fixed" => "hot_fixed16_given_up",
            "g_adaptive" => "hot_adaptive_given_up",
            _ => "hot_shares48_given_up",
        };
        figures.push((label, given_up.load(Ordering::Relaxed)));
    }
    figures.push(("hot_writes", 3 * 3 * 8 * 60));
    figures.push(("hot_first_read_behind", off));
    figures
}

/// Sorted batches from every node at once, and a write-behind buffer per
/// node: exact totals everywhere.
pub async fn batches_and_buffers_on_every_node(nodes: &[DatabaseConnection]) -> Figures {
    let counters = Counters::<i64>::new(
        CounterTable::new("g_batches")
            .unwrap()
            .with_slots(12)
            .unwrap(),
    );
    counters.create_table(&nodes[0]).await.unwrap();
    // Each node its own share of the slots, as the guide advises on a
    // cluster; a batch that loses every retry is not acknowledged.
    let writer = counters.clone();
    let given_up = Arc::new(AtomicU64::new(0));
    let gave_up = given_up.clone();
    let batched = on_every_node(nodes, 4, move |node, db, mut rng| {
        let table = writer
            .table()
            .clone()
            .with_writer(Writer::new(node as u16, 3).unwrap());
        let (counters, given_up) = (Counters::<i64>::new(table), gave_up.clone());
        async move {
            let mut sum = 0;
            for _ in 0..25 {
                let mut batch = DeltaBatch::new();
                let mut batch_sum = 0;
                for _ in 0..10 {
                    let (owner, delta) = (rng.random_range(1..=20i64), rng.random_range(-3..=9));
                    batch.add(&counters, owner, "views", delta)?;
                    batch_sum += delta;
                }
                match batch.apply(&db).await {
                    Ok(_) => sum += batch_sum,
                    Err(CounterError::Conflict { .. }) => {
                        given_up.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(sum)
        }
    })
    .await;
    // Exactly-once flushes: each writer's ledger rows replicate too.
    FlushLedger::default()
        .create_table(&nodes[0])
        .await
        .unwrap();
    let mut buffered = 0;
    let mut buffers = Vec::new();
    for node in nodes {
        buffers.push(
            CounterBuffer::builder(node)
                .interval(Duration::from_millis(50))
                .start()
                .await
                .unwrap(),
        );
    }
    let mut rng = StdRng::seed_from_u64(7);
    for round in 0..3000 {
        let delta = rng.random_range(1..=5);
        buffers[round % 3]
            .add(&counters, rng.random_range(1..=20i64), "views", delta)
            .unwrap();
        buffered += delta;
        if round % 500 == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for buffer in &buffers {
        let stats = buffer.shutdown().await.unwrap();
        assert_eq!(stats.pending_adds, 0, "{stats:?}");
    }
    let owners: Vec<i64> = (1..=20).collect();
    let off = same_on_every_node(nodes, "batches and buffers", batched + buffered, |db| {
        let (counters, owners) = (counters.clone(), owners.clone());
        async move {
            let counts = counters.get_many(&db, &owners, &["views"]).await.unwrap();
            counts.values().map(|c| c["views"]).sum()
        }
    })
    .await;
    vec![
        ("batches", 3 * 4 * 25),
        ("batches_given_up", given_up.load(Ordering::Relaxed)),
        ("buffered_adds", 3000),
        ("batches_first_read_behind", off),
    ]
}

/// Compactions started on nodes 0 and 1 at once, five passes each, while
/// all three nodes write the counters they fold.
pub async fn compactions_on_two_nodes_at_once(nodes: &[DatabaseConnection]) -> Figures {
    let counters = Counters::<i64>::new(CounterTable::new("g_compact").unwrap());
    counters.create_table(&nodes[0]).await.unwrap();
    let (passes, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let compactors: Vec<_> = nodes[..2]
        .iter()
        .map(|db| {
            let (db, counters) = (db.clone(), counters.clone());
            let (passes, refused) = (passes.clone(), refused.clone());
            tokio::spawn(async move {
                for _ in 0..5 {
                    match counters.compact(&db, &Compact::new()).await {
                        Ok(_) => passes.fetch_add(1, Ordering::Relaxed),
                        // Lost every retry to the writers: nothing changed.
                        Err(e) if e.kind() == ErrorKind::Transient => {
                            refused.fetch_add(1, Ordering::Relaxed)
                        }
                        Err(e) => panic!("compaction: {e}"),
                    };
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
            })
        })
        .collect();
    let writer = counters.clone();
    let acknowledged = on_every_node(nodes, 6, move |_, db, mut rng| {
        let counters = writer.clone();
        async move {
            let mut sum = 0;
            for _ in 0..80 {
                counters
                    .add(&db, rng.random_range(1..=5i64), "likes", 1)
                    .await?;
                sum += 1;
            }
            Ok(sum)
        }
    })
    .await;
    for compactor in compactors {
        compactor.await.unwrap();
    }
    counters.compact(&nodes[2], &Compact::new()).await.unwrap();
    let owners: Vec<i64> = (1..=5).collect();
    let off = same_on_every_node(nodes, "compacted", acknowledged, |db| {
        let (counters, owners) = (counters.clone(), owners.clone());
        async move {
            let counts = counters.get_many(&db, &owners, &["likes"]).await.unwrap();
            counts.values().map(|c| c["likes"]).sum()
        }
    })
    .await;
    vec![
        ("compaction_writes", 3 * 6 * 80),
        ("compactions", passes.load(Ordering::Relaxed) + 1),
        (
            "compactions_lost_to_writers",
            refused.load(Ordering::Relaxed),
        ),
        ("compaction_first_read_behind", off),
    ]
}

/// The field check's shape: 24 writers (8 per node, each node writing its
/// own share of 48 slots) on one hot counter, compactions looping on nodes
/// 0 and 1 while they write: first folding every slot (`all_slots`: each
/// fold of another node's rows loses certification to that node's
/// writers), then the default on a Galera node, each node folding its own
/// share. The node-share compactions must commit while the writes run;
/// afterwards a compaction on every node leaves at most one row per node;
/// every acknowledged write is in the total, on every node.
pub async fn compaction_with_writers_on_every_node(nodes: &[DatabaseConnection]) -> Figures {
    let table = CounterTable::new("g_compact_hot")
        .unwrap()
        .with_slots(48)
        .unwrap();
    let counters = Counters::<i64>::new(table.clone());
    counters.create_table(&nodes[0]).await.unwrap();
    let mut shares = Vec::new();
    for node in nodes {
        shares.push(
            Writer::of_galera_node(node)
                .await
                .unwrap()
                .expect("a Galera node"),
        );
    }
    let mut figures = Figures::new();
    let mut acknowledged = 0;
    for (phase, options) in [
        ("whole", Compact::new().all_slots()),
        ("share", Compact::new()),
    ] {
        let writing = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let compactors: Vec<_> = nodes[..2]
            .iter()
            .map(|db| {
                let (db, counters, options) = (db.clone(), counters.clone(), options.clone());
                let writing = writing.clone();
                tokio::spawn(async move {
                    let (mut ok, mut refused, mut folded) = (0u64, 0u64, 0u64);
                    while writing.load(Ordering::Relaxed) && ok + refused < 200 {
                        match counters.compact(&db, &options).await {
                            Ok(report) => {
                                ok += 1;
                                folded += report.totals.counters_folded;
                            }
                            // Lost every retry to the writers: nothing changed.
                            Err(e) if e.kind() == ErrorKind::Transient => refused += 1,
                            Err(e) => panic!("compaction: {e}"),
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    (ok, refused, folded)
                })
            })
            .collect();
        let stop_at = Instant::now() + Duration::from_secs(5);
        let shares = shares.clone();
        let writer_table = table.clone();
        acknowledged += on_every_node(nodes, 8, move |node, db, _| {
            let counters = Counters::<i64>::new(writer_table.clone().with_writer(shares[node]));
            async move {
                let mut sum = 0;
                while Instant::now() < stop_at && sum < 2_000 {
                    counters.increment(&db, 1, "likes").await?;
                    sum += 1;
                }
                Ok(sum)
            }
        })
        .await;
        writing.store(false, Ordering::Relaxed);
        let (mut ok, mut refused, mut folded) = (Vec::new(), 0, 0);
        for compactor in compactors {
            let (o, l, f) = compactor.await.unwrap();
            ok.push(o);
            refused += l;
            folded += f;
        }
        let (ok_label, refused_label, folded_label) = match phase {
            "whole" => (
                "compact_whole_ok",
                "compact_whole_refused",
                "compact_whole_folded",
            ),
            _ => (
                "compact_share_ok",
                "compact_share_refused",
                "compact_share_folded",
            ),
        };
        if phase == "share" {
            // Progress while every node wrote, on each compacting node.
            assert!(
                ok.iter().all(|&o| o > 0),
                "node-share compactions committed {ok:?}, refused {refused}"
            );
        }
        figures.extend([
            (ok_label, ok.iter().sum()),
            (refused_label, refused),
            (folded_label, folded),
        ]);
    }
    // Quiet now: each node folds its share; one row per node is left.
    for node in nodes {
        let report = counters.compact(node, &Compact::new()).await.unwrap();
        assert!(report.share.is_some(), "{report:?}");
    }
    let rows: i64 = {
        let select = Query::select()
            .expr_as(sea_orm::sea_query::Expr::cust("COUNT(*)"), Alias::new("n"))
            .from(Alias::new("g_compact_hot"))
            .to_owned();
        nodes[0]
            .query_one(&select)
            .await
            .unwrap()
            .unwrap()
            .try_get("", "n")
            .unwrap()
    };
    assert!(
        rows <= 3,
        "{rows} rows after every node compacted its share"
    );
    let off = same_on_every_node(nodes, "compacted hot counter", acknowledged, |db| {
        let counters = counters.clone();
        async move { counters.get(&db, 1, "likes").await.unwrap() }
    })
    .await;
    figures.extend([
        ("compact_hot_writes", acknowledged as u64),
        ("compact_hot_rows_after", rows as u64),
        ("compact_hot_first_read_behind", off),
    ]);
    figures
}

mod shelf {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "g_shelves")]
    #[counter(keys(items), slots = 8, table = "g_shelf_counters")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

mod item {
    use counter_core::CounterCache;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, CounterCache)]
    #[sea_orm(table_name = "g_items")]
    #[counter_cache(parent = super::shelf::Entity, key = items, via = shelf_id)]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub shelf_id: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    counter_core::counter_cache_behavior!();
}

/// A counter cache's row deleted on two nodes at once, 20 times: one
/// delete counts, the other finds nothing (or loses certification and,
/// retried, finds nothing).
pub async fn double_deletes_on_two_nodes(nodes: &[DatabaseConnection]) -> Figures {
    let schema = Schema::new(nodes[0].get_database_backend());
    nodes[0]
        .execute(&schema.create_table_from_entity(item::Entity))
        .await
        .unwrap();
    shelf::Entity::counters()
        .create_table(&nodes[0])
        .await
        .unwrap();
    let mut deleted = 0;
    for round in 0..20 {
        let am = item::ActiveModel {
            shelf_id: Set(1),
            ..Default::default()
        };
        let row = item::Entity::insert_counted(&nodes[0], am).await.unwrap();
        // The row on node 1 too before the race.
        same_on_every_node(&nodes[..2], "the new row", 1, |db| async move {
            i64::from(
                item::Entity::find_by_id(row.id)
                    .one(&db)
                    .await
                    .unwrap()
                    .is_some(),
            )
        })
        .await;
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let deleters: Vec<_> = nodes[..2]
            .iter()
            .map(|db| {
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
            affected.push(
                deleter
                    .await
                    .unwrap()
                    .unwrap_or_else(|e| panic!("round {round}: {e}"))
                    .rows_affected,
            );
        }
        affected.sort();
        assert_eq!(affected, [0, 1], "round {round}");
        deleted += 1;
        same_on_every_node(nodes, "items after a double delete", 0, |db| async move {
            shelf::Entity::counters()
                .counts(&db, 1)
                .await
                .unwrap()
                .items
        })
        .await;
    }
    vec![("double_deletes", deleted)]
}

/// A recount that repairs is refused on every node, typed; a dry run
/// measures the drift.
pub async fn recounts_are_refused(nodes: &[DatabaseConnection]) -> Figures {
    let counters = shelf::Entity::counters().untyped();
    counters.add(&nodes[0], 1, "items", 5).await.unwrap();
    let truth = || {
        Truth::statement(
            Query::select()
                .expr_as(
                    sea_orm::sea_query::Expr::col(Alias::new("shelf_id")),
                    Alias::new("owner_id"),
                )
                .expr_as(sea_orm::sea_query::Expr::cust("COUNT(*)"), Alias::new("n"))
                .from(Alias::new("g_items"))
                .group_by_col(Alias::new("shelf_id"))
                .to_owned(),
        )
    };
    let mut refused = 0;
    for (i, db) in nodes.iter().enumerate() {
        let err = counters
            .reconcile(db, "items", truth(), &Reconcile::new())
            .await
            .unwrap_err();
        assert!(
            matches!(err, CounterError::ClusterUnsafe { .. }),
            "node {i}: {err}"
        );
        assert_eq!(err.kind(), ErrorKind::Misuse, "node {i}");
        refused += 1;
        let dry = counters
            .reconcile(db, "items", truth(), &Reconcile::new().dry_run(true))
            .await
            .unwrap();
        assert_eq!(dry.drifted.len(), 1, "node {i}: {dry:?}");
    }
    vec![("recounts_refused", refused)]
}

/// Writers on all three nodes; node 2 is killed mid-run and restarted.
/// Every write acknowledged anywhere is in the total, on every node; a
/// write in flight on the killed node may have committed (its reply lost).
pub async fn node_killed_and_rejoined(
    cluster: &Arc<GaleraCluster>,
    nodes: &[DatabaseConnection],
) -> Figures {
    let table = CounterTable::new("g_kill").unwrap().with_slots(24).unwrap();
    Counters::<i64>::new(table.clone())
        .create_table(&nodes[0])
        .await
        .unwrap();
    let counters = Counters::<i64>::new(table.clone());
    let (acknowledged, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let given_up = Arc::new(AtomicU64::new(0));
    // The longest one write took on a surviving node: the pause while the
    // cluster evicts the dead node.
    let longest_ms = Arc::new(AtomicU64::new(0));
    let stop_at = Instant::now() + Duration::from_secs(8);
    let mut writers = Vec::new();
    for (i, db) in nodes.iter().enumerate() {
        for _ in 0..6 {
            let db = db.clone();
            let share = table.clone().with_writer(Writer::new(i as u16, 3).unwrap());
            let counters = Counters::<i64>::new(share);
            let (acknowledged, failed) = (acknowledged.clone(), failed.clone());
            let (given_up, longest_ms) = (given_up.clone(), longest_ms.clone());
            writers.push(tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < stop_at && n < 5_000 {
                    n += 1;
                    let started = Instant::now();
                    match counters.increment(&db, 1, "likes").await {
                        Ok(()) => {
                            acknowledged.fetch_add(1, Ordering::Relaxed);
                            if i != 2 {
                                let ms = started.elapsed().as_millis() as u64;
                                longest_ms.fetch_max(ms, Ordering::Relaxed);
                            }
                        }
                        // Refused by the database after every retry:
                        // rolled back, not counted.
                        Err(CounterError::Conflict { .. }) => {
                            given_up.fetch_add(1, Ordering::Relaxed);
                        }
                        // Only the killed node's writers fail otherwise:
                        // their outcome is unknown, and they stop. A lost
                        // connection is one kind, whatever the call.
                        Err(e) => {
                            assert_eq!(i, 2, "node {i}: {e}");
                            assert_eq!(e.kind(), ErrorKind::Transient, "{e:?}");
                            failed.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                    }
                }
            }));
        }
    }
    // A pool of its own on the node to be killed, with a short wait, for
    // the other calls to meet the dead node.
    let probe = counter_tests::servers::pool(&cluster.urls()[2], 2, Duration::from_secs(2)).await;
    counters.get(&probe, 1, "likes").await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killer = cluster.clone();
    tokio::task::spawn_blocking(move || killer.kill(2))
        .await
        .unwrap();
    for writer in writers {
        writer.await.unwrap();
    }
    // Every call on the dead node fails with the same kind.
    let mut dead_node_calls = 0;
    for call in ["increment", "batch", "compact", "read"] {
        let outcome = match call {
            "increment" => counters.increment(&probe, 1, "likes").await,
            "batch" => {
                let mut batch = DeltaBatch::new();
                batch.add(&counters, 1, "likes", 1).unwrap();
                batch.add(&counters, 2, "likes", 1).unwrap();
                batch.apply(&probe).await.map(drop)
            }
            "compact" => counters.compact(&probe, &Compact::new()).await.map(drop),
            _ => counters.get(&probe, 1, "likes").await.map(drop),
        };
        let error = outcome.expect_err("a call on a dead node");
        assert_eq!(
            error.kind(),
            ErrorKind::Transient,
            "{call} on the dead node: {error:?}"
        );
        dead_node_calls += 1;
    }
    let _ = probe.close().await;
    let restarter = cluster.clone();
    let started = Instant::now();
    tokio::task::spawn_blocking(move || restarter.restart(2))
        .await
        .unwrap();
    let rejoin_ms = started.elapsed().as_millis() as u64;
    let (acknowledged, in_doubt) = (
        acknowledged.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
    );
    // What node 0 reads, with the doubtful writes counted or not.
    let total = counters.get(&nodes[0], 1, "likes").await.unwrap();
    let total = u64::try_from(total).unwrap();
    assert!(
        (acknowledged..=acknowledged + in_doubt).contains(&total),
        "total {total}, acknowledged {acknowledged}, in doubt {in_doubt}"
    );
    // The killed node's pool reconnects; every node reads the same total.
    same_on_every_node(nodes, "after the rejoin", total as i64, |db| {
        let counters = counters.clone();
        async move { counters.get(&db, 1, "likes").await.unwrap_or(-1) }
    })
    .await;
    vec![
        ("kill_acknowledged", acknowledged),
        ("kill_in_doubt", in_doubt),
        ("kill_given_up", given_up.load(Ordering::Relaxed)),
        ("kill_lost", acknowledged.saturating_sub(total)),
        ("dead_node_calls_transient", dead_node_calls),
        (
            "survivor_longest_write_ms",
            longest_ms.load(Ordering::Relaxed),
        ),
        ("rejoin_ms", rejoin_ms),
    ]
}
