//! `limits --floor`'s table (`floor-{postgres,mariadb,sqlite}.json`): each
//! limit the machine sets, then each route's rate and its fraction of its
//! limit against the target.

use std::path::Path;

use crate::{
    BoxError, Generator,
    render::{Cell, THREE_BACKENDS, against, field, load, number, table_over},
};

pub(crate) const TABLES: &[(&str, Generator)] = &[("floor", floor)];

/// `floor.rates_per_s.NAME`, a whole number a second.
fn rate(name: &'static str) -> Cell {
    Box::new(move |run, _| Some(number(field(run, &format!("floor.rates_per_s.{name}"))?, 0)))
}

/// `floor.routes.NAME`: its fraction of its limit against the target,
/// with the two rates.
fn route(name: &'static str) -> Cell {
    Box::new(move |run, _| {
        let figure = |what: &str| field(run, &format!("floor.routes.{name}.{what}"));
        let (fraction, target) = (figure("fraction")?, figure("target")?);
        Some(against(
            format!(
                "{} ({} / {})",
                number(fraction, 2),
                number(figure("per_s")?, 0),
                number(figure("limit_per_s")?, 0)
            ),
            fraction >= target,
        ))
    })
}

fn floor(bench: &Path) -> Result<String, BoxError> {
    let runs = THREE_BACKENDS
        .iter()
        .map(|(_, file)| load(bench, &format!("floor-{file}")))
        .collect::<Result<Vec<_>, _>>()?;
    let rows: Vec<(String, Cell)> = vec![
        (
            "**limits**, a second".into(),
            Box::new(|_, _| Some(String::new())),
        ),
        ("the HTTP floor: `GET /healthz`".into(), rate("http_floor")),
        ("one-owner `SUM`, raw SQL".into(), rate("raw_sum")),
        (
            "`GET` of a cached entry, raw Redis".into(),
            rate("raw_redis_get"),
        ),
        (
            "the add's upsert in autocommit, raw SQL (reference)".into(),
            rate("raw_upsert"),
        ),
        (
            "1,000-item batches through `DeltaBatch::apply`, items".into(),
            rate("raw_batch_items"),
        ),
        (
            "**routes**: fraction of the limit (route / limit a second)".into(),
            Box::new(|_, _| Some(String::new())),
        ),
        (
            "`counters:add` / the floor (target 0.6)".into(),
            route("plain_add"),
        ),
        (
            "`counters:add` with an `Idempotency-Key` / the floor (target 0.4)".into(),
            route("keyed_add"),
        ),
        (
            "one-owner `counts:batchGet` / HTTP + SQL (target 0.8)".into(),
            route("batch_get"),
        ),
        (
            "the same, cached / HTTP + Redis (target 0.8)".into(),
            route("cached_batch_get"),
        ),
        (
            "one-member `counters:observe` / a plain add (target 0.8)".into(),
            route("observe_one"),
        ),
        (
            "1,000-item `counters:batchAdd`, items / the raw batch (target 0.77, 1.3x)".into(),
            route("batch_add_items"),
        ),
    ];
    let names: Vec<&str> = THREE_BACKENDS.iter().map(|(name, _)| *name).collect();
    Ok(table_over(
        "64 clients (16 for batches)",
        &names,
        &rows,
        &runs,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_route_is_shown_against_its_target() {
        let dir = std::env::temp_dir().join(format!("guide-figures-floor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run = serde_json::json!({
            "backend": "postgres",
            "floor": {
                "rates_per_s": {"http_floor": 40000.0, "raw_sum": 20000.0},
                "routes": {
                    "plain_add": {"per_s": 30000.0, "limit_per_s": 40000.0, "fraction": 0.75, "target": 0.6},
                    "batch_get": {"per_s": 6000.0, "limit_per_s": 13333.3, "fraction": 0.45, "target": 0.8}
                }
            }
        });
        std::fs::write(dir.join("floor-postgres.json"), run.to_string()).unwrap();
        let table = floor(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            table.contains("| the HTTP floor: `GET /healthz` | 40,000 | n/a | n/a |"),
            "{table}"
        );
        assert!(table.contains("| 0.75 (30,000 / 40,000) |"), "{table}");
        assert!(
            table.contains("| **0.45 (6,000 / 13,333), missed** |"),
            "{table}"
        );
    }
}
