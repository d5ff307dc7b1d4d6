//! `counter_table!`: the counters of an owner declared apart from its
//! entity, in a module of their own, for apps whose entity files are
//! generated (sea-orm-cli, Loco) and whose migration crate cannot see the
//! entities. The module holds everything that does not need the entity:
//! the keys, the companion table and its handle (so a migration crate
//! builds the exact migration from it); counter-core's
//! `slotted_counter!` later binds it to the entity.
//!
//! The same `#[counter(...)]` grammar as the derive, plus the three facts
//! the derive reads from the entity: `owner`, `owner_column`, `owner_id`.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Attribute, ItemMod, LitStr, spanned::Spanned};

use super::{
    attr::{self, Form, SlotCount, SlotStrategy},
    expand::{
        Relation, companion_entity, key_slots, key_windows, owner_type, slot_count, slot_strategy,
        typed_keys, unique_keys,
    },
    model::{DEFAULT_SLOTS, Key, check_bucket_table, counter_table, validate_keys},
};
use crate::{
    diagnostics::{Checked, Errors},
    entity::OwnerKind,
    root::Root,
    symbol::{COUNTER, OWNER, OWNER_ID},
};

/// The declared module, checked.
pub(crate) struct Declaration {
    /// The module's own attributes but `#[counter]` (its docs), its
    /// visibility and its name.
    item: ItemMod,
    root: Root,
    table: String,
    slots: SlotCount,
    keys: Vec<Key>,
    slot_strategy: Option<SlotStrategy>,
    cascade: bool,
    owner_table: String,
    owner_column: String,
    owner: OwnerKind,
}

/// The whole macro: the module, or the compile errors beside a stand-in
/// module with the keys that parsed.
pub(crate) fn declare(input: TokenStream) -> TokenStream {
    let item: ItemMod = match syn::parse2(input) {
        Ok(item) => item,
        Err(e) => {
            let mut tokens = e.to_compile_error();
            tokens.extend(usage_error(e.span()));
            return tokens;
        }
    };
    build(item).expand(expand, fallback)
}

fn usage_error(span: proc_macro2::Span) -> TokenStream {
    syn::Error::new(
        span,
        format!(
            "write `counter_table! {{ #[{COUNTER}({OWNER} = \"posts\", {OWNER_ID} = i64, keys(likes))] pub mod post_counters; }}`"
        ),
    )
    .to_compile_error()
}

/// What parsed of a declaration that has errors: the module and the keys,
/// for the stand-in module.
pub(crate) struct Fallback {
    item: ItemMod,
    root: Root,
    keys: Vec<Key>,
}

fn build(mut item: ItemMod) -> Checked<Declaration, Fallback> {
    let mut errors = Errors::default();
    if let Some((brace, _)) = &item.content {
        errors.at(
            brace.span.join(),
            "the module is generated: declare it as `pub mod name;`, without a body",
        );
    }
    let options = attr::parse(&item.attrs, Form::Declaration, &mut errors);
    item.attrs.retain(|a: &Attribute| *a.path() != COUNTER);
    let span = options.span.unwrap_or_else(|| item.ident.span());
    let keys = validate_keys(options.keys, span, &mut errors);
    let root = options.root.unwrap_or_default();
    if !options.written.contains(&OWNER) {
        errors.at(
            span,
            format!(
                "missing `{OWNER}`: the owner table, as in `{OWNER} = \"posts\"` (the derive reads \
                 it from the entity; a declaration names it)"
            ),
        );
    }
    if !options.written.contains(&OWNER_ID) {
        errors.at(
            span,
            format!(
                "missing `{OWNER_ID}`: the owner's primary-key type, `i32`, `i64`, `Uuid` or \
                 `String` (`slotted_counter!` checks it against the entity)"
            ),
        );
    }
    let table = counter_table(options.table, options.owner.as_ref(), &mut errors);
    if let Some(table) = &table {
        check_bucket_table(table, &keys, &mut errors);
    }
    let owner_column = options
        .owner_column
        .as_ref()
        .map_or_else(|| "id".to_owned(), LitStr::value);
    match (errors.finish(), table, options.owner, options.owner_id) {
        (Ok(()), Some(table), Some(owner_table), Some(owner)) => Checked::Valid(Declaration {
            item,
            root,
            table,
            slots: options.slots.unwrap_or(DEFAULT_SLOTS),
            keys,
            slot_strategy: options.slot_strategy,
            cascade: options.cascade,
            owner_table: owner_table.value(),
            owner_column,
            owner,
        }),
        (result, ..) => {
            let errors = result
                .err()
                .unwrap_or_else(|| syn::Error::new(item.span(), "incomplete declaration"));
            Checked::Invalid(errors, Some(Fallback { item, root, keys }))
        }
    }
}

fn expand(d: &Declaration) -> TokenStream {
    let root = &d.root;
    let private = root.private();
    let attrs = &d.item.attrs;
    let vis = &d.item.vis;
    let name = &d.item.ident;
    let table = &d.table;
    let owner_table = &d.owner_table;
    let owner_column = &d.owner_column;
    let owner = owner_type(&private, d.owner);
    let slots = slot_count(root, d.slots);
    let cascade = d.cascade;
    let key_slots = key_slots(root, &d.keys);
    let key_windows = key_windows(root, &d.keys);
    let unique_keys = unique_keys(&d.keys);
    let strategy = slot_strategy(root, d.slot_strategy);
    let relation = if d.cascade {
        Relation::ByName {
            table: owner_table.clone(),
            column: owner_column.clone(),
        }
    } else {
        Relation::None
    };
    let companion = companion_entity(root, table, d.owner, &relation);
    let keys = typed_keys(root, &d.keys);
    quote! {
        #(#attrs)*
        #vis mod #name {
            use #private::sea_orm;
            use sea_orm::entity::prelude::*;

            /// The companion table's name.
            pub const TABLE: &str = #table;

            /// The owner's primary-key type, also the `owner_id` column's.
            pub type OwnerId = #owner;

            /// The declaration, as `slotted_counter!` and `counters()` read it.
            #[doc(hidden)]
            pub const DECLARATION: #private::Declaration = #private::Declaration {
                table: TABLE,
                owner_table: #owner_table,
                owner_column: #owner_column,
                slots: #slots,
                key_slots: #key_slots,
                key_windows: #key_windows,
                unique_keys: #unique_keys,
                cascade: #cascade,
                slot_strategy: #strategy,
            };

            /// The declared counters on a handle that needs no entity: what a
            /// migration crate builds its migrations from
            /// (`counters().migration()`). The application's typed handle
            /// is `Entity::counters()`, once `slotted_counter!` binds this
            /// module to the entity.
            pub fn counters() -> &'static #root::Counters<OwnerId> {
                static COUNTERS: ::std::sync::LazyLock<#root::Counters<OwnerId>> =
                    ::std::sync::LazyLock::new(|| #root::Counters::new(DECLARATION.table()));
                &COUNTERS
            }

            #companion
            #keys
        }
    }
}

/// Beside the errors: the module with `Key` and `Counts` of the keys that
/// parsed, so code using them adds no error of its own.
fn fallback(Fallback { item, root, keys }: &Fallback) -> TokenStream {
    let private = root.private();
    let attrs = item.attrs.iter().filter(|a| *a.path() != COUNTER);
    let vis = &item.vis;
    let name = &item.ident;
    let keys = typed_keys(root, keys);
    quote! {
        #(#attrs)*
        #vis mod #name {
            /// Stand-in while the declaration has errors.
            pub const TABLE: &str = "";
            /// Stand-in while the declaration has errors.
            pub type OwnerId = i64;
            #[doc(hidden)]
            pub const DECLARATION: #private::Declaration = #private::Declaration {
                table: "",
                owner_table: "",
                owner_column: "",
                slots: #private::DeclaredSlots::Fixed(1),
                key_slots: &[],
                key_windows: &[],
                unique_keys: &[],
                cascade: false,
                slot_strategy: ::core::option::Option::None,
            };
            /// Stand-in while the declaration has errors.
            pub fn counters() -> &'static #root::Counters<OwnerId> {
                ::core::unreachable!()
            }
            #keys
        }
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;

    fn pretty(input: proc_macro2::TokenStream) -> String {
        crate::testing::pretty(super::declare(input))
    }

    #[test]
    fn declared_with_cascade_and_a_window() {
        insta::assert_snapshot!(pretty(quote! {
            /// The counters of notes.
            #[counter(owner = "notes", owner_id = i32, keys(likes, views(slots = 64, window = day)), cascade)]
            pub mod note_counters;
        }));
    }

    #[test]
    fn errors_are_reported_together_beside_a_stand_in() {
        insta::assert_snapshot!(pretty(quote! {
            #[counter(owner_id = u8, keys(likes), slotz = 3)]
            pub mod note_counters {}
        }));
    }
}
