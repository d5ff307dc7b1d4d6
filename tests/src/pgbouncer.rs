//! A private PgBouncer in transaction pooling mode, in front of a
//! PostgreSQL server, on a free loopback port; killed and deleted on drop.
//!
//! Configured as `counter_core::pooling` asks of PgBouncer 1.18: each
//! transaction may land on any server connection, and what a transaction
//! prepared is dropped when it ends (`server_reset_query = DEALLOCATE ALL`,
//! `server_reset_query_always = 1`). `pool_size` server connections per
//! database serve every client, so clients share them.
//!
//! `COUNTER_TEST_PGBOUNCER` may name the binary; else `/usr/sbin/pgbouncer`
//! or `pgbouncer` on `PATH`. As root it runs as the `postgres` OS user
//! (PgBouncer refuses root).

use std::{
    net::TcpStream,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::servers::{free_port, running_as_root};

/// A running PgBouncer.
pub struct PgBouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl PgBouncer {
    /// Starts one in front of `upstream` (`host:port`), `pool_size` server
    /// connections per database, and waits until it takes connections.
    pub fn start(upstream: &str, pool_size: u32) -> Self {
        let (host, upstream_port) = upstream.rsplit_once(':').expect("upstream is host:port");
        let dir = std::env::temp_dir().join(format!(
            "counter-pgbouncer-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("the PgBouncer directory");
        let port = free_port();
        let ini = format!(
            "[databases]\n* = host={host} port={upstream_port}\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {users}\npool_mode = transaction\n\
             default_pool_size = {pool_size}\nmax_client_conn = 500\nmax_user_connections = 40\n\
             server_reset_query = DEALLOCATE ALL\nserver_reset_query_always = 1\n\
             server_idle_timeout = 5\nignore_startup_parameters = extra_float_digits\n\
             logfile = {log}\n",
            users = dir.join("users.txt").display(),
            log = dir.join("log").display(),
        );
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").expect("users.txt");
        std::fs::write(dir.join("pgbouncer.ini"), ini).expect("pgbouncer.ini");
        let bin = std::env::var("COUNTER_TEST_PGBOUNCER")
            .ok()
            .filter(|b| !b.trim().is_empty())
            .unwrap_or_else(|| {
                if std::path::Path::new("/usr/sbin/pgbouncer").exists() {
                    "/usr/sbin/pgbouncer".into()
                } else {
                    "pgbouncer".into()
                }
            });
        let root = running_as_root();
        let mut command = if root {
            let status = Command::new("chown")
                .args(["-R", "postgres:"])
                .arg(&dir)
                .status()
                .expect("chown");
            assert!(
                status.success(),
                "chown the PgBouncer directory to postgres"
            );
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&bin);
            c
        } else {
            Command::new(&bin)
        };
        let child = command
            .arg(dir.join("pgbouncer.ini"))
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {bin} (install Debian's pgbouncer): {e}"));
        let bouncer = Self { child, dir, port };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "PgBouncer did not listen: {}",
                bouncer.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        bouncer
    }

    /// A URL for `database` through this PgBouncer, with the statement cache
    /// off, as `counter_core::pooling` asks.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{database}?statement-cache-capacity=0",
            self.port
        )
    }

    /// The same URL with sqlx's default statement cache: a client that was
    /// not told about the pooler.
    pub fn url_cached(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("PgBouncer's log:\n{}", self.log_tail());
        }
        // runuser passes the signal on to PgBouncer.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("pkill")
            .args(["-f", &self.dir.join("pgbouncer.ini").display().to_string()])
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
