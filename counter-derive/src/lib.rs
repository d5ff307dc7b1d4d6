//! `#[derive(SlottedCounter)]`: typed slotted counters on a SeaORM entity;
//! `#[derive(CounterCache)]`: a child entity's rows counted in its parents'
//! counters. Use them through `counter-core`, which re-exports them; the
//! documentation is on the derives.
//!
//! The crate only parses, checks and expands; everything that runs is in
//! counter-core. Both derives are laid out alike, `counter` for
//! `SlottedCounter` and `cache` for `CounterCache`: `attr` parses the
//! attribute, `model` checks it against the entity (`entity` reads what
//! sea-orm's derive makes of the `Model`), `expand` generates, and
//! `fallback` generates stand-ins beside the errors of an input that has
//! some, so that a mistake is one error, not one more at every use of the
//! derived items. They share `options` (reading `name = value` options, so
//! both grammars treat a bad option alike), `symbol` (every attribute and
//! option name, once), `diagnostics` (errors reported together) and `root`
//! (the path to counter-core and its versioned private module).

mod cache;
mod counter;
mod diagnostics;
mod entity;
#[cfg(test)]
mod fuzz;
mod options;
mod root;
mod symbol;
#[cfg(test)]
mod testing;

use proc_macro::TokenStream;

/// Counters for a SeaORM entity, stored in a companion table of slot rows.
///
/// Put it on the `Model` of an entity, beside `DeriveEntityModel`, with a
/// `#[counter(...)]` attribute naming the counters.
///
/// (The runnable example is on counter-core's re-export of this derive.)
///
/// ```text
/// #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
/// #[sea_orm(table_name = "posts")]
/// #[counter(keys(likes, comments, views(slots = 64)))]
/// pub struct Model {
///     #[sea_orm(primary_key)]
///     pub id: i64,
///     pub title: String,
/// }
///
/// // Elsewhere, with `use counter_core::prelude::*;` in scope:
/// let posts = post::Entity::counters();
/// posts.increment(&db, 1, post::counters::Key::Likes).await?;
/// let counts: post::counters::Counts = posts.counts(&db, 1).await?;
/// posts.untyped().increment(&db, 1, "reaction:heart").await?;
/// ```
///
/// # The attribute
///
/// `#[counter(keys(...), slots = N, table = "name", slot_strategy = "random", cascade, crate = "path")]`
///
/// | option | meaning | default |
/// |---|---|---|
/// | `keys(a, b, c(slots = N, window = day))` | the counters; each key is a lowercase snake_case identifier (at most 64 bytes) and may set its own slot count and a time window, `hour` or `day` (UTC), to be counted in buckets too (see counter-core's `Window`) | required |
/// | `slots = N` | slot rows per counter, `1..=1024`: more slots, less contention on a hot counter, more rows to sum on read | `16` |
/// | `table = "name"` | the companion table | `"<table_name>_counters"` |
/// | `slot_strategy = "rotating"` or `"random"` | how a write picks one of a counter's slots, a [`SlotStrategy`]: successive writes of a counter take successive slots, or each takes a random one | counter-core's `SlotStrategy::default()` (rotating) |
/// | `cascade` | the counter table references the owner table (its schema, table and primary-key column, as the entity names them) with `ON DELETE CASCADE` | off |
/// | `crate = "path"` | the path of counter-core, for a renamed dependency (`crate = "my_counters"` with `my_counters = { package = "counter-core", ... }`) or a re-export (`crate = "crate::deps::counter_core"`); every path the derive generates starts there. It is also resolved inside the generated `counters` module, so it cannot start with `self` or `super` | `"::counter_core"` |
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
/// attribute, all reported at once; beside them the derive still generates
/// stand-ins for its items (the trait impl, `counters::Key` and
/// `counters::Counts` with the keys that were valid), so the code using
/// them compiles and the mistakes are the only errors.
///
/// # What it generates
///
/// Beside `Model`, in the entity's module:
///
/// * `impl counter_core::SlottedCounter for Entity`, which binds the entity
///   to its counters: `Entity::counters()` (with the trait in scope, `use
///   counter_core::prelude::*`) is the typed handle of the companion table,
///   a [`Counters`] (its alias `EntityCounters<Entity>`), built once, on
///   which every operation is called, as
///   `post::Entity::counters().increment(&db, id, Key::Likes)`:
///   * writes: `add` (any delta), `increment`, `decrement`, `add_at` (at a
///     given time, for windowed keys) and `add_many` (many owners and keys,
///     all or nothing, folded and sorted into multi-row upserts);
///   * reads: `get` (one counter), `counts` (every counter of one owner, a
///     `Counts`), `counts_many` (many owners in one query per chunk, a
///     zero-filled `HashMap<id, Counts>`), `load_counts` (a page of `Model`s
///     paired with their `Counts`, one query for the page), `get_many`
///     (chosen keys of many owners); rankings (`top`, `top_models`) and,
///     for windowed keys, `range` and `series`;
///   * the table: `migration()` (feature `migration`, on by default) and
///     `create_table`, compaction and recounts (`compact`, `reconcile`);
///   * `untyped()`: the same table with keys chosen at run time (any
///     string, as `"reaction:heart"`), beside the typed `Key`s.
///
///   A typed handle takes only the entity's `Key`, so a misspelt counter is
///   a compile error. The trait's other method, `owner_id`, is a model's
///   primary key.
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
///     sync and `counters::Entity::find()` work on it. Prefer the migration
///     or `create_table`, which also create what the entity cannot describe:
///     the key index rankings read through, the bucket table of windowed
///     keys, and on MySQL a binary collation for `count_key` (keys stay
///     case-sensitive, as on the other backends);
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
    counter::derive(&input).into()
}

/// The counters of an owner, declared apart from its entity: for apps whose
/// entity files are generated (sea-orm-cli, Loco's `_entities/`) and whose
/// migration crate cannot depend on the entities.
///
/// (The guide and the runnable example are on counter-core's re-export.)
///
/// ```text
/// // In the migration crate (or any crate both it and the app can see):
/// counter_core::counter_table! {
///     /// The counters of notes.
///     #[counter(owner = "notes", owner_id = i32, keys(likes, views(slots = 64)), cascade)]
///     pub mod note_counters;
/// }
/// // Its Migrator: `Box::new(note_counters::counters().migration())`.
///
/// // In the app, beside the generated entity (Loco's `models/notes.rs`):
/// counter_core::slotted_counter!(Entity, migration::note_counters);
/// ```
///
/// The attribute is `#[counter(...)]` with every option of
/// `#[derive(SlottedCounter)]`, and the three facts the derive reads from
/// the entity:
///
/// | option | meaning | default |
/// |---|---|---|
/// | `owner = "notes"` | the owner table | required |
/// | `owner_id = i32` | the owner's primary-key type: `i32`, `i64`, `Uuid` or `String` | required |
/// | `owner_column = "id"` | the owner's primary-key column, which `cascade` references | `"id"` |
///
/// The module holds what the derive's `counters` module holds (`Key`,
/// `Counts`, `TABLE`, the companion `Entity`), `OwnerId`, and `counters()`,
/// the handle of the declared table that needs no entity. Mistakes are
/// compile errors at the attribute, beside a stand-in module with the keys
/// that parsed.
#[proc_macro]
pub fn counter_table(input: TokenStream) -> TokenStream {
    counter::declare(input.into()).into()
}

/// A counter cache declared beside a child entity whose file is generated
/// (sea-orm-cli, Loco's `_entities/`): the `#[counter_cache(...)]`
/// attributes of `#[derive(CounterCache)]`, then the child's entity type.
///
/// ```text
/// // Loco's models/comments.rs, beside the generated _entities/comments.rs:
/// counter_core::counter_cache! {
///     #[counter_cache(parent = super::notes::Entity, key = comments, via = note_id)]
///     super::_entities::comments::Entity
/// }
/// counter_core::counter_cache_behavior!(ActiveModel, Entity);
/// ```
///
/// It generates the derive's `impl CounterCache`. The macro cannot see the
/// `Model`, so a field it lacks is rustc's error at the field in the
/// attribute, and a field with `#[sea_orm(enum_name = "...")]` cannot be
/// named (sea-orm-cli writes none).
#[proc_macro]
pub fn counter_cache(input: TokenStream) -> TokenStream {
    cache::declare(input.into()).into()
}

/// A child entity's rows kept counted in counters of their parents: comments
/// counted on their post, tips summed on it, hidden comments counted on their
/// author.
///
/// Put it on the `Model` of the child entity, beside `DeriveEntityModel`,
/// with one `#[counter_cache(...)]` attribute per cache. Each parent is an
/// entity with `#[derive(SlottedCounter)]` that declares the cache's key.
/// (The runnable example is on counter-core's `CounterCache` trait.)
///
/// ```text
/// #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, CounterCache)]
/// #[sea_orm(table_name = "comments")]
/// #[counter_cache(parent = super::post::Entity, key = comments, via = post_id)]
/// #[counter_cache(parent = super::post::Entity, key = published_comments, via = post_id, when = published)]
/// #[counter_cache(parent = super::user::Entity, key = hidden_comments, via = author_id, when = !published)]
/// #[counter_cache(parent = super::post::Entity, key = tips, via = post_id, sum = amount)]
/// pub struct Model {
///     #[sea_orm(primary_key)]
///     pub id: i64,
///     pub post_id: i64,
///     pub author_id: Option<i64>,
///     pub published: bool,
///     pub amount: i32,
///     pub body: String,
/// }
///
/// #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
/// pub enum Relation {}
///
/// // In place of `impl ActiveModelBehavior for ActiveModel {}`:
/// counter_core::counter_cache_behavior!();
/// ```
///
/// # The attribute
///
/// `#[counter_cache(parent = path::Entity, key = name, via = field, sum = field, when = field)]`,
/// and `#[counter_cache(crate = "path")]`
///
/// | option | meaning | default |
/// |---|---|---|
/// | `parent = super::post::Entity` | the parent entity: a path ending in `Entity`, whose module holds the `counters::Key` its `#[derive(SlottedCounter)]` generated (`parent = Entity` for a parent in the same module, as in a tree) | required |
/// | `key = comments` | the parent's counter, one of its `#[counter(keys(...))]` (`published_comments` is `Key::PublishedComments`) | required |
/// | `via = post_id` | the child field holding the parent's id: the parent's primary-key type `P`, or `Option<P>` (a row without a parent counts nowhere) | required |
/// | `sum = amount` | add this integer field's value (any of `i8` to `i64`, `u8` to `u64`, or an `Option` of one, `NULL` adding 0) instead of 1 | count rows |
/// | `when = published`, `when = !published` | count the row only when this `bool` or `Option<bool>` field is `true` (with `!`, `false`); `NULL` never counts, as in SQL's `published = TRUE` | every row |
/// | `crate = "path"` | the path of counter-core for a renamed dependency or a re-export, as in `#[counter(crate = "...")]`: written once, for every cache, in an attribute of its own (`#[counter_cache(crate = "my_counters")]`) or in any one cache's | `"::counter_core"` |
///
/// Mistakes are compile errors pointing at the attribute, all reported at
/// once (beside them the derive still generates the trait impl, with bodies
/// that never run, so that the code using it adds no error of its own): an
/// unknown, duplicate or missing option, a `parent` not ending in
/// `Entity` (an alias of the entity is refused too: the derive finds the
/// parent's `counters::Key` through the path), a field `Model` does not
/// have or that is `#[sea_orm(ignore)]`, the same `parent` and `key`
/// declared twice, or no `#[counter_cache]` at all. A key the parent lacks,
/// or a field of a type the cache cannot read, is an error of rustc's
/// pointing at that key or field in the attribute.
///
/// The check for a cache declared twice compares `parent` paths as written,
/// not what they resolve to: `parent = Entity` and `parent = self::Entity`
/// (or `super::post::Entity` and `crate::post::Entity`) with the same `key`
/// are not caught, and that counter would count each row twice. Write each
/// parent's path the same way in every attribute.
///
/// # What it generates
///
/// `impl counter_core::CounterCache for Entity`, beside `Model`:
///
/// * `count_row`: a row's contribution to each counter it feeds, added to a
///   `DeltaBatch` with a sign (`+1` counts the row in, `-1` out);
/// * `counted_columns`: the `via`, `sum` and `when` columns, the only ones
///   whose change moves a counter (an update of other columns costs nothing);
/// * `cache_rules`: each cache as a `CacheRule` (parent table, key and
///   columns), from which the true counts are computed to repair drift;
/// * the provided methods of the trait, `insert_counted`, `update_counted`,
///   `delete_counted` and the bulk `*_many_counted`, which open their own
///   transaction.
///
/// The dense entity format (`#[sea_orm::model]`) works too: the copy of the
/// derive that sea-orm puts on `ModelEx` expands to nothing.
///
/// # Keeping the counters in step
///
/// One line in the child's module installs the hooks that count every
/// `insert`, `update`, `save` and `delete` of an `ActiveModel`:
///
/// ```text
/// counter_core::counter_cache_behavior!();
/// ```
///
/// It is the entity's `impl ActiveModelBehavior for ActiveModel`; an entity
/// with hooks of its own calls `counter_core::hooks` from them instead.
///
/// **The hooks need a transaction.** They write the counters on the
/// connection the write was given, so that the counter commits or rolls back
/// with the row, and lock the row they read, so that two concurrent deletes
/// of one row decrement once. On a bare pool that cannot be exact, so the
/// hooks refuse it with an error before anything is written: pass a
/// transaction (`db.begin()`), or use `Entity::insert_counted` and its
/// siblings, which open one.
///
/// **Bulk writes bypass the hooks.** `Entity::insert_many`, `update_many`,
/// `delete_many` and `delete_by_id` run no `ActiveModelBehavior` hook (by
/// sea-orm's design), so they change rows without changing counters; use
/// `insert_many_counted`, `update_many_counted` and `delete_many_counted`
/// instead. Writes made outside sea-orm (raw SQL, another service) are not
/// seen either; repair their drift with
/// `post::Entity::counters().reconcile(...)` (counter-core's
/// `Counters::reconcile`, with `Truth::counter_cache`).
#[proc_macro_derive(CounterCache, attributes(counter_cache))]
pub fn derive_counter_cache(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    cache::derive(&input).into()
}
