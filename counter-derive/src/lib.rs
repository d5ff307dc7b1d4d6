//! `#[derive(SlottedCounter)]`: typed slotted counters on a SeaORM entity.
//! Use it through `counter-core`, which re-exports it; the documentation is
//! on the derive.
//!
//! The crate only parses, checks and expands (`attr` and `entity` read the
//! input, `model` validates it, `expand` generates); everything that runs is
//! in counter-core.

mod attr;
mod diagnostics;
mod entity;
mod expand;
mod model;

use proc_macro::TokenStream;

/// Counters for a SeaORM entity, stored in a companion table of slot rows.
///
/// Put it on the `Model` of an entity, beside `DeriveEntityModel`, with a
/// `#[counter(...)]` attribute naming the counters.
///
/// (The runnable example is on counter-core's re-export of this derive.)
///
/// # The attribute
///
/// `#[counter(keys(...), slots = N, table = "name", slot_strategy = "random", cascade)]`
///
/// | option | meaning | default |
/// |---|---|---|
/// | `keys(a, b, c(slots = N))` | the counters; each key is a lowercase snake_case identifier (at most 64 bytes) and may set its own slot count | required |
/// | `slots = N` | slot rows per counter, `1..=1024`: more slots, less contention on a hot counter, more rows to sum on read | `16` |
/// | `table = "name"` | the companion table | `"<table_name>_counters"` |
/// | `slot_strategy = "rotating"` or `"random"` | how a write picks one of a counter's slots, a [`SlotStrategy`]: successive writes of a counter take successive slots, or each takes a random one | counter-core's `SlotStrategy::default()` (rotating) |
/// | `cascade` | the counter table references the owner table (its schema, table and primary-key column, as the entity names them) with `ON DELETE CASCADE` | off |
///
/// Slot counts can change at any time without a migration: reads sum every
/// slot row that exists. `cascade` costs a foreign-key check on every write
/// (on InnoDB a shared lock on the owner row), and writes for an owner that
/// does not exist then fail; use it when owners are deleted and their
/// counters must go with them.
///
/// The owner's primary key must be a single column of type `i32`, `i64`,
/// `Uuid` or `String` (at most 255 characters); a composite key is a compile
/// error. Mistakes in the attribute are compile errors pointing at the
/// attribute, all reported at once.
///
/// # What it generates
///
/// Beside `Model`, in the entity's module:
///
/// * `impl counter_core::SlottedCounter for Entity`: the counter methods,
///   called as `post::Entity::increment(&db, id, Key::Likes)` with the trait
///   in scope (`use counter_core::prelude::*`):
///   * writes: `add` (any delta), `increment`, `decrement`, and `add_many`
///     (many owners and keys, all or nothing, folded and sorted into
///     multi-row upserts);
///   * reads: `get` (one counter), `counts` (every counter of one owner, a
///     `Counts`), `counts_many` (many owners in one query per chunk, a
///     zero-filled `HashMap<id, Counts>`), `load_counts` (a page of `Model`s
///     paired with their `Counts`, one query for the page), `get_many` (chosen
///     keys of many owners);
///   * `counters()`: the dynamic [`Counters`] handle on the same table, for
///     keys chosen at run time, and `counter_migration()`, the migration of
///     the companion table (feature `migration`, on by default).
/// * `pub mod counters`, holding:
///   * `Key`: an enum with a variant per key (`likes` is `Key::Likes`), with
///     `as_str`, `Display`, `FromStr` (an unknown name is
///     `CounterError::UnknownKey`), `Key::ALL` and `Key::NAMES`;
///   * `Counts`: a struct with a public `i64` field per key (`Default`,
///     `Debug`, `Clone`, `Copy`, `PartialEq`, `Eq`, `Hash`);
///   * with counter-core's `serde` feature, `Serialize` and `Deserialize`
///     for both: a key as its stored name, `Counts` as a map
///     `{"likes": 1, "comments": 0, "views": 100}`;
///   * `Entity`, `Model`, `Column`, `ActiveModel`, `Relation`: the companion
///     table as a SeaORM entity, so `Schema::create_table_from_entity`, schema
///     sync and `counters::Entity::find()` work on it. On MySQL prefer the
///     migration or `create_table`: they give `count_key` a binary collation,
///     which keeps keys case-sensitive as on the other backends;
///   * `TABLE`, the companion table's name.
///
/// The dense entity format (`#[sea_orm::model]`) works too: the copy of the
/// derive that sea-orm puts on `ModelEx` expands to nothing.
///
/// The generated module is named `counters`, so the entity's module cannot
/// have another item of that name. Keys that are Rust keywords (`type`) are
/// fine and become raw fields (`counts.r#type`); `self`, `super` and `crate`
/// are refused. The companion table is created in the connection's default
/// schema even when the owner has a `schema_name`.
///
/// [`Counters`]: https://docs.rs/counter-core/latest/counter_core/struct.Counters.html
/// [`SlotStrategy`]: https://docs.rs/counter-core/latest/counter_core/enum.SlotStrategy.html
#[proc_macro_derive(SlottedCounter, attributes(counter))]
pub fn derive_slotted_counter(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    expand::derive(&input).into()
}
