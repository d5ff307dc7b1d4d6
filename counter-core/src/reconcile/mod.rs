//! Recounts: repairing a counter's drift from the truth (the guarantee is on
//! [`Counters::reconcile`](crate::Counters::reconcile)).

use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbErr, QueryTrait, TransactionOptions, TransactionTrait,
    sea_query::{Alias, IntoColumnRef, IntoTableRef, SelectStatement},
};

use crate::{
    CounterCache, Counters, DeltaBatch, detach,
    error::{CounterError, Result},
    key::validate_key,
    observe,
    owner::{self, OwnerColumn, OwnerId},
    retry,
    sql::{self, Dialect, OwnerIndex, OwnerRange, RecountLock, TruthSql},
    typed::{KeyOf, KeySpace},
    walk::Forward,
};

use crate::limits::MAX_RECONCILE_BATCH;

/// Where the true counts come from: a query yielding `(owner_id, count)`
/// rows, at most one per owner, or the declaration of a counter cache.
///
/// ```
/// use counter_core::Truth;
/// use sea_orm::sea_query::{Alias, Asterisk, Expr, ExprTrait, Query};
///
/// // The comments of each post: any SeaORM or sea-query select whose first
/// // two columns are the owner id and its count.
/// let truth = Truth::statement(
///     Query::select()
///         .column(Alias::new("post_id"))
///         .expr(Expr::col(Asterisk).count())
///         .from(Alias::new("comments"))
///         .group_by_col(Alias::new("post_id"))
///         .to_owned(),
/// );
/// # let _ = truth;
/// ```
#[derive(Debug, Clone)]
pub struct Truth {
    source: Source,
    owners: Option<OwnerIndex>,
}

#[derive(Debug, Clone)]
enum Source {
    Query(Box<SelectStatement>),
    Cache {
        child: &'static str,
        resolve: fn(Dialect, OwnerColumn, &str, &str) -> Option<TruthSql>,
    },
    Rows(RowsOf),
}

/// The rows of a child table counted by parent, named by table and column
/// ([`Truth::rows_of`]): the truth of a counter cache where its entity
/// cannot be named, as in a migration crate.
#[derive(Debug, Clone)]
pub struct RowsOf {
    table: String,
    via: String,
    sum: Option<String>,
    when: Option<(String, bool)>,
}

impl RowsOf {
    /// Adds up this integer column instead of counting rows (`SUM`,
    /// `NULL` adding 0), as a cache's `sum = column`.
    pub fn sum(mut self, column: impl Into<String>) -> Self {
        self.sum = Some(column.into());
        self
    }

    /// Counts only the rows whose boolean `column` is `expected`, as a
    /// cache's `when = column` (`when = !column` for `false`).
    pub fn when(mut self, column: impl Into<String>, expected: bool) -> Self {
        self.when = Some((column.into(), expected));
        self
    }

    /// What of this truth `db` does not have: `[table]` if the table is
    /// missing, else the columns it reads (`via`, `sum`, `when`) that the
    /// table lacks; empty when everything is there. Reads only the catalog
    /// (the connection's schema). Worth calling at start-up: SQLite takes
    /// a double-quoted name that is no column for a string literal, so a
    /// misspelt column there counts nothing instead of failing.
    pub async fn missing<C: ConnectionTrait>(&self, db: &C) -> Result<Vec<String>> {
        let dialect = Dialect::of(db)?;
        let table = self.table.as_str();
        if detach::query_one(db, sql::align::table_exists(dialect, table))
            .await?
            .is_none()
        {
            return Ok(vec![table.to_owned()]);
        }
        let columns = std::iter::once(&self.via)
            .chain(&self.sum)
            .chain(self.when.as_ref().map(|(column, _)| column));
        let mut missing = Vec::new();
        for column in columns {
            let found = sql::align::column_exists(dialect, None, table, column);
            if detach::query_one(db, found).await?.is_none() {
                missing.push(format!("{table}.{column}"));
            }
        }
        Ok(missing)
    }
}

impl From<RowsOf> for Truth {
    fn from(rows: RowsOf) -> Self {
        Self {
            source: Source::Rows(rows),
            owners: None,
        }
    }
}

impl Truth {
    /// The counts a sea-orm query yields (`Entity::find().select_only()...`):
    /// its first column is the owner id, its second the count (an integer
    /// value: a `SUM` over a decimal column with a fractional part is an
    /// error, not a rounded count; rows with a `NULL` owner are ignored), at
    /// most one row per owner.
    ///
    /// # String owners
    ///
    /// The recount compares, orders and bounds the query's owner column in
    /// the companion table's exact collation (`COLLATE "C"` on PostgreSQL,
    /// after a cast to `text`, so `citext` columns too;
    /// `utf8mb4_bin` on MySQL/MariaDB, `BINARY` on SQLite), whatever the
    /// column's own. What it cannot undo is the query's own `GROUP BY`: on
    /// a column in MySQL's default `utf8mb4_general_ci`, `GROUP BY post_id`
    /// makes `abc`, `ABC` and `Abç` one row, and the recount would move
    /// counts between them. So group (and filter, and join) string owner ids
    /// in that exact collation too:
    ///
    /// ```sql
    /// -- MySQL/MariaDB
    /// SELECT CONVERT(post_id USING utf8mb4) COLLATE utf8mb4_bin, COUNT(*)
    ///   FROM comments GROUP BY CONVERT(post_id USING utf8mb4) COLLATE utf8mb4_bin
    /// -- PostgreSQL (any database collation; nondeterministic ICU ones included)
    /// SELECT CAST(post_id AS TEXT) COLLATE "C", COUNT(*) FROM comments
    ///   GROUP BY CAST(post_id AS TEXT) COLLATE "C"
    /// ```
    ///
    /// [`Truth::counter_cache`] does this for you. A query whose owners come
    /// back in another order than the companion table's is caught by the
    /// walk's order check ([`CounterError::WalkStalled`]) rather than looped
    /// on, but ids it merged cannot be told apart afterwards.
    pub fn query<Q: QueryTrait<QueryStatement = SelectStatement>>(query: Q) -> Self {
        Self::statement(query.into_query())
    }

    /// [`Truth::query`] for a sea-query `SelectStatement`.
    pub fn statement(query: SelectStatement) -> Self {
        Self {
            source: Source::Query(Box::new(query)),
            owners: None,
        }
    }

    /// Where the truth's owner ids can be listed in order cheaply: a column
    /// with an index, usually the foreign key the query groups by.
    ///
    /// A keyset recount bounds each batch by the `batch_size`-th owner on
    /// each side. Without this, the truth side's is read through the truth
    /// query itself, which PostgreSQL narrows to the batch but MySQL,
    /// MariaDB and SQLite compute whole for every batch: fine for thousands
    /// of owners, quadratic for millions. [`Truth::counter_cache`] sets it to
    /// the cache's `via` column.
    pub fn owners_in(mut self, table: impl IntoTableRef, column: impl IntoColumnRef) -> Self {
        self.owners = Some(OwnerIndex {
            table: table.into_table_ref(),
            column: column.into_column_ref(),
        });
        self
    }

    /// The counts a counter cache declared on the child entity `E` keeps:
    /// its rows grouped by parent, counted (`COUNT(*)`) or summed, with its
    /// condition. Which of `E`'s caches is picked by the table and key being
    /// reconciled; none is [`CounterError::NoCounterCache`].
    ///
    /// Only `E`'s rows are the truth: if two child entities feed the same
    /// key (comments and reviews both counted in a post's `activity`),
    /// reconciling with one of them would take the other's rows away; use
    /// [`Truth::query`] with a `UNION ALL` of both instead.
    pub fn counter_cache<E: CounterCache>() -> Self {
        Self {
            source: Source::Cache {
                child: std::any::type_name::<E>(),
                resolve: cache_truth::<E>,
            },
            owners: None,
        }
    }

    /// The rows of `table` grouped by their parent column `via`, counted
    /// (or summed with [`RowsOf::sum`], filtered with [`RowsOf::when`]):
    /// what [`Truth::counter_cache`] reads, for code that cannot name the
    /// child entity, such as a backfill in a migration crate
    /// ([`Counters::backfill_migration`](crate::Counters::backfill_migration)).
    /// The names are quoted identifiers, never user input.
    pub fn rows_of(table: impl Into<String>, via: impl Into<String>) -> RowsOf {
        RowsOf {
            table: table.into(),
            via: via.into(),
            sum: None,
            when: None,
        }
    }

    fn resolve(
        self,
        dialect: Dialect,
        column: OwnerColumn,
        table: &str,
        key: &str,
    ) -> Result<TruthSql> {
        let mut truth =
            match self.source {
                Source::Query(query) => TruthSql {
                    query: *query,
                    owners: None,
                },
                Source::Cache { child, resolve } => resolve(dialect, column, table, key)
                    .ok_or_else(|| CounterError::NoCounterCache {
                        child,
                        table: table.to_owned(),
                        key: key.to_owned(),
                    })?,
                Source::Rows(rows) => sql::cache_truth(
                    dialect,
                    column,
                    Alias::new(rows.table),
                    Alias::new(rows.via),
                    rows.sum.map(Alias::new),
                    rows.when
                        .map(|(flag, expected)| (Alias::new(flag), expected)),
                ),
            };
        if let Some(owners) = self.owners {
            truth.owners = Some(owners);
        }
        Ok(truth)
    }
}

impl From<SelectStatement> for Truth {
    fn from(query: SelectStatement) -> Self {
        Self::statement(query)
    }
}

fn cache_truth<E: CounterCache>(
    dialect: Dialect,
    column: OwnerColumn,
    table: &str,
    key: &str,
) -> Option<TruthSql> {
    let rule = E::cache_rules()
        .into_iter()
        .find(|rule| rule.parent_table == table && rule.key == key)?;
    Some(sql::cache_truth(
        dialect,
        column,
        E::default(),
        rule.via,
        rule.sum,
        rule.when,
    ))
}

/// How a recount runs: batch size, which owners, and whether to write.
///
/// ```
/// use counter_core::Reconcile;
///
/// let check_only = Reconcile::<i64>::new().owners([1, 2, 3]).dry_run(true);
/// let nightly = Reconcile::<i64>::new().batch_size(5_000);
/// # let _ = (check_only, nightly);
/// ```
#[derive(Debug, Clone)]
pub struct Reconcile<I> {
    batch_size: usize,
    owners: Option<Vec<I>>,
    dry_run: bool,
}

impl<I> Default for Reconcile<I> {
    fn default() -> Self {
        Self {
            batch_size: 1_000,
            owners: None,
            dry_run: false,
        }
    }
}

impl<I: OwnerId> Reconcile<I> {
    /// Every owner, in batches of 1,000, writing the repairs.
    pub fn new() -> Self {
        Self::default()
    }

    /// Owners per batch, `1..=MAX_RECONCILE_BATCH`. Each batch is one
    /// snapshot and one short transaction: smaller batches hold the lock and
    /// the repaired slot rows for less time.
    pub fn batch_size(mut self, owners: usize) -> Self {
        self.batch_size = owners;
        self
    }

    /// Only these owners (any order, duplicates allowed); others are not read.
    pub fn owners(mut self, owners: impl IntoIterator<Item = I>) -> Self {
        self.owners = Some(owners.into_iter().collect());
        self
    }

    /// Report the drift without repairing it: no lock, no write.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }
}

/// What a recount found, and repaired unless it was a dry run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileReport<I> {
    /// Owners that have a true count or a stored total (or were asked for).
    pub owners_checked: u64,
    /// Owners whose stored total differed from the truth.
    pub owners_drifted: u64,
    /// The sum of `|drift|` over all owners.
    pub total_abs_drift: u128,
    /// Each drifted owner, in owner order.
    pub drifted: Vec<Drift<I>>,
    /// Snapshots taken (one per batch).
    pub batches: u64,
    /// Whether the drift was left as found.
    pub dry_run: bool,
}

impl<I> Default for ReconcileReport<I> {
    fn default() -> Self {
        Self {
            owners_checked: 0,
            owners_drifted: 0,
            total_abs_drift: 0,
            drifted: Vec::new(),
            batches: 0,
            dry_run: false,
        }
    }
}

/// One owner's drift, as seen in its batch's snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift<I> {
    /// The owner.
    pub owner: I,
    /// The true count.
    pub truth: i64,
    /// The stored total at the snapshot.
    pub current: i64,
    /// `truth - current`: the increment applied (unless a dry run).
    pub drift: i64,
}

impl<I: OwnerId, S: KeySpace> Counters<I, S> {
    /// Recounts `key` from `truth` and adds each owner's drift to its
    /// counter, without losing a write made while the recount runs.
    ///
    /// A counter kept by a counter cache changes in the same transaction as the
    /// child row it counts, so every committed write moves the truth and the
    /// stored total by the same amount: `drift = truth - total` is unchanged by
    /// it. A recount therefore reads both sides in **one statement** (one
    /// snapshot: a write is in both sides or in neither), and adds the drift it
    /// found as an ordinary increment, never an absolute value: writes that
    /// commit between the read and the increment are kept, because they did not
    /// change the drift being corrected. Two recounts of one counter would both
    /// correct the same drift, so each batch holds a lock that keeps them apart.
    ///
    /// | backend | one batch |
    /// |---|---|
    /// | PostgreSQL | `READ COMMITTED` transaction; `pg_advisory_xact_lock(hash(table, key))`; the snapshot statement; the drift as a sorted upsert; `COMMIT` (releases the lock) |
    /// | MySQL/MariaDB | `READ COMMITTED` transaction; `GET_LOCK(name, 60)`; the snapshot statement (a consistent read); the upsert; `COMMIT`, then `RELEASE_LOCK` on the same connection |
    /// | SQLite | `BEGIN IMMEDIATE` (the database's write lock, so writers wait and no other recount runs); the statement; the upsert; `COMMIT` |
    ///
    /// Owners are taken in primary-key order, `batch_size` at a time (by
    /// keyset, `owner_id > last`), or from the `owners` list; each batch is
    /// one snapshot statement:
    ///
    /// ```sql
    /// WITH counter_truth (owner_id, total) AS (<truth>)
    /// SELECT owner_id, SUM(truth_total), SUM(current_total) FROM (
    ///   SELECT owner_id, total, 0 FROM counter_truth WHERE <batch>
    ///   UNION ALL
    ///   SELECT owner_id, 0, value FROM <table> WHERE count_key = ? AND <batch>
    /// ) u GROUP BY owner_id ORDER BY owner_id LIMIT <batch_size>
    /// ```
    ///
    /// It takes the pool, not a transaction: each batch commits on its own,
    /// so a long recount never holds locks for long, and a failed batch
    /// leaves the earlier ones repaired and itself untouched. Deadlocks are
    /// retried. Counters written other than through their counter cache
    /// (a plain `increment` of a cached key) count as drift and are undone.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use counter_core::{CounterTable, Counters, Reconcile, Truth};
    /// use sea_orm::{ConnectionTrait, sea_query::{Alias, Asterisk, Expr, ExprTrait, Query}};
    ///
    /// let db = sea_orm::Database::connect("sqlite::memory:").await?;
    /// db.execute_unprepared("CREATE TABLE comments (id INTEGER PRIMARY KEY, post_id BIGINT)").await?;
    /// db.execute_unprepared("INSERT INTO comments (post_id) VALUES (1), (1), (2)").await?;
    /// let posts = Counters::<i64>::new(CounterTable::new("post_counters")?);
    /// posts.create_table(&db).await?;
    /// posts.add(&db, 1, "comments", 5).await?; // drifted: the truth is 2
    ///
    /// let truth = Truth::statement(
    ///     Query::select()
    ///         .column(Alias::new("post_id"))
    ///         .expr(Expr::col(Asterisk).count())
    ///         .from(Alias::new("comments"))
    ///         .group_by_col(Alias::new("post_id"))
    ///         .to_owned(),
    /// );
    /// let report = posts.reconcile(&db, "comments", truth.clone(), &Reconcile::new()).await?;
    /// assert_eq!((report.owners_checked, report.owners_drifted, report.total_abs_drift), (2, 2, 4));
    /// assert_eq!(posts.get(&db, 1, "comments").await?, 2);
    /// assert_eq!(posts.get(&db, 2, "comments").await?, 1);
    ///
    /// let again = posts.reconcile(&db, "comments", truth, &Reconcile::new()).await?;
    /// assert_eq!(again.owners_drifted, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reconcile<K: KeyOf<S>>(
        &self,
        db: &DatabaseConnection,
        key: K,
        truth: impl Into<Truth>,
        options: &Reconcile<I>,
    ) -> Result<ReconcileReport<I>> {
        let key = key.as_key_str();
        validate_key(key)?;
        CounterError::check_size(
            "recount batch_size",
            options.batch_size,
            1,
            MAX_RECONCILE_BATCH,
        )?;
        let dialect = Dialect::of(db)?;
        let truth = truth
            .into()
            .resolve(dialect, I::COLUMN, self.table().name(), key)?;
        let mut report = ReconcileReport {
            dry_run: options.dry_run,
            ..ReconcileReport::default()
        };
        if !options.dry_run {
            // `truth - current` with `current` missing what replication has
            // not brought yet would add it twice: a dry run only measures.
            self.table().refuse_in_region("a repairing recount")?;
        }
        let mut lock = match options.dry_run {
            true => None,
            false => Some(RecountLock::new(db, self.table().name(), key).await?),
        };
        match &options.owners {
            Some(owners) => {
                let owners = owner::sorted_unique(owners)?;
                for chunk in owners.chunks(options.batch_size) {
                    let range = OwnerRange::In(chunk.iter().cloned().map(Into::into).collect());
                    let seen = self
                        .reconcile_batch(db, key, &truth, range, lock.as_mut())
                        .await?;
                    // Every owner asked for is checked, found or not.
                    report.add(chunk.len() as u64, seen);
                }
            }
            None => {
                let limit = options.batch_size as u64;
                let mut after: Option<I> = None;
                loop {
                    let upto = self
                        .batch_bound(db, key, &truth, after.as_ref(), limit)
                        .await?;
                    let range = OwnerRange::Keyset {
                        after: after.clone().map(Into::into),
                        upto: upto.clone().map(Into::into),
                        limit,
                    };
                    let seen = self
                        .reconcile_batch(db, key, &truth, range, lock.as_mut())
                        .await?;
                    let owners: Vec<&I> = seen.iter().map(|d| &d.owner).collect();
                    Forward::new("recount", dialect, self.table().name()).check(
                        after.as_ref(),
                        upto.as_ref(),
                        &owners,
                    )?;
                    let full = seen.len() as u64 == limit;
                    let last = seen.last().map(|d| d.owner.clone());
                    report.add(seen.len() as u64, seen);
                    // Each batch ends past the last: the walk takes at most
                    // one batch per owner in scope, and always ends.
                    after = match (full, last, upto) {
                        (true, Some(last), _) => Some(last),
                        (_, _, Some(upto)) => Some(upto),
                        (_, _, None) => break,
                    };
                }
            }
        }
        Ok(report)
    }

    /// The upper bound of the next keyset batch: the smaller of the two
    /// sides' `limit`-th owner after `after`, or `None` when neither side
    /// has that many left (the last batch).
    async fn batch_bound(
        &self,
        db: &DatabaseConnection,
        key: &str,
        truth: &TruthSql,
        after: Option<&I>,
        limit: u64,
    ) -> Result<Option<I>> {
        let dialect = Dialect::of(db)?;
        let table = self.table().name();
        let after = after.cloned().map(Into::into);
        let mut bound: Option<I> = None;
        for stmt in sql::nth_owners(dialect, I::COLUMN, table, key, truth, after, limit) {
            let row = retry::run(db, table, || detach::query_one(db, stmt.clone())).await?;
            if let Some(row) = row {
                let owner = row.try_get::<I>("", "owner_id")?;
                bound = Some(match bound {
                    Some(b) if sql::owner_order(dialect, &b, &owner).is_le() => b,
                    _ => owner,
                });
            }
        }
        Ok(bound)
    }

    /// One batch: its snapshot and, unless a dry run (no `lock`), its
    /// repair, in one transaction under the recount lock. Returns every
    /// owner the snapshot saw, drifted or not.
    async fn reconcile_batch(
        &self,
        db: &DatabaseConnection,
        key: &str,
        truth: &TruthSql,
        range: OwnerRange,
        lock: Option<&mut RecountLock>,
    ) -> Result<Vec<Drift<I>>> {
        let dialect = Dialect::of(db)?;
        let table = self.table().name();
        let snapshot = sql::snapshot(dialect, I::COLUMN, table, key, truth, &range);
        let Some(lock) = lock else {
            let rows = retry::run(db, table, || detach::query_all(db, snapshot.clone())).await?;
            return decode(&rows, table);
        };
        let options = dialect.batch_transaction();
        // The whole batch, recount lock included, runs in a task of its own
        // (see `detach`): a recount dropped midway still commits or rolls
        // back its batch before it lets the lock go, so another recount
        // never sees the counter between this batch's snapshot and repair.
        let held = std::mem::replace(lock, RecountLock::None);
        let batch = (self.clone(), key.to_owned(), snapshot);
        let (repaired, held) = detach::Detached::pool(db)
            .run(move |db| async move {
                let (counters, key, snapshot) = batch;
                let mut held = held;
                let repaired = counters
                    .repair_locked(&db, &key, &snapshot, options, &mut held)
                    .await;
                Ok((repaired, held))
            })
            .await?;
        *lock = held;
        repaired
    }

    /// A batch's transaction under the recount lock: wait for the lock,
    /// snapshot and repair in one transaction (retried whole after a
    /// deadlock), let the lock go.
    async fn repair_locked(
        &self,
        db: &DatabaseConnection,
        key: &str,
        snapshot: &sea_orm::Statement,
        options: TransactionOptions,
        lock: &mut RecountLock,
    ) -> Result<Vec<Drift<I>>> {
        let table = self.table().name();
        lock.acquire(table, key).await?;
        let in_transaction = lock.in_transaction(table, key);
        let repaired = retry::run(db, table, || async {
            let (drifts, repaired) = observe::scope(async {
                let txn = db.begin_with_options(options).await?;
                if let Some(lock) = &in_transaction {
                    lock.take(&txn).await?;
                }
                let drifts = self.repair(&txn, key, snapshot).await?;
                txn.commit().await?;
                Ok(drifts)
            })
            .await;
            // The repaired owners, told after the commit (see `crate::observe`).
            repaired.committed().await;
            drifts
        })
        .await;
        lock.release().await;
        repaired
    }

    /// Inside the batch transaction, after the lock: the snapshot, then the
    /// drift added as an increment. The crate's own errors ride in the
    /// `DbErr` (see `CounterError::into_db_err`) and come out of
    /// `retry::run` typed.
    async fn repair<C: ConnectionTrait>(
        &self,
        txn: &C,
        key: &str,
        snapshot: &sea_orm::Statement,
    ) -> Result<Vec<Drift<I>>, DbErr> {
        let table = self.table().name();
        let rows = txn.query_all_raw(snapshot.clone()).await?;
        let drifts = decode::<I>(&rows, table).map_err(CounterError::into_db_err)?;
        let mut deltas = DeltaBatch::new();
        for d in drifts.iter().filter(|d| d.drift != 0) {
            // A repair corrects the total; no bucket of any time caused it.
            deltas
                .add_to_total(self, d.owner.clone(), key, d.drift)
                .map_err(CounterError::into_db_err)?;
        }
        deltas
            .apply_in(txn)
            .await
            .map_err(CounterError::into_db_err)?;
        Ok(drifts)
    }
}

/// The rows of a snapshot, with each owner's drift (checked: a difference
/// past `i64` is an overflow, not a wrapped repair).
fn decode<I: OwnerId>(rows: &[sea_orm::QueryResult], table: &str) -> Result<Vec<Drift<I>>> {
    let [truth_col, current_col] = sql::SNAPSHOT_TOTALS;
    rows.iter()
        .map(|row| {
            let owner = row.try_get::<I>("", "owner_id")?;
            let total = |col: &str| -> Result<i64> {
                let text = row.try_get::<String>("", col)?;
                sql::parse_total(&text, || format!("the {col} of an owner in `{table}`"))
            };
            let (truth, current) = (total(truth_col)?, total(current_col)?);
            let drift = truth
                .checked_sub(current)
                .ok_or_else(|| CounterError::Overflow {
                    context: format!("the drift {truth} - {current} in `{table}`"),
                })?;
            Ok(Drift {
                owner,
                truth,
                current,
                drift,
            })
        })
        .collect()
}

impl<I> ReconcileReport<I> {
    /// Adds a batch that checked `checked` owners and saw `seen`.
    fn add(&mut self, checked: u64, seen: Vec<Drift<I>>) {
        self.batches += 1;
        self.owners_checked += checked;
        for drift in seen.into_iter().filter(|d| d.drift != 0) {
            self.owners_drifted += 1;
            self.total_abs_drift += u128::from(drift.drift.unsigned_abs());
            self.drifted.push(drift);
        }
    }
}
