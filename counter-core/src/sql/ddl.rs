//! Creating and dropping a companion table.

use sea_orm::{
    Statement,
    sea_query::{Alias, ColumnDef, ForeignKey, ForeignKeyAction, Index, Table},
};

use super::{Dialect, col};
use crate::{owner::OwnerColumn, table::CounterTable};

/// `CREATE TABLE IF NOT EXISTS t (owner_id, count_key, slot, value, PRIMARY KEY (owner_id, count_key, slot))`.
///
/// No surrogate id (every conflicting upsert would burn a sequence value), no
/// index on `value` (PostgreSQL updates stay HOT), and no foreign key unless
/// the table opted into [`CounterTable::with_cascade`] (on InnoDB the check
/// share-locks the owner row and brings some contention back).
/// On MySQL the string columns compare byte-wise (`_bin` collations), so keys
/// and string owner ids are case-sensitive and exact, as on the other backends.
pub(crate) fn create_table(
    dialect: Dialect,
    table: &CounterTable,
    owner: OwnerColumn,
) -> Statement {
    let mysql = dialect == Dialect::MySql;
    let mut owner_id = ColumnDef::new(Alias::new(col::OWNER_ID));
    match owner {
        OwnerColumn::Integer => owner_id.integer(),
        OwnerColumn::BigInteger => owner_id.big_integer(),
        OwnerColumn::Uuid => owner_id.uuid(),
        OwnerColumn::String if mysql => owner_id.custom(Alias::new(
            "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
        )),
        OwnerColumn::String => owner_id.string_len(255),
    };
    let mut count_key = ColumnDef::new(Alias::new(col::COUNT_KEY));
    if mysql {
        count_key.custom(Alias::new(
            "VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin",
        ));
    } else {
        count_key.string_len(64);
    }
    let mut create = Table::create()
        .table(Alias::new(table.name()))
        .if_not_exists()
        .col(owner_id.not_null())
        .col(count_key.not_null())
        .col(
            ColumnDef::new(Alias::new(col::SLOT))
                .small_integer()
                .not_null(),
        )
        .col(
            ColumnDef::new(Alias::new(col::VALUE))
                .big_integer()
                .not_null(),
        )
        .primary_key(
            Index::create()
                .col(Alias::new(col::OWNER_ID))
                .col(Alias::new(col::COUNT_KEY))
                .col(Alias::new(col::SLOT)),
        )
        .to_owned();
    if let Some(owner) = table.cascade() {
        create.foreign_key(
            ForeignKey::create()
                .name(format!("fk_{}_owner", table.name()))
                .from_col(Alias::new(col::OWNER_ID))
                .to(
                    Alias::new(owner.table.as_ref()),
                    Alias::new(owner.column.as_ref()),
                )
                .on_delete(ForeignKeyAction::Cascade),
        );
    }
    dialect.backend().build(&create)
}

/// `DROP TABLE IF EXISTS t`.
pub(crate) fn drop_table(dialect: Dialect, table: &str) -> Statement {
    dialect.backend().build(
        &Table::drop()
            .table(Alias::new(table))
            .if_exists()
            .to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn companion_table_ddl() {
        let table = CounterTable::new("post_counters").unwrap();
        let pg = create_table(Dialect::Postgres, &table, OwnerColumn::BigInteger);
        assert_eq!(
            pg.sql,
            r#"CREATE TABLE IF NOT EXISTS "post_counters" ( "owner_id" bigint NOT NULL, "count_key" varchar(64) NOT NULL, "slot" smallint NOT NULL, "value" bigint NOT NULL, PRIMARY KEY ("owner_id", "count_key", "slot") )"#
        );
        let my = create_table(Dialect::MySql, &table, OwnerColumn::String);
        assert!(
            my.sql.contains(
                "`owner_id` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL"
            ),
            "{}",
            my.sql
        );
        assert!(
            my.sql
                .contains("`count_key` VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL"),
            "{}",
            my.sql
        );
    }

    #[test]
    fn cascade_adds_a_foreign_key() {
        let table = CounterTable::new("post_counters")
            .unwrap()
            .with_cascade("posts", "id")
            .unwrap();
        let pg = create_table(Dialect::Postgres, &table, OwnerColumn::BigInteger);
        assert!(
            pg.sql.contains(
                r#"CONSTRAINT "fk_post_counters_owner" FOREIGN KEY ("owner_id") REFERENCES "posts" ("id") ON DELETE CASCADE"#
            ),
            "{}",
            pg.sql
        );
    }
}
