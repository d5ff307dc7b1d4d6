//! Reading `name = value` options, shared by `#[counter(...)]`,
//! `views(slots = 64)` and `#[counter_cache(...)]`, so that the grammars
//! treat an unknown, repeated or valueless option the same way, and
//! `crate = "..."` alike.

use syn::{
    Expr, ExprLit, Lit, LitStr, Path, Token, ext::IdentExt, meta::ParseNestedMeta, spanned::Spanned,
};

use crate::{
    diagnostics::{Errors, unknown},
    root::Root,
    symbol::{self, CRATE, Symbol},
};

/// The options one attribute (or one list) accepts, and which of them it
/// has written so far.
pub(crate) struct Options {
    /// What an option is called in errors: "option", "key option".
    what: &'static str,
    known: &'static [Symbol],
    written: Vec<Symbol>,
}

impl Options {
    pub(crate) fn new(what: &'static str, known: &'static [Symbol]) -> Self {
        Self {
            what,
            known,
            written: Vec::new(),
        }
    }

    /// The option `meta` is, the first time it is written. An unknown
    /// option (reported with the closest known name, each time it is
    /// written) and a repeated known one (reported as a duplicate) are
    /// skipped with their value, so that parsing goes on to the next option
    /// and its errors are reported too: then this is `None`.
    pub(crate) fn next(
        &mut self,
        meta: &ParseNestedMeta,
        errors: &mut Errors,
    ) -> syn::Result<Option<Symbol>> {
        let name = path_string(&meta.path);
        let Some(&option) = self.known.iter().find(|k| k.as_str() == name) else {
            errors.at(
                meta.path.span(),
                unknown(self.what, &name, &symbol::names(self.known)),
            );
            skip_value(meta)?;
            return Ok(None);
        };
        if self.wrote(option) {
            errors.at(
                meta.path.span(),
                format!("duplicate {} `{name}`", self.what),
            );
            skip_value(meta)?;
            return Ok(None);
        }
        self.written.push(option);
        Ok(Some(option))
    }

    /// Whether `option` was written, validly or not: a required option that
    /// was written wrongly has been reported already, and is not missing.
    pub(crate) fn wrote(&self, option: Symbol) -> bool {
        self.written.contains(&option)
    }

    /// The known options written, validly or not, in order.
    pub(crate) fn written(&self) -> &[Symbol] {
        &self.written
    }
}

/// A path as written, without `r#`, for messages and comparisons:
/// `super::post::Entity`, `keys`.
pub(crate) fn path_string(path: &Path) -> String {
    let segments: Vec<String> = path
        .segments
        .iter()
        .map(|s| s.ident.unraw().to_string())
        .collect();
    let root = if path.leading_colon.is_some() {
        "::"
    } else {
        ""
    };
    format!("{root}{}", segments.join("::"))
}

/// The value of `name = value`; an option written without one is reported
/// (with `example`) and skipped.
pub(crate) fn option_value(
    meta: &ParseNestedMeta,
    example: &str,
    errors: &mut Errors,
) -> syn::Result<Option<Expr>> {
    if meta.input.peek(Token![=]) {
        return Ok(Some(meta.value()?.parse()?));
    }
    errors.at(
        meta.path.span(),
        format!("`{}` takes a value: {example}", path_string(&meta.path)),
    );
    skip_value(meta)?;
    Ok(None)
}

/// Consumes whatever follows an option we reject (`= value` or `(...)`), so
/// parsing goes on to the next option and its errors are reported too.
pub(crate) fn skip_value(meta: &ParseNestedMeta) -> syn::Result<()> {
    if meta.input.peek(Token![=]) {
        meta.value()?.parse::<Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        let content;
        syn::parenthesized!(content in meta.input);
        content.parse::<proc_macro2::TokenStream>()?;
    }
    Ok(())
}

/// `crate = "path"`: the path counter-core is reached by, for a renamed
/// dependency: a string literal holding a path, as serde's `crate`.
pub(crate) fn parse_crate(
    meta: &ParseNestedMeta,
    errors: &mut Errors,
) -> syn::Result<Option<Root>> {
    let example = format!("`{CRATE} = \"my_counters\"`");
    let Some(lit) = string_value(meta, &example, errors)? else {
        return Ok(None);
    };
    match Root::parse(&lit) {
        Ok(root) if root.is_relative_to_module() => {
            errors.at(
                lit.span(),
                format!(
                    "`{CRATE}` is read from the generated `counters` module too, where {:?} \
                     would name another path: write it from the crate root (`crate::...`) or \
                     from the dependency's name",
                    lit.value()
                ),
            );
            Ok(None)
        }
        Ok(root) => Ok(Some(root)),
        Err(_) => {
            errors.at(
                lit.span(),
                format!(
                    "`{CRATE}` is the path of counter-core, as in {example} for the \
                     dependency renamed `my_counters`; {:?} is no path",
                    lit.value()
                ),
            );
            Ok(None)
        }
    }
}

/// The string literal of `name = "..."`; an option written without a value,
/// or with one that is not a string literal, is reported (with `example`).
pub(crate) fn string_value(
    meta: &ParseNestedMeta,
    example: &str,
    errors: &mut Errors,
) -> syn::Result<Option<LitStr>> {
    let Some(expr) = option_value(meta, example, errors)? else {
        return Ok(None);
    };
    let Expr::Lit(ExprLit {
        lit: Lit::Str(value),
        ..
    }) = expr
    else {
        errors.at(
            expr.span(),
            format!(
                "`{}` takes a string literal: {example}",
                path_string(&meta.path)
            ),
        );
        return Ok(None);
    };
    Ok(Some(value))
}
