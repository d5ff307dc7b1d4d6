//! `mq-bench`'s table (`mq-<backend>-<broker>.json`, one run per database
//! and broker): a row per run, each figure against its target, then a line
//! on the runs' totals and targets.

use std::path::Path;

use serde_json::Value;

use crate::{
    BoxError, Generator,
    render::{against, field, grid, load, number},
};

pub(crate) const TABLES: &[(&str, Generator)] = &[("mq", mq)];

/// The databases: their label, their file names' spelling, and the
/// messages a second they must apply.
const DATABASES: [(&str, &str, f64); 4] = [
    ("PostgreSQL 15", "postgres", 10_000.0),
    ("MariaDB 10.11", "mariadb", 10_000.0),
    ("SQLite, a file", "sqlite-file", 5_000.0),
    ("SQLite, in memory", "sqlite", 5_000.0),
];

/// The brokers: their label and their file names' spelling.
const BROKERS: [(&str, &str); 2] = [("JetStream", "nats"), ("RabbitMQ", "amqp")];

/// The other targets: statements per batch and p99 at most, batched over
/// one transaction per message at least.
const STATEMENTS_TARGET: f64 = 4.0;
const P99_MS_TARGET: f64 = 250.0;
const NAIVE_TARGET: f64 = 20.0;

/// A run's cells (without its labels), and whether every figure met its
/// target; `None` for a figure the run lacks.
fn cells(run: &Value, applied_target: f64) -> (Vec<Option<String>>, bool) {
    let mut all_met = true;
    let mut judged = |text: Option<String>, met: Option<bool>| {
        let met = met.unwrap_or(true);
        all_met &= met;
        text.map(|t| against(t, met))
    };
    let applied = field(run, "batched.applied_per_s");
    let statements = field(run, "batched.statements_per_batch");
    let (p50, p99) = (field(run, "batched.p50_ms"), field(run, "batched.p99_ms"));
    let ratio = field(run, "ratio_batched_over_naive");
    let cells = vec![
        judged(
            applied.map(|v| number(v, 0)),
            applied.map(|v| v >= applied_target),
        ),
        judged(
            statements.map(|v| number(v, 2)),
            statements.map(|v| v <= STATEMENTS_TARGET),
        ),
        judged(
            p50.zip(p99)
                .map(|(a, b)| format!("{} / {}", number(a, 1), number(b, 1))),
            p99.map(|v| v <= P99_MS_TARGET),
        ),
        field(run, "naive.applied_per_s").map(|v| number(v, 0)),
        judged(
            ratio.map(|v| number(v, 1)),
            ratio.map(|v| v >= NAIVE_TARGET),
        ),
    ];
    (cells, all_met)
}

/// What a run's totals say went wrong, if anything.
fn wrong(run: &Value) -> Option<String> {
    let lost = field(run, "lost").unwrap_or(f64::NAN);
    let doubled = field(run, "doubled").unwrap_or(f64::NAN);
    let totals_ok = run["totals_ok"].as_bool() == Some(true);
    if lost == 0.0 && doubled == 0.0 && totals_ok {
        return None;
    }
    let mut what = format!("{lost} lost, {doubled} doubled");
    if !totals_ok {
        what.push_str(", owners' totals wrong");
    }
    Some(what)
}

fn mq(bench: &Path) -> Result<String, BoxError> {
    let mut rows = Vec::new();
    let mut every_met = true;
    let mut problems = Vec::new();
    let mut offered = None;
    for (database, db_file, applied_target) in DATABASES {
        for (broker, broker_file) in BROKERS {
            let run = load(bench, &format!("mq-{db_file}-{broker_file}"))?;
            let mut row = vec![database.to_owned(), broker.to_owned()];
            match &run {
                Some(run) => {
                    let (cells, met) = cells(run, applied_target);
                    every_met &= met;
                    offered = offered.or(field(run, "offered_rate"));
                    row.extend(cells.into_iter().map(|c| c.unwrap_or_else(|| "n/a".into())));
                    if let Some(what) = wrong(run) {
                        problems.push(format!("{database} and {broker}: {what}"));
                    }
                }
                None => row.extend(std::iter::repeat_n("n/a".to_owned(), 5)),
            }
            rows.push(row);
        }
    }
    let mut out = grid(
        &[
            "backend",
            "broker",
            "applied/s",
            "statements/batch",
            "p50 / p99 ms",
            "naive/s",
            "batched / naive",
        ],
        2,
        &rows,
    );
    let totals = if problems.is_empty() {
        "Every run: 0 lost, 0 doubled, every owner's total right".to_owned()
    } else {
        format!("Runs whose totals are wrong: {}", problems.join("; "))
    };
    let targets = format!(
        "{} a second on PostgreSQL and MariaDB, {} on SQLite, {}x the \
         one-transaction-per-message consumer, at most {} statements per batch, p99 at most {} \
         ms at {}",
        number(DATABASES[0].2, 0),
        number(DATABASES[2].2, 0),
        NAIVE_TARGET,
        STATEMENTS_TARGET,
        number(P99_MS_TARGET, 0),
        offered.map_or("the offered rate".into(), |r| format!(
            "{} a second",
            number(r, 0)
        ))
    );
    let verdict = if every_met {
        format!("every target met ({targets})")
    } else {
        format!("a figure in bold misses its target ({targets})")
    };
    out.push('\n');
    out.push_str(&wrap(&format!("{totals}; {verdict}."), 100));
    Ok(out)
}

/// `text` in lines of at most `width` characters (a longer word alone on
/// its line), each ending with a newline, as the guides' prose is wrapped.
fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(applied: f64, p99: f64, lost: u64) -> Value {
        serde_json::json!({
            "batched": {
                "applied_per_s": applied, "statements_per_batch": 4.0,
                "p50_ms": 3.96902, "p99_ms": p99
            },
            "naive": {"applied_per_s": 340.0},
            "offered_rate": 2000,
            "lost": lost, "doubled": 0, "totals_ok": lost == 0,
            "ratio_batched_over_naive": applied / 340.0
        })
    }

    #[test]
    fn a_row_per_run_with_misses_in_bold_and_the_totals_said() {
        let dir = std::env::temp_dir().join(format!("guide-figures-mq-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("mq-postgres-nats.json"),
            run(16_964.3, 14.51, 0).to_string(),
        )
        .unwrap();
        let table = mq(&dir).unwrap();
        assert!(
            table.starts_with(
                "| backend | broker | applied/s | statements/batch | p50 / p99 ms | naive/s | batched / naive |\n|---|---|---:|---:|---:|---:|---:|\n"
            ),
            "{table}"
        );
        assert!(
            table.contains(
                "| PostgreSQL 15 | JetStream | 16,964 | 4.00 | 4.0 / 14.5 | 340 | 49.9 |\n"
            ),
            "{table}"
        );
        assert!(
            table.contains("| MariaDB 10.11 | RabbitMQ | n/a | n/a | n/a | n/a | n/a |\n"),
            "{table}"
        );
        assert!(
            table.ends_with(
                "|\n\nEvery run: 0 lost, 0 doubled, every owner's total right; every target met (10,000 a second on\n\
                 PostgreSQL and MariaDB, 5,000 on SQLite, 20x the one-transaction-per-message consumer, at most 4\n\
                 statements per batch, p99 at most 250 ms at 2,000 a second).\n"
            ),
            "{table}"
        );
        // A slow SQLite run that lost a message and waited too long.
        std::fs::write(
            dir.join("mq-sqlite-amqp.json"),
            run(4_000.0, 300.0, 1).to_string(),
        )
        .unwrap();
        let table = mq(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            table.contains(
                "| SQLite, in memory | RabbitMQ | **4,000, missed** | 4.00 | **4.0 / 300.0, missed** | 340 | **11.8, missed** |\n"
            ),
            "{table}"
        );
        assert!(
            table.contains(
                "Runs whose totals are wrong: SQLite, in memory and RabbitMQ: 1 lost, 0 doubled, owners' totals\n\
                 wrong; a figure in bold misses its target"
            ),
            "{table}"
        );
    }
}
