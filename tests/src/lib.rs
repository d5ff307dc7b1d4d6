//! The test harness: every integration test runs once per backend.
//!
//! * SQLite, in memory: always.
//! * PostgreSQL: when `COUNTER_TEST_POSTGRES_URL` is set; each test gets a
//!   schema of its own in that database, dropped when the test passes.
//! * MySQL/MariaDB: when `COUNTER_TEST_MYSQL_URL` is set; each test gets a
//!   database of its own on that server, dropped when the test passes.
//!
//! A test is written once, with [`backend_test!`], and registered as one
//! test per backend, named after it:
//! `reads::all_keys_of_owners_for_runtime_keys::sqlite`, `…::postgres`,
//! `…::mysql`, so `cargo test postgres` runs the PostgreSQL ones and a
//! failure on one backend hides none of the others. A test whose backend is
//! not configured says so and passes. The tests are grouped by area into a
//! few binaries (`tests/counters`, `caches`, `buffer`, `reliability`,
//! `blog_server.rs`), one module per former test file.
//!
//! A backend whose URL is set but which cannot be reached fails the test: a
//! configured backend is never skipped silently. When `COUNTER_TEST_REPORT`
//! names a file, one line `<backend> <test>` is appended to it per run, so CI
//! can prove that all three backends really ran.

use std::{
    fmt,
    io::Write,
    sync::atomic::{AtomicU32, Ordering},
    time::{SystemTime, UNIX_EPOCH},
};

use counter_core::{CounterTable, Counters, OwnerId};
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection};

pub mod child;
pub mod counting;
pub mod galera;
pub mod mq;
pub mod pgbouncer;
pub mod proxy;
pub mod redis;
pub mod regions;
pub mod servers;
pub mod sql;

/// The environment variable with a PostgreSQL URL to test against.
pub const POSTGRES_URL_VAR: &str = "COUNTER_TEST_POSTGRES_URL";
/// The environment variable with a MySQL/MariaDB URL to test against.
pub const MYSQL_URL_VAR: &str = "COUNTER_TEST_MYSQL_URL";
/// The environment variable naming the file that records which backends ran.
pub const REPORT_VAR: &str = "COUNTER_TEST_REPORT";
/// The environment variable naming the file that collects the reliability
/// figures of a run (see [`figures`]); `.ci/run` prints them as a table.
pub const FIGURES_VAR: &str = "COUNTER_TEST_FIGURES";

/// Connections per test pool: enough for the 32-task concurrency tests, few
/// enough that two tests in parallel stay under PostgreSQL's default 100.
const POOL_SIZE: u32 = 36;

/// A database backend under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    MySql,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
            Backend::MySql => "mysql",
        })
    }
}

/// Registers a test once per backend: written once as
/// `async fn name(t: TestDb) { ... }`, it becomes the tests `name::sqlite`,
/// `name::postgres` and `name::mysql`, each of which opens a fresh scratch
/// space on its backend with [`TestDb::open`] (and skips, saying so, when
/// that backend is not configured) and runs the function on it.
///
/// ```text
/// backend_test! {
///     /// Docs, for the shared function.
///     #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
///     #[label = "batch_read_100k"]
///     async fn batch_read_of_100_000_owners_is_zero_filled(t: TestDb) {
///         // ... the test, on `t.db`; `t.finish().await` at the end.
///     }
/// }
/// ```
///
/// Attributes, in any order, all optional:
///
/// * `#[tokio::test]`, `#[tokio::test(...)]`: the runtime of each generated
///   test, as on a plain test (default: `#[tokio::test]`).
/// * `#[label = "..."]`: the name the scratch spaces and the
///   `COUNTER_TEST_REPORT` lines use (default: the function's name).
/// * `#[backends(postgres, mysql)]`: register only these backends (default:
///   `sqlite, postgres, mysql`).
/// * anything else (doc comments) goes on the shared function.
///
/// Two more shapes, for tests that need no scratch space of the shared
/// servers (a private server of their own, say): `async fn name(b: Backend)`
/// and, for a test that builds its own runtime, `fn name(b: Backend)`; each
/// generated test calls the function with its backend and nothing else
/// (the function decides whether its backend is configured).
///
/// rustfmt does not format the inside of a macro call: to format a test,
/// `backend_test! {` can be turned into `mod m {` and back.
#[macro_export]
macro_rules! backend_test {
    // Attributes, one at a time: the test attribute, the label, the
    // backends; anything else is kept for the shared function.
    (@collect [$($attrs:tt)*] $test:tt $label:tt $backends:tt
        #[tokio::test $($args:tt)?] $($rest:tt)*) => {
        $crate::backend_test!(@collect [$($attrs)*] [$($args)?] $label $backends $($rest)*);
    };
    (@collect [$($attrs:tt)*] $test:tt $label:tt $backends:tt
        #[label = $new:literal] $($rest:tt)*) => {
        $crate::backend_test!(@collect [$($attrs)*] $test [$new] $backends $($rest)*);
    };
    (@collect [$($attrs:tt)*] $test:tt $label:tt $backends:tt
        #[backends($($backend:ident),+ $(,)?)] $($rest:tt)*) => {
        $crate::backend_test!(@collect [$($attrs)*] $test $label [$($backend)+] $($rest)*);
    };
    (@collect [$($attrs:tt)*] $test:tt $label:tt $backends:tt
        #[$($attr:tt)*] $($rest:tt)*) => {
        $crate::backend_test!(@collect [$($attrs)* #[$($attr)*]] $test $label $backends $($rest)*);
    };
    // A test on a fresh `TestDb`. The shared function's parameter type is
    // written unqualified: it resolves where the macro is called, like the
    // caller's own `TestDb` / `Backend` import.
    (@collect [$($attrs:tt)*] $test:tt [] $backends:tt
        async fn $name:ident($t:ident: TestDb $(,)?) $body:block) => {
        $crate::backend_test!(@collect [$($attrs)*] $test [stringify!($name)] $backends
            async fn $name($t: TestDb) $body);
    };
    (@collect [$($attrs:tt)*] $test:tt [$label:expr] [$($backend:ident)+]
        async fn $name:ident($t:ident: TestDb $(,)?) $body:block) => {
        $($attrs)*
        async fn $name($t: TestDb) $body

        mod $name {
            $($crate::backend_test!(@open $name $backend $test $label);)+
        }
    };
    // A test that is given its backend only.
    (@collect [$($attrs:tt)*] $test:tt $label:tt [$($backend:ident)+]
        async fn $name:ident($b:ident: Backend $(,)?) $body:block) => {
        $($attrs)*
        async fn $name($b: Backend) $body

        mod $name {
            $($crate::backend_test!(@pass $name $backend $test);)+
        }
    };
    (@collect [$($attrs:tt)*] $test:tt $label:tt [$($backend:ident)+]
        fn $name:ident($b:ident: Backend $(,)?) $body:block) => {
        $($attrs)*
        fn $name($b: Backend) $body

        mod $name {
            $(
                #[test]
                fn $backend() {
                    super::$name($crate::backend_test!(@backend $backend))
                }
            )+
        }
    };
    (@open $name:ident $backend:ident [$($args:tt)?] $label:expr) => {
        #[::tokio::test $($args)?]
        async fn $backend() {
            let backend = $crate::backend_test!(@backend $backend);
            if let ::std::option::Option::Some(t) = $crate::TestDb::open(backend, $label).await {
                super::$name(t).await;
            }
        }
    };
    (@pass $name:ident $backend:ident [$($args:tt)?]) => {
        #[::tokio::test $($args)?]
        async fn $backend() {
            super::$name($crate::backend_test!(@backend $backend)).await;
        }
    };
    (@backend sqlite) => { $crate::Backend::Sqlite };
    (@backend postgres) => { $crate::Backend::Postgres };
    (@backend mysql) => { $crate::Backend::MySql };
    (@backend $other:ident) => {
        compile_error!(concat!("backend_test!: no backend `", stringify!($other), "` (sqlite, postgres or mysql)"))
    };
    (@$($rest:tt)*) => {
        compile_error!(
            "backend_test!: expected attributes, then `async fn name(t: TestDb) { ... }`, \
             `async fn name(b: Backend) { ... }` or `fn name(b: Backend) { ... }`"
        );
    };
    ($($input:tt)+) => {
        $crate::backend_test!(@collect [] [] [] [sqlite postgres mysql] $($input)+);
    };
}

/// A fresh, empty database (or schema) for one test on one backend.
pub struct TestDb {
    pub backend: Backend,
    pub db: DatabaseConnection,
    /// The name the test opened it with (its line in `COUNTER_TEST_REPORT`).
    label: String,
    /// Connection used to drop the scratch schema/database at the end.
    admin: Option<(DatabaseConnection, String)>,
    /// How `db` reached its scratch space (none for SQLite).
    location: Option<Location>,
}

/// The URL and schema a server-backed [`TestDb`] connected with.
#[derive(Debug, Clone)]
struct Location {
    url: String,
    schema: Option<String>,
}

impl TestDb {
    /// A fresh scratch space on `backend` for the test `label` (which names
    /// the scratch schema or database, and the test's line in
    /// `COUNTER_TEST_REPORT`), or `None` when `backend` is a server whose
    /// URL variable is not set: the test is skipped, and says so.
    ///
    /// [`backend_test!`] calls this; call it directly only for a second
    /// scratch space on the same backend (say, a second tenant).
    pub async fn open(backend: Backend, label: &str) -> Option<TestDb> {
        let db = match backend {
            Backend::Sqlite => sqlite(label).await,
            Backend::Postgres => {
                postgres(&url_or_skip(POSTGRES_URL_VAR, backend, label)?, label).await
            }
            Backend::MySql => mysql(&url_or_skip(MYSQL_URL_VAR, backend, label)?, label).await,
        };
        eprintln!("[{backend}] {label}");
        record(backend, label);
        Some(db)
    }

    /// The name the test opened this scratch space with.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// `db` for the test's own statements and entity queries, safe behind
    /// a transaction pooler (see [`sql`]).
    pub fn sql(&self) -> sql::Sql<'_> {
        sql::Sql::new(&self.db)
    }

    /// Drops the scratch schema or database. Call it at the end of a test;
    /// a failed test leaves its scratch space behind for inspection (CI drops
    /// the whole run's database afterwards).
    pub async fn finish(self) {
        self.db.close().await.expect("close the test pool");
        if let Some((admin, drop_sql)) = self.admin {
            admin
                .execute_unprepared(&drop_sql)
                .await
                .expect("drop the scratch schema");
            admin.close().await.expect("close the admin connection");
        }
    }
}

/// Counters in `table`, with `slots` slots per key.
pub fn counters<I: OwnerId>(table: &str, slots: u16) -> Counters<I> {
    let table = CounterTable::new(table.to_owned()).and_then(|t| t.with_slots(slots));
    Counters::new(table.expect("a valid test table"))
}

/// Counters in `table` with `slots` slots and two unique keys: `viewers`
/// (all-time) and `visitors` (with day buckets); any other key counts
/// deltas.
pub fn uniques(table: &str, slots: u16) -> Counters<i64> {
    let table = CounterTable::new(table.to_owned())
        .and_then(|t| t.with_slots(slots))
        .and_then(|t| t.with_unique_key("viewers"))
        .and_then(|t| t.with_unique_key("visitors"))
        .and_then(|t| t.with_key_window("visitors", counter_core::Window::Day));
    Counters::new(table.expect("a valid test table"))
}

/// A number from the environment variable `var` (a test's knob, such as
/// `COUNTER_SOAK_SECS`): `None` when unset or empty; a panic naming the
/// variable when it is not a number, rather than a silent default.
pub fn env_number<T: std::str::FromStr>(var: &str) -> Option<T> {
    let value = configured(var)?;
    Some(
        value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{var}={value:?} is not a number")),
    )
}

fn configured(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|url| !url.trim().is_empty())
}

/// The URL in `var`, or `None` after saying that `label` is skipped on
/// `backend`.
fn url_or_skip(var: &str, backend: Backend, label: &str) -> Option<String> {
    let url = configured(var);
    if url.is_none() {
        eprintln!("skipped {label} on {backend}: {var} is not set");
    }
    url
}

async fn sqlite(label: &str) -> TestDb {
    // An in-memory database lives as long as its one connection.
    let mut options = ConnectOptions::new("sqlite::memory:");
    options
        .max_connections(1)
        .min_connections(1)
        .sqlx_logging(false);
    TestDb {
        backend: Backend::Sqlite,
        label: label.to_owned(),
        db: Database::connect(options)
            .await
            .expect("open in-memory SQLite"),
        admin: None,
        location: None,
    }
}

async fn postgres(url: &str, test: &str) -> TestDb {
    let admin = connect(url, 1, None)
        .await
        .unwrap_or_else(|e| panic!("{POSTGRES_URL_VAR} is set but PostgreSQL is unreachable: {e}"));
    if counter_core::pooling::is_transaction_pooled(&admin) {
        return postgres_pooled(admin, url, test).await;
    }
    let schema = scratch_name("ct", test);
    admin
        .execute_unprepared(&format!("CREATE SCHEMA \"{schema}\""))
        .await
        .expect("create the test schema");
    let db = connect(url, POOL_SIZE, Some(&schema))
        .await
        .expect("connect to the test schema");
    TestDb {
        backend: Backend::Postgres,
        label: test.to_owned(),
        db,
        admin: Some((admin, format!("DROP SCHEMA \"{schema}\" CASCADE"))),
        location: Some(Location {
            url: url.to_owned(),
            schema: Some(schema),
        }),
    }
}

/// [`postgres`] through a transaction pooler (PgBouncer, the URL's
/// statement cache 0): a database per test, as on MySQL, since a schema is
/// a session's `search_path`, which a transaction pooler does not keep.
async fn postgres_pooled(admin: DatabaseConnection, url: &str, test: &str) -> TestDb {
    own_database(Backend::Postgres, admin, url, test).await
}

async fn mysql(url: &str, test: &str) -> TestDb {
    let admin = connect(url, 1, None)
        .await
        .unwrap_or_else(|e| panic!("{MYSQL_URL_VAR} is set but MySQL/MariaDB is unreachable: {e}"));
    own_database(Backend::MySql, admin, url, test).await
}

/// A scratch database of the test's own, made and later dropped by
/// `admin`, named after the URL's own database so CI drops a run's
/// leftovers by prefix.
async fn own_database(
    backend: Backend,
    admin: DatabaseConnection,
    url: &str,
    test: &str,
) -> TestDb {
    let database = scratch_name(database_of(url).unwrap_or("ct"), test);
    let (create, drop) = match backend {
        Backend::Postgres => (
            format!("CREATE DATABASE \"{database}\""),
            format!("DROP DATABASE \"{database}\" WITH (FORCE)"),
        ),
        _ => (
            format!("CREATE DATABASE `{database}`"),
            format!("DROP DATABASE `{database}`"),
        ),
    };
    admin
        .execute_unprepared(&create)
        .await
        .expect("create the test database");
    let scratch_url = with_database(url, &database);
    let db = connect(&scratch_url, POOL_SIZE, None)
        .await
        .expect("connect to the test database");
    TestDb {
        backend,
        label: test.to_owned(),
        db,
        admin: Some((admin, drop)),
        location: Some(Location {
            url: scratch_url,
            schema: None,
        }),
    }
}

async fn connect(
    url: &str,
    pool: u32,
    schema: Option<&str>,
) -> Result<DatabaseConnection, sea_orm::DbErr> {
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(pool)
        .min_connections(0)
        .sqlx_logging(false);
    if let Some(schema) = schema {
        options.set_schema_search_path(schema);
    }
    Database::connect(options).await
}

/// `<prefix>_<test>_<pid>_<micros>_<n>`: unique per process and call, at
/// most 63 bytes. MySQL scratch databases are prefixed with the URL's own
/// database name, so CI can drop every one of a run's leftovers by prefix.
fn scratch_name(prefix: &str, test: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let salt = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_micros());
    let suffix = format!("_{}_{salt}_{n}", std::process::id());
    let room = 63usize.saturating_sub(prefix.len() + 1 + suffix.len());
    let test: String = test
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(room)
        .collect();
    format!("{prefix}_{test}{suffix}")
}

/// The database named in a URL's path, if any.
fn database_of(url: &str) -> Option<&str> {
    let base = url.split('?').next()?;
    let path = &base[base.find("://")? + 3..];
    let db = &path[path.find('/')? + 1..];
    (!db.is_empty()).then_some(db)
}

/// Replaces the database in a `mysql://` or `postgres://user@host:port/db?params` URL.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let authority_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[authority_end..].find('/') {
        Some(slash) => &base[..authority_end + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{database}?{query}"),
        None => format!("{base}/{database}"),
    }
}

/// Reports what a reliability test did on one backend: operations run,
/// faults injected, increments lost, and so on, as `name=value` pairs.
///
/// Always printed to stderr; also appended as one line
/// `<test> <backend> name=value ...` to the file named by
/// `COUNTER_TEST_FIGURES`, from which `.ci/run` prints the run's figures
/// (RELIABILITY.md quotes the last ones).
pub fn figures(test: &str, backend: impl fmt::Display, figures: &[(&str, u64)]) {
    let pairs: Vec<String> = figures.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let line = format!("{test} {backend} {}\n", pairs.join(" "));
    eprint!("figures: {line}");
    append_line(FIGURES_VAR, &line);
}

fn record(backend: Backend, test: &str) {
    append_line(REPORT_VAR, &format!("{backend} {test}\n"));
}

/// Appends `line` to the file named by the environment variable `var`, if
/// set. One write of the whole line: O_APPEND keeps parallel tests' lines
/// whole.
fn append_line(var: &str, line: &str) {
    let Some(path) = configured(var) else {
        return;
    };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {var}={path}: {e}"));
    file.write_all(line.as_bytes())
        .unwrap_or_else(|e| panic!("write {var}={path}: {e}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_missing_from_a_sketch_is_counted() {
        let mut stored = counter_core::unique::Sketch::new();
        stored.insert("ann");
        assert_eq!(members_missing(&stored, ["ann"]), 0);
        assert_eq!(members_missing(&stored, ["ann", "bob", "cy"]), 2);
    }

    #[test]
    fn database_is_replaced_in_mysql_urls() {
        assert_eq!(
            with_database("mysql://root@127.0.0.1:3306/test", "x"),
            "mysql://root@127.0.0.1:3306/x"
        );
        assert_eq!(
            with_database("mysql://root@h/test?ssl-mode=disabled", "x"),
            "mysql://root@h/x?ssl-mode=disabled"
        );
        assert_eq!(with_database("mysql://root@h", "x"), "mysql://root@h/x");
    }

    #[test]
    fn scratch_names_are_identifiers() {
        let name = scratch_name(
            "counter_ci_1764000000_12345",
            "a very-long test name that goes on and on",
        );
        assert!(name.len() <= 63, "{name}");
        assert!(
            name.starts_with("counter_ci_1764000000_12345_a_very"),
            "{name}"
        );
        assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        assert_ne!(scratch_name("ct", "t"), scratch_name("ct", "t"));
        assert_eq!(database_of("mysql://root@h:3306/test?x=1"), Some("test"));
        assert_eq!(database_of("mysql://root@h:3306"), None);
    }
}

/// How many of `members` a stored sketch does not account for: a member
/// is accounted for when merging it alone changes no register (a lost
/// write would have left its register lower).
pub fn members_missing<'a>(
    stored: &counter_core::unique::Sketch,
    members: impl IntoIterator<Item = &'a str>,
) -> u64 {
    members
        .into_iter()
        .filter(|member| {
            let mut alone = counter_core::unique::Sketch::new();
            alone.insert(*member);
            stored.clone().merge(&alone)
        })
        .count() as u64
}

/// Helpers that look at or write the companion table behind the crate's back
/// (through [`sql::Sql`], so behind a transaction pooler too).
pub mod raw {
    use sea_orm::{
        ConnectionTrait, DatabaseConnection, Value,
        sea_query::{Alias, Expr, ExprTrait, Query},
    };

    use crate::sql::Sql;

    /// Writes one slot row directly, as a hand edit or a legacy import would.
    pub async fn insert_slot(
        db: &DatabaseConnection,
        table: &str,
        owner: impl Into<Value>,
        key: &str,
        slot: i16,
        value: i64,
    ) {
        let insert = Query::insert()
            .into_table(Alias::new(table))
            .columns(["owner_id", "count_key", "slot", "value"].map(Alias::new))
            .values_panic([owner.into().into(), key.into(), slot.into(), value.into()])
            .to_owned();
        Sql::new(db)
            .execute(&insert)
            .await
            .expect("insert a slot row");
    }

    /// The `(slot, value)` rows of one counter, ordered by slot.
    pub async fn slot_rows(
        db: &DatabaseConnection,
        table: &str,
        owner: impl Into<Value>,
        key: &str,
    ) -> Vec<(i16, i64)> {
        let select = Query::select()
            .columns(["slot", "value"].map(Alias::new))
            .from(Alias::new(table))
            .and_where(Expr::col(Alias::new("owner_id")).eq(owner.into()))
            .and_where(Expr::col(Alias::new("count_key")).eq(key))
            .order_by(Alias::new("slot"), sea_orm::Order::Asc)
            .to_owned();
        Sql::new(db)
            .query_all(&select)
            .await
            .expect("read slot rows")
            .iter()
            .map(|row| {
                (
                    row.try_get("", "slot").expect("slot"),
                    row.try_get("", "value").expect("value"),
                )
            })
            .collect()
    }

    /// Every `(owner, key, slot, value)` row of an `i64`-owned `table`, in
    /// primary-key order.
    pub async fn all_slot_rows(
        db: &DatabaseConnection,
        table: &str,
    ) -> Vec<(i64, String, i16, i64)> {
        let select = Query::select()
            .columns(["owner_id", "count_key", "slot", "value"].map(Alias::new))
            .from(Alias::new(table))
            .order_by(Alias::new("owner_id"), sea_orm::Order::Asc)
            .order_by(Alias::new("count_key"), sea_orm::Order::Asc)
            .order_by(Alias::new("slot"), sea_orm::Order::Asc)
            .to_owned();
        Sql::new(db)
            .query_all(&select)
            .await
            .expect("read rows")
            .iter()
            .map(|r| {
                (
                    r.try_get("", "owner_id").expect("owner_id"),
                    r.try_get("", "count_key").expect("count_key"),
                    r.try_get("", "slot").expect("slot"),
                    r.try_get("", "value").expect("value"),
                )
            })
            .collect()
    }

    /// The slot rows of one `i64`-owned counter in a sketch table.
    pub async fn slot_rows_of(
        db: &DatabaseConnection,
        table: &str,
        owner: i64,
        key: &str,
    ) -> usize {
        sketch_bytes(db, table, owner, key).await.len()
    }

    /// The stored sketches of one `i64`-owned counter's all-time rows in a
    /// sketch table, by slot.
    pub async fn sketch_bytes(
        db: &DatabaseConnection,
        table: &str,
        owner: i64,
        key: &str,
    ) -> Vec<(i16, Vec<u8>)> {
        let select = Query::select()
            .columns(["slot", "sketch"].map(Alias::new))
            .from(Alias::new(table))
            .and_where(Expr::col(Alias::new("owner_id")).eq(owner))
            .and_where(Expr::col(Alias::new("count_key")).eq(key))
            .and_where(Expr::col(Alias::new("bucket")).eq(i64::MIN))
            .order_by(Alias::new("slot"), sea_orm::Order::Asc)
            .to_owned();
        Sql::new(db)
            .query_all(&select)
            .await
            .expect("read sketch rows")
            .iter()
            .map(|row| {
                (
                    row.try_get("", "slot").expect("slot"),
                    row.try_get("", "sketch").expect("sketch"),
                )
            })
            .collect()
    }

    /// Rows in `table`.
    pub async fn count_rows(db: &DatabaseConnection, table: &str) -> i64 {
        let select = Query::select()
            .expr_as(Expr::cust("COUNT(*)"), Alias::new("n"))
            .from(Alias::new(table))
            .to_owned();
        let row = Sql::new(db)
            .query_one(&select)
            .await
            .expect("count rows")
            .expect("a count");
        row.try_get::<i64>("", "n").expect("the count")
    }
}

impl TestDb {
    /// The URL `db` connected with: on MySQL it names the scratch database;
    /// on PostgreSQL it is the configured URL (the scratch space is
    /// [`TestDb::schema`]). `None` for SQLite.
    pub fn url(&self) -> Option<&str> {
        self.location.as_ref().map(|l| l.url.as_str())
    }

    /// PostgreSQL: the scratch schema `db` uses as its `search_path`.
    pub fn schema(&self) -> Option<&str> {
        self.location.as_ref().and_then(|l| l.schema.as_deref())
    }

    /// MySQL: the scratch database named in [`TestDb::url`].
    pub fn database(&self) -> Option<&str> {
        match self.backend {
            Backend::MySql => self.url().and_then(database_of),
            _ => None,
        }
    }

    /// The server's `host:port` (the backend's default port if the URL has
    /// none). `None` for SQLite.
    pub fn server_addr(&self) -> Option<String> {
        let (_, host) = split_authority(self.url()?)?;
        let default_port = match self.backend {
            Backend::Postgres => 5432,
            _ => 3306,
        };
        Some(if host.contains(':') {
            host.to_owned()
        } else {
            format!("{host}:{default_port}")
        })
    }

    /// A new pool of `pool` connections to this test's scratch space (same
    /// database, same schema) through `addr` (`host:port`, e.g. a
    /// [`proxy::Proxy`]) instead of the server's own address. TLS is turned
    /// off (`sslmode=disable` / `ssl-mode=disabled`) so that a proxy sees
    /// the protocol in clear.
    pub async fn connect_via(
        &self,
        addr: &str,
        pool: u32,
    ) -> Result<DatabaseConnection, sea_orm::DbErr> {
        let location = self.location.as_ref().ok_or_else(|| {
            sea_orm::DbErr::Custom(format!("{} has no server to connect to", self.backend))
        })?;
        let url = with_host(&location.url, addr).ok_or_else(|| {
            sea_orm::DbErr::Custom(format!("no host in the {} URL", self.backend))
        })?;
        let plain = match self.backend {
            Backend::Postgres => "sslmode=disable",
            _ => "ssl-mode=disabled",
        };
        let url = format!("{url}{}{plain}", if url.contains('?') { '&' } else { '?' });
        connect(&url, pool, location.schema.as_deref()).await
    }
}

/// `(scheme://user@, host[:port])` of a URL.
pub fn split_authority(url: &str) -> Option<(&str, &str)> {
    let start = url.find("://")? + 3;
    let rest = &url[start..];
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let host_at = authority.rfind('@').map_or(0, |at| at + 1);
    Some((&url[..start + host_at], &authority[host_at..]))
}

/// `url` with its `host[:port]` replaced by `addr` (a [`proxy::Proxy`]'s).
pub fn with_host(url: &str, addr: &str) -> Option<String> {
    let (before, host) = split_authority(url)?;
    let after = &url[before.len() + host.len()..];
    Some(format!("{before}{addr}{after}"))
}

#[cfg(test)]
mod location_tests {
    use super::*;

    #[test]
    fn the_host_is_replaced_in_urls() {
        assert_eq!(
            with_host("postgres://postgres@127.0.0.1:5432/test", "127.0.0.1:9").as_deref(),
            Some("postgres://postgres@127.0.0.1:9/test")
        );
        assert_eq!(
            with_host("mysql://root:pw@db/x?ssl-mode=disabled", "h:1").as_deref(),
            Some("mysql://root:pw@h:1/x?ssl-mode=disabled")
        );
        assert_eq!(
            with_host("mysql://localhost:3306", "h:1").as_deref(),
            Some("mysql://h:1")
        );
        assert_eq!(
            split_authority("postgres://u@h:5/d"),
            Some(("postgres://u@", "h:5"))
        );
        assert_eq!(with_host("sqlite::memory:", "h:1"), None);
    }
}
