//! Creating and dropping a companion table, its index and its bucket table.

use sea_orm::{
    Statement,
    sea_query::{
        Alias, ColumnDef, ForeignKey, ForeignKeyAction, Index, IndexCreateStatement, Table,
        TableCreateStatement,
    },
};

use super::{Dialect, Layout, col};
use crate::{limits::MAX_TABLE_NAME_LEN, owner::OwnerColumn, table::CounterTable};

/// Every statement that creates `table`'s storage, idempotently:
///
/// * `CREATE TABLE IF NOT EXISTS t (owner_id, count_key, slot, value,
///   PRIMARY KEY (owner_id, count_key, slot))`;
/// * the key index `(count_key, owner_id)`, which lets a ranking
///   ([`Counters::top`](crate::Counters::top)) read one key's rows instead of
///   the whole table (inline in `CREATE TABLE` on MySQL, which has no
///   `CREATE INDEX IF NOT EXISTS`: there a table that already exists gets it
///   from the upgrade migration only);
/// * with a windowed key, the bucket table
///   `(owner_id, count_key, bucket, slot, value)`.
///
/// No surrogate id (every conflicting upsert would burn a sequence value), no
/// index on `value` (PostgreSQL updates stay HOT: the key index holds only
/// columns no write changes), and no foreign key unless the table opted into
/// [`CounterTable::with_cascade`] (on InnoDB the check share-locks the owner
/// row and brings some contention back). On MySQL the string columns compare
/// byte-wise (`_bin` collations), so keys and string owner ids are
/// case-sensitive and exact, as on the other backends.
pub(crate) fn create_table(
    dialect: Dialect,
    table: &CounterTable,
    owner: OwnerColumn,
) -> Vec<Statement> {
    let mut create = table_def(dialect, table, table.name(), Layout::Totals, owner);
    let mut statements = Vec::new();
    if dialect == Dialect::MySql {
        create.index(&mut key_index_def(table.name()));
        statements.push(dialect.backend().build(&create));
    } else {
        statements.push(dialect.backend().build(&create));
        statements.push(create_key_index(dialect, table.name(), true));
    }
    if let Some(buckets) = table.bucket_table() {
        statements.push(create_bucket_table(dialect, table, &buckets, owner));
    }
    if let Some(sketches) = table.sketch_table() {
        statements.push(create_sketch_table(dialect, table, &sketches, owner));
    }
    statements
}

/// `CREATE TABLE IF NOT EXISTS <t>_sketches (owner_id, count_key, bucket,
/// slot, sketch, PRIMARY KEY (owner_id, count_key, bucket, slot))`: a
/// sketch is at most [`Sketch::MAX_BYTES`](crate::unique::Sketch::MAX_BYTES),
/// a `BLOB` on MySQL (up to 64 kB), `bytea` on PostgreSQL.
pub(crate) fn create_sketch_table(
    dialect: Dialect,
    table: &CounterTable,
    sketches: &str,
    owner: OwnerColumn,
) -> Statement {
    dialect.backend().build(&table_def(
        dialect,
        table,
        sketches,
        Layout::Sketches,
        owner,
    ))
}

/// `CREATE TABLE IF NOT EXISTS <t>_buckets (owner_id, count_key, bucket,
/// slot, value, PRIMARY KEY (owner_id, count_key, bucket, slot))`.
pub(crate) fn create_bucket_table(
    dialect: Dialect,
    table: &CounterTable,
    buckets: &str,
    owner: OwnerColumn,
) -> Statement {
    dialect
        .backend()
        .build(&table_def(dialect, table, buckets, Layout::Buckets, owner))
}

/// The name of a counter table's key index: `<table>_by_key`, or, when
/// that would pass the 63-byte identifier limit, the table's first 47 bytes,
/// a hash of the whole name and `_by_key`, so it never equals the table's
/// own name (an index and a table share a namespace on PostgreSQL and
/// SQLite) nor another long table's index.
pub(crate) fn key_index_name(table: &str) -> String {
    const SUFFIX: &str = "_by_key";
    if table.len() + SUFFIX.len() <= MAX_TABLE_NAME_LEN {
        return format!("{table}{SUFFIX}");
    }
    // Table names are ASCII, so any byte index is a char boundary.
    let hash = super::fnv1a(table.bytes()) as u32;
    format!("{}_{hash:08x}{SUFFIX}", &table[..47])
}

fn key_index_def(table: &str) -> IndexCreateStatement {
    Index::create()
        .name(key_index_name(table))
        .table(Alias::new(table))
        .col(Alias::new(col::COUNT_KEY))
        .col(Alias::new(col::OWNER_ID))
        .to_owned()
}

/// `CREATE INDEX [IF NOT EXISTS] <t>_by_key ON t (count_key, owner_id)`
/// (MySQL knows no `IF NOT EXISTS` here: check first).
pub(crate) fn create_key_index(dialect: Dialect, table: &str, if_not_exists: bool) -> Statement {
    let mut index = key_index_def(table);
    if if_not_exists && dialect != Dialect::MySql {
        index.if_not_exists();
    }
    dialect.backend().build(&index)
}

pub(crate) fn table_def(
    dialect: Dialect,
    table: &CounterTable,
    name: &str,
    layout: Layout,
    owner: OwnerColumn,
) -> TableCreateStatement {
    let mysql = dialect == Dialect::MySql;
    let mut owner_id = ColumnDef::new(Alias::new(col::OWNER_ID));
    match owner {
        OwnerColumn::Integer => owner_id.integer(),
        OwnerColumn::BigInteger => owner_id.big_integer(),
        OwnerColumn::Uuid => owner_id.uuid(),
        OwnerColumn::String if mysql => owner_id.custom(Alias::new(
            "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
        )),
        // Byte order, as on MySQL (`_bin`) and SQLite (`BINARY`): string
        // owners rank, walk and lock in the same order on every backend, and
        // in Rust's.
        OwnerColumn::String if dialect == Dialect::Postgres => {
            owner_id.custom(Alias::new(r#"VARCHAR(255) COLLATE "C""#))
        }
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
        .table(Alias::new(name))
        .if_not_exists()
        .col(owner_id.not_null())
        .col(count_key.not_null())
        .to_owned();
    if layout != Layout::Totals {
        create.col(
            ColumnDef::new(Alias::new(col::BUCKET))
                .big_integer()
                .not_null(),
        );
    }
    create.col(
        ColumnDef::new(Alias::new(col::SLOT))
            .small_integer()
            .not_null(),
    );
    let mut payload = ColumnDef::new(Alias::new(layout.payload()));
    match layout {
        Layout::Sketches => payload.blob(),
        Layout::Totals | Layout::Buckets => payload.big_integer(),
    };
    create.col(payload.not_null());
    let mut primary_key = Index::create();
    for column in layout.primary_key() {
        primary_key.col(Alias::new(*column));
    }
    create.primary_key(&mut primary_key);
    if let Some(owner) = table.cascade() {
        let fk_name = owner_fk_name(name);
        let owner_table = Alias::new(owner.table.as_ref());
        let owner_column = Alias::new(owner.column.as_ref());
        let mut fk = ForeignKey::create();
        fk.name(fk_name)
            .from_col(Alias::new(col::OWNER_ID))
            .on_delete(ForeignKeyAction::Cascade);
        match &owner.schema {
            Some(schema) => fk.to((Alias::new(schema.as_ref()), owner_table), owner_column),
            None => fk.to(owner_table, owner_column),
        };
        create.foreign_key(&mut fk);
    }
    create
}

/// The name of the reference from the table `name` to its owner:
/// `<name>_owner_fk`. Constraint names share the 63/64-byte identifier
/// limit of PostgreSQL and MySQL; table names are ASCII, so cutting is safe.
pub(crate) fn owner_fk_name(name: &str) -> String {
    let mut fk_name = format!("{name}_owner_fk");
    fk_name.truncate(MAX_TABLE_NAME_LEN);
    fk_name
}

/// `DROP TABLE IF EXISTS` of `table`'s bucket table, if it has one, then
/// of the table itself: every table [`create_table`] creates.
pub(crate) fn drop_table(dialect: Dialect, table: &CounterTable) -> Vec<(String, Statement)> {
    // The buckets first, then the totals.
    super::tables(table)
        .into_iter()
        .rev()
        .map(|(name, _)| {
            let drop = Table::drop()
                .table(Alias::new(&name))
                .if_exists()
                .to_owned();
            let stmt = dialect.backend().build(&drop);
            (name, stmt)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OwnerTable;

    #[test]
    fn companion_table_ddl() {
        let table = CounterTable::new("post_counters").unwrap();
        let pg = create_table(Dialect::Postgres, &table, OwnerColumn::BigInteger).remove(0);
        assert_eq!(
            pg.sql,
            r#"CREATE TABLE IF NOT EXISTS "post_counters" ( "owner_id" bigint NOT NULL, "count_key" varchar(64) NOT NULL, "slot" smallint NOT NULL, "value" bigint NOT NULL, PRIMARY KEY ("owner_id", "count_key", "slot") )"#
        );
        let my = create_table(Dialect::MySql, &table, OwnerColumn::String).remove(0);
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
    fn key_index_names_fit_and_differ_from_the_table() {
        assert_eq!(key_index_name("post_counters"), "post_counters_by_key");
        let long = "t".repeat(63);
        let name = key_index_name(&long);
        assert_eq!(name.len(), 63, "{name}");
        assert_ne!(name, long);
        assert_ne!(key_index_name(&"t".repeat(62)), name);
        let statements = create_table(
            Dialect::Postgres,
            &CounterTable::new("p".repeat(60)).unwrap(),
            OwnerColumn::String,
        );
        assert!(
            statements[0].sql.contains(r#"VARCHAR(255) COLLATE "C""#),
            "{}",
            statements[0].sql
        );
        assert!(
            statements[1].sql.starts_with("CREATE INDEX IF NOT EXISTS"),
            "{}",
            statements[1].sql
        );
    }

    #[test]
    fn cascade_adds_a_foreign_key() {
        let owner = |schema: Option<&'static str>| OwnerTable {
            schema: schema.map(Into::into),
            table: "posts".into(),
            column: "id".into(),
        };
        let table = CounterTable::new("post_counters").unwrap();
        let pg = create_table(
            Dialect::Postgres,
            &table.clone().with_cascade(owner(None)),
            OwnerColumn::BigInteger,
        )
        .remove(0);
        assert!(
            pg.sql.contains(
                r#"CONSTRAINT "post_counters_owner_fk" FOREIGN KEY ("owner_id") REFERENCES "posts" ("id") ON DELETE CASCADE"#
            ),
            "{}",
            pg.sql
        );
        let qualified = create_table(
            Dialect::Postgres,
            &table.with_cascade(owner(Some("blog"))),
            OwnerColumn::BigInteger,
        )
        .remove(0);
        assert!(
            qualified
                .sql
                .contains(r#"REFERENCES "blog"."posts" ("id")"#),
            "{}",
            qualified.sql
        );
        let long = CounterTable::new("t".repeat(63))
            .unwrap()
            .with_cascade(owner(None));
        let my = create_table(Dialect::MySql, &long, OwnerColumn::BigInteger).remove(0);
        assert!(
            my.sql.contains(&format!("CONSTRAINT `{}`", "t".repeat(63))),
            "{}",
            my.sql
        );
    }
}
