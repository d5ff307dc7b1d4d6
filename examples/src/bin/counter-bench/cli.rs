//! The command line: which cells to run and where to write the results.

use std::{fmt, path::PathBuf};

use clap::{Parser, ValueEnum};
use counter_core::SlotStrategy;

/// Measures slotted counters against a hot row, hand-written SQL, the
/// no-contention ceiling and the write-behind buffer, then batch reads
/// against a naive loop.
///
/// Every write cell runs its clients for a warm-up and then for
/// `--duration` seconds, and checks that the stored total equals the number
/// of increments that committed; a mismatch fails the run.
#[derive(Debug, Parser)]
#[command(name = "counter-bench", version)]
pub struct Args {
    /// Database to measure (default: a temporary SQLite file, removed at the end).
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,

    /// `autocommit`: each increment is its own statement. `business`: BEGIN;
    /// insert a child row; increment; application work; COMMIT.
    #[arg(long, value_delimiter = ',', default_value = "business")]
    pub workload: Vec<Workload>,

    /// Designs to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "hot_row,slotted,slotted_raw,uncontended,buffered"
    )]
    pub designs: Vec<Design>,

    /// The flush interval of the `buffered` design's `CounterBuffer`, in
    /// milliseconds: the lag between an increment and its visibility in the
    /// database is about half of it on average, plus the flush itself.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub buffer_interval_ms: u64,

    /// Slot counts for `slotted` and `slotted_raw` (the others have no slots).
    #[arg(long, value_delimiter = ',', default_value = "16,64")]
    pub slots: Vec<u16>,

    /// Concurrent clients, each with its own connection.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,64")]
    pub clients: Vec<usize>,

    /// How `slotted` and `slotted_raw` pick a slot; several to compare them.
    #[arg(long, value_delimiter = ',', default_value = "rotating")]
    pub slot_strategy: Vec<Strategy>,

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
}

impl Design {
    /// Whether the design spreads writes over slots (and so has a slot count
    /// and a strategy).
    pub fn slotted(self) -> bool {
        matches!(self, Design::Slotted | Design::SlottedRaw)
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
}

impl From<Strategy> for SlotStrategy {
    fn from(strategy: Strategy) -> Self {
        match strategy {
            Strategy::Rotating => SlotStrategy::Rotating,
            Strategy::Random => SlotStrategy::Random,
        }
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
