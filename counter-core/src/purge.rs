//! Deleting counts: one counter set back to zero ([`Counters::reset`]),
//! and the counts of owners that are gone, for tables without
//! `cascade` (whose database deletes them with the owner row) and for
//! deletes no foreign key sees: so that a new owner row reusing an id (a
//! test suite's truncate and seed, Loco's `truncate`) starts from zero.

use sea_orm::{ConnectionTrait, Statement, Value};

use crate::{
    Counters, detach,
    error::{CounterError, Result},
    key::validate_key,
    observe::Touched,
    owner::{OwnerId, sorted_unique},
    retry,
    sql::{self, Dialect, Layout},
    typed::{KeyOf, KeySpace, UniqueKeyOf},
};

/// Owners per `DELETE ... IN (...)`: far below every backend's bind limit.
const OWNERS_PER_STATEMENT: usize = 1_000;

impl<I: OwnerId, S: KeySpace> Counters<I, S> {
    /// Deletes every count (totals and time buckets) of `owners`, returning
    /// the slot rows deleted: what deleting those owner rows does on a table
    /// with `cascade`. Call it after deleting the owners; a write for one of
    /// them that commits later counts again, from zero.
    ///
    /// In a [`Region`](crate::Region), only the region's own rows: replication
    /// carries the deletes to the others, and each region purges its own
    /// share (the owner rows' delete reaches every region, so run it, or
    /// [`Counters::purge_orphans`], in each).
    pub async fn purge<C: ConnectionTrait>(&self, db: &C, owners: &[I]) -> Result<u64> {
        let owners = sorted_unique(owners)?;
        let dialect = Dialect::of(db)?;
        let slots = self.own_slots();
        let mut deleted = 0;
        for (table, _) in sql::tables(self.table()) {
            deleted += self
                .delete_in_chunks(db, &table, &owners, |ids| {
                    sql::delete_owners(dialect, &table, ids, slots)
                })
                .await?;
        }
        Ok(deleted)
    }

    /// Sets the counter `key` of each of `owners` back to zero, returning
    /// the slot rows deleted: its total and, for a windowed key, its time
    /// buckets (a unique key: [`Counters::reset_unique`]). The rows are
    /// deleted, 1,000 owners per statement: an add that commits before the
    /// reset is erased with them, one that commits after counts from zero
    /// (on a new row), and none is half-counted. A cache in front of the
    /// table forgets the owners after the commit, as after any write.
    ///
    /// For a counter the application's own rows define (a counter cache's
    /// `comments`), a reset makes it disagree with those rows: recount it
    /// instead. A moderation reset of `likes`, a test's fixture, a counter
    /// whose meaning changed are what this is for.
    pub async fn reset<C: ConnectionTrait, K: KeyOf<S>>(
        &self,
        db: &C,
        owners: &[I],
        key: K,
    ) -> Result<u64> {
        self.reset_named(db, owners, key.as_key_str(), false).await
    }

    /// [`Counters::reset`] of a unique key: its sketches (all time and
    /// buckets) are deleted, and it counts distinct members from none.
    pub async fn reset_unique<C: ConnectionTrait, K: UniqueKeyOf<S>>(
        &self,
        db: &C,
        owners: &[I],
        key: K,
    ) -> Result<u64> {
        self.reset_named(db, owners, key.as_key_str(), true).await
    }

    /// Deletes the rows of `key`, a unique key or not as `unique` says
    /// (refused otherwise), of `owners`.
    async fn reset_named<C: ConnectionTrait>(
        &self,
        db: &C,
        owners: &[I],
        key: &str,
        unique: bool,
    ) -> Result<u64> {
        validate_key(key)?;
        let operation = if unique { "reset_unique" } else { "reset" };
        self.table().check_kind(key, unique, operation)?;
        // Zero means every region's rows gone, and a region deletes only
        // its own.
        self.table().refuse_in_region(operation)?;
        let owners = sorted_unique(owners)?;
        let dialect = Dialect::of(db)?;
        let table = self.table();
        let mut deleted = 0;
        for (name, layout) in sql::tables(table) {
            // Only the tables that can hold the key.
            let holds = match layout {
                Layout::Totals | Layout::Buckets => !unique,
                Layout::Sketches => unique,
            };
            if !holds || (layout == Layout::Buckets && table.window_for(key).is_none()) {
                continue;
            }
            deleted += self
                .delete_in_chunks(db, &name, &owners, |ids| {
                    sql::delete_key_of_owners(dialect, &name, ids, key)
                })
                .await?;
        }
        Ok(deleted)
    }

    /// The slots a delete of this table may touch: its region's, or all.
    fn own_slots(&self) -> sql::FoldSlots {
        sql::FoldSlots::of_region(self.table().region().as_ref())
    }

    /// One `DELETE` from `table` per 1,000 of `owners` (`statement` builds
    /// it from a chunk's ids), each retried after a conflict and reported
    /// to a cache in front once committed; the rows deleted.
    async fn delete_in_chunks<C: ConnectionTrait>(
        &self,
        db: &C,
        table: &str,
        owners: &[I],
        statement: impl Fn(Vec<Value>) -> Statement,
    ) -> Result<u64> {
        let mut deleted = 0;
        for chunk in owners.chunks(OWNERS_PER_STATEMENT) {
            let ids: Vec<Value> = chunk.iter().cloned().map(Into::into).collect();
            let touched = Touched::of(self.table().name(), ids.clone());
            let stmt = statement(ids);
            let done = retry::run(db, table, || {
                detach::execute_observed(db, stmt.clone(), &touched)
            })
            .await?;
            deleted += done.rows_affected();
        }
        Ok(deleted)
    }

    /// Deletes the counts of every owner whose row no longer exists in the
    /// owner table, returning the slot rows deleted: the repair after rows
    /// were deleted without the counts, by `delete_many`, raw SQL or a
    /// truncate (Loco's `truncate` hook calls it after truncating the owner
    /// table). The orphaned owners are read first without a lock (one scan
    /// of the table, the owner table through its primary key), then deleted
    /// 1,000 owners per statement, each statement checking again that the
    /// owner is still gone: writers of other owners are never locked out
    /// for the length of the scan.
    ///
    /// The owner table is the one the derives and `counter_table!` name;
    /// a handle built by hand needs [`CounterTable::with_owner`](crate::CounterTable::with_owner),
    /// or this is [`CounterError::NoOwnerTable`]. In a
    /// [`Region`](crate::Region), the region's own rows, as [`Counters::purge`].
    pub async fn purge_orphans<C: ConnectionTrait>(&self, db: &C) -> Result<u64> {
        let owner = self
            .table()
            .owner()
            .ok_or_else(|| CounterError::NoOwnerTable {
                table: self.table().name().to_owned(),
            })?;
        let dialect = Dialect::of(db)?;
        let slots = self.own_slots();
        let mut deleted = 0;
        for (table, _) in sql::tables(self.table()) {
            let select = sql::orphan_owners(dialect, &table, owner);
            let rows = retry::run(db, &table, || detach::query_all(db, select.clone())).await?;
            let orphans = rows
                .iter()
                .map(|row| row.try_get_by_index::<I>(0))
                .collect::<Result<Vec<I>, _>>()?;
            deleted += self
                .delete_in_chunks(db, &table, &orphans, |ids| {
                    sql::delete_orphans_of(dialect, &table, owner, ids, slots)
                })
                .await?;
        }
        Ok(deleted)
    }

    /// Deletes every count in the table (totals and time buckets),
    /// returning the slot rows deleted: for a test suite that truncates the
    /// owner table. In a [`Region`](crate::Region), the region's own rows,
    /// as [`Counters::purge`].
    pub async fn clear<C: ConnectionTrait>(&self, db: &C) -> Result<u64> {
        let dialect = Dialect::of(db)?;
        let slots = self.own_slots();
        let mut deleted = 0;
        for (table, _) in sql::tables(self.table()) {
            let stmt = sql::delete_all(dialect, &table, slots);
            // The cache hears of the totals' table (its buckets are not cached).
            let touched = match table == self.table().name() {
                true => Touched::clear(&table),
                false => Touched::new(),
            };
            let done = retry::run(db, &table, || {
                detach::execute_observed(db, stmt.clone(), &touched)
            })
            .await?;
            deleted += done.rows_affected();
        }
        Ok(deleted)
    }
}
