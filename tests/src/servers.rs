//! Private database servers a test can crash and restart: a PostgreSQL
//! cluster ([`PrivatePostgres`], `initdb` + `pg_ctl`) or a MariaDB server
//! ([`PrivateMariaDb`], `mariadb-install-db` + `mariadbd`), each in a
//! temporary directory of its own, on a free port of `127.0.0.1`, so a test
//! can stop and start it without touching the shared servers. Both are
//! stopped hard and deleted on drop, whether the test passed or not (a
//! failing test prints the server's log tail first).
//!
//! They run where the matching URL variable is set ([`wanted`]): the sign
//! of a machine with that server installed (the URL itself is not used),
//! and a server that cannot be set up there fails the test.
//!
//! * PostgreSQL: `COUNTER_TEST_PG_BIN` may name the directory holding
//!   `initdb` and `pg_ctl`; otherwise the newest
//!   `/usr/lib/postgresql/<version>/bin` is used. As root, the tools run as
//!   the `postgres` OS user (they refuse root).
//! * MariaDB: `mariadb-install-db`, `mariadbd` and the `mariadb` client
//!   from `COUNTER_TEST_MARIADB_BIN` if set, else from `PATH`, `/usr/sbin`
//!   or `/usr/bin`. As root, `mariadbd` is told `--user=root`. `root` has no
//!   password and is reachable over TCP from `127.0.0.1`.
//!
//! The calls block (they run processes): call them from
//! `tokio::task::spawn_blocking`, or through [`stop`] and [`start`].

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use rand::Rng;
use sea_orm::{ConnectOptions, Database, DatabaseConnection};

use crate::{MYSQL_URL_VAR, POSTGRES_URL_VAR};

/// How a server is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// A crash: PostgreSQL `pg_ctl stop -m immediate` (every backend killed
    /// at once, recovery at the next start), MariaDB `kill -9`.
    /// Transactions in flight are cut; a `COMMIT` may be applied with its
    /// reply lost.
    Crash,
    /// A clean shutdown: PostgreSQL `-m fast`, MariaDB `SIGTERM`.
    /// Transactions in flight are rolled back, clients disconnected.
    Graceful,
    /// `SIGKILL` to the server and every process of it at once, as the
    /// kernel's OOM killer or a lost machine would: nothing is told, no
    /// shutdown checkpoint, recovery at the next start. (MariaDB: as
    /// [`Stop::Crash`], which already is `kill -9`.)
    Kill,
}

/// A private server that can be stopped and started again on the same
/// data directory and port.
pub trait PrivateServer: Send + Sync + 'static {
    /// A URL for a database (MariaDB) or the `postgres` database
    /// (PostgreSQL) of the server, as `root`/`postgres`, without password.
    fn url(&self) -> String;
    /// The port it listens on.
    fn port(&self) -> u16;
    /// Stops the server and waits until it is gone. Blocks.
    fn stop_server(&self, how: Stop);
    /// Starts it again (same data, same port) and waits until it takes
    /// connections. Blocks.
    fn start_server(&self);
    /// The server's own log (errors, and replication's).
    fn log_file(&self) -> PathBuf;
}

/// Whether the private-server tests for the backend of `var`
/// ([`POSTGRES_URL_VAR`] or [`MYSQL_URL_VAR`]) should run: the variable is
/// set and not blank. Prints the reason when they should not.
pub fn wanted(var: &str, test: &str) -> bool {
    let set = super::configured(var).is_some();
    if !set {
        eprintln!("skipped {test}: {var} is not set (it needs a private server of that backend)");
    }
    set
}

/// [`PrivateServer::stop_server`] on a blocking thread.
pub async fn stop<S: PrivateServer + ?Sized>(server: &Arc<S>, how: Stop) {
    let server = server.clone();
    tokio::task::spawn_blocking(move || server.stop_server(how))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
}

/// [`PrivateServer::start_server`] on a blocking thread.
pub async fn start<S: PrivateServer + ?Sized>(server: &Arc<S>) {
    let server = server.clone();
    tokio::task::spawn_blocking(move || server.start_server())
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
}

/// Sets up a new server with `setup` on a blocking thread.
pub async fn launch<S: PrivateServer>(setup: impl FnOnce() -> S + Send + 'static) -> Arc<S> {
    Arc::new(
        tokio::task::spawn_blocking(setup)
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())),
    )
}

/// A pool of up to `max` connections to `url` (a private server's), that
/// gives up on a down server after `wait`: a call that needs a connection
/// waits at most that long for one (sqlx retries a refused connection
/// meanwhile), then fails with a connection error.
pub async fn pool(url: &str, max: u32, wait: Duration) -> DatabaseConnection {
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(max)
        .min_connections(0)
        .acquire_timeout(wait)
        .connect_timeout(wait)
        .sqlx_logging(false);
    Database::connect(options)
        .await
        .unwrap_or_else(|e| panic!("connect to the private server at {url}: {e}"))
}

/// A private PostgreSQL cluster in a temporary directory; stopped (`-m
/// immediate`) and deleted on drop.
pub struct PrivatePostgres {
    bin: PathBuf,
    /// Owned by the server's OS user: holds `data/`, the socket and `log`.
    dir: PathBuf,
    port: u16,
    /// Whether commands run as the `postgres` OS user (we are root).
    as_postgres: bool,
    /// Server settings beyond the defaults, as `-c name=value`.
    settings: Vec<String>,
}

impl PrivatePostgres {
    /// initdb + start. Panics with the reason if anything fails.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A cluster that can publish by logical replication (the regions'
    /// tests), whose subscriptions reconnect to a publisher back from a
    /// restart within 200 ms (5 s by default).
    pub fn start_logical() -> Self {
        Self::start_with(&[
            ("wal_level", "logical"),
            ("wal_retrieve_retry_interval", "200ms"),
        ])
    }

    /// [`PrivatePostgres::start`] with server settings of its own, such as
    /// `("wal_level", "logical")`, kept for every restart.
    pub fn start_with(settings: &[(&str, &str)]) -> Self {
        let bin = pg_bin();
        let as_postgres = running_as_root();
        let dir = scratch_dir("counter-pg");
        let port = free_port();
        // From here on, the guard cleans up whatever exists.
        let pg = Self {
            bin,
            dir,
            port,
            as_postgres,
            settings: settings
                .iter()
                .map(|(name, value)| format!(" -c {name}={value}"))
                .collect(),
        };
        if as_postgres {
            // initdb and postgres refuse to run as root.
            run(
                Command::new("chown").arg("postgres:").arg(&pg.dir),
                POSTGRES_URL_VAR,
                "chown the private server's directory to the postgres user",
            );
        }
        run(
            pg.pg_command("initdb")
                .arg("-D")
                .arg(pg.data())
                .args(["-A", "trust", "-U", "postgres", "--no-sync"])
                .args(["-E", "UTF8", "--no-locale"]),
            POSTGRES_URL_VAR,
            "initdb the private PostgreSQL server",
        );
        pg.start_server();
        pg
    }

    /// The temporary directory (data, socket, log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("log")
    }

    /// A command running `tool` from the PostgreSQL bin directory, as the
    /// `postgres` user when we are root.
    fn pg_command(&self, tool: &str) -> Command {
        let tool = self.bin.join(tool);
        let mut command = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(tool);
            c
        } else {
            Command::new(tool)
        };
        // The test's own working directory may be closed to that user.
        command.current_dir(&self.dir);
        command
    }
}

impl PrivateServer for PrivatePostgres {
    fn log_file(&self) -> PathBuf {
        self.log()
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn port(&self) -> u16 {
        self.port
    }

    fn start_server(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off \
             -c shared_buffers=16MB -c max_connections=60{}",
            self.port,
            self.dir.display(),
            self.settings.concat()
        );
        let started = self
            .pg_command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.log())
            .args(["-w", "-t", "60", "-o", &options, "start"])
            .output();
        check(
            started,
            POSTGRES_URL_VAR,
            "start the private PostgreSQL server",
            &self.log(),
        );
    }

    fn stop_server(&self, how: Stop) {
        let mode = match how {
            Stop::Crash => "immediate",
            Stop::Graceful => "fast",
            Stop::Kill => return self.kill_all(),
        };
        let stopped = self
            .pg_command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-w", "-t", "60", "-m", mode, "stop"])
            .output();
        check(
            stopped,
            POSTGRES_URL_VAR,
            "stop the private PostgreSQL server",
            &self.log(),
        );
    }
}

impl PrivatePostgres {
    /// `SIGKILL` to the postmaster and every child of it, then waits until
    /// all are gone (their shared memory detached, so the next start
    /// recovers instead of refusing).
    fn kill_all(&self) {
        let pid_file = self.data().join("postmaster.pid");
        let postmaster = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|text| text.lines().next()?.trim().parse::<u32>().ok())
            .expect("the private PostgreSQL server is running (postmaster.pid)");
        let mut pids = vec![postmaster];
        pids.extend(children_of(postmaster));
        let list: Vec<String> = pids.iter().map(u32::to_string).collect();
        let _ = Command::new("kill")
            .arg("-KILL")
            .args(&list)
            .stdin(Stdio::null())
            .output();
        let deadline = Instant::now() + Duration::from_secs(30);
        while pids
            .iter()
            .any(|pid| Path::new(&format!("/proc/{pid}")).exists())
        {
            assert!(
                Instant::now() < deadline,
                "the private PostgreSQL server's processes {list:?} outlived SIGKILL for 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The processes whose parent is `pid` (from `/proc/<pid>/stat`).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let child: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid ...`: comm may hold spaces, so after the last ')'.
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == pid).then_some(child)
        })
        .collect()
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- private PostgreSQL log ({:?}), last lines ---\n{}",
                self.log(),
                log_tail(&self.log())
            );
        }
        let pid_file = self.data().join("postmaster.pid");
        if pid_file.exists() {
            let stopped = self
                .pg_command("pg_ctl")
                .arg("-D")
                .arg(self.data())
                .args(["-w", "-t", "30", "-m", "immediate", "stop"])
                .output()
                .is_ok_and(|out| out.status.success());
            // pg_ctl failed: kill the postmaster itself (its children exit
            // with it) rather than delete the directory under it, if the
            // pid is still that of a process running on this directory.
            let pid = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|text| text.lines().next()?.trim().parse::<u32>().ok());
            let ours = |pid: u32| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                    String::from_utf8_lossy(&cmdline).contains(&*self.data().to_string_lossy())
                })
            };
            if let (false, Some(pid)) = (stopped, pid.filter(|pid| ours(*pid))) {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .stdin(Stdio::null())
                    .output();
                std::thread::sleep(Duration::from_millis(500));
            }
        }
        remove(&self.dir);
    }
}

/// A private MariaDB server in a temporary directory, a child process of
/// the test; killed and deleted on drop.
pub struct PrivateMariaDb {
    bin: MariaDbBin,
    dir: PathBuf,
    port: u16,
    as_root: bool,
    /// Server options beyond the defaults, kept for every restart.
    options: Vec<String>,
    server: Mutex<Option<Child>>,
}

/// The database [`PrivateMariaDb::url`] names, created at the first start.
const MARIADB_DATABASE: &str = "counters";

pub(crate) struct MariaDbBin {
    pub(crate) install_db: PathBuf,
    pub(crate) server: PathBuf,
    pub(crate) client: PathBuf,
}

impl PrivateMariaDb {
    /// `mariadb-install-db` + start + `CREATE DATABASE counters`. Panics
    /// with the reason if anything fails.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// [`PrivateMariaDb::start`] with server options of its own, such as
    /// `--server-id=1`, kept for every restart. The binary log is off
    /// unless they name `--log-bin`.
    pub fn start_with(options: &[&str]) -> Self {
        let bin = mariadb_bin();
        let db = Self {
            bin,
            dir: scratch_dir("counter-mariadb"),
            port: free_port(),
            as_root: running_as_root(),
            options: options.iter().map(|o| (*o).to_owned()).collect(),
            server: Mutex::new(None),
        };
        // Temporary tables in a directory of its own, not the machine's
        // `/tmp`: the bootstraps and servers of tests run at once then share
        // nothing (CI once saw a bootstrap lose its temporary table there).
        std::fs::create_dir_all(db.tmp()).unwrap_or_else(|e| panic!("create {:?}: {e}", db.tmp()));
        let mut install = Command::new(&db.bin.install_db);
        // `--no-defaults` must come first.
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", db.data().display()))
            .arg(format!("--tmpdir={}", db.tmp().display()))
            .args([
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
            ])
            .current_dir(&db.dir);
        if db.as_root {
            install.arg("--user=root");
        }
        run(
            &mut install,
            MYSQL_URL_VAR,
            "install the private MariaDB server",
        );
        db.start_server();
        db
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("error.log")
    }

    fn tmp(&self) -> PathBuf {
        self.dir.join("tmp")
    }

    /// The server's process, if it runs.
    fn child(&self) -> std::sync::MutexGuard<'_, Option<Child>> {
        self.server.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `sql` with the `mariadb` client as root over TCP.
    fn client(&self, sql: &str) -> std::io::Result<std::process::Output> {
        Command::new(&self.bin.client)
            .arg("--no-defaults")
            .args(["--protocol=TCP", "-h", "127.0.0.1", "-u", "root"])
            .arg(format!("--port={}", self.port))
            .args(["--connect-timeout=2", "-e", sql])
            .stdin(Stdio::null())
            .output()
    }
}

impl PrivateServer for PrivateMariaDb {
    fn log_file(&self) -> PathBuf {
        self.log()
    }

    fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/{MARIADB_DATABASE}", self.port)
    }

    fn port(&self) -> u16 {
        self.port
    }

    fn start_server(&self) {
        let mut child = self.child();
        assert!(child.is_none(), "the private MariaDB server already runs");
        let mut server = Command::new(&self.bin.server);
        server
            .arg("--no-defaults")
            .arg(format!("--datadir={}", self.data().display()))
            .arg(format!("--tmpdir={}", self.tmp().display()))
            .arg(format!("--socket={}", self.dir.join("sock").display()))
            .arg(format!("--pid-file={}", self.dir.join("pid").display()))
            .arg(format!("--log-error={}", self.log().display()))
            .arg(format!("--port={}", self.port))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--max-connections=60",
                "--innodb-buffer-pool-size=32M",
                "--performance-schema=OFF",
            ])
            .args(&self.options)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if !self.options.iter().any(|o| o.starts_with("--log-bin")) {
            server.arg("--skip-log-bin");
        }
        if self.as_root {
            // mariadbd refuses root unless told so.
            server.arg("--user=root");
        }
        let process = server.spawn().unwrap_or_else(|e| {
            panic!(
                "{MYSQL_URL_VAR} is set, but could not run {:?}: {e}",
                self.bin.server
            )
        });
        // Stored at once: if anything below panics, drop still kills it
        // before deleting its data directory.
        let process = child.insert(process);
        // Ready when the client gets in (creating the database the first
        // time); bounded, and failing at once if the server exits.
        let deadline = Instant::now() + Duration::from_secs(60);
        let create = format!("CREATE DATABASE IF NOT EXISTS {MARIADB_DATABASE}");
        loop {
            if let Ok(Some(status)) = process.try_wait() {
                panic!(
                    "{MYSQL_URL_VAR} is set, but the private MariaDB server exited at start \
                     ({status}):\n{}",
                    log_tail(&self.log())
                );
            }
            match self.client(&create) {
                Ok(out) if out.status.success() => break,
                Ok(out) if Instant::now() >= deadline => panic!(
                    "{MYSQL_URL_VAR} is set, but the private MariaDB server took no connection \
                     in 60 s: {}\n{}",
                    String::from_utf8_lossy(&out.stderr),
                    log_tail(&self.log())
                ),
                Err(e) => panic!(
                    "{MYSQL_URL_VAR} is set, but could not run {:?}: {e}",
                    self.bin.client
                ),
                Ok(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn stop_server(&self, how: Stop) {
        let mut child = self.child();
        // Left in place until it is gone: if anything below panics, drop
        // still kills it before deleting its data directory.
        let process = child
            .as_mut()
            .expect("the private MariaDB server is not running");
        match how {
            Stop::Crash | Stop::Kill => process.kill().expect("kill -9 the private MariaDB server"),
            Stop::Graceful => run(
                Command::new("kill")
                    .args(["-TERM", &process.id().to_string()])
                    .stdin(Stdio::null()),
                MYSQL_URL_VAR,
                "send SIGTERM to the private MariaDB server",
            ),
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match process.try_wait() {
                Ok(Some(_)) => {
                    *child = None;
                    return;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(None) => {
                    let _ = process.kill();
                    let _ = process.wait();
                    *child = None;
                    panic!(
                        "the private MariaDB server did not stop ({how:?}) in 60 s:\n{}",
                        log_tail(&self.log())
                    );
                }
                Err(e) => panic!("wait for the private MariaDB server: {e}"),
            }
        }
    }
}

impl Drop for PrivateMariaDb {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- private MariaDB log ({:?}), last lines ---\n{}",
                self.log(),
                log_tail(&self.log())
            );
        }
        if let Some(mut process) = self.child().take() {
            let _ = process.kill();
            let _ = process.wait();
        }
        remove(&self.dir);
    }
}

/// A new, empty directory under the system's temporary directory.
pub(crate) fn scratch_dir(prefix: &str) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("{prefix}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("create the private server's directory {dir:?}: {e}"));
    dir
}

pub(crate) fn remove(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        eprintln!("could not remove {dir:?}: {e}");
    }
}

/// The directory with `initdb` and `pg_ctl`.
fn pg_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("COUNTER_TEST_PG_BIN").filter(|b| !b.is_empty()) {
        return PathBuf::from(bin);
    }
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            (bin.join("initdb").is_file() && bin.join("pg_ctl").is_file()).then_some((version, bin))
        })
        .max_by_key(|(version, _)| *version);
    match newest {
        Some((_, bin)) => bin,
        None => panic!(
            "{POSTGRES_URL_VAR} is set, but no PostgreSQL server binaries (initdb, pg_ctl) were \
             found in /usr/lib/postgresql/<version>/bin: install the PostgreSQL server package or \
             set COUNTER_TEST_PG_BIN to their directory"
        ),
    }
}

/// `mariadb-install-db`, `mariadbd` and `mariadb`.
pub(crate) fn mariadb_bin() -> MariaDbBin {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(bin) = std::env::var_os("COUNTER_TEST_MARIADB_BIN").filter(|b| !b.is_empty()) {
        dirs.push(bin.into());
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs.extend(["/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"].map(PathBuf::from));
    let find = |tool: &str| {
        dirs.iter()
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
            .unwrap_or_else(|| {
                panic!(
                    "{MYSQL_URL_VAR} is set, but `{tool}` was not found (in \
                     COUNTER_TEST_MARIADB_BIN, PATH, /usr/sbin or /usr/bin): install the MariaDB \
                     server package or set COUNTER_TEST_MARIADB_BIN to its directory"
                )
            })
    };
    MariaDbBin {
        install_db: find("mariadb-install-db"),
        server: find("mariadbd"),
        client: find("mariadb"),
    }
}

pub(crate) fn running_as_root() -> bool {
    let id = Command::new("id")
        .arg("-u")
        .output()
        .unwrap_or_else(|e| panic!("run `id -u`: {e}"));
    String::from_utf8_lossy(&id.stdout).trim() == "0"
}

/// A TCP port of `127.0.0.1` nothing listens on right now, below the
/// kernel's ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`), so
/// no client connection (which takes its local port from that range) can
/// hold it when the server starts or restarts on it. (Where that range
/// starts below 21000, ports 20000..21000 are used all the same.) Never
/// 30000 or above: those are the cluster bus ports of the private Redis
/// Clusters (a node's port + 10000, see `redis::RedisCluster`), which a
/// server started meanwhile must not take.
pub fn free_port() -> u16 {
    const FLOOR: u16 = 20_000;
    const BUS_PORTS: u16 = 30_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let high = ephemeral_low.clamp(FLOOR + 1_000, BUS_PORTS);
    let mut rng = rand::rng();
    for _ in 0..1_000 {
        let port = rng.random_range(FLOOR..high);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port of 127.0.0.1 in {FLOOR}..{high}");
}

pub(crate) fn run(command: &mut Command, var: &str, what: &str) {
    check(command.output(), var, what, Path::new(""));
}

fn check(output: std::io::Result<std::process::Output>, var: &str, what: &str, log: &Path) {
    let output = output.unwrap_or_else(|e| panic!("{var} is set, but could not {what}: {e}"));
    assert!(
        output.status.success(),
        "{var} is set, but could not {what} ({}):\nstdout: {}\nstderr: {}\nserver log: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        log_tail(log),
    );
}

pub(crate) fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
