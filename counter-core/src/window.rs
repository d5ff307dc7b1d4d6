//! Time windows: the hour or day buckets a windowed key also counts in.

use chrono::{DateTime, TimeZone, Utc};

use crate::error::{CounterError, Result};

use crate::limits::MAX_SERIES_BUCKETS;

/// The width of a windowed key's buckets, always in UTC.
///
/// A windowed key (`keys(views(window = day))`, or
/// [`CounterTable::with_key_window`](crate::CounterTable::with_key_window))
/// counts every increment twice in one transaction: in its all-time total,
/// as every key does, and in the bucket of the increment's time, so that
/// range sums and charts cost a read of the buckets in the range, not of
/// every event. Buckets are UTC because a counter has one set of buckets
/// for all its readers; a reader in another time zone sums hour buckets.
///
/// ```
/// use chrono::{TimeZone, Utc};
/// use counter_core::Window;
///
/// let at = Utc.with_ymd_and_hms(2026, 11, 22, 23, 59, 59).unwrap();
/// assert_eq!(Window::Day.start_of(at), Utc.with_ymd_and_hms(2026, 11, 22, 0, 0, 0).unwrap());
/// assert_eq!(Window::Hour.start_of(at), Utc.with_ymd_and_hms(2026, 11, 22, 23, 0, 0).unwrap());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Window {
    /// One bucket per UTC hour.
    Hour,
    /// One bucket per UTC day, from midnight to midnight.
    Day,
}

impl Window {
    /// The width of one bucket, in seconds.
    pub const fn seconds(self) -> i64 {
        match self {
            Window::Hour => 3_600,
            Window::Day => 86_400,
        }
    }

    /// The start of the bucket `at` falls in.
    pub fn start_of(self, at: DateTime<Utc>) -> DateTime<Utc> {
        from_bucket(self.bucket_of(at))
    }

    /// The stored `bucket` of `at`: its bucket's start in Unix seconds.
    pub(crate) fn bucket_of(self, at: DateTime<Utc>) -> i64 {
        let secs = at.timestamp();
        secs - secs.rem_euclid(self.seconds())
    }

    /// The first bucket that starts at or after `at`.
    fn first_at_or_after(self, at: DateTime<Utc>) -> i64 {
        let floor = ceil_seconds(at);
        match floor.rem_euclid(self.seconds()) {
            0 => floor,
            past => floor - past + self.seconds(),
        }
    }

    /// Bucket starts `b` with `from <= b < to`, or an error for a reversed
    /// range or one longer than [`MAX_SERIES_BUCKETS`].
    pub(crate) fn starts(self, from: DateTime<Utc>, to: DateTime<Utc>) -> Result<Vec<i64>> {
        check_range(from, to)?;
        let first = self.first_at_or_after(from);
        let end = ceil_seconds(to);
        if first >= end {
            return Ok(Vec::new());
        }
        let count = (end - first - 1) / self.seconds() + 1;
        if count > MAX_SERIES_BUCKETS as i64 {
            return Err(CounterError::InvalidRange {
                reason: format!(
                    "{count} buckets of {self:?} between {from} and {to}: a series has at most {MAX_SERIES_BUCKETS}"
                ),
            });
        }
        Ok((0..count).map(|i| first + i * self.seconds()).collect())
    }
}

/// `from <= to`, or [`CounterError::InvalidRange`].
pub(crate) fn check_range(from: DateTime<Utc>, to: DateTime<Utc>) -> Result<()> {
    if from > to {
        return Err(CounterError::InvalidRange {
            reason: format!("the range starts at {from}, after its end {to}"),
        });
    }
    Ok(())
}

/// The first whole second at or after `at`. Buckets start on whole
/// seconds, so those starting in `[from, to)` are those with
/// `ceil_seconds(from) <= bucket < ceil_seconds(to)`: a bucket starting at
/// `to` itself is out, one starting a nanosecond before it is in.
pub(crate) fn ceil_seconds(at: DateTime<Utc>) -> i64 {
    let secs = at.timestamp();
    if at.timestamp_subsec_nanos() > 0 {
        secs + 1
    } else {
        secs
    }
}

/// A stored bucket back to its start time. Buckets come from
/// [`Window::bucket_of`], so they are in chrono's range; anything else (a
/// hand-edited row) maps to the Unix epoch rather than panicking.
pub(crate) fn from_bucket(bucket: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(bucket, 0)
        .single()
        .unwrap_or(DateTime::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    fn at(y: i32, m: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, m, d, h, mi, s).unwrap()
    }

    #[test]
    fn buckets_are_utc_and_half_open() {
        let last = at(2026, 11, 22, 23, 59, 59) + Duration::milliseconds(999);
        let midnight = at(2026, 11, 23, 0, 0, 0);
        assert_eq!(
            Window::Day.bucket_of(last),
            at(2026, 11, 22, 0, 0, 0).timestamp()
        );
        assert_eq!(Window::Day.bucket_of(midnight), midnight.timestamp());
        assert_eq!(
            Window::Hour.bucket_of(last),
            at(2026, 11, 22, 23, 0, 0).timestamp()
        );
        // Before 1970 the floor still goes down.
        let old = at(1969, 12, 31, 12, 0, 0);
        assert_eq!(Window::Day.start_of(old), at(1969, 12, 31, 0, 0, 0));
    }

    #[test]
    fn series_starts() {
        let day = |d| at(2026, 11, d, 0, 0, 0);
        let s = Window::Day.starts(day(1), day(4)).unwrap();
        assert_eq!(s, [day(1), day(2), day(3)].map(|d| d.timestamp()));
        // Unaligned bounds: buckets that start inside the range.
        let s = Window::Day
            .starts(
                day(1) + Duration::seconds(1),
                day(3) + Duration::nanoseconds(1),
            )
            .unwrap();
        assert_eq!(s, [day(2), day(3)].map(|d| d.timestamp()));
        assert!(Window::Day.starts(day(2), day(2)).unwrap().is_empty());
        assert!(matches!(
            Window::Day.starts(day(3), day(2)),
            Err(CounterError::InvalidRange { .. })
        ));
        assert!(matches!(
            Window::Hour.starts(at(2000, 1, 1, 0, 0, 0), at(2026, 1, 1, 0, 0, 0)),
            Err(CounterError::InvalidRange { .. })
        ));
    }
}
