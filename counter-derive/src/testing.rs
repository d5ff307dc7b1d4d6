//! Helpers of the unit tests of both derives.

use proc_macro2::TokenStream;

/// Generated tokens, pretty-printed as reviewers read them; tokens that are
/// no file (compile errors) as they are.
pub(crate) fn pretty(tokens: TokenStream) -> String {
    match syn::parse2::<syn::File>(tokens.clone()) {
        Ok(file) => prettyplease::unparse(&file),
        Err(_) => tokens.to_string(),
    }
}
