//! `limits --growth`' tables (`growth-{postgres,mariadb}.json`): each cost
//! by the number of owners, and unique sketches by members a day.

use std::path::Path;

use serde_json::Value;

use crate::{
    BoxError, Generator,
    render::{BACKENDS, load, number},
};

pub(crate) const TABLES: &[(&str, Generator)] =
    &[("growth", growth), ("growth-unique", growth_unique)];

/// The growth figures: one table per backend, a row per size.
fn growth(bench: &Path) -> Result<String, BoxError> {
    let mut out = String::new();
    for (name, file) in BACKENDS {
        let Some(run) = load(bench, &format!("growth-{file}"))? else {
            continue;
        };
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!(
            "| {name}: owners (x 4 keys) | page read, 100 owners | cached | one increment p50 / p99 | bytes per counter | `top` page | full compaction: s, rows folded/s |\n|---:|---:|---:|---:|---:|---:|---:|\n"
        ));
        for row in run["growth"]["owners"].as_array().into_iter().flatten() {
            let f = |k: &str| row[k].as_f64();
            let or_na = |v: Option<String>| v.unwrap_or_else(|| "n/a".into());
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} |\n",
                or_na(f("owners").map(|v| number(v, 0))),
                or_na(f("page_read_us").map(|v| format!("{} ms", number(v / 1e3, 2)))),
                or_na(f("cached_page_read_us").map(|v| format!("{} ms", number(v / 1e3, 2)))),
                or_na(
                    f("increment_p50_us")
                        .zip(f("increment_p99_us"))
                        .map(|(a, b)| format!(
                            "{} / {} ms",
                            number(a / 1e3, 2),
                            number(b / 1e3, 2)
                        ))
                ),
                or_na(f("bytes_per_counter").map(|v| number(v, 0))),
                or_na(f("top_page_ms").map(|v| format!("{} ms", number(v, 1)))),
                or_na(
                    f("compact_s")
                        .zip(f("compact_rows_per_s"))
                        .map(|(s, r)| format!("{} s, {}", number(s, 2), number(r, 0)))
                ),
            ));
        }
    }
    Ok(out)
}

fn growth_unique(bench: &Path) -> Result<String, BoxError> {
    let mut out = String::from(
        "| members per owner-day | bytes on disk per owner-day | 30-day union of 100 owners |\n|---:|---|---|\n",
    );
    let runs: Vec<(&str, Value)> = BACKENDS
        .iter()
        .filter_map(|(name, file)| Some((*name, load(bench, &format!("growth-{file}")).ok()??)))
        .collect();
    let sizes: Vec<f64> = runs
        .first()
        .and_then(|(_, run)| run["growth"]["unique"].as_array())
        .into_iter()
        .flatten()
        .filter_map(|row| row["members_per_day"].as_f64())
        .collect();
    for members in sizes {
        let mut bytes = Vec::new();
        let mut union = Vec::new();
        for (name, run) in &runs {
            let row = run["growth"]["unique"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|row| row["members_per_day"].as_f64() == Some(members));
            let get = |k: &str| row.and_then(|r| r[k].as_f64());
            bytes.push(format!(
                "{name} {}",
                get("bytes_per_owner_day").map_or("n/a".into(), |v| number(v, 0))
            ));
            union.push(format!(
                "{name} {}",
                get("union_30d_100_owners_ms")
                    .map_or("n/a".into(), |v| format!("{} ms", number(v, 1)))
            ));
        }
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            number(members, 0),
            bytes.join(", "),
            union.join(", ")
        ));
    }
    Ok(out)
}
