//! `counter-bench`'s tables: the business-workload grid and its target
//! ratios (`{postgres,mariadb}-grid.json`), slot strategies
//! (`-strategy.json`), the quiet rerun with `deferred` (`-business.json`),
//! Zipf counters with fixed and adaptive slots (`-zipf.json`), the Galera
//! cluster (`galera-hot.json`), and buffered writes on all three backends
//! (`{postgres,mariadb,sqlite}-buffered.json`).
//!
//! Also what `readme` reads from the same runs: a cell of a run
//! ([`cell`], [`tx`]) and the target ratios ([`ratio`]).

use std::path::Path;

use serde_json::Value;

use crate::{
    BoxError, Generator,
    render::{BACKENDS, Column, Figure, against, columns, field, load, number},
};

pub(crate) const TABLES: &[(&str, Generator)] = &[
    ("counter-grid", grid),
    ("counter-ratios", ratios),
    ("counter-strategy", strategy),
    ("counter-business", business),
    ("counter-zipf", zipf),
    ("counter-galera", galera),
    ("counter-buffered", buffered),
];

/// The runs of `bench` (e.g. `grid` for `postgres-grid.json`) on
/// PostgreSQL and MariaDB, each column headed by its backend and `suffix`.
fn backends(bench: &Path, name: &str, suffix: &str) -> Result<Vec<Column>, BoxError> {
    BACKENDS
        .iter()
        .map(|(label, file)| {
            Ok((
                format!("{label}{suffix}"),
                load(bench, &format!("{file}-{name}"))?,
            ))
        })
        .collect()
}

/// The largest client count a run measured.
fn top_clients(run: &Value) -> Option<u64> {
    run["cells"]
        .as_array()?
        .iter()
        .filter_map(|c| c["clients"].as_u64())
        .max()
}

/// The cell of `design` (its JSON name: `slotted`, `fixed16`, ...) with
/// `slots` and `strategy` (`None`: a design without slots), at the run's
/// largest client count.
pub(crate) fn cell<'a>(
    run: &'a Value,
    design: &str,
    slots: Option<u64>,
    strategy: Option<&str>,
) -> Option<&'a Value> {
    let clients = top_clients(run)?;
    run["cells"].as_array()?.iter().find(|c| {
        c["design"].as_str() == Some(design)
            && c["slots"].as_u64() == slots
            && c["slot_strategy"].as_str() == strategy
            && c["clients"].as_u64() == Some(clients)
    })
}

/// The transactions a second of a cell (see [`cell`]).
pub(crate) fn tx(
    run: &Value,
    design: &str,
    slots: Option<u64>,
    strategy: Option<&str>,
) -> Option<f64> {
    cell(run, design, slots, strategy)?["tx_per_s"].as_f64()
}

/// The rotating strategy's cells, as the bench's target ratios use them.
const ROTATING: Option<&str> = Some("rotating");

/// The bench's target ratios at the largest client count, rotating slots.
#[derive(Clone, Copy)]
pub(crate) enum Ratio {
    /// slotted (16) / hot_row: target at least 10.
    SlottedVsHot,
    /// slotted (64) / uncontended: target at least 0.9.
    SlottedVsCeiling,
    /// slotted / slotted_raw at the same slot count (16 or 64), the crate's
    /// overhead: at least 0.9.
    CrateVsRaw(u64),
    /// deferred (16) / hot_row: no target.
    DeferredVsHot,
}

/// A [`Ratio`] of a run, and whether it meets its target.
pub(crate) fn ratio(run: &Value, which: Ratio) -> Option<(f64, bool)> {
    let (over, under, target) = match which {
        Ratio::SlottedVsHot => (
            tx(run, "slotted", Some(16), ROTATING)?,
            tx(run, "hot_row", None, None)?,
            10.0,
        ),
        Ratio::SlottedVsCeiling => (
            tx(run, "slotted", Some(64), ROTATING)?,
            tx(run, "uncontended", None, None)?,
            0.9,
        ),
        Ratio::CrateVsRaw(slots) => (
            tx(run, "slotted", Some(slots), ROTATING)?,
            tx(run, "slotted_raw", Some(slots), ROTATING)?,
            0.9,
        ),
        Ratio::DeferredVsHot => (
            tx(run, "deferred", Some(16), ROTATING)?,
            tx(run, "hot_row", None, None)?,
            0.0,
        ),
    };
    let value = over / under;
    Some((value, value >= target))
}

/// The median milliseconds of a run's batch read `design` (`batch`,
/// `naive_loop`, `raw_sql`).
pub(crate) fn read_ms(run: &Value, design: &str) -> Option<f64> {
    run["reads"]
        .as_array()?
        .iter()
        .find(|r| r["design"].as_str() == Some(design))?["ms"]
        .as_f64()
}

/// Label cells from text.
fn labels<const N: usize>(texts: [&str; N]) -> Vec<String> {
    texts.iter().map(|t| (*t).to_owned()).collect()
}

/// A cell's transactions a second, as a whole number.
fn rate(design: &'static str, slots: Option<u64>, strategy: Option<&'static str>) -> Figure {
    Box::new(move |run| Some(number(tx(run, design, slots, strategy)?, 0)))
}

/// A [`Ratio`] against its target, with `decimals`.
fn target(which: Ratio, decimals: usize) -> Figure {
    Box::new(move |run| {
        let (value, met) = ratio(run, which)?;
        Some(against(number(value, decimals), met))
    })
}

/// The headline: the business workload's designs at 64 clients.
fn grid(bench: &Path) -> Result<String, BoxError> {
    let runs = backends(bench, "grid", " tx/s")?;
    let rows: Vec<(Vec<String>, Figure)> = vec![
        (
            labels(["`hot_row`: `UPDATE posts SET likes = likes + 1`"]),
            rate("hot_row", None, None),
        ),
        (
            labels(["`slotted`, 16 slots"]),
            rate("slotted", Some(16), ROTATING),
        ),
        (
            labels(["`slotted`, 64 slots"]),
            rate("slotted", Some(64), ROTATING),
        ),
        (
            labels(["`slotted_raw` (the same upsert by hand), 16 slots"]),
            rate("slotted_raw", Some(16), ROTATING),
        ),
        (
            labels(["`uncontended` (every client its own post: the ceiling)"]),
            rate("uncontended", None, None),
        ),
    ];
    let clients = runs.iter().find_map(|(_, run)| top_clients(run.as_ref()?));
    let head = format!(
        "design ({} clients)",
        clients.map_or("n/a".into(), |c| c.to_string())
    );
    Ok(columns(&[&head], &runs, &rows))
}

/// The grid's target ratios, and the batch reads against theirs.
fn ratios(bench: &Path) -> Result<String, BoxError> {
    let runs = backends(bench, "grid", "")?;
    let naive: Figure = Box::new(|run| {
        let (naive, batch) = (read_ms(run, "naive_loop")?, read_ms(run, "batch")?);
        Some(against(
            format!(
                "{}x ({} / {} ms)",
                number(naive / batch, 0),
                number(naive, 0),
                number(batch, 1)
            ),
            naive / batch >= 30.0,
        ))
    });
    let raw: Figure = Box::new(|run| {
        let (batch, raw) = (read_ms(run, "batch")?, read_ms(run, "raw_sql")?);
        Some(against(
            format!(
                "{} ({} / {} ms)",
                number(batch / raw, 2),
                number(batch, 1),
                number(raw, 1)
            ),
            batch / raw <= 1.3,
        ))
    });
    let rows: Vec<(Vec<String>, Figure)> = vec![
        (
            labels(["slotted (16) / hot_row", ">= 10"]),
            target(Ratio::SlottedVsHot, 1),
        ),
        (
            labels(["slotted (64) / uncontended", ">= 0.9"]),
            target(Ratio::SlottedVsCeiling, 2),
        ),
        (
            labels([
                "slotted (16) / slotted_raw (16): the crate's overhead",
                ">= 0.9",
            ]),
            target(Ratio::CrateVsRaw(16), 2),
        ),
        (
            labels(["slotted (64) / slotted_raw (64)", ">= 0.9"]),
            target(Ratio::CrateVsRaw(64), 2),
        ),
        (
            labels([
                "batch read, 1,000 owners x 4 keys x 16 slots: naive loop / crate",
                ">= 30",
            ]),
            naive,
        ),
        (
            labels(["batch read: crate / hand-written SQL", "<= 1.3"]),
            raw,
        ),
    ];
    Ok(columns(&["ratio", "target"], &runs, &rows))
}

/// Rotating against random slots: slotted (64) / uncontended.
fn strategy(bench: &Path) -> Result<String, BoxError> {
    let runs = backends(bench, "strategy", "")?;
    let of = |strategy: &'static str| -> Figure {
        Box::new(move |run| {
            let slotted = tx(run, "slotted", Some(64), Some(strategy))?;
            Some(number(slotted / tx(run, "uncontended", None, None)?, 2))
        })
    };
    let rows: Vec<(Vec<String>, Figure)> = vec![
        (labels(["`Rotating` (default)"]), of("rotating")),
        (labels(["`Random`"]), of("random")),
    ];
    Ok(columns(
        &["64 clients, 64 slots, / uncontended"],
        &runs,
        &rows,
    ))
}

/// The quiet rerun: hot row, slotted, the same upsert by hand and deferred,
/// with p99.
fn business(bench: &Path) -> Result<String, BoxError> {
    let runs = backends(bench, "business", "")?;
    let with_p99 = |design: &'static str, slots: u64| -> Figure {
        Box::new(move |run| {
            let cell = cell(run, design, Some(slots), ROTATING)?;
            Some(format!(
                "{}, {} ms",
                number(cell["tx_per_s"].as_f64()?, 0),
                number(cell["p99_ms"].as_f64()?, 0)
            ))
        })
    };
    let rows: Vec<(Vec<String>, Figure)> = vec![
        (labels(["`hot_row`, tx/s"]), rate("hot_row", None, None)),
        (
            labels(["`slotted` (16), tx/s, p99"]),
            with_p99("slotted", 16),
        ),
        (
            labels(["`slotted_raw` (16), tx/s, p99"]),
            with_p99("slotted_raw", 16),
        ),
        (
            labels(["`slotted` (64), tx/s, p99"]),
            with_p99("slotted", 64),
        ),
        (
            labels(["`slotted_raw` (64), tx/s, p99"]),
            with_p99("slotted_raw", 64),
        ),
        (
            labels(["`deferred` (16), tx/s, p99"]),
            with_p99("deferred", 16),
        ),
        (
            labels(["slotted (16) / hot_row (target >= 10)"]),
            target(Ratio::SlottedVsHot, 2),
        ),
        (
            labels(["deferred (16) / hot_row"]),
            target(Ratio::DeferredVsHot, 2),
        ),
        (
            labels(["slotted (16) / slotted_raw (16) (target >= 0.9)"]),
            target(Ratio::CrateVsRaw(16), 2),
        ),
        (
            labels(["slotted (64) / slotted_raw (64) (target >= 0.9)"]),
            target(Ratio::CrateVsRaw(64), 2),
        ),
    ];
    Ok(columns(&["64 clients, business"], &runs, &rows))
}

/// Zipf counters: fixed 16, fixed 64 and adaptive slots.
fn zipf(bench: &Path) -> Result<String, BoxError> {
    let runs = backends(bench, "zipf", "")?;
    let of = |run: &Value, design: &str, name: &str| -> Option<f64> {
        run["cells"]
            .as_array()?
            .iter()
            .find(|c| c["design"].as_str() == Some(design))?[name]
            .as_f64()
    };
    let designs = ["fixed16", "fixed64", "adaptive"];
    let hot: Figure = Box::new(move |run| {
        let all: Option<Vec<String>> = designs
            .iter()
            .map(|d| Some(number(of(run, d, "hot_tx_per_s")?, 0)))
            .collect();
        Some(all?.join(" / "))
    });
    let hot_ratio: Figure = Box::new(move |run| {
        let value = of(run, "adaptive", "hot_tx_per_s")? / of(run, "fixed64", "hot_tx_per_s")?;
        Some(against(number(value, 2), value >= 0.95))
    });
    let rows_per: Figure = Box::new(move |run| {
        let fixed = [
            number(of(run, "fixed16", "rows_per_cold_counter")?, 2),
            number(of(run, "fixed64", "rows_per_cold_counter")?, 2),
        ];
        let adaptive = of(run, "adaptive", "rows_per_cold_counter")?;
        Some(format!(
            "{} / {}",
            fixed.join(" / "),
            against(number(adaptive, 2), adaptive <= 1.5)
        ))
    });
    let read: Figure = Box::new(move |run| {
        Some(format!(
            "{} / {} ms",
            number(of(run, "fixed16", "cold_read_ms")?, 1),
            number(of(run, "adaptive", "cold_read_ms")?, 1)
        ))
    });
    let read_ratio: Figure = Box::new(move |run| {
        let value = of(run, "fixed16", "cold_read_ms")? / of(run, "adaptive", "cold_read_ms")?;
        Some(against(number(value, 2), value >= 2.0))
    });
    // The sizes in the labels, from the first committed run.
    let first = runs.iter().find_map(|(_, run)| run.as_ref());
    let size = |name: &str| {
        first
            .and_then(|run| of(run, "adaptive", name))
            .map_or("n/a".into(), |v| number(v, 0))
    };
    let (hot_owners, read_owners) = (size("hot_owners"), size("cold_read_owners"));
    let head = format!(
        "{} clients, {} counters",
        first
            .and_then(top_clients)
            .map_or("n/a".into(), |c| c.to_string()),
        size("owners")
    );
    let rows: Vec<(Vec<String>, Figure)> = vec![
        (
            vec![format!(
                "hot owners (1 to {hot_owners}), increments/s: fixed 16 / fixed 64 / adaptive"
            )],
            hot,
        ),
        (
            labels(["adaptive / fixed 64 on the hot owners (target >= 0.95)"]),
            hot_ratio,
        ),
        (
            labels(["slot rows per cold counter: fixed 16 / fixed 64 / adaptive (target <= 1.5)"]),
            rows_per,
        ),
        (
            vec![format!(
                "batch read of {read_owners} cold owners: fixed 16 / adaptive"
            )],
            read,
        ),
        (
            labels(["fixed 16 / adaptive read time (target >= 2)"]),
            read_ratio,
        ),
    ];
    Ok(columns(&[&head], &runs, &rows))
}

/// The Galera cluster: one row per design, its rate, errors, p99 and
/// ratio to the hot row.
fn galera(bench: &Path) -> Result<String, BoxError> {
    let run = load(bench, "galera-hot")?;
    let run = run.as_ref();
    let nodes = run.and_then(|r| r["nodes"].as_u64());
    let clients = run.and_then(top_clients);
    let rounds = run
        .and_then(|r| cell(r, "hot_row", None, None))
        .and_then(|c| c["rounds"].as_array())
        .map(Vec::len);
    let text = |v: Option<u64>| v.map_or("n/a".into(), |v| v.to_string());
    let mut out = format!(
        "| {} clients on {} nodes, one counter | tx/s | errors ({} rounds) | p99 ms | vs hot row |\n|---|---:|---:|---:|---:|\n",
        text(clients),
        text(nodes),
        text(rounds.map(|r| r as u64)),
    );
    let hot = run.and_then(|r| tx(r, "hot_row", None, None));
    let designs = [
        ("`hot_row`", "hot_row", None, None, None),
        (
            "slotted, `random`",
            "slotted",
            Some(64),
            Some("random"),
            Some(10.0),
        ),
        (
            "slotted, `rotating` (per process)",
            "slotted",
            Some(64),
            ROTATING,
            None,
        ),
        (
            "slotted, `shares` (`Writer` per node)",
            "slotted",
            Some(64),
            Some("shares"),
            None,
        ),
    ];
    let na = || "n/a".to_owned();
    for (label, design, slots, strategy, goal) in designs {
        let cell = run.and_then(|r| cell(r, design, slots, strategy));
        let get = |name: &str| cell.and_then(|c| c[name].as_f64());
        let versus = get("tx_per_s").zip(hot).map(|(t, h)| t / h);
        let versus = match (versus, goal) {
            (None, _) => na(),
            (Some(_), _) if design == "hot_row" => "1".into(),
            (Some(v), Some(goal)) => against(
                format!("{} (target >= {})", number(v, 1), number(goal, 0)),
                v >= goal,
            ),
            (Some(v), None) => number(v, 1),
        };
        out.push_str(&format!(
            "| {label} | {} | {} | {} | {versus} |\n",
            get("tx_per_s").map_or_else(na, |v| number(v, 0)),
            get("errors").map_or_else(na, |v| number(v, 0)),
            get("p99_ms").map_or_else(na, |v| number(v, 0)),
        ));
    }
    let shares = run
        .and_then(|r| tx(r, "slotted", Some(64), Some("shares")))
        .zip(run.and_then(|r| tx(r, "slotted", Some(64), Some("random"))))
        .map(|(s, r)| s / r);
    out.push_str(&format!(
        "| shares / random (target >= 1.2) | | | | {} |\n",
        shares.map_or_else(na, |v| against(number(v, 2), v >= 1.2))
    ));
    Ok(out)
}

/// Buffered writes against slotted ones, on all three backends.
fn buffered(bench: &Path) -> Result<String, BoxError> {
    let runs: Vec<Column> = [
        ("PostgreSQL", "postgres"),
        ("MariaDB", "mariadb"),
        ("SQLite", "sqlite"),
    ]
    .iter()
    .map(|(label, file)| {
        Ok((
            (*label).to_owned(),
            load(bench, &format!("{file}-buffered"))?,
        ))
    })
    .collect::<Result<_, BoxError>>()?;
    let figure = |name: &'static str| {
        move |run: &Value| {
            field(
                cell(run, "buffered", None, None)?,
                &format!("buffered.{name}"),
            )
        }
    };
    let times: Figure = Box::new(|run| {
        let value = tx(run, "buffered", None, None)? / tx(run, "slotted", Some(64), ROTATING)?;
        Some(against(format!("{}x", number(value, 0)), value >= 50.0))
    });
    let statements: Figure = Box::new(move |run| {
        let value = figure("statements_per_100k")(run)?;
        Some(against(number(value, 1), value <= 100.0))
    });
    let lag: Figure = Box::new(move |run| {
        Some(format!(
            "{} / {} ms",
            number(figure("lag_p50_ms")(run)?, 1),
            number(figure("lag_p99_ms")(run)?, 1)
        ))
    });
    let rows: Vec<(Vec<String>, Figure)> = vec![
        (
            labels(["`slotted` (64 slots), increments/s"]),
            rate("slotted", Some(64), ROTATING),
        ),
        (
            labels(["`buffered`, increments/s accepted"]),
            rate("buffered", None, None),
        ),
        (labels(["buffered / slotted (target >= 50)"]), times),
        (
            labels(["statements per 100,000 increments (target <= 100)"]),
            statements,
        ),
        (labels(["lag until stored, p50 / p99"]), lag),
    ];
    Ok(columns(&["64 clients, one hot key"], &runs, &rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cell_json(design: &str, slots: Option<u64>, strategy: Option<&str>, tx: f64) -> Value {
        json!({"workload": "business", "design": design, "slots": slots,
            "slot_strategy": strategy, "clients": 64, "tx_per_s": tx, "p99_ms": 80.4,
            "rounds": [tx, tx, tx], "errors": 0})
    }

    #[test]
    fn the_grid_and_its_ratios_come_from_the_json() {
        let dir =
            std::env::temp_dir().join(format!("guide-figures-counter-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run = json!({"backend": "postgres", "cells": [
            cell_json("hot_row", None, None, 250.0),
            cell_json("slotted", Some(16), Some("rotating"), 2_000.0),
            cell_json("slotted", Some(64), Some("rotating"), 4_123.4),
            cell_json("slotted_raw", Some(16), Some("rotating"), 2_000.0),
            cell_json("uncontended", None, None, 4_000.0),
            // Fewer clients: never the headline's.
            json!({"design": "hot_row", "slots": null, "slot_strategy": null,
                "clients": 8, "tx_per_s": 1.0}),
        ], "reads": [
            {"design": "batch", "ms": 40.0},
            {"design": "naive_loop", "ms": 2_000.0},
            {"design": "raw_sql", "ms": 20.0},
        ]});
        std::fs::write(dir.join("postgres-grid.json"), run.to_string()).unwrap();
        let table = grid(&dir).unwrap();
        assert!(
            table.starts_with(
                "| design (64 clients) | PostgreSQL tx/s | MariaDB tx/s |\n|---|---:|---:|\n"
            ),
            "{table}"
        );
        assert!(
            table.contains("| `slotted`, 64 slots | 4,123 | n/a |\n"),
            "{table}"
        );
        assert!(table.contains("likes + 1` | 250 | n/a |\n"), "{table}");
        let table = ratios(&dir).unwrap();
        assert!(
            table.starts_with("| ratio | target | PostgreSQL | MariaDB |\n|---|---|---:|---:|\n"),
            "{table}"
        );
        // 2,000 / 250 = 8: the target of 10 missed.
        assert!(
            table.contains("| slotted (16) / hot_row | >= 10 | **8.0, missed** | n/a |"),
            "{table}"
        );
        assert!(table.contains("| >= 0.9 | 1.03 | n/a |"), "{table}");
        assert!(
            table.contains("| >= 30 | 50x (2,000 / 40.0 ms) | n/a |"),
            "{table}"
        );
        assert!(
            table.contains("| <= 1.3 | **2.00 (40.0 / 20.0 ms), missed** | n/a |"),
            "{table}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn buffered_has_three_backends() {
        let dir =
            std::env::temp_dir().join(format!("guide-figures-buffered-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run = json!({"backend": "sqlite", "cells": [
            {"design": "slotted", "slots": 64, "slot_strategy": "rotating", "clients": 64,
                "tx_per_s": 800.0},
            {"design": "buffered", "slots": null, "slot_strategy": null, "clients": 64,
                "tx_per_s": 4_000_000.0, "buffered": {"statements_per_100k": 150.26,
                "lag_p50_ms": 50.04, "lag_p99_ms": 101.96}},
        ]});
        std::fs::write(dir.join("sqlite-buffered.json"), run.to_string()).unwrap();
        let table = buffered(&dir).unwrap();
        assert!(
            table.starts_with("| 64 clients, one hot key | PostgreSQL | MariaDB | SQLite |\n|---|---:|---:|---:|\n"),
            "{table}"
        );
        assert!(
            table.contains("accepted | n/a | n/a | 4,000,000 |"),
            "{table}"
        );
        assert!(table.contains("| n/a | n/a | 5,000x |"), "{table}");
        assert!(
            table.contains("| n/a | n/a | **150.3, missed** |"),
            "{table}"
        );
        assert!(table.contains("| n/a | n/a | 50.0 / 102.0 ms |"), "{table}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn galera_without_its_json_is_all_n_a() {
        let dir = std::env::temp_dir().join(format!("guide-figures-galera-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let table = galera(&dir).unwrap();
        assert!(
            table.contains("| `hot_row` | n/a | n/a | n/a | n/a |"),
            "{table}"
        );
        let run = json!({"nodes": 3, "cells": [
            {"design": "hot_row", "slots": null, "slot_strategy": null, "clients": 64,
                "tx_per_s": 100.0, "errors": 500, "p99_ms": 230.0, "rounds": [1, 2, 3]},
            {"design": "slotted", "slots": 64, "slot_strategy": "random", "clients": 64,
                "tx_per_s": 900.0, "errors": 6, "p99_ms": 299.6, "rounds": [1, 2, 3]},
            {"design": "slotted", "slots": 64, "slot_strategy": "shares", "clients": 64,
                "tx_per_s": 2_000.0, "errors": 0, "p99_ms": 60.0, "rounds": [1, 2, 3]},
        ]});
        std::fs::write(dir.join("galera-hot.json"), run.to_string()).unwrap();
        let table = galera(&dir).unwrap();
        assert!(
            table.starts_with("| 64 clients on 3 nodes, one counter | tx/s | errors (3 rounds) |"),
            "{table}"
        );
        assert!(
            table
                .contains("| slotted, `random` | 900 | 6 | 300 | **9.0 (target >= 10), missed** |"),
            "{table}"
        );
        assert!(
            table.contains("(per process) | n/a | n/a | n/a | n/a |"),
            "{table}"
        );
        assert!(table.contains("| | | | 2.22 |"), "{table}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
