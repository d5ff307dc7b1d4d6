//! How long a recount takes, and whether it grows linearly with the owners.
//!
//! For each `--owners` size: fresh tables, `--children` child rows per owner,
//! every counter stored right except 1% of owners (one too many), then a
//! dry run and a repairing run of `reconcile`, both timed; each must find
//! exactly the corrupted owners (exit 1 otherwise).
//!
//! `cargo run --release -p examples --bin reconcile-bench -- --database-url <URL>`

use std::{process::ExitCode, time::Instant};

use clap::Parser;
use counter_core::{CounterTable, Counters, Reconcile, Truth};
use sea_orm::{
    ConnectionTrait, Database, DatabaseConnection,
    sea_query::{Alias, Asterisk, ColumnDef, Expr, ExprTrait, Index, Query, Table},
};

/// Times `reconcile` over growing numbers of owners.
#[derive(Debug, Parser)]
struct Args {
    /// Database to measure (default: a temporary SQLite file).
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Owner counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    owners: Vec<i64>,
    /// Child rows per owner.
    #[arg(long, default_value_t = 5)]
    children: i64,
    /// Owners per reconcile batch.
    #[arg(long, default_value_t = 1_000)]
    batch_size: usize,
}

const CHILDREN: &str = "reconcile_bench_children";
const COUNTERS: &str = "reconcile_bench_counters";
const KEY: &str = "children";

type BoxError = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("reconcile-bench: {e}");
            ExitCode::FAILURE
        }
    }
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
        let corrupted = fill(&db, &counters, owners, args.children).await?;
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
        let found = (
            dry.owners_drifted,
            real.owners_drifted,
            quiet.owners_drifted,
        );
        ok &= found == (corrupted, corrupted, 0) && real.owners_checked == owners as u64;
        println!(
            "| {owners} | {} | {} | {dry_s:.2} | {real_s:.2} | {:.0} | {} of {corrupted} |",
            owners * args.children,
            args.batch_size,
            owners as f64 / real_s,
            real.owners_drifted,
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
        eprintln!("reconcile-bench: a recount did not find exactly the corrupted owners");
    }
    Ok(ok)
}

/// Fresh tables: `children` rows per owner, every counter right except every
/// hundredth owner's, which has one too many. Returns how many were corrupted.
async fn fill(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    owners: i64,
    children: i64,
) -> Result<u64, BoxError> {
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
    let rows: Vec<i64> = (0..owners * children).map(|i| i % owners + 1).collect();
    for chunk in rows.chunks(5_000) {
        let mut insert = Query::insert();
        insert
            .into_table(Alias::new(CHILDREN))
            .columns([Alias::new("owner_id")]);
        for &owner in chunk {
            insert.values_panic([owner.into()]);
        }
        db.execute_raw(backend.build(&insert)).await?;
    }
    let deltas = (1..=owners).map(|o| (o, KEY, children + i64::from(o % 100 == 0)));
    counters.add_many(db, deltas).await?;
    Ok((owners / 100) as u64)
}
