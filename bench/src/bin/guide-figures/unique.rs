//! `unique-bench`'s tables (`unique-{postgres,mariadb}.json`): every
//! figure against its target (performance guide), and its four ratios
//! (unique guide), each ratio's cell from the same function in both.

use std::path::Path;

use serde_json::Value;

use crate::{
    BoxError, Generator,
    render::{BACKENDS, Cell, against, field, load, number, table_over},
};

pub(crate) const TABLES: &[(&str, Generator)] =
    &[("unique", unique), ("unique-ratios", unique_ratios)];

/// The targets: each ratio at least, the error and a 10-member sketch at
/// most.
const READ_TARGET: f64 = 20.0;
const STORAGE_TARGET: f64 = 20.0;
const OBSERVE_TARGET: f64 = 10.0;
const ERROR_TARGET: f64 = 0.02;
const SKETCH_AT_10_TARGET: f64 = 64.0;

/// The figure at `path`, `text` of it, bold and marked when `met` fails.
fn judged(
    path: &'static str,
    met: impl Fn(f64) -> bool + 'static,
    text: impl Fn(f64) -> String + 'static,
) -> Cell {
    Box::new(move |run, _| {
        let value = field(run, path)?;
        Some(against(text(value), met(value)))
    })
}

/// A ratio against a target it must reach, in `decimals`, then `suffix`.
fn ratio(path: &'static str, target: f64, decimals: usize, suffix: &'static str) -> Cell {
    judged(
        path,
        move |v| v >= target,
        move |v| format!("{}{suffix}", number(v, decimals)),
    )
}

/// Sketches against `COUNT(DISTINCT)`, 1,001 owners' reads.
fn read_ratio(decimals: usize, suffix: &'static str) -> Cell {
    ratio(
        "ratios.read_vs_count_distinct",
        READ_TARGET,
        decimals,
        suffix,
    )
}

/// The membership table's bytes over the sketch table's.
fn storage_ratio(decimals: usize, suffix: &'static str) -> Cell {
    ratio(
        "ratios.storage_vs_membership",
        STORAGE_TARGET,
        decimals,
        suffix,
    )
}

/// Buffered observes a second over membership inserts a second.
fn observe_ratio(suffix: &'static str) -> Cell {
    ratio(
        "ratios.observe_vs_membership_insert",
        OBSERVE_TARGET,
        0,
        suffix,
    )
}

/// The relative error of the 1,000,000-member owner, in %.
fn error_at_1m() -> Cell {
    judged(
        "relative_error_at_1m",
        |v| v <= ERROR_TARGET,
        |v| format!("{} %", number(v * 100.0, 2)),
    )
}

/// `a / b / ...`: the figures at `paths`, each times its scale, in its
/// decimals, then `unit`.
fn several(paths: &'static [(&'static str, f64, usize)], unit: &'static str) -> Cell {
    Box::new(move |run, _| {
        let parts = paths
            .iter()
            .map(|(path, scale, decimals)| {
                Some(format!(
                    "{}{unit}",
                    number(field(run, path)? * scale, *decimals)
                ))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(parts.join(" / "))
    })
}

fn runs(bench: &Path) -> Result<Vec<Option<Value>>, BoxError> {
    BACKENDS
        .iter()
        .map(|(_, file)| load(bench, &format!("unique-{file}")))
        .collect()
}

fn render(bench: &Path, header: &str, rows: Vec<(String, Cell)>) -> Result<String, BoxError> {
    let names: Vec<&str> = BACKENDS.iter().map(|(name, _)| *name).collect();
    Ok(table_over(header, &names, &rows, &runs(bench)?))
}

/// The performance guide's table.
fn unique(bench: &Path) -> Result<String, BoxError> {
    let sketch_at_10: Cell = Box::new(|run, _| {
        let at_10 = field(run, "sketch_bytes_at_10")?;
        Some(against(
            format!(
                "{} / {} / {}",
                number(at_10, 0),
                number(field(run, "sketch_bytes_at_1k")?, 0),
                number(field(run, "sketch_bytes_at_1m")?, 0)
            ),
            at_10 <= SKETCH_AT_10_TARGET,
        ))
    });
    let rows: Vec<(String, Cell)> = vec![
        (
            "read of 1,001 owners (2M memberships), ms: sketches / `COUNT(DISTINCT)`".into(),
            several(
                &[
                    ("reads.big.sketch_ms", 1.0, 1),
                    ("reads.big.count_distinct_ms", 1.0, 0),
                ],
                "",
            ),
        ),
        (
            format!("`read_vs_count_distinct` (target {READ_TARGET})"),
            read_ratio(1, ""),
        ),
        (
            "the same at 10,000 memberships".into(),
            several(&[("ratios.read_vs_count_distinct_at_10k", 1.0, 1)], ""),
        ),
        (
            "storage, MB: membership table / sketch table".into(),
            several(
                &[
                    ("storage.membership_table_bytes", 1e-6, 1),
                    ("storage.sketch_table_bytes", 1e-6, 1),
                ],
                "",
            ),
        ),
        (
            format!("`storage_vs_membership` (target {STORAGE_TARGET})"),
            storage_ratio(1, ""),
        ),
        (
            "writes/s on one owner, 64 writers: membership insert / buffered observe / direct observe".into(),
            several(
                &[
                    ("writes_per_second.membership_insert", 1.0, 0),
                    ("writes_per_second.buffered_observe", 1.0, 0),
                    ("writes_per_second.direct_observe", 1.0, 0),
                ],
                "",
            ),
        ),
        (
            format!("`observe_vs_membership_insert`, buffered (target {OBSERVE_TARGET})"),
            observe_ratio(""),
        ),
        (
            format!(
                "`relative_error_at_1m` (target {} %)",
                ERROR_TARGET * 100.0
            ),
            error_at_1m(),
        ),
        (
            "worst / root mean square error over the 1,001 owners".into(),
            several(
                &[
                    ("reads.big.worst_relative_error", 100.0, 2),
                    ("reads.big.rms_relative_error", 100.0, 2),
                ],
                " %",
            ),
        ),
        (
            format!("`sketch_bytes_at_10` / 1k / 1M (target {SKETCH_AT_10_TARGET} at 10)"),
            sketch_at_10,
        ),
    ];
    render(bench, "", rows)
}

/// The unique guide's table: the four ratios.
fn unique_ratios(bench: &Path) -> Result<String, BoxError> {
    let rows: Vec<(String, Cell)> = vec![
        (
            "read of 1,001 owners' counts: `COUNT(DISTINCT)` / sketches".into(),
            read_ratio(1, "x"),
        ),
        (
            "storage: membership table / sketch table".into(),
            storage_ratio(0, "x"),
        ),
        (
            "writes on one owner, 64 writers: buffered `observe` / membership `INSERT`".into(),
            observe_ratio("x"),
        ),
        ("error of the 1,000,000-member owner".into(), error_at_1m()),
    ];
    render(bench, "ratio", rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_tables_are_rendered_from_the_run_with_misses_in_bold() {
        let dir = std::env::temp_dir().join(format!("guide-figures-unique-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run = serde_json::json!({
            "backend": "mysql",
            "ratios": {
                "observe_vs_membership_insert": 122.6,
                "read_vs_count_distinct": 12.34,
                "read_vs_count_distinct_at_10k": 0.98,
                "storage_vs_membership": 23.16
            },
            "reads": {"big": {
                "count_distinct_ms": 212.77, "sketch_ms": 6.4,
                "rms_relative_error": 0.0055, "worst_relative_error": 0.0197
            }},
            "relative_error_at_1m": 0.00484,
            "sketch_bytes_at_10": 31, "sketch_bytes_at_1k": 2896, "sketch_bytes_at_1m": 12289,
            "storage": {"membership_table_bytes": 75120640, "sketch_table_bytes": 3244032},
            "writes_per_second": {
                "buffered_observe": 2196613.9, "direct_observe": 627.2, "membership_insert": 17915.5
            }
        });
        std::fs::write(dir.join("unique-mariadb.json"), run.to_string()).unwrap();
        let perf = unique(&dir).unwrap();
        let ratios = unique_ratios(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();

        assert!(
            perf.starts_with("| | PostgreSQL | MariaDB |\n|---|---:|---:|\n"),
            "{perf}"
        );
        // PostgreSQL has no run: "n/a"; 12.3 misses the target of 20.
        assert!(
            perf.contains("| `read_vs_count_distinct` (target 20) | n/a | **12.3, missed** |"),
            "{perf}"
        );
        assert!(perf.contains("| n/a | 6.4 / 213 |"), "{perf}");
        assert!(perf.contains("| n/a | 75.1 / 3.2 |"), "{perf}");
        assert!(
            perf.contains("| n/a | 17,916 / 2,196,614 / 627 |"),
            "{perf}"
        );
        assert!(
            perf.contains("| `relative_error_at_1m` (target 2 %) | n/a | 0.48 % |"),
            "{perf}"
        );
        assert!(perf.contains("| n/a | 1.97 % / 0.55 % |"), "{perf}");
        assert!(
            perf.contains("(target 64 at 10) | n/a | 31 / 2,896 / 12,289 |"),
            "{perf}"
        );

        assert!(
            ratios.starts_with("| ratio | PostgreSQL | MariaDB |\n"),
            "{ratios}"
        );
        assert!(
            ratios.contains("counts: `COUNT(DISTINCT)` / sketches | n/a | **12.3x, missed** |"),
            "{ratios}"
        );
        assert!(
            ratios.contains("| storage: membership table / sketch table | n/a | 23x |"),
            "{ratios}"
        );
        assert!(ratios.contains("`INSERT` | n/a | 123x |"), "{ratios}");
        assert!(ratios.contains("| n/a | 0.48 % |"), "{ratios}");
    }
}
