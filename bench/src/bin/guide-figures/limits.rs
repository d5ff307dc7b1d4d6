//! `limits`' tables: each path beside its raw limit, the unique figures
//! (`limits-{postgres,mariadb}.json`, and `-before.json`), and the adds
//! over HTTP beside the same adds in process.

use std::path::Path;

use serde_json::Value;

use crate::{
    BoxError, Generator,
    render::{Cell, against, field, number, runs, table},
};

pub(crate) const TABLES: &[(&str, Generator)] = &[("limits", limits), ("limits-adds", limits_adds)];

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
