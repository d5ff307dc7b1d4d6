//! Where the next write goes: the slot a writer upserts.

use std::{
    hash::{BuildHasher, Hash},
    sync::{
        LazyLock,
        atomic::{AtomicU32, Ordering},
    },
};

use crate::{
    error::{CounterError, Result},
    region::Region,
    slots::Slots,
};

/// How a write picks one of a counter's slots.
///
/// Any slot is correct (a read sums them all), so the choice only decides
/// how often two concurrent writers of one counter queue on the same row
/// lock. Measured with `counter-bench` (business workload, 64 clients,
/// 64 slots; see the README's "Performance"), [`Rotating`](Self::Rotating)
/// comes much closer to the no-contention ceiling than
/// [`Random`](Self::Random), and is the default.
///
/// ```
/// use counter_core::{CounterTable, SlotStrategy};
///
/// let table = CounterTable::new("post_counters")?.with_slot_strategy(SlotStrategy::Random);
/// assert_eq!(table.slot_strategy(), SlotStrategy::Random);
/// assert_eq!(CounterTable::new("t")?.slot_strategy(), SlotStrategy::Rotating);
/// # Ok::<(), counter_core::CounterError>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SlotStrategy {
    /// Each counter has a per-process rotor: successive writes of one
    /// counter take successive slots, starting at a random slot.
    ///
    /// With `n` slots, the `n` writes in flight at a time from one process
    /// all hold different rows, so a writer usually finds its row free: the
    /// one that last used it started `n` writes earlier and has most likely
    /// committed. Uniform random picks cannot promise that: 64 writers on
    /// 64 slots use only about 41 rows, so over a third of them queue behind
    /// another (the birthday problem). Several processes each rotate from their own
    /// random start, so between processes the spread is as good as random,
    /// never worse. Counters are mapped onto a fixed set of rotors by hash,
    /// so memory stays constant whatever the number of counters.
    #[default]
    Rotating,
    /// A slot chosen uniformly at random for every write.
    Random,
}

impl SlotStrategy {
    /// The slot for the next write of `counter` (anything identifying the
    /// counter, such as `(table, owner, key)`), among `slots`.
    ///
    /// [`CounterTable::next_slot`](crate::CounterTable::next_slot) calls
    /// this with the table's strategy and `(table, owner, key)`; prefer it
    /// when writing a table's slots by hand.
    ///
    /// ```
    /// use counter_core::{SlotStrategy, Slots};
    ///
    /// let slots = Slots::new(4)?;
    /// let picks: Vec<i16> = (0..8).map(|_| SlotStrategy::Rotating.pick(slots, ("t", 1, "likes"))).collect();
    /// // Two full turns: every slot twice.
    /// let mut sorted = picks.clone();
    /// sorted.sort();
    /// assert_eq!(sorted, [0, 0, 1, 1, 2, 2, 3, 3]);
    /// # Ok::<(), counter_core::CounterError>(())
    /// ```
    pub fn pick(self, slots: Slots, counter: impl Hash) -> i16 {
        self.pick_among(slots.get(), None, None, &counter)
    }

    /// The slot for the next write of `counter` among the first `width`
    /// slots: within `region`'s slots if there is a region (always one of
    /// its own, however narrow the counter), and within `writer`'s share of
    /// those if there is a writer.
    pub(crate) fn pick_among(
        self,
        width: u16,
        region: Option<&Region>,
        writer: Option<Writer>,
        counter: &impl Hash,
    ) -> i16 {
        let width = u32::from(width.max(1));
        // The region's slots, numbered 0.. within it: slot `base + stride * n`.
        let (base, stride, owned) = match region {
            Some(region) => region.share(width),
            None => (0, 1, width),
        };
        let (first, step, choices) = match writer {
            Some(w) => w.share(owned),
            None => (0, 1, owned),
        };
        let turn = match self {
            SlotStrategy::Rotating => ROTORS.next(counter) % choices,
            SlotStrategy::Random => rand::random_range(0..choices),
        };
        // Below `max(width, region count)`, both at most `Slots::MAX`
        // (1024): fits in an i16.
        (base + stride * (first + step * turn)) as i16
    }
}

/// One of several writers (processes, or a cluster's nodes) that write
/// the same counters: each takes its own share of a counter's slots, so
/// two writers never wait for each other's rows.
///
/// Within one process the [`SlotStrategy`] keeps concurrent writes apart;
/// across processes the only spread is their random starting points, and
/// on a multi-primary cluster (Galera) a collision is worse than a wait:
/// two nodes that write one row at once both run their transaction to
/// the end and one of them fails certification and is retried. With
/// `Writer::new(i, n)` writer `i` of `n` writes only the slots `s` with
/// `s % n == i`, so `n` writers of a counter with at least `n` slots never
/// share a row; a counter narrower than `n` slots (a cold adaptive counter
/// on one row) is shared, as it must be.
///
/// Give each process (or each node's pool) its own index, e.g. from a
/// StatefulSet ordinal or the node it writes to, and one count for all:
/// process-wide with [`Writer::install`], or per table with
/// [`CounterTable::with_writer`](crate::CounterTable::with_writer). Reads
/// are unaffected, and a writer with a wrong index only costs speed.
///
/// ```
/// use counter_core::{CounterTable, Writer};
///
/// let table = CounterTable::new("post_counters")?.with_slots(8)?.with_writer(Writer::new(1, 4)?);
/// let mut slots: Vec<i16> = (0..4).map(|_| table.next_slot(&7_i64, "likes")).collect();
/// slots.sort();
/// assert_eq!(slots, [1, 1, 5, 5]); // writer 1 of 4: slots 1 and 5 of 8
/// # Ok::<(), counter_core::CounterError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Writer {
    index: u16,
    count: u16,
}

/// The process's writer, packed as `index << 16 | count` (0: none).
static PROCESS_WRITER: AtomicU32 = AtomicU32::new(0);

impl Writer {
    /// Writer `index` of `count` (`index < count <= 1024`).
    pub fn new(index: u16, count: u16) -> Result<Self> {
        CounterError::check_range("writer count", count, 1, Slots::MAX)?;
        CounterError::check_range("writer index", index, 0, count - 1)?;
        Ok(Self { index, count })
    }

    /// This writer's index.
    pub fn index(self) -> u16 {
        self.index
    }

    /// The number of writers.
    pub fn count(self) -> u16 {
        self.count
    }

    /// Makes this the writer of every table of the process that names none
    /// of its own; call it once at start-up.
    pub fn install(self) {
        let packed = u32::from(self.index) << 16 | u32::from(self.count);
        PROCESS_WRITER.store(packed, Ordering::Relaxed);
    }

    /// The writer [`Writer::install`]ed, if any.
    pub fn installed() -> Option<Self> {
        let packed = PROCESS_WRITER.load(Ordering::Relaxed);
        let (index, count) = ((packed >> 16) as u16, packed as u16);
        (count > 0).then_some(Self { index, count })
    }

    /// This writer's slots among the first `width`: `(first, step, how
    /// many)`. Narrower than the writers, every writer shares one slot.
    fn share(self, width: u32) -> (u32, u32, u32) {
        let (index, count) = (u32::from(self.index), u32::from(self.count));
        if index >= width {
            return (index % width, 1, 1);
        }
        (index, count, (width - index).div_ceil(count))
    }
}

/// The process's rotors, shared by every table.
static ROTORS: LazyLock<Rotors> = LazyLock::new(Rotors::new);

/// Rotors, one per hash bucket of counters. 4 KiB in all.
struct Rotors {
    hasher: std::collections::hash_map::RandomState,
    turns: Box<[AtomicU32]>,
}

impl Rotors {
    /// Enough buckets that two hot counters rarely share one. Sharing never
    /// breaks a count, but it interleaves turns: two equally busy counters
    /// alternating in one bucket each get every other turn, so with an even
    /// slot count each uses only half of its slots.
    const BUCKETS: usize = 1024;

    /// Rotors starting at random positions, so two processes writing the
    /// same counter do not start in lockstep.
    fn new() -> Self {
        Self {
            hasher: Default::default(),
            turns: (0..Self::BUCKETS)
                .map(|_| AtomicU32::new(rand::random()))
                .collect(),
        }
    }

    /// The counter's next turn. Wrapping at `u32::MAX` skips at most one
    /// slot once every four billion writes.
    fn next(&self, counter: &impl Hash) -> u32 {
        let bucket = self.hasher.hash_one(counter) as usize % Self::BUCKETS;
        self.turns[bucket].fetch_add(1, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotating_spreads_concurrent_writes_over_every_slot() {
        let rotors = Rotors::new();
        let slots = 64;
        let mut hits = [0u32; 64];
        for _ in 0..slots * 10 {
            hits[(rotors.next(&("t", 7_i64, "likes")) % slots) as usize] += 1;
        }
        // Any window of 64 successive writes of one counter uses 64 rows.
        assert!(hits.iter().all(|&h| h == 10), "{hits:?}");
    }

    #[test]
    fn writers_take_disjoint_shares_that_cover_the_slots() {
        for (count, width) in [(3u16, 64u16), (3, 3), (4, 10), (5, 2), (1, 16), (7, 1)] {
            let mut owner = vec![Vec::new(); usize::from(width)];
            for index in 0..count {
                let writer = Writer::new(index, count).unwrap();
                for _ in 0..width * 4 {
                    let slot =
                        SlotStrategy::Rotating.pick_among(width, None, Some(writer), &("t", index));
                    assert!((0..width as i16).contains(&slot), "{count} {width} {slot}");
                    if !owner[slot as usize].contains(&index) {
                        owner[slot as usize].push(index);
                    }
                }
            }
            // Every slot is used; shared only when there are fewer slots than writers.
            assert!(
                owner.iter().all(|w| !w.is_empty()),
                "{count} {width} {owner:?}"
            );
            if width >= count {
                assert!(
                    owner.iter().all(|w| w.len() == 1),
                    "{count} {width} {owner:?}"
                );
            }
        }
        assert!(Writer::new(3, 3).is_err());
        assert!(Writer::new(0, 0).is_err());
        assert!(Writer::new(0, 1025).is_err());
    }

    #[test]
    fn a_region_takes_only_its_slots_and_its_writers_share_them() {
        let region = Region::new("eu", 2, 3).unwrap();
        for width in [1u16, 2, 3, 8, 64] {
            let mut used = std::collections::BTreeMap::new();
            for writer in 0..2 {
                let share = Writer::new(writer, 2).unwrap();
                for turn in 0..width * 4 {
                    let slot = SlotStrategy::Rotating.pick_among(
                        width,
                        Some(&region),
                        Some(share),
                        &("r", writer, turn / width),
                    );
                    assert!(region.owns_slot(slot), "width {width}: slot {slot}");
                    assert!(slot < width.max(3) as i16, "width {width}: slot {slot}");
                    used.entry(slot).or_insert_with(Vec::new).push(writer);
                }
            }
            // Every slot of the region's in use; each writer's own where the
            // region has a slot per writer.
            let owned = (0..width.max(3) as i16)
                .filter(|s| region.owns_slot(*s))
                .count();
            assert_eq!(used.len(), owned, "width {width}: {used:?}");
            if owned >= 2 {
                for writers in used.values_mut() {
                    writers.dedup();
                    assert_eq!(writers.len(), 1, "width {width}: {used:?}");
                }
            }
        }
    }

    #[test]
    fn both_strategies_stay_in_range() {
        for strategy in [SlotStrategy::Rotating, SlotStrategy::Random] {
            for n in [1, 2, 16, 1024] {
                let slots = Slots::new(n).unwrap();
                let mut seen = vec![false; n as usize];
                for i in 0..n * 40 {
                    let slot = strategy.pick(slots, ("t", i % 3, "k"));
                    assert!((0..n as i16).contains(&slot));
                    seen[slot as usize] = true;
                }
                assert!(seen.iter().all(|s| *s), "{strategy:?} {n}");
            }
        }
    }
}
