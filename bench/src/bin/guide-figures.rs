//! The guide's figure tables, rendered from the benches' JSON in
//! `docs/bench/`: no number in them is copied by hand, so none drifts
//! from the run it came from.
//!
//! A generated table sits between `<!-- figures:NAME -->` and
//! `<!-- /figures:NAME -->` in a guide page; this rewrites every such block
//! from the JSON, or with `--check` fails (as CI runs it) when a block
//! differs from what the JSON gives. A page names its JSON in the text
//! around the block; the tables are:
//!
//! * `limits`: `limits-{postgres,mariadb}.json` (and `-before.json`);
//! * `limits-adds`: the same files' `adds` section;
//! * `growth`: `growth-{postgres,mariadb}.json`, each cost by size;
//! * `growth-unique`: the same files' unique sketches;
//! * `service`: `service-{postgres,mariadb}.json` (`service-bench`).
//!
//! `cargo run -p bench --bin guide-figures [-- --check]`

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use serde_json::Value;

/// The backends a table compares, with their file names' spelling.
const BACKENDS: [(&str, &str); 2] = [("PostgreSQL", "postgres"), ("MariaDB", "mariadb")];

type BoxError = Box<dyn std::error::Error>;

/// A backend's run of a bench and the run before it, each if committed.
type Run = (Option<Value>, Option<Value>);

/// A backend's cell of a row, from its run and the run before it (if
/// any); `None` when the run lacks the figure.
type Cell = Box<dyn Fn(&Value, Option<&Value>) -> Option<String>>;

/// The bench JSON of `name` (e.g. `limits-postgres`), if committed.
fn load(bench: &Path, name: &str) -> Result<Option<Value>, BoxError> {
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
fn number(value: f64, decimals: usize) -> String {
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
fn against(text: String, met: bool) -> String {
    if met {
        text
    } else {
        format!("**{text}, missed**")
    }
}

fn field(json: &Value, path: &str) -> Option<f64> {
    path.split('.')
        .try_fold(json, |v, key| v.get(key))?
        .as_f64()
}

/// One row per figure, one column per backend: `cell(json, before)`
/// renders a backend's cell ("n/a" without its JSON).
fn table(header: &str, rows: &[(&str, Cell)], runs: &[Run]) -> String {
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

/// A ratio of `limits.NAME` against its target of 1.3, with its two costs.
fn limit(name: &'static str, unit_ms: bool) -> impl Fn(&Value, Option<&Value>) -> Option<String> {
    move |run, _| {
        let ratio = field(run, &format!("limits.{name}.ratio"))?;
        let (own, raw) = (
            field(run, &format!("limits.{name}.own_us"))?,
            field(run, &format!("limits.{name}.raw_us"))?,
        );
        let costs = if unit_ms {
            format!("{} / {} ms", number(own / 1e3, 2), number(raw / 1e3, 2))
        } else {
            format!("{} / {} us", number(own, 1), number(raw, 1))
        };
        Some(against(
            format!("{} ({costs})", number(ratio, 2)),
            ratio <= 1.3,
        ))
    }
}

/// `unique.NAME`, "before → now" when the run before has it.
fn unique(
    name: &'static str,
    decimals: usize,
    met: fn(f64) -> bool,
) -> impl Fn(&Value, Option<&Value>) -> Option<String> {
    move |run, before| {
        let now = field(run, &format!("unique.{name}"))?;
        let text = match before.and_then(|b| field(b, &format!("unique.{name}"))) {
            Some(then) => format!("{} → {}", number(then, decimals), number(now, decimals)),
            None => number(now, decimals),
        };
        Some(against(text, met(now)))
    }
}

fn limits(bench: &Path) -> Result<String, BoxError> {
    let runs = runs(bench, "limits", true)?;
    let any = |_: f64| true;
    let mut rows: Vec<(&str, Cell)> = vec![
        (
            "`service_keyed_add`: hot adds with an `Idempotency-Key` over HTTP / the same adds in process (target 1.3)",
            Box::new(limit("service_keyed_add", false)),
        ),
        (
            "`service_plain_add`: the same without a key (target 1.3)",
            Box::new(limit("service_plain_add", false)),
        ),
        (
            "`cache_read`: all-hit cached read, 1,000 owners x 4 keys / raw `MGET` decoded by hand (target 1.3)",
            Box::new(limit("cache_read", true)),
        ),
        (
            "`service_cached_read`: the service's cached `counts:batchGet` over HTTP / the same read in process (target 1.3)",
            Box::new(limit("service_cached_read", true)),
        ),
        (
            "`unique_read`: 1,000 owners through the library / raw `SELECT` + merge (target 1.3)",
            Box::new(limit("unique_read", true)),
        ),
    ];
    // Rows measured only with an optional service (e.g. `--nats-url`) are
    // shown once a committed run has them: pages rendered before stay as
    // they are.
    let measured = |name: &str| {
        runs.iter().any(|(run, _)| {
            run.as_ref()
                .is_some_and(|r| field(r, &format!("limits.{name}.ratio")).is_some())
        })
    };
    if measured("mq_consume") {
        rows.push((
            "`mq_consume`: a JetStream backlog drained by the counting consumer / by a loop written by hand, per message (target 1.3)",
            Box::new(limit("mq_consume", false)),
        ));
    }
    let others: Vec<(&str, Cell)> = vec![
        (
            "one-member observes/s over HTTP",
            Box::new(unique("service_observes_per_s", 0, any)),
        ),
        (
            "the same members inserted into a membership table, /s",
            Box::new(unique("membership_inserts_per_s", 0, any)),
        ),
        (
            "`service_observe_vs_membership_insert` (target 5)",
            Box::new(unique("service_observe_vs_membership_insert", 2, |v| {
                v >= 5.0
            })),
        ),
        (
            "1,000-item batches over 1,000 owners, items/s (target 20,000)",
            Box::new(unique("spread_observe_items_per_s", 0, |v| v >= 20_000.0)),
        ),
        (
            "p99 ms per 1,000-item request (target 1,000)",
            Box::new(unique("spread_observe_p99_ms", 0, |v| v < 1_000.0)),
        ),
        (
            "sketch table on disk / live sketch bytes (target 5)",
            Box::new(unique("sketch_disk_vs_live", 1, |v| v <= 5.0)),
        ),
        (
            "30-day union of 1,000 owners, ms (target 200)",
            Box::new(unique("union_30d_ms", 1, |v| v < 200.0)),
        ),
        (
            "full compaction of the sketch rows the loads left, rows folded a second",
            Box::new(unique("compaction_rows_folded_per_s", 0, any)),
        ),
    ];
    rows.extend(others);
    Ok(table("figure", &rows, &runs))
}

fn limits_adds(bench: &Path) -> Result<String, BoxError> {
    let runs = runs(bench, "limits", false)?;
    let mut rows: Vec<(&str, Cell)> = Vec::new();
    for (name, kind) in [
        ("service_keyed_add", "keyed"),
        ("service_plain_add", "plain"),
    ] {
        let rate = move |figure: &'static str| -> Cell {
            Box::new(move |run, _| Some(number(field(run, &format!("adds.{name}.{figure}"))?, 0)))
        };
        let groups: Cell = Box::new(move |run, _| {
            let mean = |phase: &str| field(run, &format!("adds.{name}.{phase}_mean_group"));
            Some(format!(
                "{}, {}",
                number(mean("http")?, 1),
                number(mean("in_process")?, 1)
            ))
        });
        let (over_http, in_process) = match kind {
            "keyed" => ("keyed adds/s over HTTP", "keyed adds/s in process"),
            _ => ("plain adds/s over HTTP", "plain adds/s in process"),
        };
        rows.push((over_http, rate("http_adds_per_s")));
        rows.push((in_process, rate("in_process_adds_per_s")));
        rows.push(("requests per group: over HTTP, in process", groups));
    }
    Ok(table("64 clients, one hot counter", &rows, &runs))
}

/// `service-bench`'s figures (the service guide's targets in the labels).
fn service(bench: &Path) -> Result<String, BoxError> {
    let runs = runs(bench, "service", false)?;
    let rate =
        |path: &'static str| -> Cell { Box::new(move |run, _| Some(number(field(run, path)?, 0))) };
    let ratio = |path: &'static str, met: fn(f64) -> bool| -> Cell {
        Box::new(move |run, _| {
            let value = field(run, path)?;
            Some(against(number(value, 2), met(value)))
        })
    };
    let reads: Cell = Box::new(|run, _| {
        let ms = |name: &str, decimals| {
            field(run, &format!("batch_get_ms.{name}")).map(|v| number(v, decimals))
        };
        Some(format!(
            "{} / {} / {} / {} / {}",
            ms("http", 1)?,
            ms("in_process", 1)?,
            ms("http_cached", 1)?,
            ms("in_process_cached", 1)?,
            ms("naive_http", 0)?
        ))
    });
    let latency: Cell = Box::new(|run, _| {
        let p99 = field(run, "p99_ms_at_rate")?;
        Some(against(
            format!(
                "{} / {}",
                number(field(run, "p50_ms_at_rate")?, 1),
                number(p99, 1)
            ),
            p99 <= 50.0,
        ))
    });
    let exact: Cell = Box::new(|run, _| {
        Some(format!(
            "{}, {}",
            number(field(run, "lost")?, 0),
            number(field(run, "doubled")?, 0)
        ))
    });
    let rows: Vec<(&str, Cell)> = vec![
        (
            "keyed adds/s (64 clients, one counter)",
            rate("adds_per_s.idempotent"),
        ),
        ("adds/s without keys", rate("adds_per_s.plain")),
        ("naive service's adds/s", rate("adds_per_s.naive")),
        (
            "the same requests with no database (`http_ceiling`)",
            rate("adds_per_s.http_ceiling"),
        ),
        (
            "requests per committed group (`mean_add_group`)",
            Box::new(|run, _| Some(number(field(run, "mean_add_group")?, 1))),
        ),
        (
            "keyed / naive (`hot_vs_naive`, target 10)",
            ratio("ratios.hot_vs_naive", |v| v >= 10.0),
        ),
        (
            "keyed / without keys (`idempotent_vs_plain`, target 0.5)",
            ratio("ratios.idempotent_vs_plain", |v| v >= 0.5),
        ),
        (
            "batch get 1,000 x 4, ms: HTTP / in process / cached / cached in process / naive",
            reads,
        ),
        (
            "HTTP / in process (`http_vs_inprocess_read`, target at most 1.5)",
            ratio("ratios.http_vs_inprocess_read", |v| v <= 1.5),
        ),
        (
            "uncached / cached (`cached_vs_uncached_read`, target 5)",
            ratio("ratios.cached_vs_uncached_read", |v| v >= 5.0),
        ),
        (
            "p50 / p99 ms at 2,000 adds/s offered (target p99 at most 50)",
            latency,
        ),
        ("lost, doubled", exact),
    ];
    Ok(table("figure", &rows, &runs))
}

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

/// Each backend's run of `bench` and, with `before`, the run before it.
fn runs(bench: &Path, name: &str, before: bool) -> Result<Vec<Run>, BoxError> {
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

/// The blocks of `page` rewritten: the new text, and the names of the
/// blocks that changed.
fn rewrite(page: &str, bench: &Path) -> Result<(String, Vec<String>), BoxError> {
    let mut out = String::new();
    let mut changed = Vec::new();
    let mut rest = page;
    while let Some(start) = rest.find("<!-- figures:") {
        let open_end = rest[start..]
            .find("-->")
            .ok_or("an unclosed figures marker")?
            + start
            + 3;
        let name = rest[start + "<!-- figures:".len()..open_end - 3]
            .trim()
            .to_owned();
        let close = format!("<!-- /figures:{name} -->");
        let end = rest[open_end..]
            .find(&close)
            .ok_or_else(|| format!("no {close}"))?
            + open_end;
        let fresh = match name.as_str() {
            "limits" => limits(bench)?,
            "limits-adds" => limits_adds(bench)?,
            "growth" => growth(bench)?,
            "growth-unique" => growth_unique(bench)?,
            "service" => service(bench)?,
            other => return Err(format!("no figures table named `{other}`").into()),
        };
        let fresh = format!("\n{fresh}");
        if rest[open_end..end] != fresh {
            changed.push(name);
        }
        out.push_str(&rest[..open_end]);
        out.push_str(&fresh);
        rest = &rest[end..];
    }
    out.push_str(rest);
    Ok((out, changed))
}

fn run() -> Result<bool, BoxError> {
    let check = std::env::args().any(|a| a == "--check");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let bench = root.join("docs/bench");
    let mut stale = Vec::new();
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs/guide"))?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.push(root.join("README.md"));
    pages.sort();
    for page in pages {
        let text = std::fs::read_to_string(&page)?;
        let (fresh, changed) = rewrite(&text, &bench)?;
        for name in &changed {
            stale.push(format!("{} ({name})", page.display()));
        }
        if !check && !changed.is_empty() {
            std::fs::write(&page, fresh)?;
        }
    }
    if stale.is_empty() {
        println!("guide-figures: every generated table matches docs/bench/");
        return Ok(true);
    }
    if check {
        eprintln!(
            "guide-figures: tables differ from docs/bench/ (run `cargo run -p bench --bin guide-figures`): {}",
            stale.join(", ")
        );
        return Ok(false);
    }
    println!("guide-figures: rewrote {}", stale.join(", "));
    Ok(true)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("guide-figures: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_grouped_and_rounded() {
        assert_eq!(number(1234567.891, 1), "1,234,567.9");
        assert_eq!(number(999.0, 0), "999");
        assert_eq!(number(1000.0, 0), "1,000");
        assert_eq!(number(-23749.3, 0), "-23,749");
        assert_eq!(number(0.456, 2), "0.46");
    }

    #[test]
    fn blocks_are_rewritten_from_the_json_and_stale_ones_named() {
        let dir = std::env::temp_dir().join(format!("guide-figures-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run = serde_json::json!({"limits": {"cache_read": {"ratio": 1.5, "own_us": 3000.0, "raw_us": 2000.0}}});
        std::fs::write(dir.join("limits-postgres.json"), run.to_string()).unwrap();
        let page = "intro\n<!-- figures:limits -->\nold\n<!-- /figures:limits -->\nafter\n";
        let (fresh, changed) = rewrite(page, &dir).unwrap();
        assert_eq!(changed, ["limits"]);
        assert!(
            fresh.starts_with("intro\n<!-- figures:limits -->\n| figure |"),
            "{fresh}"
        );
        assert!(
            fresh.contains("| **1.50 (3.00 / 2.00 ms), missed** | n/a |"),
            "{fresh}"
        );
        assert!(!fresh.contains("mq_consume"), "{fresh}");
        assert!(
            fresh.ends_with("<!-- /figures:limits -->\nafter\n"),
            "{fresh}"
        );
        // Rendered again from the same JSON: nothing changes.
        let (again, changed) = rewrite(&fresh, &dir).unwrap();
        assert!(changed.is_empty());
        assert_eq!(again, fresh);
        // A run with the MQ figure shows its row; the other backend "n/a".
        let run = serde_json::json!({"limits": {"mq_consume": {"ratio": 1.25, "own_us": 50.0, "raw_us": 40.0}}});
        std::fs::write(dir.join("limits-mariadb.json"), run.to_string()).unwrap();
        let (with_mq, changed) = rewrite(&fresh, &dir).unwrap();
        assert_eq!(changed, ["limits"]);
        assert!(
            with_mq.contains("(target 1.3) | n/a | 1.25 (50.0 / 40.0 us) |"),
            "{with_mq}"
        );
        std::fs::remove_file(dir.join("limits-mariadb.json")).unwrap();
        let unknown = rewrite("<!-- figures:nope -->\n<!-- /figures:nope -->", &dir).unwrap_err();
        assert!(unknown.to_string().contains("`nope`"), "{unknown}");
        assert!(
            rewrite("<!-- figures:limits -->", &dir).is_err(),
            "an unclosed block"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
