//! How hot each counter of this process is: the width of an adaptive key's
//! counters (see [`SlotPolicy::Adaptive`](crate::SlotPolicy::Adaptive)).
//!
//! A counter's width is how many of its slots this process's writes use.
//! It starts at the key's minimum and doubles, up to the maximum, when a
//! write sees contention that more rows would remove:
//! * more writes of the counter in flight in this process than its width
//!   (by Little's law, the rows a counter needs are its concurrent writers);
//! * [`SLOW_STREAK`] slow writes of the counter in a row, each within
//!   [`SLOW_GAP`] of the last: a write that took [`SLOW_FACTOR`] times the
//!   process's typical write, which is what a wait for a row lock held by
//!   another process (or another node) looks like, and what a retried
//!   deadlock or certification failure costs. One fast write ends the
//!   streak, so the odd stall of a busy machine never widens a counter.
//!
//! It halves again after [`COOL`] without either signal (or without half
//! its width in flight). Nothing is shared between processes and nothing
//! is stored: a read sums whatever rows exist, so each process's width is
//! only a hint about speed, and processes converge because they feel the
//! same lock waits. Rows of a counter that cooled are folded back into one
//! by [`Counters::compact`](crate::Counters::compact).
//!
//! The map is a fixed array of entries indexed by the counter's hash, so its
//! memory is constant. An entry belongs to one counter (its fingerprint) and
//! is handed to another only once it is idle and back at its minimum; a
//! counter that finds its entry taken by a hotter one writes at its minimum
//! width. So a cold counter never inherits another's width, and a cold
//! counter is one row.

use std::{
    hash::{BuildHasher, Hash},
    sync::{
        LazyLock, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

/// Entries in the map: 96 KiB. More hot counters than this at once share
/// the overflow at their minimum width.
const ENTRIES: usize = 4096;
/// How long a counter stays at its width without a sign of contention.
pub(crate) const COOL: Duration = Duration::from_secs(30);
/// A write this many times slower than the process's typical write waited.
const SLOW_FACTOR: u64 = 4;
/// Plus this, so that the jitter of fast writes is never a wait.
const SLOW_MARGIN: Duration = Duration::from_millis(2);
/// Slow writes of one counter in a row that widen it: one or two can be
/// hiccups of the machine, a lock wait repeats.
const SLOW_STREAK: u8 = 3;
/// The most time between two slow writes of one streak.
const SLOW_GAP: Duration = Duration::from_secs(1);

/// The process's map.
pub(crate) static HEAT: LazyLock<Heat> = LazyLock::new(Heat::new);

/// Per-counter widths of the adaptive keys of this process.
pub(crate) struct Heat {
    hasher: std::collections::hash_map::RandomState,
    entries: Box<[Mutex<Entry>]>,
    /// The typical duration of a write that had no company, in nanoseconds
    /// (a moving average): what "slow" is measured against.
    typical_nanos: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The owning counter's hash; 0 for a free entry.
    fingerprint: u64,
    width: u16,
    in_flight: u16,
    /// The last sign of contention (or growth): cooling starts from here.
    warm_at: Option<Instant>,
    /// The last slow write, and how many came in a row.
    slow_at: Option<Instant>,
    slow_streak: u8,
}

const FREE: Entry = Entry {
    fingerprint: 0,
    width: 1,
    in_flight: 0,
    warm_at: None,
    slow_at: None,
    slow_streak: 0,
};

/// A key's adaptive range, `min..=max` slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Range {
    pub min: u16,
    pub max: u16,
}

/// One write in flight: the width it writes at. Dropping it ends the write.
#[must_use]
pub(crate) struct Flight<'h> {
    heat: &'h Heat,
    fingerprint: u64,
    range: Range,
    width: u16,
    /// Whether the write holds a place in its counter's entry.
    tracked: bool,
    /// Whether it was the only write of its counter in flight when it began.
    alone: bool,
    started: Instant,
}

impl Heat {
    fn new() -> Self {
        Self {
            hasher: Default::default(),
            entries: (0..ENTRIES).map(|_| Mutex::new(FREE)).collect(),
            typical_nanos: AtomicU64::new(0),
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
        let (width, alone) = match tracked {
            true => {
                entry.in_flight = entry.in_flight.saturating_add(1);
                entry.cool(range, now);
                let in_flight = entry.in_flight;
                if in_flight > entry.width {
                    entry.grow(range, in_flight, now);
                } else if in_flight.saturating_mul(2) > entry.width {
                    entry.warm_at = Some(now);
                }
                (entry.width, in_flight == 1)
            }
            false => (range.min, false),
        };
        Flight {
            heat: self,
            fingerprint,
            range,
            width,
            tracked,
            alone,
            started: now,
        }
    }

    fn entry(&self, fingerprint: u64) -> std::sync::MutexGuard<'_, Entry> {
        let entry = &self.entries[fingerprint as usize % ENTRIES];
        // An entry holds plain numbers, consistent after any panic.
        entry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The end of a write that took `took`.
    fn land(&self, flight: &Flight<'_>, took: Duration) {
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let typical = self.typical_nanos.load(Ordering::Relaxed);
        let slow = typical > 0
            && nanos
                > typical
                    .saturating_mul(SLOW_FACTOR)
                    .saturating_add(SLOW_MARGIN.as_nanos() as u64);
        if flight.alone {
            // A moving average over about 64 writes; races between threads
            // only lose a sample. A slow sample counts as a few typical
            // ones, so that one stall moves it little and a machine that
            // became slower for good is followed.
            let sample = match typical {
                0 => nanos,
                t => nanos.min(t.saturating_mul(SLOW_FACTOR)),
            };
            let next = match typical {
                0 => sample,
                t => t - t / 64 + sample / 64,
            };
            self.typical_nanos.store(next.max(1), Ordering::Relaxed);
        }
        if !flight.tracked {
            return;
        }
        let now = flight.started + took;
        let mut entry = self.entry(flight.fingerprint);
        if entry.fingerprint != flight.fingerprint {
            return;
        }
        entry.in_flight = entry.in_flight.saturating_sub(1);
        if !slow {
            entry.slow_streak = 0;
            return;
        }
        let recent = entry
            .slow_at
            .is_some_and(|at| now.duration_since(at) <= SLOW_GAP);
        entry.slow_streak = if recent { entry.slow_streak + 1 } else { 1 };
        entry.slow_at = Some(now);
        if entry.slow_streak >= SLOW_STREAK {
            let doubled = entry.width.saturating_mul(2);
            entry.grow(flight.range, doubled, now);
            entry.slow_streak = 0;
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

    /// Ends the write as if it took `took`.
    #[cfg(test)]
    fn land_after(self, took: Duration) {
        self.heat.land(&self, took);
        std::mem::forget(self);
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        self.heat.land(self, self.started.elapsed());
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
            drop(flight);
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
        // Never past the ceiling.
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
    fn a_streak_of_slow_writes_doubles_the_width() {
        let heat = Heat::new();
        heat.typical_nanos.store(1_000_000, Ordering::Relaxed);
        let counter = heat.fingerprint(("t", 9, "likes"));
        let (slow, fast) = (Duration::from_millis(50), Duration::from_micros(900));
        // Two slow writes, then a fast one: no streak.
        heat.begin(counter, WIDE).land_after(slow);
        heat.begin(counter, WIDE).land_after(slow);
        heat.begin(counter, WIDE).land_after(fast);
        assert_eq!(heat.width(counter, WIDE), 1);
        for _ in 0..SLOW_STREAK {
            heat.begin(counter, WIDE).land_after(slow);
        }
        assert_eq!(heat.width(counter, WIDE), 2);
        // A fast write is no signal.
        heat.begin(counter, WIDE).land_after(fast);
        assert_eq!(heat.width(counter, WIDE), 2);
    }
}
