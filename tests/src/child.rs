//! A second process for a test: the test binary run again, running one
//! named test that reads what to do from an environment variable, beside
//! a database both processes open (a file for SQLite, the test's scratch
//! space on a server). For what one process cannot show: a consumer that
//! dies by `abort()`, a cache in another process that no write of this one
//! reaches through the process-wide observers.

use std::process::{Command, ExitStatus};

use sea_orm::{ConnectOptions, Database, DatabaseConnection};

use crate::{Backend, TestDb};

/// A database the child process opens too.
pub struct SharedDb {
    pub db: DatabaseConnection,
    /// Its URL, for the child.
    pub url: String,
    /// The test's PostgreSQL schema, if any, for the child's search path.
    pub schema: Option<String>,
    test: Option<TestDb>,
    _dir: Option<std::path::PathBuf>,
}

impl SharedDb {
    /// Opens the database for the test `label` on `backend`, or `None`
    /// when that backend is not configured (the test says it skipped).
    pub async fn open(backend: Backend, label: &str) -> Option<SharedDb> {
        if backend == Backend::Sqlite {
            let dir = std::env::temp_dir().join(format!(
                "counter-child-{}-{}",
                std::process::id(),
                rand::random::<u32>()
            ));
            std::fs::create_dir_all(&dir).expect("a temporary directory");
            let url = format!("sqlite://{}?mode=rwc", dir.join("counters.db").display());
            let db = connect(&url, None).await;
            return Some(SharedDb {
                db,
                url,
                schema: None,
                test: None,
                _dir: Some(dir),
            });
        }
        let test = TestDb::open(backend, label).await?;
        Some(SharedDb {
            db: test.db.clone(),
            url: test.url().expect("a server URL").to_owned(),
            schema: test.schema().map(str::to_owned),
            test: Some(test),
            _dir: None,
        })
    }

    /// Drops the test's scratch space (a passed test's).
    pub async fn finish(self) {
        if let Some(test) = self.test {
            test.finish().await;
        }
        if let Some(dir) = self._dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A pool of two connections on `url`, in `schema` (PostgreSQL) if given:
/// what a child opens.
pub async fn connect(url: &str, schema: Option<&str>) -> DatabaseConnection {
    let mut options = ConnectOptions::new(url);
    options.max_connections(2).sqlx_logging(false);
    if let Some(schema) = schema {
        options.set_schema_search_path(schema);
    }
    Database::connect(options)
        .await
        .expect("connect the child's database")
}

/// Runs the test `test` (its full path in this binary) in a new process of
/// this test binary, with `spec` in the environment variable `var`, and
/// returns how it ended. The child writes no report or figures lines.
pub async fn run(test: &'static str, var: &'static str, spec: String) -> ExitStatus {
    let exe = std::env::current_exe().expect("the test binary");
    tokio::task::spawn_blocking(move || {
        Command::new(exe)
            .args(["--exact", test, "--nocapture", "--test-threads", "1"])
            .env(var, spec)
            .env_remove("COUNTER_TEST_REPORT")
            .env_remove("COUNTER_TEST_FIGURES")
            .status()
            .expect("run the child process")
    })
    .await
    .expect("the child")
}
