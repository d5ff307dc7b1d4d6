//! What the derive generates beside its errors, as thiserror does: a
//! stand-in `impl CounterCache for Entity`, so that the code relying on it
//! (`counter_cache_behavior!()`, `Entity::insert_counted`) compiles and a
//! mistake in an attribute is one error at the mistake. Its methods are
//! never run (the crate does not build), so their bodies are
//! `unreachable!()`.

use proc_macro2::TokenStream;
use quote::quote;

use super::model::Fallback;

pub(crate) fn expand(fallback: &Fallback) -> TokenStream {
    let root = &fallback.root;
    quote! {
        #[automatically_derived]
        impl #root::CounterCache for Entity {
            fn count_row(
                _: &Model,
                _: i64,
                _: &mut #root::DeltaBatch,
            ) -> #root::Result<()> {
                ::core::unreachable!()
            }

            fn counted_columns() -> ::std::vec::Vec<Column> {
                ::core::unreachable!()
            }

            fn cache_rules() -> ::std::vec::Vec<#root::CacheRule<Self>> {
                ::core::unreachable!()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use syn::{DeriveInput, parse_quote};

    fn pretty(input: DeriveInput) -> String {
        crate::testing::pretty(super::super::derive(&input))
    }

    /// One typo: its error, and the stand-in impl, from the renamed root.
    #[test]
    fn a_typo_keeps_the_impl() {
        let input = parse_quote! {
            #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, CounterCache)]
            #[sea_orm(table_name = "comments")]
            #[counter_cache(crate = "::my_counters")]
            #[counter_cache(parent = super::post::Entity, key = comments, vai = post_id)]
            pub struct Model {
                #[sea_orm(primary_key)]
                pub id: i64,
                pub post_id: i64,
            }
        };
        let expanded = pretty(input);
        assert!(!expanded.contains("counter_core"), "{expanded}");
        insta::assert_snapshot!(expanded);
    }

    /// No `Entity` to implement the trait for: the errors alone.
    #[test]
    fn no_fallback_without_an_entity() {
        let inputs: [DeriveInput; 2] = [
            parse_quote! {
                #[sea_orm(table_name = "comments")]
                #[counter_cache(parent = super::post::Entity, key = comments, vai = post_id)]
                pub enum Model { A }
            },
            parse_quote! {
                #[counter_cache(parent = super::post::Entity, key = comments, vai = post_id)]
                pub struct Model { pub id: i64, pub post_id: i64 }
            },
        ];
        for input in inputs {
            let expanded = super::super::derive(&input).to_string();
            assert!(expanded.contains("compile_error"), "{expanded}");
            assert!(!expanded.contains("impl"), "{expanded}");
        }
    }
}
