//! Deltas of many tables, owners and keys, applied together.

use std::{
    collections::{BTreeMap, btree_map::Entry},
    sync::Arc,
};

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, TransactionSession, TransactionTrait, Value};

use crate::{
    BatchReport, CounterTable, Counters,
    chunks::{self, Chunk, Mode},
    detach,
    error::{CounterError, Result},
    key::validate_key,
    observe::{self, Touched},
    owner::{OwnerId, SortOwner},
    retry,
    sql::{self, Dialect, UpsertRow},
    typed::{KeyOf, KeySpace, UniqueKeyOf},
    unique::{self, Member, Merges, Sketch},
};

/// Counter deltas collected across tables, owners and keys, then applied in
/// the caller's connection or transaction with one sorted multi-row upsert
/// per table and chunk.
///
/// Counter caches use it so that one child write (a comment moved from one
/// post to another: `-1` and `+1`) touches its counters in one statement, in
/// primary-key order: two such writes lock slot rows in the same order and
/// cannot deadlock on each other. Deltas of the same counter are folded
/// (checked, never wrapped), and counters that net to zero send nothing.
///
/// A windowed key's delta also lands in its time bucket (of the moment it
/// was added, or of [`DeltaBatch::add_at`]'s time): the bucket rows follow
/// the table's own, in the same order, so they are locked in one global
/// order too.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use counter_core::{CounterTable, Counters, DeltaBatch};
///
/// let db = sea_orm::Database::connect("sqlite::memory:").await?;
/// let posts = Counters::<i64>::new(CounterTable::new("post_counters")?);
/// let users = Counters::<i64>::new(CounterTable::new("user_counters")?);
/// posts.create_table(&db).await?;
/// users.create_table(&db).await?;
///
/// let mut batch = DeltaBatch::new();
/// batch.add(&posts, 1, "comments", -1)?;
/// batch.add(&posts, 2, "comments", 1)?;
/// batch.add(&users, 9, "comments", 1)?;
/// batch.add(&users, 9, "comments", -1)?; // folds to zero: not sent
/// let outcome = batch.apply(&db).await?;
/// assert_eq!((outcome.rows, outcome.statements), (2, 1));
/// assert_eq!(posts.get(&db, 2, "comments").await?, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Default)]
pub struct DeltaBatch {
    /// Per table, in name order (the order tables are locked in), its
    /// folded deltas.
    tables: BTreeMap<String, TableDeltas>,
    /// Members observed into unique keys, one sketch per (table, owner,
    /// key, bucket): merged into their rows after the deltas, in the same
    /// transaction.
    sketches: BTreeMap<(String, SortOwner, String, i64), PendingSketch>,
}

#[derive(Debug)]
struct PendingSketch {
    table: CounterTable,
    owner: Value,
    sketch: Sketch,
}

#[derive(Debug)]
struct TableDeltas {
    table: CounterTable,
    /// By (owner, key): the primary-key order rows are locked in.
    deltas: BTreeMap<(SortOwner, String), Pending>,
    /// Windowed keys' deltas by (owner, key, bucket), likewise.
    buckets: BTreeMap<(SortOwner, String, i64), Pending>,
}

#[derive(Debug)]
struct Pending {
    owner: Value,
    delta: i64,
}

impl DeltaBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `delta` to `key` of `owner` in `counters`' table (and, for a
    /// windowed key, to the bucket of now).
    ///
    /// Keys and owners are checked here, so a bad one fails before any SQL
    /// is sent; a fold that leaves `i64` is [`CounterError::Overflow`].
    /// Deltas are grouped by table name, and the first [`Counters`] added
    /// for a name supplies its configuration (slots, windows) for the whole
    /// batch.
    pub fn add<I: OwnerId, S: KeySpace, K: KeyOf<S>>(
        &mut self,
        counters: &Counters<I, S>,
        owner: I,
        key: K,
        delta: i64,
    ) -> Result<&mut Self> {
        self.add_at(counters, owner, key, delta, Utc::now())
    }

    /// Adds 1 (see [`DeltaBatch::add`]).
    pub fn increment<I: OwnerId, S: KeySpace, K: KeyOf<S>>(
        &mut self,
        counters: &Counters<I, S>,
        owner: I,
        key: K,
    ) -> Result<&mut Self> {
        self.add(counters, owner, key, 1)
    }

    /// Subtracts 1 (see [`DeltaBatch::add`]).
    pub fn decrement<I: OwnerId, S: KeySpace, K: KeyOf<S>>(
        &mut self,
        counters: &Counters<I, S>,
        owner: I,
        key: K,
    ) -> Result<&mut Self> {
        self.add(counters, owner, key, -1)
    }

    /// [`DeltaBatch::add`] of an event that happened `at`: a windowed key
    /// counts it in the bucket of `at` (a backfill, an imported log). Its
    /// all-time total counts it either way.
    pub fn add_at<I: OwnerId, S: KeySpace, K: KeyOf<S>>(
        &mut self,
        counters: &Counters<I, S>,
        owner: I,
        key: K,
        delta: i64,
        at: DateTime<Utc>,
    ) -> Result<&mut Self> {
        self.fold_in(counters, owner, key.as_key_str(), delta, Some(at))?;
        Ok(self)
    }

    /// Adds `delta` to the all-time total only, never to a bucket: a
    /// recount's repair, which corrects the total and happened at no time.
    pub(crate) fn add_to_total<I: OwnerId, S: KeySpace>(
        &mut self,
        counters: &Counters<I, S>,
        owner: I,
        key: &str,
        delta: i64,
    ) -> Result<()> {
        self.fold_in(counters, owner, key, delta, None)
    }

    /// Folds `delta` into the total of `(owner, key)` and, for a windowed
    /// key and a time, into the bucket of `at`, after checking the key and
    /// the owner.
    pub(crate) fn fold_in<I: OwnerId, S: KeySpace>(
        &mut self,
        counters: &Counters<I, S>,
        owner: I,
        key: &str,
        delta: i64,
        at: Option<DateTime<Utc>>,
    ) -> Result<()> {
        validate_key(key)?;
        owner.check()?;
        let bucket = at
            .zip(counters.table().window_for(key))
            .map(|(at, window)| (window.bucket_of(at), delta));
        self.fold_checked(
            counters.table(),
            owner.into(),
            key,
            delta,
            bucket.as_slice(),
        )
    }

    /// Folds `delta` into the total of `(owner, key)` and each
    /// `(bucket start, delta)` into its bucket, for a key and an owner
    /// already checked. Every sum is checked before any is stored, so an
    /// overflow leaves the batch unchanged.
    pub(crate) fn fold_checked(
        &mut self,
        table: &CounterTable,
        owner: Value,
        key: &str,
        delta: i64,
        buckets: &[(i64, i64)],
    ) -> Result<()> {
        table.check_kind(key, false, "add")?;
        let sort = SortOwner::of(&owner);
        let deltas = self
            .tables
            .entry(table.name().to_owned())
            .or_insert_with(|| TableDeltas {
                table: table.clone(),
                deltas: BTreeMap::new(),
                buckets: BTreeMap::new(),
            });
        // Another handle of the same table name in another region (or
        // none) came first: these rows would take that region's slots.
        check_same_region(&deltas.table, table)?;
        if !buckets.is_empty() && deltas.table.window_for(key).is_none() {
            // Another handle of the same table name, without this window,
            // came first: its configuration is the batch's.
            return Err(CounterError::NotWindowed {
                table: table.name().to_owned(),
                key: key.to_owned(),
            });
        }
        let total_at = (sort.clone(), key.to_owned());
        let new_total = fold(
            deltas.deltas.get(&total_at).map_or(0, |p| p.delta),
            delta,
            key,
        )?;
        let mut new_buckets = Vec::with_capacity(buckets.len());
        for &(bucket, delta) in buckets {
            let at = (sort.clone(), key.to_owned(), bucket);
            let folded = new_buckets
                .iter()
                .rev()
                .find(|(b, _)| *b == at)
                .map(|(_, d)| *d)
                .or_else(|| deltas.buckets.get(&at).map(|p| p.delta))
                .unwrap_or(0);
            let sum = fold(folded, delta, key)?;
            new_buckets.push((at, sum));
        }
        let pending = |delta| Pending {
            owner: owner.clone(),
            delta,
        };
        deltas.deltas.insert(total_at, pending(new_total));
        for (at, sum) in new_buckets {
            deltas.buckets.insert(at, pending(sum));
        }
        Ok(())
    }

    /// Counts `member` among the distinct members of the unique key `key`
    /// of `owner` (see [`Counters::observe`]); members of one counter are
    /// merged into one sketch here, so a batch writes one row per counter
    /// whatever the number of members.
    pub fn observe<I, S, K, M>(
        &mut self,
        counters: &Counters<I, S>,
        owner: I,
        key: K,
        member: &M,
    ) -> Result<&mut Self>
    where
        I: OwnerId,
        S: KeySpace,
        K: UniqueKeyOf<S>,
        M: Member + ?Sized,
    {
        self.observe_at(counters, owner, key, member, Utc::now())
    }

    /// [`DeltaBatch::observe`] of a visit that happened `at` (the bucket
    /// of a windowed key).
    pub fn observe_at<I, S, K, M>(
        &mut self,
        counters: &Counters<I, S>,
        owner: I,
        key: K,
        member: &M,
        at: DateTime<Utc>,
    ) -> Result<&mut Self>
    where
        I: OwnerId,
        S: KeySpace,
        K: UniqueKeyOf<S>,
        M: Member + ?Sized,
    {
        let key = key.as_key_str();
        counters.check_unique(&owner, key, "observe")?;
        let table = counters.table();
        let owner: Value = owner.into();
        let sort = SortOwner::of(&owner);
        for bucket in table.sketch_buckets(key, at) {
            let at = (
                table.name().to_owned(),
                sort.clone(),
                key.to_owned(),
                bucket,
            );
            let pending = self.sketches.entry(at).or_insert_with(|| PendingSketch {
                table: table.clone(),
                owner: owner.clone(),
                sketch: Sketch::new(),
            });
            check_same_region(&pending.table, table)?;
            pending.sketch.insert(member);
        }
        Ok(self)
    }

    /// Takes in every delta and observation of `other`, as if they had
    /// been added to this batch: a group of batches (a service's waiting
    /// requests, a consumer's messages) sent as one. A table both hold
    /// keeps this batch's configuration (see [`DeltaBatch::add`]). A fold
    /// that leaves `i64` is [`CounterError::Overflow`], and leaves this
    /// batch unchanged.
    ///
    /// ```
    /// # use counter_core::{CounterTable, Counters, DeltaBatch};
    /// # let posts = Counters::<i64>::new(CounterTable::new("post_counters")?.with_unique_key("viewers")?);
    /// let (mut first, mut second) = (DeltaBatch::new(), DeltaBatch::new());
    /// first.add(&posts, 1, "likes", 2)?.observe(&posts, 1, "viewers", "ann")?;
    /// second.add(&posts, 1, "likes", 3)?.observe(&posts, 1, "viewers", "bob")?;
    /// first.append(second)?; // likes +5, viewers {ann, bob}: one row each
    /// # Ok::<(), counter_core::CounterError>(())
    /// ```
    pub fn append(&mut self, other: DeltaBatch) -> Result<&mut Self> {
        // Every sum checked first, then stored: all or nothing.
        for (name, theirs) in &other.tables {
            let ours = self.tables.get(name);
            if let Some(ours) = ours {
                check_same_region(&ours.table, &theirs.table)?;
            }
            for (at, pending) in &theirs.deltas {
                let had = ours.and_then(|t| t.deltas.get(at)).map_or(0, |p| p.delta);
                fold(had, pending.delta, &at.1)?;
            }
            for (at, pending) in &theirs.buckets {
                if let Some(ours) = ours
                    && ours.table.window_for(&at.1).is_none()
                {
                    return Err(CounterError::NotWindowed {
                        table: name.clone(),
                        key: at.1.clone(),
                    });
                }
                let had = ours.and_then(|t| t.buckets.get(at)).map_or(0, |p| p.delta);
                fold(had, pending.delta, &at.1)?;
            }
        }
        for (at, theirs) in &other.sketches {
            if let Some(ours) = self.sketches.get(at) {
                check_same_region(&ours.table, &theirs.table)?;
            }
        }
        let DeltaBatch { tables, sketches } = other;
        for (name, theirs) in tables {
            let ours = self.tables.entry(name).or_insert_with(|| TableDeltas {
                table: theirs.table,
                deltas: BTreeMap::new(),
                buckets: BTreeMap::new(),
            });
            for (at, pending) in theirs.deltas {
                let sum = ours.deltas.entry(at).or_insert(Pending {
                    owner: pending.owner,
                    delta: 0,
                });
                sum.delta += pending.delta; // checked above
            }
            for (at, pending) in theirs.buckets {
                let sum = ours.buckets.entry(at).or_insert(Pending {
                    owner: pending.owner,
                    delta: 0,
                });
                sum.delta += pending.delta; // checked above
            }
        }
        for (at, theirs) in sketches {
            match self.sketches.entry(at) {
                Entry::Occupied(mut ours) => {
                    ours.get_mut().sketch.merge(&theirs.sketch);
                }
                Entry::Vacant(slot) => {
                    slot.insert(theirs);
                }
            }
        }
        Ok(self)
    }

    /// The merges of the batch's sketches, each in the slot its table
    /// picks.
    fn take_merges(&mut self, dialect: Dialect) -> Merges {
        let sketches = std::mem::take(&mut self.sketches);
        let cells = sketches
            .iter()
            .map(|((_, _, key, bucket), pending)| {
                let owner = pending.owner.clone();
                let cell = unique::cell(&pending.table, dialect, owner, key, *bucket);
                (&pending.table, cell, pending.sketch.clone())
            })
            .collect();
        Merges::new(dialect, cells)
    }

    /// Whether no counter would change.
    pub fn is_empty(&self) -> bool {
        self.sketches.values().all(|p| p.sketch.is_empty())
            && self.tables.values().all(|t| {
                t.deltas.values().all(|p| p.delta == 0) && t.buckets.values().all(|p| p.delta == 0)
            })
    }

    /// Sends the batch, all or nothing: one multi-row upsert per table and
    /// chunk of [`UPSERT_ROWS_PER_STATEMENT`](crate::limits::UPSERT_ROWS_PER_STATEMENT)
    /// rows, tables in name order and rows in primary-key order. One
    /// statement is sent alone. Several run in a transaction of their own,
    /// retried whole on a pool after a deadlock; in the caller's transaction
    /// they run in it directly on PostgreSQL, where a failed statement
    /// aborts it, and under a savepoint on MySQL and SQLite, which would
    /// keep the statements before a failed one. Either way a windowed key's
    /// total and bucket, or the two sides of a move, are never half applied.
    /// A counter whose total would leave `i64` fails the whole batch with
    /// [`CounterError::Overflow`], nothing written (see the guide's "Limits").
    pub async fn apply<C>(self, db: &C) -> Result<BatchReport>
    where
        C: ConnectionTrait + TransactionTrait,
    {
        self.apply_as(db, Mode::Fast).await
    }

    /// [`DeltaBatch::apply`], every counter settled at once (see
    /// `crate::settle`): for an add whose own slot already met the cap.
    pub(crate) async fn apply_settled<C>(self, db: &C) -> Result<BatchReport>
    where
        C: ConnectionTrait + TransactionTrait,
    {
        self.apply_as(db, Mode::Settle).await
    }

    async fn apply_as<C>(mut self, db: &C, mut mode: Mode) -> Result<BatchReport>
    where
        C: ConnectionTrait + TransactionTrait,
    {
        if self.is_empty() {
            return Ok(BatchReport::default());
        }
        let mut touched = self.touched();
        let dialect = Dialect::of(db)?;
        let merges = self.take_merges(dialect);
        let (mut outcome, chunks) = self.into_chunks(dialect);
        outcome.sketches = merges.len();
        if chunks.is_empty() {
            merges.write(db).await?;
            return Ok(outcome);
        }
        touched.merge(merges.touched().clone());
        let (chunks, merges) = (Arc::new(chunks), Arc::new(merges));
        let mut tables: Vec<&str> = chunks.iter().map(|c| c.table.as_str()).collect();
        tables.extend(merges.tables());
        let pool = retry::is_pool::<C>();
        let alone = chunks.len() == 1 || dialect == Dialect::Postgres;
        if !pool && merges.is_empty() && alone && mode == Mode::Fast {
            // The caller's connection, where these statements need no
            // savepoint (see above and `crate::chunks`); a row the guard
            // refused, rare, is settled apart.
            let written = retry::run_on(db, tables[0], &tables, || async {
                let sent = chunks::send(db, dialect, &chunks, mode).await?;
                match sent.is_done() {
                    true => Ok(()),
                    false => chunks::settle_apart(db, dialect, sent).await,
                }
            })
            .await;
            touched.wrote(false).await;
            return written.map(|()| outcome);
        }
        if let ([chunk], true, Mode::Fast, true) =
            (chunks.as_slice(), merges.is_empty(), mode, pool)
        {
            // Autocommit: a refused statement wrote nothing.
            if chunks::send_alone(db, dialect, chunk, &touched).await? {
                return Ok(outcome);
            }
            mode = Mode::Settle;
        }
        retry::run_on(db, tables[0], &tables, || {
            let (chunks, touched) = (chunks.clone(), touched.clone());
            let merges = merges.clone();
            async move {
                match detach::detached(db) {
                    Some(pool) => {
                        let work = |pool| async move {
                            let done = all_or_nothing(&pool, dialect, &chunks, &merges, mode).await;
                            touched.committed().await;
                            done
                        };
                        pool.run(work).await
                    }
                    None => {
                        let done = all_or_nothing(db, dialect, &chunks, &merges, mode).await;
                        touched.wrote(retry::is_pool::<C>()).await;
                        done
                    }
                }
            }
        })
        .await
        .map(|()| outcome)
    }

    /// Sends the batch on `txn`, a connection that is already inside a
    /// transaction but cannot open one (the connection a SeaORM
    /// `ActiveModelBehavior` hook is given): the statements in order, one
    /// per chunk, all or nothing with that transaction. On a connection
    /// known to be a pool a batch of more than one statement is refused with
    /// [`CounterError::BatchNeedsTransaction`] before anything is sent:
    /// there it could be half applied.
    ///
    /// A counter that meets the slot cap (see [`DeltaBatch::apply`]) is
    /// settled in the same transaction, with no savepoint on any backend: a
    /// refusal leaves the transaction usable, with nothing of the batch
    /// applied.
    pub async fn apply_in<C: ConnectionTrait>(mut self, txn: &C) -> Result<BatchReport> {
        if self.is_empty() {
            return Ok(BatchReport::default());
        }
        let mut touched = self.touched();
        let dialect = Dialect::of(txn)?;
        let merges = self.take_merges(dialect);
        let (mut outcome, chunks) = self.into_chunks(dialect);
        outcome.sketches = merges.len();
        // A merge reads and writes back its row: outside a transaction
        // another writer could come in between.
        let pool = retry::is_pool::<C>();
        if (chunks.len() > 1 || !merges.is_empty()) && pool {
            return Err(CounterError::BatchNeedsTransaction {
                statements: chunks.len() + merges.len(),
            });
        }
        let tables: Vec<&str> = chunks.iter().map(|c| c.table.as_str()).collect();
        let label = tables.first().copied().unwrap_or_default();
        if pool {
            // One statement, autocommit: a refused one wrote nothing.
            let mut mode = Mode::Fast;
            if let [chunk] = chunks.as_slice() {
                if chunks::send_alone(txn, dialect, chunk, &touched).await? {
                    return Ok(outcome);
                }
                mode = Mode::Settle;
            }
            let Some(pool) = detach::pool(txn) else {
                return Err(CounterError::BatchNeedsTransaction { statements: 1 });
            };
            retry::run_on(txn, label, &tables, || async {
                let own = pool.begin().await?;
                chunks::write(&own, dialect, &chunks, mode).await?;
                own.commit().await
            })
            .await?;
            touched.wrote(true).await;
            return Ok(outcome);
        }
        // Deltas first, sketches after: the lock order of `apply` too.
        if !chunks.is_empty() {
            let written = retry::run_on(txn, label, &tables, || {
                chunks::write(txn, dialect, &chunks, Mode::Fast)
            })
            .await;
            std::mem::take(&mut touched).wrote(false).await;
            written?;
        }
        if !merges.is_empty() {
            let tables = merges.tables();
            retry::run_on(txn, tables[0], &tables, || merges.apply(txn)).await?;
            merges.touched().clone().wrote(false).await;
        }
        Ok(outcome)
    }

    /// The owners this batch changes, per counter table, for the cache
    /// observers (see [`crate::observe`]); nothing when none is registered.
    pub(crate) fn touched(&self) -> Touched {
        let mut touched = Touched::new();
        if observe::active() {
            for (name, t) in &self.tables {
                let owners = t.deltas.values().filter(|p| p.delta != 0);
                touched.touch(name, owners.map(|p| p.owner.clone()));
            }
        }
        touched
    }

    /// The upserts that apply the batch, each with its table and rows, in
    /// the order they must run: net-zero counters dropped, one slot picked
    /// per counter, rows chunked.
    pub(crate) fn into_chunks(self, dialect: Dialect) -> (BatchReport, Vec<Chunk>) {
        let mut outcome = BatchReport::default();
        let mut chunks = Vec::new();
        let mut push = |name: &str, rows: Vec<UpsertRow>, region: Option<crate::Region>| {
            for rows in rows.chunks(sql::UPSERT_ROWS_PER_STATEMENT) {
                outcome.rows += rows.len();
                outcome.statements += 1;
                chunks.push(Chunk {
                    table: name.to_owned(),
                    rows: rows.to_vec(),
                    region: region.clone(),
                });
            }
        };
        for (name, t) in self.tables {
            let rows = t
                .deltas
                .into_iter()
                .filter(|(_, pending)| pending.delta != 0)
                .map(|((sort, key), pending)| UpsertRow {
                    slot: t.table.next_slot_on(Some(dialect), &sort, &key),
                    owner: pending.owner,
                    key,
                    bucket: None,
                    delta: pending.delta,
                })
                .collect();
            let region = t.table.region();
            push(&name, rows, region.clone());
            let Some(bucket_table) = t.table.bucket_table() else {
                continue;
            };
            let rows = t
                .buckets
                .into_iter()
                .filter(|(_, pending)| pending.delta != 0)
                .map(|((sort, key, bucket), pending)| UpsertRow {
                    slot: t.table.next_bucket_slot(Some(dialect), &sort, &key),
                    owner: pending.owner,
                    key,
                    bucket: Some(bucket),
                    delta: pending.delta,
                })
                .collect();
            push(&bucket_table, rows, region);
        }
        (outcome, chunks)
    }
}

/// `Ok` if `first` (the configuration a batch holds for a table name) and
/// `next` (another handle of the same name) are in the same region, or
/// both in none; else `CrossRegion`: `next`'s rows would take the slots of
/// `first`'s region.
fn check_same_region(first: &CounterTable, next: &CounterTable) -> Result<()> {
    let (first, next) = (first.region(), next.region());
    if first == next {
        return Ok(());
    }
    Err(CounterError::CrossRegion {
        region: next
            .or(first)
            .map_or_else(String::new, |r| r.name().to_owned()),
        operation: "one batch writing a table from two regions",
    })
}

/// `total + delta`, checked.
fn fold(total: i64, delta: i64, key: &str) -> Result<i64> {
    total
        .checked_add(delta)
        .ok_or_else(|| CounterError::Overflow {
            context: format!("the folded batch delta of `{key}`"),
        })
}

/// The chunks of a batch, then its merges, in one transaction of their own
/// on `db`, committed, or none of them.
async fn all_or_nothing<C>(
    db: &C,
    dialect: Dialect,
    chunks: &[Chunk],
    merges: &Merges,
    mode: Mode,
) -> Result<(), sea_orm::DbErr>
where
    C: TransactionTrait,
{
    let txn = db.begin().await?;
    chunks::write(&txn, dialect, chunks, mode).await?;
    merges.apply(&txn).await?;
    txn.commit().await
}
