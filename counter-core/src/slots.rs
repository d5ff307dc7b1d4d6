//! How many rows one counter is spread over.

use std::ops::RangeInclusive;

use crate::{
    error::{CounterError, Result},
    heat,
};

/// A slot count in `1..=1024`.
///
/// More slots mean fewer writers queue on the same row lock, at the price of
/// more rows to sum on read (until compaction folds them). 16 suits most hot
/// counters; a key written by hundreds of concurrent clients may want 64.
///
/// ```
/// use counter_core::Slots;
///
/// assert_eq!(Slots::new(16).unwrap().get(), 16);
/// assert!(Slots::new(0).is_err());
/// assert!(Slots::new(1025).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slots(u16);

impl Slots {
    /// The largest slot count (the `slot` column is a `SMALLINT`).
    pub const MAX: u16 = 1024;
    /// The default: enough to spread a busy key, cheap to sum.
    pub const DEFAULT: Slots = Slots(16);
    /// One row per counter: no spreading at all.
    pub const ONE: Slots = Slots(1);

    /// Validates a slot count.
    pub fn new(slots: impl TryInto<i64> + Copy) -> Result<Self> {
        let requested = slots.try_into().unwrap_or(i64::MAX);
        CounterError::check_range("slot count", requested, 1, Self::MAX)?;
        Ok(Slots(u16::try_from(requested).unwrap_or(Self::MAX)))
    }

    /// The slot count.
    pub fn get(self) -> u16 {
        self.0
    }
}

impl Default for Slots {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// How many slots a key's writes spread over: always the same number, or
/// as many as each counter's contention calls for.
///
/// A read sums the rows that exist, so the two are read alike, and a key
/// can switch from one to the other without a migration.
///
/// ```
/// use counter_core::{CounterTable, SlotPolicy, Slots};
///
/// let table = CounterTable::new("post_counters")?
///     .with_key_slot_policy("views", SlotPolicy::adaptive(1..=256)?)?;
/// assert_eq!(table.slot_policy_for("views"), SlotPolicy::adaptive(1..=256)?);
/// assert_eq!(table.slots_for("views").get(), 256); // the ceiling
/// assert_eq!(table.slot_policy_for("likes"), SlotPolicy::Fixed(Slots::DEFAULT));
/// # Ok::<(), counter_core::CounterError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SlotPolicy {
    /// Every counter of the key spreads its writes over this many slots:
    /// up to that many rows each, contended or not.
    Fixed(Slots),
    /// Each counter starts on `min` slots (one row, with `min` 1) and grows,
    /// doubling up to `max`, while its writes contend; it shrinks back
    /// when they stop. Contention is what this process sees: more writes of
    /// the counter in flight at once than it has rows (queued behind other
    /// processes' locks included), and writes the database refused and the
    /// crate retried (deadlocks, lock timeouts, failed certifications).
    /// Each process adapts on its own, nothing is stored or shared (the
    /// guide's "Hot keys at scale" tells how), and the rows a counter grew
    /// are folded back into one by [`Counters::compact`](crate::Counters::compact).
    /// Cold counters stay one row each, so a batch read of many of them
    /// sums one row per counter.
    ///
    /// Build it with [`SlotPolicy::adaptive`].
    Adaptive {
        /// The slots a cold counter uses.
        min: Slots,
        /// The most slots a hot counter uses.
        max: Slots,
    },
}

impl SlotPolicy {
    /// Adaptive slots in `range`, e.g. `1..=256` (see
    /// [`SlotPolicy::Adaptive`]). Both ends are slot counts; the start may
    /// not exceed the end.
    pub fn adaptive(range: RangeInclusive<u16>) -> Result<Self> {
        let max = Slots::new(*range.end())?;
        CounterError::check_range("adaptive slot minimum", *range.start(), 1, max.get())?;
        let min = Slots::new(*range.start())?;
        Ok(Self::Adaptive { min, max })
    }

    /// The most slots a counter of this policy uses.
    pub fn ceiling(self) -> Slots {
        match self {
            Self::Fixed(slots) => slots,
            Self::Adaptive { max, .. } => max,
        }
    }

    /// The adaptive range, if adaptive.
    pub(crate) fn heat_range(self) -> Option<heat::Range> {
        match self {
            Self::Fixed(_) => None,
            Self::Adaptive { min, max } => Some(heat::Range {
                min: min.get(),
                max: max.get(),
            }),
        }
    }
}

impl From<Slots> for SlotPolicy {
    fn from(slots: Slots) -> Self {
        Self::Fixed(slots)
    }
}

impl Default for SlotPolicy {
    fn default() -> Self {
        Self::Fixed(Slots::DEFAULT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_is_checked_for_any_integer() {
        assert!(Slots::new(1u8).is_ok());
        assert!(Slots::new(1024i64).is_ok());
        assert!(Slots::new(-1i32).is_err());
        assert!(Slots::new(u64::MAX).is_err());
    }

    #[test]
    fn adaptive_ranges_are_checked() {
        assert!(SlotPolicy::adaptive(1..=1024).is_ok());
        assert!(SlotPolicy::adaptive(4..=4).is_ok());
        assert!(SlotPolicy::adaptive(0..=16).is_err());
        assert!(SlotPolicy::adaptive(1..=1025).is_err());
        let (min, max) = (9, 8);
        assert!(matches!(
            SlotPolicy::adaptive(min..=max),
            Err(CounterError::OutOfRange {
                value: 9,
                max: 8,
                ..
            })
        ));
        assert_eq!(SlotPolicy::adaptive(1..=64).unwrap().ceiling().get(), 64);
    }
}
