//! What the derives need to know about the SeaORM entity they are on: for
//! `SlottedCounter`, the owner table's name and its single primary key; for
//! both, whether the input is an entity's `Model` (or the `ModelEx` copy to
//! skip), whether sea-orm's derive makes an `Entity` of it (for a fallback
//! to implement a trait for), and which `Column` variant sea-orm gives a
//! field.

use heck::ToUpperCamelCase;
use proc_macro2::Span;
use syn::{
    Data, DeriveInput, Expr, ExprLit, Field, Fields, Ident, Lit, LitStr, Meta, Token, Type,
    ext::IdentExt, punctuated::Punctuated, spanned::Spanned,
};

use crate::{
    diagnostics::Errors,
    symbol::{ENUM_NAME, IGNORE, PRIMARY_KEY, SEA_ORM, Symbol, TABLE_NAME},
};

/// What the derive was put on.
pub(crate) enum Target {
    /// The `ModelEx` that `#[sea_orm::model]` copies our derive onto; the
    /// real work happens on `Model`.
    ModelEx,
    /// An entity's `Model` (fields it lacks have been reported as errors).
    Model(Box<EntityInfo>),
}

/// The facts about the owner entity.
pub(crate) struct EntityInfo {
    /// `#[sea_orm(table_name = "...")]`.
    pub table_name: Option<LitStr>,
    pub primary_key: Option<PrimaryKey>,
    /// Whether `DeriveEntityModel` generates an `Entity` from this `Model`
    /// (see [`has_entity`]).
    pub has_entity: bool,
}

/// The owner's single primary key.
pub(crate) struct PrimaryKey {
    /// The `Model` field.
    pub field: Ident,
    /// Its type, as written.
    pub ty: Type,
    pub owner: OwnerKind,
    /// The `Column` variant DeriveEntityModel generated for it.
    pub column: Ident,
}

/// The primary-key types counter-core stores as `owner_id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OwnerKind {
    I32,
    I64,
    Uuid,
    String,
}

/// The error of a derive put on anything but an entity's `Model`.
pub(crate) fn not_a_model(derive: &str) -> String {
    format!(
        "#[derive({derive})] goes on the `Model` struct of a SeaORM entity, beside \
         `DeriveEntityModel`: `#[derive(DeriveEntityModel, {derive})]`"
    )
}

pub(crate) fn read(input: &DeriveInput, errors: &mut Errors) -> Option<Target> {
    if is_model_ex(input) {
        return Some(Target::ModelEx);
    }
    let Some(fields) = model_fields(input) else {
        errors.at(input.ident.span(), not_a_model("SlottedCounter"));
        return None;
    };
    let table_name = table_name(input);
    if table_name.is_none() {
        errors.at(
            input.ident.span(),
            format!(
                "{}, with `#[{SEA_ORM}({TABLE_NAME} = \"...\")]`; this `Model` has no `{TABLE_NAME}`",
                not_a_model("SlottedCounter")
            ),
        );
    }
    Some(Target::Model(Box::new(EntityInfo {
        table_name,
        primary_key: primary_key(input.ident.span(), fields.iter(), errors),
        has_entity: has_entity(input),
    })))
}

/// Whether sea-orm's `DeriveEntityModel`, beside the derive, generates an
/// `Entity` (with its `Column`) from this input: a `Model` struct with named
/// fields and a `table_name` (without one it generates no `Entity`), every
/// field of which has a `Column` variant (it panics on one without). Only
/// then can a fallback implement a trait for `Entity` without an error of
/// its own; the derive cannot see whether `DeriveEntityModel` is there.
pub(crate) fn has_entity(input: &DeriveInput) -> bool {
    let Some(fields) = model_fields(input) else {
        return false;
    };
    table_name(input).is_some()
        && fields.iter().all(|f| {
            f.ident
                .as_ref()
                .is_some_and(|i| variant_ident(&i.unraw().to_string(), i.span()).is_some())
        })
}

/// Whether this is the `ModelEx` that `#[sea_orm::model]` copies the
/// entity's derives onto (the copy keeps the entity's `table_name`); derives
/// of this crate expand to nothing there, having done their work on `Model`.
pub(crate) fn is_model_ex(input: &DeriveInput) -> bool {
    input.ident == "ModelEx" && table_name(input).is_some()
}

/// The fields of an entity's `Model`: `None` if the input is not a struct
/// named `Model` with named fields.
pub(crate) fn model_fields(input: &DeriveInput) -> Option<&Punctuated<Field, Token![,]>> {
    match &input.data {
        Data::Struct(data) if input.ident == "Model" => match &data.fields {
            Fields::Named(named) => Some(&named.named),
            _ => None,
        },
        _ => None,
    }
}

/// The `Column` variant DeriveEntityModel generates for a field, spanned at
/// `span`: its `enum_name`, or the field's name (without `r#`) in
/// UpperCamelCase. A name with no such form (`_1` would be `1`) is an error
/// at `span`, where a panic would be a useless message.
pub(crate) fn column_ident(
    field: &Ident,
    attrs: &[syn::Attribute],
    span: Span,
) -> syn::Result<Ident> {
    if let Some(mut ident) =
        sea_orm_str(attrs, ENUM_NAME).and_then(|name| name.parse::<Ident>().ok())
    {
        ident.set_span(span);
        return Ok(ident);
    }
    let name = field.unraw().to_string();
    variant_ident(&name, span).ok_or_else(|| {
        syn::Error::new(
            span,
            format!(
                "the field `{name}` has no `Column` variant: sea-orm names it in UpperCamelCase, \
                 and `{name}` has none that is an identifier; rename the field"
            ),
        )
    })
}

/// Whether a field is `#[sea_orm(ignore)]`: sea-orm gives it no column.
pub(crate) fn is_ignored(attrs: &[syn::Attribute]) -> bool {
    sea_orm_metas(attrs).any(|meta| matches!(meta, Meta::Path(path) if path == IGNORE))
}

fn table_name(input: &DeriveInput) -> Option<LitStr> {
    sea_orm_str(&input.attrs, TABLE_NAME)
}

/// The string of `#[sea_orm(name = "...")]`, if set.
fn sea_orm_str(attrs: &[syn::Attribute], name: Symbol) -> Option<LitStr> {
    sea_orm_metas(attrs).find_map(|meta| match meta {
        Meta::NameValue(nv) if nv.path == name => match nv.value {
            Expr::Lit(ExprLit {
                lit: Lit::Str(value),
                ..
            }) => Some(value),
            _ => None,
        },
        _ => None,
    })
}

fn primary_key<'a>(
    model: Span,
    fields: impl Iterator<Item = &'a Field>,
    errors: &mut Errors,
) -> Option<PrimaryKey> {
    let keys: Vec<&Field> = fields
        .filter(|f| sea_orm_metas(&f.attrs).any(|m| *m.path() == PRIMARY_KEY))
        .collect();
    let [field] = keys.as_slice() else {
        if keys.is_empty() {
            errors.at(
                model,
                format!(
                    "#[derive(SlottedCounter)] needs a `#[{SEA_ORM}({PRIMARY_KEY})]` field: it \
                     becomes the counters' `owner_id`"
                ),
            );
        } else {
            let names: Vec<String> = keys
                .iter()
                .filter_map(|f| f.ident.as_ref().map(|i| format!("`{}`", i.unraw())))
                .collect();
            let second = keys[1].ident.as_ref().map_or(keys[1].span(), |i| i.span());
            errors.at(
                second,
                format!(
                    "composite primary keys cannot own counters: `owner_id` is one column, and this \
                     `Model` has a primary key of {} fields ({})",
                    keys.len(),
                    names.join(", ")
                ),
            );
        }
        return None;
    };
    let ident = field.ident.clone()?;
    let Some(owner) = owner_kind(&field.ty) else {
        errors.at(
            field.ty.span(),
            "this primary key type cannot own counters: use i32, i64, Uuid or String",
        );
        return None;
    };
    let column = match column_ident(&ident, &field.attrs, ident.span()) {
        Ok(column) => column,
        Err(e) => {
            errors.push(e);
            return None;
        }
    };
    Some(PrimaryKey {
        field: ident,
        ty: field.ty.clone(),
        owner,
        column,
    })
}

/// Recognises the key type by its last path segment, as sea-orm's own
/// derive recognises column types; an alias is refused with a clear error.
pub(crate) fn owner_kind(ty: &Type) -> Option<OwnerKind> {
    let path = match ty {
        Type::Path(path) => path,
        // A type passed through a `macro_rules!` `$t:ty`, or parenthesised.
        Type::Group(group) => return owner_kind(&group.elem),
        Type::Paren(paren) => return owner_kind(&paren.elem),
        _ => return None,
    };
    let last = path.path.segments.last()?;
    if !last.arguments.is_none() {
        return None;
    }
    match last.ident.to_string().as_str() {
        "i32" => Some(OwnerKind::I32),
        "i64" => Some(OwnerKind::I64),
        "Uuid" => Some(OwnerKind::Uuid),
        "String" => Some(OwnerKind::String),
        _ => None,
    }
}

/// The items inside every `#[sea_orm(...)]` attribute. Attributes we cannot
/// parse are sea-orm's business, not ours, and are skipped.
fn sea_orm_metas(attrs: &[syn::Attribute]) -> impl Iterator<Item = Meta> + '_ {
    attrs
        .iter()
        .filter(|a| *a.path() == SEA_ORM)
        .filter_map(|a| {
            a.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)
                .ok()
        })
        .flatten()
}

/// The `Key` variant of a key, or the `Column` variant of a field, in
/// UpperCamelCase as sea-orm names columns, including its escape of `Self`;
/// `None` for a name whose UpperCamelCase is no identifier (`_1` is `1`).
pub(crate) fn variant_ident(name: &str, span: Span) -> Option<Ident> {
    let camel = match name.to_upper_camel_case() {
        camel if camel == "Self" => "Self_".to_owned(),
        camel => camel,
    };
    // syn rejects what `Ident::new` would panic on: no identifier, or a keyword.
    let mut ident = syn::parse_str::<Ident>(&camel).ok()?;
    ident.set_span(span);
    Some(ident)
}
