//! Fault injection: the PostgreSQL server behind a write-behind buffer is
//! restarted (once cutting every connection at once, once cleanly) while the
//! buffer flushes every few milliseconds and producers keep adding. Every
//! acknowledged add must end up stored exactly once.
//!
//! PostgreSQL only, by nature: the test runs a private server of its own
//! (initdb + pg_ctl, in a temporary directory, on a free port) so it can stop
//! and start it without touching the shared one. It runs when
//! `COUNTER_TEST_POSTGRES_URL` is set (the sign of a PostgreSQL-capable
//! machine; its URL is not used) and fails if the private server cannot be
//! set up. `COUNTER_TEST_PG_BIN` may name the directory holding `initdb` and
//! `pg_ctl`; otherwise the newest `/usr/lib/postgresql/<version>/bin` is used.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering::SeqCst},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use counter_core::{CounterBuffer, CounterError, Counters, FlushLedger};
use counter_tests::{POSTGRES_URL_VAR, counters, raw};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::{ConnectOptions, Database, DatabaseConnection};

const TABLE: &str = "restart_counters";
const KEYS: [&str; 3] = ["views", "likes", "shares"];
const OWNERS: i64 = 6;
const ADDERS: u64 = 16;
/// Adds run alone before the first restart, between the two and after.
const PHASE: Duration = Duration::from_secs(2);
/// The least time the server stays down at each restart.
const DOWN: Duration = Duration::from_secs(1);

/// How a restart stops the server (`pg_ctl stop -m <mode>`).
#[derive(Debug, Clone, Copy)]
enum StopMode {
    /// Every backend killed at once: transactions in flight are cut, a
    /// `COMMIT` may be applied with its reply lost.
    Immediate,
    /// Transactions rolled back, clients disconnected.
    Fast,
}

impl StopMode {
    fn as_arg(self) -> &'static str {
        match self {
            StopMode::Immediate => "immediate",
            StopMode::Fast => "fast",
        }
    }
}

/// A private PostgreSQL server in a temporary directory; stopped (`-m
/// immediate`) and deleted on drop, whether the test passed or not.
struct PrivatePostgres {
    bin: PathBuf,
    /// Owned by the server's OS user: holds `data/`, the socket and `log`.
    dir: PathBuf,
    port: u16,
    /// Whether commands run as the `postgres` OS user (we are root).
    as_postgres: bool,
}

impl PrivatePostgres {
    /// initdb + start. Panics with the reason if anything fails.
    fn start() -> Self {
        let bin = pg_bin();
        let as_postgres = running_as_root();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir =
            std::env::temp_dir().join(format!("counter-pg-restart-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("create the private server's directory {dir:?}: {e}"));
        let port = free_port();
        // From here on, the guard cleans up whatever exists.
        let pg = Self {
            bin,
            dir,
            port,
            as_postgres,
        };
        if as_postgres {
            // initdb and postgres refuse to run as root.
            run(
                Command::new("chown").arg("postgres:").arg(&pg.dir),
                "chown the private server's directory to the postgres user",
            );
        }
        let data = pg.data();
        run(
            pg.pg_command("initdb")
                .arg("-D")
                .arg(&data)
                .args(["-A", "trust", "-U", "postgres", "--no-sync"])
                .args(["-E", "UTF8", "--no-locale"]),
            "initdb the private PostgreSQL server",
        );
        pg.start_server();
        pg
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("log")
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
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

    fn start_server(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off \
             -c shared_buffers=16MB -c max_connections=60",
            self.port,
            self.dir.display()
        );
        let started = self
            .pg_command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.log())
            .args(["-w", "-t", "60", "-o", &options, "start"])
            .output();
        check(started, "start the private PostgreSQL server", &self.log());
    }

    fn stop_server(&self, mode: StopMode) {
        let stopped = self
            .pg_command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-w", "-t", "60", "-m", mode.as_arg(), "stop"])
            .output();
        check(stopped, "stop the private PostgreSQL server", &self.log());
    }
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
        if self.data().join("postmaster.pid").exists() {
            let _ = self
                .pg_command("pg_ctl")
                .arg("-D")
                .arg(self.data())
                .args(["-w", "-t", "30", "-m", "immediate", "stop"])
                .output();
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("could not remove {:?}: {e}", self.dir);
        }
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

fn running_as_root() -> bool {
    let id = Command::new("id")
        .arg("-u")
        .output()
        .unwrap_or_else(|e| panic!("run `id -u`: {e}"));
    String::from_utf8_lossy(&id.stdout).trim() == "0"
}

/// A TCP port nothing listens on right now.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("the bound port").port()
}

fn run(command: &mut Command, what: &str) {
    check(command.output(), what, Path::new(""));
}

fn check(output: std::io::Result<std::process::Output>, what: &str, log: &Path) {
    let output =
        output.unwrap_or_else(|e| panic!("{POSTGRES_URL_VAR} is set, but could not {what}: {e}"));
    assert!(
        output.status.success(),
        "{POSTGRES_URL_VAR} is set, but could not {what} ({}):\nstdout: {}\nstderr: {}\nserver log: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        log_tail(log),
    );
}

fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

async fn connect(url: &str) -> DatabaseConnection {
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(16)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2))
        .sqlx_logging(false);
    Database::connect(options)
        .await
        .expect("connect to the private PostgreSQL server")
}

/// What one adder had acknowledged: the sum per counter, and how many adds.
type Acked = (HashMap<(i64, &'static str), i64>, u64);

/// Adds to random counters through the buffer until `stop`, keeping only
/// the adds that returned `Ok`.
async fn adder(
    buffer: CounterBuffer,
    counters: Counters<i64>,
    seed: u64,
    stop: Arc<AtomicBool>,
    acked_total: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
) -> Acked {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut sums = HashMap::new();
    let mut acked = 0u64;
    let mut n = 0u64;
    while !stop.load(SeqCst) {
        let owner = rng.random_range(1..=OWNERS);
        let key = KEYS[rng.random_range(0..KEYS.len())];
        let delta = if rng.random_ratio(1, 8) { -1 } else { 1 };
        match buffer.add(&counters, owner, key, delta) {
            Ok(()) => {
                *sums.entry((owner, key)).or_insert(0) += delta;
                acked += 1;
                acked_total.fetch_add(1, SeqCst);
            }
            Err(e) => {
                refused.fetch_add(1, SeqCst);
                eprintln!("adder {seed}: buffer.add refused: {e}");
            }
        }
        n += 1;
        // Continuous, but leaving the CPU to the flusher and the server.
        if n.is_multiple_of(32) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    (sums, acked)
}

/// Stops the server, checks it is really unusable (a direct write fails
/// with a typed database error) while buffered adds go on, and starts it
/// again: down for at least [`DOWN`], and until a flush attempt has failed.
async fn restart(
    pg: &Arc<PrivatePostgres>,
    mode: StopMode,
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    buffer: &CounterBuffer,
    acked_total: &AtomicU64,
) {
    let stopping = pg.clone();
    tokio::task::spawn_blocking(move || stopping.stop_server(mode))
        .await
        .expect("stop the server");
    let down_at = Instant::now();
    let acked_before = acked_total.load(SeqCst);
    let failed_before = buffer.stats().failed_attempts;

    let direct = counters.add(db, 1, "direct", 1).await;
    eprintln!("server down ({mode:?}): direct Counters::add -> {direct:?}");
    assert!(
        matches!(direct, Err(CounterError::Database(_))),
        "a direct add with the server down ({mode:?}) must fail with CounterError::Database, got {direct:?}"
    );
    // The buffer does not wait on the database: it takes adds meanwhile.
    buffer
        .add(counters, 1, "during_outage", 1)
        .expect("buffer.add while the server is down");

    // Stay down until a flush attempt has failed on the outage (bounded,
    // so a flusher that never tries fails the test instead of hanging it).
    let deadline = Instant::now() + Duration::from_secs(30);
    while buffer.stats().failed_attempts <= failed_before {
        assert!(
            Instant::now() < deadline,
            "no flush attempt failed while the server was down ({mode:?}): {:?}",
            buffer.stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "server down ({mode:?}): flush failing: {:?}",
        buffer.stats().last_error
    );
    let rest = DOWN.saturating_sub(down_at.elapsed());
    tokio::time::sleep(rest).await;
    let acked_down = acked_total.load(SeqCst) - acked_before;
    assert!(
        acked_down > 0,
        "the adders' buffer.add calls must keep succeeding while the server is down ({mode:?})"
    );
    let starting = pg.clone();
    tokio::task::spawn_blocking(move || starting.start_server())
        .await
        .expect("start the server");
    eprintln!(
        "server back after {:.2} s down ({mode:?}); {acked_down} buffered adds acknowledged meanwhile",
        down_at.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restarted_during_a_flush_loop_loses_and_doubles_nothing() {
    if std::env::var(POSTGRES_URL_VAR).map_or(true, |u| u.trim().is_empty()) {
        eprintln!(
            "skipped postgres_restarted_during_a_flush_loop_loses_and_doubles_nothing: \
             {POSTGRES_URL_VAR} is not set (PostgreSQL-only test)"
        );
        return;
    }
    let began = Instant::now();
    let pg = Arc::new(
        tokio::task::spawn_blocking(PrivatePostgres::start)
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())),
    );
    eprintln!("private PostgreSQL on port {} in {:?}", pg.port, pg.dir);

    let db = connect(&pg.url()).await;
    let counters = counters::<i64>(TABLE, 16);
    counters.create_table(&db).await.expect("create the table");
    let ledger = FlushLedger::default();
    ledger.create_table(&db).await.expect("create the ledger");
    let buffer = CounterBuffer::builder(&db)
        .interval(Duration::from_millis(5))
        .start()
        .await
        .expect("start the buffer");

    let stop = Arc::new(AtomicBool::new(false));
    let acked_total = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let adders: Vec<_> = (0..ADDERS)
        .map(|seed| {
            tokio::spawn(adder(
                buffer.clone(),
                counters.clone(),
                seed,
                stop.clone(),
                acked_total.clone(),
                refused.clone(),
            ))
        })
        .collect();

    let mut restarts = 0;
    for mode in [StopMode::Immediate, StopMode::Fast] {
        tokio::time::sleep(PHASE).await;
        restart(&pg, mode, &db, &counters, &buffer, &acked_total).await;
        restarts += 1;
    }
    tokio::time::sleep(PHASE).await;

    stop.store(true, SeqCst);
    let mut expected: HashMap<(i64, &str), i64> = HashMap::new();
    let mut acked = 0u64;
    for adder in adders {
        let (sums, n) = adder.await.expect("an adder task");
        acked += n;
        for (counter, sum) in sums {
            *expected.entry(counter).or_insert(0) += sum;
        }
    }
    // The two adds made by `restart` while the server was down.
    expected.insert((1, "during_outage"), restarts);
    acked += restarts as u64;

    let stats = tokio::time::timeout(Duration::from_secs(60), buffer.shutdown())
        .await
        .expect("shutdown() must finish once the server is back")
        .expect("shutdown() succeeds once the server is back");
    eprintln!(
        "adds acknowledged: {acked}; refused: {}; flushes: {}; failed attempts: {}; \
         replays skipped: {}; statements: {}; rows written: {}; restarts: {restarts}; \
         last error: {:?}; {:.1} s so far",
        refused.load(SeqCst),
        stats.flushes,
        stats.failed_attempts,
        stats.replays_skipped,
        stats.statements,
        stats.rows_written,
        stats.last_error,
        began.elapsed().as_secs_f64(),
    );

    assert_eq!(refused.load(SeqCst), 0, "no buffer.add may be refused");
    assert_eq!(stats.adds, acked, "every acknowledged add is counted once");
    assert_eq!(stats.pending_adds, 0, "nothing left unflushed: {stats:?}");
    assert!(
        stats.failed_attempts > 0,
        "the restarts must have made flushes fail: {stats:?}"
    );
    assert!(stats.flushes > 0, "{stats:?}");

    // Every stored total is exactly the sum of the acknowledged adds: none
    // lost, none applied twice.
    let owners: Vec<i64> = (1..=OWNERS).collect();
    let stored = counters
        .get_many(&db, &owners, &KEYS)
        .await
        .expect("read the totals");
    for owner in 1..=OWNERS {
        for key in KEYS {
            let want = expected.get(&(owner, key)).copied().unwrap_or(0);
            let got = stored.get(&owner).and_then(|k| k.get(key)).copied();
            assert_eq!(
                got.unwrap_or(0),
                want,
                "counter ({owner}, {key}): stored total vs acknowledged adds"
            );
        }
    }
    assert_eq!(
        counters.get(&db, &1, "during_outage").await.unwrap(),
        restarts,
        "the adds made while the server was down"
    );
    assert_eq!(
        counters.get(&db, &1, "direct").await.unwrap(),
        0,
        "the direct adds failed while the server was down: nothing stored"
    );
    assert_eq!(
        raw::count_rows(&db, ledger.name()).await,
        0,
        "a clean shutdown removes the buffer's ledger row"
    );
    let total: i64 = expected.values().sum();
    eprintln!(
        "{} counters, net total {total}, all exact; test took {:.1} s",
        expected.len(),
        began.elapsed().as_secs_f64()
    );

    db.close().await.expect("close the pool");
    drop(pg);
}
