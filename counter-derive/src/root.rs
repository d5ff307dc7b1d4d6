//! How generated code names counter-core: through one root path,
//! `::counter_core` or the `crate = "..."` of a renamed dependency, and
//! counter-core's private module under it, whose name carries the version.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::{Ident, LitStr, Path, spanned::Spanned};

/// counter-core's module of the re-exports generated code uses
/// (`counter_core::__private_0_1_0`), named once. Its name carries the
/// version the two crates share, so a derive of one version with a
/// counter-core of another fails to compile instead of misbehaving; a unit
/// test below keeps it in step with the crate version.
const PRIVATE: &str = "__private_0_1_0";

/// The path to counter-core that every generated path starts from.
#[derive(Clone)]
pub(crate) struct Root(Path);

impl Default for Root {
    /// `::counter_core`.
    fn default() -> Self {
        Self(syn::parse_quote!(::counter_core))
    }
}

impl Root {
    /// The root of `crate = "path"`: a path without generic arguments,
    /// spanned at the string, so an error about it points there.
    pub(crate) fn parse(lit: &LitStr) -> syn::Result<Self> {
        lit.parse_with(Path::parse_mod_style).map(Self)
    }

    /// Whether the path starts at the module it is written in (`self::`,
    /// `super::`), and so means another path inside the generated
    /// `counters` module.
    pub(crate) fn is_relative_to_module(&self) -> bool {
        self.0.leading_colon.is_none()
            && self
                .0
                .segments
                .first()
                .is_some_and(|s| s.ident == "self" || s.ident == "super")
    }

    /// The same root with every token spanned at `span`, for a generated
    /// call whose errors must point at the user's token.
    pub(crate) fn at(&self, span: Span) -> Self {
        let mut path = self.0.clone();
        if let Some(colon) = &mut path.leading_colon {
            colon.spans = [span; 2];
        }
        for pair in path.segments.pairs_mut() {
            let (segment, colons) = pair.into_tuple();
            segment.ident.set_span(span);
            if let Some(colons) = colons {
                colons.spans = [span; 2];
            }
        }
        Self(path)
    }

    /// counter-core's private module: `::counter_core::__private_0_1_0`.
    pub(crate) fn private(&self) -> TokenStream {
        let private = Ident::new(PRIVATE, self.0.span());
        quote!(#self::#private)
    }
}

impl ToTokens for Root {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        self.0.to_tokens(tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two crates share the workspace version, so the private module
    /// the derive names is the one counter-core of the same version has.
    #[test]
    fn the_private_path_carries_the_crate_version() {
        let versioned = format!("__private_{}", env!("CARGO_PKG_VERSION").replace('.', "_"));
        assert_eq!(PRIVATE, versioned);
        let emitted = Root::default().private().to_string();
        assert_eq!(
            emitted.replace(' ', ""),
            format!("::counter_core::{versioned}")
        );
    }

    #[test]
    fn a_renamed_root() {
        let root = Root::parse(&syn::parse_quote!("my_app::deps::counters")).unwrap();
        assert_eq!(
            root.private().to_string().replace(' ', ""),
            format!("my_app::deps::counters::{PRIVATE}")
        );
        for bad in ["", "a b", "a::<T>", "1x", "a::"] {
            let lit = LitStr::new(bad, Span::call_site());
            assert!(Root::parse(&lit).is_err(), "{bad:?}");
        }
    }
}
