//! Reads of unique counts: every slot row of the counters asked for, merged
//! per owner and key in Rust (one query per chunk of owners).

use std::collections::{BTreeSet, HashMap, HashSet, hash_map::Entry};

use chrono::{DateTime, Utc};
use sea_orm::ConnectionTrait;

use super::Sketch;
use crate::{
    CounterError, Counters, detach,
    error::Result,
    limits::MAX_UNIQUE_RANGE_SKETCHES,
    owner::OwnerId,
    retry,
    sql::{
        self, Dialect,
        sketches::{self, Buckets, SketchRow},
    },
    typed::{KeySpace, UniqueKeyOf},
    window,
};

/// Estimates of distinct members by owner, then by key.
pub type UniqueMap<I> = HashMap<I, HashMap<String, u64>>;

impl<I: OwnerId, S: KeySpace> Counters<I, S> {
    /// The estimated number of distinct members of a unique key: the
    /// merge of its slots' sketches. 0 if nothing was observed. Within
    /// 0.81 % (one standard error; see [`Sketch`]) of the exact count.
    pub async fn unique<C: ConnectionTrait, K: UniqueKeyOf<S>>(
        &self,
        db: &C,
        owner: I,
        key: K,
    ) -> Result<u64> {
        Ok(self.sketch(db, owner, key).await?.estimate())
    }

    /// The merged sketch of a unique key (empty if nothing was observed):
    /// to merge with other sketches in memory (the union of several
    /// owners), to cache, or to move to another store.
    pub async fn sketch<C: ConnectionTrait, K: UniqueKeyOf<S>>(
        &self,
        db: &C,
        owner: I,
        key: K,
    ) -> Result<Sketch> {
        let key = key.as_key_str();
        self.check_unique(&owner, key, "unique")?;
        let mut merged = self
            .read_sketches(
                db,
                std::slice::from_ref(&owner),
                &[key.to_owned()],
                Buckets::AllTime,
            )
            .await?;
        Ok(merged.remove(&(owner, key.to_owned())).unwrap_or_default())
    }

    /// The estimates of `keys` for each of `owners`, in one query per chunk
    /// of owners (sketches merged per owner and key in memory). Every
    /// requested owner and key is in the map, 0 where nothing was observed.
    pub async fn unique_many<C: ConnectionTrait, K: UniqueKeyOf<S>>(
        &self,
        db: &C,
        owners: &[I],
        keys: &[K],
    ) -> Result<UniqueMap<I>> {
        let mut names = BTreeSet::new();
        for key in keys {
            self.check_unique_key(key.as_key_str(), "unique_many")?;
            names.insert(key.as_key_str().to_owned());
        }
        for owner in owners {
            owner.check()?;
        }
        let names: Vec<String> = names.into_iter().collect();
        let merged = self
            .read_sketches(db, owners, &names, Buckets::AllTime)
            .await?;
        Ok(zero_filled(owners, &names, merged))
    }

    /// The estimated number of distinct members of a windowed unique key
    /// over the buckets that start in `[from, to)` (the same range rule as
    /// [`Counters::range`]): the *union* of the buckets' sketches, so a
    /// member seen on Monday and Tuesday counts once in the week, not twice
    /// as a sum of days would. A key without a window is
    /// [`CounterError::NotWindowed`]; `from > to` is
    /// [`CounterError::InvalidRange`].
    pub async fn unique_over<C: ConnectionTrait, K: UniqueKeyOf<S>>(
        &self,
        db: &C,
        owner: I,
        key: K,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<u64> {
        let mut all = self
            .unique_over_named(db, std::slice::from_ref(&owner), key.as_key_str(), from, to)
            .await?;
        Ok(all.remove(&owner).unwrap_or(0))
    }

    /// [`Counters::unique_over`] of many owners, in one query per chunk of
    /// owners; every requested owner is in the map.
    pub async fn unique_over_many<C: ConnectionTrait, K: UniqueKeyOf<S>>(
        &self,
        db: &C,
        owners: &[I],
        key: K,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<HashMap<I, u64>> {
        self.unique_over_named(db, owners, key.as_key_str(), from, to)
            .await
    }

    async fn unique_over_named<C: ConnectionTrait>(
        &self,
        db: &C,
        owners: &[I],
        key: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<HashMap<I, u64>> {
        self.check_unique_key(key, "unique_over")?;
        for owner in owners {
            owner.check()?;
        }
        let window = self.table().required_window(key)?;
        // owners x buckets sketches at most: the read's rows and merging.
        let buckets = window.starts(from, to)?.len();
        let sketches = owners.len().saturating_mul(buckets);
        if sketches > MAX_UNIQUE_RANGE_SKETCHES {
            return Err(CounterError::InvalidRange {
                reason: format!(
                    "{} owners x {buckets} buckets is {sketches} sketches; a unique range read merges at most {MAX_UNIQUE_RANGE_SKETCHES}",
                    owners.len()
                ),
            });
        }
        let range = Buckets::Range {
            from: window::ceil_seconds(from),
            to: window::ceil_seconds(to),
        };
        let names = [key.to_owned()];
        let merged = self.read_sketches(db, owners, &names, range).await?;
        Ok(zero_filled(owners, &names, merged)
            .into_iter()
            .map(|(owner, mut by_key)| (owner, by_key.remove(key).unwrap_or(0)))
            .collect())
    }

    /// The merged sketch of each `(owner, key)` that has rows in `buckets`.
    async fn read_sketches<C: ConnectionTrait>(
        &self,
        db: &C,
        owners: &[I],
        keys: &[String],
        buckets: Buckets,
    ) -> Result<HashMap<(I, String), Sketch>> {
        let mut merged: HashMap<(I, String), Sketch> = HashMap::new();
        let (Some(table), false, false) = (
            self.table().sketch_table(),
            owners.is_empty(),
            keys.is_empty(),
        ) else {
            return Ok(merged);
        };
        let owners: Vec<I> = owners
            .iter()
            .cloned()
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let dialect = Dialect::of(db)?;
        let (_, owners_per_query) = sql::read_chunks(dialect, keys.len() + 2);
        for chunk in owners.chunks(owners_per_query) {
            let ids = chunk.iter().cloned().map(Into::into).collect();
            let stmt = sketches::read_sketches(dialect, &table, ids, keys.to_vec(), buckets);
            let rows = retry::run(db, &table, || detach::query_all(db, stmt.clone())).await?;
            let rows: Vec<SketchRow<I>> =
                rows.iter().map(SketchRow::decode).collect::<Result<_>>()?;
            merged = merge_rows(&table, rows, merged).await?;
        }
        Ok(merged)
    }
}

/// Rows merged inline at most; more go to a blocking thread.
const INLINE_MERGE_ROWS: usize = 64;

/// `rows` merged into `merged`, per owner and key. Merging is CPU work (a
/// 30-day union of 1,000 owners merges 30,000 sketches of up to 12 kB), so
/// beyond a few rows it runs on Tokio's blocking pool, not on the async
/// worker whose other tasks (other requests) would wait behind it.
async fn merge_rows<I: OwnerId>(
    table: &str,
    rows: Vec<SketchRow<I>>,
    merged: HashMap<(I, String), Sketch>,
) -> Result<HashMap<(I, String), Sketch>> {
    let many = rows.len() > INLINE_MERGE_ROWS;
    let merge = {
        let table = table.to_owned();
        move || merge_all(&table, rows, merged)
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) if many => match runtime.spawn_blocking(merge).await {
            Ok(done) => done,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down: as a lost connection would.
            Err(e) => {
                Err(sea_orm::DbErr::Custom(format!("merging sketches did not finish: {e}")).into())
            }
        },
        _ => merge(),
    }
}

fn merge_all<I: OwnerId>(
    table: &str,
    rows: Vec<SketchRow<I>>,
    mut merged: HashMap<(I, String), Sketch>,
) -> Result<HashMap<(I, String), Sketch>> {
    for SketchRow { owner, key, sketch } in rows {
        let sketch = Sketch::from_bytes(&sketch).map_err(|source| CounterError::BadSketch {
            table: table.to_owned(),
            source,
        })?;
        // The first row of a counter is its merge so far: no copy.
        match merged.entry((owner, key)) {
            Entry::Occupied(mut first) => {
                first.get_mut().merge(&sketch);
            }
            Entry::Vacant(none) => {
                none.insert(sketch);
            }
        }
    }
    Ok(merged)
}

/// Every owner with every key, its estimate or 0.
fn zero_filled<I: OwnerId>(
    owners: &[I],
    keys: &[String],
    merged: HashMap<(I, String), Sketch>,
) -> UniqueMap<I> {
    owners
        .iter()
        .map(|owner| {
            let by_key = keys
                .iter()
                .map(|key| {
                    let sketch = merged.get(&(owner.clone(), key.clone()));
                    (key.clone(), sketch.map_or(0, Sketch::estimate))
                })
                .collect();
            (owner.clone(), by_key)
        })
        .collect()
}
