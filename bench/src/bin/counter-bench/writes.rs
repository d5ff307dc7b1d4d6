//! Write cells: clients hammering one counter in one design, then the check
//! that every committed increment is in the stored total (on a cluster,
//! once every node reads the same total). `buffered` and `zipf` cells have
//! modules of their own.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use counter_core::{CounterTable, Counters, DeltaBatch, SlotPolicy, SlotStrategy, Writer};
use indicatif::ProgressBar;
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, TransactionTrait, Value,
    sea_query::{Alias, ColumnDef, Expr, ExprTrait, InsertStatement, Query, Table},
};

use crate::{
    buffered::{self, BufferedFigures},
    cli::{Design, Strategy, Workload},
    grid,
    nodes::{Node, Nodes},
    zipf::{self, ZipfFigures},
};

/// The counted owner every client of a contended design writes.
pub const HOT_OWNER: i64 = 1;
/// The counter's key.
pub const KEY: &str = "likes";
const HOT_TABLE: &str = "bench_hot";
const CHILD_TABLE: &str = "bench_children";
pub const COUNTER_TABLE: &str = "bench_counters";

/// One cell of the benchmark grid.
#[derive(Debug, Clone, Copy)]
pub struct Cell {
    pub workload: Workload,
    pub design: Design,
    /// `None` for designs without slots; for `adaptive`, its ceiling.
    pub slots: Option<u16>,
    /// `None` for designs without slots.
    pub strategy: Option<Strategy>,
    pub clients: usize,
}

/// What a cell measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CellResult {
    pub workload: Workload,
    /// Not serialized: the JSON's `design` is `name`, which tells apart the
    /// slot counts of `zipf`'s `fixed16` and `fixed64`.
    #[serde(skip)]
    pub design: Design,
    /// The design as reported ([`grid::label`]): its name, or in `zipf`
    /// `fixed<slots>` and `adaptive`.
    #[serde(rename = "design")]
    pub name: String,
    /// The fixed slot count, or the ceiling of `adaptive`.
    pub slots: Option<u16>,
    pub slot_strategy: Option<Strategy>,
    pub clients: usize,
    /// Committed transactions per second (the median round's, with `--repeat`).
    pub tx_per_s: f64,
    /// Every round's transactions per second, in the order they ran.
    pub rounds: Vec<f64>,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Increments that committed, warm-up included.
    pub expected_total: i64,
    /// The counter's stored total afterwards.
    pub observed_total: i64,
    /// For `business`: child rows stored (must equal `expected_total`).
    pub observed_children: Option<i64>,
    /// Transactions that failed (rolled back, so not in the expected total).
    pub errors: u64,
    pub last_error: Option<String>,
    /// `observed_total == expected_total` (and the child rows agree, and
    /// on a cluster every node read the same), in every round.
    pub total_ok: bool,
    /// On a multi-node run: whether every node read the same totals within
    /// `nodes::AGREEMENT_WAIT` (the totals checked are the first node's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes_agreed: Option<bool>,
    /// For `buffered`: statements, flushes and lag (see [`BufferedFigures`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub buffered: Option<BufferedFigures>,
    /// For `zipf`: hot throughput, rows per cold counter, cold reads (see
    /// [`ZipfFigures`]), as fields of the cell itself.
    #[serde(flatten)]
    pub zipf: Option<ZipfFigures>,
}

impl CellResult {
    /// The median round, carrying every round's throughput; its check holds
    /// only if every round's did.
    pub fn median(mut rounds: Vec<CellResult>) -> Option<CellResult> {
        let throughputs: Vec<f64> = rounds.iter().map(|r| r.tx_per_s).collect();
        let all_ok = rounds.iter().all(|r| r.total_ok);
        let agreed = rounds
            .iter()
            .filter_map(|r| r.nodes_agreed)
            .reduce(|a, b| a && b);
        let errors = rounds.iter().map(|r| r.errors).sum();
        rounds.sort_by(|a, b| a.tx_per_s.total_cmp(&b.tx_per_s));
        let mut median = rounds.into_iter().nth(throughputs.len() / 2)?;
        median.rounds = throughputs;
        median.total_ok = all_ok;
        median.nodes_agreed = agreed;
        median.errors = errors;
        Some(median)
    }
}

/// How long a cell runs, and the application work of a business transaction.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub warmup: Duration,
    pub measured: Duration,
    pub app_work: Duration,
}

/// What every cell of a run shares besides its coordinates.
pub struct Shared {
    pub timing: Timing,
    pub buffer: buffered::Settings,
    /// `None` unless `zipf` is among the workloads.
    pub zipf: Option<zipf::Settings>,
    /// The run's progress bar: a `zipf` cell shows its history there.
    pub progress: ProgressBar,
}

/// Prepared statements and handles shared by a cell's clients.
pub struct Setup {
    pub cell: Cell,
    pub app_work: Duration,
    pub counters: Counters<i64>,
    backend: DbBackend,
    hot_update: Statement,
    /// [`raw_upsert_sql`], built once.
    raw_upsert: String,
    pub child_insert: InsertStatement,
}

/// Runs one cell on fresh tables, created on the first node.
pub async fn run(nodes: &Nodes, cell: Cell, shared: &Shared) -> Result<CellResult, BoxError> {
    let timing = shared.timing;
    let setup = Arc::new(prepare(nodes.first(), cell, timing.app_work).await?);
    if cell.design == Design::Buffered {
        return buffered::run(nodes, setup, timing, &shared.buffer).await;
    }
    if cell.workload == Workload::Zipf {
        let settings = shared
            .zipf
            .as_ref()
            .ok_or("a zipf cell in a run without the zipf workload")?;
        return zipf::run(nodes, setup, timing, settings, &shared.progress).await;
    }
    let tallies = run_clients(
        nodes,
        &setup,
        timing,
        |client, db, counters, warm_end, end| {
            let setup = setup.clone();
            async move { drive(&db, &setup, &counters, client, warm_end, end).await }
        },
    )
    .await?;
    let mut tally = Tally::default();
    for client in tallies {
        tally.merge(client);
    }

    let (observed, agreed) = nodes.agree(async |db| observe(db, &setup).await).await?;
    let tx_per_s = tally.latencies_ms.len() as f64 / timing.measured.as_secs_f64();
    CellResult::checked(cell, tx_per_s, tally, observed).map(|r| r.agreed(agreed))
}

/// Runs `client` for each of the cell's clients in a task of its own,
/// with its node's pool and counters handle, all warming up until the same
/// instant and stopping at the same end; their results, in client order.
/// Every handle is built first, so a failure leaves no client running.
pub async fn run_clients<T, F, Fut>(
    nodes: &Nodes,
    setup: &Setup,
    timing: Timing,
    client: F,
) -> Result<Vec<T>, BoxError>
where
    F: Fn(usize, DatabaseConnection, Counters<i64>, Instant, Instant) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles = (0..setup.cell.clients)
        .map(|c| setup.counters_on(nodes.for_client(c)))
        .collect::<Result<Vec<_>, _>>()?;
    let warm_end = Instant::now() + timing.warmup;
    let end = warm_end + timing.measured;
    let tasks: Vec<_> = handles
        .into_iter()
        .enumerate()
        .map(|(c, counters)| {
            let db = nodes.for_client(c).db.clone();
            tokio::spawn(client(c, db, counters, warm_end, end))
        })
        .collect();
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(task.await?);
    }
    Ok(results)
}

impl CellResult {
    /// A cell's result: `tx_per_s`, the latency percentiles of `tally`, and
    /// the check of the stored `(total, child rows)` against its committed
    /// increments.
    pub fn checked(
        cell: Cell,
        tx_per_s: f64,
        tally: Tally,
        (observed_total, observed_children): (i64, Option<i64>),
    ) -> Result<Self, BoxError> {
        let expected_total = i64::try_from(tally.committed)?;
        let mut latencies = tally.latencies_ms;
        latencies.sort_by(f64::total_cmp);
        Ok(CellResult {
            workload: cell.workload,
            design: cell.design,
            name: grid::label(cell.workload, cell.design, cell.slots),
            slots: cell.slots,
            slot_strategy: cell.strategy,
            clients: cell.clients,
            tx_per_s,
            rounds: vec![tx_per_s],
            p50_ms: percentile(&latencies, 0.50),
            p99_ms: percentile(&latencies, 0.99),
            expected_total,
            observed_total,
            observed_children,
            errors: tally.errors,
            last_error: tally.last_error,
            total_ok: observed_total == expected_total
                && observed_children.is_none_or(|children| children == expected_total),
            nodes_agreed: None,
            buffered: None,
            zipf: None,
        })
    }

    /// Records whether the nodes agreed (`None` on one node); nodes that
    /// never agreed fail the check.
    pub fn agreed(mut self, agreed: Option<bool>) -> Self {
        self.nodes_agreed = agreed;
        self.total_ok &= agreed != Some(false);
        self
    }
}

impl Setup {
    /// The handle of a client writing through `node`: the cell's, or with
    /// `--slot-strategy shares` one carrying `Writer::new(node, nodes)`, so
    /// that each node's clients write only their node's share of the slots.
    pub fn counters_on(&self, node: Node<'_>) -> Result<Counters<i64>, BoxError> {
        if self.cell.strategy != Some(Strategy::Shares) {
            return Ok(self.counters.clone());
        }
        let writer = Writer::new(u16::try_from(node.index)?, u16::try_from(node.count)?)?;
        Ok(Counters::new(
            self.counters.table().clone().with_writer(writer),
        ))
    }
}

/// The cell's counter table: `adaptive` grows each counter from one row up
/// to its ceiling; the others have a fixed slot count (one without slots).
fn counter_table(cell: Cell) -> Result<CounterTable, BoxError> {
    let strategy: SlotStrategy = cell.strategy.map_or(SlotStrategy::default(), Into::into);
    let table = CounterTable::new(COUNTER_TABLE)?.with_slot_strategy(strategy);
    Ok(match cell.design {
        Design::Adaptive => {
            table.with_slot_policy(SlotPolicy::adaptive(1..=cell.slots.unwrap_or(1))?)
        }
        _ => table.with_slots(cell.slots.unwrap_or(1))?,
    })
}

/// Drops and recreates the cell's tables, so every total starts at zero.
async fn prepare(
    db: &DatabaseConnection,
    cell: Cell,
    app_work: Duration,
) -> Result<Setup, BoxError> {
    let counters = Counters::<i64>::new(counter_table(cell)?);
    counters.drop_table(db).await?;
    counters.create_table(db).await?;

    for table in [HOT_TABLE, CHILD_TABLE] {
        through_pooler(
            db,
            &Table::drop()
                .table(Alias::new(table))
                .if_exists()
                .to_owned(),
        )
        .await?;
    }
    through_pooler(
        db,
        &Table::create()
            .table(Alias::new(HOT_TABLE))
            .col(
                ColumnDef::new(Alias::new("id"))
                    .big_integer()
                    .not_null()
                    .primary_key(),
            )
            .col(ColumnDef::new(Alias::new("n")).big_integer().not_null())
            .to_owned(),
    )
    .await?;
    through_pooler(
        db,
        &Query::insert()
            .into_table(Alias::new(HOT_TABLE))
            .columns([Alias::new("id"), Alias::new("n")])
            .values([HOT_OWNER.into(), 0i64.into()])?
            .to_owned(),
    )
    .await?;
    through_pooler(
        db,
        &Table::create()
            .table(Alias::new(CHILD_TABLE))
            .col(
                ColumnDef::new(Alias::new("id"))
                    .integer()
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

    let backend = db.get_database_backend();
    let hot_update = backend.build(
        Query::update()
            .table(Alias::new(HOT_TABLE))
            .value(Alias::new("n"), Expr::col(Alias::new("n")).add(1))
            .and_where(Expr::col(Alias::new("id")).eq(HOT_OWNER)),
    );
    let child_insert = Query::insert()
        .into_table(Alias::new(CHILD_TABLE))
        .columns([Alias::new("owner_id")])
        .values([HOT_OWNER.into()])?
        .to_owned();
    Ok(Setup {
        cell,
        app_work,
        counters,
        backend,
        hot_update,
        raw_upsert: raw_upsert_sql(backend),
        child_insert,
    })
}

/// Per-client results, merged at the end.
#[derive(Default)]
pub struct Tally {
    pub committed: u64,
    pub errors: u64,
    pub last_error: Option<String>,
    pub latencies_ms: Vec<f64>,
}

impl Tally {
    /// Counts one transaction that started at `started`; a committed one
    /// is timed when `timed`. Returns whether it committed.
    pub fn record<E: std::fmt::Display>(
        &mut self,
        result: Result<(), E>,
        started: Instant,
        timed: bool,
    ) -> bool {
        match result {
            Ok(()) => {
                self.committed += 1;
                if timed {
                    self.latencies_ms
                        .push(started.elapsed().as_secs_f64() * 1e3);
                }
                true
            }
            Err(e) => {
                self.errors += 1;
                self.last_error = Some(e.to_string());
                false
            }
        }
    }

    pub fn merge(&mut self, other: Tally) {
        self.committed += other.committed;
        self.errors += other.errors;
        self.last_error = other.last_error.or(self.last_error.take());
        self.latencies_ms.extend(other.latencies_ms);
    }
}

/// One client: transactions back to back until `end`; only those started
/// after the warm-up are timed, all committed ones are counted.
async fn drive(
    db: &DatabaseConnection,
    setup: &Setup,
    counters: &Counters<i64>,
    client: usize,
    warm_end: Instant,
    end: Instant,
) -> Tally {
    let mut tally = Tally::default();
    // Uncontended clients each own a counter; the others share the hot one.
    let owner = match setup.cell.design {
        Design::Uncontended => HOT_OWNER + client as i64,
        _ => HOT_OWNER,
    };
    loop {
        let started = Instant::now();
        if started >= end {
            return tally;
        }
        let result = transaction(db, setup, counters, owner).await;
        tally.record(result, started, started >= warm_end);
    }
}

/// One client transaction. A failed one (a deadlock, a certification
/// failure at COMMIT on a cluster) is rolled back when `txn` is dropped,
/// and counted as an error, not as an increment.
async fn transaction(
    db: &DatabaseConnection,
    setup: &Setup,
    counters: &Counters<i64>,
    owner: i64,
) -> Result<(), BoxError> {
    match setup.cell.workload {
        Workload::Autocommit | Workload::Zipf => increment(db, setup, counters, owner).await,
        Workload::Business if setup.cell.design == Design::Deferred => {
            let txn = db.begin().await?;
            txn.execute(&setup.child_insert).await?;
            // Collected, not written: no slot row is locked yet.
            let mut batch = DeltaBatch::new();
            batch.add(counters, owner, KEY, 1)?;
            tokio::time::sleep(setup.app_work).await;
            // Written just before COMMIT: the slot row is locked for the
            // commit only.
            batch.apply_in(&txn).await?;
            txn.commit().await?;
            Ok(())
        }
        Workload::Business => {
            let txn = db.begin().await?;
            txn.execute(&setup.child_insert).await?;
            increment(&txn, setup, counters, owner).await?;
            tokio::time::sleep(setup.app_work).await;
            txn.commit().await?;
            Ok(())
        }
    }
}

/// The increment itself, in the cell's design (`deferred` outside
/// `business`, and `adaptive` on one counter, are plain increments).
async fn increment<C: ConnectionTrait + TransactionTrait>(
    db: &C,
    setup: &Setup,
    counters: &Counters<i64>,
    owner: i64,
) -> Result<(), BoxError> {
    match setup.cell.design {
        Design::HotRow => {
            counter_core::pooling::execute(db, setup.hot_update.clone()).await?;
        }
        Design::Buffered => return Err("buffered cells are driven by buffered::run".into()),
        Design::Slotted | Design::Uncontended | Design::Deferred | Design::Adaptive => {
            counters.increment(db, owner, KEY).await?;
        }
        Design::SlottedRaw => {
            let slot = counters.table().next_slot(&owner, KEY);
            let values: [Value; 3] = [owner.into(), KEY.into(), slot.into()];
            let sql = setup.raw_upsert.clone();
            counter_core::pooling::execute(
                db,
                Statement::from_sql_and_values(setup.backend, sql, values),
            )
            .await?;
        }
    }
    Ok(())
}

/// The slotted upsert as an application would write it by hand, once per
/// cell: `(owner, key, slot)` are bound, the delta is the literal 1.
fn raw_upsert_sql(backend: DbBackend) -> String {
    let [o, k, s] = [1, 2, 3].map(|n| placeholder(backend, n));
    let insert = format!(
        "INSERT INTO {COUNTER_TABLE} (owner_id, count_key, slot, value) VALUES ({o}, {k}, {s}, 1)"
    );
    match backend {
        DbBackend::MySql => format!("{insert} ON DUPLICATE KEY UPDATE value = value + 1"),
        _ => format!(
            "{insert} ON CONFLICT (owner_id, count_key, slot) \
             DO UPDATE SET value = {COUNTER_TABLE}.value + 1"
        ),
    }
}

/// The `n`th (1-based) bind marker of hand-written SQL.
pub fn placeholder(backend: DbBackend, n: usize) -> String {
    match backend {
        DbBackend::Postgres => format!("${n}"),
        _ => "?".to_owned(),
    }
}

/// The stored total (and child rows, for `business`), read after the clients stopped.
pub async fn observe(
    db: &DatabaseConnection,
    setup: &Setup,
) -> Result<(i64, Option<i64>), BoxError> {
    let total = match setup.cell.design {
        Design::HotRow => {
            scalar(
                db,
                &format!("SELECT n FROM {HOT_TABLE} WHERE id = {HOT_OWNER}"),
            )
            .await?
        }
        Design::Slotted
        | Design::SlottedRaw
        | Design::Buffered
        | Design::Deferred
        | Design::Adaptive => setup.counters.get(db, HOT_OWNER, KEY).await?,
        Design::Uncontended => {
            let owners: Vec<i64> = (0..setup.cell.clients as i64)
                .map(|c| HOT_OWNER + c)
                .collect();
            let counts = setup.counters.get_many(db, &owners, &[KEY]).await?;
            counts.values().flat_map(|keys| keys.values()).sum()
        }
    };
    let children = match setup.cell.workload {
        Workload::Business => {
            Some(scalar(db, &format!("SELECT COUNT(*) FROM {CHILD_TABLE}")).await?)
        }
        Workload::Autocommit | Workload::Zipf => None,
    };
    Ok((total, children))
}

/// The first column of a one-row query, as an i64.
pub async fn scalar(db: &DatabaseConnection, sql: &str) -> Result<i64, BoxError> {
    let row = counter_core::pooling::query_one(
        db,
        Statement::from_string(db.get_database_backend(), sql),
    )
    .await?
    .ok_or_else(|| DbErr::RecordNotFound(sql.to_owned()))?;
    Ok(row.try_get_by_index::<i64>(0)?)
}

/// The value below which a fraction `q` of the sorted samples fall.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A setup statement sent as the crate sends its own (in a transaction of
/// its own behind a transaction pooler: see `counter_core::pooling`).
async fn through_pooler<S: sea_orm::StatementBuilder>(
    db: &DatabaseConnection,
    stmt: &S,
) -> Result<sea_orm::ExecResult, DbErr> {
    counter_core::pooling::execute(db, db.get_database_backend().build(stmt)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(tx_per_s: f64, total_ok: bool) -> CellResult {
        CellResult {
            workload: Workload::Business,
            design: Design::Slotted,
            name: "slotted".into(),
            slots: Some(16),
            slot_strategy: Some(Strategy::Rotating),
            clients: 64,
            tx_per_s,
            rounds: vec![tx_per_s],
            p50_ms: tx_per_s / 100.0,
            p99_ms: 0.0,
            expected_total: 1,
            observed_total: 1,
            observed_children: None,
            errors: 1,
            last_error: None,
            total_ok,
            nodes_agreed: Some(true),
            buffered: None,
            zipf: None,
        }
    }

    #[test]
    fn the_median_round_keeps_every_throughput_and_every_check() {
        let median = CellResult::median(vec![
            result(300.0, true),
            result(100.0, false),
            result(200.0, true),
        ])
        .unwrap();
        assert_eq!(median.tx_per_s, 200.0);
        assert_eq!(median.p50_ms, 2.0, "figures come from the median round");
        assert_eq!(median.rounds, [300.0, 100.0, 200.0]);
        assert!(!median.total_ok, "one failed round fails the cell");
        assert_eq!(median.nodes_agreed, Some(true));
        assert_eq!(median.errors, 3);
        assert!(CellResult::median(Vec::new()).is_none());
    }

    #[test]
    fn nodes_that_never_agree_fail_the_check() {
        assert!(result(1.0, true).agreed(None).total_ok);
        assert!(result(1.0, true).agreed(Some(true)).total_ok);
        let split = result(1.0, true).agreed(Some(false));
        assert!(!split.total_ok);
        assert_eq!(split.nodes_agreed, Some(false));
    }

    fn setup(design: Design, strategy: Strategy) -> Setup {
        let cell = Cell {
            workload: Workload::Zipf,
            design,
            slots: Some(16),
            strategy: Some(strategy),
            clients: 3,
        };
        Setup {
            cell,
            app_work: Duration::ZERO,
            counters: Counters::new(counter_table(cell).unwrap()),
            backend: DbBackend::Postgres,
            hot_update: Statement::from_string(DbBackend::Postgres, ""),
            raw_upsert: String::new(),
            child_insert: Query::insert().to_owned(),
        }
    }

    #[test]
    fn with_shares_each_node_writes_its_own_slots() {
        let db = DatabaseConnection::default();
        let shares = setup(Design::Slotted, Strategy::Shares);
        for index in 0..3 {
            let node = Node {
                index,
                count: 3,
                db: &db,
            };
            let counters = shares.counters_on(node).unwrap();
            for _ in 0..32 {
                let slot = counters.table().next_slot(&HOT_OWNER, KEY);
                assert_eq!(slot as usize % 3, index, "{slot}");
            }
        }
        let node = Node {
            index: 1,
            count: 3,
            db: &db,
        };
        let rotating = setup(Design::Slotted, Strategy::Rotating);
        assert_eq!(rotating.counters_on(node).unwrap().table().writer(), None);
    }

    #[test]
    fn adaptive_cells_grow_from_one_row_to_their_ceiling() {
        let adaptive = setup(Design::Adaptive, Strategy::Rotating);
        assert_eq!(
            adaptive.counters.table().slot_policy(),
            SlotPolicy::adaptive(1..=16).unwrap()
        );
        let fixed = setup(Design::Slotted, Strategy::Rotating);
        assert_eq!(fixed.counters.table().slots_for(KEY).get(), 16);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&samples, 0.50), 50.0);
        assert_eq!(percentile(&samples, 0.99), 99.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn raw_upserts_use_each_backends_placeholders() {
        let pg = raw_upsert_sql(DbBackend::Postgres);
        assert!(pg.contains("$3") && pg.contains("ON CONFLICT"), "{pg}");
        let my = raw_upsert_sql(DbBackend::MySql);
        assert!(
            my.contains("ON DUPLICATE KEY UPDATE") && !my.contains('$'),
            "{my}"
        );
    }
}
