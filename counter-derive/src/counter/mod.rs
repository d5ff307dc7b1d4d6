//! `#[derive(SlottedCounter)]`: typed counters of an owner entity, in a
//! companion table. `attr` parses the `#[counter(...)]` attributes, `model`
//! checks them against the entity, `expand` generates the trait impl and
//! the `counters` module, and `fallback` their stand-ins beside the errors
//! of an input that has some.

pub(crate) mod attr;
mod declaration;
mod expand;
mod fallback;
pub(crate) mod model;

use proc_macro2::TokenStream;
use syn::DeriveInput;

pub(crate) use declaration::declare;

/// The whole derive: the items, or the compile errors and the fallback.
pub(crate) fn derive(input: &DeriveInput) -> TokenStream {
    model::build(input).expand(expand::expand, fallback::expand)
}
