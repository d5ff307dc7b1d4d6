//! A companion table: its name and how many slots each key is spread over.

use std::{
    borrow::Cow,
    collections::{HashMap, HashSet},
    hash::BuildHasher,
    marker::PhantomData,
    sync::Arc,
};

use crate::{
    error::{CounterError, Result, preview},
    heat::{Flight, HEAT},
    key::validate_key,
    owner::OwnerId,
    region::Region,
    slots::{SlotPolicy, Slots},
    sql::Dialect,
    strategy::{SlotStrategy, Writer},
    typed::{KeySpace, Untyped},
    window::Window,
};

use crate::limits::MAX_TABLE_NAME_LEN;

/// The configuration of one companion table `(owner_id, count_key, slot, value)`.
///
/// Cheap to clone. Slot counts can differ per key and can be changed at any
/// time without a migration: reads sum every slot row that exists, so rows
/// written under an older, larger slot count are still counted.
///
/// ```
/// use counter_core::CounterTable;
///
/// let table = CounterTable::new("post_counters")?
///     .with_slots(16)?
///     .with_key_slots("views", 64)?;
/// assert_eq!(table.slots_for("views").get(), 64);
/// assert_eq!(table.slots_for("likes").get(), 16);
/// # Ok::<(), counter_core::CounterError>(())
/// ```
#[derive(Debug, Clone)]
pub struct CounterTable {
    inner: Arc<TableConfig>,
}

#[derive(Debug, Clone)]
struct TableConfig {
    name: Cow<'static, str>,
    slots: SlotPolicy,
    key_slots: HashMap<String, SlotPolicy>,
    /// Keys also counted in time buckets, and their window.
    key_windows: HashMap<String, Window>,
    /// Keys that count distinct members in sketches, not deltas.
    unique_keys: HashSet<String>,
    strategy: SlotStrategy,
    /// This table's share of the slots, if not the process's.
    writer: Option<Writer>,
    /// The region this table's writes belong to, if not the process's.
    region: Option<Region>,
    /// The owner table, when known.
    owner: Option<OwnerTable>,
    /// Whether the table references `owner` with `ON DELETE CASCADE`.
    cascade: bool,
}

/// The owner table a companion table references with
/// `FOREIGN KEY (owner_id) ... ON DELETE CASCADE` (see [`CounterTable::with_cascade`]).
///
/// The names come from the application's entity definitions, not from its
/// users, and are always quoted in SQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerTable {
    /// The owner table's schema, if it is not the connection's default.
    pub schema: Option<Cow<'static, str>>,
    /// The owner table's name.
    pub table: Cow<'static, str>,
    /// Its single primary-key column.
    pub column: Cow<'static, str>,
}

impl CounterTable {
    /// A table with the default [`Slots::DEFAULT`] slots per key.
    ///
    /// Names are SQL identifiers: 1 to 63 bytes of ASCII letters, digits and
    /// `_`, not starting with a digit. They are quoted in every statement, so
    /// reserved words are fine, but nothing else can get in. The one name
    /// refused is `excluded`, which upserts use for the incoming row.
    pub fn new(name: impl Into<Cow<'static, str>>) -> Result<Self> {
        let name = name.into();
        validate_table_name(&name)?;
        Ok(Self {
            inner: Arc::new(TableConfig {
                name,
                slots: SlotPolicy::default(),
                key_slots: HashMap::new(),
                key_windows: HashMap::new(),
                unique_keys: HashSet::new(),
                strategy: SlotStrategy::default(),
                writer: None,
                region: None,
                owner: None,
                cascade: false,
            }),
        })
    }

    /// Sets the slot count of every key that has none of its own.
    pub fn with_slots(self, slots: impl TryInto<i64> + Copy) -> Result<Self> {
        let slots = Slots::new(slots)?;
        Ok(self.with_slot_policy(SlotPolicy::Fixed(slots)))
    }

    /// The default [`SlotPolicy`] of the table's keys: e.g.
    /// `SlotPolicy::adaptive(1..=256)?` for counters that start on one row
    /// and grow only where writes contend.
    pub fn with_slot_policy(mut self, policy: SlotPolicy) -> Self {
        Arc::make_mut(&mut self.inner).slots = policy;
        self
    }

    /// The [`SlotPolicy`] of `key`, overriding the table's.
    pub fn with_key_slot_policy(mut self, key: &str, policy: SlotPolicy) -> Result<Self> {
        validate_key(key)?;
        Arc::make_mut(&mut self.inner)
            .key_slots
            .insert(key.to_owned(), policy);
        Ok(self)
    }

    /// Writes of this table take `writer`'s share of each counter's slots
    /// (see [`Writer`]), instead of the process's ([`Writer::install`]).
    pub fn with_writer(mut self, writer: Writer) -> Self {
        Arc::make_mut(&mut self.inner).writer = Some(writer);
        self
    }

    /// The writer whose share of the slots this table's writes take: its
    /// own, else the process's, if any.
    pub fn writer(&self) -> Option<Writer> {
        self.inner.writer.or_else(Writer::installed)
    }

    /// Places this table in `region` (see [`Region`]), instead of the
    /// process's ([`Region::install`]): its writes take only the region's
    /// slots, and what would change other regions' rows is refused.
    pub fn with_region(mut self, region: Region) -> Self {
        Arc::make_mut(&mut self.inner).region = Some(region);
        self
    }

    /// The region of this table's writes: its own, else the process's, if
    /// any.
    pub fn region(&self) -> Option<Region> {
        self.inner.region.clone().or_else(Region::installed)
    }

    /// `Err(CrossRegion)` for `operation` if this table is in a region:
    /// what an operation that must see or change every region's rows
    /// calls first.
    pub(crate) fn refuse_in_region(&self, operation: &'static str) -> Result<()> {
        Region::refuse(self.region().as_ref(), operation)
    }

    /// Sets the slot count of one key.
    pub fn with_key_slots(self, key: &str, slots: impl TryInto<i64> + Copy) -> Result<Self> {
        validate_key(key)?;
        let slots = Slots::new(slots)?;
        self.with_key_slot_policy(key, SlotPolicy::Fixed(slots))
    }

    /// Counts `key` in time buckets too, of `window`'s width: see [`Window`].
    ///
    /// The buckets live in a second table, [`CounterTable::bucket_table`]
    /// (`<name>_buckets`), created with the counter table. Fails if that
    /// name would be longer than [`MAX_TABLE_NAME_LEN`].
    pub fn with_key_window(mut self, key: &str, window: Window) -> Result<Self> {
        validate_key(key)?;
        self.check_side_table(
            BUCKET_TABLE_SUFFIX,
            "the bucket table of a windowed key is the counter table's name plus \
             `_buckets`, at most 63 bytes: choose a shorter counter table name",
        )?;
        Arc::make_mut(&mut self.inner)
            .key_windows
            .insert(key.to_owned(), window);
        Ok(self)
    }

    /// The time window of `key`, if it is counted in buckets.
    pub fn window_for(&self, key: &str) -> Option<Window> {
        self.inner.key_windows.get(key).copied()
    }

    /// The window of `key`, or [`CounterError::NotWindowed`]: what a range
    /// read needs.
    pub(crate) fn required_window(&self, key: &str) -> Result<Window> {
        self.window_for(key)
            .ok_or_else(|| CounterError::NotWindowed {
                table: self.name().to_owned(),
                key: key.to_owned(),
            })
    }

    /// The windowed keys and their windows, in key order.
    pub fn windows(&self) -> Vec<(&str, Window)> {
        let mut windows: Vec<_> = self
            .inner
            .key_windows
            .iter()
            .map(|(k, w)| (k.as_str(), *w))
            .collect();
        windows.sort();
        windows
    }

    /// The windowed keys grouped by window: the unique ones (`unique`), or
    /// those that count deltas.
    pub(crate) fn keys_by_window(&self, unique: bool) -> Vec<(Window, Vec<String>)> {
        let mut by_window: Vec<(Window, Vec<String>)> = Vec::new();
        for (key, window) in self.windows() {
            if self.is_unique(key) != unique {
                continue;
            }
            match by_window.iter_mut().find(|(w, _)| *w == window) {
                Some((_, keys)) => keys.push(key.to_owned()),
                None => by_window.push((window, vec![key.to_owned()])),
            }
        }
        by_window
    }

    /// The table of time buckets, `<name>_buckets`
    /// `(owner_id, count_key, bucket, slot, value)`, if a key that counts
    /// deltas is windowed (a windowed unique key keeps its buckets in the
    /// [sketch table](CounterTable::sketch_table)).
    pub fn bucket_table(&self) -> Option<String> {
        let config = &self.inner;
        config
            .key_windows
            .keys()
            .any(|key| !config.unique_keys.contains(key))
            .then(|| format!("{}{BUCKET_TABLE_SUFFIX}", self.name()))
    }

    /// Makes `key` a unique count: it counts distinct members
    /// ([`Counters::observe`](crate::Counters::observe)) in HyperLogLog
    /// sketches kept in the [sketch table](CounterTable::sketch_table),
    /// instead of deltas. Adding to it, or observing a key that is not
    /// unique, is [`CounterError::WrongKeyKind`]. With
    /// [`CounterTable::with_key_window`] it keeps a sketch per bucket too,
    /// whose unions answer "distinct viewers this week"
    /// ([`Counters::unique_over`](crate::Counters::unique_over)).
    ///
    /// Fails if the sketch table's name would be longer than
    /// [`MAX_TABLE_NAME_LEN`].
    pub fn with_unique_key(mut self, key: &str) -> Result<Self> {
        validate_key(key)?;
        self.check_side_table(
            SKETCH_TABLE_SUFFIX,
            "the sketch table of a unique key is the counter table's name plus \
             `_sketches`, at most 63 bytes: choose a shorter counter table name",
        )?;
        Arc::make_mut(&mut self.inner)
            .unique_keys
            .insert(key.to_owned());
        Ok(self)
    }

    /// `Ok` if this table's name plus `suffix` (a bucket or sketch table)
    /// is a valid table name; else the error, with `reason`.
    fn check_side_table(&self, suffix: &str, reason: &'static str) -> Result<()> {
        let name = format!("{}{suffix}", self.name());
        validate_table_name(&name).map_err(|_| CounterError::InvalidTableName {
            name: preview(&name),
            reason,
        })
    }

    /// The buckets a member observed `at` merges into for `key`: the
    /// all-time sketch's ([`ALL_TIME`](crate::sql::sketches::ALL_TIME)) and,
    /// for a windowed key, the bucket of `at`.
    pub(crate) fn sketch_buckets(
        &self,
        key: &str,
        at: chrono::DateTime<chrono::Utc>,
    ) -> impl Iterator<Item = i64> + use<> {
        let window = self.window_for(key).map(|w| w.bucket_of(at));
        [Some(crate::sql::sketches::ALL_TIME), window]
            .into_iter()
            .flatten()
    }

    /// Whether `key` is a unique count ([`CounterTable::with_unique_key`]).
    pub fn is_unique(&self, key: &str) -> bool {
        self.inner.unique_keys.contains(key)
    }

    /// The unique keys, in key order.
    pub fn unique_keys(&self) -> Vec<&str> {
        let mut keys: Vec<&str> = self.inner.unique_keys.iter().map(String::as_str).collect();
        keys.sort_unstable();
        keys
    }

    /// The table of sketches, `<name>_sketches`
    /// `(owner_id, count_key, bucket, slot, sketch)`, if any key is unique.
    pub fn sketch_table(&self) -> Option<String> {
        (!self.inner.unique_keys.is_empty())
            .then(|| format!("{}{SKETCH_TABLE_SUFFIX}", self.name()))
    }

    /// `Ok` if `key` counts deltas (`unique == false`) or members
    /// (`unique == true`), as the operation `what` needs; else
    /// [`CounterError::WrongKeyKind`].
    pub(crate) fn check_kind(&self, key: &str, unique: bool, what: &'static str) -> Result<()> {
        if self.is_unique(key) == unique {
            return Ok(());
        }
        Err(CounterError::WrongKeyKind {
            table: self.name().to_owned(),
            key: key.to_owned(),
            unique: !unique,
            operation: what,
        })
    }

    /// Sets how writes pick a slot (default [`SlotStrategy::Rotating`]).
    pub fn with_slot_strategy(mut self, strategy: SlotStrategy) -> Self {
        Arc::make_mut(&mut self.inner).strategy = strategy;
        self
    }

    /// How writes pick a slot.
    pub fn slot_strategy(&self) -> SlotStrategy {
        self.inner.strategy
    }

    /// Makes the created table reference its owner table, so deleting an
    /// owner row deletes its counters.
    ///
    /// Off by default, and worth its cost only when owners are deleted
    /// often: every counter write then checks the owner row (on InnoDB that
    /// check share-locks it, which brings back some of the contention slots
    /// remove), and a write for an owner that does not exist fails. It only
    /// changes the DDL of [`Counters::create_table`](crate::Counters::create_table)
    /// and of the migration; an existing table gets (or loses) the
    /// reference from [`Counters::cascade_migration`](crate::Counters::cascade_migration).
    /// On MySQL, a `String` owner key must use the `utf8mb4_bin` collation
    /// for the reference to be accepted.
    pub fn with_cascade(mut self, owner: OwnerTable) -> Self {
        let config = Arc::make_mut(&mut self.inner);
        config.owner = Some(owner);
        config.cascade = true;
        self
    }

    /// Names the owner table without referencing it: what
    /// [`Counters::purge_orphans`](crate::Counters::purge_orphans) compares
    /// with, and what a [`Counters::cascade_migration`](crate::Counters::cascade_migration)
    /// turning `cascade` off restores on `down`. The derives set it always.
    pub fn with_owner(mut self, owner: OwnerTable) -> Self {
        Arc::make_mut(&mut self.inner).owner = Some(owner);
        self
    }

    /// The owner table referenced with `ON DELETE CASCADE`, if any.
    pub fn cascade(&self) -> Option<&OwnerTable> {
        self.inner
            .cascade
            .then_some(self.inner.owner.as_ref())
            .flatten()
    }

    /// The owner table, if it is known ([`CounterTable::with_owner`] or
    /// [`CounterTable::with_cascade`]).
    pub fn owner(&self) -> Option<&OwnerTable> {
        self.inner.owner.as_ref()
    }

    /// The same table without the reference to its owner (the owner stays
    /// known): what `cascade` off creates.
    #[cfg(feature = "migration")]
    pub(crate) fn without_cascade(&self) -> Self {
        let mut table = self.clone();
        Arc::make_mut(&mut table.inner).cascade = false;
        table
    }

    /// The table name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The default slot count: the most slots a key's counters use unless
    /// the key sets its own.
    pub fn slots(&self) -> Slots {
        self.inner.slots.ceiling()
    }

    /// The most slots a counter of `key` uses: its fixed count, or the top
    /// of its adaptive range.
    pub fn slots_for(&self, key: &str) -> Slots {
        self.slot_policy_for(key).ceiling()
    }

    /// The table's default [`SlotPolicy`].
    pub fn slot_policy(&self) -> SlotPolicy {
        self.inner.slots
    }

    /// The [`SlotPolicy`] of `key`.
    pub fn slot_policy_for(&self, key: &str) -> SlotPolicy {
        self.inner
            .key_slots
            .get(key)
            .copied()
            .unwrap_or(self.inner.slots)
    }

    /// The slot the next write of `(owner, key)` goes to, by the table's
    /// strategy and the key's slot count.
    ///
    /// Every write of the crate asks this; it is public so that SQL written
    /// by hand (a bulk import, the benchmark's `slotted_raw` design) spreads
    /// its writes exactly as the crate does.
    ///
    /// ```
    /// use counter_core::CounterTable;
    ///
    /// let table = CounterTable::new("post_counters")?.with_slots(4)?;
    /// let mut slots: Vec<i16> = (0..4).map(|_| table.next_slot(&7_i64, "likes")).collect();
    /// slots.sort();
    /// assert_eq!(slots, [0, 1, 2, 3]); // four writes in a row: four rows
    /// # Ok::<(), counter_core::CounterError>(())
    /// ```
    pub fn next_slot(&self, owner: &impl std::hash::Hash, key: &str) -> i16 {
        self.next_slot_on(None, owner, key)
    }

    /// [`CounterTable::next_slot`] of a write on `dialect`: SQLite's
    /// adaptive counters never widen (see [`CounterTable::begin_write`]).
    pub(crate) fn next_slot_on(
        &self,
        dialect: Option<Dialect>,
        owner: &impl std::hash::Hash,
        key: &str,
    ) -> i16 {
        self.slot_of(dialect, owner, key, (self.name(), owner, key))
    }

    /// The slot the next bucket write of `(owner, key)` goes to: a rotor of
    /// its own, so the table's and the bucket table's rows both take every
    /// slot in turn; as wide as the counter's total.
    pub(crate) fn next_bucket_slot(
        &self,
        dialect: Option<Dialect>,
        owner: &impl std::hash::Hash,
        key: &str,
    ) -> i16 {
        let counter = ((self.name(), BUCKET_TABLE_SUFFIX), owner, key);
        self.slot_of(dialect, owner, key, counter)
    }

    /// The slot of the next write of `(owner, key)` among the counter's
    /// width now, `counter` naming the rotor it turns.
    fn slot_of(
        &self,
        dialect: Option<Dialect>,
        owner: &impl std::hash::Hash,
        key: &str,
        counter: impl std::hash::Hash,
    ) -> i16 {
        let policy = self.slot_policy_for(key);
        let width = self.width(policy, dialect, owner, key);
        self.pick(policy, width, counter)
    }

    /// How many slots the next write of `(owner, key)` chooses among: the
    /// key's fixed count, or the counter's width now if it is adaptive.
    fn width(
        &self,
        policy: SlotPolicy,
        dialect: Option<Dialect>,
        owner: &impl std::hash::Hash,
        key: &str,
    ) -> u16 {
        match (policy.heat_range(), dialect) {
            (Some(range), Some(Dialect::Sqlite)) => range.min,
            (Some(range), _) => HEAT.width(HEAT.fingerprint((self.name(), owner, key)), range),
            (None, _) => policy.ceiling().get(),
        }
    }

    /// A single write of `(owner, key)` on `dialect` starting: followed
    /// while in flight if the key is adaptive, so that concurrent writes
    /// widen the counter. Pick its slot (and its retries' slots) with
    /// [`CounterTable::slot_in_flight`].
    ///
    /// Not on SQLite, where every write takes the database's one write
    /// lock: more rows would never let two writes run at once, so adaptive
    /// counters stay at their minimum there.
    pub(crate) fn begin_write(
        &self,
        dialect: Dialect,
        owner: &impl std::hash::Hash,
        key: &str,
    ) -> Option<Flight<'static>> {
        let range = self.slot_policy_for(key).heat_range()?;
        if dialect == Dialect::Sqlite {
            return None;
        }
        Some(HEAT.begin(HEAT.fingerprint((self.name(), owner, key)), range))
    }

    /// The slot of a write begun with [`CounterTable::begin_write`].
    pub(crate) fn slot_in_flight(
        &self,
        dialect: Dialect,
        flight: Option<&Flight<'_>>,
        owner: &impl std::hash::Hash,
        key: &str,
    ) -> i16 {
        match flight {
            Some(flight) => {
                let policy = self.slot_policy_for(key);
                self.pick(policy, flight.width(), (self.name(), owner, key))
            }
            None => self.next_slot_on(Some(dialect), owner, key),
        }
    }

    /// A slot among the first `width` of `key`'s, by the strategy and the
    /// writer share. A widened adaptive counter without a share takes its
    /// `width` slots from a block of its own in this process (picked by a
    /// hash seeded per process): processes that each widen a counter to 8
    /// of 64 slots then use different rows, not all the first 8.
    fn pick(&self, policy: SlotPolicy, width: u16, counter: impl std::hash::Hash) -> i16 {
        let writer = self.writer();
        let region = self.region();
        // An adaptive counter's width is the rows this process's writes of
        // it need; in a region they must all be the region's own, so it
        // spreads over `count` times as many slots (within its ceiling),
        // the region's share of them being that many.
        let width = match (policy.heat_range(), &region) {
            (Some(range), Some(region)) => width.saturating_mul(region.count()).min(range.max),
            _ => width,
        };
        let slot = self
            .inner
            .strategy
            .pick_among(width, region.as_ref(), writer, &counter);
        match policy.heat_range() {
            Some(range)
                if writer.is_none()
                    && region.is_none()
                    && width > range.min
                    && width < range.max =>
            {
                let blocks = u64::from(range.max / width);
                let block = PROCESS_BLOCKS.hash_one(&counter) % blocks;
                // block * width + slot < range.max <= Slots::MAX: fits.
                (block as i16) * (width as i16) + slot
            }
            _ => slot,
        }
    }
}

/// The seed of this process's blocks of widened adaptive counters.
static PROCESS_BLOCKS: std::sync::LazyLock<std::collections::hash_map::RandomState> =
    std::sync::LazyLock::new(Default::default);

/// What a counter table's name gets to name its bucket table.
const BUCKET_TABLE_SUFFIX: &str = "_buckets";

/// What a counter table's name gets to name its sketch table.
const SKETCH_TABLE_SUFFIX: &str = "_sketches";

/// Checks a companion table name (see [`CounterTable::new`]).
pub fn validate_table_name(name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        "a table name cannot be empty"
    } else if name.len() > MAX_TABLE_NAME_LEN {
        "a table name is at most 63 bytes long"
    } else if name.as_bytes()[0].is_ascii_digit() {
        "a table name cannot start with a digit"
    } else if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        "a table name may only contain ASCII letters, digits and '_'"
    } else if name.eq_ignore_ascii_case(crate::sql::NEW_ROWS) {
        "`excluded` names the proposed row in upserts and cannot be a counter table"
    } else {
        return Ok(());
    };
    Err(CounterError::InvalidTableName {
        name: preview(name),
        reason,
    })
}

/// The handle to one companion table: every counting operation, written once.
///
/// `I` is the owners' id type. `S` says which keys the handle takes
/// ([`KeySpace`]): [`Untyped`] (the default) takes any
/// [`CounterKey`](crate::CounterKey), including strings chosen at run time,
/// and no DDL is ever needed for a new key; an entity with
/// `#[derive(SlottedCounter)]` gets a typed handle,
/// [`EntityCounters<E>`](crate::EntityCounters), from `E::counters()`, which
/// takes only its `Key` enum and reads into its `Counts`. Both are the same
/// type, so the buffer, batches and cache tiers take either.
///
/// Every method takes any `&C: ConnectionTrait`, so it runs on a pool or
/// inside the caller's transaction; owners are passed by value, lists of
/// owners as slices.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use counter_core::{CounterTable, Counters};
///
/// let db = sea_orm::Database::connect("sqlite::memory:").await?;
/// let reactions = Counters::<i64>::new(CounterTable::new("post_reactions")?);
/// reactions.create_table(&db).await?;
///
/// reactions.increment(&db, 7, "reaction:heart").await?;
/// reactions.add(&db, 7, "reaction:rocket", 3).await?;
/// assert_eq!(reactions.get(&db, 7, "reaction:rocket").await?, 3);
///
/// let counts = reactions.get_many(&db, &[7, 8], &["reaction:heart"]).await?;
/// assert_eq!(counts[&7]["reaction:heart"], 1);
/// assert_eq!(counts[&8]["reaction:heart"], 0); // zero-filled
/// # Ok(())
/// # }
/// ```
pub struct Counters<I, S = Untyped> {
    table: CounterTable,
    owner: PhantomData<fn() -> (I, S)>,
}

impl<I: OwnerId> Counters<I> {
    /// Untyped counters stored in `table`.
    pub fn new(table: CounterTable) -> Self {
        Self::with_table(table)
    }
}

impl<I: OwnerId, S: KeySpace> Counters<I, S> {
    /// The same table behind a handle of another key space.
    pub(crate) fn with_table(table: CounterTable) -> Self {
        Self {
            table,
            owner: PhantomData,
        }
    }

    /// The table configuration.
    pub fn table(&self) -> &CounterTable {
        &self.table
    }

    /// The same counters placed in `region` (see [`Region`]): how a typed
    /// handle (`Entity::counters()`) counts in one region of several,
    /// where the process as a whole is not in one ([`Region::install`]).
    pub fn in_region(&self, region: Region) -> Self {
        Self::with_table(self.table.clone().with_region(region))
    }

    /// The same table with keys chosen at run time: per-emoji reactions
    /// beside an entity's declared keys, or a string key from a request.
    pub fn untyped(&self) -> Counters<I> {
        Counters::with_table(self.table.clone())
    }
}

impl<I, S> Clone for Counters<I, S> {
    fn clone(&self) -> Self {
        Self {
            table: self.table.clone(),
            owner: PhantomData,
        }
    }
}

impl<I, S> std::fmt::Debug for Counters<I, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counters")
            .field("table", &self.table)
            .field("owner", &std::any::type_name::<I>())
            .field("keys", &std::any::type_name::<S>())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_identifiers() {
        for ok in ["post_counters", "_x", "T1", &"a".repeat(63)] {
            assert!(CounterTable::new(ok.to_owned()).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1x",
            "a-b",
            "a\"b",
            "a;drop",
            "a b",
            "ü",
            "Excluded",
            &"a".repeat(64),
        ] {
            let err = CounterTable::new(bad.to_owned()).unwrap_err();
            assert!(
                matches!(err, CounterError::InvalidTableName { .. }),
                "{bad}"
            );
        }
    }

    #[test]
    fn widened_adaptive_counters_take_a_block_of_their_own() {
        let policy = SlotPolicy::adaptive(1..=64).unwrap();
        let t = CounterTable::new("t").unwrap().with_slot_policy(policy);
        let mut blocks = std::collections::BTreeSet::new();
        for owner in 0..50 {
            let counter = ("t", owner, "views");
            let slots: Vec<i16> = (0..16).map(|_| t.pick(policy, 8, counter)).collect();
            let block = slots[0] / 8;
            assert!(
                slots.iter().all(|s| s / 8 == block && (0..64).contains(s)),
                "{slots:?}"
            );
            blocks.insert(block);
            // Cold: the first slot; fully widened: all of them.
            assert_eq!(t.pick(policy, 1, counter), 0);
        }
        assert!(blocks.len() > 2, "counters spread over blocks: {blocks:?}");
        let all: std::collections::BTreeSet<i16> = (0..256)
            .map(|_| t.pick(policy, 64, ("t", 1, "views")))
            .collect();
        assert_eq!(all.len(), 64);
    }

    #[test]
    fn per_key_slots_override_the_default() {
        let t = CounterTable::new("t").unwrap().with_slots(4).unwrap();
        let t = t.with_key_slots("views", 64).unwrap();
        assert_eq!(t.slots_for("views").get(), 64);
        assert_eq!(t.slots_for("likes").get(), 4);
        assert!(t.clone().with_key_slots("bad key", 2).is_err());
        assert!(t.with_key_slots("views", 0).is_err());
    }
}
