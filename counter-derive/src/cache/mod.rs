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
use syn::DeriveInput;

/// The whole derive: the impl, or the compile errors and the fallback.
pub(crate) fn derive(input: &DeriveInput) -> TokenStream {
    model::build(input).expand(expand::expand, fallback::expand)
}
