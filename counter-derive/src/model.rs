//! The validated model of one derive: the entity's facts and the
//! `#[counter]` options, combined and defaulted. Expansion starts from here
//! and cannot fail.

use heck::ToUpperCamelCase;
use proc_macro2::Span;
use syn::{DeriveInput, Ident};

use crate::{
    attr::{self, SlotStrategy, Window, table_name_problem},
    diagnostics::Errors,
    entity::{self, PrimaryKey, Target},
};

/// The slots of a key that sets none and of a table that sets none
/// (counter-core's `Slots::DEFAULT`).
const DEFAULT_SLOTS: u16 = 16;

pub(crate) struct CounterModel {
    /// The companion table.
    pub table: String,
    /// The default slot count.
    pub slots: u16,
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
    pub slots: Option<u16>,
    /// Its time window, if it is counted in buckets too.
    pub window: Option<Window>,
}

/// Reads and checks everything; `Ok(None)` means there is nothing to
/// generate (the `ModelEx` copy of a dense-format entity). Every problem
/// found is in the error, not only the first.
pub(crate) fn build(input: &DeriveInput) -> syn::Result<Option<CounterModel>> {
    let mut errors = Errors::default();
    let target = entity::read(input, &mut errors);
    if let Some(Target::ModelEx) = target {
        return Ok(None);
    }
    let options = attr::parse(&input.attrs, &mut errors);

    let keys = match options.keys {
        Some(keys) => keys,
        None => {
            let span = options.span.unwrap_or_else(|| input.ident.span());
            errors.at(
                span,
                "missing `keys`: name the counters, as in `#[counter(keys(likes, views))]`",
            );
            Vec::new()
        }
    };
    let keys: Vec<Key> = keys
        .into_iter()
        .filter_map(|k| {
            let Some(variant) = variant_ident(&k.name, k.ident.span()) else {
                // `attr` admits only keys that start with a letter, which
                // all have one.
                errors.at(
                    k.ident.span(),
                    format!("key `{}` has no `Key` variant name", k.name),
                );
                return None;
            };
            Some(Key {
                variant,
                field: field_ident(&k.name, k.ident.span()),
                name: k.name,
                slots: k.options.slots,
                window: k.options.window,
            })
        })
        .collect();
    for (i, key) in keys.iter().enumerate() {
        if let Some(other) = keys[..i]
            .iter()
            .find(|o| o.variant == key.variant && o.name != key.name)
        {
            errors.at(
                key.field.span(),
                format!(
                    "keys `{}` and `{}` would both be the variant `Key::{}`; rename one",
                    other.name, key.name, key.variant
                ),
            );
        }
    }

    let Some(Target::Model(entity)) = target else {
        // `entity::read` has recorded why this is not an entity.
        return Err(errors.into_error(|| syn::Error::new(input.ident.span(), "not an entity")));
    };
    let table = match (options.table, &entity.table_name) {
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
                             name it with `#[counter(table = \"...\")]`"
                        ),
                    );
                    None
                }
            }
        }
        (None, None) => None,
    };
    if let (Some(table), Some(key)) = (&table, keys.iter().find(|k| k.window.is_some())) {
        let buckets = format!("{table}_buckets");
        if let Some(problem) = table_name_problem(&buckets) {
            errors.at(
                key.field.span(),
                format!(
                    "a windowed key keeps its buckets in {buckets:?}, an invalid name ({problem}); \
                     choose a shorter counter table with `#[counter(table = \"...\")]`"
                ),
            );
        }
    }
    match (table, entity.primary_key) {
        (Some(table), Some(primary_key)) => {
            errors.finish()?;
            Ok(Some(CounterModel {
                table,
                slots: options.slots.unwrap_or(DEFAULT_SLOTS),
                keys,
                slot_strategy: options.slot_strategy,
                cascade: options.cascade,
                primary_key,
            }))
        }
        // Whatever is missing has been recorded with its reason.
        _ => Err(errors
            .into_error(|| syn::Error::new(input.ident.span(), "no table name or primary key"))),
    }
}

/// The `Counts` field of a key: the key itself, raw if it is a keyword
/// (`type` becomes `r#type`).
fn field_ident(name: &str, span: Span) -> Ident {
    // syn knows every keyword but edition 2024's `gen`.
    if name != "gen" && syn::parse_str::<Ident>(name).is_ok() {
        Ident::new(name, span)
    } else {
        Ident::new_raw(name, span)
    }
}

/// The `Key` variant of a key, or the `Column` variant of a field, in
/// UpperCamelCase as sea-orm names columns, including its escape of `Self`;
/// `None` for a name whose UpperCamelCase is no identifier (`_1` is `1`).
pub(crate) fn variant_ident(name: &str, span: Span) -> Option<Ident> {
    let camel = match name.to_upper_camel_case() {
        camel if camel == "Self" => "Self_".to_owned(),
        camel => camel,
    };
    // syn rejects what `Ident::new` would panic on: no identifier, or a keyword.
    let mut ident = syn::parse_str::<Ident>(&camel).ok()?;
    ident.set_span(span);
    Some(ident)
}
