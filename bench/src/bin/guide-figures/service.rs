//! `service-bench`'s tables (`service-{postgres,mariadb}.json`): every
//! figure (performance guide), and a few of them (service guide), each
//! shared figure's cell from the same function in both.

use std::path::Path;

use crate::{
    BoxError, Generator,
    render::{BACKENDS, Cell, against, field, number, runs, table, table_over},
};

pub(crate) const TABLES: &[(&str, Generator)] =
    &[("service", service), ("service-summary", service_summary)];

/// A rate at `path`, adds a second.
fn rate(path: &'static str) -> Cell {
    Box::new(move |run, _| Some(number(field(run, path)?, 0)))
}

/// The batch get's times at `names` (`batch_get_ms.NAME`), ms, one decimal.
fn reads(names: &'static [&'static str]) -> Cell {
    Box::new(move |run, _| {
        let times = names
            .iter()
            .map(|name| {
                let decimals = if *name == "naive_http" { 0 } else { 1 };
                field(run, &format!("batch_get_ms.{name}")).map(|v| number(v, decimals))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(times.join(" / "))
    })
}

/// p99 at the offered rate (with p50 before it when `p50`), against the
/// target of at most 50 ms.
fn latency(p50: bool) -> Cell {
    Box::new(move |run, _| {
        let p99 = field(run, "p99_ms_at_rate")?;
        let text = if p50 {
            format!(
                "{} / {}",
                number(field(run, "p50_ms_at_rate")?, 1),
                number(p99, 1)
            )
        } else {
            number(p99, 1)
        };
        Some(against(text, p99 <= 50.0))
    })
}

/// `service-bench`'s figures (the service guide's targets in the labels).
fn service(bench: &Path) -> Result<String, BoxError> {
    let runs = runs(bench, "service", false)?;
    let ratio = |path: &'static str, met: fn(f64) -> bool| -> Cell {
        Box::new(move |run, _| {
            let value = field(run, path)?;
            Some(against(number(value, 2), met(value)))
        })
    };
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
            reads(&[
                "http",
                "in_process",
                "http_cached",
                "in_process_cached",
                "naive_http",
            ]),
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
            latency(true),
        ),
        ("lost, doubled", exact),
    ];
    Ok(table("figure", &rows, &runs))
}

/// The service guide's table: a few of the same figures.
fn service_summary(bench: &Path) -> Result<String, BoxError> {
    let runs: Vec<_> = runs(bench, "service", false)?
        .into_iter()
        .map(|(run, _)| run)
        .collect();
    let rows: Vec<(&str, Cell)> = vec![
        (
            "keyed adds/s, 64 clients on one counter",
            rate("adds_per_s.idempotent"),
        ),
        (
            "the same, naive service (`UPDATE` of one row)",
            rate("adds_per_s.naive"),
        ),
        (
            "batch get 1,000 owners x 4 keys, ms: HTTP / cached",
            reads(&["http", "http_cached"]),
        ),
        ("p99 ms at 2,000 adds/s", latency(false)),
    ];
    let rows: Vec<(String, Cell)> = rows
        .into_iter()
        .map(|(label, cell)| (label.to_owned(), cell))
        .collect();
    let names: Vec<&str> = BACKENDS.iter().map(|(name, _)| *name).collect();
    Ok(table_over("", &names, &rows, &runs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_shares_the_full_tables_figures() {
        let dir =
            std::env::temp_dir().join(format!("guide-figures-service-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run = serde_json::json!({
            "adds_per_s": {"http_ceiling": 58135.0, "idempotent": 8919.0, "naive": 2783.0, "plain": 16663.0},
            "batch_get_ms": {"http": 9.27, "http_cached": 2.49, "in_process": 8.0, "in_process_cached": 1.58, "naive_http": 748.2},
            "doubled": 0, "lost": 0, "mean_add_group": 17.1,
            "p50_ms_at_rate": 1.98, "p99_ms_at_rate": 55.3,
            "ratios": {"cached_vs_uncached_read": 3.72, "hot_vs_naive": 3.2, "http_vs_inprocess_read": 1.16, "idempotent_vs_plain": 0.54}
        });
        std::fs::write(dir.join("service-postgres.json"), run.to_string()).unwrap();
        let summary = service_summary(&dir).unwrap();
        let full = service(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            summary.starts_with("| | PostgreSQL | MariaDB |\n|---|---:|---:|\n"),
            "{summary}"
        );
        assert!(
            summary.contains("| keyed adds/s, 64 clients on one counter | 8,919 | n/a |"),
            "{summary}"
        );
        assert!(
            summary.contains("ms: HTTP / cached | 9.3 / 2.5 | n/a |"),
            "{summary}"
        );
        // 55.3 ms misses the p99 target of 50, in both tables.
        assert!(
            summary.contains("| p99 ms at 2,000 adds/s | **55.3, missed** | n/a |"),
            "{summary}"
        );
        assert!(full.contains("| **2.0 / 55.3, missed** | n/a |"), "{full}");
        assert!(
            full.contains("| 9.3 / 8.0 / 2.5 / 1.6 / 748 | n/a |"),
            "{full}"
        );
    }
}
