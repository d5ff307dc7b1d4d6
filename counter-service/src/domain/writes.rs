//! A write's items checked and applied through its namespace's add queue
//! ([`adds`](crate::domain::adds)), and what the write answers: the path of
//! `counters:add`, `counters:addAndGet` and `counters:batchAdd`, and of the
//! in-process [`Local`](crate::Local).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use crate::{
    dispatch,
    domain::{
        adds::{Item, Op, Outcome, Write},
        admission::Arrival,
        idempotency,
        namespace::Namespace,
        owner::ServiceOwner,
        schema::OwnerValue,
    },
    problem::Problem,
};

/// A 64-bit integer as a JSON number or a decimal string: a JavaScript
/// client cannot write one past 2^53 as a number.
pub(crate) fn int64<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Int64 {
        Number(i64),
        Text(String),
    }
    match Int64::deserialize(deserializer)? {
        Int64::Number(n) => Ok(n),
        Int64::Text(text) => text.parse().map_err(|_| {
            serde::de::Error::custom(format!(
                "`{}` is not a 64-bit integer",
                crate::problem::preview(&text)
            ))
        }),
    }
}

/// An item's `delta` when it names none.
pub(crate) fn one() -> i64 {
    1
}

/// One item of a batch: a delta and the id that makes it retry-safe.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchItem {
    /// Applied once per id (1 to 128 printable ASCII characters); without
    /// one, the item is applied as often as it is sent.
    pub id: Option<String>,
    /// The owner.
    #[schema(value_type = OwnerValue)]
    pub owner: Value,
    /// The key.
    pub key: String,
    /// The amount; default 1.
    #[serde(
        default = "crate::domain::writes::one",
        deserialize_with = "crate::domain::writes::int64"
    )]
    pub delta: i64,
    /// When it happened.
    pub at: Option<DateTime<Utc>>,
}

/// The answer to an add.
#[derive(Debug, Serialize, ToSchema)]
pub struct AddReply {
    /// True: the add is committed (a replay answers what the first did).
    pub applied: bool,
}

/// The answer to an add-and-get.
#[derive(Debug, Serialize, ToSchema)]
pub struct AddAndGetReply {
    /// True: the add is committed.
    pub applied: bool,
    /// The counter's total right after the add.
    pub total: i64,
}

/// The answer to a batch add.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BatchAddReply {
    /// Items applied now.
    pub applied: u64,
    /// Items whose id was applied before (skipped).
    pub duplicates: u64,
}

/// Checks `items` and applies them through the namespace's add queue as
/// `source`'s write: the HTTP handlers' path, and the in-process one
/// ([`crate::Local`]).
pub(crate) async fn apply(
    namespace: &Namespace,
    source: String,
    key: Option<String>,
    request_id: Option<String>,
    arrival: Arrival,
    op: Op,
    items: Vec<BatchItem>,
) -> Result<Outcome, Problem> {
    dispatch!(&namespace.table, h => {
        let adds = h.adds.as_ref().ok_or_else(|| Problem::internal("the add queue is not started"))?;
        let admitted = adds.admit(items.len(), arrival)?;
        let mut write = check(namespace, op, key, items)?;
        write.request_id = request_id;
        write.source = source;
        adds.submit(write, admitted).await
    })
}

fn check<I: ServiceOwner>(
    namespace: &Namespace,
    op: Op,
    key: Option<String>,
    raw: Vec<BatchItem>,
) -> Result<Write<I>, Problem> {
    let mut items = Vec::with_capacity(raw.len());
    let mut canonical_items = Vec::with_capacity(if key.is_some() { raw.len() } else { 0 });
    for (i, item) in raw.into_iter().enumerate() {
        let at_item = |p: Problem| {
            if op == Op::Batch {
                p.with("item", i)
            } else {
                p
            }
        };
        let owner = I::from_json(&item.owner).map_err(at_item)?;
        let counter_key = namespace
            .counted_key(&item.key)
            .map_err(at_item)?
            .to_owned();
        if let Some(id) = &item.id {
            idempotency::check_id(id).map_err(at_item)?;
            if key.as_deref() == Some(id.as_str()) {
                return Err(at_item(Problem::bad_request(
                    "an item id cannot be the request's Idempotency-Key",
                )));
            }
        }
        // What a retry is compared against: only a request with a key or
        // an item with an id is ever compared, so a plain add (the hot
        // path) builds none of it.
        let mut canonical = String::new();
        if key.is_some() || item.id.is_some() {
            let form = json!({
                "owner": owner.render(),
                "key": counter_key,
                "delta": item.delta,
                "at": item.at.map(|t| t.to_rfc3339()),
            });
            if item.id.is_some() {
                canonical = form.to_string();
            }
            if key.is_some() {
                canonical_items.push(json!({"id": item.id, "item": form}));
            }
        }
        items.push(Item {
            id: item.id,
            owner,
            key: counter_key,
            delta: item.delta,
            at: item.at,
            canonical,
        });
    }
    // One id twice in a request: the same item is applied once, two
    // different ones are a mistake.
    let mut by_id = std::collections::HashMap::new();
    for (i, item) in items.iter().enumerate() {
        if let Some(id) = &item.id
            && let Some(first) = by_id.insert(id.as_str(), &item.canonical)
            && *first != item.canonical
        {
            return Err(Problem::idempotency_conflict(id).with("item", i));
        }
    }
    let canonical = match key {
        Some(_) => json!({"op": op.name(), "items": canonical_items}).to_string(),
        None => String::new(),
    };
    Ok(Write {
        request_id: None,
        op,
        source: String::new(),
        key,
        canonical,
        items,
    })
}
