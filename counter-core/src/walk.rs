//! Walking a table's owners in primary-key order, a bounded stretch at a
//! time: the batches of compaction and pruning.

use sea_orm::{ConnectionTrait, Value};

use crate::{
    error::Result,
    owner::OwnerId,
    retry,
    sql::{self, Dialect, OwnerRange},
};

/// Consecutive stretches of a table's owners, each holding at least `rows`
/// slot rows (the last one fewer), that together cover the table:
/// `(-inf, b1]`, `(b1, b2]`, ..., `(bn, +inf)`. Each bound is found by an
/// index walk of `rows` entries, so a whole pass is linear in the table's
/// rows. Rows written behind the walk are left for the next pass.
pub(crate) struct Stretches<'t> {
    table: &'t str,
    rows: u64,
    after: Option<Value>,
    done: bool,
}

impl<'t> Stretches<'t> {
    pub(crate) fn new(table: &'t str, rows: u64) -> Self {
        Self {
            table,
            rows,
            after: None,
            done: false,
        }
    }

    /// The next stretch, or `None` once the table is covered.
    pub(crate) async fn next<I: OwnerId, C: ConnectionTrait>(
        &mut self,
        db: &C,
    ) -> Result<Option<OwnerRange>> {
        if self.done {
            return Ok(None);
        }
        let stmt = sql::nth_row_owner(Dialect::of(db)?, self.table, self.after.clone(), self.rows);
        let row = retry::run(db, self.table, || db.query_one_raw(stmt.clone())).await?;
        let upto: Option<Value> = match row {
            Some(row) => Some(row.try_get::<I>("", sql::col::OWNER_ID)?.into()),
            None => None,
        };
        let range = OwnerRange::Keyset {
            after: self.after.take(),
            upto: upto.clone(),
            limit: self.rows,
        };
        match upto {
            Some(upto) => self.after = Some(upto),
            None => self.done = true,
        }
        Ok(Some(range))
    }
}
