//! The read behind every event: the watched totals and estimates of some
//! owners of one namespace, grouped, from the primary (a cache or a standby
//! could answer with a value older than the change that asked for it).

use counter_core::CounterError;
use sea_orm::DatabaseConnection;

use super::{
    RankedTotal, WatchedRanking,
    mailbox::{Total, Value},
};
use crate::{
    dispatch,
    domain::namespace::{Handle, Namespace},
    domain::owner::ServiceOwner,
};

/// Owners per statement: a refresh of many owners is several reads.
const OWNERS_PER_READ: usize = 500;

/// Every `(owner, key)` value of `owners` × `counted` and `owners` ×
/// `unique`, zero-filled. Owners were checked when their stream began.
pub(super) async fn values(
    db: &DatabaseConnection,
    namespace: &Namespace,
    owners: &[String],
    counted: &[String],
    unique: &[String],
) -> Result<Vec<(Total, Value)>, CounterError> {
    dispatch!(&namespace.table, h => typed(db, h, owners, counted, unique).await)
}

async fn typed<I: ServiceOwner>(
    db: &DatabaseConnection,
    handle: &Handle<I>,
    owners: &[String],
    counted: &[String],
    unique: &[String],
) -> Result<Vec<(Total, Value)>, CounterError> {
    let owners: Vec<(I, &String)> = owners
        .iter()
        .filter_map(|text| Some((I::from_text(text).ok()?, text)))
        .collect();
    let counted: Vec<&str> = counted.iter().map(String::as_str).collect();
    let unique: Vec<&str> = unique.iter().map(String::as_str).collect();
    let mut values = Vec::with_capacity(owners.len() * (counted.len() + unique.len()));
    for chunk in owners.chunks(OWNERS_PER_READ) {
        let ids: Vec<I> = chunk.iter().map(|(id, _)| id.clone()).collect();
        if !counted.is_empty() {
            let totals = handle.counters.get_many(db, &ids, &counted).await?;
            for (id, text) in chunk {
                let of_owner = totals.get(id);
                for key in &counted {
                    let total = of_owner.and_then(|t| t.get(*key)).copied().unwrap_or(0);
                    values.push((((*text).clone(), (*key).to_owned()), Value::Count(total)));
                }
            }
        }
        if !unique.is_empty() {
            let estimates = handle.counters.unique_many(db, &ids, &unique).await?;
            for (id, text) in chunk {
                let of_owner = estimates.get(id);
                for key in &unique {
                    let estimate = of_owner.and_then(|e| e.get(*key)).copied().unwrap_or(0);
                    values.push((
                        ((*text).clone(), (*key).to_owned()),
                        Value::Unique(estimate),
                    ));
                }
            }
        }
    }
    Ok(values)
}

/// The first `limit` owners of `key`'s ranking in `namespace`.
pub(super) async fn ranking(
    db: &DatabaseConnection,
    namespace: &Namespace,
    key: &str,
    limit: usize,
) -> Result<WatchedRanking, CounterError> {
    let owners = dispatch!(&namespace.table, h => h
        .counters
        .top(db, key, limit)
        .await?
        .into_iter()
        .map(|r| RankedTotal {
            owner: r.owner.render(),
            total: r.total,
        })
        .collect());
    Ok(WatchedRanking {
        key: key.to_owned(),
        owners,
    })
}
