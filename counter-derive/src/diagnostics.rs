//! Collecting every error in the user's attributes, so one build shows them
//! all, and what a derive then makes of its input: a model to expand, or
//! the errors with a fallback for what did parse.

use proc_macro2::{Span, TokenStream};
use std::fmt::Display;

/// What the checks of one derive's input came to.
pub(crate) enum Checked<M, F> {
    /// Nothing to generate: the `ModelEx` copy of a dense-format entity.
    Skip,
    /// Everything checked: the model to expand.
    Valid(M),
    /// Every error found, and the fallback of what did parse: stand-ins
    /// for the generated items, so that the code using them compiles and
    /// the errors are the only ones the user sees. No fallback when the
    /// input is no entity's `Model` (there is no `Entity` to implement for).
    Invalid(syn::Error, Option<F>),
}

impl<M, F> Checked<M, F> {
    /// The derive's output: the expansion, or the errors and the fallback.
    pub(crate) fn expand(
        self,
        expand: impl FnOnce(&M) -> TokenStream,
        fallback: impl FnOnce(&F) -> TokenStream,
    ) -> TokenStream {
        match self {
            Checked::Skip => TokenStream::new(),
            Checked::Valid(model) => expand(&model),
            Checked::Invalid(errors, stand_in) => {
                let mut tokens = errors.to_compile_error();
                if let Some(stand_in) = stand_in {
                    tokens.extend(fallback(&stand_in));
                }
                tokens
            }
        }
    }
}

/// The errors found so far; each keeps the span of the tokens it is about.
#[derive(Default)]
pub(crate) struct Errors {
    errors: Vec<syn::Error>,
}

impl Errors {
    pub(crate) fn push(&mut self, error: syn::Error) {
        self.errors.push(error);
    }

    pub(crate) fn at(&mut self, span: Span, message: impl Display) {
        self.push(syn::Error::new(span, message));
    }

    /// All errors as one; `otherwise` only if none was recorded, which the
    /// caller believes cannot happen.
    pub(crate) fn into_error(self, otherwise: impl FnOnce() -> syn::Error) -> syn::Error {
        self.finish().err().unwrap_or_else(otherwise)
    }

    /// All errors as one, or `Ok` if there were none.
    pub(crate) fn finish(self) -> syn::Result<()> {
        let mut errors = self.errors.into_iter();
        let Some(mut first) = errors.next() else {
            return Ok(());
        };
        first.extend(errors);
        Err(first)
    }
}

/// The known word closest to a misspelt one, if any is close enough to be
/// what was meant.
pub(crate) fn closest<'a>(word: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (strsim::jaro_winkler(word, k), *k))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| k)
}

/// "unknown option `x`", with a suggestion or the list of valid options.
pub(crate) fn unknown(what: &str, word: &str, known: &[&str]) -> String {
    match closest(word, known) {
        Some(k) => format!("unknown {what} `{word}`; did you mean `{k}`?"),
        None => format!(
            "unknown {what} `{word}`; expected one of: {}",
            known
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_only_close_words() {
        let known = ["keys", "slots", "table", "cascade"];
        assert_eq!(closest("slot", &known), Some("slots"));
        assert_eq!(closest("key", &known), Some("keys"));
        assert_eq!(closest("tabel", &known), Some("table"));
        assert_eq!(closest("zzz", &known), None);
        assert!(unknown("option", "zzz", &known).contains("`keys`, `slots`"));
    }
}
