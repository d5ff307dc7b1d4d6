//! What the run prints and writes: a markdown table, the target ratios, JSON.

use std::fmt::Write as _;

use crate::{
    cli::{Design, Strategy, Workload},
    reads::ReadResult,
    writes::CellResult,
};

/// Everything one run measured, as written by `--json`.
#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub backend: String,
    pub cells: Vec<CellResult>,
    pub reads: Vec<ReadResult>,
}

impl Report {
    /// The write cells and the reads as markdown tables.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        if !self.cells.is_empty() {
            out.push_str("| workload | design | slots | strategy | clients | tx/s | rounds | p50 ms | p99 ms | expected | observed | errors | check |\n");
            out.push_str("|---|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---|\n");
            for c in &self.cells {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {:.0} | {} | {:.2} | {:.2} | {} | {} | {} | {} |",
                    c.workload,
                    c.design,
                    c.slots.map_or("-".into(), |s| s.to_string()),
                    c.slot_strategy.map_or("-".into(), |s| s.to_string()),
                    c.clients,
                    c.tx_per_s,
                    c.rounds
                        .iter()
                        .map(|r| format!("{r:.0}"))
                        .collect::<Vec<_>>()
                        .join(" "),
                    c.p50_ms,
                    c.p99_ms,
                    c.expected_total,
                    c.observed_total,
                    c.errors,
                    if c.total_ok { "ok" } else { "MISMATCH" },
                );
            }
        }
        if !self.reads.is_empty() {
            out.push_str("\n| read | owners | keys | ms (median) |\n|---|---:|---:|---:|\n");
            for r in &self.reads {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {:.2} |",
                    r.design, r.owners, r.keys, r.ms
                );
            }
        }
        out
    }

    /// The target ratios, for each workload and strategy, at the
    /// largest client count measured; only those whose cells ran.
    pub fn ratios(&self) -> String {
        let mut out = String::new();
        let Some(clients) = self.cells.iter().map(|c| c.clients).max() else {
            return self.read_ratios();
        };
        let mut workloads: Vec<Workload> = self.cells.iter().map(|c| c.workload).collect();
        workloads.sort();
        workloads.dedup();
        let mut strategies: Vec<Strategy> =
            self.cells.iter().filter_map(|c| c.slot_strategy).collect();
        strategies.sort();
        strategies.dedup();
        for workload in workloads {
            let tps = |design: Design, slots: Option<u16>, strategy: Option<Strategy>| {
                self.cells
                    .iter()
                    .find(|c| {
                        c.workload == workload
                            && c.clients == clients
                            && c.design == design
                            && c.slots == slots
                            && c.slot_strategy == strategy
                    })
                    .map(|c| c.tx_per_s)
            };
            for &strategy in &strategies {
                let s = Some(strategy);
                let lines = [
                    (
                        "slotted(16) / hot_row",
                        tps(Design::Slotted, Some(16), s),
                        tps(Design::HotRow, None, None),
                        ">= 10",
                    ),
                    (
                        "slotted(64) / uncontended",
                        tps(Design::Slotted, Some(64), s),
                        tps(Design::Uncontended, None, None),
                        ">= 0.9",
                    ),
                    (
                        "slotted(16) / slotted_raw(16)",
                        tps(Design::Slotted, Some(16), s),
                        tps(Design::SlottedRaw, Some(16), s),
                        ">= 0.9",
                    ),
                    (
                        "slotted_raw(64) / uncontended",
                        tps(Design::SlottedRaw, Some(64), s),
                        tps(Design::Uncontended, None, None),
                        "",
                    ),
                ];
                for (name, a, b, target) in lines {
                    if let (Some(a), Some(b)) = (a, b) {
                        let _ = writeln!(
                            out,
                            "{workload}, {clients} clients, {strategy}: {name} = {:.2} {target}",
                            a / b.max(f64::MIN_POSITIVE)
                        );
                    }
                }
            }
        }
        out + &self.read_ratios()
    }

    fn read_ratios(&self) -> String {
        let ms = |design: &str| self.reads.iter().find(|r| r.design == design).map(|r| r.ms);
        let mut out = String::new();
        if let (Some(batch), Some(naive), Some(raw)) =
            (ms("batch"), ms("naive_loop"), ms("raw_sql"))
        {
            let _ = writeln!(
                out,
                "reads: naive_loop / batch = {:.1}x faster (>= 30)",
                naive / batch
            );
            let _ = writeln!(out, "reads: batch / raw_sql = {:.2} (<= 1.3)", batch / raw);
        }
        out
    }
}
