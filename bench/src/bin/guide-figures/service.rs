//! `service-bench`'s table (`service-{postgres,mariadb}.json`).

use std::path::Path;

use crate::{
    BoxError, Generator,
    render::{Cell, against, field, number, runs, table},
};

pub(crate) const TABLES: &[(&str, Generator)] = &[("service", service)];

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
