//! A membership table `(owner_id BIGINT, member BIGINT, PRIMARY KEY
//! (owner_id, member))`: what a unique key replaces, as unique-bench and
//! limits compare it.

use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend,
    sea_query::{Alias, ColumnDef, Expr, Index, OnConflict, Query, Table},
};

use crate::BoxError;

/// Creates the membership table `table`.
pub async fn create(db: &DatabaseConnection, table: &str) -> Result<(), BoxError> {
    let create = Table::create()
        .table(Alias::new(table))
        .col(
            ColumnDef::new(Alias::new("owner_id"))
                .big_integer()
                .not_null(),
        )
        .col(
            ColumnDef::new(Alias::new("member"))
                .big_integer()
                .not_null(),
        )
        .primary_key(
            Index::create()
                .col(Alias::new("owner_id"))
                .col(Alias::new("member")),
        )
        .to_owned();
    db.execute(&create).await?;
    Ok(())
}

/// Drops `table` if it exists (errors ignored: a bench's cleanup).
pub async fn drop(db: &DatabaseConnection, table: &str) {
    let drop = Table::drop()
        .table(Alias::new(table))
        .if_exists()
        .to_owned();
    let _ = db.execute(&drop).await;
}

/// `INSERT .. ON CONFLICT DO NOTHING` of one membership (MySQL: `ON
/// DUPLICATE KEY UPDATE member = member`), autocommit.
pub async fn insert(
    db: &DatabaseConnection,
    table: &str,
    owner: i64,
    member: i64,
) -> Result<(), BoxError> {
    let columns = [Alias::new("owner_id"), Alias::new("member")];
    let mut on_conflict = OnConflict::columns(columns.clone());
    match db.get_database_backend() {
        DbBackend::MySql => {
            on_conflict.value(Alias::new("member"), Expr::col(Alias::new("member")))
        }
        _ => on_conflict.do_nothing(),
    };
    let insert = Query::insert()
        .into_table(Alias::new(table))
        .columns(columns)
        .values_panic([owner.into(), member.into()])
        .on_conflict(on_conflict)
        .to_owned();
    db.execute(&insert).await?;
    Ok(())
}
