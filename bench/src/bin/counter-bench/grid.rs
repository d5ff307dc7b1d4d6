//! The cells a run measures, and their names.

use crate::{
    cli::{Args, Design, Workload},
    writes::Cell,
};

/// Every (workload, clients, design, slots, strategy) cell asked for, and a
/// note per workload naming the designs that do not apply to it (see
/// [`Design::applies_to`]). Designs with fixed slots run once per slot
/// count and strategy, `adaptive` once per strategy (its slots are the
/// `--adaptive-max` ceiling), the others once per client count.
pub fn grid(args: &Args) -> (Vec<Cell>, Vec<String>) {
    let mut cells = Vec::new();
    let mut notes = Vec::new();
    for &workload in &args.workload {
        let skipped: Vec<String> = args
            .designs
            .iter()
            .filter(|d| !d.applies_to(workload))
            .map(ToString::to_string)
            .collect();
        if !skipped.is_empty() {
            notes.push(format!(
                "note: {workload} skips {} (not applicable there)",
                skipped.join(", ")
            ));
        }
        for &clients in &args.clients {
            for &design in args.designs.iter().filter(|d| d.applies_to(workload)) {
                let slot_counts: Vec<Option<u16>> = if design.slotted() {
                    args.slots.iter().copied().map(Some).collect()
                } else if design == Design::Adaptive {
                    vec![Some(args.adaptive_max)]
                } else {
                    vec![None]
                };
                for slots in slot_counts {
                    if slots.is_none() {
                        cells.push(Cell {
                            workload,
                            design,
                            slots,
                            strategy: None,
                            clients,
                        });
                        continue;
                    }
                    for &strategy in &args.slot_strategy {
                        cells.push(Cell {
                            workload,
                            design,
                            slots,
                            strategy: Some(strategy),
                            clients,
                        });
                    }
                }
            }
        }
    }
    (cells, notes)
}

/// A cell's design as reported: in `zipf`, where the designs compare slot
/// policies, `fixed<slots>` for `slotted` (`fixed16`, `fixed64`) and
/// `adaptive`; elsewhere the design's own name.
pub fn label(workload: Workload, design: Design, slots: Option<u16>) -> String {
    match (workload, design, slots) {
        (Workload::Zipf, Design::Slotted, Some(slots)) => format!("fixed{slots}"),
        _ => design.to_string(),
    }
}

/// The progress bar's line for a cell.
pub fn describe(cell: &Cell) -> String {
    let name = label(cell.workload, cell.design, cell.slots);
    let mut text = format!("{} {name} x{}", cell.workload, cell.clients);
    match (cell.design, cell.slots, cell.strategy) {
        (Design::Adaptive, Some(max), Some(strategy)) => {
            text += &format!(" (1..={max} slots, {strategy})");
        }
        (_, Some(slots), Some(strategy)) => text += &format!(" ({slots} slots, {strategy})"),
        _ => {}
    }
    if cell.design == Design::Buffered {
        text += " (flushing every --buffer-interval-ms)";
    }
    text
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::Strategy;

    fn args(extra: &[&str]) -> Args {
        Args::try_parse_from(["counter-bench"].iter().chain(extra)).unwrap()
    }

    #[test]
    fn every_workload_runs_only_its_designs() {
        let (cells, notes) = grid(&args(&[
            "--workload",
            "autocommit,business,zipf",
            "--clients",
            "8",
            "--slots",
            "16,64",
        ]));
        let names = |workload: Workload| -> Vec<String> {
            cells
                .iter()
                .filter(|c| c.workload == workload)
                .map(|c| label(c.workload, c.design, c.slots))
                .collect()
        };
        assert_eq!(
            names(Workload::Autocommit),
            [
                "hot_row",
                "slotted",
                "slotted",
                "slotted_raw",
                "slotted_raw",
                "uncontended",
                "buffered"
            ]
        );
        assert_eq!(
            names(Workload::Business),
            [
                "hot_row",
                "slotted",
                "slotted",
                "slotted_raw",
                "slotted_raw",
                "uncontended",
                "buffered",
                "deferred",
                "deferred"
            ]
        );
        assert_eq!(names(Workload::Zipf), ["fixed16", "fixed64", "adaptive"]);
        assert_eq!(
            notes,
            [
                "note: autocommit skips deferred, adaptive (not applicable there)",
                "note: business skips adaptive (not applicable there)",
                "note: zipf skips hot_row, slotted_raw, uncontended, buffered, deferred (not applicable there)",
            ]
        );
    }

    #[test]
    fn adaptive_cells_carry_their_ceiling_and_every_strategy() {
        let (cells, notes) = grid(&args(&[
            "--workload",
            "zipf",
            "--designs",
            "adaptive",
            "--adaptive-max",
            "32",
            "--slot-strategy",
            "rotating,shares",
            "--clients",
            "1,8",
        ]));
        assert!(notes.is_empty());
        assert_eq!(cells.len(), 4);
        assert!(cells.iter().all(|c| c.slots == Some(32)));
        assert_eq!(cells[1].strategy, Some(Strategy::Shares));
        assert_eq!(
            describe(&cells[0]),
            "zipf adaptive x1 (1..=32 slots, rotating)"
        );
    }

    #[test]
    fn cells_are_named_by_slots_only_in_zipf() {
        assert_eq!(label(Workload::Zipf, Design::Slotted, Some(16)), "fixed16");
        assert_eq!(
            label(Workload::Zipf, Design::Adaptive, Some(64)),
            "adaptive"
        );
        assert_eq!(
            label(Workload::Business, Design::Slotted, Some(16)),
            "slotted"
        );
        assert_eq!(
            label(Workload::Business, Design::Deferred, Some(16)),
            "deferred"
        );
        assert_eq!(label(Workload::Autocommit, Design::HotRow, None), "hot_row");
    }

    #[test]
    fn a_workload_without_applicable_designs_has_no_cells() {
        let (cells, notes) = grid(&args(&["--workload", "zipf", "--designs", "hot_row"]));
        assert!(cells.is_empty());
        assert_eq!(notes.len(), 1);
    }
}
