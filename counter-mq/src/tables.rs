//! The counter tables a consumer applies messages to, and how a change of
//! each is checked and folded: owners decoded into the table's owner type,
//! keys checked against its key space.

use std::{collections::HashMap, fmt, marker::PhantomData, sync::Arc};

use counter_core::{CounterError, Counters, DeltaBatch, KeySpace, OwnerId, Untyped};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Value};
use serde::de::DeserializeOwned;

use crate::{
    error::{MqError, Rejection},
    message::{Change, CounterMessage, Observation},
};

/// The counter tables a consumer accepts messages for, by table name: a
/// message naming any other table is rejected.
///
/// ```
/// use counter_core::{CounterTable, Counters};
/// use counter_mq::Tables;
///
/// let posts = Counters::<i64>::new(CounterTable::new("post_counters")?);
/// let tables = Tables::new().with(&posts);
/// assert!(tables.contains("post_counters"));
/// # Ok::<(), counter_core::CounterError>(())
/// ```
#[derive(Clone, Default)]
pub struct Tables {
    by_name: HashMap<String, Arc<dyn Target>>,
}

impl fmt::Debug for Tables {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.by_name.keys()).finish()
    }
}

impl Tables {
    /// No table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Accepts messages for `counters`' table, with its owner type, its keys
    /// (an entity's handle takes only the entity's keys) and its windows. A
    /// second handle of the same table name replaces the first.
    pub fn with<I, S>(mut self, counters: &Counters<I, S>) -> Self
    where
        I: OwnerId + DeserializeOwned,
        S: KeySpace,
    {
        self.by_name.insert(
            counters.table().name().to_owned(),
            Arc::new(Registered::<I, S> {
                counters: counters.untyped(),
                keys: PhantomData,
            }),
        );
        self
    }

    /// Whether messages for `table` are accepted.
    pub fn contains(&self, table: &str) -> bool {
        self.by_name.contains_key(table)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Checks that every registered table (and its bucket table) exists, so
    /// a consumer missing a migration fails at start, by name, instead of
    /// retrying every batch.
    pub(crate) async fn probe(&self, db: &DatabaseConnection) -> Result<(), MqError> {
        let backend = db.get_database_backend();
        for target in self.by_name.values() {
            for table in target.tables() {
                let quoted = match backend {
                    DbBackend::MySql => format!("`{table}`"),
                    _ => format!("\"{table}\""),
                };
                let probe = format!("SELECT 1 FROM {quoted} WHERE 1 = 0");
                if let Err(source) = db.execute_unprepared(&probe).await {
                    return Err(MqError::SchemaMissing {
                        table: table.to_string(),
                        hint: "run its migration",
                        source: Box::new(source),
                    });
                }
            }
        }
        Ok(())
    }

    /// `message` checked against its table: a message that passes folds
    /// into any batch without error of its own making.
    pub(crate) fn check(&self, message: CounterMessage) -> Result<Checked, Rejection> {
        let target = self
            .by_name
            .get(message.table())
            .ok_or_else(|| Rejection::UnknownTable(preview_str(message.table())))?
            .clone();
        let mut scratch = DeltaBatch::new();
        for change in message.changes() {
            target.fold(&mut scratch, change)?;
        }
        for observation in message.observations() {
            target.observe(&mut scratch, observation)?;
        }
        Ok(Checked { message, target })
    }
}

/// A message that passed [`Tables::check`].
#[derive(Clone)]
pub(crate) struct Checked {
    pub message: CounterMessage,
    target: Arc<dyn Target>,
}

impl Checked {
    /// Folds the message's changes into `batch`; an error only if a sum
    /// with other messages leaves `i64`.
    pub fn fold_into(&self, batch: &mut DeltaBatch) -> Result<(), Rejection> {
        for change in self.message.changes() {
            self.target.fold(batch, change)?;
        }
        for observation in self.message.observations() {
            self.target.observe(batch, observation)?;
        }
        Ok(())
    }

    /// The owners the message changes, as bound in SQL: what a cache in
    /// front of the table is told to forget.
    pub fn owners(&self) -> Vec<Value> {
        let changes = self.message.changes().iter().map(|c| &c.owner);
        let observations = self.message.observations().iter().map(|o| &o.owner);
        changes
            .chain(observations)
            .filter_map(|owner| self.target.owner_value(owner))
            .collect()
    }
}

/// One registered table, type-erased.
trait Target: Send + Sync {
    /// The table and, for windowed keys, its bucket table.
    fn tables(&self) -> Vec<String>;
    fn fold(&self, batch: &mut DeltaBatch, change: &Change) -> Result<(), Rejection>;
    fn observe(&self, batch: &mut DeltaBatch, observation: &Observation) -> Result<(), Rejection>;
    fn owner_value(&self, owner: &serde_json::Value) -> Option<Value>;
}

struct Registered<I: OwnerId, S> {
    /// The same table, taking string keys (checked against `S` first).
    counters: Counters<I, Untyped>,
    keys: PhantomData<fn() -> S>,
}

impl<I: OwnerId, S> Registered<I, S>
where
    I: DeserializeOwned,
{
    fn owner(&self, owner: &serde_json::Value) -> Result<I, Rejection> {
        I::deserialize(owner).map_err(|e| Rejection::BadOwner {
            owner: preview(owner),
            reason: e.to_string(),
        })
    }
}

impl<I, S> Target for Registered<I, S>
where
    I: OwnerId + DeserializeOwned,
    S: KeySpace,
{
    fn tables(&self) -> Vec<String> {
        let table = self.counters.table();
        std::iter::once(table.name().to_owned())
            .chain(table.bucket_table())
            .chain(table.sketch_table())
            .collect()
    }

    fn fold(&self, batch: &mut DeltaBatch, change: &Change) -> Result<(), Rejection> {
        if !S::accepts(&change.key) {
            return Err(Rejection::BadKey {
                key: preview_str(&change.key),
                reason: format!("not a key of `{}`", self.counters.table().name()),
            });
        }
        let owner = self.owner(&change.owner)?;
        let key = change.key.as_str();
        let folded = match change.at {
            Some(at) => batch.add_at(&self.counters, owner, key, change.delta, at),
            None => batch.add(&self.counters, owner, key, change.delta),
        };
        folded
            .map(drop)
            .map_err(|e| rejection(e, &change.key, &change.owner))
    }

    fn observe(&self, batch: &mut DeltaBatch, observation: &Observation) -> Result<(), Rejection> {
        if !S::accepts_unique(&observation.key) {
            return Err(Rejection::BadKey {
                key: preview_str(&observation.key),
                reason: format!("not a unique key of `{}`", self.counters.table().name()),
            });
        }
        let owner = self.owner(&observation.owner)?;
        let (key, member) = (observation.key.as_str(), observation.member.as_str());
        let observed = match observation.at {
            Some(at) => batch.observe_at(&self.counters, owner, key, member, at),
            None => batch.observe(&self.counters, owner, key, member),
        };
        observed
            .map(drop)
            .map_err(|e| rejection(e, &observation.key, &observation.owner))
    }

    fn owner_value(&self, owner: &serde_json::Value) -> Option<Value> {
        self.owner(owner).ok().map(Into::into)
    }
}

/// A change or observation the batch refused, as the consumer reports it.
fn rejection(e: CounterError, key: &str, owner: &serde_json::Value) -> Rejection {
    match e {
        CounterError::Overflow { .. } => Rejection::Overflow(e.to_string()),
        CounterError::InvalidKey { .. }
        | CounterError::NotWindowed { .. }
        | CounterError::WrongKeyKind { .. } => Rejection::BadKey {
            key: preview_str(key),
            reason: e.to_string(),
        },
        other => Rejection::BadOwner {
            owner: preview(owner),
            reason: other.to_string(),
        },
    }
}

/// At most 80 characters of a hostile value, for errors and logs.
fn preview(owner: &serde_json::Value) -> String {
    preview_str(&owner.to_string())
}

fn preview_str(text: &str) -> String {
    let mut short: String = text.chars().take(80).collect();
    if short.len() < text.len() {
        short.push('…');
    }
    short
}
