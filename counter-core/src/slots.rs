//! How many rows one counter is spread over.

use crate::error::{CounterError, Result};

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
}
