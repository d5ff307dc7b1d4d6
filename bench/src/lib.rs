//! What the benches share: the database a run measures when none is
//! given (a temporary SQLite file, removed however the run ends) and the
//! exit code of a run that checks its own figures.

use std::{path::PathBuf, process::ExitCode};

pub mod http;
pub mod load;
pub mod members;
pub mod sizes;
pub mod stats;

/// Any error of a bench run.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Removes a temporary SQLite database and its `-wal` and `-shm` files
/// when dropped, whichever way the run ends.
#[derive(Debug)]
pub struct TempSqlite(PathBuf);

impl Drop for TempSqlite {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.0.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The URL to measure: `given`, or a new SQLite file named after `bench`
/// and this process, with the guard that removes it (keep the guard alive
/// longer than the connection: declare it first).
pub fn database_url(given: Option<&str>, bench: &str) -> (String, Option<TempSqlite>) {
    match given {
        Some(url) => (url.to_owned(), None),
        None => {
            let path = std::env::temp_dir().join(format!("{bench}-{}.db", std::process::id()));
            let url = format!("sqlite://{}?mode=rwc", path.display());
            (url, Some(TempSqlite(path)))
        }
    }
}

/// The exit code of a run: success if it ran and its checks held; an
/// error is printed, prefixed with the bench's name.
pub fn exit_code<E: std::fmt::Display>(bench: &str, outcome: Result<bool, E>) -> ExitCode {
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("{bench}: {e}");
            ExitCode::FAILURE
        }
    }
}
