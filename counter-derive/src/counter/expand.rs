//! The generated items. Thin on purpose: everything that runs lives in
//! counter-core, reached through absolute paths from one root
//! (`::counter_core`, or the `crate = "..."` option).

use proc_macro2::TokenStream;
use quote::quote;

use super::{
    attr::{SlotCount, SlotStrategy, Window},
    model::{CounterModel, Key},
};
use crate::{entity::OwnerKind, root::Root};

pub(crate) fn expand(model: &CounterModel) -> TokenStream {
    let root = &model.root;
    let private = root.private();
    let trait_impl = slotted_counter_impl(model);
    let table = &model.table;
    let table_doc = format!(
        " The counters of [`Entity`](super::Entity), in the companion table `{table}`: \
         the typed [`Key`]s, one [`Counts`] record per owner, and the table itself as a \
         SeaORM entity ([`Entity`], [`Model`], [`Column`])."
    );
    let relation = if model.cascade {
        Relation::ToEntity(model.primary_key.column.clone())
    } else {
        Relation::None
    };
    let companion = companion_entity(root, table, model.primary_key.owner, &relation);
    let keys = typed_keys(root, &model.keys);
    quote! {
        #trait_impl

        #[doc = #table_doc]
        pub mod counters {
            use #private::sea_orm;
            use sea_orm::entity::prelude::*;

            /// The companion table's name.
            pub const TABLE: &str = #table;

            #companion
            #keys
        }
    }
}

/// `Key`, `Counts` and `UniqueKey` of `keys`, with `Serialize` and
/// `Deserialize` for the first two if counter-core has its `serde`
/// feature: what every form (derive, declaration, fallbacks) generates.
pub(super) fn typed_keys(root: &Root, keys: &[Key]) -> TokenStream {
    let (unique, counted): (Vec<&Key>, Vec<&Key>) = keys.iter().partition(|k| k.unique);
    let key = key_enum(root, &counted, KeyEnum::Counted);
    let counts = counts_struct(root, &counted);
    let unique_key = key_enum(root, &unique, KeyEnum::Unique);
    quote! {
        #key
        #counts
        #unique_key

        // `Serialize` and `Deserialize` if counter-core has its `serde` feature.
        #root::__derive_serde!(Key, Counts);
    }
}

/// `&["viewers"]`: the unique keys.
pub(super) fn unique_keys(keys: &[Key]) -> TokenStream {
    let names = keys.iter().filter(|k| k.unique).map(|k| &k.name);
    quote!(&[#(#names),*])
}

fn slotted_counter_impl(model: &CounterModel) -> TokenStream {
    let root = &model.root;
    let private = root.private();
    let owner = &model.primary_key.ty;
    let field = &model.primary_key.field;
    let column = &model.primary_key.column;
    let slots = slot_count(root, model.slots);
    let key_slots = key_slots(root, &model.keys);
    let key_windows = key_windows(root, &model.keys);
    let unique_keys = unique_keys(&model.keys);
    let cascade = model.cascade;
    let strategy = slot_strategy(root, model.slot_strategy);
    quote! {
        #[automatically_derived]
        impl #root::SlottedCounter for Entity {
            type OwnerId = #owner;
            type Key = counters::Key;
            type Counts = counters::Counts;
            type UniqueKey = counters::UniqueKey;

            fn counters() -> &'static #root::EntityCounters<Self> {
                static COUNTERS: ::std::sync::LazyLock<#root::EntityCounters<Entity>> =
                    ::std::sync::LazyLock::new(|| {
                        #private::derived_counters::<Entity>(
                            counters::TABLE,
                            #slots,
                            #key_slots,
                            #key_windows,
                            #unique_keys,
                            #private::sea_orm::IdenStatic::as_str(&Column::#column),
                            #cascade,
                            #strategy,
                        )
                    });
                &COUNTERS
            }

            fn owner_id(model: &Model) -> #owner {
                ::core::clone::Clone::clone(&model.#field)
            }
        }
    }
}

/// `[("views", ..DeclaredSlots::Fixed(64u16))]`: the keys with a slot
/// count of their own.
pub(super) fn key_slots(root: &Root, keys: &[Key]) -> TokenStream {
    let pairs = keys.iter().filter_map(|k| {
        let name = &k.name;
        k.slots.map(|slots| {
            let slots = slot_count(root, slots);
            quote!((#name, #slots))
        })
    });
    quote!(&[#(#pairs),*])
}

/// counter-core's `DeclaredSlots` of a `slots` option.
pub(super) fn slot_count(root: &Root, slots: SlotCount) -> TokenStream {
    let private = root.private();
    match slots {
        SlotCount::Fixed(n) => quote!(#private::DeclaredSlots::Fixed(#n)),
        SlotCount::Adaptive(min, max) => quote!(#private::DeclaredSlots::Adaptive(#min, #max)),
    }
}

/// `[("views", ::counter_core::Window::Day)]`: the windowed keys.
pub(super) fn key_windows(root: &Root, keys: &[Key]) -> TokenStream {
    let pairs = keys.iter().filter_map(|k| {
        let name = &k.name;
        k.window.map(|window| {
            let window = window_tokens(root, window);
            quote!((#name, #window))
        })
    });
    quote!(&[#(#pairs),*])
}

/// `Some(::counter_core::SlotStrategy::Rotating)` and so on (the
/// counter-core variant of the same name), or `None` for the default.
pub(super) fn slot_strategy(root: &Root, strategy: Option<SlotStrategy>) -> TokenStream {
    let variant = match strategy {
        Some(SlotStrategy::Rotating) => quote!(Rotating),
        Some(SlotStrategy::Random) => quote!(Random),
        None => return quote!(::core::option::Option::None),
    };
    quote!(::core::option::Option::Some(#root::SlotStrategy::#variant))
}

/// `::counter_core::Window::Day` and so on.
fn window_tokens(root: &Root, window: Window) -> TokenStream {
    let variant = match window {
        Window::Hour => quote!(Hour),
        Window::Day => quote!(Day),
    };
    quote!(#root::Window::#variant)
}

/// How the companion entity relates to its owner.
pub(crate) enum Relation {
    /// Not at all (no `cascade`).
    None,
    /// `belongs_to` the owner entity of the derive, `super::Entity`,
    /// through the column of that `Column` variant, deleted with it.
    ToEntity(syn::Ident),
    /// References the owner table by name (a declaration, which has no
    /// entity to name), deleted with it.
    ByName { table: String, column: String },
}

/// The Rust type of an `owner_id`.
pub(crate) fn owner_type(private: &TokenStream, owner: OwnerKind) -> TokenStream {
    match owner {
        OwnerKind::I32 => quote!(i32),
        OwnerKind::I64 => quote!(i64),
        OwnerKind::Uuid => quote!(#private::sea_orm::prelude::Uuid),
        OwnerKind::String => quote!(::std::string::String),
    }
}

/// The companion table as a classic-format SeaORM entity, so `Schema`,
/// schema sync and `Entity::find()` all know it.
pub(crate) fn companion_entity(
    root: &Root,
    table: &str,
    owner: OwnerKind,
    relation: &Relation,
) -> TokenStream {
    let private = root.private();
    let owner_type = owner_type(&private, owner);
    let owner_column = match owner {
        OwnerKind::I32 => "Integer",
        OwnerKind::I64 => "BigInteger",
        OwnerKind::Uuid => "Uuid",
        // MySQL needs a length on a VARCHAR in a primary key.
        OwnerKind::String => "String(StringLen::N(255))",
    };
    let relations = match relation {
        Relation::None => quote! {
            /// The companion table's relations.
            #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
            pub enum Relation {}
        },
        Relation::ToEntity(column) => {
            let to = format!("super::Column::{column}");
            // The name the migration gives it, so that schema sync and the
            // cascade migration find one reference, not two.
            let mut fk_name = format!("{table}_owner_fk");
            fk_name.truncate(super::attr::MAX_TABLE_NAME_LEN);
            quote! {
                /// The companion table's relations.
                #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
                pub enum Relation {
                    /// The owner; deleting it deletes its counters.
                    #[sea_orm(
                        belongs_to = "super::Entity",
                        from = "Column::OwnerId",
                        to = #to,
                        on_delete = "Cascade",
                        fk_name = #fk_name
                    )]
                    Owner,
                }

                #[automatically_derived]
                impl Related<super::Entity> for Entity {
                    fn to() -> RelationDef {
                        Relation::Owner.def()
                    }
                }
            }
        }
        Relation::ByName { table, column } => quote! {
            /// The companion table's relations.
            #[derive(Copy, Clone, Debug, EnumIter)]
            pub enum Relation {
                /// The owner table; deleting an owner deletes its counters.
                Owner,
            }

            #[automatically_derived]
            impl RelationTrait for Relation {
                fn def(&self) -> RelationDef {
                    #private::owner_relation::<Entity>(Column::OwnerId, #table, #column)
                }
            }
        },
    };
    quote! {
        /// One slot row: a counter's total is the sum of its slots' values.
        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
        #[sea_orm(table_name = #table)]
        pub struct Model {
            /// The owner's primary key.
            #[sea_orm(primary_key, auto_increment = false, column_type = #owner_column)]
            pub owner_id: #owner_type,
            /// The counter's name: a [`Key`], or a runtime key of the dynamic API.
            #[sea_orm(primary_key, auto_increment = false, column_type = "String(StringLen::N(64))")]
            pub count_key: ::std::string::String,
            /// Which of the counter's slots this row is.
            #[sea_orm(primary_key, auto_increment = false)]
            pub slot: i16,
            /// This slot's share of the total (may be negative).
            pub value: i64,
        }

        #relations

        impl ActiveModelBehavior for ActiveModel {}
    }
}

/// Which of the two key enums [`key_enum`] generates.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyEnum {
    /// `Key`: the keys that count deltas, with `by_name` for the counter
    /// caches.
    Counted,
    /// `UniqueKey`: the keys that count distinct members.
    Unique,
}

/// The `Key` (or `UniqueKey`) enum of `keys` and its impls; the fallback's too.
pub(super) fn key_enum(root: &Root, keys: &[&Key], which: KeyEnum) -> TokenStream {
    let private = root.private();
    let count = keys.len();
    let variants: Vec<_> = keys.iter().map(|k| &k.variant).collect();
    let names: Vec<_> = keys.iter().map(|k| &k.name).collect();
    let fields: Vec<_> = keys.iter().map(|k| &k.field).collect();
    let docs = names.iter().map(|n| format!(" `{n}`"));
    let (name, doc, by_name) = match which {
        KeyEnum::Counted => (
            quote!(Key),
            " The counters of an owner. `as_str` is the stored name; `parse` turns a stored or \
             user-supplied name back into a key.",
            quote! {
                /// Each key under its stored name, as the counter caches'
                /// `key = comments` names it: a misspelt key there is rustc's
                /// error with the similar stored name as the fix.
                #[doc(hidden)]
                #[allow(non_upper_case_globals)]
                pub mod by_name {
                    #(pub const #fields: super::Key = super::Key::#variants;)*
                }
            },
        ),
        KeyEnum::Unique => (
            quote!(UniqueKey),
            " The unique counts of an owner (distinct members, in sketches): what `observe` and \
             `unique` take, and what `add` and `get` refuse at compile time.",
            TokenStream::new(),
        ),
    };
    quote! {
        #by_name

        #[doc = #doc]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum #name {
            #(
                #[doc = #docs]
                #variants,
            )*
        }

        impl #name {
            /// Every key, in declaration order.
            pub const ALL: [#name; #count] = [#(#name::#variants),*];
            /// Every stored name, in declaration order.
            pub const NAMES: [&'static str; #count] = [#(#names),*];

            /// The name stored in `count_key`.
            pub const fn as_str(self) -> &'static str {
                match self {
                    #(#name::#variants => #names,)*
                }
            }
        }

        #[automatically_derived]
        impl #root::CounterKey for #name {
            fn as_key_str(&self) -> &str {
                self.as_str()
            }
        }

        #[automatically_derived]
        impl #root::KeySet for #name {
            const ALL: &'static [Self] = &#name::ALL;
        }

        #[automatically_derived]
        impl ::core::fmt::Display for #name {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        #[automatically_derived]
        impl ::core::str::FromStr for #name {
            type Err = #root::CounterError;

            fn from_str(key: &str) -> ::core::result::Result<Self, Self::Err> {
                match key {
                    #(#names => ::core::result::Result::Ok(#name::#variants),)*
                    _ => ::core::result::Result::Err(
                        #private::unknown_key(key, &#name::NAMES),
                    ),
                }
            }
        }
    }
}

/// The `Counts` struct of `keys` and its impl; the fallback's too.
pub(super) fn counts_struct(root: &Root, keys: &[&Key]) -> TokenStream {
    let fields: Vec<_> = keys.iter().map(|k| &k.field).collect();
    let variants: Vec<_> = keys.iter().map(|k| &k.variant).collect();
    let docs = keys.iter().map(|k| format!(" The total of `{}`.", k.name));
    quote! {
        /// One owner's totals, a field per key; zero for a counter never written.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct Counts {
            #(
                #[doc = #docs]
                pub #fields: i64,
            )*
        }

        #[automatically_derived]
        impl #root::CountSet for Counts {
            type Key = Key;

            fn get(&self, key: Key) -> i64 {
                match key {
                    #(Key::#variants => self.#fields,)*
                }
            }

            fn set(&mut self, key: Key, total: i64) {
                match key {
                    #(Key::#variants => self.#fields = total,)*
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use syn::{DeriveInput, parse_quote};

    /// The expansion, pretty-printed, as reviewers read it.
    fn pretty(input: DeriveInput) -> String {
        crate::testing::pretty(super::super::derive(&input))
    }

    #[test]
    fn classic_entity_with_per_key_slots() {
        let input = parse_quote! {
            #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
            #[sea_orm(table_name = "posts")]
            #[counter(keys(likes, comments(slots = adaptive(1..=256)), views(slots = 64, window = day)), slots = 8)]
            pub struct Model {
                #[sea_orm(primary_key)]
                pub id: i64,
                pub title: String,
            }
        };
        insta::assert_snapshot!(pretty(input));
    }

    #[test]
    fn string_owner_with_cascade_table_and_strategy() {
        let input = parse_quote! {
            #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
            #[sea_orm(table_name = "pages")]
            #[counter(keys(views, r#type), table = "page_stats", slot_strategy = "random", cascade)]
            pub struct Model {
                #[sea_orm(primary_key, auto_increment = false, enum_name = "Slug")]
                pub id: String,
            }
        };
        insta::assert_snapshot!(pretty(input));
    }

    #[test]
    fn dense_model_ex_expands_to_nothing() {
        let input = parse_quote! {
            #[derive(Clone, Debug, PartialEq, DeriveModelEx, SlottedCounter)]
            #[sea_orm(table_name = "videos")]
            #[counter(keys(plays))]
            pub struct ModelEx {
                #[sea_orm(primary_key)]
                pub id: i64,
            }
        };
        assert_eq!(pretty(input), "");
    }

    #[test]
    fn errors_are_reported_together() {
        let input = parse_quote! {
            #[sea_orm(table_name = "posts")]
            #[counter(
                keys(likes, likes, Views, hits(window = week), runs(window = 3)), slots = 0, slot = 3,
                table = "no-dash",
                slot_strategy = "rotatin"
            )]
            pub struct Model {
                #[sea_orm(primary_key)]
                pub a: i64,
                #[sea_orm(primary_key)]
                pub b: i64,
            }
        };
        insta::assert_snapshot!(pretty(input));
    }
}
