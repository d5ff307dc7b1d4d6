//! `deploy/ha/`, the reference topology (etcd, three PostgreSQL nodes under
//! Patroni, HAProxy, PgBouncer in transaction pooling, the service's
//! instances behind HAProxy), started for a test and always stopped, and
//! the moves a test makes on it: kill the leader, switch over, restart an
//! instance.
//!
//! Runs where `COUNTER_TEST_HA` is set (`.ci/run` sets it once it has
//! installed Debian's `patroni`, `etcd-server`, `haproxy` and `pgbouncer`);
//! elsewhere a test that needs it says so and returns.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

/// Set to run the tests on `deploy/ha/`.
pub const HA_VAR: &str = "COUNTER_TEST_HA";

/// A running `deploy/ha/up`; `deploy/ha/down` on drop.
pub struct Topology {
    dir: PathBuf,
    ports: HashMap<String, String>,
}

impl Topology {
    /// Starts the topology on the ports from `port_base` (each test its
    /// own hundred, apart from a developer's `deploy/ha/up` at 17000), with
    /// `services` instances and Patroni's `synchronous_mode` `sync`; or
    /// `None` (with a line saying why) where `COUNTER_TEST_HA` is unset.
    pub fn up(test: &str, port_base: u16, services: u8, sync: bool) -> Option<Topology> {
        Self::up_with(test, port_base, services, sync, &[])
    }

    /// [`Topology::up`] with more of `deploy/ha/up`'s settings (`HA_REDIS`,
    /// `HA_REPLICA_MAX_LAG_MS`).
    pub fn up_with(
        test: &str,
        port_base: u16,
        services: u8,
        sync: bool,
        settings: &[(&str, &str)],
    ) -> Option<Topology> {
        if std::env::var_os(HA_VAR).is_none() {
            eprintln!(
                "{test}: skipped, {HA_VAR} is not set (deploy/ha/ needs Patroni, etcd, HAProxy, PgBouncer)"
            );
            return None;
        }
        stop_abandoned(test);
        let dir = std::env::temp_dir().join(format!("counter-ha-{test}-{}", std::process::id()));
        let mut topology = Topology {
            dir: dir.clone(),
            ports: HashMap::new(),
        };
        let started = Instant::now();
        let output = Command::new(script("up"))
            .env("HA_DIR", &dir)
            .env("HA_PORT_BASE", port_base.to_string())
            .env("HA_SERVICES", services.to_string())
            .env("HA_SYNC", if sync { "on" } else { "off" })
            .env("COUNTER_SERVICE_BIN", env!("CARGO_BIN_EXE_counter-service"))
            .env("RUST_LOG", "info")
            .envs(settings.iter().copied())
            .output()
            .expect("run deploy/ha/up");
        assert!(
            output.status.success(),
            "deploy/ha/up failed:\n{}\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            topology.logs()
        );
        eprintln!(
            "{test}: deploy/ha/up in {:.1} s\n{}",
            started.elapsed().as_secs_f64(),
            String::from_utf8_lossy(&output.stdout)
        );
        let env = std::fs::read_to_string(dir.join("ports.env")).expect("deploy/ha/up's ports.env");
        topology.ports = env
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
            .collect();
        Some(topology)
    }

    fn port(&self, name: &str) -> &str {
        self.ports
            .get(name)
            .unwrap_or_else(|| panic!("{name} in ports.env"))
    }

    /// The service front (HAProxy), `http://host:port`.
    pub fn front(&self) -> String {
        format!("http://{}", self.port("HA_FRONT"))
    }

    /// Each instance, `http://host:port`.
    pub fn instances(&self) -> Vec<String> {
        self.port("HA_SERVICE_PORTS")
            .split_whitespace()
            .map(|port| format!("http://127.0.0.1:{port}"))
            .collect()
    }

    /// PgBouncer's URL for the service's database, as a library user in
    /// transaction pooling connects.
    pub fn pooler_url(&self) -> String {
        format!(
            "postgres://postgres@{}/counter?statement-cache-capacity=0",
            self.port("HA_POOLER")
        )
    }

    /// HAProxy's URL to whichever node leads, directly (no pooler).
    pub fn primary_url(&self) -> String {
        format!("postgres://postgres@{}/counter", self.port("HA_PRIMARY"))
    }

    /// Each PostgreSQL node's own URL (no pooler, no HAProxy), by member
    /// name (`pg0`..).
    pub fn node_urls(&self) -> Vec<(String, String)> {
        self.port("HA_PG_NODES")
            .split_whitespace()
            .enumerate()
            .map(|(i, addr)| {
                (
                    format!("pg{i}"),
                    format!("postgres://postgres@{addr}/counter"),
                )
            })
            .collect()
    }

    /// The service's `replica_max_lag_ms`.
    pub fn replica_max_lag(&self) -> Duration {
        Duration::from_millis(
            self.port("HA_REPLICA_MAX_LAG_MS")
                .parse()
                .expect("milliseconds"),
        )
    }

    /// The members as Patroni lists them: name and role ("Leader", "Sync
    /// Standby", "Replica"), each with its state.
    pub fn members(&self) -> Vec<(String, String, String)> {
        let output = Command::new("patronictl")
            .arg("-c")
            .arg(self.dir.join("pg0.yml"))
            .args(["list", "-f", "json"])
            .output()
            .expect("patronictl list");
        let list: serde_json::Value =
            serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null);
        list.as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                let text = |k: &str| m[k].as_str().unwrap_or_default().to_owned();
                (text("Member"), text("Role"), text("State"))
            })
            .collect()
    }

    /// The leader's name, once one runs.
    pub fn leader(&self) -> Option<String> {
        self.members()
            .into_iter()
            .find(|(_, role, state)| role == "Leader" && state == "running")
            .map(|(name, _, _)| name)
    }

    /// Waits up to `within` for a running leader, a synchronous standby
    /// (where `sync`) and every member streaming: the topology healed.
    pub fn await_healthy(&self, sync: bool, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let members = self.members();
            let running = |role: &str| {
                members
                    .iter()
                    .filter(|(_, r, s)| r == role && (s == "running" || s == "streaming"))
                    .count()
            };
            let healthy = members.len() == 3
                && running("Leader") == 1
                && members
                    .iter()
                    .all(|(_, _, s)| s == "running" || s == "streaming")
                && (!sync || running("Sync Standby") == 1);
            if healthy {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not heal within {within:?}: {members:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// SIGKILLs the PostgreSQL postmaster of `member` (an unplanned failure:
    /// its Patroni sees it die).
    pub fn kill_postgres(&self, member: &str) {
        let pid_file = self.dir.join(member).join("data/postmaster.pid");
        let pid = std::fs::read_to_string(&pid_file)
            .unwrap_or_else(|e| panic!("{}: {e}", pid_file.display()));
        let pid = pid.lines().next().unwrap().trim();
        let status = Command::new("kill").args(["-KILL", pid]).status().unwrap();
        assert!(status.success(), "kill -KILL {pid} ({member}'s postmaster)");
    }

    /// A planned `patronictl switchover` from the leader to the synchronous
    /// standby (the only candidate `synchronous_mode` allows) or, without
    /// one, a replica.
    pub fn switchover(&self) -> (String, String) {
        let members = self.members();
        let leader = self.leader().expect("a leader to switch over from");
        let candidate = members
            .iter()
            .find(|(_, role, _)| role == "Sync Standby")
            .or_else(|| members.iter().find(|(_, role, _)| role == "Replica"))
            .map(|(name, _, _)| name.clone())
            .expect("a standby to switch over to");
        let output = Command::new("patronictl")
            .arg("-c")
            .arg(self.dir.join("pg0.yml"))
            .args([
                "switchover",
                "--leader",
                &leader,
                "--candidate",
                &candidate,
                "--force",
            ])
            .output()
            .expect("patronictl switchover");
        assert!(
            output.status.success(),
            "patronictl switchover {leader} -> {candidate}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (leader, candidate)
    }

    /// The Redis master's port as the first Sentinel that answers names it.
    pub fn redis_master(&self) -> Option<String> {
        self.port("HA_SENTINELS")
            .split_whitespace()
            .find_map(|sentinel| {
                let port = sentinel.rsplit(':').next()?;
                let output = Command::new("redis-cli")
                    .args([
                        "-p",
                        port,
                        "SENTINEL",
                        "get-master-addr-by-name",
                        "counter-ha",
                    ])
                    .output()
                    .ok()?;
                let text = String::from_utf8_lossy(&output.stdout).into_owned();
                text.lines().nth(1).map(|p| p.trim().to_owned())
            })
    }

    /// SIGKILLs the Redis master (its replicas and the Sentinels live on);
    /// returns its port.
    pub fn kill_redis_master(&self) -> String {
        let master = self.redis_master().expect("a Redis master");
        let index = self
            .port("HA_REDIS_SERVERS")
            .split_whitespace()
            .position(|server| server.ends_with(&format!(":{master}")))
            .expect("the master is one of deploy/ha/'s Redis servers");
        let file = self.dir.join("pids").join(format!("redis{index}"));
        let pid = std::fs::read_to_string(&file).expect("the Redis master's pid");
        let status = Command::new("kill")
            .args(["-KILL", pid.trim()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -KILL the Redis master");
        master
    }

    /// `deploy/ha/roll`: `migrate`, then each instance restarted in turn;
    /// returns what it printed.
    pub fn roll(&self) -> String {
        let output = Command::new(script("roll"))
            .env("HA_DIR", &self.dir)
            .env("COUNTER_SERVICE_BIN", env!("CARGO_BIN_EXE_counter-service"))
            .env("RUST_LOG", "info")
            .output()
            .expect("run deploy/ha/roll");
        let printed = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "deploy/ha/roll failed:\n{printed}\n{}\n{}",
            String::from_utf8_lossy(&output.stderr),
            self.logs()
        );
        printed
    }

    /// The service's configuration file.
    pub fn service_config(&self) -> PathBuf {
        self.dir.join("counter-service.toml")
    }

    /// Everything process `name` (`service0`, `patroni1`...) logged.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join("log").join(name)).unwrap_or_default()
    }

    /// The tail of every log, for a failure's message.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        let Ok(entries) = std::fs::read_dir(self.dir.join("log")) else {
            return text;
        };
        for entry in entries.flatten() {
            let body = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let tail: Vec<&str> = body.lines().rev().take(15).collect();
            text.push_str(&format!("--- {}\n", entry.path().display()));
            for line in tail.into_iter().rev() {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        let output = Command::new(script("down"))
            .env("HA_DIR", &self.dir)
            .output();
        if let Ok(output) = output
            && !output.status.success()
        {
            eprintln!(
                "deploy/ha/down: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}

/// Stops a topology of `test` left by a run that was killed before its
/// `Drop` (its directory names a process that is gone): it holds the ports.
fn stop_abandoned(test: &str) {
    let prefix = format!("counter-ha-{test}-");
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(&prefix) else {
            continue;
        };
        if Path::new("/proc").join(pid).exists() {
            continue;
        }
        let _ = Command::new(script("down"))
            .env("HA_DIR", entry.path())
            .output();
    }
}

/// `deploy/ha/<name>` in this checkout.
fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/ha")
        .join(name)
}
