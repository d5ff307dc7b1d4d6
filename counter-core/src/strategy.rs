//! Where the next write goes: the slot a writer upserts.

use std::{
    hash::{BuildHasher, Hash},
    sync::{
        LazyLock,
        atomic::{AtomicU32, Ordering},
    },
};

use crate::slots::Slots;

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
        let n = u32::from(slots.get());
        let slot = match self {
            SlotStrategy::Rotating => ROTORS.next(&counter) % n,
            SlotStrategy::Random => rand::random_range(0..n),
        };
        // `Slots::MAX` (1024) fits in an i16, so the cast cannot truncate.
        slot as i16
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
