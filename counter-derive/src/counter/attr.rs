//! The `#[counter(...)]` grammar: parsed, and each value checked where it
//! stands, so every error points at the user's own tokens.

use proc_macro2::Span;
use syn::{
    Attribute, Expr, ExprLit, Ident, Lit, LitStr, Token, ext::IdentExt, meta::ParseNestedMeta,
    spanned::Spanned,
};

use crate::{
    diagnostics::{Errors, unknown},
    entity::{OwnerKind, owner_kind},
    options::{Options, option_value, parse_crate, path_string, skip_value, string_value},
    root::Root,
    symbol::{
        ADAPTIVE, CASCADE, COUNTER, CRATE, KEYS, OWNER, OWNER_COLUMN, OWNER_ID, SLOT_STRATEGY,
        SLOTS, Symbol, TABLE, UNIQUE, WINDOW,
    },
};

/// Where a `#[counter(...)]` is written, which decides the options it takes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// On an entity's `Model`, which tells the owner.
    Derive,
    /// On a `counter_table!` module, which names the owner itself.
    Declaration,
}

impl Form {
    /// The options of the form, in the order of the docs, which is the
    /// order an unknown option's error lists them in when none is close
    /// enough to suggest.
    fn options(self) -> &'static [Symbol] {
        match self {
            Form::Derive => &[KEYS, SLOTS, TABLE, SLOT_STRATEGY, CASCADE, CRATE],
            Form::Declaration => &[
                OWNER,
                OWNER_ID,
                OWNER_COLUMN,
                KEYS,
                SLOTS,
                TABLE,
                SLOT_STRATEGY,
                CASCADE,
                CRATE,
            ],
        }
    }
}
/// The values of `slot_strategy = "..."`, counter-core's `SlotStrategy`.
const SLOT_STRATEGIES: &[(&str, SlotStrategy)] = &[
    ("rotating", SlotStrategy::Rotating),
    ("random", SlotStrategy::Random),
];
/// The options of one key, `views(slots = 64, window = day)`, `viewers(unique)`.
const KEY_OPTIONS: &[Symbol] = &[SLOTS, WINDOW, UNIQUE];
/// The values of `window = ...`, counter-core's `Window`.
const WINDOWS: &[(&str, Window)] = &[("hour", Window::Hour), ("day", Window::Day)];
/// The most slots a key may have (counter-core's `Slots::MAX`).
const MAX_SLOTS: u64 = 1024;
/// The longest key (counter-core's `limits::MAX_KEY_LEN`).
const MAX_KEY_LEN: usize = 64;
/// The longest table name (counter-core's `limits::MAX_TABLE_NAME_LEN`).
pub(crate) const MAX_TABLE_NAME_LEN: usize = 63;

/// Everything the `#[counter]` attributes of one struct said. Options
/// that were invalid are `None` (or left out, for keys), and have been
/// reported.
#[derive(Default)]
pub(crate) struct CounterAttr {
    /// Where the first `#[counter]` attribute is, for errors about what it lacks.
    pub span: Option<Span>,
    pub keys: Option<Vec<KeyAttr>>,
    pub slots: Option<SlotCount>,
    pub table: Option<LitStr>,
    pub slot_strategy: Option<SlotStrategy>,
    pub cascade: bool,
    /// `crate = "..."`.
    pub root: Option<Root>,
    /// `owner = "notes"` ([`Form::Declaration`] only).
    pub owner: Option<LitStr>,
    /// `owner_column = "id"` ([`Form::Declaration`] only).
    pub owner_column: Option<LitStr>,
    /// `owner_id = i32` ([`Form::Declaration`] only).
    pub owner_id: Option<OwnerKind>,
    /// Every option written, valid or not: a missing option is reported
    /// only if it is not there at all.
    pub written: Vec<Symbol>,
}

/// `slot_strategy = "..."`: counter-core's `SlotStrategy` variant of that name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlotStrategy {
    Rotating,
    Random,
}

/// `slots = 64` or `slots = adaptive(1..=256)`: counter-core's
/// `SlotPolicy`, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlotCount {
    Fixed(u16),
    Adaptive(u16, u16),
}

impl std::fmt::Display for SlotCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Fixed(n) => write!(f, "{n}"),
            Self::Adaptive(min, max) => write!(f, "{ADAPTIVE}({min}..={max})"),
        }
    }
}

/// `window = hour` or `day`: counter-core's `Window` variant of that name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Window {
    Hour,
    Day,
}

/// One declared key, `likes` or `views(slots = 64, window = day)`.
pub(crate) struct KeyAttr {
    /// As written (its span is the user's).
    pub ident: Ident,
    /// The stored name: the identifier without `r#`.
    pub name: String,
    pub options: KeyOptions,
}

/// What a key's parentheses said.
#[derive(Default)]
pub(crate) struct KeyOptions {
    pub slots: Option<SlotCount>,
    pub window: Option<Window>,
    /// `unique`: the key counts distinct members, not deltas.
    pub unique: bool,
}

/// Parses every `#[counter]` attribute. Errors are collected, not returned,
/// so that one build reports all of them.
pub(crate) fn parse(attrs: &[Attribute], form: Form, errors: &mut Errors) -> CounterAttr {
    let mut out = CounterAttr::default();
    // Shared by every `#[counter]` of the struct: an option is set once in all.
    let mut options = Options::new("option", form.options());
    for attr in attrs.iter().filter(|a| *a.path() == COUNTER) {
        out.span.get_or_insert(attr.path().span());
        let result = attr.parse_nested_meta(|meta| {
            match options.next(&meta, errors)? {
                Some(KEYS) => parse_keys(&meta, out.keys.insert(Vec::new()), errors)?,
                Some(SLOTS) => out.slots = parse_slots(&meta, errors)?,
                Some(TABLE) => out.table = parse_table(&meta, errors)?,
                Some(SLOT_STRATEGY) => out.slot_strategy = parse_slot_strategy(&meta, errors)?,
                Some(CASCADE) => out.cascade = parse_flag(&meta, errors)?,
                Some(CRATE) => out.root = parse_crate(&meta, errors)?,
                Some(OWNER) => {
                    let example = format!("`{OWNER} = \"posts\"`");
                    out.owner = parse_name(&meta, "table name", &example, errors)?;
                }
                Some(OWNER_COLUMN) => {
                    let example = format!("`{OWNER_COLUMN} = \"id\"`");
                    out.owner_column = parse_name(&meta, "column name", &example, errors)?;
                }
                Some(OWNER_ID) => out.owner_id = parse_owner_id(&meta, errors)?,
                // Reported and skipped; the form has no other name.
                _ => {}
            }
            Ok(())
        });
        if let Err(e) = result {
            errors.push(e);
        }
    }
    out.written = options.written().to_vec();
    out
}

/// `keys(likes, views(slots = 64))`, into `keys`. Keys with an invalid name
/// are reported and left out, so nothing downstream has to cope with them.
fn parse_keys(
    meta: &ParseNestedMeta,
    keys: &mut Vec<KeyAttr>,
    errors: &mut Errors,
) -> syn::Result<()> {
    if !meta.input.peek(syn::token::Paren) {
        errors.at(
            meta.path.span(),
            format!(
                "`{KEYS}` lists the counters in parentheses: `{KEYS}(likes, views({SLOTS} = 64))`"
            ),
        );
        return skip_value(meta);
    }
    let mut written = 0;
    meta.parse_nested_meta(|key| {
        written += 1;
        let Some(ident) = key.path.get_ident().cloned() else {
            errors.at(
                key.path.span(),
                "a key is a single identifier, like `likes`",
            );
            return skip_value(&key);
        };
        let name = ident.unraw().to_string();
        let options = parse_key_options(&key, &name, errors)?;
        if let Some(problem) = key_name_problem(&name) {
            errors.at(ident.span(), format!("invalid key `{name}`: {problem}"));
        } else if keys.iter().any(|k| k.name == name) {
            errors.at(ident.span(), format!("duplicate key `{name}`"));
        } else {
            keys.push(KeyAttr {
                ident,
                name,
                options,
            });
        }
        Ok(())
    })?;
    if written == 0 {
        errors.at(
            meta.path.span(),
            format!("`{KEYS}(...)` needs at least one key"),
        );
    }
    Ok(())
}

/// The options of one key: `(slots = 64, window = day)`.
fn parse_key_options(
    key: &ParseNestedMeta,
    name: &str,
    errors: &mut Errors,
) -> syn::Result<KeyOptions> {
    let mut out = KeyOptions::default();
    if key.input.peek(Token![=]) {
        errors.at(
            key.path.span(),
            format!("options of a key go in parentheses: `{name}({SLOTS} = 64)`"),
        );
        skip_value(key)?;
    } else if key.input.peek(syn::token::Paren) {
        let mut options = Options::new("key option", KEY_OPTIONS);
        key.parse_nested_meta(|option| {
            match options.next(&option, errors)? {
                Some(SLOTS) => out.slots = parse_slots(&option, errors)?,
                Some(WINDOW) => out.window = parse_window(&option, errors)?,
                Some(UNIQUE) => out.unique = parse_flag(&option, errors)?,
                // Reported and skipped; `KEY_OPTIONS` has no other name.
                _ => {}
            }
            Ok(())
        })?;
    }
    Ok(out)
}

/// A flag (`cascade`, `unique`): true, or false when it was given a value,
/// which is reported and skipped.
fn parse_flag(meta: &ParseNestedMeta, errors: &mut Errors) -> syn::Result<bool> {
    if meta.input.is_empty() || meta.input.peek(Token![,]) {
        return Ok(true);
    }
    errors.at(
        meta.path.span(),
        format!("`{}` is a flag and takes no value", path_string(&meta.path)),
    );
    skip_value(meta)?;
    Ok(false)
}

/// `window = day` or `window = hour` (a bare word, or the same in quotes).
fn parse_window(meta: &ParseNestedMeta, errors: &mut Errors) -> syn::Result<Option<Window>> {
    let Some(expr) = option_value(meta, &format!("`{WINDOW} = day`"), errors)? else {
        return Ok(None);
    };
    let written = match &expr {
        Expr::Path(path) => path.path.get_ident().map(|i| i.to_string()),
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Some(s.value()),
        _ => None,
    };
    let names: Vec<&str> = WINDOWS.iter().map(|&(name, _)| name).collect();
    let Some(written) = written else {
        errors.at(
            expr.span(),
            format!("`{WINDOW}` is one of `hour` or `day`, as in `views({WINDOW} = day)`"),
        );
        return Ok(None);
    };
    let window = WINDOWS
        .iter()
        .find(|(name, _)| *name == written)
        .map(|&(_, window)| window);
    if window.is_none() {
        errors.at(expr.span(), unknown(WINDOW.as_str(), &written, &names));
    }
    Ok(window)
}

/// `slots = N`, an integer literal in `1..=1024`, or `slots =
/// adaptive(MIN..=MAX)`, two such literals with `MIN <= MAX`.
fn parse_slots(meta: &ParseNestedMeta, errors: &mut Errors) -> syn::Result<Option<SlotCount>> {
    let example = format!("`{SLOTS} = 64` or `{SLOTS} = {ADAPTIVE}(1..=256)`");
    let Some(expr) = option_value(meta, &example, errors)? else {
        return Ok(None);
    };
    if let Expr::Call(call) = &expr
        && matches!(&*call.func, Expr::Path(p) if p.path == ADAPTIVE)
    {
        return Ok(parse_adaptive(call, errors));
    }
    let problem = match slot_count(&expr) {
        Ok(n) => return Ok(Some(SlotCount::Fixed(n))),
        Err(problem) => problem,
    };
    let message = match problem {
        SlotProblem::Zero => format!("{SLOTS} must be at least 1"),
        SlotProblem::TooMany(n) => format!("{n} {SLOTS} is too many: at most {MAX_SLOTS}"),
        SlotProblem::NotALiteral => format!(
            "{SLOTS} must be an integer literal from 1 to {MAX_SLOTS}, or `{ADAPTIVE}(1..=256)`"
        ),
    };
    errors.at(expr.span(), message);
    Ok(None)
}

/// Why an expression is not a slot count.
enum SlotProblem {
    Zero,
    TooMany(u64),
    NotALiteral,
}

/// An integer literal in `1..=1024`.
fn slot_count(expr: &Expr) -> Result<u16, SlotProblem> {
    let parsed = match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) => int.base10_parse::<u64>().ok(),
        _ => None,
    };
    match parsed {
        Some(0) => Err(SlotProblem::Zero),
        Some(n) if n <= MAX_SLOTS => Ok(n as u16),
        Some(n) => Err(SlotProblem::TooMany(n)),
        None => Err(SlotProblem::NotALiteral),
    }
}

/// `adaptive(MIN..=MAX)`.
fn parse_adaptive(call: &syn::ExprCall, errors: &mut Errors) -> Option<SlotCount> {
    let shape = format!("`{ADAPTIVE}` takes one range of slot counts: `{ADAPTIVE}(1..=256)`");
    let range = match (call.args.len(), call.args.first()) {
        (1, Some(Expr::Range(range))) => range,
        _ => {
            errors.at(call.span(), shape);
            return None;
        }
    };
    let (Some(start), Some(end), syn::RangeLimits::Closed(_)) =
        (&range.start, &range.end, range.limits)
    else {
        errors.at(range.span(), shape);
        return None;
    };
    let mut bound = |expr: &Expr| match slot_count(expr) {
        Ok(n) => Some(n),
        Err(SlotProblem::Zero) => {
            errors.at(expr.span(), format!("{SLOTS} must be at least 1"));
            None
        }
        Err(SlotProblem::TooMany(n)) => {
            errors.at(
                expr.span(),
                format!("{n} {SLOTS} is too many: at most {MAX_SLOTS}"),
            );
            None
        }
        Err(SlotProblem::NotALiteral) => {
            let message =
                format!("an adaptive range's ends are integer literals from 1 to {MAX_SLOTS}");
            errors.at(expr.span(), message);
            None
        }
    };
    let (min, max) = (bound(start)?, bound(end)?);
    if min > max {
        errors.at(
            range.span(),
            format!("an adaptive range starts at most at its end, not {min}..={max}"),
        );
        return None;
    }
    Some(SlotCount::Adaptive(min, max))
}

/// `table = "name"`: a string literal holding a valid table name.
fn parse_table(meta: &ParseNestedMeta, errors: &mut Errors) -> syn::Result<Option<LitStr>> {
    let example = format!("`{TABLE} = \"post_counters\"`");
    parse_name(meta, "table name", &example, errors)
}

/// A string literal holding an SQL name (a table's or a column's), valid
/// by counter-core's table-name rules.
fn parse_name(
    meta: &ParseNestedMeta,
    what: &str,
    example: &str,
    errors: &mut Errors,
) -> syn::Result<Option<LitStr>> {
    let Some(name) = string_value(meta, example, errors)? else {
        return Ok(None);
    };
    if let Some(problem) = table_name_problem(&name.value()) {
        errors.at(
            name.span(),
            format!("invalid {what} {:?}: {problem}", name.value()),
        );
        return Ok(None);
    }
    Ok(Some(name))
}

/// `owner_id = i32`: one of the types that can own counters.
fn parse_owner_id(meta: &ParseNestedMeta, errors: &mut Errors) -> syn::Result<Option<OwnerKind>> {
    let Some(expr) = option_value(meta, &format!("`{OWNER_ID} = i32`"), errors)? else {
        return Ok(None);
    };
    let kind = match &expr {
        Expr::Path(path) => owner_kind(&syn::Type::Path(syn::TypePath {
            qself: None,
            path: path.path.clone(),
        })),
        _ => None,
    };
    if kind.is_none() {
        errors.at(
            expr.span(),
            format!(
                "`{OWNER_ID}` is the owner's primary-key type: `i32`, `i64`, `Uuid` or `String`"
            ),
        );
    }
    Ok(kind)
}

/// `slot_strategy = "rotating"` or `"random"`: a string literal, as `table`.
fn parse_slot_strategy(
    meta: &ParseNestedMeta,
    errors: &mut Errors,
) -> syn::Result<Option<SlotStrategy>> {
    let example = format!("`{SLOT_STRATEGY} = \"random\"`");
    let Some(value) = string_value(meta, &example, errors)? else {
        return Ok(None);
    };
    let written = value.value();
    let strategy = SLOT_STRATEGIES
        .iter()
        .find(|(name, _)| *name == written)
        .map(|&(_, strategy)| strategy);
    if strategy.is_none() {
        let names: Vec<&str> = SLOT_STRATEGIES.iter().map(|&(name, _)| name).collect();
        errors.at(value.span(), unknown("slot strategy", &written, &names));
    }
    Ok(strategy)
}

/// Why a key name cannot be used, if it cannot. Keys become struct fields
/// and stored strings, so they are lowercase snake_case ASCII, which is also
/// inside counter-core's runtime key rules.
pub(crate) fn key_name_problem(name: &str) -> Option<&'static str> {
    if matches!(name, "self" | "super" | "crate") {
        Some("`self`, `super` and `crate` cannot name a struct field")
    } else if name.len() > MAX_KEY_LEN {
        Some("a key is at most 64 bytes long")
    } else if !name.starts_with(|c: char| c.is_ascii_lowercase())
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        Some("keys are lowercase snake_case ASCII identifiers, like `likes` or `downloads_v2`")
    } else {
        None
    }
}

/// Why a table name cannot be used, if it cannot: counter-core's
/// `validate_table_name` rules, checked here so a bad name fails the build.
pub(crate) fn table_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("a table name cannot be empty")
    } else if name.len() > MAX_TABLE_NAME_LEN {
        Some("a table name is at most 63 bytes long")
    } else if name.as_bytes()[0].is_ascii_digit() {
        Some("a table name cannot start with a digit")
    } else if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        Some("a table name may only contain ASCII letters, digits and '_'")
    } else if name.eq_ignore_ascii_case("excluded") {
        Some("`excluded` names the proposed row in upserts and cannot be a counter table")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_names() {
        for ok in ["likes", "downloads_v2", "a", &"k".repeat(64)] {
            assert_eq!(key_name_problem(ok), None, "{ok}");
        }
        for bad in [
            "Likes",
            "_x",
            "_",
            "_1",
            "likés",
            "self",
            "two__ok_but_Upper",
            &"k".repeat(65),
        ] {
            assert!(key_name_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn table_names() {
        assert_eq!(table_name_problem("post_counters"), None);
        for bad in ["", "1x", "a-b", "Excluded", &"t".repeat(64)] {
            assert!(table_name_problem(bad).is_some(), "{bad}");
        }
    }
}
