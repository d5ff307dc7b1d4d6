//! `cache-bench`'s tables (`{postgres,mariadb}-cache.json`, one report per
//! Redis target): the ratios against their targets (performance guide) and
//! the figures behind them (cache guide). Both read each figure, and judge
//! it against its target, through the same [`CacheFigure`].

use std::path::Path;

use serde_json::Value;

use crate::{
    BoxError, Generator,
    render::{BACKENDS, Cell, against, cell_of, grid, load, number, table_over},
};

pub(crate) const TABLES: &[(&str, Generator)] =
    &[("cache-targets", cache_targets), ("cache", cache)];

/// A target a figure must meet.
#[derive(Clone, Copy)]
enum Target {
    AtLeast(f64),
    AtMost(f64),
}

/// One figure of one Redis target's report, with its target if it has one.
struct CacheFigure {
    /// `standalone` or `cluster`.
    redis: &'static str,
    /// Its name in the report.
    name: &'static str,
    target: Option<Target>,
}

const HIT_SPEEDUP: CacheFigure = CacheFigure {
    redis: "standalone",
    name: "hit_speedup",
    target: Some(Target::AtLeast(10.0)),
};
const MISS_RATIO: CacheFigure = CacheFigure {
    redis: "standalone",
    name: "miss_ratio",
    target: Some(Target::AtMost(1.3)),
};
const CLUSTER_HIT_SPEEDUP: CacheFigure = CacheFigure {
    redis: "cluster",
    name: "hit_speedup",
    target: Some(Target::AtLeast(5.0)),
};
const FILLS_PER_INVALIDATION: CacheFigure = CacheFigure {
    redis: "standalone",
    name: "fills_per_invalidation",
    target: Some(Target::AtMost(1.05)),
};
const BYTES_PER_OWNER: CacheFigure = CacheFigure {
    redis: "standalone",
    name: "bytes_per_owner",
    target: Some(Target::AtMost(160.0)),
};
const HIT_RATIO: CacheFigure = CacheFigure {
    redis: "standalone",
    name: "hit_ratio",
    target: None,
};

/// The report of Redis target `redis` in a backend's run.
fn report<'a>(run: &'a Value, redis: &str) -> Option<&'a Value> {
    run.as_array()?
        .iter()
        .find(|report| report["redis"] == redis)
}

/// The median batch read of `mode` (`uncached`, `hit`, `miss`), ms.
fn read_ms(run: &Value, redis: &str, mode: &str) -> Option<f64> {
    report(run, redis)?["reads"]
        .as_array()?
        .iter()
        .find(|read| read["mode"] == mode)?["ms"]
        .as_f64()
}

impl CacheFigure {
    /// The figure in `run`, and whether it meets its target.
    fn of(&self, run: &Value) -> Option<(f64, bool)> {
        let value = report(run, self.redis)?[self.name].as_f64()?;
        let met = match self.target {
            Some(Target::AtLeast(t)) => value >= t,
            Some(Target::AtMost(t)) => value <= t,
            None => true,
        };
        Some((value, met))
    }

    /// Its target as the performance guide's column shows it (`>= 10`).
    fn target_column(&self) -> String {
        match self.target {
            Some(Target::AtLeast(t)) => format!(">= {t}"),
            Some(Target::AtMost(t)) => format!("<= {t}"),
            None => String::new(),
        }
    }

    /// Its target as a label of the cache guide shows it (`target ≥ 10x`),
    /// a ratio's with `x`.
    fn target_label(&self, ratio: bool) -> String {
        let x = if ratio { "x" } else { "" };
        match self.target {
            Some(Target::AtLeast(t)) => format!(" (target ≥ {t}{x})"),
            Some(Target::AtMost(t)) => format!(" (target ≤ {t}{x})"),
            None => String::new(),
        }
    }

    /// A cell of this figure: `text(run, value)`, bold and marked when the
    /// value misses its target.
    fn cell(&'static self, text: fn(&Value, f64) -> Option<String>) -> Cell {
        Box::new(move |run, _| {
            let (value, met) = self.of(run)?;
            Some(against(text(run, value)?, met))
        })
    }
}

/// Each backend's run, if committed.
fn runs(bench: &Path) -> Result<Vec<Option<Value>>, BoxError> {
    BACKENDS
        .iter()
        .map(|(_, file)| load(bench, &format!("{file}-cache")))
        .collect()
}

/// The performance guide's table: each ratio, its target, each backend.
fn cache_targets(bench: &Path) -> Result<String, BoxError> {
    let runs = runs(bench)?;
    let rows: [(&str, &'static CacheFigure, Cell); 5] = [
        (
            "uncached read / all-hit read, standalone Redis",
            &HIT_SPEEDUP,
            HIT_SPEEDUP.cell(|run, v| {
                Some(format!(
                    "{} ({} / {} ms)",
                    number(v, 1),
                    number(read_ms(run, "standalone", "uncached")?, 2),
                    number(read_ms(run, "standalone", "hit")?, 2)
                ))
            }),
        ),
        (
            "all-miss read / uncached read, standalone Redis",
            &MISS_RATIO,
            MISS_RATIO.cell(|_, v| Some(number(v, 2))),
        ),
        (
            "uncached read / all-hit read, 3-master cluster",
            &CLUSTER_HIT_SPEEDUP,
            CLUSTER_HIT_SPEEDUP.cell(|_, v| Some(number(v, 1))),
        ),
        (
            "database fills per invalidation, 64 readers",
            &FILLS_PER_INVALIDATION,
            FILLS_PER_INVALIDATION.cell(|_, v| Some(number(v, 2))),
        ),
        (
            "bytes per owner, 4 small counts",
            &BYTES_PER_OWNER,
            BYTES_PER_OWNER.cell(|_, v| Some(number(v, 0))),
        ),
    ];
    let mut head = vec!["ratio", "target"];
    head.extend(BACKENDS.iter().map(|(name, _)| *name));
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|(label, figure, cell)| {
            let mut row = vec![label.to_string(), figure.target_column()];
            row.extend(runs.iter().map(|run| cell_of(cell, run.as_ref())));
            row
        })
        .collect();
    Ok(grid(&head, 2, &rows))
}

/// The cache guide's table: the reads behind the ratios, and the rest.
fn cache(bench: &Path) -> Result<String, BoxError> {
    let runs = runs(bench)?;
    let labels = [
        "uncached batch read".to_owned(),
        format!("all hits, standalone{}", HIT_SPEEDUP.target_label(true)),
        format!("all misses, standalone{}", MISS_RATIO.target_label(true)),
        format!(
            "all hits, 3-master cluster{}",
            CLUSTER_HIT_SPEEDUP.target_label(true)
        ),
        format!(
            "database fills per invalidation, 64 readers of one owner{}",
            FILLS_PER_INVALIDATION.target_label(false)
        ),
        format!(
            "bytes per owner, 4 small counts{}",
            BYTES_PER_OWNER.target_label(false)
        ),
        "hit ratio, Zipf s = 1.1 over 100,000 owners, 10 % writes, 16,000 operations".to_owned(),
    ];
    let cells: [Cell; 7] = [
        Box::new(|run, _| {
            Some(format!(
                "{} ms",
                number(read_ms(run, "standalone", "uncached")?, 1)
            ))
        }),
        HIT_SPEEDUP.cell(|run, v| {
            Some(format!(
                "{} ms ({}x)",
                number(read_ms(run, "standalone", "hit")?, 2),
                number(v, 1)
            ))
        }),
        MISS_RATIO.cell(|run, v| {
            Some(format!(
                "{} ms ({}x)",
                number(read_ms(run, "standalone", "miss")?, 1),
                number(v, 2)
            ))
        }),
        CLUSTER_HIT_SPEEDUP.cell(|run, v| {
            Some(format!(
                "{} ms ({}x)",
                number(read_ms(run, "cluster", "hit")?, 2),
                number(v, 1)
            ))
        }),
        FILLS_PER_INVALIDATION.cell(|_, v| Some(number(v, 2))),
        BYTES_PER_OWNER.cell(|_, v| Some(number(v, 0))),
        HIT_RATIO.cell(|_, v| Some(number(v, 2))),
    ];
    let rows: Vec<(String, Cell)> = labels.into_iter().zip(cells).collect();
    let names: Vec<&str> = BACKENDS.iter().map(|(name, _)| *name).collect();
    Ok(table_over("", &names, &rows, &runs))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of one backend: `cache-bench`'s two reports.
    fn run(hit_ms: f64, cluster: bool) -> Value {
        let reads = |uncached: f64, hit: f64, miss: f64| {
            serde_json::json!([
                {"mode": "uncached", "owners": 1000, "keys": 4, "ms": uncached},
                {"mode": "hit", "owners": 1000, "keys": 4, "ms": hit},
                {"mode": "miss", "owners": 1000, "keys": 4, "ms": miss}
            ])
        };
        let mut reports = vec![serde_json::json!({
            "backend": "postgres", "redis": "standalone", "reads": reads(20.0, hit_ms, 19.0),
            "hit_ratio": 0.6629, "fills_per_invalidation": 1.0, "bytes_per_owner": 136.0,
            "stale_reads": 0, "totals_ok": true,
            "hit_speedup": 20.0 / hit_ms, "miss_ratio": 0.95
        })];
        if cluster {
            reports.push(serde_json::json!({
                "backend": "postgres", "redis": "cluster", "reads": reads(21.0, 1.5, 22.0),
                "hit_ratio": 0.66, "fills_per_invalidation": 1.0, "bytes_per_owner": null,
                "stale_reads": 0, "totals_ok": true, "hit_speedup": 14.0, "miss_ratio": 1.05
            }));
        }
        Value::Array(reports)
    }

    #[test]
    fn both_tables_are_rendered_from_the_same_figures() {
        let dir = std::env::temp_dir().join(format!("guide-figures-cache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // 20 / 4 = 5: the standalone hit misses its target of 10.
        std::fs::write(dir.join("postgres-cache.json"), run(4.0, false).to_string()).unwrap();
        let targets = cache_targets(&dir).unwrap();
        std::fs::write(dir.join("postgres-cache.json"), run(0.5, true).to_string()).unwrap();
        let guide = cache(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();

        assert!(
            targets.starts_with("| ratio | target | PostgreSQL | MariaDB |\n|---|---|---:|---:|\n"),
            "{targets}"
        );
        assert!(
            targets.contains(
                "| uncached read / all-hit read, standalone Redis | >= 10 | **5.0 (20.00 / 4.00 ms), missed** | n/a |"
            ),
            "{targets}"
        );
        assert!(
            targets.contains("| bytes per owner, 4 small counts | <= 160 | 136 | n/a |"),
            "{targets}"
        );
        // No cluster report: its row is "n/a".
        assert!(
            targets
                .contains("| uncached read / all-hit read, 3-master cluster | >= 5 | n/a | n/a |"),
            "{targets}"
        );

        assert!(
            guide.starts_with("| | PostgreSQL | MariaDB |\n|---|---:|---:|\n| uncached batch read | 20.0 ms | n/a |\n"),
            "{guide}"
        );
        assert!(
            guide.contains("| all hits, standalone (target ≥ 10x) | 0.50 ms (40.0x) | n/a |"),
            "{guide}"
        );
        assert!(
            guide.contains("| all hits, 3-master cluster (target ≥ 5x) | 1.50 ms (14.0x) | n/a |"),
            "{guide}"
        );
        assert!(
            guide.contains("| all misses, standalone (target ≤ 1.3x) | 19.0 ms (0.95x) | n/a |"),
            "{guide}"
        );
        assert!(guide.contains("| 0.66 | n/a |\n"), "{guide}");
    }
}
