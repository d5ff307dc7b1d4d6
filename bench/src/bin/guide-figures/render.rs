//! What every table shares: loading a bench's JSON, reading a figure out
//! of it, formatting numbers, and writing a table: [`grid`] writes the
//! markdown, [`table`] (one column per backend, each cell from a run and
//! the run before it), [`table_over`] (any list of backends) and
//! [`columns`] (label columns, then one column per run) build its rows.

use std::path::Path;

use serde_json::Value;

use crate::BoxError;

/// The backends a table compares, with their file names' spelling.
pub(crate) const BACKENDS: [(&str, &str); 2] = [("PostgreSQL", "postgres"), ("MariaDB", "mariadb")];

/// A figure of one run: `None` when the run lacks it.
pub(crate) type Figure = Box<dyn Fn(&Value) -> Option<String>>;

/// A run's column: its header and its JSON, if committed.
pub(crate) type Column = (String, Option<Value>);

/// A backend's run of a bench and the run before it, each if committed.
pub(crate) type Run = (Option<Value>, Option<Value>);

/// A backend's cell of a row, from its run and the run before it (if
/// any); `None` when the run lacks the figure.
pub(crate) type Cell = Box<dyn Fn(&Value, Option<&Value>) -> Option<String>>;

/// The bench JSON of `name` (e.g. `limits-postgres`), if committed.
pub(crate) fn load(bench: &Path, name: &str) -> Result<Option<Value>, BoxError> {
    let path = bench.join(format!("{name}.json"));
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display()).into()),
    }
}

/// `value` with thousands separators, rounded to `decimals`.
pub(crate) fn number(value: f64, decimals: usize) -> String {
    let text = format!("{:.*}", decimals, value.abs());
    let (whole, fraction) = text
        .split_once('.')
        .map_or((text.as_str(), None), |(w, f)| (w, Some(f)));
    let mut grouped = String::new();
    for (i, digit) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    let sign = if value < 0.0 { "-" } else { "" };
    match fraction {
        Some(f) => format!("{sign}{grouped}.{f}"),
        None => format!("{sign}{grouped}"),
    }
}

/// A figure against its target: bold and marked when it misses.
pub(crate) fn against(text: String, met: bool) -> String {
    if met {
        text
    } else {
        format!("**{text}, missed**")
    }
}

pub(crate) fn field(json: &Value, path: &str) -> Option<f64> {
    path.split('.')
        .try_fold(json, |v, key| v.get(key))?
        .as_f64()
}

/// One row per figure, one column per backend: `cell(json, before)`
/// renders a backend's cell ("n/a" without its JSON).
pub(crate) fn table(header: &str, rows: &[(&str, Cell)], runs: &[Run]) -> String {
    let mut head = vec![header];
    head.extend(BACKENDS.iter().map(|(name, _)| *name));
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|(label, cell)| {
            let mut row = vec![(*label).to_owned()];
            row.extend(runs.iter().map(|(run, before)| {
                run.as_ref()
                    .and_then(|run| cell(run, before.as_ref()))
                    .unwrap_or_else(|| "n/a".into())
            }));
            row
        })
        .collect();
    grid(&head, 1, &rows)
}

/// A table: the `heads` label columns, then one column per run. Each row
/// has one text per label column and a figure rendered from every run
/// ("n/a" without its JSON or the figure).
pub(crate) fn columns(heads: &[&str], runs: &[Column], rows: &[(Vec<String>, Figure)]) -> String {
    let mut head: Vec<&str> = heads.to_vec();
    head.extend(runs.iter().map(|(name, _)| name.as_str()));
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|(labels, figure)| {
            let mut row = labels.clone();
            row.extend(runs.iter().map(|(_, run)| {
                run.as_ref()
                    .and_then(figure)
                    .unwrap_or_else(|| "n/a".into())
            }));
            row
        })
        .collect();
    grid(&head, heads.len(), &rows)
}

/// The backends of a table with a SQLite column, with their file names'
/// spelling.
pub(crate) const THREE_BACKENDS: [(&str, &str); 3] = [
    ("PostgreSQL", "postgres"),
    ("MariaDB", "mariadb"),
    ("SQLite", "sqlite"),
];

/// A markdown table of `head` and `rows`: the first `left` columns
/// left-aligned, the others (figures) right-aligned. An empty cell is
/// written `| |`.
pub(crate) fn grid(head: &[&str], left: usize, rows: &[Vec<String>]) -> String {
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::from("|");
        for cell in cells {
            if cell.is_empty() {
                out.push_str(" |");
            } else {
                out.push_str(&format!(" {cell} |"));
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(&mut head.iter().copied());
    out.push('|');
    for column in 0..head.len() {
        out.push_str(if column < left { "---|" } else { "---:|" });
    }
    out.push('\n');
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

/// A backend's cell of a row from its run, "n/a" without the run or the
/// figure.
pub(crate) fn cell_of(cell: &Cell, run: Option<&Value>) -> String {
    run.and_then(|run| cell(run, None))
        .unwrap_or_else(|| "n/a".into())
}

/// `render::table` over any `backends` (their names as the columns),
/// `runs` in their order.
pub(crate) fn table_over(
    header: &str,
    backends: &[&str],
    rows: &[(String, Cell)],
    runs: &[Option<Value>],
) -> String {
    let mut head = vec![header];
    head.extend(backends);
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|(label, cell)| {
            let mut row = vec![label.clone()];
            row.extend(runs.iter().map(|run| cell_of(cell, run.as_ref())));
            row
        })
        .collect();
    grid(&head, 1, &rows)
}

/// Each backend's run of `bench` and, with `before`, the run before it.
pub(crate) fn runs(bench: &Path, name: &str, before: bool) -> Result<Vec<Run>, BoxError> {
    BACKENDS
        .iter()
        .map(|(_, file)| {
            let run = load(bench, &format!("{name}-{file}"))?;
            let then = if before {
                load(bench, &format!("{name}-{file}-before"))?
            } else {
                None
            };
            Ok((run, then))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_aligns_figures_right_and_keeps_an_empty_header() {
        let table = grid(
            &["", "target", "a"],
            2,
            &[vec!["x".into(), ">= 1".into(), "2".into()]],
        );
        assert_eq!(
            table,
            "| | target | a |\n|---|---|---:|\n| x | >= 1 | 2 |\n"
        );
    }
}
