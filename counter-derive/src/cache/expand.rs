//! The generated `impl CounterCache for Entity`. Thin on purpose: reading a
//! field, folding deltas and applying them live in counter-core, reached
//! through absolute paths from one root (`::counter_core`, or the
//! `crate = "..."` option).
//!
//! Each use of a field or key is spanned at the user's token in the
//! attribute, so a field of the wrong type or a key the parent lacks is a
//! compile error pointing there.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;

use super::model::{Cache, CacheModel, FieldRef};
use crate::root::Root;

/// The derive's impl, in the entity's module: `Entity`, `Model` and
/// `Column` are the ones beside it.
pub(crate) fn expand(model: &CacheModel) -> TokenStream {
    cache_impl(model, &quote!(Entity), &quote!(Model), &quote!(Column))
}

/// `counter_cache!`'s impl for the entity type `entity`, named by a path
/// the macro cannot look into: the same impl, inside a block whose aliases
/// name its `Model` and `Column`.
pub(crate) fn expand_declared(model: &CacheModel, entity: &syn::Path) -> TokenStream {
    let private = model.root.private();
    let child = quote!(__CounterCacheChild);
    let child_model = quote!(__CounterCacheModel);
    let child_column = quote!(__CounterCacheColumn);
    let cache_impl = cache_impl(model, &child, &child_model, &child_column);
    quote! {
        const _: () = {
            type #child = #entity;
            type #child_model = <#child as #private::sea_orm::EntityTrait>::Model;
            type #child_column = <#child as #private::sea_orm::EntityTrait>::Column;
            #cache_impl
        };
    }
}

fn cache_impl(
    model: &CacheModel,
    entity: &TokenStream,
    entity_model: &TokenStream,
    entity_column: &TokenStream,
) -> TokenStream {
    let root = &model.root;
    let counts = model.caches.iter().map(|cache| count_row(root, cache));
    let columns = model.columns.iter().map(|c| column(entity_column, c));
    let rules = model
        .caches
        .iter()
        .map(|cache| rule(root, entity_column, cache));
    let private = root.private();
    let recounts = model.caches.iter().map(|cache| {
        let parent = &cache.parent;
        let key = key_variant(cache);
        quote! {
            differed += #private::recount_cache::<Self, #parent>(db, #key, repair).await?;
        }
    });
    quote! {
        #[automatically_derived]
        impl #root::CounterCache for #entity {
            fn count_row(
                model: &#entity_model,
                sign: i64,
                deltas: &mut #root::DeltaBatch,
            ) -> #root::Result<()> {
                #(#counts)*
                ::core::result::Result::Ok(())
            }

            fn counted_columns() -> ::std::vec::Vec<#entity_column> {
                ::std::vec::Vec::from([#(#columns),*])
            }

            fn cache_rules() -> ::std::vec::Vec<#root::CacheRule<Self>> {
                ::std::vec::Vec::from([#(#rules),*])
            }

            fn recount_caches(
                db: &#private::sea_orm::DatabaseConnection,
                repair: bool,
            ) -> impl ::core::future::Future<Output = #root::Result<u64>> + ::core::marker::Send {
                async move {
                    let mut differed = 0u64;
                    #(#recounts)*
                    ::core::result::Result::Ok(differed)
                }
            }
        }
    }
}

/// `Column::PostId`, spanned at the user's field.
fn column(entity_column: &TokenStream, field: &FieldRef) -> TokenStream {
    let column = &field.column;
    quote_spanned!(field.span()=> #entity_column::#column)
}

/// One cache's part of `count_row`: the delta this row adds to its parent's
/// counter, if it counts and has a parent.
fn count_row(root: &Root, cache: &Cache) -> TokenStream {
    let private = root.private();
    let parent = &cache.parent;
    let via = &cache.via.field;
    // The helpers' paths spanned at the user's field too, as all of each
    // call is, so that a field of the wrong type is an error there.
    let at = |span| root.at(span).private();
    let parent_id = {
        let private = at(via.span());
        quote_spanned! {via.span()=>
            #private::cache_parent::<#parent, _>(&model.#via)
        }
    };
    let amount = match &cache.sum {
        Some(sum) => {
            let field = &sum.field;
            let private = at(field.span());
            quote_spanned!(field.span()=> #private::cache_amount(&model.#field)?)
        }
        None => quote!(1),
    };
    let key = key_variant(cache);
    let add = quote! {
        if let ::core::option::Option::Some(owner) = #parent_id {
            let amount: i64 = #amount;
            deltas.add(
                <#parent as #root::SlottedCounter>::counters(),
                owner,
                #key,
                #private::cache_delta(sign, amount)?,
            )?;
        }
    };
    match &cache.when {
        Some((flag, expected)) => {
            let field = &flag.field;
            let private = at(field.span());
            let counts = quote_spanned! {field.span()=>
                #private::cache_when(&model.#field, #expected)
            };
            quote! {
                if #counts {
                    #add
                }
            }
        }
        None => add,
    }
}

/// `super::post::counters::by_name::published_comments`: the key the
/// parent's `#[derive(SlottedCounter)]` (or `counter_table!`) put beside its
/// `Entity`, under its stored name. The name keeps the user's key span, so
/// a key the parent lacks is rustc's error there, offering the parent's
/// similar key as written in the attribute; `counters::by_name` the span of
/// `Entity`.
fn key_variant(cache: &Cache) -> TokenStream {
    let path = &cache.parent;
    let entity = path
        .segments
        .last()
        .map_or_else(|| path.span(), |s| s.ident.span());
    let root = path.leading_colon;
    let module = path.segments.iter().rev().skip(1).rev();
    let name = &cache.key_ident;
    let counters = quote_spanned!(entity=> counters::by_name);
    quote!(#root #(#module ::)* #counters::#name)
}

/// The cache's `CacheRule`, for what runs outside a row's hooks.
fn rule(root: &Root, entity_column: &TokenStream, cache: &Cache) -> TokenStream {
    let parent = &cache.parent;
    let key = &cache.key;
    let column = |field| column(entity_column, field);
    let via = column(&cache.via);
    let sum = match &cache.sum {
        Some(sum) => {
            let column = column(sum);
            quote!(::core::option::Option::Some(#column))
        }
        None => quote!(::core::option::Option::None),
    };
    let when = match &cache.when {
        Some((flag, expected)) => {
            let column = column(flag);
            quote!(::core::option::Option::Some((#column, #expected)))
        }
        None => quote!(::core::option::Option::None),
    };
    quote! {
        #root::CacheRule {
            parent_table: <#parent as #root::SlottedCounter>::counters().table().name(),
            key: #key,
            via: #via,
            sum: #sum,
            when: #when,
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
    fn comment_caches_on_posts_and_users() {
        let input = parse_quote! {
            #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, CounterCache)]
            #[sea_orm(table_name = "comments")]
            #[counter_cache(parent = super::post::Entity, key = comments, via = post_id)]
            #[counter_cache(parent = super::post::Entity, key = published_comments, via = post_id, when = published)]
            #[counter_cache(parent = super::user::Entity, key = hidden_comments, via = author_id, when = !published)]
            #[counter_cache(parent = super::post::Entity, key = tips, via = post_id, sum = amount)]
            pub struct Model {
                #[sea_orm(primary_key)]
                pub id: i64,
                pub post_id: i64,
                pub author_id: Option<i64>,
                pub published: bool,
                pub amount: i32,
                pub body: String,
            }
        };
        insta::assert_snapshot!(pretty(input));
    }

    #[test]
    fn names_follow_sea_orm_and_the_parent_derive() {
        // A raw field, an `enum_name`, a parent in the same module (a tree)
        // and one by an absolute path, and a keyword key.
        let input = parse_quote! {
            #[sea_orm(table_name = "nodes")]
            #[counter_cache(parent = Entity, key = children, via = r#type)]
            #[counter_cache(parent = ::blog::kind::Entity, key = r#type, via = r#type, sum = weight)]
            pub struct Model {
                #[sea_orm(primary_key)]
                pub id: i64,
                pub r#type: Option<i64>,
                #[sea_orm(enum_name = "Heaviness")]
                pub weight: i16,
            }
        };
        insta::assert_snapshot!(pretty(input));
    }

    #[test]
    fn dense_model_ex_expands_to_nothing() {
        let input = parse_quote! {
            #[derive(Clone, Debug, PartialEq, DeriveModelEx, CounterCache)]
            #[sea_orm(table_name = "comments")]
            #[counter_cache(parent = super::post::Entity, key = comments, via = post_id)]
            pub struct ModelEx {
                #[sea_orm(primary_key)]
                pub id: i64,
                pub post_id: i64,
            }
        };
        assert_eq!(pretty(input), "");
    }

    #[test]
    fn errors_are_reported_together() {
        let input = parse_quote! {
            #[sea_orm(table_name = "comments")]
            #[counter_cache(parent = super::post::Entity, key = comments, via = post_idd, count = 1)]
            #[counter_cache(parent = super::post::Model, key = Likes, via = post_id, via = post_id)]
            #[counter_cache(parent = super::post::Entity, key = comments, via = post_id, when = !publishd)]
            #[counter_cache(parent = super::user::Entity, sum = amount)]
            #[counter_cache(parent = super::user::Entity, key = tips, via = author_id, when = published == true)]
            pub struct Model {
                #[sea_orm(primary_key)]
                pub id: i64,
                pub post_id: i64,
                pub author_id: i64,
                pub published: bool,
            }
        };
        insta::assert_snapshot!(pretty(input));
    }

    #[test]
    fn not_a_model() {
        let input = parse_quote! {
            pub enum Model {
                A,
            }
        };
        insta::assert_snapshot!(pretty(input));
    }
}
