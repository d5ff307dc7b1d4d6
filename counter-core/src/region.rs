//! Regions: several databases that count the same counters at once, each
//! writing only rows of its own, the rows carried between them by the
//! database's replication (PostgreSQL's logical replication, or MariaDB's
//! replication of row binary logs, set up by the servers' options).
//!
//! A slotted counter is already a sum of rows that different writers own.
//! Region `index` of `count` owns the slots `s` with `s % count == index`
//! of every counter, bucket and sketch: every write of a table placed in it
//! ([`CounterTable::with_region`](crate::CounterTable::with_region), or
//! [`Region::install`] for the whole process) takes one of those, however
//! narrow the counter (a one-slot counter of region 1 writes slot 1), and
//! compaction, retention and orphan purges touch only those. A region never
//! inserts, updates or deletes a row another region owns, so replication
//! never meets a conflict and never overwrites a count: each region
//! publishes its own rows ([`Region::publish`]), subscribes to the others',
//! and a read sums every region's rows as it sums slots.
//!
//! What would change another region's rows, or must see every region's
//! rows at once to be exact (a repairing recount, a reset, folding every
//! slot, settling an add at the slot cap, a table that cascades its
//! owner's deletes, one batch given the table in two regions), is refused
//! with [`CounterError::CrossRegion`].

use std::{
    sync::{Arc, RwLock},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use sea_orm::ConnectionTrait;

use crate::{
    CounterTable,
    error::{CounterError, Result, preview},
    sql::{self, Dialect},
};

/// One region of several that count the same counters at once, each in a
/// database of its own: its name, and its share of every counter's slots
/// (the slots `s` with `s % count == index`).
///
/// Every write of a table placed in a region takes one of its slots,
/// however narrow the counter; compaction, retention and purges touch only
/// its rows. No region ever writes a row another owns, so the databases'
/// replication ([`Region::publish`]) never meets a conflict or overwrites a
/// count, and a read sums every region's rows as it sums slots. What would
/// change or must see every region's rows (a repairing recount, a reset,
/// folding every slot) is [`CounterError::CrossRegion`]. The guide's
/// "Regions" page has the setup, what each operation does in a region, and
/// the measured figures.
///
/// ```
/// use counter_core::{CounterTable, Region};
///
/// let eu = Region::new("eu", 1, 2)?;
/// let table = CounterTable::new("post_counters")?.with_slots(8)?.with_region(eu);
/// let mut slots: Vec<i16> = (0..8).map(|_| table.next_slot(&7_i64, "likes")).collect();
/// slots.sort();
/// slots.dedup();
/// assert_eq!(slots, [1, 3, 5, 7]); // region 1 of 2: the odd slots of 8
///
/// // A counter narrower than the regions still gets a row of its own.
/// let narrow = CounterTable::new("post_counters")?.with_slots(1)?.with_region(Region::new("eu", 1, 2)?);
/// assert_eq!(narrow.next_slot(&7_i64, "likes"), 1);
/// # Ok::<(), counter_core::CounterError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Region {
    name: Arc<str>,
    index: u16,
    count: u16,
}

/// The process's region ([`Region::install`]).
static PROCESS_REGION: RwLock<Option<Region>> = RwLock::new(None);

impl Region {
    /// The most regions: each owns at least one slot of every counter, and
    /// a counter has at most [`Slots::MAX`](crate::Slots::MAX) slots.
    pub const MAX: u16 = 64;

    /// Region `index` of `count` (`index < count <= Region::MAX`), named
    /// `name`: 1 to 64 ASCII letters, digits, `_` or `-` (it is stored in
    /// the heartbeat table and shown in errors, metrics and headers).
    pub fn new(name: impl Into<String>, index: u16, count: u16) -> Result<Self> {
        let name = name.into();
        CounterError::check_range("region count", count, 1, Self::MAX)?;
        CounterError::check_range("region index", index, 0, count - 1)?;
        let reason = if name.is_empty() {
            Some("a region name cannot be empty")
        } else if name.len() > 64 {
            Some("a region name is at most 64 bytes long")
        } else if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            Some("a region name may only contain ASCII letters, digits, '_' and '-'")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(CounterError::InvalidRegion {
                name: preview(&name),
                reason,
            });
        }
        Ok(Self {
            name: name.into(),
            index,
            count,
        })
    }

    /// The region's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its index among the regions.
    pub fn index(&self) -> u16 {
        self.index
    }

    /// The number of regions.
    pub fn count(&self) -> u16 {
        self.count
    }

    /// Whether `slot` is one of this region's.
    pub fn owns_slot(&self, slot: i16) -> bool {
        slot >= 0 && slot as u16 % self.count == self.index
    }

    /// Places every table of the process that names no region of its own
    /// in this one; call it once at start-up. The tables the derives make
    /// (counter caches included) take their region from here.
    ///
    /// ```rust,standalone_crate
    /// use counter_core::{CounterTable, Region};
    ///
    /// Region::new("us", 1, 2)?.install();
    /// let table = CounterTable::new("post_counters")?.with_slots(4)?;
    /// assert_eq!(table.region().map(|r| r.name().to_owned()), Some("us".to_owned()));
    /// assert!((0..8).all(|_| table.next_slot(&7_i64, "likes") % 2 == 1));
    /// # Ok::<(), counter_core::CounterError>(())
    /// ```
    pub fn install(self) {
        *PROCESS_REGION
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(self);
    }

    /// The region [`Region::install`]ed, if any.
    pub fn installed() -> Option<Self> {
        PROCESS_REGION
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// `Err(CrossRegion)` for `operation` when there is a region: what an
    /// operation that must see or change every region's rows says.
    pub(crate) fn refuse(region: Option<&Self>, operation: &'static str) -> Result<()> {
        match region {
            Some(region) => Err(CounterError::CrossRegion {
                region: region.name().to_owned(),
                operation,
            }),
            None => Ok(()),
        }
    }

    /// This region's slots of a counter `width` slots wide, at least one:
    /// `(first, step, how many)`.
    pub(crate) fn share(&self, width: u32) -> (u32, u32, u32) {
        let (index, count) = (u32::from(self.index), u32::from(self.count));
        (
            index,
            count,
            width.saturating_sub(index).div_ceil(count).max(1),
        )
    }

    /// Creates the heartbeat table, `counter_regions (region, beat_at_us)`,
    /// if it does not exist: one row per region, written only by its
    /// region ([`Region::beat`]) and replicated with its counters, so each
    /// region can tell how fresh the others' rows are ([`Region::lags`]).
    pub async fn create_beat_table<C: ConnectionTrait>(db: &C) -> Result<()> {
        let dialect = Dialect::of(db)?;
        db.execute_raw(sql::regions::create_beats(dialect))
            .await
            .map_err(CounterError::Database)?;
        Ok(())
    }

    /// Records that this region's rows are replicated up to now: upserts
    /// its heartbeat row with the current time. Call it every second or so
    /// (the service does); the others read it with [`Region::lags`].
    pub async fn beat<C: ConnectionTrait>(&self, db: &C) -> Result<()> {
        let dialect = Dialect::of(db)?;
        db.execute_raw(sql::regions::beat(
            dialect,
            self.name(),
            micros(SystemTime::now()),
        ))
        .await
        .map_err(CounterError::Database)?;
        Ok(())
    }

    /// How stale each other region's rows may be in `db`: the age of its
    /// latest heartbeat that replication has applied here. Every row that
    /// region committed before that beat is here too (a subscription
    /// applies a region's transactions in commit order), so its share of
    /// any total is at most this old, give or take the beat interval. A
    /// region that never beat here is absent. Ages come from this
    /// process's clock and the beating process's: keep them in sync (NTP).
    pub async fn lags<C: ConnectionTrait>(&self, db: &C) -> Result<Vec<RegionLag>> {
        let dialect = Dialect::of(db)?;
        let rows = db
            .query_all_raw(sql::regions::beats(dialect))
            .await
            .map_err(CounterError::Database)?;
        let now = micros(SystemTime::now());
        let mut lags = Vec::with_capacity(rows.len());
        for row in rows {
            let region: String = row.try_get_by_index(0).map_err(CounterError::Database)?;
            let beat: i64 = row.try_get_by_index(1).map_err(CounterError::Database)?;
            if region == self.name() {
                continue;
            }
            let age = Duration::from_micros(now.saturating_sub(beat).max(0).unsigned_abs());
            lags.push(RegionLag { region, age });
        }
        lags.sort_by(|a, b| a.region.cmp(&b.region));
        Ok(lags)
    }

    /// Publishes this region's rows of `tables` (their bucket and sketch
    /// tables too) and its heartbeat row, as the PostgreSQL publication
    /// `publication`: created, or its tables replaced if it exists.
    ///
    /// Each table is published with the row filter `slot % count = index`
    /// (the heartbeat table with `region = name`), inserts, updates and
    /// deletes only (never `TRUNCATE`, which row filters do not govern).
    /// PostgreSQL 15 has no `origin = none`: without the filter, a row
    /// received from another region would be published again and come
    /// back. The other regions subscribe to it with `CREATE SUBSCRIPTION`
    /// (see the guide's "Regions"). Never publish the ledgers (buffer
    /// flushes, MQ messages, the service's idempotency keys): each region
    /// keeps its own.
    ///
    /// PostgreSQL only ([`CounterError::UnsupportedBackend`] elsewhere:
    /// MariaDB's servers leave out the ledgers by their own options, and
    /// need no filter against loops, the guide's "Regions"); the server
    /// needs `wal_level = logical`.
    pub async fn publish<C: ConnectionTrait>(
        &self,
        db: &C,
        publication: &str,
        tables: &[&CounterTable],
    ) -> Result<()> {
        crate::validate_table_name(publication)?;
        if Dialect::of(db)? != Dialect::Postgres {
            return Err(CounterError::UnsupportedBackend(
                "regions replicate with PostgreSQL logical replication: publish on PostgreSQL"
                    .to_owned(),
            ));
        }
        let mut names = Vec::new();
        for table in tables {
            names.push(table.name().to_owned());
            names.extend(table.bucket_table());
            names.extend(table.sketch_table());
        }
        names.sort();
        names.dedup();
        for statement in sql::regions::publish(publication, &names, self) {
            db.execute_raw(statement)
                .await
                .map_err(CounterError::Database)?;
        }
        Ok(())
    }
}

/// How fresh another region's rows are here: see [`Region::lags`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionLag {
    /// The other region's name.
    pub region: String,
    /// The age of its latest heartbeat applied here.
    pub age: Duration,
}

/// Microseconds since the Unix epoch (0 before it).
fn micros(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}
