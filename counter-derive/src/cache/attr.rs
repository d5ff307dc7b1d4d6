//! The `#[counter_cache(...)]` grammar, one attribute per cache: parsed, and
//! each value checked where it stands, so every error points at the user's
//! own tokens. Whether the named fields exist is `model`'s business.

use proc_macro2::Span;
use syn::{
    Attribute, Expr, ExprPath, ExprUnary, Ident, Path, PathSegment, UnOp, ext::IdentExt,
    spanned::Spanned,
};

use crate::{
    attr::{key_name_problem, option_value, path_name, skip_value},
    diagnostics::{Errors, unknown},
};

/// The options of `#[counter_cache(...)]`.
const OPTIONS: &[&str] = &["parent", "key", "via", "sum", "when"];
/// The last segment of a `parent` path.
const ENTITY: &str = "Entity";
/// The other items a SeaORM entity module defines, which a `parent` path
/// may end in by mistake.
const ENTITY_ITEMS: &[&str] = &[
    "Model",
    "ModelEx",
    "ActiveModel",
    "ActiveModelEx",
    "Column",
    "PrimaryKey",
    "Relation",
];

/// One `#[counter_cache(...)]` attribute, as written. Options that were
/// missing or invalid are `None`, and have been reported.
pub(crate) struct CacheAttr {
    /// The attribute's `counter_cache`, for errors about what it lacks.
    pub span: Span,
    pub parent: Option<Path>,
    /// The parent's key, as written (its span is the user's).
    pub key: Option<Ident>,
    pub via: Option<Ident>,
    pub sum: Option<Ident>,
    pub when: Option<When>,
    /// Whether the attribute could not be read to its end: what it lacks is
    /// then not reported, as it may be behind the syntax error.
    pub malformed: bool,
    /// The options written, valid or not: a missing option is one not written.
    pub written: Vec<String>,
}

/// `when = published` or `when = !published`.
pub(crate) struct When {
    pub field: Ident,
    /// The value the field must hold for the row to count: `false` for `!field`.
    pub expected: bool,
}

impl CacheAttr {
    fn new(span: Span) -> Self {
        Self {
            span,
            parent: None,
            key: None,
            via: None,
            sum: None,
            when: None,
            malformed: false,
            written: Vec::new(),
        }
    }

    /// Whether the attribute wrote `option`, validly or not.
    pub(crate) fn wrote(&self, option: &str) -> bool {
        self.written.iter().any(|w| w == option)
    }
}

/// Whether `attr` is a `#[counter_cache(...)]`.
pub(crate) fn is_cache(attr: &Attribute) -> bool {
    attr.path().is_ident("counter_cache")
}

/// Parses one `#[counter_cache(...)]`. Errors are collected, not returned,
/// so that one build reports all of them.
pub(crate) fn parse(attr: &Attribute, errors: &mut Errors) -> CacheAttr {
    let mut out = CacheAttr::new(attr.path().span());
    let result = attr.parse_nested_meta(|meta| {
        let name = path_name(&meta);
        if out.wrote(&name) {
            errors.at(meta.path.span(), format!("duplicate option `{name}`"));
            return skip_value(&meta);
        }
        if OPTIONS.contains(&name.as_str()) {
            out.written.push(name.clone());
        }
        let example = match name.as_str() {
            "parent" => "`parent = super::post::Entity`",
            "key" => "`key = comments`",
            "via" => "`via = post_id`",
            "sum" => "`sum = amount`",
            "when" => "`when = published` or `when = !published`",
            _ => {
                errors.at(meta.path.span(), unknown("option", &name, OPTIONS));
                return skip_value(&meta);
            }
        };
        let Some(value) = option_value(&meta, example, errors)? else {
            return Ok(());
        };
        match name.as_str() {
            "parent" => out.parent = parent(value, errors),
            "key" => out.key = key(value, errors),
            "via" => out.via = field(&name, value, example, errors),
            "sum" => out.sum = field(&name, value, example, errors),
            _ => out.when = when(value, errors),
        }
        Ok(())
    });
    if let Err(e) = result {
        errors.push(e);
        out.malformed = true;
    }
    out
}

/// `parent = super::post::Entity`: a plain path whose last segment is `Entity`.
fn parent(value: Expr, errors: &mut Errors) -> Option<Path> {
    let Expr::Path(ExprPath {
        qself: None, path, ..
    }) = value
    else {
        errors.at(
            value.span(),
            "`parent` is the parent's entity type, a path like `super::post::Entity`",
        );
        return None;
    };
    let last = path.segments.last()?;
    if last.ident == ENTITY && last.arguments.is_none() {
        return Some(path);
    }
    let mut suggestion = path.clone();
    if ENTITY_ITEMS.contains(&last.ident.to_string().as_str()) {
        suggestion.segments.pop();
    }
    suggestion
        .segments
        .push(PathSegment::from(Ident::new(ENTITY, last.ident.span())));
    let suggestion = path_string(&suggestion);
    errors.at(
        last.ident.span(),
        format!(
            "`parent` names the parent's `Entity` (its `counters::Key` is found beside it): \
             did you mean `{suggestion}`?"
        ),
    );
    None
}

/// `key = comments`: a key the parent's `#[counter(keys(...))]` declares,
/// so it follows the same rules.
fn key(value: Expr, errors: &mut Errors) -> Option<Ident> {
    let ident = single_ident(&value).or_else(|| {
        errors.at(
            value.span(),
            "`key` is one of the parent's keys, as an identifier: `key = comments`",
        );
        None
    })?;
    let name = ident.unraw().to_string();
    if let Some(problem) = key_name_problem(&name) {
        errors.at(ident.span(), format!("invalid key `{name}`: {problem}"));
        return None;
    }
    Some(ident)
}

/// `via = post_id`, `sum = amount`: a field of `Model`, by name.
fn field(option: &str, value: Expr, example: &str, errors: &mut Errors) -> Option<Ident> {
    single_ident(&value).or_else(|| {
        errors.at(
            value.span(),
            format!("`{option}` names a field of `Model`: {example}"),
        );
        None
    })
}

/// `when = published` or `when = !published`.
fn when(value: Expr, errors: &mut Errors) -> Option<When> {
    let when = match &value {
        Expr::Unary(ExprUnary {
            op: UnOp::Not(_),
            expr,
            ..
        }) => single_ident(expr).map(|field| When {
            field,
            expected: false,
        }),
        _ => single_ident(&value).map(|field| When {
            field,
            expected: true,
        }),
    };
    if when.is_none() {
        errors.at(
            value.span(),
            "`when` names a `bool` field of `Model`, or its negation: \
             `when = published` or `when = !published`",
        );
    }
    when
}

/// The identifier an expression is, if it is a single one (`r#type` included).
fn single_ident(expr: &Expr) -> Option<Ident> {
    match expr {
        Expr::Path(ExprPath {
            qself: None,
            path,
            attrs,
        }) if attrs.is_empty() => path.get_ident().cloned(),
        Expr::Group(group) => single_ident(&group.expr),
        _ => None,
    }
}

/// A path as written, for messages and comparisons: `super::post::Entity`.
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
