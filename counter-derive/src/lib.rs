//! Placeholder
use proc_macro::TokenStream;
#[proc_macro_derive(SlottedCounter, attributes(counter))]
pub fn derive_slotted_counter(_input: TokenStream) -> TokenStream {
    TokenStream::new()
}
