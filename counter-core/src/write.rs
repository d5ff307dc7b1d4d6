//! Increments: one slot row per write, many rows per statement in a batch.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, TransactionTrait};

use crate::{
    Counters, DeltaBatch, detach,
    error::Result,
    key::validate_key,
    observe::Touched,
    owner::{OwnerId, SortOwner},
    retry, settle,
    sql::{self, Dialect, Guard, UpsertRow},
    typed::{KeyOf, KeySpace},
};

/// What a batch write sent to the database.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Slot rows upserted, after folding duplicates and dropping net zeros.
    pub rows: usize,
    /// Statements sent (one per chunk of rows, not counting BEGIN/COMMIT).
    pub statements: usize,
    /// Sketch rows of unique keys merged ([`DeltaBatch::observe`](crate::DeltaBatch::observe)).
    pub sketches: usize,
}

impl<I: OwnerId, S: KeySpace> Counters<I, S> {
    /// Adds `delta` (which may be negative) to a counter.
    ///
    /// One upsert of one slot row, picked among the key's slots by the
    /// table's [`SlotStrategy`](crate::SlotStrategy), so concurrent writers
    /// of a hot counter rarely wait on the same row lock.
    /// A zero delta is validated and then skipped. On a pool, conflicts are
    /// retried; in a transaction, the counter commits or rolls back with it,
    /// and a failed write leaves the transaction as the database does (on
    /// PostgreSQL, aborted: roll it back).
    ///
    /// A windowed key (see [`Window`](crate::Window)) is also counted in the
    /// bucket of now: two upserts, all or nothing (see
    /// [`DeltaBatch::apply`](crate::DeltaBatch::apply)), so the total and
    /// the buckets never disagree. That is why `C` must be able to open a
    /// transaction; inside a SeaORM hook, whose connection cannot, use
    /// [`DeltaBatch::apply_in`](crate::DeltaBatch::apply_in).
    pub async fn add<C, K>(&self, db: &C, owner: I, key: K, delta: i64) -> Result<()>
    where
        C: ConnectionTrait + TransactionTrait,
        K: KeyOf<S>,
    {
        self.add_at(db, owner, key, delta, Utc::now()).await
    }

    /// [`Counters::add`] of an event that happened `at`: a windowed key
    /// counts it in the bucket of `at` instead of now (a backfill, an
    /// imported log, a test of bucket boundaries). Every key counts it in
    /// its all-time total.
    pub async fn add_at<C, K>(
        &self,
        db: &C,
        owner: I,
        key: K,
        delta: i64,
        at: DateTime<Utc>,
    ) -> Result<()>
    where
        C: ConnectionTrait + TransactionTrait,
        K: KeyOf<S>,
    {
        let key = key.as_key_str();
        validate_key(key)?;
        self.table().check_kind(key, false, "add")?;
        owner.check()?;
        if delta == 0 {
            return Ok(());
        }
        let dialect = Dialect::of(db)?;
        // A windowed key writes two tables, all or nothing; a delta beyond
        // the slot cap is settled.
        if self.table().window_for(key).is_some() || settle::beyond_cap(delta) {
            let mut batch = DeltaBatch::new();
            batch.fold_in(self, owner, key, delta, Some(at))?;
            return batch.apply(db).await.map(drop);
        }
        let table = self.table().name();
        let owner = owner.into();
        let touched = Touched::of(table, [owner.clone()]);
        // One statement wherever it runs: on PostgreSQL inside a
        // transaction, a refusal at the cap affects no row instead of
        // raising and aborting it (see `crate::chunks`).
        let guard = Guard::for_add(dialect, !retry::is_pool::<C>());
        let counter = SortOwner::of(&owner);
        // Followed while in flight when the key is adaptive (see `heat`).
        let flight = self.table().begin_write(dialect, &counter, key);
        // Each attempt takes a slot of its own: a retried conflict was a
        // collision, which the same row would repeat.
        let mut attempts = 0u32;
        let written = retry::run(db, table, || {
            attempts += 1;
            let row = UpsertRow {
                slot: self
                    .table()
                    .slot_in_flight(dialect, flight.as_ref(), &counter, key),
                owner: owner.clone(),
                key: key.to_owned(),
                bucket: None,
                delta,
            };
            detach::execute_observed(db, sql::add_one(dialect, table, row, guard), &touched)
        })
        .await;
        if let Some(flight) = flight {
            flight.land(attempts > 1);
        }
        let refused = match &written {
            Ok(done) => guard == Guard::Skip && done.rows_affected() == 0,
            Err(e) => settle::met_cap_typed(e),
        };
        if !refused {
            return written.map(drop);
        }
        // A region never settles: the spread takes slots other regions own.
        self.table()
            .refuse_in_region("settling an add at the slot cap")?;
        // Its slot met the cap: settled, with the counter's rows locked and
        // summed (`crate::settle`).
        let mut batch = DeltaBatch::new();
        batch.fold_checked(self.table(), owner, key, delta, &[])?;
        batch.apply_settled(db).await.map(drop)
    }

    /// Adds 1.
    pub async fn increment<C: ConnectionTrait + TransactionTrait, K: KeyOf<S>>(
        &self,
        db: &C,
        owner: I,
        key: K,
    ) -> Result<()> {
        self.add(db, owner, key, 1).await
    }

    /// Subtracts 1. Totals may go below zero: a counter is a sum of deltas.
    pub async fn decrement<C: ConnectionTrait + TransactionTrait, K: KeyOf<S>>(
        &self,
        db: &C,
        owner: I,
        key: K,
    ) -> Result<()> {
        self.add(db, owner, key, -1).await
    }

    /// Applies many deltas at once, atomically.
    ///
    /// Deltas of the same (owner, key) are folded first (an overflowing sum
    /// is an error, never wrapped) and net zeros dropped; each remaining
    /// counter gets one slot; rows are sorted by primary key, so
    /// concurrent batches lock in the same order and cannot deadlock on each
    /// other; then one multi-row upsert is sent per chunk of
    /// [`UPSERT_ROWS_PER_STATEMENT`](crate::limits::UPSERT_ROWS_PER_STATEMENT) rows.
    /// Several chunks are all or nothing (see [`DeltaBatch::apply`]), so a
    /// batch is never half applied; a single chunk is one statement, atomic
    /// by itself.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use counter_core::{CounterTable, Counters};
    /// # let db = sea_orm::Database::connect("sqlite::memory:").await?;
    /// let counters = Counters::<i32>::new(CounterTable::new("c")?);
    /// # counters.create_table(&db).await?;
    /// let outcome = counters
    ///     .add_many(&db, [(1, "likes", 1), (1, "likes", 1), (2, "views", 5), (3, "views", 0)])
    ///     .await?;
    /// assert_eq!((outcome.rows, outcome.statements), (2, 1));
    /// assert_eq!(counters.get(&db, 1, "likes").await?, 2);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn add_many<C, K, It>(&self, db: &C, deltas: It) -> Result<BatchReport>
    where
        C: ConnectionTrait + TransactionTrait,
        K: KeyOf<S>,
        It: IntoIterator<Item = (I, K, i64)>,
    {
        let mut batch = DeltaBatch::new();
        for (owner, key, delta) in deltas {
            batch.add(self, owner, key, delta)?;
        }
        batch.apply(db).await
    }
}
