//! How long a recount takes, whether it grows linearly with the owners, and
//! whether it finds exactly the damage done.
//!
//! For each `--owners` size: fresh tables, `--children` child rows per owner,
//! every counter stored right except three kinds of damage, each on 1% of the
//! owners (by `owner % 100`):
//!
//! | damage | truth | stored | drift |
//! |---|---:|---:|---:|
//! | one too many | children | children + 1 | -1 |
//! | a counter, no child rows | 0 | children | -children |
//! | child rows, no counter rows | children | 0 | +children |
//!
//! The last two put owners on one side of the recount only (the truth query
//! or the counter table), so the keyset bound of each batch, taken on both
//! sides, is exercised. Then a dry run and a repairing run of `reconcile`,
//! both timed, and a third run that must find nothing. The dry run and the
//! repair must each report exactly the damaged owners with exactly the
//! expected truth, stored total and drift, the sum of the damage as
//! `total_abs_drift`, and every owner as checked (exit 1 otherwise).
//!
//! `cargo run --release -p bench --bin reconcile-bench -- --database-url <URL>`

use std::{collections::BTreeMap, process::ExitCode, time::Instant};

use clap::{Parser, builder::RangedU64ValueParser};
use counter_core::{
    CounterTable, Counters, Drift, Reconcile, ReconcileReport, Truth, limits::MAX_RECONCILE_BATCH,
};
use sea_orm::{
    ConnectionTrait, Database, DatabaseConnection,
    sea_query::{Alias, Asterisk, ColumnDef, Expr, ExprTrait, Index, Query, Table},
};

/// Times `reconcile` over growing numbers of owners.
///
/// The ranges bound the work (at most 10^10 child rows, so `owners *
/// children` cannot overflow) and refuse a batch size `reconcile` would
/// refuse, before any table is touched.
#[derive(Debug, Parser)]
struct Args {
    /// Database to measure (default: a temporary SQLite file).
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Owner counts to measure, each 1 to 10,000,000.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "10000,100000",
        value_parser = clap::value_parser!(u64).range(1..=10_000_000)
    )]
    owners: Vec<u64>,
    /// Child rows per owner, 1 to 1,000.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1_000))]
    children: u64,
    /// Owners per reconcile batch, 1 to `counter_core::limits::MAX_RECONCILE_BATCH`.
    #[arg(
        long,
        default_value_t = 1_000,
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=MAX_RECONCILE_BATCH as u64)
    )]
    batch_size: usize,
}

const CHILDREN: &str = "reconcile_bench_children";
const COUNTERS: &str = "reconcile_bench_counters";
const KEY: &str = "children";

/// Rows per `INSERT` of child rows, and owners per counter write: the
/// tables are filled a chunk at a time, never from one big vector.
const CHUNK: usize = 5_000;

/// How many problems of one recount are printed before giving up on it.
const SHOWN: usize = 10;

type BoxError = Box<dyn std::error::Error>;

/// The damage done to an owner's counter, by `owner % 100`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Damage {
    /// Stored right.
    None,
    /// Child rows and a counter one too high.
    OneTooMany,
    /// A counter, but no child rows: the truth is 0, and the owner is only
    /// on the counter side of the recount.
    NoChildren,
    /// Child rows, but its slot rows deleted: the owner is only on the
    /// truth side of the recount.
    NoCounter,
}

impl Damage {
    /// The `owner % 100` of the owners whose slot rows are deleted: written
    /// as every other counter is, then removed by one `DELETE`.
    const NO_COUNTER_REMAINDER: i64 = 71;

    fn of(owner: i64) -> Damage {
        match owner % 100 {
            0 => Damage::OneTooMany,
            37 => Damage::NoChildren,
            Self::NO_COUNTER_REMAINDER => Damage::NoCounter,
            _ => Damage::None,
        }
    }

    /// What a recount must report for an owner with `children` children:
    /// `(truth, stored)`, or `None` when they agree.
    fn expected(self, children: i64) -> Option<(i64, i64)> {
        match self {
            Damage::None => None,
            Damage::OneTooMany => Some((children, children + 1)),
            Damage::NoChildren => Some((0, children)),
            Damage::NoCounter => Some((children, 0)),
        }
    }
}

/// What `fill` did: the drift a recount must find, owner by owner, how
/// many distinct owners have a truth or a stored counter, and how many child
/// rows it wrote.
struct Damaged {
    drift: BTreeMap<i64, Drift<i64>>,
    owners: u64,
    rows: u64,
}

impl Damaged {
    fn total_abs_drift(&self) -> u128 {
        self.drift
            .values()
            .map(|d| u128::from(d.drift.unsigned_abs()))
            .sum()
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    bench::exit_code("reconcile-bench", run(Args::parse()).await)
}

async fn run(args: Args) -> Result<bool, BoxError> {
    let sqlite = std::env::temp_dir().join(format!("reconcile-bench-{}.db", std::process::id()));
    let url = args
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}?mode=rwc", sqlite.display()));
    let db = Database::connect(&url).await?;
    let counters = Counters::<i64>::new(CounterTable::new(COUNTERS)?);
    println!(
        "| owners | children | batch | dry run s | repair s | owners/s (repair) | drifted found |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut ok = true;
    let mut per_owner = Vec::new();
    for &owners in &args.owners {
        let damaged = fill(&db, &counters, owners, args.children).await?;
        let truth = Truth::statement(
            Query::select()
                .column(Alias::new("owner_id"))
                .expr(Expr::col(Asterisk).count())
                .from(Alias::new(CHILDREN))
                .group_by_col(Alias::new("owner_id"))
                .to_owned(),
        )
        .owners_in(Alias::new(CHILDREN), Alias::new("owner_id"));
        let options = Reconcile::new().batch_size(args.batch_size);
        let started = Instant::now();
        let dry = counters
            .reconcile(&db, KEY, truth.clone(), &options.clone().dry_run(true))
            .await?;
        let dry_s = started.elapsed().as_secs_f64();
        let started = Instant::now();
        let real = counters
            .reconcile(&db, KEY, truth.clone(), &options)
            .await?;
        let real_s = started.elapsed().as_secs_f64();
        let quiet = counters.reconcile(&db, KEY, truth, &options).await?;

        let repaired = Damaged {
            drift: BTreeMap::new(),
            ..damaged
        };
        let problems: Vec<String> = [
            ("dry run", &dry, &damaged),
            ("repair", &real, &damaged),
            ("after the repair", &quiet, &repaired),
        ]
        .into_iter()
        .flat_map(|(run, report, expected)| {
            problems(report, expected)
                .into_iter()
                .map(move |problem| format!("{owners} owners, {run}: {problem}"))
        })
        .collect();
        for problem in &problems {
            eprintln!("reconcile-bench: {problem}");
        }
        ok &= problems.is_empty();
        println!(
            "| {owners} | {} | {} | {dry_s:.2} | {real_s:.2} | {:.0} | {} of {} |",
            damaged.rows,
            args.batch_size,
            owners as f64 / real_s,
            real.owners_drifted,
            damaged.drift.len(),
        );
        per_owner.push(real_s / owners as f64);
    }
    if let (Some(first), Some(last)) = (per_owner.first(), per_owner.last()) {
        println!(
            "time per owner, largest / smallest size: {:.2} (1.0 = linear)",
            last / first
        );
    }
    drop(db);
    let _ = std::fs::remove_file(&sqlite);
    if !ok {
        eprintln!(
            "reconcile-bench: a recount did not report exactly the damaged owners and their drift"
        );
    }
    Ok(ok)
}

/// Where `report` differs from `expected`: the owners checked, the drifted
/// owners with their truth, stored total and drift, and the total, each
/// compared exactly. Empty when it matches.
fn problems(report: &ReconcileReport<i64>, expected: &Damaged) -> Vec<String> {
    let mut problems = Vec::new();
    if report.owners_checked != expected.owners {
        problems.push(format!(
            "{} owners checked, expected {}",
            report.owners_checked, expected.owners
        ));
    }
    if report.owners_drifted != report.drifted.len() as u64 {
        problems.push(format!(
            "{} owners drifted, but {} listed",
            report.owners_drifted,
            report.drifted.len()
        ));
    }
    if report.total_abs_drift != expected.total_abs_drift() {
        problems.push(format!(
            "total abs drift {}, expected {}",
            report.total_abs_drift,
            expected.total_abs_drift()
        ));
    }
    let mut found = BTreeMap::new();
    for drift in &report.drifted {
        if found.insert(drift.owner, drift).is_some() {
            problems.push(format!("owner {} reported twice", drift.owner));
        }
    }
    for (owner, drift) in &found {
        match expected.drift.get(owner) {
            Some(want) if want == *drift => {}
            Some(want) => problems.push(format!("found {drift:?}, expected {want:?}")),
            None => problems.push(format!("found {drift:?} on an owner left intact")),
        }
    }
    for (owner, want) in &expected.drift {
        if !found.contains_key(owner) {
            problems.push(format!("missed {want:?}"));
        }
    }
    let more = problems.len().saturating_sub(SHOWN);
    problems.truncate(SHOWN);
    if more > 0 {
        problems.push(format!("and {more} more problems"));
    }
    problems
}

/// Fresh tables: `children` rows per owner and every counter right, except
/// the [`Damage`] of every owner. Returns the drift a recount must find.
async fn fill(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    owners: u64,
    children: u64,
) -> Result<Damaged, BoxError> {
    let backend = db.get_database_backend();
    db.execute(
        &Table::drop()
            .table(Alias::new(CHILDREN))
            .if_exists()
            .to_owned(),
    )
    .await?;
    counters.drop_table(db).await?;
    db.execute(
        &Table::create()
            .table(Alias::new(CHILDREN))
            .col(
                ColumnDef::new(Alias::new("id"))
                    .big_integer()
                    .not_null()
                    .auto_increment()
                    .primary_key(),
            )
            .col(
                ColumnDef::new(Alias::new("owner_id"))
                    .big_integer()
                    .not_null(),
            )
            .to_owned(),
    )
    .await?;
    db.execute(
        &Index::create()
            .name("reconcile_bench_children_owner")
            .table(Alias::new(CHILDREN))
            .col(Alias::new("owner_id"))
            .to_owned(),
    )
    .await?;
    counters.create_table(db).await?;

    // Both bounded by the CLI ranges: at most 10^7 and 10^3.
    let owners = i64::try_from(owners)?;
    let children = i64::try_from(children)?;
    let mut damaged = Damaged {
        drift: BTreeMap::new(),
        // No damage takes both the child rows and the counter of an owner:
        // every owner is on at least one side of the recount.
        owners: owners as u64,
        rows: 0,
    };
    let mut rows: Vec<i64> = Vec::with_capacity(CHUNK);
    let mut deltas: Vec<(i64, &str, i64)> = Vec::with_capacity(CHUNK);
    for owner in 1..=owners {
        let damage = Damage::of(owner);
        if let Some((truth, current)) = damage.expected(children) {
            damaged.drift.insert(
                owner,
                Drift {
                    owner,
                    truth,
                    current,
                    drift: truth - current,
                },
            );
        }
        if damage != Damage::NoChildren {
            damaged.rows += children as u64;
            for _ in 0..children {
                rows.push(owner);
                if rows.len() == CHUNK {
                    insert_children(db, backend, &rows).await?;
                    rows.clear();
                }
            }
        }
        // The slot rows of `NoCounter` owners are written, then deleted below.
        let stored = children + i64::from(damage == Damage::OneTooMany);
        deltas.push((owner, KEY, stored));
        if deltas.len() == CHUNK {
            counters.add_many(db, deltas.drain(..)).await?;
        }
    }
    insert_children(db, backend, &rows).await?;
    counters.add_many(db, deltas).await?;
    db.execute(
        &Query::delete()
            .from_table(Alias::new(COUNTERS))
            .and_where(
                Expr::col(Alias::new("owner_id"))
                    .modulo(100)
                    .eq(Damage::NO_COUNTER_REMAINDER),
            )
            .to_owned(),
    )
    .await?;
    Ok(damaged)
}

/// One `INSERT` of a child row per owner id in `owners` (none if empty).
async fn insert_children(
    db: &DatabaseConnection,
    backend: sea_orm::DbBackend,
    owners: &[i64],
) -> Result<(), BoxError> {
    if owners.is_empty() {
        return Ok(());
    }
    let mut insert = Query::insert();
    insert
        .into_table(Alias::new(CHILDREN))
        .columns([Alias::new("owner_id")]);
    for &owner in owners {
        insert.values_panic([owner.into()]);
    }
    db.execute_raw(backend.build(&insert)).await?;
    Ok(())
}
