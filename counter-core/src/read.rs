//! Reads: totals are sums over slots, fetched in one grouped query per chunk.

use std::collections::{BTreeSet, HashMap, HashSet};

use sea_orm::ConnectionTrait;

use crate::{
    CounterError, Counters, ErrorKind, detach,
    error::Result,
    key::validate_key,
    owner::OwnerId,
    retry,
    sql::{self, Dialect, SumRow},
    typed::{KeyOf, KeySpace},
};

/// Totals by owner, then by key.
pub type CountMap<I> = HashMap<I, HashMap<String, i64>>;

impl<I: OwnerId, S: KeySpace> Counters<I, S> {
    /// The total of one counter; 0 if it was never written.
    pub async fn get<C: ConnectionTrait, K: KeyOf<S>>(
        &self,
        db: &C,
        owner: I,
        key: K,
    ) -> Result<i64> {
        let key = key.as_key_str();
        validate_key(key)?;
        self.table().check_kind(key, false, "get")?;
        let mut counts = self
            .read(db, std::slice::from_ref(&owner), Some(vec![key.to_owned()]))
            .await?;
        Ok(counts
            .remove(&owner)
            .and_then(|keys| keys.get(key).copied())
            .unwrap_or(0))
    }

    /// The totals of `keys` for each of `owners`, in one grouped `SUM` query
    /// per chunk of owners (chunks stay under the backend's bind limit).
    ///
    /// Every requested owner is in the result, and every requested key in
    /// its totals, zero-filled, so the map can be indexed without checks: by
    /// key name on an untyped handle, as the entity's `Counts` on a typed one
    /// (where the fields of keys not asked for are 0 too). Duplicate owners
    /// or keys are fine; an empty owner list returns an empty map without a
    /// query.
    pub async fn get_many<C: ConnectionTrait, K: KeyOf<S>>(
        &self,
        db: &C,
        owners: &[I],
        keys: &[K],
    ) -> Result<HashMap<I, S::Totals>> {
        let mut wanted = BTreeSet::new();
        for key in keys {
            let key = key.as_key_str();
            validate_key(key)?;
            self.table().check_kind(key, false, "get_many")?;
            wanted.insert(key.to_owned());
        }
        let counts = self
            .read(db, owners, Some(wanted.into_iter().collect()))
            .await?;
        Ok(counts
            .into_iter()
            .map(|(owner, by_name)| (owner, S::totals(by_name)))
            .collect())
    }

    /// Every counter that exists for each of `owners`, for keys not known in
    /// advance (per-emoji reactions, feature flags). Owners with no counters
    /// map to an empty map.
    pub async fn get_all_keys<C: ConnectionTrait>(
        &self,
        db: &C,
        owners: &[I],
    ) -> Result<CountMap<I>> {
        self.read(db, owners, None).await
    }

    async fn read<C: ConnectionTrait>(
        &self,
        db: &C,
        owners: &[I],
        keys: Option<Vec<String>>,
    ) -> Result<CountMap<I>> {
        let mut unique = HashSet::with_capacity(owners.len());
        for owner in owners {
            owner.check()?;
            unique.insert(owner.clone());
        }
        let owners: Vec<I> = unique.into_iter().collect();
        let zeros: HashMap<String, i64> = keys.iter().flatten().map(|k| (k.clone(), 0)).collect();
        let mut counts: CountMap<I> = owners.iter().map(|o| (o.clone(), zeros.clone())).collect();
        if owners.is_empty() || keys.as_ref().is_some_and(Vec::is_empty) {
            return Ok(counts);
        }
        let dialect = Dialect::of(db)?;
        let table = self.table().name();
        let (keys_per_query, owners_per_query) =
            sql::read_chunks(dialect, keys.as_ref().map_or(0, Vec::len));
        // `None` reads every key: one pass with no key filter.
        let key_chunks: Vec<Option<Vec<String>>> = match &keys {
            Some(keys) => keys
                .chunks(keys_per_query)
                .map(|c| Some(c.to_vec()))
                .collect(),
            None => vec![None],
        };
        for keys in key_chunks {
            for chunk in owners.chunks(owners_per_query) {
                let ids = chunk.iter().cloned().map(Into::into).collect();
                let stmt = sql::sums(dialect, table, ids, keys.clone());
                let rows = match retry::run(db, table, || detach::query_all(db, stmt.clone())).await
                {
                    Ok(rows) => rows,
                    Err(e) if e.kind() == ErrorKind::Overflow => {
                        return Err(name_overflow(db, dialect, table, chunk, keys.clone())
                            .await
                            .unwrap_or(e));
                    }
                    Err(e) => return Err(e),
                };
                for row in rows {
                    let SumRow { owner, key, total } = SumRow::<I>::decode(&row, table)?;
                    if let Some(totals) = counts.get_mut(&owner) {
                        totals.insert(key, total);
                    }
                }
            }
        }
        Ok(counts)
    }
}

/// The counter among `owners` (and `keys`) whose total leaves `i64`, as an
/// [`CounterError::Overflow`] naming its owner and key: the read's error,
/// where the database raised one for the whole query (SQLite's `sum()`).
/// Only direct SQL can put a counter there: every add checks its total
/// (see `crate::settle`).
async fn name_overflow<C: ConnectionTrait, I: OwnerId>(
    db: &C,
    dialect: Dialect,
    table: &str,
    owners: &[I],
    keys: Option<Vec<String>>,
) -> Option<CounterError> {
    let ids = owners.iter().cloned().map(Into::into).collect();
    let rows = detach::query_all(db, sql::slot_values(dialect, table, ids, keys))
        .await
        .ok()?;
    let mut sums: HashMap<(I, String), i128> = HashMap::new();
    for row in rows {
        let owner: I = row.try_get_by_index(0).ok()?;
        let key: String = row.try_get_by_index(1).ok()?;
        let value: i64 = row.try_get_by_index(2).ok()?;
        *sums.entry((owner, key)).or_default() += i128::from(value);
    }
    let ((owner, key), _) = sums
        .into_iter()
        .find(|(_, total)| i64::try_from(*total).is_err())?;
    Some(CounterError::Overflow {
        context: sql::total_context(&key, &owner.into(), table),
    })
}
