//! The typed side of a handle: which keys a [`Counters`] takes, and what its
//! batch reads return.
//!
//! A handle is `Counters<I, S>`: `I` is the owner id, `S` the key space.
//! [`Untyped`] takes any [`CounterKey`] (strings chosen at run time); an
//! entity `E` with `#[derive(SlottedCounter)]` takes only its generated
//! `Key` enum and reads into its generated `Counts` record
//! ([`EntityCounters<E>`](crate::EntityCounters)). Every operation is
//! written once, on `Counters<I, S>`, and serves both.

use std::{collections::HashMap, fmt::Debug, hash::Hash};

use crate::{SlottedCounter, key::CounterKey};

/// A closed set of counter keys: the `Key` enum generated for an entity.
///
/// Knowing every key lets a read fetch all of an entity's counters at once
/// and return them as a [`CountSet`] with no missing field.
pub trait KeySet: CounterKey + Copy + Eq + Hash + Debug + Send + Sync + 'static {
    /// Every key, in declaration order.
    const ALL: &'static [Self];
}

/// One total per key of a [`KeySet`]: the `Counts` struct generated for an
/// entity, whose fields are named after the keys.
pub trait CountSet: Default + Clone + Debug + PartialEq + Send + Sync + 'static {
    /// The keys this record has a field for.
    type Key: KeySet;

    /// The total of `key`.
    fn get(&self, key: Self::Key) -> i64;

    /// Sets the total of `key`.
    fn set(&mut self, key: Self::Key, total: i64);
}

/// The key space of the dynamic API: any [`CounterKey`], read back by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Untyped;

/// Which keys a [`Counters`](crate::Counters) handle takes and what its batch
/// reads return: [`Untyped`], or an entity with `#[derive(SlottedCounter)]`.
/// Implemented for both; there is nothing to implement by hand.
pub trait KeySpace: Send + Sync + 'static {
    /// One owner's totals in a batch read: by key name for [`Untyped`], the
    /// generated `Counts` for an entity.
    type Totals: Default + Clone + Debug + PartialEq + Send + Sync + 'static;

    /// The totals of one owner from its totals by key name.
    #[doc(hidden)]
    fn totals(by_name: HashMap<String, i64>) -> Self::Totals;

    /// Sets the total of the key named `name`, if this key space has it
    /// (a cache decoding stored totals straight into `Totals`).
    #[doc(hidden)]
    fn set_total(totals: &mut Self::Totals, name: &str, total: i64);

    /// Makes every key of `names` present (0 where absent): a no-op where
    /// `Totals` has a field per key.
    #[doc(hidden)]
    fn zero_fill(totals: &mut Self::Totals, names: &[String]);

    /// Whether the key named `name` belongs to this key space: any key for
    /// [`Untyped`], one of the entity's keys otherwise (a consumer checking
    /// a key that arrived as a string in a message).
    #[doc(hidden)]
    fn accepts(name: &str) -> bool;

    /// Whether the unique key named `name` belongs to this key space (see
    /// [`KeySpace::accepts`]).
    #[doc(hidden)]
    fn accepts_unique(name: &str) -> bool;
}

impl KeySpace for Untyped {
    type Totals = HashMap<String, i64>;

    fn totals(by_name: HashMap<String, i64>) -> Self::Totals {
        by_name
    }

    fn set_total(totals: &mut Self::Totals, name: &str, total: i64) {
        totals.insert(name.to_owned(), total);
    }

    fn zero_fill(totals: &mut Self::Totals, names: &[String]) {
        if totals.len() < names.len() {
            for name in names {
                totals.entry(name.clone()).or_insert(0);
            }
        }
    }

    fn accepts(_: &str) -> bool {
        true
    }

    fn accepts_unique(_: &str) -> bool {
        true
    }
}

impl<E: SlottedCounter> KeySpace for E {
    type Totals = E::Counts;

    fn totals(by_name: HashMap<String, i64>) -> Self::Totals {
        let mut counts = E::Counts::default();
        for &key in E::Key::ALL {
            if let Some(&total) = by_name.get(key.as_key_str()) {
                counts.set(key, total);
            }
        }
        counts
    }

    fn set_total(totals: &mut Self::Totals, name: &str, total: i64) {
        if let Some(&key) = E::Key::ALL.iter().find(|k| k.as_key_str() == name) {
            totals.set(key, total);
        }
    }

    fn zero_fill(_: &mut Self::Totals, _: &[String]) {}

    fn accepts(name: &str) -> bool {
        E::Key::ALL.iter().any(|k| k.as_key_str() == name)
    }

    fn accepts_unique(name: &str) -> bool {
        E::UniqueKey::ALL.iter().any(|k| k.as_key_str() == name)
    }
}

/// A key a handle of key space `S` takes: every [`CounterKey`] for
/// [`Untyped`], only the generated `Key` enum for an entity, so a typed
/// handle never takes a string.
pub trait KeyOf<S>: CounterKey {}

impl<K: CounterKey + ?Sized> KeyOf<Untyped> for K {}

impl<E: SlottedCounter> KeyOf<E> for <E as SlottedCounter>::Key {}

/// A unique key a handle of key space `S` takes (see
/// [`CounterTable::with_unique_key`](crate::CounterTable::with_unique_key)):
/// every [`CounterKey`] for [`Untyped`] (a wrong kind is
/// [`CounterError::WrongKeyKind`](crate::CounterError::WrongKeyKind) at run
/// time), only the generated `UniqueKey` enum for an entity, so that
/// `observe(.., Key::Likes, ..)` and `add(.., UniqueKey::Viewers, ..)` do not
/// compile.
pub trait UniqueKeyOf<S>: CounterKey {}

impl<K: CounterKey + ?Sized> UniqueKeyOf<Untyped> for K {}

impl<E: SlottedCounter> UniqueKeyOf<E> for <E as SlottedCounter>::UniqueKey {}
