//! The validated model of one derive: the entity's facts and the
//! `#[counter]` options, combined and defaulted. Expansion starts from here
//! and cannot fail; when something is wrong, what did parse is kept for the
//! fallback.

use proc_macro2::Span;
use syn::{DeriveInput, Ident, LitStr, Type};

use super::attr::{self, Form, SlotCount, SlotStrategy, Window, table_name_problem};
use crate::{
    diagnostics::{Checked, Errors},
    entity::{self, PrimaryKey, Target, variant_ident},
    root::Root,
    symbol::{COUNTER, KEYS, TABLE},
};

/// The slots of a key that sets none and of a table that sets none
/// (counter-core's `Slots::DEFAULT`).
pub(crate) const DEFAULT_SLOTS: SlotCount = SlotCount::Fixed(16);

pub(crate) struct CounterModel {
    /// The path to counter-core.
    pub root: Root,
    /// The companion table.
    pub table: String,
    /// The default slot count.
    pub slots: SlotCount,
    pub keys: Vec<Key>,
    /// How writes pick a slot; `None` leaves it to counter-core's default.
    pub slot_strategy: Option<SlotStrategy>,
    /// Whether the companion table references the owner table.
    pub cascade: bool,
    pub primary_key: PrimaryKey,
}

pub(crate) struct Key {
    /// The `Counts` field.
    pub field: Ident,
    /// The `Key` variant.
    pub variant: Ident,
    /// The stored `count_key`.
    pub name: String,
    /// Its own slot count, if it has one.
    pub slots: Option<SlotCount>,
    /// Its time window, if it is counted in buckets too.
    pub window: Option<Window>,
    /// Whether it counts distinct members (`viewers(unique)`): a
    /// `UniqueKey` variant then, not a `Key` one, and no `Counts` field.
    pub unique: bool,
}

/// What parsed of a derive that has errors: enough for stand-ins of the
/// generated items (see `fallback`).
pub(crate) struct Fallback {
    pub root: Root,
    /// The companion table as far as it is known, or empty.
    pub table: String,
    /// The keys that parsed, each with a distinct variant.
    pub keys: Vec<Key>,
    /// The primary key's type, if it is one that can own counters.
    pub owner: Option<Type>,
}

/// Reads and checks everything. Every problem found is in the error, not
/// only the first; with it, a fallback of what parsed when the input is an
/// entity's `Model`.
pub(crate) fn build(input: &DeriveInput) -> Checked<CounterModel, Fallback> {
    let mut errors = Errors::default();
    let target = entity::read(input, &mut errors);
    if let Some(Target::ModelEx) = target {
        return Checked::Skip;
    }
    let options = attr::parse(&input.attrs, Form::Derive, &mut errors);

    let span = options.span.unwrap_or_else(|| input.ident.span());
    let keys = validate_keys(options.keys, span, &mut errors);
    let root = options.root.unwrap_or_default();

    let Some(Target::Model(entity)) = target else {
        // `entity::read` has recorded why this is not an entity, which has
        // no `Entity` for a fallback to implement the trait for.
        let errors = errors.into_error(|| syn::Error::new(input.ident.span(), "not an entity"));
        return Checked::Invalid(errors, None);
    };
    let table = counter_table(options.table, entity.table_name.as_ref(), &mut errors);
    if let Some(table) = &table {
        check_bucket_table(table, &keys, &mut errors);
    }
    match (errors.finish(), table, entity.primary_key) {
        (Ok(()), Some(table), Some(primary_key)) => Checked::Valid(CounterModel {
            root,
            table,
            slots: options.slots.unwrap_or(DEFAULT_SLOTS),
            keys,
            slot_strategy: options.slot_strategy,
            cascade: options.cascade,
            primary_key,
        }),
        (result, table, primary_key) => {
            // Whatever is missing has been recorded with its reason.
            let errors = result.err().unwrap_or_else(|| {
                syn::Error::new(input.ident.span(), "no table name or primary key")
            });
            let fallback = entity.has_entity.then(|| Fallback {
                root,
                table: table.unwrap_or_default(),
                keys,
                owner: primary_key.map(|pk| pk.ty),
            });
            Checked::Invalid(errors, fallback)
        }
    }
}

/// The declared keys, each with its `Key` variant and `Counts` field; a
/// missing `keys(...)` or two keys with the same variant are reported (at
/// `span`, where the attribute is) and left out.
pub(crate) fn validate_keys(
    keys: Option<Vec<attr::KeyAttr>>,
    span: Span,
    errors: &mut Errors,
) -> Vec<Key> {
    let Some(keys) = keys else {
        errors.at(
            span,
            format!(
                "missing `{KEYS}`: name the counters, as in `#[{COUNTER}({KEYS}(likes, views))]`"
            ),
        );
        return Vec::new();
    };
    let mut valid: Vec<Key> = Vec::with_capacity(keys.len());
    for k in keys {
        let Some(variant) = variant_ident(&k.name, k.ident.span()) else {
            // `attr` admits only keys that start with a letter, which all
            // have one.
            errors.at(
                k.ident.span(),
                format!("key `{}` has no `Key` variant name", k.name),
            );
            continue;
        };
        let field = field_ident(&k.name, k.ident.span());
        if let Some(other) = valid.iter().find(|o| o.variant == variant) {
            // `attr` has refused a key written twice: these are two names.
            errors.at(
                field.span(),
                format!(
                    "keys `{}` and `{}` would both be the variant `Key::{variant}`; rename one",
                    other.name, k.name
                ),
            );
            continue;
        }
        valid.push(Key {
            variant,
            field,
            name: k.name,
            slots: k.options.slots,
            window: k.options.window,
            unique: k.options.unique,
        });
    }
    valid
}

/// The companion table: `table = "..."`, or `<owner>_counters`. `None`
/// (reported) when the name is the owner's own or the default is invalid,
/// and when neither is known.
pub(crate) fn counter_table(
    table: Option<LitStr>,
    owner: Option<&LitStr>,
    errors: &mut Errors,
) -> Option<String> {
    match (table, owner) {
        (Some(table), Some(owner)) if table.value().eq_ignore_ascii_case(&owner.value()) => {
            errors.at(
                table.span(),
                "the counter table cannot be the owner's own table; choose another name",
            );
            None
        }
        (Some(table), _) => Some(table.value()),
        (None, Some(owner_table)) => {
            let table = format!("{}_counters", owner_table.value());
            match table_name_problem(&table) {
                None => Some(table),
                Some(problem) => {
                    errors.at(
                        owner_table.span(),
                        format!(
                            "the default counter table name {table:?} is invalid ({problem}); \
                             name it with `#[{COUNTER}({TABLE} = \"...\")]`"
                        ),
                    );
                    None
                }
            }
        }
        (None, None) => None,
    }
}

/// Reports a windowed key when the bucket table's name, `<table>_buckets`,
/// would be invalid.
pub(crate) fn check_bucket_table(table: &str, keys: &[Key], errors: &mut Errors) {
    let windowed = keys.iter().find(|k| k.window.is_some() && !k.unique);
    let unique = keys.iter().find(|k| k.unique);
    let needs = [
        (windowed, "_buckets", "a windowed key keeps its buckets"),
        (unique, "_sketches", "a unique key keeps its sketches"),
    ];
    for (key, suffix, what) in needs {
        let Some(key) = key else {
            continue;
        };
        let name = format!("{table}{suffix}");
        if let Some(problem) = table_name_problem(&name) {
            errors.at(
                key.field.span(),
                format!(
                    "{what} in {name:?}, an invalid name ({problem}); choose a shorter counter \
                     table with `#[{COUNTER}({TABLE} = \"...\")]`"
                ),
            );
        }
    }
}

/// The `Counts` field of a key: the key itself, raw if it is a keyword
/// (`type` becomes `r#type`).
pub(crate) fn field_ident(name: &str, span: Span) -> Ident {
    // syn knows every keyword but edition 2024's `gen`.
    if name != "gen" && syn::parse_str::<Ident>(name).is_ok() {
        Ident::new(name, span)
    } else {
        Ident::new_raw(name, span)
    }
}
