//! The correctness core on a private three-node MariaDB Galera cluster
//! (multi-primary: every node takes writes, and conflicting transactions
//! are settled by certification at commit, the loser getting a deadlock
//! error that the crate retries on a pool).
//!
//! One cluster for the whole suite (starting one takes about 15 s), the
//! scenarios one after the other, each on tables of its own:
//! * one hot counter written from all three nodes (fixed slots, adaptive
//!   slots, and writer shares): exact, and every node reads the same total;
//! * sorted batches and write-behind buffers on every node;
//! * compactions started on two nodes at once while all three write, and
//!   compactions looping on two nodes while 24 writers on every node write
//!   one hot counter (folding every slot, then each node its own share);
//! * a counter cache's concurrent double deletes, one on each of two nodes;
//! * recounts that repair, refused on every node with a typed error
//!   (their lock is one node's), dry runs allowed;
//! * a node killed mid-run (SIGKILL) and rejoined: every acknowledged
//!   write is in the total, on every node; every call that meets the dead
//!   node fails with the same kind (`Transient`).
//!
//! Runs where `COUNTER_TEST_GALERA_PROVIDER` names the Galera library. It
//! lives in the reliability binary, not one of its own: the suite mostly
//! waits (node starts, state transfers, a kill), and here the other
//! reliability tests run beside it.

mod scenarios;

use std::{sync::Arc, time::Duration, time::Instant};

use counter_tests::{
    figures,
    galera::{self, GaleraCluster},
    servers,
};
use sea_orm::DatabaseConnection;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn galera_cluster_counts_exactly() {
    let Some(provider) = galera::provider("galera_cluster_counts_exactly") else {
        return;
    };
    let started = Instant::now();
    let cluster = Arc::new(
        tokio::task::spawn_blocking(move || GaleraCluster::start(provider))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())),
    );
    let start_secs = started.elapsed().as_secs();
    let mut nodes: Vec<DatabaseConnection> = Vec::new();
    for url in cluster.urls() {
        nodes.push(servers::pool(&url, 40, Duration::from_secs(30)).await);
    }
    let conflicts_before = conflicts(&cluster).await;
    let mut report = Vec::new();
    report.extend(scenarios::hot_counter_on_every_node(&nodes).await);
    report.extend(scenarios::batches_and_buffers_on_every_node(&nodes).await);
    report.extend(scenarios::compactions_on_two_nodes_at_once(&nodes).await);
    report.extend(scenarios::compaction_with_writers_on_every_node(&nodes).await);
    report.extend(scenarios::double_deletes_on_two_nodes(&nodes).await);
    report.extend(scenarios::recounts_are_refused(&nodes).await);
    let conflicts_after = conflicts(&cluster).await;
    report.extend(scenarios::node_killed_and_rejoined(&cluster, &nodes).await);
    report.push(("conflicts_retried", conflicts_after - conflicts_before));
    report.push(("cluster_start_secs", start_secs));
    report.push(("suite_secs", started.elapsed().as_secs()));
    figures("galera_suite", "galera", &report);
    for node in nodes {
        let _ = node.close().await;
    }
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .expect("stop the cluster");
}

/// Certification failures and brute-force aborts so far, summed over the
/// nodes: the conflicts the cluster settled by failing a transaction.
async fn conflicts(cluster: &Arc<GaleraCluster>) -> u64 {
    let cluster = cluster.clone();
    tokio::task::spawn_blocking(move || {
        (0..3)
            .flat_map(|i| {
                ["wsrep_local_cert_failures", "wsrep_local_bf_aborts"]
                    .map(|name| cluster.status(i, name).parse::<u64>().unwrap_or(0))
            })
            .sum()
    })
    .await
    .expect("read the nodes' status")
}
