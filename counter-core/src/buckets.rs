//! Reading and pruning a windowed key's time buckets.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use sea_orm::ConnectionTrait;

use crate::{
    Counters, detach,
    error::{CounterError, Result},
    key::validate_key,
    owner::OwnerId,
    retry,
    sql::{self, Dialect, col},
    typed::{KeyOf, KeySpace},
    walk,
    window::{self, Window},
};

/// A zero-filled series: each bucket's start and its count, oldest first.
pub type Series = Vec<(DateTime<Utc>, i64)>;

/// The most counts [`Counters::series_many`] returns (owners x buckets):
/// a year of days for 25,000 owners.
const MAX_SERIES_CELLS: usize = 10_000_000;

/// Slot rows per prune statement: the stretch of owners one `DELETE` covers.
const PRUNE_ROWS_PER_STATEMENT: u64 = 5_000;

impl<I: OwnerId, S: KeySpace> Counters<I, S> {
    /// The count of a windowed key over the buckets that start in
    /// `[from, to)`: with day buckets, `from` and `to` at midnight give
    /// whole days, and a range that starts mid-day leaves that day out.
    /// `from == to` is an empty range (0); `from > to` is
    /// [`CounterError::InvalidRange`]; a key without a window is
    /// [`CounterError::NotWindowed`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use chrono::{Duration, TimeZone, Utc};
    /// use counter_core::{CounterTable, Counters, Window};
    ///
    /// let db = sea_orm::Database::connect("sqlite::memory:").await?;
    /// let table = CounterTable::new("post_counters")?.with_key_window("views", Window::Day)?;
    /// let posts = Counters::<i64>::new(table);
    /// posts.create_table(&db).await?;
    ///
    /// let nov_1 = Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).unwrap();
    /// posts.add_at(&db, 7, "views", 3, nov_1 + Duration::hours(5)).await?;
    /// posts.add_at(&db, 7, "views", 2, nov_1 + Duration::days(2)).await?;
    ///
    /// assert_eq!(posts.range(&db, 7, "views", nov_1, nov_1 + Duration::days(1)).await?, 3);
    /// let series = posts.series(&db, 7, "views", nov_1, nov_1 + Duration::days(3)).await?;
    /// assert_eq!(series.iter().map(|(_, n)| *n).collect::<Vec<_>>(), [3, 0, 2]);
    /// assert_eq!(posts.get(&db, 7, "views").await?, 5); // the all-time total
    /// # Ok(())
    /// # }
    /// ```
    pub async fn range<C: ConnectionTrait, K: KeyOf<S>>(
        &self,
        db: &C,
        owner: I,
        key: K,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<i64> {
        let mut all = self
            .range_many(db, std::slice::from_ref(&owner), key, from, to)
            .await?;
        Ok(all.remove(&owner).unwrap_or(0))
    }

    /// [`Counters::range`] for many owners, in one grouped query per chunk
    /// of owners; every owner asked for is in the map, zero-filled.
    pub async fn range_many<C: ConnectionTrait, K: KeyOf<S>>(
        &self,
        db: &C,
        owners: &[I],
        key: K,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<HashMap<I, i64>> {
        let (key, _) = self.windowed(&key)?;
        window::check_range(from, to)?;
        let mut totals: HashMap<I, i64> = HashMap::new();
        let bounds = (window::ceil_seconds(from), window::ceil_seconds(to));
        self.read_buckets(db, owners, key, bounds, false, |owner, _, total| {
            totals.insert(owner, total);
        })
        .await?;
        Ok(owners
            .iter()
            .map(|o| (o.clone(), totals.get(o).copied().unwrap_or(0)))
            .collect())
    }

    /// A windowed key's count per bucket, for every bucket that starts in
    /// `[from, to)`, zero-filled, oldest first: a chart's data. At most
    /// [`MAX_SERIES_BUCKETS`](crate::limits::MAX_SERIES_BUCKETS) buckets.
    pub async fn series<C: ConnectionTrait, K: KeyOf<S>>(
        &self,
        db: &C,
        owner: I,
        key: K,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Series> {
        let mut all = self
            .series_many(db, std::slice::from_ref(&owner), key, from, to)
            .await?;
        Ok(all.remove(&owner).unwrap_or_default())
    }

    /// [`Counters::series`] for many owners, in one grouped query per chunk
    /// of owners; every owner asked for has a full, zero-filled series. At
    /// most 10,000,000 counts (owners x buckets) in all, else
    /// [`CounterError::InvalidRange`].
    pub async fn series_many<C: ConnectionTrait, K: KeyOf<S>>(
        &self,
        db: &C,
        owners: &[I],
        key: K,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<HashMap<I, Series>> {
        let (key, window) = self.windowed(&key)?;
        let starts = window.starts(from, to)?;
        // The result holds owners x buckets counts: bounded like one series.
        let cells = owners.len().saturating_mul(starts.len());
        if cells > MAX_SERIES_CELLS {
            return Err(CounterError::InvalidRange {
                reason: format!(
                    "{} owners x {} buckets is {cells} counts; a batch of series holds at most {MAX_SERIES_CELLS}",
                    owners.len(),
                    starts.len()
                ),
            });
        }
        let mut counts: HashMap<(I, i64), i64> = HashMap::new();
        if let (Some(&first), Some(&last)) = (starts.first(), starts.last()) {
            let bounds = (first, last + 1);
            self.read_buckets(db, owners, key, bounds, true, |owner, bucket, total| {
                counts.insert((owner, bucket), total);
            })
            .await?;
        }
        Ok(owners
            .iter()
            .map(|owner| {
                let series = starts
                    .iter()
                    .map(|&b| {
                        let count = counts.get(&(owner.clone(), b)).copied().unwrap_or(0);
                        (window::from_bucket(b), count)
                    })
                    .collect();
                (owner.clone(), series)
            })
            .collect())
    }

    /// Deletes every bucket, of every windowed key, that ended at or before
    /// `before` (a day bucket of Oct 31 ends at Nov 1, 00:00). All-time
    /// totals do not change: they are kept apart from the buckets. Runs in
    /// stretches of owners, one `DELETE` per stretch and window, so it never
    /// holds many locks for long; returns the bucket rows deleted. A
    /// compaction folding the same old buckets at the same moment may leave
    /// one folded row of a pruned bucket behind (the next prune takes it);
    /// no total is affected either way.
    pub async fn prune<C: ConnectionTrait>(&self, db: &C, before: DateTime<Utc>) -> Result<u64> {
        let mut deleted = 0;
        // The deltas' buckets, then the unique keys' (whose all-time
        // sketches, in bucket `ALL_TIME`, stay).
        let tables = [
            (self.table().bucket_table(), false),
            (self.table().sketch_table(), true),
        ];
        for (table, unique) in tables {
            if let Some(table) = table {
                deleted += self.prune_table(db, &table, unique, before).await?;
            }
        }
        Ok(deleted)
    }

    /// The part of [`Counters::prune`] for one table of buckets: the bucket
    /// table (`unique == false`) or the sketch table.
    async fn prune_table<C: ConnectionTrait>(
        &self,
        db: &C,
        table: &str,
        unique: bool,
        before: DateTime<Utc>,
    ) -> Result<u64> {
        let dialect = Dialect::of(db)?;
        let by_window = self.table().keys_by_window(unique);
        if by_window.is_empty() {
            return Ok(0);
        }
        let floor = unique.then_some(sql::sketches::ALL_TIME);
        // In a region, its own buckets only: each region prunes its own.
        let slots = sql::FoldSlots::of_region(self.table().region().as_ref());
        let mut deleted = 0;
        let mut stretches = walk::Stretches::<I>::new("prune", table, PRUNE_ROWS_PER_STATEMENT);
        while let Some(range) = stretches.next(db).await? {
            for (window, keys) in &by_window {
                // The last start whose bucket ends at or before `before`.
                let last = before.timestamp() - window.seconds();
                let stmt =
                    sql::prune_buckets(dialect, table, &range, keys.clone(), floor, last, slots);
                let done = retry::run(db, table, || detach::execute(db, stmt.clone())).await?;
                deleted += done.rows_affected();
            }
        }
        Ok(deleted)
    }

    /// The stored name and window of a windowed key.
    fn windowed<'k, K: KeyOf<S>>(&self, key: &'k K) -> Result<(&'k str, Window)> {
        let key = key.as_key_str();
        validate_key(key)?;
        self.table().check_kind(key, false, "range")?;
        Ok((key, self.table().required_window(key)?))
    }

    /// Runs the bucket sums of `owners` in chunks, handing each
    /// `(owner, bucket, total)` to `found` (bucket 0 when not per bucket).
    async fn read_buckets<C: ConnectionTrait>(
        &self,
        db: &C,
        owners: &[I],
        key: &str,
        bounds: (i64, i64),
        per_bucket: bool,
        mut found: impl FnMut(I, i64, i64),
    ) -> Result<()> {
        let Some(table) = self.table().bucket_table() else {
            return Ok(());
        };
        let mut unique = HashSet::with_capacity(owners.len());
        for owner in owners {
            owner.check()?;
            unique.insert(owner.clone());
        }
        if unique.is_empty() || bounds.0 >= bounds.1 {
            return Ok(());
        }
        let unique: Vec<I> = unique.into_iter().collect();
        let dialect = Dialect::of(db)?;
        // Three binds besides the owners: the key and the two bounds.
        let (_, per_query) = sql::read_chunks(dialect, 3);
        for chunk in unique.chunks(per_query) {
            let ids = chunk.iter().cloned().map(Into::into).collect();
            let stmt = sql::bucket_sums(dialect, &table, ids, key, bounds, per_bucket);
            let rows = retry::run(db, &table, || detach::query_all(db, stmt.clone())).await?;
            for row in rows {
                let owner = row.try_get::<I>("", col::OWNER_ID)?;
                let bucket = match per_bucket {
                    true => row.try_get::<i64>("", col::BUCKET)?,
                    false => 0,
                };
                let total = row.try_get::<String>("", col::TOTAL)?;
                let total = sql::parse_total(&total, || {
                    format!("the bucket sum of `{key}` in table `{table}`")
                })?;
                found(owner, bucket, total);
            }
        }
        Ok(())
    }
}
