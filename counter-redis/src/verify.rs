//! Check and fix: cached owners compared with the database, mismatches
//! deleted and reported. The figure that proves the guarantees in
//! production: it stays 0 unless an invalidation failed.

use counter_core::{KeySpace, OwnerId, Result};
use sea_orm::DatabaseConnection;

use crate::{
    CachedCounters,
    stats::bump,
    value::{self, Entry},
};

/// What [`CachedCounters::verify`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyReport<I> {
    /// Owners asked about.
    pub checked: usize,
    /// Of those, owners cached (complete values) when looked at.
    pub cached: usize,
    /// Cached owners whose totals differed from the database's; their
    /// values were deleted.
    pub mismatched: Vec<I>,
    /// Whether Redis answered at all (if not, nothing was compared).
    pub redis_answered: bool,
}

impl<I: OwnerId, S: KeySpace> CachedCounters<I, S> {
    /// Compares the cached totals of `owners` (a sample: recently read
    /// owners, random ids) with one grouped database read, deletes every
    /// cached owner that differs, and reports them; counted in
    /// [`CacheStats::mismatches`](crate::CacheStats::mismatches).
    ///
    /// A write that commits between the two reads can make a correct entry
    /// look wrong; deleting it is harmless (the next read fills it again).
    pub async fn verify(&self, db: &DatabaseConnection, owners: &[I]) -> Result<VerifyReport<I>> {
        let shared = self.shared();
        let table = self.counters().table().name();
        let mut owners = owners.to_vec();
        owners.sort();
        owners.dedup();
        let keys: Vec<Vec<u8>> = owners
            .iter()
            .map(|o| shared.key(table, &o.clone().into()))
            .collect();
        let mut report = VerifyReport {
            checked: owners.len(),
            cached: 0,
            mismatched: Vec::new(),
            redis_answered: false,
        };
        let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let Some(values) = shared.redis(shared.link.read(&refs)).await else {
            return Ok(report);
        };
        report.redis_answered = true;
        let cached: Vec<(I, Vec<u8>, _)> = owners
            .into_iter()
            .zip(keys)
            .zip(values)
            .filter_map(
                |((owner, key), value)| match value::decode_map(value.as_deref(), None) {
                    Entry::Complete(counts) => Some((owner, key, counts)),
                    _ => None,
                },
            )
            .collect();
        report.cached = cached.len();
        let ids: Vec<I> = cached.iter().map(|(o, _, _)| o.clone()).collect();
        let truth = self.owner_counts(db, &ids).await?;
        let mut wrong_keys = Vec::new();
        for (owner, key, mut counts) in cached {
            let mut expected = truth.get(&owner).cloned().unwrap_or_default();
            counts.retain(|_, v| *v != 0);
            expected.retain(|_, v| *v != 0);
            if counts != expected {
                tracing::warn!(table, owner = ?owner, "counter cache: cached totals differ from the database; deleted");
                report.mismatched.push(owner);
                wrong_keys.push(key);
            }
        }
        bump(&shared.meter.mismatches, wrong_keys.len());
        shared.invalidate(wrong_keys).await;
        Ok(report)
    }
}
