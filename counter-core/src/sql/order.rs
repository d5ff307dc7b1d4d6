//! The one order string owner ids are compared, grouped and walked in, on
//! the companion table and on every user column a recount reads.
//!
//! A user's column compares by its own collation: MySQL's default
//! `utf8mb4_general_ci` (and SeaORM's schema builder, which uses it) makes
//! `abc`, `ABC` and `Abc` one group, a PostgreSQL database in `en_US` sorts
//! `B` before `a`, a SQLite column may be `COLLATE NOCASE`. A recount that
//! grouped or bounded its batches by such a column would merge distinct
//! owners or walk the two sides of its snapshot in different orders. So
//! every comparison the crate makes on a user's owner column goes through
//! [`exact_owner`], which puts it in the companion table's collation:
//!
//! | backend | companion `owner_id` | a user's column, as compared |
//! |---|---|---|
//! | PostgreSQL | `COLLATE "C"` (byte order) | `CAST(col AS TEXT) COLLATE "C"` (`citext` too) |
//! | MySQL/MariaDB | `utf8mb4_bin` (code points, PAD SPACE) | `CONVERT(col USING utf8mb4) COLLATE utf8mb4_bin` |
//! | SQLite | `BINARY` (byte order) | `col COLLATE BINARY` |
//!
//! Integer and UUID owners compare alike everywhere and are left as they
//! are (so their indexes serve every batch). [`owner_order`] is the same
//! order in Rust: walks use it to prove each batch moved forward.

use std::cmp::Ordering;

use sea_orm::sea_query::Expr;

use super::Dialect;
use crate::owner::{OwnerColumn, OwnerId};

/// `owner`, a user's owner column or expression, compared in the companion
/// table's collation when owners are strings (see the module).
pub(crate) fn exact_owner(dialect: Dialect, column: OwnerColumn, owner: Expr) -> Expr {
    if column != OwnerColumn::String {
        return owner;
    }
    // sea-query's placeholder for the expression: `$1` on PostgreSQL, `?`
    // on the others.
    let template = match dialect {
        // As text first: `citext` compares case-insensitively under any
        // collation; varchar to text is free and keeps a "C" index usable.
        Dialect::Postgres => r#"(CAST($1 AS TEXT) COLLATE "C")"#,
        Dialect::MySql => "(CONVERT(? USING utf8mb4) COLLATE utf8mb4_bin)",
        Dialect::Sqlite => "(? COLLATE BINARY)",
    };
    Expr::cust_with_expr(template, owner)
}

/// How two owner ids compare in the database's order of the companion
/// table's `owner_id` column: `Ord` of the id, but for strings on MySQL,
/// whose `utf8mb4_bin` compares code points as if the shorter id were
/// padded with spaces (`"a\t"` sorts before `"a"` there, after it in Rust).
pub(crate) fn owner_order<I: OwnerId>(dialect: Dialect, a: &I, b: &I) -> Ordering {
    if dialect != Dialect::MySql || I::COLUMN != OwnerColumn::String {
        return a.cmp(b);
    }
    match (a.clone().into(), b.clone().into()) {
        (sea_orm::Value::String(Some(a)), sea_orm::Value::String(Some(b))) => pad_space_cmp(&a, &b),
        _ => a.cmp(b),
    }
}

/// Code-point order with the shorter string padded with spaces.
fn pad_space_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.chars(), b.chars());
    loop {
        match (a.next(), b.next()) {
            (None, None) => return Ordering::Equal,
            (x, y) => match x.unwrap_or(' ').cmp(&y.unwrap_or(' ')) {
                Ordering::Equal => {}
                unequal => return unequal,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mysql_strings_compare_padded_with_spaces() {
        let s = |v: &str| v.to_owned();
        assert_eq!(
            owner_order(Dialect::MySql, &s("a\t"), &s("a")),
            Ordering::Less
        );
        assert_eq!(
            owner_order(Dialect::Sqlite, &s("a\t"), &s("a")),
            Ordering::Greater
        );
        assert_eq!(
            owner_order(Dialect::MySql, &s("a"), &s("ab")),
            Ordering::Less
        );
        assert_eq!(
            owner_order(Dialect::MySql, &s("B"), &s("a")),
            Ordering::Less
        );
        assert_eq!(
            owner_order(Dialect::MySql, &s("é"), &s("e")),
            Ordering::Greater
        );
        assert_eq!(
            owner_order(Dialect::MySql, &s("x"), &s("x")),
            Ordering::Equal
        );
        assert_eq!(owner_order(Dialect::MySql, &2i64, &10i64), Ordering::Less);
    }

    #[test]
    fn only_string_owners_are_wrapped() {
        let built = |dialect: Dialect, column| {
            let mut select = sea_orm::sea_query::Query::select();
            select.expr(exact_owner(
                dialect,
                column,
                Expr::col(sea_orm::sea_query::Alias::new("post_id")),
            ));
            dialect.backend().build(&select).sql
        };
        assert_eq!(
            built(Dialect::MySql, OwnerColumn::BigInteger),
            "SELECT `post_id`"
        );
        assert_eq!(
            built(Dialect::MySql, OwnerColumn::String),
            "SELECT (CONVERT(`post_id` USING utf8mb4) COLLATE utf8mb4_bin)"
        );
        assert_eq!(
            built(Dialect::Postgres, OwnerColumn::String),
            r#"SELECT (CAST("post_id" AS TEXT) COLLATE "C")"#
        );
        assert_eq!(
            built(Dialect::Sqlite, OwnerColumn::String),
            r#"SELECT ("post_id" COLLATE BINARY)"#
        );
    }
}
