//! What the derive generates beside its errors, as thiserror does: a
//! stand-in `impl CounterCache for Entity`, so that the code relying on it
//! (`counter_cache_behavior!()`, `Entity::insert_counted`) compiles and a
//! mistake in an attribute is one error at the mistake. Its methods are
//! never run (the crate does not build), so their bodies are
//! `unreachable!()`.

use proc_macro2::TokenStream;
use quote::quote;

use super::model::Fallback;
use crate::root::Root;

pub(crate) fn expand(fallback: &Fallback) -> TokenStream {
    stand_in(
        &fallback.root,
        &quote!(Entity),
        &quote!(Model),
        &quote!(Column),
    )
}

/// `counter_cache!`'s stand-in, for the entity type `entity`.
pub(crate) fn expand_declared(root: &Root, entity: &syn::Path) -> TokenStream {
    let private = root.private();
    let sea_orm = quote!(#private::sea_orm::EntityTrait);
    stand_in(
        root,
        &quote!(#entity),
        &quote!(<#entity as #sea_orm>::Model),
        &quote!(<#entity as #sea_orm>::Column),
    )
}

fn stand_in(
    root: &Root,
    entity: &TokenStream,
    model: &TokenStream,
    column: &TokenStream,
) -> TokenStream {
    let private = root.private();
    quote! {
        #[automatically_derived]
        impl #root::CounterCache for #entity {
            fn count_row(
                _: &#model,
                _: i64,
                _: &mut #root::DeltaBatch,
            ) -> #root::Result<()> {
                ::core::unreachable!()
            }

            fn counted_columns() -> ::std::vec::Vec<#column> {
                ::core::unreachable!()
            }

            fn cache_rules() -> ::std::vec::Vec<#root::CacheRule<Self>> {
                ::core::unreachable!()
            }

            async fn recount_caches(
                _: &#private::sea_orm::DatabaseConnection,
                _: bool,
            ) -> #root::Result<u64> {
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
