//! The deltas waiting for a flush: sharded maps that an `add` folds into
//! under a short lock. Once a counter is pending, adding to it allocates
//! nothing: the map is searched with borrowed parts of the key.

use std::{
    hash::{BuildHasher, Hash, Hasher},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError, RwLock,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
};

use hashbrown::{DefaultHashBuilder, Equivalent, HashMap};

use crate::{CounterTable, owner::OwnerColumn, owner::SortOwner};

/// One counter: table, owner and key.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct CounterId {
    pub table: Arc<str>,
    pub owner: SortOwner,
    pub key: Box<str>,
}

/// A [`CounterId`] made of borrowed parts, to look one up without building it.
#[derive(Debug, Clone, Copy)]
pub(super) struct CounterRef<'a> {
    pub table: &'a str,
    pub owner: &'a SortOwner,
    pub key: &'a str,
}

impl Hash for CounterId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_ref().hash(state);
    }
}

impl Hash for CounterRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.table.hash(state);
        self.owner.hash(state);
        self.key.hash(state);
    }
}

impl CounterId {
    fn as_ref(&self) -> CounterRef<'_> {
        CounterRef {
            table: &self.table,
            owner: &self.owner,
            key: &self.key,
        }
    }
}

impl Equivalent<CounterId> for CounterRef<'_> {
    fn equivalent(&self, id: &CounterId) -> bool {
        self.table == &*id.table && self.owner == &id.owner && self.key == &*id.key
    }
}

/// What one counter is owed: its total and, for a windowed key, the share
/// of each time bucket (almost always one).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Delta {
    pub total: i64,
    pub buckets: Vec<(i64, i64)>,
}

impl Delta {
    /// Adds `delta` (to `bucket` too, if given); `None`, and no change, if a
    /// sum would leave `i64`.
    fn add(&mut self, delta: i64, bucket: Option<i64>) -> Option<()> {
        let total = self.total.checked_add(delta)?;
        if let Some(bucket) = bucket {
            match self.buckets.iter_mut().rev().find(|(b, _)| *b == bucket) {
                Some((_, d)) => *d = d.checked_add(delta)?,
                None => self.buckets.push((bucket, delta)),
            }
        }
        self.total = total;
        Some(())
    }
}

pub(super) type Map = HashMap<CounterId, Delta, DefaultHashBuilder>;

#[derive(Default)]
struct Shard {
    map: Map,
    /// The map of an earlier flush, cleared with its capacity kept: the next
    /// drain swaps it in instead of growing a new one.
    spare: Option<Map>,
    /// `add` calls folded in since the last drain.
    adds: u64,
    /// `add` calls taken since the start, never drained: counted under the
    /// lock the add holds anyway, so a caller whose add returned is in it
    /// whatever a flush is doing (a sum of the drained and the waiting
    /// would miss a drain caught half done).
    accepted: u64,
}

/// Why an `add` was not taken.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// The counter is new and `capacity` counters are pending already.
    Full,
    /// The counter's sum would leave `i64`.
    Overflow,
    /// The buffer is shutting down.
    Closed,
    /// The table is registered with another owner column or another
    /// window for the key.
    Mismatch,
}

/// What an accepted `add` left behind.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Added {
    /// Distinct counters pending after it.
    pub counters: usize,
    /// Whether it brought a new counter in.
    pub new: bool,
}

/// Everything one drain took: each shard's map, in shard order (a lookup
/// finds its shard the same way as in [`Pending`]), and the adds in them.
#[derive(Debug, Default)]
pub(super) struct Drained {
    pub maps: Vec<Map>,
    pub adds: u64,
}

impl Drained {
    pub fn counters(&self) -> usize {
        self.maps.iter().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.maps.iter().all(HashMap::is_empty)
    }

    /// Every pending counter with its delta.
    pub fn iter(&self) -> impl Iterator<Item = (&CounterId, &Delta)> {
        self.maps.iter().flat_map(|map| map.iter())
    }
}

/// A table the buffer has seen: its configuration (slots, windows) and the
/// type of its owner column, shared by every pending counter of it.
#[derive(Debug, Clone)]
pub(super) struct KnownTable {
    pub name: Arc<str>,
    pub table: CounterTable,
    pub column: OwnerColumn,
}

pub(super) struct Pending {
    shards: Box<[Mutex<Shard>]>,
    hasher: DefaultHashBuilder,
    /// Distinct counters in all shards; reserved before an insert, so it
    /// never passes `capacity`.
    counters: AtomicUsize,
    capacity: usize,
    tables: RwLock<Vec<KnownTable>>,
}

impl Pending {
    pub fn new(shards: usize, capacity: usize) -> Self {
        Self {
            shards: (0..shards.max(1)).map(|_| Mutex::default()).collect(),
            hasher: DefaultHashBuilder::default(),
            counters: AtomicUsize::new(0),
            capacity,
            tables: RwLock::default(),
        }
    }

    fn shard_of(&self, id: CounterRef<'_>) -> usize {
        (self.hasher.hash_one(id) % self.shards.len() as u64) as usize
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        // A panic while holding the lock cannot leave a map half updated
        // (every update is a single assignment), so the data stays usable.
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Folds `delta` into the counter `id` (and its `bucket`), inserting the
    /// counter if there is room, unless `closed` is set. `closed` is read
    /// under the shard's lock, so once a drain that started after it was
    /// set has passed a shard, nothing enters that shard again.
    pub fn add(
        &self,
        table: &CounterTable,
        column: OwnerColumn,
        id: CounterRef<'_>,
        delta: i64,
        bucket: Option<i64>,
        closed: &AtomicBool,
    ) -> Result<Added, Refused> {
        let mut shard = self.lock(self.shard_of(id));
        if closed.load(Ordering::SeqCst) {
            return Err(Refused::Closed);
        }
        if let Some(pending) = shard.map.get_mut(&id) {
            pending.add(delta, bucket).ok_or(Refused::Overflow)?;
            shard.adds += 1;
            shard.accepted += 1;
            return Ok(Added {
                counters: self.counters.load(Ordering::Relaxed),
                new: false,
            });
        }
        let known = self.known(table, column);
        if known.column != column
            || known.table.window_for(id.key).is_some() != bucket.is_some()
            || known.table.region() != table.region()
        {
            return Err(Refused::Mismatch);
        }
        let mut pending = Delta::default();
        pending.add(delta, bucket).ok_or(Refused::Overflow)?;
        let reserved = self
            .counters
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.capacity).then_some(n + 1)
            })
            .map_err(|_| Refused::Full)?;
        shard.map.insert(
            CounterId {
                table: known.name,
                owner: id.owner.clone(),
                key: id.key.into(),
            },
            pending,
        );
        shard.adds += 1;
        shard.accepted += 1;
        Ok(Added {
            counters: reserved + 1,
            new: true,
        })
    }

    /// The table registered under `table`'s name, registering it first.
    /// The first configuration seen for a name is kept, as in a
    /// [`DeltaBatch`](crate::DeltaBatch).
    fn known(&self, table: &CounterTable, column: OwnerColumn) -> KnownTable {
        let find =
            |tables: &[KnownTable]| tables.iter().find(|t| &*t.name == table.name()).cloned();
        if let Some(known) = find(&self.tables.read().unwrap_or_else(PoisonError::into_inner)) {
            return known;
        }
        let mut tables = self.tables.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(known) = find(&tables) {
            return known;
        }
        let known = KnownTable {
            name: table.name().into(),
            table: table.clone(),
            column,
        };
        tables.push(known.clone());
        known
    }

    /// Every registered table (a handful: one per counter table name).
    pub fn tables(&self) -> Vec<KnownTable> {
        self.tables
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The delta pending for `id`, or 0.
    pub fn get(&self, id: CounterRef<'_>) -> i64 {
        self.lock(self.shard_of(id))
            .map
            .get(&id)
            .map_or(0, |p| p.total)
    }

    /// The delta for `id` in maps an earlier [`Pending::drain`] took.
    pub fn get_in(&self, drained: &Drained, id: CounterRef<'_>) -> i64 {
        drained
            .maps
            .get(self.shard_of(id))
            .and_then(|map| map.get(&id))
            .map_or(0, |p| p.total)
    }

    /// Distinct counters pending.
    pub fn counters(&self) -> usize {
        self.counters.load(Ordering::Acquire)
    }

    /// Whether a new counter would find no room.
    pub fn is_full(&self) -> bool {
        self.counters() >= self.capacity
    }

    /// `add` calls taken since the start, and those waiting in the shards
    /// (one pass over the shards).
    pub fn accepted_and_waiting(&self) -> (u64, u64) {
        (0..self.shards.len()).fold((0, 0), |(accepted, waiting), s| {
            let shard = self.lock(s);
            (accepted + shard.accepted, waiting + shard.adds)
        })
    }

    /// Takes everything pending, leaving empty maps (with the capacity of an
    /// earlier flush's, where [`Pending::recycle`] gave one back).
    pub fn drain(&self) -> Drained {
        let mut drained = Drained::default();
        for s in 0..self.shards.len() {
            let mut shard = self.lock(s);
            let empty = shard.spare.take().unwrap_or_default();
            let map = std::mem::replace(&mut shard.map, empty);
            self.counters.fetch_sub(map.len(), Ordering::AcqRel);
            drained.adds += std::mem::take(&mut shard.adds);
            drained.maps.push(map);
        }
        drained
    }

    /// Gives a flushed drain's maps back, emptied, for the next drain.
    pub fn recycle(&self, drained: Drained) {
        for (s, mut map) in drained.maps.into_iter().enumerate() {
            map.clear();
            let mut shard = self.lock(s);
            if shard.spare.is_none() {
                shard.spare = Some(map);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> CounterTable {
        CounterTable::new("t").expect("a valid name")
    }

    fn open() -> AtomicBool {
        AtomicBool::new(false)
    }

    fn id<'a>(owner: &'a SortOwner, key: &'a str) -> CounterRef<'a> {
        CounterRef {
            table: "t",
            owner,
            key,
        }
    }

    #[test]
    fn adds_fold_per_counter_and_drain_takes_all() {
        let pending = Pending::new(4, 10);
        let (one, two) = (SortOwner::Int(1), SortOwner::Int(2));
        for _ in 0..3 {
            pending
                .add(
                    &table(),
                    OwnerColumn::BigInteger,
                    id(&one, "likes"),
                    2,
                    None,
                    &open(),
                )
                .expect("room");
        }
        pending
            .add(
                &table(),
                OwnerColumn::BigInteger,
                id(&two, "likes"),
                -1,
                None,
                &open(),
            )
            .expect("room");
        assert_eq!(pending.get(id(&one, "likes")), 6);
        assert_eq!(
            (pending.counters(), pending.accepted_and_waiting()),
            (2, (4, 4))
        );
        let drained = pending.drain();
        assert_eq!((drained.counters(), drained.adds), (2, 4));
        // Taken adds stay counted while their drain is neither waiting nor
        // yet in flight (what `BufferStats::adds` reads).
        assert_eq!(pending.accepted_and_waiting(), (4, 0));
        assert_eq!(pending.get_in(&drained, id(&two, "likes")), -1);
        assert_eq!((pending.counters(), pending.get(id(&one, "likes"))), (0, 0));
        pending.recycle(drained);
        assert!(pending.drain().is_empty());
    }

    #[test]
    fn a_full_buffer_still_takes_pending_counters() {
        let pending = Pending::new(2, 1);
        let (one, two) = (SortOwner::Int(1), SortOwner::Int(2));
        let add = |owner, delta| {
            pending.add(
                &table(),
                OwnerColumn::BigInteger,
                id(owner, "k"),
                delta,
                None,
                &open(),
            )
        };
        assert_eq!(
            add(&one, 1),
            Ok(Added {
                counters: 1,
                new: true
            })
        );
        assert_eq!(add(&two, 1), Err(Refused::Full));
        assert_eq!(add(&one, i64::MAX), Err(Refused::Overflow));
        assert_eq!(
            add(&one, 1),
            Ok(Added {
                counters: 1,
                new: false
            })
        );
        assert_eq!(pending.get(id(&one, "k")), 2);
        let closed = AtomicBool::new(true);
        let add = pending.add(
            &table(),
            OwnerColumn::BigInteger,
            id(&one, "k"),
            1,
            None,
            &closed,
        );
        assert_eq!(add, Err(Refused::Closed));
    }

    #[test]
    fn buckets_are_kept_apart() {
        let mut delta = Delta::default();
        for (d, bucket) in [(1, 0), (2, 3600), (3, 0)] {
            delta.add(d, Some(bucket)).expect("no overflow");
        }
        assert_eq!(delta.total, 6);
        assert_eq!(delta.buckets, vec![(0, 4), (3600, 2)]);
    }
}

#[cfg(test)]
mod mismatch_tests {
    use super::*;

    #[test]
    fn one_configuration_per_table_name() {
        let pending = Pending::new(2, 10);
        let open = AtomicBool::new(false);
        let table = CounterTable::new("t").expect("a valid name");
        let one = SortOwner::Int(1);
        let id = |key| CounterRef {
            table: "t",
            owner: &one,
            key,
        };
        let add = |column, key, bucket| pending.add(&table, column, id(key), 1, bucket, &open);
        assert!(add(OwnerColumn::BigInteger, "a", None).is_ok());
        assert_eq!(add(OwnerColumn::Integer, "b", None), Err(Refused::Mismatch));
        assert_eq!(
            add(OwnerColumn::BigInteger, "b", Some(0)),
            Err(Refused::Mismatch)
        );
        assert!(add(OwnerColumn::BigInteger, "b", None).is_ok());
    }
}
