//! A private three-node MariaDB Galera cluster on loopback, for the tests
//! and benchmarks that need a multi-primary engine (recipe:
//! `../shared/GALERA.md`).
//!
//! Each node is a `mariadbd` child process with a data directory of its own
//! under one temporary directory, on free ports of `127.0.0.1` (SQL, group
//! communication, IST, SST). Node 0 bootstraps the cluster; nodes 1 and 2
//! join by state transfer (rsync). Every node is killed and the directory
//! deleted on drop, whether the test passed or not (a failing test prints
//! the nodes' log tails first).
//!
//! It runs where [`GALERA_VAR`] names the Galera provider library
//! (`libgalera_smm.so`); `.ci/run` sets it. The MariaDB binaries are found
//! as for [`PrivateMariaDb`](crate::servers::PrivateMariaDb).
//!
//! The calls block (they run processes): call them from
//! `tokio::task::spawn_blocking`.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use crate::servers::{
    MariaDbBin, free_port, log_tail, mariadb_bin, remove, run, running_as_root, scratch_dir,
};

/// The variable naming the Galera provider library: set, the Galera tests run.
pub const GALERA_VAR: &str = "COUNTER_TEST_GALERA_PROVIDER";

/// The database every node's URL names, created before the joiners copy
/// the bootstrap node's data.
const DATABASE: &str = "counters";

/// The provider library from [`GALERA_VAR`], or `None` (with the reason
/// printed) when the Galera tests should not run here.
pub fn provider(test: &str) -> Option<PathBuf> {
    let Some(path) = crate::configured(GALERA_VAR) else {
        eprintln!("skipped {test}: {GALERA_VAR} is not set (it needs MariaDB Galera)");
        return None;
    };
    let path = PathBuf::from(path);
    assert!(
        path.is_file(),
        "{GALERA_VAR} is set to {path:?}, which is not a file: install galera-4 or fix the path"
    );
    Some(path)
}

/// Three nodes of one cluster (see the module).
pub struct GaleraCluster {
    bin: MariaDbBin,
    provider: PathBuf,
    dir: PathBuf,
    as_root: bool,
    nodes: Vec<Node>,
}

struct Node {
    port: u16,
    group_port: u16,
    ist_port: u16,
    sst_port: u16,
    process: Mutex<Option<Child>>,
}

impl GaleraCluster {
    /// Installs node 0, bootstraps the cluster on it, creates the database,
    /// and joins nodes 1 and 2. Panics with the reason (and the logs) if
    /// the cluster is not synced on three nodes within 120 s.
    pub fn start(provider: PathBuf) -> Self {
        let cluster = Self {
            bin: mariadb_bin(),
            provider,
            dir: scratch_dir("counter-galera"),
            as_root: running_as_root(),
            nodes: (0..3)
                .map(|_| Node {
                    port: free_port(),
                    group_port: free_port(),
                    ist_port: free_port(),
                    sst_port: free_port(),
                    process: Mutex::new(None),
                })
                .collect(),
        };
        for i in 0..3 {
            std::fs::create_dir_all(cluster.data(i)).expect("a node's data directory");
        }
        let mut install = Command::new(&cluster.bin.install_db);
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", cluster.data(0).display()))
            .args([
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
            ])
            .current_dir(&cluster.dir);
        // State transfer runs rsync as the server's user, which must own
        // every data directory: `mysql`, never root.
        cluster.give_to_mysql();
        if cluster.as_root {
            install.arg("--user=mysql");
        }
        run(
            &mut install,
            GALERA_VAR,
            "install the Galera bootstrap node",
        );
        cluster.give_to_mysql();
        cluster.spawn(0, true);
        cluster.wait_synced(0, 1);
        cluster.sql(0, &format!("CREATE DATABASE IF NOT EXISTS {DATABASE}"));
        // One joiner at a time, as Galera's own instructions say: the donor
        // serves one state transfer at a time, and two joiners at once once
        // left one of them outside the cluster for two minutes on a loaded
        // machine (a red CI).
        for i in 1..3 {
            cluster.spawn(i, false);
            cluster.wait_synced(i, i + 1);
        }
        for i in 0..3 {
            cluster.wait_synced(i, 3);
        }
        cluster
    }

    /// The URL of node `i`'s database, as root without a password.
    pub fn url(&self, i: usize) -> String {
        format!("mysql://root@127.0.0.1:{}/{DATABASE}", self.nodes[i].port)
    }

    /// Every node's URL.
    pub fn urls(&self) -> Vec<String> {
        (0..self.nodes.len()).map(|i| self.url(i)).collect()
    }

    /// Kills node `i` (SIGKILL) and waits until it is gone and the other
    /// two see a cluster of two.
    pub fn kill(&self, i: usize) {
        let mut process = self.process(i);
        if let Some(mut child) = process.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        drop(process);
        for other in (0..self.nodes.len()).filter(|&o| o != i) {
            self.wait_synced(other, self.nodes.len() - 1);
        }
    }

    /// Starts node `i` again on its data (it rejoins by incremental state
    /// transfer) and waits until the cluster is whole and synced.
    pub fn restart(&self, i: usize) {
        self.spawn(i, false);
        for node in 0..self.nodes.len() {
            self.wait_synced(node, self.nodes.len());
        }
    }

    /// A status variable of node `i` (`SHOW GLOBAL STATUS`), as text.
    pub fn status(&self, i: usize, name: &str) -> String {
        let out = self.sql(i, &format!("SHOW GLOBAL STATUS LIKE '{name}'"));
        out.split_whitespace().nth(1).unwrap_or_default().to_owned()
    }

    /// As root, hands the cluster's directory to the `mysql` user the
    /// nodes run as.
    fn give_to_mysql(&self) {
        if self.as_root {
            run(
                Command::new("chown")
                    .arg("-R")
                    .arg("mysql:mysql")
                    .arg(&self.dir),
                GALERA_VAR,
                "give the cluster's directory to the mysql user",
            );
        }
    }

    fn data(&self, i: usize) -> PathBuf {
        self.dir.join(format!("n{i}"))
    }

    fn log(&self, i: usize) -> PathBuf {
        self.dir.join(format!("n{i}.err"))
    }

    fn process(&self, i: usize) -> std::sync::MutexGuard<'_, Option<Child>> {
        self.nodes[i]
            .process
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn spawn(&self, i: usize, bootstrap: bool) {
        let mut process = self.process(i);
        assert!(process.is_none(), "Galera node {i} already runs");
        let node = &self.nodes[i];
        let members: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.group_port))
            .collect();
        let mut server = Command::new(&self.bin.server);
        server
            .arg("--no-defaults")
            .arg(format!("--datadir={}", self.data(i).display()))
            .arg(format!(
                "--socket={}",
                self.dir.join(format!("n{i}.sock")).display()
            ))
            .arg(format!(
                "--pid-file={}",
                self.dir.join(format!("n{i}.pid")).display()
            ))
            .arg(format!("--log-error={}", self.log(i).display()))
            .arg(format!("--port={}", node.port))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--binlog-format=ROW",
                "--default-storage-engine=InnoDB",
                "--innodb-autoinc-lock-mode=2",
                "--innodb-buffer-pool-size=64M",
                "--performance-schema=OFF",
                "--max-connections=300",
                "--wsrep-on=ON",
                "--wsrep-cluster-name=counters",
                "--wsrep-node-address=127.0.0.1",
                "--wsrep-sst-method=rsync",
            ])
            .arg(format!("--wsrep-provider={}", self.provider.display()))
            .arg(format!(
                "--wsrep-cluster-address=gcomm://{}",
                members.join(",")
            ))
            .arg(format!("--wsrep-node-name=n{i}"))
            .arg(format!(
                "--wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:{};\
                 ist.recv_addr=127.0.0.1:{};gcache.size=64M",
                node.group_port, node.ist_port
            ))
            .arg(format!(
                "--wsrep-sst-receive-address=127.0.0.1:{}",
                node.sst_port
            ))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if bootstrap {
            server.arg("--wsrep-new-cluster");
        }
        if self.as_root {
            server.arg("--user=mysql");
        }
        let child = server.spawn().unwrap_or_else(|e| {
            panic!(
                "{GALERA_VAR} is set, but could not run {:?}: {e}",
                self.bin.server
            )
        });
        // Kept at once: drop kills it whatever happens next.
        *process = Some(child);
    }

    /// Waits until node `i` is synced in a cluster of `size`.
    fn wait_synced(&self, i: usize, size: usize) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(child) = self.process(i).as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "Galera node {i} exited ({status}):\n{}",
                    log_tail(&self.log(i))
                );
            }
            let out = self.try_sql(
                i,
                "SHOW GLOBAL STATUS WHERE Variable_name IN \
                 ('wsrep_ready', 'wsrep_cluster_size', 'wsrep_local_state_comment')",
            );
            if let Some(out) = out {
                let ready = out.contains("wsrep_ready\tON");
                let sized = out.contains(&format!("wsrep_cluster_size\t{size}\n"));
                let synced = out.contains("wsrep_local_state_comment\tSynced");
                if ready && sized && synced {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "Galera node {i} was not synced in a cluster of {size} within 120 s:\n{}",
                (0..self.nodes.len())
                    .map(|n| format!("node {n}:\n{}", log_tail(&self.log(n))))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn sql(&self, i: usize, sql: &str) -> String {
        self.try_sql(i, sql).unwrap_or_else(|| {
            panic!(
                "Galera node {i} refused `{sql}`:\n{}",
                log_tail(&self.log(i))
            )
        })
    }

    /// `sql` through the `mariadb` client on node `i`: its output, or
    /// `None` if it failed.
    fn try_sql(&self, i: usize, sql: &str) -> Option<String> {
        let out = Command::new(&self.bin.client)
            .arg("--no-defaults")
            .args([
                "--protocol=TCP",
                "-h",
                "127.0.0.1",
                "-u",
                "root",
                "-N",
                "-B",
            ])
            .arg(format!("--port={}", self.nodes[i].port))
            .args(["--connect-timeout=2", "-e", sql])
            .stdin(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The cluster's directory (data and logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for GaleraCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for i in 0..self.nodes.len() {
                eprintln!(
                    "--- Galera node {i} log ({:?}), last lines ---\n{}",
                    self.log(i),
                    log_tail(&self.log(i))
                );
            }
        }
        for i in 0..self.nodes.len() {
            if let Some(mut child) = self.process(i).take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        remove(&self.dir);
    }
}
