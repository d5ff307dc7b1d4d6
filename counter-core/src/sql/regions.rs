//! The statements of regions: the heartbeat table and a region's
//! publication (PostgreSQL logical replication).

use sea_orm::{
    Statement,
    sea_query::{Alias, ColumnDef, OnConflict, Query, Table},
};

use super::{Dialect, col, quote};
use crate::region::Region;

/// The heartbeat table: one row per region.
pub(crate) const BEATS: &str = "counter_regions";
const REGION: &str = "region";
const BEAT_AT: &str = "beat_at_us";

/// `CREATE TABLE IF NOT EXISTS counter_regions (region VARCHAR(64) PRIMARY
/// KEY, beat_at_us BIGINT NOT NULL)`.
pub(crate) fn create_beats(dialect: Dialect) -> Statement {
    let create = Table::create()
        .table(Alias::new(BEATS))
        .if_not_exists()
        .col(
            ColumnDef::new(Alias::new(REGION))
                .string_len(64)
                .not_null()
                .primary_key(),
        )
        .col(ColumnDef::new(Alias::new(BEAT_AT)).big_integer().not_null())
        .to_owned();
    dialect.backend().build(&create)
}

/// Upserts `region`'s heartbeat at `at_us` (microseconds since the epoch).
pub(crate) fn beat(dialect: Dialect, region: &str, at_us: i64) -> Statement {
    let insert = Query::insert()
        .into_table(Alias::new(BEATS))
        .columns([Alias::new(REGION), Alias::new(BEAT_AT)])
        .values_panic([region.into(), at_us.into()])
        .on_conflict(
            OnConflict::column(Alias::new(REGION))
                .update_column(Alias::new(BEAT_AT))
                .to_owned(),
        )
        .to_owned();
    dialect.backend().build(&insert)
}

/// Every region's latest heartbeat here: `(region, beat_at_us)`.
pub(crate) fn beats(dialect: Dialect) -> Statement {
    let select = Query::select()
        .columns([Alias::new(REGION), Alias::new(BEAT_AT)])
        .from(Alias::new(BEATS))
        .to_owned();
    dialect.backend().build(&select)
}

/// The publication of `region`'s rows of `tables` (counter, bucket and
/// sketch tables, validated names) and of its heartbeat row, created or
/// replaced in one PL/pgSQL block:
///
/// ```sql
/// CREATE PUBLICATION "p" FOR TABLE "t" WHERE (slot % 2 = 1), ...,
///   "counter_regions" WHERE (region = 'eu') WITH (publish = 'insert, update, delete')
/// ```
///
/// The publication name is a validated identifier and the region name
/// letters, digits, `_` and `-` (see [`Region::new`]), so both can be
/// written into the block, which takes no parameters.
pub(crate) fn publish(publication: &str, tables: &[String], region: &Region) -> Vec<Statement> {
    let pg = Dialect::Postgres;
    let slot = quote(pg, col::SLOT);
    let mut list: Vec<String> = tables
        .iter()
        .map(|table| {
            format!(
                "{} WHERE ({slot} % {} = {})",
                quote(pg, table),
                region.count(),
                region.index()
            )
        })
        .collect();
    list.push(format!(
        "{} WHERE ({} = '{}')",
        quote(pg, BEATS),
        quote(pg, REGION),
        region.name()
    ));
    let list = list.join(", ");
    let name = quote(pg, publication);
    let options = "publish = 'insert, update, delete'";
    // Two `migrate`s at once may both find no publication: the loser of
    // the `CREATE` replaces the tables instead.
    let replace = format!(
        "ALTER PUBLICATION {name} SET TABLE {list}; ALTER PUBLICATION {name} SET ({options});"
    );
    let block = format!(
        "DO $counter$ BEGIN \
           IF EXISTS (SELECT 1 FROM pg_publication WHERE pubname = '{publication}') THEN \
             {replace} \
           ELSE \
             BEGIN \
               CREATE PUBLICATION {name} FOR TABLE {list} WITH ({options}); \
             EXCEPTION WHEN duplicate_object THEN \
               {replace} \
             END; \
           END IF; \
         END $counter$"
    );
    vec![Statement::from_string(pg.backend(), block)]
}
