//! A namespace: one companion table, its owner type and the keys it admits.

use std::collections::BTreeMap;

use counter_core::{CounterTable, Counters, SlotPolicy, Window, limits::MAX_KEY_LEN, validate_key};
use counter_redis::{CachedCounters, CountCache};

use crate::{
    domain::adds::AddQueue,
    domain::admission::{Admission, Arrival, QueueKind},
    domain::observes::ObserveQueue,
};
use serde::Serialize;

use crate::{
    config::{
        CheckConfig, Config, ConfigError, KeyConfig, NamespaceConfig, OwnerType, ServerConfig,
        SlotsName, SlotsSetting, WindowSetting,
    },
    problem::{Problem, preview},
};

/// The handle of a namespace's table, by owner type. Operations are
/// written once, generic over the owner type, and dispatched with
/// [`dispatch!`](crate::dispatch).
#[derive(Debug, Clone)]
pub(crate) enum Table {
    Integer(Handle<i64>),
    Uuid(Handle<uuid::Uuid>),
    String(Handle<String>),
}

/// A namespace's typed handles: the table, and the cache in front of it.
#[derive(Clone)]
pub(crate) struct Handle<I> {
    pub counters: Counters<I>,
    pub cached: Option<CachedCounters<I>>,
    /// The add queue, once the service has started.
    pub adds: Option<AddQueue<I>>,
}

impl<I: counter_core::OwnerId> std::fmt::Debug for Handle<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("table", &self.counters.table().name())
            .field("cached", &self.cached.is_some())
            .finish()
    }
}

impl<I: counter_core::OwnerId> Handle<I> {
    fn new(table: CounterTable) -> Self {
        Self {
            counters: Counters::new(table),
            cached: None,
            adds: None,
        }
    }
}

/// Runs `$body` with `$c` bound to the namespace's [`Handle`], whatever
/// its owner type: operations are written once, generic over it.
macro_rules! dispatch {
    ($table:expr, $c:ident => $body:expr) => {
        match $table {
            $crate::domain::namespace::Table::Integer($c) => $body,
            $crate::domain::namespace::Table::Uuid($c) => $body,
            $crate::domain::namespace::Table::String($c) => $body,
        }
    };
}
pub(crate) use dispatch;

/// One declared key, as listed by `GET /v1/{ns}/keys`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct KeyInfo {
    /// The key.
    pub name: String,
    /// `"16"`-style fixed slots or `"adaptive"`.
    pub slots: String,
    /// `hour`, `day`, or absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    /// Whether a check-and-fix truth is configured.
    pub checked: bool,
    /// Whether the key counts distinct members (an estimate, read by
    /// `uniques:batchGet`) rather than deltas.
    pub unique: bool,
}

/// A namespace, built from its configuration.
#[derive(Debug, Clone)]
pub(crate) struct Namespace {
    pub name: String,
    pub table: Table,
    pub keys: BTreeMap<String, KeyInfo>,
    /// Prefixes of the open key sets (`prefix*` in the configuration).
    pub prefixes: Vec<String>,
    pub checks: BTreeMap<String, CheckConfig>,
    /// The observe queue, once the service has started.
    pub observes: Option<ObserveQueue>,
    /// Whether its lag-tolerant reads go to a replica unless a request
    /// asks for the primary.
    pub replica_reads: bool,
}

/// The ledger's `source` column.
const LEDGER_SOURCE_LEN: usize = 64;

/// FNV-1a, 64 bits: a hash that is the same in every build and process.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Namespace names: what fits a URL segment and a ledger source.
const MAX_NAMESPACE_LEN: usize = 32;

impl Namespace {
    /// The configured namespaces, built and checked (a table is one
    /// namespace's only), with every refusal of every namespace at once.
    pub fn build_all(config: &Config) -> Result<BTreeMap<String, Namespace>, ConfigError> {
        let mut namespaces = BTreeMap::new();
        let mut tables = BTreeMap::new();
        let mut errors = Vec::new();
        // A bad region is the region check's to report.
        let region = config.region.as_ref().and_then(|r| r.region().ok());
        for (name, ns) in &config.namespaces {
            let namespace = match Namespace::build(name, ns, region.as_ref()) {
                Ok(namespace) => namespace,
                Err(error) => {
                    errors.push(error);
                    continue;
                }
            };
            if let Some(other) = tables.insert(namespace.table_name().to_owned(), name.clone()) {
                errors.push(ConfigError::invalid(
                    format!("namespaces.{name}.table"),
                    format!("the table is namespace `{other}`'s already"),
                ));
            }
            namespaces.insert(name.clone(), namespace);
        }
        if config.namespaces.is_empty() {
            errors.push(ConfigError::invalid(
                "namespaces",
                "declare at least one namespace",
            ));
        }
        ConfigError::all(errors)?;
        Ok(namespaces)
    }

    /// Builds and validates `config`, naming each bad value's path (all of
    /// them: a refused key does not hide the next one's mistake).
    /// Its table is placed in `region`, if there is one: every write takes
    /// the region's slots only.
    pub fn build(
        name: &str,
        config: &NamespaceConfig,
        region: Option<&counter_core::Region>,
    ) -> Result<Self, ConfigError> {
        let path = format!("namespaces.{name}");
        let valid_name = !name.is_empty()
            && name.len() <= MAX_NAMESPACE_LEN
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if !valid_name {
            return Err(ConfigError::invalid(
                path,
                format!(
                    "a namespace name is 1 to {MAX_NAMESPACE_LEN} lowercase letters, digits, `_` or `-`, starting with a letter"
                ),
            ));
        }
        let mut errors = Vec::new();
        let mut table = CounterTable::new(config.table.clone())
            .map_err(|e| invalid(format!("{path}.table"), e))?;
        if let Some(slots) = config.slots {
            match policy(slots) {
                Ok(slots) => table = table.with_slot_policy(slots),
                Err(e) => errors.push(invalid(format!("{path}.slots"), e)),
            }
        }
        let mut keys = BTreeMap::new();
        let mut checks = BTreeMap::new();
        for (key, key_config) in &config.keys {
            let at = format!("{path}.keys.{key}");
            // On a clone: a refused key leaves the table as it was.
            match declare_key(table.clone(), key, key_config, &at) {
                Ok(declared) => table = declared,
                Err(e) => {
                    errors.extend(e);
                    continue;
                }
            }
            if let Some(check) = &key_config.check {
                checks.insert(key.clone(), check.clone());
            }
            keys.insert(
                key.clone(),
                KeyInfo {
                    name: key.clone(),
                    slots: match table.slot_policy_for(key) {
                        SlotPolicy::Fixed(n) => n.get().to_string(),
                        _ => "adaptive".into(),
                    },
                    window: key_config.window.map(|w| match w {
                        WindowSetting::Hour => "hour".into(),
                        WindowSetting::Day => "day".into(),
                    }),
                    checked: key_config.check.is_some(),
                    unique: key_config.unique,
                },
            );
        }
        let mut prefixes = Vec::new();
        for (i, pattern) in config.key_patterns.iter().enumerate() {
            let at = format!("{path}.key_patterns.{i}");
            let Some(prefix) = pattern.strip_suffix('*').filter(|p| !p.contains('*')) else {
                errors.push(ConfigError::invalid(
                    at,
                    "a key pattern is a prefix and one `*` at its end, e.g. `reaction:*`",
                ));
                continue;
            };
            // The prefix followed by one more character must be a valid key.
            match validate_key(&format!("{prefix}a")) {
                Ok(()) => prefixes.push(prefix.to_owned()),
                Err(e) => errors.push(invalid(at, e)),
            }
        }
        if config.keys.is_empty() && config.key_patterns.is_empty() {
            errors.push(ConfigError::invalid(
                path,
                "a namespace declares `keys` or `key_patterns`",
            ));
        }
        ConfigError::all(errors)?;
        if let Some(region) = region {
            table = table.with_region(region.clone());
        }
        let table = match config.owner {
            OwnerType::Integer => Table::Integer(Handle::new(table)),
            OwnerType::Uuid => Table::Uuid(Handle::new(table)),
            OwnerType::String => Table::String(Handle::new(table)),
        };
        Ok(Self {
            name: name.to_owned(),
            table,
            keys,
            prefixes,
            checks,
            observes: None,
            replica_reads: config.replica_reads,
        })
    }

    /// `key` if this namespace admits it: declared, or valid and matching
    /// an open key set; otherwise a 400 naming the declared keys.
    pub fn key<'k>(&self, key: &'k str) -> Result<&'k str, Problem> {
        if self.keys.contains_key(key) {
            return Ok(key);
        }
        // The one rule of a key that is a bound: named, with its `max`.
        if key.len() > MAX_KEY_LEN {
            return Err(Problem::over_bound("key length", MAX_KEY_LEN, key.len()));
        }
        if self
            .prefixes
            .iter()
            .any(|p| key.starts_with(p.as_str()) && key.len() > p.len())
        {
            validate_key(key)?;
            return Ok(key);
        }
        let declared: Vec<&str> = self.keys.keys().map(String::as_str).collect();
        let patterns: Vec<String> = self.prefixes.iter().map(|p| format!("{p}*")).collect();
        Err(Problem::bad_request(format!(
            "namespace `{}` has no key `{}` (keys: {}{})",
            self.name,
            preview(key),
            declared.join(", "),
            if patterns.is_empty() {
                String::new()
            } else {
                format!("; patterns: {}", patterns.join(", "))
            }
        )))
    }

    /// `key` if this namespace admits it and it counts deltas (open key
    /// sets always do); a unique key is a 400 that names the endpoints
    /// which serve it.
    pub fn counted_key<'k>(&self, key: &'k str) -> Result<&'k str, Problem> {
        let key = self.key(key)?;
        if self.is_unique(key) {
            return Err(Problem::bad_request(format!(
                "`{key}` counts distinct members: write it with `counters:observe`, read it with `uniques:batchGet`"
            )));
        }
        Ok(key)
    }

    /// `key` if it is one of this namespace's unique keys; else a 400.
    pub fn unique_key<'k>(&self, key: &'k str) -> Result<&'k str, Problem> {
        let key = self.key(key)?;
        if !self.is_unique(key) {
            return Err(Problem::bad_request(format!(
                "`{key}` counts deltas, not distinct members: write it with `counters:add`, read it with `counts:batchGet`"
            )));
        }
        Ok(key)
    }

    /// Whether `key` is one of this namespace's unique keys (declared
    /// `unique = true`; open key sets count deltas).
    pub fn is_unique(&self, key: &str) -> bool {
        self.keys.get(key).is_some_and(|k| k.unique)
    }

    /// The companion table's name.
    pub fn table_name(&self) -> &str {
        dispatch!(&self.table, h => h.counters.table().name())
    }

    /// Starts this namespace's add and observe queues on `db`, each with
    /// `add_workers` groups in flight at once, admitting `max_queued_items`
    /// items at most and none expected to wait past `max_queue_wait_ms`.
    pub fn start_queues(&mut self, db: &sea_orm::DatabaseConnection, server: &ServerConfig) {
        let workers = server.add_workers;
        // A full group for each worker is admitted whatever the rate.
        let floor = workers * crate::domain::adds::MAX_GROUP_ITEMS;
        let admission = |kind| {
            Admission::new(
                kind,
                &self.name,
                server.max_queued_items,
                floor,
                std::time::Duration::from_millis(server.max_queue_wait_ms),
            )
        };
        let (adds, observes) = (admission(QueueKind::Adds), admission(QueueKind::Observes));
        let cache = dispatch!(&mut self.table, h => {
            let cache = h.cached.as_ref().map(|cached| cached.cache().clone());
            h.adds = Some(AddQueue::start(db.clone(), h.counters.clone(), cache.clone(), workers, adds));
            cache
        });
        self.observes = Some(ObserveQueue::start(db.clone(), cache, workers, observes));
    }

    /// `Ok` if the observe queue would admit one more observation now; its
    /// refusal if not.
    pub fn room_for_observes(&self, arrival: Arrival) -> Result<(), Problem> {
        self.observes
            .as_ref()
            .map_or(Ok(()), |queue| queue.has_room(arrival))
    }

    /// `Ok` if the add queue would admit one more item now; its refusal if
    /// not (a request is refused before its body is read).
    pub fn room_for_adds(&self, arrival: Arrival) -> Result<(), Problem> {
        dispatch!(&self.table, h => h.adds.as_ref().map_or(Ok(()), |adds| adds.has_room(arrival)))
    }

    /// Puts `cache` in front of this namespace's batch gets (and registers
    /// it for the table's writes, which invalidate it).
    pub fn use_cache(&mut self, cache: &CountCache) {
        dispatch!(&mut self.table, h => h.cached = Some(cache.table(&h.counters)));
    }

    /// The ledger source of the HTTP adds of the token named `token` (`None`
    /// on an open service): idempotency keys and item ids are scoped to the
    /// caller, as Stripe and the IETF draft scope them, so the same key from
    /// two tokens is two requests, and no caller can replay another's
    /// answer or meet a false 409. The queue keeps sources of its own.
    ///
    /// `http:<namespace>/<token>`, or, for a name that would not fit the
    /// ledger's 64-character column, `http:<namespace>/#` and a stable
    /// 64-bit FNV-1a hash of it.
    pub fn source_for(&self, token: Option<&str>) -> String {
        let base = format!("http:{}", self.name);
        match token {
            None => base,
            Some(name) if base.len() + 1 + name.len() <= LEDGER_SOURCE_LEN => {
                format!("{base}/{name}")
            }
            Some(name) => format!("{base}/#{:016x}", fnv1a(name)),
        }
    }
}

/// A configuration refusal at `at`, for the library's error `e`.
fn invalid(at: String, e: counter_core::CounterError) -> ConfigError {
    ConfigError::invalid(at, e.to_string())
}

/// `table` with `key` declared as `config` says (slots, window, unique),
/// or every refusal of the key's settings (`at` is its path).
fn declare_key(
    mut table: CounterTable,
    key: &str,
    config: &KeyConfig,
    at: &str,
) -> Result<CounterTable, Vec<ConfigError>> {
    validate_key(key).map_err(|e| vec![invalid(at.to_owned(), e)])?;
    let mut errors = Vec::new();
    if let Some(slots) = config.slots {
        match policy(slots).map_err(|e| invalid(format!("{at}.slots"), e)) {
            Ok(slots) => match table.clone().with_key_slot_policy(key, slots) {
                Ok(with) => table = with,
                Err(e) => errors.push(invalid(at.to_owned(), e)),
            },
            Err(e) => errors.push(e),
        }
    }
    if let Some(window) = config.window {
        let window = match window {
            WindowSetting::Hour => Window::Hour,
            WindowSetting::Day => Window::Day,
        };
        match table.clone().with_key_window(key, window) {
            Ok(with) => table = with,
            Err(e) => errors.push(invalid(format!("{at}.window"), e)),
        }
    }
    if config.unique {
        if config.check.is_some() {
            errors.push(ConfigError::invalid(
                format!("{at}.check"),
                "a unique key has no check: its truth is a set of members, not a count",
            ));
        }
        match table.clone().with_unique_key(key) {
            Ok(with) => table = with,
            Err(e) => errors.push(invalid(at.to_owned(), e)),
        }
    }
    if let Some(check) = &config.check
        && check.every_seconds == Some(0)
    {
        errors.push(ConfigError::invalid(
            format!("{at}.check.every_seconds"),
            "at least 1",
        ));
    }
    if errors.is_empty() {
        Ok(table)
    } else {
        Err(errors)
    }
}

fn policy(slots: SlotsSetting) -> Result<SlotPolicy, counter_core::CounterError> {
    match slots {
        SlotsSetting::Fixed(n) => Ok(SlotPolicy::Fixed(counter_core::Slots::new(n)?)),
        SlotsSetting::Named(SlotsName::Adaptive) => SlotPolicy::adaptive(1..=256),
    }
}
