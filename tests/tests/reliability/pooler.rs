//! Through PgBouncer in transaction pooling mode (a private one, three
//! server connections per database shared by every client): two
//! "instances" (pools told of the pooler by their statement cache of 0)
//! count at once through increments, batches, a buffer's flushes,
//! compactions and unique observes, and every total is exact; a pool that
//! was not told fails loudly (`Transient`), never by running another
//! client's statement.

use std::time::Duration;

use counter_core::{CounterBuffer, DeltaBatch, ErrorKind, FlushLedger};
use counter_tests::{TestDb, backend_test, figures, pgbouncer::PgBouncer, servers, uniques};
use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait};

const INSTANCES: usize = 2;
const TASKS: i64 = 4;
const INCREMENTS: i64 = 60;
const BATCHES: i64 = 15;
const TRANSACTIONS: i64 = 20;
const BUFFERED: i64 = 120;
const MEMBERS: u64 = 40;

/// What one instance adds to `likes` over owners 1..=5, all paths at once.
async fn instance(
    i: usize,
    db: DatabaseConnection,
    c: counter_core::Counters<i64>,
) -> Result<i64, counter_core::CounterError> {
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..TASKS {
        let (db, c) = (db.clone(), c.clone());
        tasks.spawn(async move {
            for n in 0..INCREMENTS {
                c.increment(&db, 1 + (task + n) % 5, "likes").await?;
            }
            for _ in 0..BATCHES {
                let mut batch = DeltaBatch::new();
                for owner in 1..=5 {
                    batch.add(&c, owner, "likes", 1)?;
                }
                batch.apply(&db).await?;
            }
            Ok::<i64, counter_core::CounterError>(INCREMENTS + BATCHES * 5)
        });
    }
    for task in 0..TASKS {
        // The commonest use: counting in the application's own transaction.
        let (db, c) = (db.clone(), c.clone());
        tasks.spawn(async move {
            for n in 0..TRANSACTIONS {
                let txn = db
                    .begin()
                    .await
                    .map_err(counter_core::CounterError::Database)?;
                c.add(&txn, 1 + (task + n) % 5, "likes", 1).await?;
                tokio::time::sleep(Duration::from_millis(1)).await;
                txn.commit()
                    .await
                    .map_err(counter_core::CounterError::Database)?;
            }
            Ok(TRANSACTIONS)
        });
    }
    {
        let (db, c) = (db.clone(), c.clone());
        tasks.spawn(async move {
            for n in 0..MEMBERS {
                c.observe(&db, 1, "viewers", &format!("viewer-{i}-{n}"))
                    .await?;
            }
            for _ in 0..3 {
                c.compact(&db, &Default::default()).await?;
            }
            Ok(0)
        });
    }
    let buffer = CounterBuffer::builder(&db)
        .interval(Duration::from_millis(5))
        .flush_at(16)
        .start()
        .await?;
    for n in 0..BUFFERED {
        buffer.add(&c, 1 + n % 5, "likes", 1)?;
    }
    let mut added = BUFFERED;
    buffer.shutdown().await?;
    while let Some(done) = tasks.join_next().await {
        added += done.expect("a task")?;
    }
    Ok(added)
}

backend_test! {
    #[backends(postgres)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "pooler_transaction_mode"]
    async fn every_path_counts_exactly_through_pgbouncer_in_transaction_mode(t: TestDb) {
        if counter_core::pooling::is_transaction_pooled(&t.db) {
            // It puts a PgBouncer of its own in front of the server, and
            // creates its database there: the server, not another pooler.
            eprintln!("skipped {}: it needs a direct connection to the server", t.label());
            t.finish().await;
            return;
        }
        let upstream = t.server_addr().expect("a server address");
        let to = upstream.clone();
        let bouncer = tokio::task::spawn_blocking(move || PgBouncer::start(&to, 3))
            .await
            .expect("start PgBouncer");
        // A database of its own: a schema is a session's search_path, which
        // a transaction pooler does not keep.
        let database = format!("ct_pooler_{}_{}", std::process::id(), servers::free_port());
        t.db.execute_unprepared(&format!("CREATE DATABASE \"{database}\""))
            .await
            .expect("create the pooled database");
        let direct = servers::pool(&format!("postgres://postgres@{upstream}/{database}"), 2, Duration::from_secs(10)).await;
        let pools: Vec<DatabaseConnection> = {
            let mut pools = Vec::new();
            for _ in 0..INSTANCES {
                pools.push(servers::pool(&bouncer.url(&database), 6, Duration::from_secs(30)).await);
            }
            pools
        };
        assert!(counter_core::pooling::is_transaction_pooled(&pools[0]), "the URL's cache of 0 names the pooler");
        assert!(!counter_core::pooling::is_transaction_pooled(&direct));

        let c = uniques("pooled_counters", 8);
        c.create_table(&pools[0]).await.expect("create the table through the pooler");
        c.create_table(&pools[1]).await.expect("create it again: idempotent");
        FlushLedger::default().create_table(&pools[0]).await.expect("the buffer's ledger");

        let runs: Vec<_> = pools
            .iter()
            .enumerate()
            .map(|(i, db)| tokio::spawn(instance(i, db.clone(), c.clone())))
            .collect();
        let mut acknowledged = 0i64;
        for run in runs {
            acknowledged += run.await.expect("an instance").expect("every call through the pooler succeeds");
        }
        let owners = [1, 2, 3, 4, 5];
        let through_pooler = c.get_many(&pools[1], &owners, &["likes"]).await.expect("read through the pooler");
        let likes = |counts: &counter_core::CountMap<i64>, owner: &i64| {
            counts.get(owner).and_then(|keys| keys.get("likes")).copied().unwrap_or(0)
        };
        let stored: i64 = owners.iter().map(|o| likes(&through_pooler, o)).sum();
        let direct_total: i64 = {
            let counts = c.get_many(&direct, &owners, &["likes"]).await.expect("read directly");
            owners.iter().map(|o| likes(&counts, o)).sum()
        };
        assert_eq!(stored, direct_total, "the pooler and the server agree");
        assert_eq!(stored, acknowledged, "every acknowledged add counted once");
        let members = c.unique(&pools[0], 1, "viewers").await.expect("a unique read through the pooler");
        let observed = INSTANCES as u64 * MEMBERS;
        assert!(members.abs_diff(observed) <= observed / 20, "{members} of {observed} members");

        // A pool not told of the pooler: its first statement is split at a
        // `Sync` and its `Bind` finds nothing prepared. Loud, and retryable.
        let untold = servers::pool(&bouncer.url_cached(&database), 2, Duration::from_secs(10)).await;
        let error = c.increment(&untold, 1, "likes").await.expect_err("an unprepared Bind");
        assert_eq!(error.kind(), ErrorKind::Transient, "{error}");
        let after = c.get(&direct, 1, "likes").await.expect("read");
        assert_eq!(after, likes(&through_pooler, &1), "the refused add wrote nothing");

        for pool in pools.into_iter().chain([untold]) {
            let _ = pool.close().await;
        }
        let _ = direct.close().await;
        drop(bouncer);
        t.db.execute_unprepared(&format!("DROP DATABASE \"{database}\" WITH (FORCE)"))
            .await
            .expect("drop the pooled database");
        figures(
            "pooler_transaction_mode",
            t.backend,
            &[
                ("instances", INSTANCES as u64),
                ("adds", acknowledged as u64),
                ("lost", acknowledged.saturating_sub(stored) as u64),
                ("doubled", stored.saturating_sub(acknowledged) as u64),
                ("unique_members", members),
                ("untold_refused", 1),
            ],
        );
        t.finish().await;
    }
}
