//! The parent ids a child row carries, checked before the row is written.
//!
//! A parent id that its column cannot hold must be the caller's error
//! ([`CounterError::InvalidOwner`], kind `InvalidInput`: a handler answers
//! 400), not a database error after half a write. Where the bound is known
//! it is checked before any statement is sent: the rules of a string owner
//! id (see [`OwnerId`]'s `String` implementation: the companion table's
//! `owner_id` holds 255 characters, no NUL, no trailing space) and the
//! child column's declared length in the entity (`String(StringLen::N(n))`,
//! `Char(Some(n))`). A column made narrower than its entity says (a
//! hand-written migration) is only known to the database: its refusal is
//! recognised ([`refused`]) and typed the same way. Either way nothing is
//! written: the write's transaction rolls back.

use sea_orm::{
    ActiveModelTrait, ColumnTrait, ColumnType, DbErr, Iden, Value, sea_query::StringLen,
};

use super::CounterCache;
use crate::{CounterError, OwnerId, error::preview};

/// Checks every parent id `am` sets, of every declared cache.
pub(crate) fn check<E: CounterCache>(am: &E::ActiveModel) -> Result<(), CounterError> {
    for rule in E::cache_rules() {
        if let Some(Value::String(Some(id))) = am.get(rule.via).into_value() {
            id.clone().check()?;
            if let Some(max) = declared_length(&rule.via)
                && id.chars().nth(max).is_some()
            {
                return Err(CounterError::InvalidOwner {
                    owner: preview(&id),
                    reason: "a parent id is longer than the child column that holds it (its declared length)",
                });
            }
        }
    }
    Ok(())
}

/// The most characters the child column `via` holds, as the entity
/// declares it (`None`: no declared bound).
fn declared_length<C: ColumnTrait>(via: &C) -> Option<usize> {
    match via.def().get_column_type() {
        ColumnType::String(StringLen::N(n)) | ColumnType::Char(Some(n)) => usize::try_from(*n).ok(),
        _ => None,
    }
}

/// `err`, the database's refusal of a child write that sets the parent
/// ids of `rows`, as [`CounterError::InvalidOwner`] when it is a parent id
/// too long for its column (carried in the `DbErr`, see
/// `CounterError::into_db_err`); else `err` unchanged.
///
/// MySQL names the column ("Data too long for column 'post_slug'");
/// PostgreSQL names the type ("value too long for type character
/// varying(100)"), so there the refusal is a parent id's when one of them
/// is longer than that.
pub(crate) fn refused<'a, E: CounterCache>(
    err: DbErr,
    rows: impl IntoIterator<Item = &'a E::ActiveModel>,
) -> DbErr {
    let message = err.to_string();
    let mysql_column = message
        .split_once("Data too long for column '")
        .and_then(|(_, rest)| rest.split_once('\''))
        .map(|(column, _)| column.to_owned());
    let postgres_length = message
        .split_once("value too long for type character varying(")
        .or_else(|| message.split_once("value too long for type character("))
        .and_then(|(_, rest)| rest.split_once(')'))
        .and_then(|(n, _)| n.parse::<usize>().ok());
    if mysql_column.is_none() && postgres_length.is_none() {
        return err;
    }
    let rules = E::cache_rules();
    for am in rows {
        for rule in &rules {
            let Some(Value::String(Some(id))) = am.get(rule.via).into_value() else {
                continue;
            };
            let names_column = mysql_column
                .as_deref()
                .is_some_and(|column| column.eq_ignore_ascii_case(&rule.via.to_string()));
            let too_long = postgres_length.is_some_and(|max| id.chars().nth(max).is_some());
            if names_column || too_long {
                return CounterError::InvalidOwner {
                    owner: preview(&id),
                    reason: "a parent id is longer than the child column that holds it (the database refused it)",
                }
                .into_db_err();
            }
        }
    }
    err
}
