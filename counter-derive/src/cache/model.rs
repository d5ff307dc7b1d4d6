//! The validated model of one `#[derive(CounterCache)]`: each cache with its
//! fields resolved against `Model` and its names derived as the other
//! derives derive them. Expansion starts from here and cannot fail.
//!
//! What only the compiler can check (that the parent has the key, that a
//! field has a type the cache can read) is left to it: the expansion gives
//! those tokens the user's spans, so its errors point at the attribute.

use proc_macro2::Span;
use syn::{DeriveInput, Field, Ident, Path, ext::IdentExt};

use super::attr::{self, CacheAttr};
use crate::{
    counter::model::field_ident,
    diagnostics::{Checked, Errors, unknown},
    entity::{self, column_ident, is_ignored, not_a_model},
    options::path_string,
    root::Root,
    symbol::{COUNTER_CACHE, CRATE, KEY, PARENT, VIA},
};

pub(crate) struct CacheModel {
    /// The path to counter-core.
    pub root: Root,
    /// In declaration order.
    pub caches: Vec<Cache>,
    /// Every field a cache reads, once, in the order caches name them.
    pub columns: Vec<FieldRef>,
}

/// One `#[counter_cache(...)]`.
pub(crate) struct Cache {
    /// The parent entity, as written (its last segment is `Entity`).
    pub parent: Path,
    /// The parent's stored key name.
    pub key: String,
    /// The parent's `counters::by_name` constant of the key, spanned at
    /// the user's key.
    pub key_ident: Ident,
    pub via: FieldRef,
    pub sum: Option<FieldRef>,
    /// The flag field and the value that counts.
    pub when: Option<(FieldRef, bool)>,
}

/// A field of `Model` that an option names.
#[derive(Clone)]
pub(crate) struct FieldRef {
    /// The field as declared (raw if it is a keyword), spanned at the
    /// user's mention of it.
    pub field: Ident,
    /// Its `Column` variant, spanned the same way.
    pub column: Ident,
}

impl FieldRef {
    pub(crate) fn span(&self) -> Span {
        self.field.span()
    }
}

/// What parsed of a derive that has errors: the stand-in impl needs only
/// the path to counter-core.
pub(crate) struct Fallback {
    pub root: Root,
}

fn no_cache() -> String {
    format!(
        "#[derive(CounterCache)] needs a cache: add \
         `#[{COUNTER_CACHE}({PARENT} = super::post::Entity, {KEY} = comments, {VIA} = post_id)]`, \
         one attribute per cache"
    )
}

/// Reads and checks everything. Every problem found is in the error, not
/// only the first; with it, a fallback when the input is an entity's `Model`.
pub(crate) fn build(input: &DeriveInput) -> Checked<CacheModel, Fallback> {
    if entity::is_model_ex(input) {
        return Checked::Skip;
    }
    let mut errors = Errors::default();
    let fields = entity::model_fields(input);
    let resolver = match fields {
        Some(fields) => Resolver::Fields(fields.iter().collect()),
        None => {
            // Adding a cache would not help: the derive is in the wrong place.
            errors.at(input.ident.span(), not_a_model("CounterCache"));
            Resolver::NotAModel
        }
    };
    let read = read_caches(&input.attrs, &resolver, &mut errors);
    if fields.is_some() && !read.any_cache {
        errors.at(input.ident.span(), no_cache());
    }
    match errors.finish() {
        Ok(()) => Checked::Valid(read.into_model()),
        Err(errors) => {
            let fallback = entity::has_entity(input).then_some(Fallback { root: read.root });
            Checked::Invalid(errors, fallback)
        }
    }
}

/// Reads the caches of `counter_cache!`, whose child entity the macro
/// cannot see: its fields are taken as written, and rustc reports one
/// the `Model` lacks, at the user's token.
pub(crate) fn build_declared(
    attrs: &[syn::Attribute],
    span: Span,
) -> Result<CacheModel, (syn::Error, Root)> {
    let mut errors = Errors::default();
    let read = read_caches(attrs, &Resolver::Unseen, &mut errors);
    if !read.any_cache {
        errors.at(span, no_cache());
    }
    match errors.finish() {
        Ok(()) => Ok(read.into_model()),
        Err(errors) => Err((errors, read.root)),
    }
}

/// What the `#[counter_cache]` attributes declared.
struct ReadCaches {
    root: Root,
    caches: Vec<Cache>,
    /// Whether any attribute declares a cache, valid or not.
    any_cache: bool,
}

impl ReadCaches {
    fn into_model(self) -> CacheModel {
        let mut columns: Vec<FieldRef> = Vec::new();
        for cache in &self.caches {
            let used = std::iter::once(&cache.via)
                .chain(&cache.sum)
                .chain(cache.when.as_ref().map(|(f, _)| f));
            for field in used {
                if !columns.iter().any(|c| c.column == field.column) {
                    columns.push(field.clone());
                }
            }
        }
        CacheModel {
            root: self.root,
            caches: self.caches,
            columns,
        }
    }
}

fn read_caches(attrs: &[syn::Attribute], resolver: &Resolver, errors: &mut Errors) -> ReadCaches {
    let mut caches: Vec<Cache> = Vec::new();
    // `crate = "..."`, written once for every cache.
    let mut root: Option<Root> = None;
    let mut root_written = false;
    let mut any_cache = false;
    // Every (parent, key) declared, valid or not, for the duplicate check.
    let mut declared: Vec<(String, String)> = Vec::new();
    for attr in attrs.iter().filter(|a| attr::is_cache(a)) {
        let cache = attr::parse(attr, errors);
        if let Some(span) = cache.root_span {
            if root_written {
                errors.at(
                    span,
                    format!(
                        "duplicate option `{CRATE}`: counter-core's path is written once, \
                         for every cache"
                    ),
                );
            } else {
                root_written = true;
                root = cache.root.clone();
            }
        }
        if !cache.declares_cache() {
            continue;
        }
        any_cache = true;
        // Fields are resolved, and missing options reported, even when the
        // attribute has other errors: one build shows them all.
        let via = resolver.resolve(cache.via.as_ref(), errors);
        let sum = resolver.resolve(cache.sum.as_ref(), errors);
        let when = cache.when.as_ref().and_then(|w| {
            let field = resolver.resolve(Some(&w.field), errors)?;
            Some((field, w.expected))
        });
        report_missing(&cache, errors);
        let (Some(parent), Some(key)) = (cache.parent, cache.key) else {
            continue;
        };
        let name = key.unraw().to_string();
        let parent_name = path_string(&parent);
        if declared.contains(&(parent_name.clone(), name.clone())) {
            errors.at(
                key.span(),
                format!(
                    "duplicate cache: `{name}` of `{parent_name}` is already counted by an \
                     earlier #[{COUNTER_CACHE}]; a counter has one definition"
                ),
            );
            continue;
        }
        declared.push((parent_name, name.clone()));
        let Some(via) = via else { continue };
        if cache.sum.is_some() && sum.is_none() || cache.when.is_some() && when.is_none() {
            continue;
        }
        // Spanned at the user's key, so that rustc's error for a key the
        // parent lacks points there, offering the parent's similar key.
        let key_ident = field_ident(&name, key.span());
        caches.push(Cache {
            parent,
            key_ident,
            key: name,
            via,
            sum,
            when,
        });
    }
    ReadCaches {
        root: root.unwrap_or_default(),
        caches,
        any_cache,
    }
}

/// Required options the attribute did not write (one it wrote wrongly has
/// been reported already, and one behind a syntax error may be there).
fn report_missing(cache: &CacheAttr, errors: &mut Errors) {
    if cache.malformed {
        return;
    }
    let required = [
        (
            PARENT,
            format!("the parent entity, as in `{PARENT} = super::post::Entity`"),
        ),
        (
            KEY,
            format!("the parent's counter, as in `{KEY} = comments`"),
        ),
        (
            VIA,
            format!("the field holding the parent's id, as in `{VIA} = post_id`"),
        ),
    ];
    for (option, what) in required {
        if !cache.options.wrote(option) {
            errors.at(cache.span, format!("missing `{option}`: name {what}"));
        }
    }
}

/// Options name fields by their Rust name; the expansion needs the field as
/// declared (raw or not) and its `Column` variant, which may be renamed.
enum Resolver<'a> {
    /// The fields of the derive's `Model`.
    Fields(Vec<&'a Field>),
    /// The derive is not on a `Model` (reported already): no field is
    /// known, and none is reported unknown.
    NotAModel,
    /// `counter_cache!`, which cannot see the `Model`: a field is taken as
    /// written, with sea-orm's default `Column` variant.
    Unseen,
}

impl Resolver<'_> {
    /// The field `written` names, spanned at `written`; an unknown one is
    /// reported, with the closest field's name.
    fn resolve(&self, written: Option<&Ident>, errors: &mut Errors) -> Option<FieldRef> {
        let written = written?;
        let fields = match self {
            Resolver::Fields(fields) => fields,
            Resolver::NotAModel => return None,
            Resolver::Unseen => {
                return match column_ident(written, &[], written.span()) {
                    Ok(column) => Some(FieldRef {
                        field: written.clone(),
                        column,
                    }),
                    Err(e) => {
                        errors.push(e);
                        None
                    }
                };
            }
        };
        let name = written.unraw().to_string();
        let found = fields.iter().find_map(|f| {
            let ident = f.ident.as_ref()?;
            (ident.unraw() == name).then_some((ident, f.attrs.as_slice()))
        });
        let Some((ident, attrs)) = found else {
            let known: Vec<String> = fields
                .iter()
                .filter_map(|f| f.ident.as_ref().map(|i| i.unraw().to_string()))
                .collect();
            let known: Vec<&str> = known.iter().map(String::as_str).collect();
            errors.at(written.span(), unknown("field", &name, &known));
            return None;
        };
        if is_ignored(attrs) {
            errors.at(
                written.span(),
                format!(
                    "`{name}` is #[sea_orm(ignore)]: it has no column, so a counter cache \
                     cannot read it"
                ),
            );
            return None;
        }
        let column = match column_ident(ident, attrs, written.span()) {
            Ok(column) => column,
            Err(e) => {
                errors.push(e);
                return None;
            }
        };
        let mut field = ident.clone();
        field.set_span(written.span());
        Some(FieldRef { field, column })
    }
}
