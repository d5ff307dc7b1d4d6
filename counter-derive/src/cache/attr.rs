//! The `#[counter_cache(...)]` grammar, one attribute per cache: parsed, and
//! each value checked where it stands, so every error points at the user's
//! own tokens. Whether the named fields exist is `model`'s business.

use proc_macro2::Span;
use syn::{
    Attribute, Expr, ExprPath, ExprUnary, Ident, Path, PathArguments, PathSegment, UnOp,
    ext::IdentExt, spanned::Spanned,
};

use crate::{
    counter::attr::key_name_problem,
    diagnostics::Errors,
    options::{Options, option_value, parse_crate, path_string},
    root::Root,
    symbol::{COUNTER_CACHE, CRATE, KEY, PARENT, SUM, Symbol, VIA, WHEN},
};

/// Listed in the order of the docs, which is the order an unknown option's
/// error lists them in when none is close enough to suggest.
const OPTIONS: &[Symbol] = &[PARENT, KEY, VIA, SUM, WHEN, CRATE];
/// The last segment of a `parent` path.
const ENTITY: &str = "Entity";
/// Why `parent` is written as it is, for each error about it.
fn parent_is_entity() -> String {
    format!(
        "`{PARENT}` must be a path ending in `{ENTITY}`, the parent's entity type in the module \
         beside the `counters::Key` its #[derive(SlottedCounter)] generated"
    )
}
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
    /// `crate = "..."`, valid, and where `crate` is written, valid or not.
    pub root: Option<Root>,
    pub root_span: Option<Span>,
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
    pub options: Options,
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
            root: None,
            root_span: None,
            parent: None,
            key: None,
            via: None,
            sum: None,
            when: None,
            malformed: false,
            options: Options::new("option", OPTIONS),
        }
    }
}

impl CacheAttr {
    /// Whether the attribute declares a cache: anything but `crate` alone,
    /// which is counter-core's path for every cache (`#[counter_cache(crate
    /// = "...")]`), is one, complete or not.
    pub(crate) fn declares_cache(&self) -> bool {
        self.malformed || self.options.written() != [CRATE]
    }
}

/// The derive sees every attribute on the struct; `sea_orm`'s and the
/// user's others are not ours to read.
pub(crate) fn is_cache(attr: &Attribute) -> bool {
    *attr.path() == COUNTER_CACHE
}

/// Parses one `#[counter_cache(...)]`. Errors are collected, not returned,
/// so that one build reports all of them.
pub(crate) fn parse(attr: &Attribute, errors: &mut Errors) -> CacheAttr {
    let mut out = CacheAttr::new(attr.path().span());
    let result = attr.parse_nested_meta(|meta| {
        let Some(option) = out.options.next(&meta, errors)? else {
            return Ok(());
        };
        if option == CRATE {
            out.root_span = Some(meta.path.span());
            out.root = parse_crate(&meta, errors)?;
            return Ok(());
        }
        let example = match option {
            PARENT => format!("`{PARENT} = super::post::Entity`"),
            KEY => format!("`{KEY} = comments`"),
            VIA => format!("`{VIA} = post_id`"),
            SUM => format!("`{SUM} = amount`"),
            _ => format!("`{WHEN} = published` or `{WHEN} = !published`"),
        };
        let Some(value) = option_value(&meta, &example, errors)? else {
            return Ok(());
        };
        match option {
            PARENT => out.parent = parent(value, errors),
            KEY => out.key = key(value, errors),
            VIA => out.via = field(option, value, &example, errors),
            SUM => out.sum = field(option, value, &example, errors),
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

/// `parent = super::post::Entity`: a plain path whose last segment is
/// `Entity`. The expansion reaches the parent's `counters::Key` by putting
/// `counters::Key` in place of that segment, so the path is all it can
/// follow: not an alias, not generic arguments.
fn parent(value: Expr, errors: &mut Errors) -> Option<Path> {
    let Expr::Path(ExprPath {
        qself: None, path, ..
    }) = value
    else {
        errors.at(
            value.span(),
            format!("{}, like `super::post::Entity`", parent_is_entity()),
        );
        return None;
    };
    let last = path.segments.last()?;
    // What the user most likely meant, without generic arguments.
    let mut suggestion = path.clone();
    for segment in &mut suggestion.segments {
        segment.arguments = PathArguments::None;
    }
    if last.ident == ENTITY {
        let Some(generic) = path.segments.iter().find(|s| !s.arguments.is_none()) else {
            return Some(path);
        };
        errors.at(
            generic.arguments.span(),
            format!(
                "`{PARENT}` takes no generic arguments: an entity type has none, and its \
                 `counters::Key` is found by the path alone; did you mean `{}`?",
                path_string(&suggestion)
            ),
        );
        return None;
    }
    let name = last.ident.unraw().to_string();
    let is_item = ENTITY_ITEMS.contains(&name.as_str());
    if !is_item && name.starts_with(|c: char| c.is_uppercase()) {
        // A type, not a module: most likely an alias of the parent's
        // `Entity`, whose module cannot be told from its name.
        errors.at(
            last.ident.span(),
            format!(
                "{}; `{name}` may be an alias of it, but an alias cannot be \
                 followed to that module: write the path of the parent's module, as in \
                 `super::post::Entity`",
                parent_is_entity()
            ),
        );
        return None;
    }
    if is_item {
        suggestion.segments.pop();
    }
    suggestion
        .segments
        .push(PathSegment::from(Ident::new(ENTITY, last.ident.span())));
    errors.at(
        last.ident.span(),
        format!(
            "{}: did you mean `{}`?",
            parent_is_entity(),
            path_string(&suggestion)
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
            format!("`{KEY}` is one of the parent's keys, as an identifier: `{KEY} = comments`"),
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

/// `via = post_id`, `sum = amount`. Only the name is read here: whether
/// `Model` has the field is checked once all of `Model` is known, and its
/// type by rustc, in the expansion.
fn field(option: Symbol, value: Expr, example: &str, errors: &mut Errors) -> Option<Ident> {
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
            format!(
                "`{WHEN}` names a `bool` field of `Model`, or its negation: \
                 `{WHEN} = published` or `{WHEN} = !published`"
            ),
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
