//! `counter-bench`: slotted counters against a hot row, hand-written SQL,
//! the no-contention ceiling, the write-behind buffer (`buffered`) and
//! increments deferred to the end of their transaction (`deferred`);
//! fixed against adaptive slots over many counters of skewed popularity
//! (`--workload zipf`); and batch reads against a naive loop.
//!
//! ```text
//! cargo run --release -p bench --bin counter-bench -- \
//!     --database-url postgres://postgres@127.0.0.1:5432/test \
//!     --workload business --clients 64 --json bench.json --svg bench.svg
//! ```
//!
//! `--database-url` may list several nodes of a multi-primary cluster
//! (comma-separated): clients are spread over them round-robin (see
//! `nodes`). It drops and recreates its own `bench_*` tables in the target
//! database. Figures are only comparable within one run on one machine,
//! which is why the run prints the ratios the README quotes. A cell whose
//! stored total differs from its committed increments (or whose nodes
//! never agree on it) fails the run (exit code 1).

mod buffered;
mod chart;
mod cli;
mod grid;
mod nodes;
mod reads;
mod report;
mod sampler;
mod writes;
mod zipf;

use std::{process::ExitCode, time::Duration};

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};

use crate::{
    cli::{Args, Workload},
    grid::describe,
    nodes::{Nodes, TempDatabase},
    report::Report,
    writes::{BoxError, CellResult, Shared, Timing},
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
    let (cells, notes) = grid::grid(&args);
    for note in &notes {
        eprintln!("{note}");
    }
    let max_clients = cells.iter().map(|c| c.clients).max().unwrap_or(1);
    let scratch = TempDatabase::new(args.database_url.clone());
    let nodes = Nodes::connect(scratch.urls(), max_clients).await?;
    let db = nodes.first().clone();
    let backend = format!("{:?}", db.get_database_backend()).to_lowercase();
    let timing = Timing {
        warmup: seconds(args.warmup, "--warmup")?,
        measured: seconds(args.duration, "--duration")?,
        app_work: seconds(args.app_work_ms / 1e3, "--app-work-ms")?,
    };
    // The distribution's table is built once, and only if a zipf cell runs.
    let zipf = if args.workload.contains(&Workload::Zipf) {
        Some(zipf::Settings::new(
            args.owners,
            args.zipf_s,
            args.history_rounds,
            args.hot_owners,
            args.seed,
        )?)
    } else {
        None
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
        nodes: nodes.len(),
        cells: Vec::with_capacity(cells.len()),
        reads: Vec::new(),
    };
    let shared = Shared {
        timing,
        buffer: buffered::Settings {
            url: scratch.urls()[0].clone(),
            interval: Duration::from_millis(args.buffer_interval_ms),
        },
        zipf,
        progress: progress.clone(),
    };
    let mut rounds: Vec<Vec<CellResult>> = vec![Vec::new(); cells.len()];
    for round in 1..=args.repeat {
        for (cell, results) in cells.iter().zip(&mut rounds) {
            progress.set_message(format!("round {round}/{}: {}", args.repeat, describe(cell)));
            let result = writes::run(&nodes, *cell, &shared).await?;
            if !result.total_ok {
                let mut probe = String::new();
                if let Some(b) = &result.buffered {
                    probe = format!(
                        "; lag probe: added {}, stored {}; buffer accepted {}",
                        b.probe_adds, b.probe_stored, b.adds
                    );
                }
                if result.nodes_agreed == Some(false) {
                    probe += &format!(
                        "; the nodes still read different totals after {:?}",
                        nodes::AGREEMENT_WAIT
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
    drop(db);
    nodes.close().await?;

    match report.nodes {
        1 => println!("## counter-bench on {}\n", report.backend),
        n => println!("## counter-bench on {}, {n} nodes\n", report.backend),
    }
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

fn seconds(value: f64, option: &str) -> Result<Duration, BoxError> {
    Duration::try_from_secs_f64(value)
        .map_err(|_| format!("{option} must be a non-negative number").into())
}
