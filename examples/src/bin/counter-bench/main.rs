//! `counter-bench`: slotted counters against a hot row, hand-written SQL,
//! the no-contention ceiling and the write-behind buffer (`buffered`), and
//! batch reads against a naive loop.
//!
//! ```text
//! cargo run --release -p examples --bin counter-bench -- \
//!     --database-url postgres://postgres@127.0.0.1:5432/test \
//!     --workload business --clients 64 --json bench.json --svg bench.svg
//! ```
//!
//! It drops and recreates its own `bench_*` tables in the target database.
//! Figures are only comparable within one run on one machine, which is why
//! the run prints the ratios the README quotes. A cell whose stored total
//! differs from its committed increments fails the run (exit code 1).

mod buffered;
mod chart;
mod cli;
mod reads;
mod report;
mod writes;

use std::{process::ExitCode, time::Duration};

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use sea_orm::{ConnectOptions, Database, DatabaseConnection};

use crate::{
    cli::Args,
    report::Report,
    writes::{BoxError, Cell, CellResult, Timing},
};

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("counter-bench: a stored total differs from the committed increments");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("counter-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs every cell; `Ok(false)` when a total check failed.
async fn run(args: Args) -> Result<bool, BoxError> {
    let cells = grid(&args);
    let max_clients = cells.iter().map(|c| c.clients).max().unwrap_or(1);
    let scratch = TempDatabase::new(args.database_url.clone());
    let db = connect(scratch.url(), max_clients).await?;
    let backend = format!("{:?}", db.get_database_backend()).to_lowercase();
    let timing = Timing {
        warmup: seconds(args.warmup, "--warmup")?,
        measured: seconds(args.duration, "--duration")?,
        app_work: seconds(args.app_work_ms / 1e3, "--app-work-ms")?,
    };

    let progress = ProgressBar::new(
        cells.len() as u64 * u64::from(args.repeat) + u64::from(args.read_owners > 0),
    );
    progress.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    progress.enable_steady_tick(Duration::from_millis(200));

    let mut report = Report {
        backend,
        cells: Vec::with_capacity(cells.len()),
        reads: Vec::new(),
    };
    let buffer = buffered::Settings {
        url: scratch.url().to_owned(),
        interval: Duration::from_millis(args.buffer_interval_ms),
    };
    let mut rounds: Vec<Vec<CellResult>> = vec![Vec::new(); cells.len()];
    for round in 1..=args.repeat {
        for (cell, results) in cells.iter().zip(&mut rounds) {
            progress.set_message(format!("round {round}/{}: {}", args.repeat, describe(cell)));
            let result = writes::run(&db, *cell, timing, &buffer).await?;
            if !result.total_ok {
                let mut probe = String::new();
                if let Some(b) = &result.buffered {
                    probe = format!(
                        "; lag probe: added {}, stored {}; buffer accepted {}",
                        b.probe_adds, b.probe_stored, b.adds
                    );
                }
                progress.println(format!(
                    "MISMATCH in {}: expected {}, stored {} (children {:?}){probe}",
                    describe(cell),
                    result.expected_total,
                    result.observed_total,
                    result.observed_children
                ));
            }
            results.push(result);
            progress.inc(1);
        }
    }
    report.cells = rounds.into_iter().filter_map(CellResult::median).collect();
    if args.read_owners > 0 {
        progress.set_message(format!("batch reads of {} owners", args.read_owners));
        report.reads = reads::run(&db, args.read_owners).await?;
        progress.inc(1);
    }
    progress.finish_and_clear();
    db.close().await?;

    println!("## counter-bench on {}\n", report.backend);
    println!("{}", report.markdown());
    println!("{}", report.ratios());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, chart::svg(&report.backend, &report.cells))?;
    }
    Ok(report.cells.iter().all(|c| c.total_ok))
}

/// Every (workload, clients, design, slots, strategy) cell asked for;
/// designs without slots run once per client count.
fn grid(args: &Args) -> Vec<Cell> {
    let mut cells = Vec::new();
    for &workload in &args.workload {
        for &clients in &args.clients {
            for &design in &args.designs {
                if design.slotted() {
                    for &slots in &args.slots {
                        for &strategy in &args.slot_strategy {
                            cells.push(Cell {
                                workload,
                                design,
                                slots: Some(slots),
                                strategy: Some(strategy),
                                clients,
                            });
                        }
                    }
                } else {
                    cells.push(Cell {
                        workload,
                        design,
                        slots: None,
                        strategy: None,
                        clients,
                    });
                }
            }
        }
    }
    cells
}

fn describe(cell: &Cell) -> String {
    let mut text = format!("{} {} x{}", cell.workload, cell.design, cell.clients);
    if let (Some(slots), Some(strategy)) = (cell.slots, cell.strategy) {
        text += &format!(" ({slots} slots, {strategy})");
    }
    if cell.design == cli::Design::Buffered {
        text += " (flushing every --buffer-interval-ms)";
    }
    text
}

fn seconds(value: f64, option: &str) -> Result<Duration, BoxError> {
    Duration::try_from_secs_f64(value)
        .map_err(|_| format!("{option} must be a non-negative number").into())
}

/// One pool for the whole run, with a connection per client.
async fn connect(url: &str, clients: usize) -> Result<DatabaseConnection, BoxError> {
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(u32::try_from(clients)? + 2)
        .min_connections(1)
        .acquire_timeout(Duration::from_secs(60))
        .sqlx_logging(false);
    Ok(Database::connect(options).await?)
}

/// The database to measure: the given URL, or a temporary SQLite file that
/// is removed (with its journal files) when the run ends.
struct TempDatabase {
    url: String,
    file: Option<std::path::PathBuf>,
}

impl TempDatabase {
    fn new(url: Option<String>) -> Self {
        match url {
            Some(url) => Self { url, file: None },
            None => {
                let file =
                    std::env::temp_dir().join(format!("counter-bench-{}.db", std::process::id()));
                Self {
                    url: format!("sqlite://{}?mode=rwc", file.display()),
                    file: Some(file),
                }
            }
        }
    }

    fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for TempDatabase {
    fn drop(&mut self) {
        if let Some(file) = &self.file {
            for suffix in ["", "-wal", "-shm", "-journal"] {
                let mut path = file.clone().into_os_string();
                path.push(suffix);
                let _ = std::fs::remove_file(path);
            }
        }
    }
}
