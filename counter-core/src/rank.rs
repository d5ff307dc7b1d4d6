//! Owners ranked by a counter: most liked, most viewed.

use sea_orm::ConnectionTrait;

use crate::{
    Counters, detach,
    error::{CounterError, Result},
    key::validate_key,
    owner::OwnerId,
    retry,
    sql::{self, Dialect, col},
    typed::{KeyOf, KeySpace},
};

use crate::limits::MAX_RANK_PAGE;

/// One owner of a ranking and its total. Also the cursor of the next page:
/// pass the last one of a page to [`Counters::top_after`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ranked<I> {
    /// The owner.
    pub owner: I,
    /// Its counter's total when the page was read.
    pub total: i64,
}

impl<I: OwnerId, S: KeySpace> Counters<I, S> {
    /// The `n` owners with the highest totals of `key`, highest first; ties
    /// are broken by owner id, ascending (string ids byte-wise, on tables
    /// this version created), so the order is deterministic. Owners with no
    /// slot row for `key` are not listed: never written, or netted to zero
    /// and compacted away (an uncompacted zero is listed with 0).
    ///
    /// Exact: the totals are summed from the slot rows when asked, so a
    /// ranking is as fresh as a [`Counters::get`]. The cost is one pass over
    /// `key`'s slot rows (through the key index `(count_key, owner_id)`,
    /// never the other keys' rows) in which the database sums every counted
    /// owner (a hash aggregate on PostgreSQL, which may spill to disk) and
    /// sends back only `n`: linear in the counted owners, tens of
    /// milliseconds for 100,000 (see the README), and the thing to cache, or
    /// to compact first (fewer rows), beyond that.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use counter_core::{CounterTable, Counters, Ranked};
    ///
    /// let db = sea_orm::Database::connect("sqlite::memory:").await?;
    /// let posts = Counters::<i64>::new(CounterTable::new("post_counters")?);
    /// posts.create_table(&db).await?;
    /// posts.add_many(&db, [(1, "likes", 5), (2, "likes", 9), (3, "likes", 5)]).await?;
    ///
    /// let top = posts.top(&db, "likes", 2).await?;
    /// assert_eq!(top, [Ranked { owner: 2, total: 9 }, Ranked { owner: 1, total: 5 }]);
    /// let next = posts.top_after(&db, "likes", &top[1], 2).await?;
    /// assert_eq!(next, [Ranked { owner: 3, total: 5 }]);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn top<C: ConnectionTrait, K: KeyOf<S>>(
        &self,
        db: &C,
        key: K,
        n: usize,
    ) -> Result<Vec<Ranked<I>>> {
        self.ranked(db, key, None, n).await
    }

    /// The page of [`Counters::top`] that follows `last` (the last owner of
    /// the page before): keyset pagination, so a page costs the same however
    /// deep it is, and an owner is listed once even if totals change between
    /// pages (unless its total moved it across the cursor).
    pub async fn top_after<C: ConnectionTrait, K: KeyOf<S>>(
        &self,
        db: &C,
        key: K,
        last: &Ranked<I>,
        n: usize,
    ) -> Result<Vec<Ranked<I>>> {
        self.ranked(db, key, Some(last), n).await
    }

    async fn ranked<C: ConnectionTrait, K: KeyOf<S>>(
        &self,
        db: &C,
        key: K,
        after: Option<&Ranked<I>>,
        n: usize,
    ) -> Result<Vec<Ranked<I>>> {
        let key = key.as_key_str();
        validate_key(key)?;
        CounterError::check_size("ranking page size", n, 1, MAX_RANK_PAGE)?;
        if let Some(last) = after {
            last.owner.check()?;
        }
        let dialect = Dialect::of(db)?;
        let table = self.table().name();
        let after = after.map(|r| (r.total, r.owner.clone().into()));
        let stmt = sql::ranked(dialect, table, key, after, n as u64);
        let rows = retry::run(db, table, || detach::query_all(db, stmt.clone())).await?;
        rows.iter()
            .map(|row| {
                let owner = row.try_get::<I>("", col::OWNER_ID)?;
                let total = row.try_get::<String>("", col::TOTAL)?;
                let total = sql::parse_total(&total, || {
                    format!("the total of `{key}` in table `{table}`")
                })?;
                Ok(Ranked { owner, total })
            })
            .collect()
    }
}
