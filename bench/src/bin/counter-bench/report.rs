//! What the run prints and writes: markdown tables, the target ratios, JSON.
//! The ratios are printed against their targets, never asserted: only the
//! total checks fail a run.

use std::fmt::Write as _;

use crate::{
    cli::{Design, Strategy, Workload},
    reads::ReadResult,
    writes::CellResult,
};

/// Milliseconds, with more digits below 0.1 ms (a buffered `add`).
fn ms(v: f64) -> String {
    if v > 0.0 && v < 0.1 {
        format!("{v:.4}")
    } else {
        format!("{v:.2}")
    }
}

/// Everything one run measured, as written by `--json`.
#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub backend: String,
    /// Database URLs the clients were spread over (1 unless a cluster).
    pub nodes: usize,
    pub cells: Vec<CellResult>,
    pub reads: Vec<ReadResult>,
}

impl Report {
    /// The write cells, the buffered and zipf cells' own figures and the
    /// reads as markdown tables. A `buffered` row's tx/s is increments
    /// accepted per second; in `autocommit` its p50/p99 time one `add` call
    /// (every 256th).
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        if !self.cells.is_empty() {
            out.push_str("| workload | design | slots | strategy | clients | tx/s | rounds | p50 ms | p99 ms | expected | observed | errors | check |\n");
            out.push_str("|---|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---|\n");
            for c in &self.cells {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
                    c.workload,
                    c.name,
                    c.slots.map_or("-".into(), |s| s.to_string()),
                    c.slot_strategy.map_or("-".into(), |s| s.to_string()),
                    c.clients,
                    c.tx_per_s,
                    c.rounds
                        .iter()
                        .map(|r| format!("{r:.0}"))
                        .collect::<Vec<_>>()
                        .join(" "),
                    ms(c.p50_ms),
                    ms(c.p99_ms),
                    c.expected_total,
                    c.observed_total,
                    c.errors,
                    if c.total_ok { "ok" } else { "MISMATCH" },
                );
            }
        }
        out += &self.buffered_table();
        out += &self.zipf_table();
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
    /// largest client count measured (for `zipf`, at every client count);
    /// only those whose cells ran.
    pub fn ratios(&self) -> String {
        let mut out = String::new();
        let Some(clients) = self.cells.iter().map(|c| c.clients).max() else {
            return self.read_ratios();
        };
        let mut workloads: Vec<Workload> = self
            .cells
            .iter()
            .map(|c| c.workload)
            .filter(|&w| w != Workload::Zipf)
            .collect();
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
                // (name, over, under, the least it should be)
                let lines = [
                    (
                        "slotted(16) / hot_row",
                        tps(Design::Slotted, Some(16), s),
                        tps(Design::HotRow, None, None),
                        Some(10.0),
                    ),
                    (
                        "deferred(16) / hot_row",
                        tps(Design::Deferred, Some(16), s),
                        tps(Design::HotRow, None, None),
                        Some(10.0),
                    ),
                    (
                        "slotted(64) / uncontended",
                        tps(Design::Slotted, Some(64), s),
                        tps(Design::Uncontended, None, None),
                        Some(0.9),
                    ),
                    (
                        "slotted(16) / slotted_raw(16)",
                        tps(Design::Slotted, Some(16), s),
                        tps(Design::SlottedRaw, Some(16), s),
                        Some(0.9),
                    ),
                    (
                        "slotted(64) / slotted_raw(64)",
                        tps(Design::Slotted, Some(64), s),
                        tps(Design::SlottedRaw, Some(64), s),
                        Some(0.9),
                    ),
                    (
                        "slotted_raw(64) / uncontended",
                        tps(Design::SlottedRaw, Some(64), s),
                        tps(Design::Uncontended, None, None),
                        None,
                    ),
                ];
                for (name, a, b, least) in lines {
                    if let (Some(a), Some(b)) = (a, b) {
                        let ratio = a / b.max(f64::MIN_POSITIVE);
                        let target = least.map_or(String::new(), |least| {
                            let verdict = if ratio >= least { "met" } else { "missed" };
                            format!(" (target >= {least}, {verdict})")
                        });
                        let _ = writeln!(
                            out,
                            "{workload}, {clients} clients, {strategy}: {name} = {ratio:.2}{target}"
                        );
                    }
                }
            }
        }
        out + &self.buffered_ratios(clients) + &self.zipf_ratios() + &self.read_ratios()
    }

    /// The `zipf` cells: hot and overall throughput, rows per cold
    /// counter, cold reads, and the totals.
    fn zipf_table(&self) -> String {
        let mut out = String::new();
        let cells: Vec<_> = self
            .cells
            .iter()
            .filter_map(|c| Some((c, c.zipf.as_ref()?)))
            .collect();
        let Some((_, first)) = cells.first() else {
            return out;
        };
        let _ = writeln!(
            out,
            "\n{} owners, s = {}, {} history rounds, hot = owners 1..={}:\n",
            first.owners, first.zipf_s, first.history_rounds, first.hot_owners
        );
        out.push_str(
            "| zipf | strategy | clients | hot tx/s | all tx/s | rows per cold counter \
             | cold read ms | history | expected | observed | check |\n",
        );
        out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
        for (c, z) in cells {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.0} | {:.0} | {:.2} | {} | {} | {} | {} | {} |",
                c.name,
                c.slot_strategy.map_or("-".into(), |s| s.to_string()),
                c.clients,
                z.hot_tx_per_s,
                c.tx_per_s,
                z.rows_per_cold_counter,
                ms(z.cold_read_ms),
                z.history_total,
                c.expected_total,
                c.observed_total,
                if c.total_ok { "ok" } else { "MISMATCH" },
            );
        }
        out
    }

    /// Per strategy and client count: adaptive slots against fixed ones,
    /// against the targets (at least 0.95x fixed64's hot throughput, at
    /// most 1.5 rows per cold counter, cold reads at least 2x faster than
    /// fixed16's).
    fn zipf_ratios(&self) -> String {
        let mut out = String::new();
        let mut runs: Vec<(Option<Strategy>, usize)> = self
            .cells
            .iter()
            .filter(|c| c.zipf.is_some())
            .map(|c| (c.slot_strategy, c.clients))
            .collect();
        runs.sort();
        runs.dedup();
        for (strategy, clients) in runs {
            let find = |name: &str| {
                self.cells.iter().find(|c| {
                    c.zipf.is_some()
                        && c.name == name
                        && c.slot_strategy == strategy
                        && c.clients == clients
                })
            };
            let Some(adaptive) = find("adaptive") else {
                continue;
            };
            let Some(a) = &adaptive.zipf else { continue };
            let at = format!(
                "zipf, {clients} clients, {}",
                strategy.map_or("-".into(), |s| s.to_string())
            );
            let verdict = |met: bool| if met { "met" } else { "missed" };
            if let Some(f) = find("fixed64").and_then(|c| c.zipf.as_ref()) {
                let ratio = a.hot_tx_per_s / f.hot_tx_per_s.max(f64::MIN_POSITIVE);
                let _ = writeln!(
                    out,
                    "{at}: adaptive / fixed64 hot tx/s = {ratio:.2} ({:.0} / {:.0}; target >= 0.95 {})",
                    a.hot_tx_per_s,
                    f.hot_tx_per_s,
                    verdict(ratio >= 0.95)
                );
            }
            let _ = writeln!(
                out,
                "{at}: adaptive rows per cold counter = {:.2} (target <= 1.5 {})",
                a.rows_per_cold_counter,
                verdict(a.rows_per_cold_counter <= 1.5)
            );
            if let Some(f) = find("fixed16").and_then(|c| c.zipf.as_ref()) {
                let ratio = f.cold_read_ms / a.cold_read_ms.max(f64::MIN_POSITIVE);
                let _ = writeln!(
                    out,
                    "{at}: fixed16 / adaptive cold read ms = {ratio:.2} ({} / {} ms; target >= 2 {})",
                    ms(f.cold_read_ms),
                    ms(a.cold_read_ms),
                    verdict(ratio >= 2.0)
                );
            }
        }
        out
    }

    /// The `buffered` cells: statements sent and lag until visible.
    fn buffered_table(&self) -> String {
        let mut out = String::new();
        let cells: Vec<_> = self
            .cells
            .iter()
            .filter_map(|c| Some((c, c.buffered.as_ref()?)))
            .collect();
        if cells.is_empty() {
            return out;
        }
        out.push_str(
            "\n| buffered | clients | interval ms | increments/s accepted | adds | flushes \
             | statements (callback + BEGIN/COMMIT) | per 100k increments \
             | BufferStats::statements | per 100k | lag p50 ms | lag p99 ms | lag max ms | lag samples |\n",
        );
        out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for (c, b) in cells {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.0} | {} | {} | {} ({} + {}) | {:.1} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
                c.workload,
                c.clients,
                b.interval_ms,
                c.tx_per_s,
                b.adds,
                b.flushes,
                b.statements,
                b.callback_statements,
                b.statements - b.callback_statements,
                b.statements_per_100k,
                b.buffer_statements,
                b.buffer_statements_per_100k,
                b.lag_p50_ms,
                b.lag_p99_ms,
                b.lag_max_ms,
                b.lag_samples,
            );
        }
        out
    }

    /// `buffered` against `slotted` at the same clients (the largest count
    /// measured), per workload, strategy and slot count, and the buffer's
    /// statements and lag. The targets are the autocommit ones: in
    /// `business` both designs are bounded by the child-row transaction.
    fn buffered_ratios(&self, clients: usize) -> String {
        let mut out = String::new();
        for b in self
            .cells
            .iter()
            .filter(|c| c.design == Design::Buffered && c.clients == clients)
        {
            let autocommit = b.workload == Workload::Autocommit;
            for s in self.cells.iter().filter(|c| {
                c.design == Design::Slotted && c.workload == b.workload && c.clients == clients
            }) {
                let _ = writeln!(
                    out,
                    "{}, {clients} clients, {}: buffered / slotted({}) = {:.1} ({:.0} / {:.0} increments/s){}",
                    b.workload,
                    s.slot_strategy.map_or("-".into(), |s| s.to_string()),
                    s.slots.unwrap_or(1),
                    b.tx_per_s / s.tx_per_s.max(f64::MIN_POSITIVE),
                    b.tx_per_s,
                    s.tx_per_s,
                    if autocommit { " >= 50" } else { "" },
                );
            }
            if let Some(f) = &b.buffered {
                let _ = writeln!(
                    out,
                    "{}, {clients} clients: buffered sent {:.1} statements per 100,000 increments{} \
                     (BufferStats: {:.1}); lag p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms at a {} ms interval",
                    b.workload,
                    f.statements_per_100k,
                    if autocommit { " (<= 100)" } else { "" },
                    f.buffer_statements_per_100k,
                    f.lag_p50_ms,
                    f.lag_p99_ms,
                    f.lag_max_ms,
                    f.interval_ms,
                );
            }
        }
        out
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{buffered::BufferedFigures, grid::label, zipf::ZipfFigures};

    fn cell(design: Design, slots: Option<u16>, tx_per_s: f64) -> CellResult {
        CellResult {
            workload: Workload::Autocommit,
            design,
            name: label(Workload::Autocommit, design, slots),
            slots,
            slot_strategy: slots.map(|_| Strategy::Rotating),
            clients: 64,
            tx_per_s,
            rounds: vec![tx_per_s],
            p50_ms: 0.0001,
            p99_ms: 2.0,
            expected_total: 1,
            observed_total: 1,
            observed_children: None,
            errors: 0,
            last_error: None,
            total_ok: true,
            nodes_agreed: None,
            zipf: None,
            buffered: (design == Design::Buffered).then_some(BufferedFigures {
                interval_ms: 100,
                adds: 1_000_000,
                flushes: 10,
                failed_attempts: 0,
                callback_statements: 23,
                statements: 43,
                buffer_statements: 40,
                statements_per_100k: 4.3,
                buffer_statements_per_100k: 4.0,
                lag_samples: 100,
                lag_p50_ms: 55.0,
                lag_p99_ms: 120.0,
                lag_max_ms: 130.0,
                probe_adds: 100,
                probe_stored: 100,
            }),
        }
    }

    #[test]
    fn buffered_cells_get_their_table_and_ratio_to_slotted() {
        let report = Report {
            backend: "postgres".into(),
            nodes: 1,
            cells: vec![
                cell(Design::Slotted, Some(64), 4000.0),
                cell(Design::Buffered, None, 400_000.0),
            ],
            reads: Vec::new(),
        };
        let table = report.markdown();
        assert!(
            table
                .contains("| autocommit | 64 | 100 | 400000 | 1000000 | 10 | 43 (23 + 20) | 4.3 |"),
            "{table}"
        );
        assert!(table.contains("| 0.0001 | 2.00 |"), "{table}");
        let ratios = report.ratios();
        assert!(
            ratios.contains("buffered / slotted(64) = 100.0"),
            "{ratios}"
        );
        assert!(
            ratios.contains("4.3 statements per 100,000 increments"),
            "{ratios}"
        );
    }

    fn zipf_cell(design: Design, slots: u16, hot: f64, rows: f64, read_ms: f64) -> CellResult {
        let mut c = cell(design, Some(slots), 1000.0);
        c.workload = Workload::Zipf;
        c.name = label(Workload::Zipf, design, Some(slots));
        c.clients = 8;
        c.zipf = Some(ZipfFigures {
            owners: 5000,
            zipf_s: 1.1,
            hot_owners: 10,
            history_rounds: 4,
            history_total: 20_000,
            hot_tx_per_s: hot,
            rows_per_cold_counter: rows,
            cold_read_ms: read_ms,
            cold_read_owners: 1000,
        });
        c
    }

    #[test]
    fn zipf_cells_get_their_table_and_targets() {
        let report = Report {
            backend: "mysql".into(),
            nodes: 3,
            cells: vec![
                zipf_cell(Design::Slotted, 16, 300.0, 4.0, 6.0),
                zipf_cell(Design::Slotted, 64, 400.0, 4.0, 6.5),
                zipf_cell(Design::Adaptive, 64, 396.0, 1.0, 2.0),
            ],
            reads: Vec::new(),
        };
        let table = report.markdown();
        assert!(
            table.contains("| fixed16 | rotating | 8 | 300 | 1000 | 4.00 | 6.00 | 20000 |"),
            "{table}"
        );
        assert!(
            table.contains("| adaptive | rotating | 8 | 396 |"),
            "{table}"
        );
        let ratios = report.ratios();
        for line in [
            "zipf, 8 clients, rotating: adaptive / fixed64 hot tx/s = 0.99 (396 / 400; target >= 0.95 met)",
            "zipf, 8 clients, rotating: adaptive rows per cold counter = 1.00 (target <= 1.5 met)",
            "zipf, 8 clients, rotating: fixed16 / adaptive cold read ms = 3.00 (6.00 / 2.00 ms; target >= 2 met)",
        ] {
            assert!(ratios.contains(line), "{ratios}");
        }
        assert!(!ratios.contains("hot_row"), "{ratios}");

        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["nodes"], 3);
        let cell = &json["cells"][2];
        assert_eq!(cell["workload"], "zipf");
        assert_eq!(cell["design"], "adaptive");
        assert_eq!(cell["hot_tx_per_s"], 396.0);
        assert_eq!(cell["rows_per_cold_counter"], 1.0);
        assert!(cell.get("nodes_agreed").is_none() && cell.get("buffered").is_none());
        assert_eq!(json["cells"][0]["design"], "fixed16");
    }

    #[test]
    fn deferred_is_compared_with_the_hot_row() {
        let mut hot = cell(Design::HotRow, None, 100.0);
        let mut deferred = cell(Design::Deferred, Some(16), 1500.0);
        hot.workload = Workload::Business;
        deferred.workload = Workload::Business;
        let report = Report {
            backend: "mysql".into(),
            nodes: 1,
            cells: vec![hot, deferred],
            reads: Vec::new(),
        };
        let ratios = report.ratios();
        assert!(
            ratios.contains(
                "business, 64 clients, rotating: deferred(16) / hot_row = 15.00 (target >= 10, met)"
            ),
            "{ratios}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["cells"][1]["design"], "deferred");
        assert!(json["cells"][1].get("hot_tx_per_s").is_none());
    }
}
