//! README's performance summary: one ratio a row, each read from the JSON
//! of the bench it sums up, on PostgreSQL and MariaDB:
//! `counter-bench` (`{backend}-business.json`, `-grid.json`,
//! `-buffered.json`, `-zipf.json`), `cache-bench` (`{backend}-cache.json`,
//! standalone Redis), `mq-bench` (`mq-{backend}-{nats,amqp}.json`),
//! `service-bench` (`service-{backend}.json`) and `unique-bench`
//! (`unique-{backend}.json`).

use std::path::Path;

use serde_json::Value;

use crate::{
    BoxError, Generator,
    counter::{Ratio, ratio, read_ms, tx},
    render::{BACKENDS, field, load, number},
};

pub(crate) const TABLES: &[(&str, Generator)] = &[("readme", readme)];

/// A row's cell for one backend (its file name's spelling): `None` when
/// the JSON or the figure is missing.
type Row = fn(&Path, &str) -> Result<Option<String>, BoxError>;

/// `figure` of the JSON `name`, if committed.
fn from(
    bench: &Path,
    name: &str,
    figure: impl Fn(&Value) -> Option<String>,
) -> Result<Option<String>, BoxError> {
    Ok(load(bench, name)?.as_ref().and_then(figure))
}

/// `value` rounded to `decimals`, then "x".
fn times(value: f64, decimals: usize) -> String {
    format!("{}x", number(value, decimals))
}

const ROWS: &[(&str, Row)] = &[
    (
        "slotted (16 slots) / `UPDATE ... SET likes = likes + 1`",
        |bench, file| {
            from(bench, &format!("{file}-business"), |run| {
                Some(number(ratio(run, Ratio::SlottedVsHot)?.0, 1))
            })
        },
    ),
    (
        "slotted (64 slots) / every client on its own post (the ceiling)",
        |bench, file| {
            from(bench, &format!("{file}-grid"), |run| {
                Some(number(ratio(run, Ratio::SlottedVsCeiling)?.0, 2))
            })
        },
    ),
    (
        "the crate / the same upsert written by hand",
        |bench, file| {
            from(bench, &format!("{file}-grid"), |run| {
                Some(number(ratio(run, Ratio::CrateVsRaw(16))?.0, 2))
            })
        },
    ),
    (
        "batch read of 1,000 owners x 4 keys: a loop of reads / the crate",
        |bench, file| {
            from(bench, &format!("{file}-grid"), |run| {
                Some(times(
                    read_ms(run, "naive_loop")? / read_ms(run, "batch")?,
                    0,
                ))
            })
        },
    ),
    (
        "buffered writes / direct writes, 64 clients on one key",
        |bench, file| {
            from(bench, &format!("{file}-buffered"), |run| {
                let buffered = tx(run, "buffered", None, None)?;
                Some(times(
                    buffered / tx(run, "slotted", Some(64), Some("rotating"))?,
                    0,
                ))
            })
        },
    ),
    (
        "100,000 Zipf counters, cold reads: 16 slots / adaptive (1 row each)",
        |bench, file| {
            from(bench, &format!("{file}-zipf"), |run| {
                let read = |design: &str| {
                    run["cells"]
                        .as_array()?
                        .iter()
                        .find(|c| c["design"].as_str() == Some(design))?["cold_read_ms"]
                        .as_f64()
                };
                Some(times(read("fixed16")? / read("adaptive")?, 1))
            })
        },
    ),
    (
        "1,000 owners x 4 keys: uncached / `counter-redis`",
        |bench, file| {
            from(bench, &format!("{file}-cache"), |run| {
                let standalone = run
                    .as_array()?
                    .iter()
                    .find(|r| r["redis"].as_str() == Some("standalone"))?;
                Some(times(field(standalone, "hit_speedup")?, 0))
            })
        },
    ),
    (
        "`counter-mq` batches of 500 / one transaction per message (JetStream, RabbitMQ)",
        |bench, file| {
            let broker = |name: &str| {
                from(bench, &format!("mq-{file}-{name}"), |run| {
                    Some(times(field(run, "ratio_batched_over_naive")?, 0))
                })
            };
            Ok(broker("nats")?
                .zip(broker("amqp")?)
                .map(|(nats, amqp)| format!("{nats}, {amqp}")))
        },
    ),
    (
        "`counter-service`, 64 HTTP clients on one counter: keyed adds/s (group commit) / a naive service's hot-row `UPDATE`",
        |bench, file| {
            from(bench, &format!("service-{file}"), |run| {
                Some(number(field(run, "ratios.hot_vs_naive")?, 2))
            })
        },
    ),
    (
        "`counter-service` at the machine's limit (64 clients): a plain add / `GET /healthz`; a one-owner read / HTTP + its `SUM`",
        |bench, file| {
            from(bench, &format!("floor-{file}"), |run| {
                Some(format!(
                    "{}; {}",
                    number(field(run, "floor.routes.plain_add.fraction")?, 2),
                    number(field(run, "floor.routes.batch_get.fraction")?, 2)
                ))
            })
        },
    ),
    (
        "unique counts of 1,001 owners (2M memberships): `COUNT(DISTINCT)` / sketches; storage",
        |bench, file| {
            from(bench, &format!("unique-{file}"), |run| {
                Some(format!(
                    "{}; {}",
                    times(field(run, "ratios.read_vs_count_distinct")?, 0),
                    times(field(run, "ratios.storage_vs_membership")?, 0)
                ))
            })
        },
    ),
    (
        "unique counts, 64 writers on one owner: buffered observes / a membership-table insert; error at 1M members",
        |bench, file| {
            from(bench, &format!("unique-{file}"), |run| {
                Some(format!(
                    "{}; {} %",
                    times(field(run, "ratios.observe_vs_membership_insert")?, 0),
                    number(field(run, "relative_error_at_1m")? * 100.0, 2)
                ))
            })
        },
    ),
];

fn readme(bench: &Path) -> Result<String, BoxError> {
    let mut out = String::from("| ratio |");
    for (name, _) in BACKENDS {
        out.push_str(&format!(" {name} |"));
    }
    out.push_str("\n|---|");
    out.push_str(&"---:|".repeat(BACKENDS.len()));
    out.push('\n');
    for (label, row) in ROWS {
        out.push_str(&format!("| {label} |"));
        for (_, file) in BACKENDS {
            let text = row(bench, file)?.unwrap_or_else(|| "n/a".into());
            out.push_str(&format!(" {text} |"));
        }
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_row_reads_its_own_bench() {
        let dir = std::env::temp_dir().join(format!("guide-figures-readme-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, value: Value| {
            std::fs::write(dir.join(format!("{name}.json")), value.to_string()).unwrap();
        };
        write("service-postgres", json!({"ratios": {"hot_vs_naive": 3.2}}));
        write(
            "floor-mariadb",
            json!({"floor": {"routes": {"plain_add": {"fraction": 0.514},
                "batch_get": {"fraction": 0.8}}}}),
        );
        write(
            "mariadb-cache",
            json!([{"redis": "cluster", "hit_speedup": 8.4},
                {"redis": "standalone", "hit_speedup": 13.07}]),
        );
        write(
            "unique-mariadb",
            json!({"relative_error_at_1m": 0.00484,
                "ratios": {"observe_vs_membership_insert": 122.6}}),
        );
        // One broker's run only: the row needs both.
        write(
            "mq-postgres-nats",
            json!({"ratio_batched_over_naive": 49.9}),
        );
        let table = readme(&dir).unwrap();
        assert!(
            table.starts_with("| ratio | PostgreSQL | MariaDB |\n|---|---:|---:|\n"),
            "{table}"
        );
        assert!(
            table.contains("naive service's hot-row `UPDATE` | 3.20 | n/a |"),
            "{table}"
        );
        assert!(table.contains("/ `counter-redis` | n/a | 13x |"), "{table}");
        assert!(
            table.contains("HTTP + its `SUM` | n/a | 0.51; 0.80 |"),
            "{table}"
        );
        assert!(
            table.contains("error at 1M members | n/a | 123x; 0.48 % |"),
            "{table}"
        );
        assert!(
            table.contains("(JetStream, RabbitMQ) | n/a | n/a |"),
            "{table}"
        );
        assert!(table.contains("(the ceiling) | n/a | n/a |"), "{table}");
        assert_eq!(table.lines().count(), 2 + ROWS.len());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
