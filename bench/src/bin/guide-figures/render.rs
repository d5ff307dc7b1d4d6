//! What every table shares: loading a bench's JSON, reading a figure out
//! of it, formatting numbers, and a table with one column per backend.

use std::path::Path;

use serde_json::Value;

use crate::BoxError;

/// The backends a table compares, with their file names' spelling.
pub(crate) const BACKENDS: [(&str, &str); 2] = [("PostgreSQL", "postgres"), ("MariaDB", "mariadb")];

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
    let mut out = format!("| {header} |");
    for (name, _) in BACKENDS {
        out.push_str(&format!(" {name} |"));
    }
    out.push_str("\n|---|");
    for _ in BACKENDS {
        out.push_str("---:|");
    }
    out.push('\n');
    for (label, cell) in rows {
        out.push_str(&format!("| {label} |"));
        for (run, before) in runs {
            let text = run
                .as_ref()
                .and_then(|run| cell(run, before.as_ref()))
                .unwrap_or_else(|| "n/a".into());
            out.push_str(&format!(" {text} |"));
        }
        out.push('\n');
    }
    out
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
