//! Every SQL statement the crate sends, and every difference between the
//! backends. Nothing outside this module knows which database it talks to.
//!
//! Identifiers are quoted by sea-query, or (in the few hand-written
//! fragments) come from validated table names and fixed column names; values
//! are always bound parameters.

pub(crate) mod align;
mod buckets;
#[cfg(feature = "migration")]
mod cascade;
mod compact;
mod ddl;
mod errors;
#[cfg(feature = "buffer")]
pub(crate) mod ledger;
mod lock;
mod order;
mod owners;
mod range;
mod rank;
mod reconcile;
pub(crate) mod regions;
mod settle;
pub(crate) mod sketches;
mod sum;
mod upsert;

pub(crate) use align::{owner_key, owner_keys};
pub(crate) use buckets::{bucket_sums, prune_buckets};
#[cfg(feature = "migration")]
pub(crate) use cascade::set_cascade;
pub(crate) use compact::{FoldDeletion, FoldScope, FoldSlots, SlotRow, fold_deletion, lock_slots};
#[cfg_attr(not(feature = "migration"), allow(unused_imports))]
pub(crate) use ddl::{create_bucket_table, create_key_index, create_sketch_table, key_index_name};
pub(crate) use ddl::{create_table, drop_table, owner_fk_name};
pub(crate) use errors::{
    Classified, classify, is_connection_fault, is_misrouted, names_table, outcome_unknown,
};
pub(crate) use lock::{RecountLock, bound_lock_waits, row_key_locks, takes_row_key_locks};
pub(crate) use order::owner_order;
pub(crate) use owners::{
    delete_all, delete_key_of_owners, delete_orphans_of, delete_owners, orphan_owners,
};
pub(crate) use range::{OwnerRange, nth_row_owner};
pub(crate) use rank::ranked;
pub(crate) use reconcile::{
    OwnerIndex, SNAPSHOT_TOTALS, TruthSql, cache_truth, nth_owners, snapshot,
};
pub(crate) use settle::{Cell, create_slots, lock_cell};
pub(crate) use sum::{SumRow, parse_total, slot_values, sums, total_context};
pub(crate) use upsert::{Guard, SLOT_CAP, UpsertRow, add_one, add_rows, add_rows_with};

use sea_orm::{
    ConnectionTrait, DbBackend, IsolationLevel, SqliteTransactionMode, TransactionOptions,
};

use crate::{
    error::{CounterError, Result},
    table::CounterTable,
};

/// The fixed column names of every companion table.
pub(crate) mod col {
    pub const OWNER_ID: &str = "owner_id";
    pub const COUNT_KEY: &str = "count_key";
    pub const SLOT: &str = "slot";
    pub const VALUE: &str = "value";
    /// The bucket's start, in Unix seconds (bucket tables only).
    pub const BUCKET: &str = "bucket";
    /// The alias of a summed total in read queries.
    pub const TOTAL: &str = "total";
}

/// The two kinds of table a counter table has: its totals
/// `(owner_id, count_key, slot, value)` and, with windowed keys, its time
/// buckets `(owner_id, count_key, bucket, slot, value)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    Totals,
    Buckets,
    /// A unique key's sketches `(owner_id, count_key, bucket, slot,
    /// sketch)`; the all-time sketch in bucket [`sketches::ALL_TIME`].
    Sketches,
}

impl Layout {
    /// The columns one counter (or one bucket of it) is identified by.
    pub(crate) fn group(self) -> &'static [&'static str] {
        match self {
            Self::Totals => &[col::OWNER_ID, col::COUNT_KEY],
            Self::Buckets | Self::Sketches => &[col::OWNER_ID, col::COUNT_KEY, col::BUCKET],
        }
    }

    /// The column a row's count is in: `value`, or a sketch table's `sketch`.
    pub(crate) fn payload(self) -> &'static str {
        match self {
            Self::Totals | Self::Buckets => col::VALUE,
            Self::Sketches => sketches::SKETCH,
        }
    }

    /// The primary key: the group, then the slot.
    pub(crate) fn primary_key(self) -> &'static [&'static str] {
        match self {
            Self::Totals => &[col::OWNER_ID, col::COUNT_KEY, col::SLOT],
            Self::Buckets | Self::Sketches => {
                &[col::OWNER_ID, col::COUNT_KEY, col::BUCKET, col::SLOT]
            }
        }
    }
}

/// Every table holding `table`'s counts, with its layout: the totals, the
/// buckets if a key is windowed, the sketches if a key is unique.
pub(crate) fn tables(table: &CounterTable) -> Vec<(String, Layout)> {
    let mut tables = vec![(table.name().to_owned(), Layout::Totals)];
    if let Some(buckets) = table.bucket_table() {
        tables.push((buckets, Layout::Buckets));
    }
    if let Some(sketches) = table.sketch_table() {
        tables.push((sketches, Layout::Sketches));
    }
    tables
}

/// The SQL dialects this crate speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Sqlite,
    Postgres,
    MySql,
}

impl Dialect {
    pub(crate) fn of<C: ConnectionTrait + ?Sized>(db: &C) -> Result<Self> {
        Self::from_backend(db.get_database_backend())
    }

    pub(crate) fn from_backend(backend: DbBackend) -> Result<Self> {
        match backend {
            DbBackend::Sqlite => Ok(Self::Sqlite),
            DbBackend::Postgres => Ok(Self::Postgres),
            DbBackend::MySql => Ok(Self::MySql),
            #[allow(unreachable_patterns)]
            other => Err(CounterError::UnsupportedBackend(format!("{other:?}"))),
        }
    }

    pub(crate) fn backend(self) -> DbBackend {
        match self {
            Self::Sqlite => DbBackend::Sqlite,
            Self::Postgres => DbBackend::Postgres,
            Self::MySql => DbBackend::MySql,
        }
    }

    /// Bind parameters one statement may carry (measured at the boundary:
    /// SQLite 32766 `too many SQL variables`, PostgreSQL and MySQL 65535).
    pub(crate) fn max_binds(self) -> usize {
        match self {
            Self::Sqlite => 32_766,
            Self::Postgres | Self::MySql => 65_535,
        }
    }

    /// Rows of `columns` bound values each that one statement may carry:
    /// the bind limit's share, between 1 and `cap`.
    pub(crate) fn rows_per_statement(self, columns: usize, cap: usize) -> usize {
        (self.max_binds() / columns.max(1)).clamp(1, cap)
    }

    /// The transaction of one maintenance batch (a compaction or recount
    /// batch): READ COMMITTED on the servers, so it takes row locks only
    /// and no gap locks that MySQL's REPEATABLE READ would hold against
    /// inserts of new slot rows; `BEGIN IMMEDIATE` on SQLite, so it holds
    /// the write lock from its first read.
    pub(crate) fn batch_transaction(self) -> TransactionOptions {
        TransactionOptions {
            isolation_level: (self != Self::Sqlite).then_some(IsolationLevel::ReadCommitted),
            sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
            ..TransactionOptions::default()
        }
    }
}

/// The name of the incoming row in a multi-row upsert: PostgreSQL's and
/// SQLite's `excluded`, and the derived table's alias on MySQL, so one name
/// is reserved (see [`crate::CounterTable::new`]) instead of two.
pub(crate) const NEW_ROWS: &str = "excluded";

pub(crate) use crate::limits::UPSERT_ROWS_PER_STATEMENT;

/// Keys and owners per grouped read. Both lists are bound, so both are
/// chunked: keys take at most half the binds, owners the rest.
pub(crate) fn read_chunks(dialect: Dialect, keys: usize) -> (usize, usize) {
    let binds = dialect.max_binds();
    let keys_per_query = keys.clamp(1, binds / 2);
    (keys_per_query, binds - keys_per_query)
}

/// The type a total is cast to for reading: text keeps every digit (see
/// [`sums`]).
fn text_type(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::MySql => "CHAR",
        Dialect::Sqlite | Dialect::Postgres => "TEXT",
    }
}

/// FNV-1a: a hash that is the same in every process and build (the
/// standard library's is not), for names and lock ids derived from names.
fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// Quotes a name that is already known to be a plain identifier (validated
/// table names and the fixed column names).
fn quote(dialect: Dialect, ident: &str) -> String {
    debug_assert!(
        ident
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
    );
    match dialect {
        Dialect::MySql => format!("`{ident}`"),
        Dialect::Sqlite | Dialect::Postgres => format!("\"{ident}\""),
    }
}
