//! The command line: which cells to run and where to write the results.

use std::{fmt, path::PathBuf};

use clap::{Parser, ValueEnum};
use counter_core::SlotStrategy;

use crate::nodes::UrlList;

/// Measures slotted counters against a hot row, hand-written SQL, the
/// no-contention ceiling and the write-behind buffer, adaptive slots on a
/// skewed (Zipf) load of many counters, then batch reads against a naive
/// loop.
///
/// Every write cell runs its clients for a warm-up and then for
/// `--duration` seconds, and checks that the stored total equals the number
/// of increments that committed; a mismatch fails the run.
#[derive(Debug, Parser)]
#[command(name = "counter-bench", version)]
pub struct Args {
    /// Database to measure (default: a temporary SQLite file, removed at the
    /// end). A comma-separated list measures a multi-primary cluster, one
    /// URL per node (e.g. three Galera nodes): client i writes through node
    /// i % n, tables are set up and totals checked on the first node, once
    /// every node reads the same totals.
    #[arg(long, env = "DATABASE_URL", value_parser = UrlList::parse)]
    pub database_url: Option<UrlList>,

    /// `autocommit`: each increment is its own statement. `business`: BEGIN;
    /// insert a child row; increment; application work; COMMIT. `zipf`:
    /// autocommit increments of `--owners` counters drawn from a Zipf
    /// distribution (a few very hot, most cold), after a history of
    /// `--history-rounds` earlier writes per counter.
    #[arg(long, value_delimiter = ',', default_value = "business")]
    pub workload: Vec<Workload>,

    /// Designs to measure. A design that does not apply to a workload is
    /// skipped there with a note: `zipf` runs only `slotted` (named
    /// `fixed<slots>`) and `adaptive`; `adaptive` runs only in `zipf`;
    /// `deferred` only in `business`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "hot_row,slotted,slotted_raw,uncontended,buffered,deferred,adaptive"
    )]
    pub designs: Vec<Design>,

    /// The flush interval of the `buffered` design's `CounterBuffer`, in
    /// milliseconds: the lag between an increment and its visibility in the
    /// database is about half of it on average, plus the flush itself.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub buffer_interval_ms: u64,

    /// Slot counts for `slotted`, `slotted_raw` and `deferred` (the others
    /// have no fixed slot count).
    #[arg(long, value_delimiter = ',', default_value = "16,64")]
    pub slots: Vec<u16>,

    /// The ceiling of the `adaptive` design: `SlotPolicy::adaptive(1..=M)`.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub adaptive_max: u16,

    /// Concurrent clients, each with its own connection.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,64")]
    pub clients: Vec<usize>,

    /// How the designs with slots pick one; several to compare them.
    #[arg(long, value_delimiter = ',', default_value = "rotating")]
    pub slot_strategy: Vec<Strategy>,

    /// `zipf`: how many counters (owners 1..=N, owner 1 the hottest).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1000..=10_000_000))]
    pub owners: u64,

    /// `zipf`: the exponent s of the distribution (owner k is drawn in
    /// proportion to 1/k^s; 0 is uniform).
    #[arg(long, default_value_t = 1.1, value_parser = parse_exponent)]
    pub zipf_s: f64,

    /// `zipf`: earlier writes each counter gets before the clients start,
    /// one batched round at a time, as a counter that lived a while would
    /// have had.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(0..=64))]
    pub history_rounds: u32,

    /// `zipf`: the hottest owners (1..=K) whose throughput is reported as
    /// `hot_tx_per_s`.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub hot_owners: u64,

    /// `zipf`: the seed of the clients' draws (client i seeds its own
    /// generator with seed + i), so runs draw the same owners.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// Measured seconds per cell.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,

    /// Warm-up seconds per cell (counted in the total check, not in the figures).
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,

    /// Milliseconds of application work inside each `business` transaction.
    #[arg(long, default_value_t = 2.0)]
    pub app_work_ms: f64,

    /// Rounds over the whole grid (interleaved, so drift hits every design
    /// alike); each cell reports its median round.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,

    /// Owners in the batch-read benchmark (0 skips it).
    #[arg(long, default_value_t = 1000)]
    pub read_owners: usize,

    /// Write the results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Write a chart of throughput against clients, per design, as SVG.
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

/// What one transaction of a client does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// One increment per statement, no explicit transaction.
    Autocommit,
    /// A child row and its counter in one transaction, with application work
    /// while the row lock is held, as a request handler would.
    Business,
    /// Autocommit increments of many counters, drawn from a Zipf
    /// distribution: a few very hot, most cold (see the `zipf` module).
    Zipf,
}

/// One way of keeping the counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Design {
    /// `UPDATE hot SET n = n + 1` on one row: every client queues on its lock.
    HotRow,
    /// This crate, every client on one hot owner.
    Slotted,
    /// The same upsert by hand, no crate: what the crate costs.
    SlottedRaw,
    /// This crate, every client on its own owner: the ceiling.
    Uncontended,
    /// `CounterBuffer::add` on the hot owner: increments folded in memory
    /// and written by a background flusher every `--buffer-interval-ms`
    /// (in `business`, the child row is still inserted in its own
    /// transaction, and the increment is buffered after it commits).
    Buffered,
    /// `business` only: this crate on the hot owner, the transaction's
    /// delta collected in a `DeltaBatch` and written just before COMMIT
    /// (`batch.apply_in(&txn)`), so the slot row is locked for the commit
    /// only, not during the application work. Skipped in `autocommit`,
    /// where there is no work to defer over and it would be `slotted`.
    Deferred,
    /// `zipf` only: this crate with `SlotPolicy::adaptive(1..=--adaptive-max)`:
    /// each counter starts on one row and widens while its writes contend.
    Adaptive,
}

impl Design {
    /// Whether the design spreads writes over a fixed number of slots (and
    /// so has a cell per `--slots` value and per strategy).
    pub fn slotted(self) -> bool {
        matches!(
            self,
            Design::Slotted | Design::SlottedRaw | Design::Deferred
        )
    }

    /// Whether the design runs in `workload`. The `zipf` workload compares
    /// slot policies of this crate over many counters, so only `slotted`
    /// and `adaptive`; a single hot counter (the other workloads) has no
    /// cold counters for `adaptive` to keep narrow; `deferred` needs a
    /// transaction with work in it.
    pub fn applies_to(self, workload: Workload) -> bool {
        match (workload, self) {
            (Workload::Zipf, design) => matches!(design, Design::Slotted | Design::Adaptive),
            (_, Design::Adaptive) => false,
            (Workload::Autocommit, Design::Deferred) => false,
            _ => true,
        }
    }
}

/// `--slot-strategy` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// [`SlotStrategy::Rotating`], the crate's default.
    Rotating,
    /// [`SlotStrategy::Random`].
    Random,
    /// Rotating within the client's node's share of the slots: each
    /// client's handle carries `Writer::new(node, nodes)`, so clients of two
    /// nodes never write the same slot row (with one URL: `rotating`).
    Shares,
}

impl From<Strategy> for SlotStrategy {
    fn from(strategy: Strategy) -> Self {
        match strategy {
            Strategy::Rotating | Strategy::Shares => SlotStrategy::Rotating,
            Strategy::Random => SlotStrategy::Random,
        }
    }
}

/// `--zipf-s`: a finite exponent in 0..=10 (beyond 10 owner 1 takes
/// practically every draw).
fn parse_exponent(text: &str) -> Result<f64, String> {
    let s: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number"))?;
    if (0.0..=10.0).contains(&s) {
        Ok(s)
    } else {
        Err(format!("the exponent must be in 0..=10, not {s}"))
    }
}

macro_rules! display_as_value {
    ($($ty:ty),*) => {$(
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.to_possible_value() {
                    Some(value) => f.write_str(value.get_name()),
                    None => write!(f, "{self:?}"),
                }
            }
        }
    )*};
}
display_as_value!(Workload, Design, Strategy);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponents_are_checked() {
        assert_eq!(parse_exponent("1.1"), Ok(1.1));
        assert_eq!(parse_exponent("0"), Ok(0.0));
        for bad in ["-1", "11", "NaN", "inf", "x"] {
            assert!(parse_exponent(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_defaults_parse() {
        let args = Args::try_parse_from(["counter-bench"]).unwrap();
        assert_eq!(args.owners, 100_000);
        assert_eq!(args.zipf_s, 1.1);
        assert_eq!(
            (args.history_rounds, args.hot_owners, args.adaptive_max),
            (16, 10, 64)
        );
        assert!(args.designs.contains(&Design::Deferred));
        assert!(args.designs.contains(&Design::Adaptive));
        assert!(Args::try_parse_from(["counter-bench", "--owners", "999"]).is_err());
        assert!(Args::try_parse_from(["counter-bench", "--history-rounds", "65"]).is_err());
    }
}
