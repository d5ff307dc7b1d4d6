//! Walking a table's owners in primary-key order, a bounded stretch at a
//! time: the batches of compaction and pruning, and the proof every walk
//! (recounts too) gives that it moves forward.

use std::cmp::Ordering;

use sea_orm::{ConnectionTrait, Value};

use crate::{
    detach,
    error::{CounterError, Result},
    owner::OwnerId,
    retry,
    sql::{self, Dialect, OwnerRange},
};

/// Checks a keyset walk's batches against the owner order of
/// [`sql::owner_order`]: every owner a batch returns lies strictly after
/// the walk's position and within the batch's bound, in strictly increasing
/// order, and every bound lies strictly after the position. A walk whose
/// batches all pass takes at most one batch per owner, so it ends; one
/// that fails stops with [`CounterError::WalkStalled`] instead of looping.
pub(crate) struct Forward<'t> {
    walk: &'static str,
    dialect: Dialect,
    table: &'t str,
}

impl<'t> Forward<'t> {
    pub(crate) fn new(walk: &'static str, dialect: Dialect, table: &'t str) -> Self {
        Self {
            walk,
            dialect,
            table,
        }
    }

    /// A batch after `after` (`None`: the start) up to `upto` (`None`: no
    /// bound) that returned `owners`, in the order returned.
    pub(crate) fn check<I: OwnerId>(
        &self,
        after: Option<&I>,
        upto: Option<&I>,
        owners: &[&I],
    ) -> Result<()> {
        let order = |a: &I, b: &I| sql::owner_order(self.dialect, a, b);
        if let (Some(after), Some(upto)) = (after, upto)
            && order(upto, after) != Ordering::Greater
        {
            return Err(self.stalled(after, "the next bound is not past it"));
        }
        let mut previous = after;
        for owner in owners.iter().copied() {
            if let Some(previous) = previous
                && order(owner, previous) != Ordering::Greater
            {
                return Err(self.stalled(previous, "a batch returned owners out of order"));
            }
            if let Some(upto) = upto
                && order(owner, upto) == Ordering::Greater
            {
                return Err(self.stalled(owner, "a batch returned an owner past its bound"));
            }
            previous = Some(owner);
        }
        Ok(())
    }

    fn stalled<I: OwnerId>(&self, owner: &I, reason: &'static str) -> CounterError {
        CounterError::WalkStalled {
            walk: self.walk,
            table: self.table.to_owned(),
            owner: format!("{owner:?}"),
            reason,
        }
    }
}

/// Consecutive stretches of a table's owners, each holding at least `rows`
/// slot rows (the last one fewer), that together cover the table:
/// `(-inf, b1]`, `(b1, b2]`, ..., `(bn, +inf)`. Each bound is found by an
/// index walk of `rows` entries, so a whole pass is linear in the table's
/// rows, and each is checked to lie past the last ([`Forward`]), so a pass
/// ends. Rows written behind the walk are left for the next pass.
pub(crate) struct Stretches<'t, I> {
    walk: &'static str,
    table: &'t str,
    rows: u64,
    after: Option<I>,
    done: bool,
}

impl<'t, I: OwnerId> Stretches<'t, I> {
    /// A `walk` (`compaction`, `prune`) over `table`, `rows` rows a stretch.
    pub(crate) fn new(walk: &'static str, table: &'t str, rows: u64) -> Self {
        Self {
            walk,
            table,
            rows,
            after: None,
            done: false,
        }
    }

    /// The next stretch, or `None` once the table is covered.
    pub(crate) async fn next<C: ConnectionTrait>(&mut self, db: &C) -> Result<Option<OwnerRange>> {
        if self.done {
            return Ok(None);
        }
        let dialect = Dialect::of(db)?;
        let after: Option<Value> = self.after.clone().map(Into::into);
        let stmt = sql::nth_row_owner(dialect, self.table, after.clone(), self.rows);
        let row = retry::run(db, self.table, || detach::query_one(db, stmt.clone())).await?;
        let upto = match row {
            Some(row) => Some(row.try_get::<I>("", sql::col::OWNER_ID)?),
            None => None,
        };
        Forward::new(self.walk, dialect, self.table).check(
            self.after.as_ref(),
            upto.as_ref(),
            &[],
        )?;
        let range = OwnerRange::Keyset {
            after,
            upto: upto.clone().map(Into::into),
            limit: self.rows,
        };
        match upto {
            Some(upto) => self.after = Some(upto),
            None => self.done = true,
        }
        Ok(Some(range))
    }
}
