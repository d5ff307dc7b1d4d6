//! What the derive generates beside its errors, as thiserror does: stand-ins
//! for the items code uses (`post::Entity::counters()`, `counters::Key`,
//! `counters::Counts`, `counters::TABLE`), so that a typo in the attribute
//! is one error at the typo, not one more at every use of the counters.
//!
//! `Key` and `Counts` are the real ones, for the keys that parsed; the
//! trait's methods are never run (the crate does not build), so their
//! bodies are `unreachable!()`. The companion table's entity is left out:
//! it is the one part that needs a valid table, and code rarely names it.

use proc_macro2::TokenStream;
use quote::{ToTokens, quote};

use super::{expand::typed_keys, model::Fallback};

pub(crate) fn expand(fallback: &Fallback) -> TokenStream {
    let root = &fallback.root;
    let table = &fallback.table;
    // Any type that owns counters does; the primary key's when it is one.
    let owner = fallback
        .owner
        .as_ref()
        .map_or_else(|| quote!(i64), ToTokens::to_token_stream);
    let keys = typed_keys(root, &fallback.keys);
    quote! {
        #[automatically_derived]
        impl #root::SlottedCounter for Entity {
            type OwnerId = #owner;
            type Key = counters::Key;
            type Counts = counters::Counts;
            type UniqueKey = counters::UniqueKey;

            fn counters() -> &'static #root::EntityCounters<Self> {
                ::core::unreachable!()
            }

            fn owner_id(_: &Model) -> #owner {
                ::core::unreachable!()
            }
        }

        /// The counters of [`Entity`](super::Entity): stand-ins while the
        /// `#[counter]` attribute has errors.
        pub mod counters {
            /// The companion table's name.
            pub const TABLE: &str = #table;

            #keys
        }
    }
}

#[cfg(test)]
mod tests {
    use syn::{DeriveInput, parse_quote};

    fn pretty(input: DeriveInput) -> String {
        crate::testing::pretty(super::super::derive(&input))
    }

    /// One typo: its error, and the stand-ins of every item, with the key
    /// that parsed.
    #[test]
    fn a_typo_keeps_the_items() {
        let input = parse_quote! {
            #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
            #[sea_orm(table_name = "posts")]
            #[counter(keys(likes), slotz = 4)]
            pub struct Model {
                #[sea_orm(primary_key, auto_increment = false)]
                pub id: String,
            }
        };
        insta::assert_snapshot!(pretty(input));
    }

    /// No key, no table, no usable primary key, and a renamed crate: empty
    /// `Key` and `Counts`, an `i64` owner, every path from the root.
    #[test]
    fn nothing_parsed_but_the_root() {
        let input = parse_quote! {
            #[sea_orm(table_name = "posts")]
            #[counter(crate = "::my_counters", keys(Likes), table = "posts")]
            pub struct Model {
                #[sea_orm(primary_key)]
                pub id: u64,
            }
        };
        let expanded = pretty(input);
        assert!(!expanded.contains("counter_core"), "{expanded}");
        insta::assert_snapshot!(expanded);
    }

    /// No `Entity` to implement the trait for: the errors alone.
    #[test]
    fn no_fallback_without_an_entity() {
        let inputs: [DeriveInput; 3] = [
            // Not a `Model`.
            parse_quote! {
                #[sea_orm(table_name = "posts")]
                #[counter(keys(likes), slotz = 4)]
                pub struct Post { #[sea_orm(primary_key)] pub id: i64 }
            },
            // No `table_name`: sea-orm generates no `Entity`.
            parse_quote! {
                #[counter(keys(likes), slotz = 4)]
                pub struct Model { #[sea_orm(primary_key)] pub id: i64 }
            },
            // A field sea-orm's derive cannot name a column for.
            parse_quote! {
                #[sea_orm(table_name = "posts")]
                #[counter(keys(likes), slotz = 4)]
                pub struct Model { #[sea_orm(primary_key)] pub id: i64, pub _1: i64 }
            },
        ];
        for input in inputs {
            let expanded = super::super::derive(&input).to_string();
            assert!(expanded.contains("compile_error"), "{expanded}");
            assert!(!expanded.contains("impl"), "{expanded}");
        }
    }
}
