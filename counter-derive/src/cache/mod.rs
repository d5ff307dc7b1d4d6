//! `#[derive(CounterCache)]`: a child entity's rows kept counted in its
//! parents' slotted counters. The same pipeline as the `SlottedCounter`
//! derive, with its shared helpers: `attr` parses each
//! `#[counter_cache(...)]`, `model` resolves and checks it against `Model`,
//! `expand` generates the `impl counter_core::CounterCache`, and `fallback`
//! its stand-in beside the errors of an input that has some.

mod attr;
mod expand;
mod fallback;
mod model;

use proc_macro2::TokenStream;
use syn::{Attribute, DeriveInput, Path, parse::Parser, spanned::Spanned};

/// The whole derive: the impl, or the compile errors and the fallback.
pub(crate) fn derive(input: &DeriveInput) -> TokenStream {
    model::build(input).expand(expand::expand, fallback::expand)
}

/// `counter_cache!`: `#[counter_cache(...)]` attributes, then the child's
/// entity type, for a child whose entity file is generated. The impl, or
/// the errors beside a stand-in impl.
pub(crate) fn declare(input: TokenStream) -> TokenStream {
    let parse = |input: syn::parse::ParseStream| {
        let attrs = input.call(Attribute::parse_outer)?;
        let entity: Path = input.parse()?;
        Ok((attrs, entity))
    };
    let (attrs, entity) = match parse.parse2(input) {
        Ok(parsed) => parsed,
        Err(e) => {
            let usage = syn::Error::new(
                e.span(),
                "write `counter_cache! { #[counter_cache(parent = super::posts::Entity, key = \
                 comments, via = post_id)] Entity }`, the child's entity type last",
            );
            let mut tokens = e.to_compile_error();
            tokens.extend(usage.to_compile_error());
            return tokens;
        }
    };
    match model::build_declared(&attrs, entity.span()) {
        Ok(model) => expand::expand_declared(&model, &entity),
        Err((errors, root)) => {
            let mut tokens = errors.to_compile_error();
            tokens.extend(fallback::expand_declared(&root, &entity));
            tokens
        }
    }
}
