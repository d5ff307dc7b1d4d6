//! How hot each counter of this process is: the width of an adaptive key's
//! counters (see [`SlotPolicy::Adaptive`](crate::SlotPolicy::Adaptive)).
//!
//! A counter's width is how many of its slots this process's writes use.
//! It starts at the key's minimum and doubles, up to the maximum, when a
//! write sees contention that more rows would remove:
//! * more writes of the counter in flight in this process than its width
//!   (by Little's law, the rows a counter needs are its concurrent writers;
//!   writes queued on a row lock another process holds are in flight too);
//! * a write that had to be retried after a conflict (a deadlock, a lock
//!   timeout, a failed certification on a Galera node): certain contention.
//!
//! It halves again after [`COOL`] without either signal (or without half
//! its width in flight). Nothing is shared between processes and nothing
//! is stored: a read sums whatever rows exist, so each process's width is
//! only a hint about speed. Rows of a counter that cooled are folded back
//! into one by [`Counters::compact`](crate::Counters::compact).
//!
//! Statement latency is deliberately not a signal: on a busy machine a
//! lone writer's statements slow down in runs, and a rule that read that
//! as lock waits widened cold counters (it did, in this crate's tests).
//!
//! The map is a fixed array of entries indexed by the counter's hash, so its
//! memory is constant. An entry belongs to one counter (its fingerprint) and
//! is handed to another only once it is idle and back at its minimum; a
//! counter that finds its entry taken by a hotter one writes at its minimum
//! width. So a cold counter never inherits another's width, and a cold
//! counter is one row.

use std::{
    hash::{BuildHasher, Hash},
    sync::{LazyLock, Mutex},
    time::{Duration, Instant},
};

/// Entries in the map (about 160 KiB). More hot counters than this at once
/// share the overflow at their minimum width.
const ENTRIES: usize = 4096;
/// How long a counter stays at its width without a sign of contention.
pub(crate) const COOL: Duration = Duration::from_secs(30);

/// The process's map.
pub(crate) static HEAT: LazyLock<Heat> = LazyLock::new(Heat::new);

/// Per-counter widths of the adaptive keys of this process.
pub(crate) struct Heat {
    hasher: std::collections::hash_map::RandomState,
    entries: Box<[Mutex<Entry>]>,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The owning counter's hash; 0 for a free entry.
    fingerprint: u64,
    width: u16,
    in_flight: u16,
    /// The last sign of contention (or growth): cooling starts from here.
    warm_at: Option<Instant>,
}

const FREE: Entry = Entry {
    fingerprint: 0,
    width: 1,
    in_flight: 0,
    warm_at: None,
};

/// A key's adaptive range, `min..=max` slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Range {
    pub min: u16,
    pub max: u16,
}

/// One write in flight: the width it writes at. [`Flight::land`] ends it,
/// telling whether it had to be retried; dropping it (a call dropped
/// mid-flight) ends it without a signal.
#[must_use]
pub(crate) struct Flight<'h> {
    heat: &'h Heat,
    fingerprint: u64,
    range: Range,
    width: u16,
    /// Whether the write holds a place in its counter's entry.
    tracked: bool,
}

impl Heat {
    fn new() -> Self {
        Self {
            hasher: Default::default(),
            entries: (0..ENTRIES).map(|_| Mutex::new(FREE)).collect(),
        }
    }

    /// The fingerprint of `counter` (anything that identifies it, such as
    /// `(table, owner, key)`); never 0.
    pub(crate) fn fingerprint(&self, counter: impl Hash) -> u64 {
        self.hasher.hash_one(counter) | 1
    }

    /// The width a write of the counter uses now, when it is not followed
    /// (a batch's rows).
    pub(crate) fn width(&self, fingerprint: u64, range: Range) -> u16 {
        let now = Instant::now();
        let mut entry = self.entry(fingerprint);
        if entry.fingerprint != fingerprint {
            return range.min;
        }
        entry.cool(range, now);
        entry.width
    }

    /// Starts a write of the counter: counts it in flight and grows the
    /// counter if it has more writes in flight than rows.
    pub(crate) fn begin(&self, fingerprint: u64, range: Range) -> Flight<'_> {
        let now = Instant::now();
        let mut entry = self.entry(fingerprint);
        let tracked = entry.claim(fingerprint, range, now);
        let width = match tracked {
            true => {
                entry.in_flight = entry.in_flight.saturating_add(1);
                entry.cool(range, now);
                let in_flight = entry.in_flight;
                if in_flight > entry.width {
                    entry.grow(range, in_flight, now);
                } else if in_flight.saturating_mul(2) > entry.width {
                    entry.warm_at = Some(now);
                }
                entry.width
            }
            false => range.min,
        };
        Flight {
            heat: self,
            fingerprint,
            range,
            width,
            tracked,
        }
    }

    fn entry(&self, fingerprint: u64) -> std::sync::MutexGuard<'_, Entry> {
        let entry = &self.entries[fingerprint as usize % ENTRIES];
        // An entry holds plain numbers, consistent after any panic.
        entry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The end of a write; `conflicted` if it had to be retried.
    fn land(&self, flight: &Flight<'_>, conflicted: bool) {
        if !flight.tracked {
            return;
        }
        let mut entry = self.entry(flight.fingerprint);
        if entry.fingerprint != flight.fingerprint {
            return;
        }
        entry.in_flight = entry.in_flight.saturating_sub(1);
        if conflicted {
            let doubled = entry.width.saturating_mul(2);
            entry.grow(flight.range, doubled, Instant::now());
        }
    }
}

impl Entry {
    /// Makes the entry `fingerprint`'s if it is, or may be taken: free, or
    /// idle at its minimum. False if a busier counter holds it.
    fn claim(&mut self, fingerprint: u64, range: Range, now: Instant) -> bool {
        if self.fingerprint == fingerprint {
            return true;
        }
        let cooled = self.warm_at.is_none_or(|at| now.duration_since(at) >= COOL);
        if self.fingerprint != 0 && (self.in_flight > 0 || (self.width > 1 && !cooled)) {
            return false;
        }
        *self = Entry {
            fingerprint,
            width: range.min,
            ..FREE
        };
        true
    }

    /// Halves the width for every [`COOL`] since the last contention.
    fn cool(&mut self, range: Range, now: Instant) {
        self.width = self.width.clamp(range.min, range.max);
        while self.width > range.min
            && let Some(at) = self.warm_at
            && now.duration_since(at) >= COOL
        {
            self.width = (self.width / 2).max(range.min);
            self.warm_at = Some(at + COOL);
        }
    }

    /// Doubles the width until it reaches `needed`, within the range.
    fn grow(&mut self, range: Range, needed: u16, now: Instant) {
        while self.width < needed && self.width < range.max {
            self.width = self.width.saturating_mul(2).min(range.max);
        }
        self.warm_at = Some(now);
    }
}

impl Flight<'_> {
    /// How many slots the write may choose among.
    pub(crate) fn width(&self) -> u16 {
        self.width
    }

    /// Ends the write; `conflicted` if the database refused an attempt
    /// (a deadlock, a lock timeout, a failed certification) and it was
    /// retried.
    pub(crate) fn land(self, conflicted: bool) {
        self.heat.land(&self, conflicted);
        std::mem::forget(self);
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        self.heat.land(self, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WIDE: Range = Range { min: 1, max: 64 };

    #[test]
    fn a_lone_writer_stays_on_one_row() {
        let heat = Heat::new();
        let counter = heat.fingerprint(("t", 1, "views"));
        for _ in 0..1000 {
            let flight = heat.begin(counter, WIDE);
            assert_eq!(flight.width(), 1);
            flight.land(false);
        }
        assert_eq!(heat.width(counter, WIDE), 1);
    }

    #[test]
    fn concurrent_writes_grow_the_counter_to_their_number() {
        let heat = Heat::new();
        let counter = heat.fingerprint(("t", 1, "views"));
        let flights: Vec<_> = (0..20).map(|_| heat.begin(counter, WIDE)).collect();
        // Doubling from 1: 2, 4, 8, 16, 32 once 17 are in flight.
        assert_eq!(flights.last().map(Flight::width), Some(32));
        drop(flights);
        assert_eq!(heat.width(counter, WIDE), 32);
        // Never past the ceiling. A map of its own: the first counter, still
        // warm, would keep its entry from a second that shared it (one run in
        // 4,096, the hasher being seeded per process).
        let heat = Heat::new();
        let narrow = Range { min: 2, max: 8 };
        let other = heat.fingerprint(("t", 2, "views"));
        let flights: Vec<_> = (0..50).map(|_| heat.begin(other, narrow)).collect();
        assert_eq!(flights[0].width(), 2);
        assert_eq!(flights.last().map(Flight::width), Some(8));
    }

    #[test]
    fn a_cooled_counter_halves_once_per_period() {
        let now = Instant::now();
        let mut entry = Entry {
            fingerprint: 3,
            width: 64,
            warm_at: Some(now),
            ..FREE
        };
        entry.cool(WIDE, now + COOL / 2);
        assert_eq!(entry.width, 64);
        entry.cool(WIDE, now + COOL * 3);
        assert_eq!(entry.width, 8);
        entry.cool(WIDE, now + COOL * 100);
        assert_eq!(entry.width, 1);
    }

    #[test]
    fn a_hot_entry_is_not_handed_to_another_counter() {
        let now = Instant::now();
        let mut entry = FREE;
        assert!(entry.claim(5, WIDE, now));
        entry.grow(WIDE, 16, now);
        // Hot and recent: another counter writes at its minimum.
        assert!(!entry.claim(7, WIDE, now + COOL / 2));
        assert_eq!((entry.fingerprint, entry.width), (5, 16));
        // Cooled: taken, and the newcomer starts at its own minimum.
        assert!(entry.claim(7, WIDE, now + COOL));
        assert_eq!((entry.fingerprint, entry.width), (7, 1));
    }

    #[test]
    fn a_retried_write_doubles_the_width() {
        let heat = Heat::new();
        let counter = heat.fingerprint(("t", 9, "likes"));
        heat.begin(counter, WIDE).land(false);
        assert_eq!(heat.width(counter, WIDE), 1);
        heat.begin(counter, WIDE).land(true);
        assert_eq!(heat.width(counter, WIDE), 2);
        heat.begin(counter, WIDE).land(true);
        assert_eq!(heat.width(counter, WIDE), 4);
        // A dropped write only leaves.
        drop(heat.begin(counter, WIDE));
        assert_eq!(heat.width(counter, WIDE), 4);
    }
}
