//! `compact-bench`'s table (`compaction-{postgres,mariadb,sqlite}.json`):
//! a hot counter's rows and reads and a ranking before and after
//! compaction, one column per backend, SQLite's too.

use std::path::Path;

use crate::{
    BoxError, Generator,
    render::{Cell, THREE_BACKENDS, field, load, number, table_over},
};

pub(crate) const TABLES: &[(&str, Generator)] = &[("compaction", compaction)];

/// `NAME.before / NAME.after` in `decimals`, with their ratio.
fn before_after(name: &'static str, decimals: usize, unit: &'static str) -> Cell {
    Box::new(move |run, _| {
        let before = field(run, &format!("{name}.before"))?;
        let after = field(run, &format!("{name}.after"))?;
        let ratio = if after > 0.0 {
            format!(" ({}x)", number(before / after, 2))
        } else {
            String::new()
        };
        Some(format!(
            "{} / {}{unit}{ratio}",
            number(before, decimals),
            number(after, decimals)
        ))
    })
}

fn compaction(bench: &Path) -> Result<String, BoxError> {
    let runs = THREE_BACKENDS
        .iter()
        .map(|(_, file)| load(bench, &format!("compaction-{file}")))
        .collect::<Result<Vec<_>, _>>()?;
    // The sizes in the labels are the runs' own (the first run's: every run
    // takes the bench's defaults).
    let first = |path: &str| {
        runs.iter()
            .flatten()
            .find_map(|run| field(run, path))
            .map_or("n/a".into(), |v| number(v, 0))
    };
    let slot_rows: Cell = Box::new(|run, _| {
        Some(format!(
            "{} / {}",
            number(field(run, "hot_slot_rows.before")?, 0),
            number(field(run, "hot_slot_rows.after")?, 0)
        ))
    });
    let online: Cell = Box::new(|run, _| {
        Some(format!(
            "{} s",
            number(field(run, "online_compact.secs")?, 1)
        ))
    });
    let rows: Vec<(String, Cell)> = vec![
        ("hot counter slot rows, before / after".into(), slot_rows),
        (
            "hot counter `get`, median before / after".into(),
            before_after("get_median_ms", 3, " ms"),
        ),
        (
            format!(
                "`top(10)` over {} owners, median of 5, before / after",
                first("ranked_owners")
            ),
            before_after("top_median_ms", 1, " ms"),
        ),
        (
            format!(
                "online `compact` of {} rows, {} writers running",
                first("online_compact.rows_before"),
                first("writers")
            ),
            online,
        ),
    ];
    let names: Vec<&str> = THREE_BACKENDS.iter().map(|(name, _)| *name).collect();
    Ok(table_over("one run each", &names, &rows, &runs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_rendered_from_each_backends_run() {
        let dir =
            std::env::temp_dir().join(format!("guide-figures-compaction-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run = serde_json::json!({
            "backend": "postgres",
            "ranked_owners": 1001,
            "writers": 8,
            "hot_slot_rows": {"before": 256, "after": 1},
            "get_median_ms": {"before": 0.5, "after": 0.25},
            "get_p95_ms": {"before": 1.0, "after": 0.5},
            "top_median_ms": {"before": 1234.56, "after": 61.5},
            "online_compact": {"rows_before": 4256, "rows_after": 1001, "counters_folded": 1001, "secs": 12.64, "increments_during": 10},
            "totals_ok": true
        });
        std::fs::write(dir.join("compaction-postgres.json"), run.to_string()).unwrap();
        let mut sqlite = run.clone();
        sqlite["online_compact"]["secs"] = 7.56.into();
        std::fs::write(dir.join("compaction-sqlite.json"), sqlite.to_string()).unwrap();
        let table = compaction(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            table.starts_with(
                "| one run each | PostgreSQL | MariaDB | SQLite |\n|---|---:|---:|---:|\n"
            ),
            "{table}"
        );
        assert!(
            table.contains("| hot counter slot rows, before / after | 256 / 1 | n/a | 256 / 1 |"),
            "{table}"
        );
        assert!(
            table.contains("| 0.500 / 0.250 ms (2.00x) | n/a |"),
            "{table}"
        );
        assert!(
            table.contains(
                "| `top(10)` over 1,001 owners, median of 5, before / after | 1,234.6 / 61.5 ms (20.07x) |"
            ),
            "{table}"
        );
        assert!(
            table.contains(
                "| online `compact` of 4,256 rows, 8 writers running | 12.6 s | n/a | 7.6 s |"
            ),
            "{table}"
        );
        assert!(table.ends_with("|\n"), "{table}");
    }
}
