//! Recounts are exact in any collation: string parent ids that a child
//! table's column compares as equal (MySQL's default `utf8mb4_general_ci`,
//! as SeaORM's schema builder leaves it; a case- and accent-insensitive ICU
//! collation on PostgreSQL; `COLLATE NOCASE` on SQLite) stay apart through
//! counter caches and dry and real recounts in every batch size, and a
//! recount over hostile ids ends, exact.

use std::{collections::HashMap, time::Duration};

use counter_core::{Reconcile, ReconcileReport, Truth, prelude::*};
use counter_tests::{
    Backend, TestDb, backend_test, figures,
    sql::{self, Sql},
};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, EntityTrait, Schema, Set,
    sea_query::{Alias, Asterisk, Expr, ExprTrait, Query},
};
use sea_orm_migration::{
    schema::{integer, pk_auto},
    sea_query::{ColumnDef, Table},
};

/// The parent: tags with string ids.
mod tag {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "tags")]
    #[counter(keys(uses, weight), slots = 4, table = "tag_counters")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// The child: each row uses a tag, counted and summed on it.
mod tagging {
    use counter_core::CounterCache;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, CounterCache)]
    #[sea_orm(table_name = "taggings")]
    #[counter_cache(parent = super::tag::Entity, key = uses, via = tag_id)]
    #[counter_cache(parent = super::tag::Entity, key = weight, via = tag_id, sum = weight)]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub tag_id: String,
        pub weight: i32,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    counter_core::counter_cache_behavior!();
}

use tag::counters::{Counts, Key};

/// Ids a case- or accent-insensitive collation would merge, and an id with
/// a LIKE wildcard.
const LOOKALIKES: [&str; 14] = [
    "B", "a", "C", "abc", "ABC", "Ab", "b", "é", "E", "e", "É", "Abc", "a%", "a_",
];

/// How a user's migration made the child table.
#[derive(Debug, Clone, Copy)]
enum Made {
    /// SeaORM's schema builder (`Schema::create_table_from_entity`).
    SchemaBuilder,
    /// An ordinary sea-orm-migration `Table::create()`.
    Migration,
}

/// The child table as users get it, made `made`: its string column takes
/// the server's default collation (case-insensitive on MariaDB); on
/// PostgreSQL and SQLite, whose defaults are exact, the column is given an
/// insensitive collation, as a user's migration may. Returns the collation
/// the column ended up with.
async fn setup(t: &TestDb, made: Made) -> String {
    tag::Entity::counters()
        .create_table(&t.db)
        .await
        .expect("create tag_counters");
    let db = &t.db;
    match made {
        Made::SchemaBuilder if t.backend == Backend::Sqlite => {
            // SQLite cannot change a column's collation afterwards.
            db.execute_unprepared(
                "CREATE TABLE taggings (id INTEGER PRIMARY KEY AUTOINCREMENT, \
                 tag_id TEXT NOT NULL COLLATE NOCASE, weight INTEGER NOT NULL)",
            )
            .await
            .expect("create taggings");
        }
        Made::SchemaBuilder => {
            let schema = Schema::new(db.get_database_backend());
            t.sql()
                .execute(&schema.create_table_from_entity(tagging::Entity))
                .await
                .expect("create taggings from the entity");
        }
        Made::Migration => {
            let mut tag_id = ColumnDef::new(tagging::Column::TagId);
            tag_id.string().not_null();
            if t.backend == Backend::Sqlite {
                tag_id.extra("COLLATE NOCASE");
            }
            let create = Table::create()
                .table(tagging::Entity)
                .col(pk_auto(tagging::Column::Id).big_integer())
                .col(&mut tag_id)
                .col(integer(tagging::Column::Weight))
                .to_owned();
            let schema = sql::schema(db).await;
            schema
                .create_table(create)
                .await
                .expect("create taggings in a migration");
            sql::done(schema).await;
        }
    }
    match t.backend {
        Backend::Sqlite => "NOCASE".to_owned(),
        Backend::Postgres => {
            db.execute_unprepared(
                "CREATE COLLATION IF NOT EXISTS ci_ai \
                 (provider = icu, locale = 'und-u-ks-level1', deterministic = false)",
            )
            .await
            .expect("create an insensitive ICU collation");
            db.execute_unprepared(
                "ALTER TABLE taggings ALTER COLUMN tag_id TYPE varchar COLLATE ci_ai",
            )
            .await
            .expect("give tag_id the insensitive collation");
            "ci_ai".to_owned()
        }
        Backend::MySql => {
            let row = db
                .query_one_raw(sea_orm::Statement::from_string(
                    db.get_database_backend(),
                    "SELECT COLLATION_NAME AS c FROM information_schema.COLUMNS \
                     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'taggings' \
                     AND COLUMN_NAME = 'tag_id'",
                ))
                .await
                .expect("read tag_id's collation")
                .expect("tag_id exists");
            let collation: String = row.try_get("", "c").expect("a collation");
            assert!(
                collation.ends_with("_ci"),
                "the test needs the server's case-insensitive default, got {collation}"
            );
            collation
        }
    }
}

/// Drops what [`setup`] made.
async fn teardown(t: &TestDb) {
    t.db.execute_unprepared("DROP TABLE taggings")
        .await
        .expect("drop taggings");
    tag::Entity::counters()
        .drop_table(&t.db)
        .await
        .expect("drop tag_counters");
}

/// Inserts `uses` rows for each id through the counter cache; the i-th row
/// of an id weighs i + 1.
async fn tag_rows(db: &DatabaseConnection, ids: &[String], uses: impl Fn(usize) -> usize) {
    for (i, id) in ids.iter().enumerate() {
        let rows: Vec<tagging::ActiveModel> = (0..uses(i))
            .map(|n| tagging::ActiveModel {
                tag_id: Set(id.clone()),
                weight: Set(n as i32 + 1),
                ..Default::default()
            })
            .collect();
        tagging::Entity::insert_many_counted(db, rows)
            .await
            .unwrap_or_else(|e| panic!("tag {id:?}: {e}"));
    }
}

/// The counts the rows say each id should have, computed in Rust from
/// every row (byte-exact ids, whatever the column's collation).
async fn truth(db: &DatabaseConnection) -> HashMap<String, Counts> {
    let mut truth: HashMap<String, Counts> = HashMap::new();
    for row in tagging::Entity::find()
        .all(&Sql::new(db))
        .await
        .expect("read taggings")
    {
        let counts = truth.entry(row.tag_id).or_default();
        counts.uses += 1;
        counts.weight += i64::from(row.weight);
    }
    truth
}

async fn assert_exact(t: &TestDb, ids: &[String], step: &str) {
    let truth = truth(&t.db).await;
    let stored = tag::Entity::counters()
        .counts_many(&t.db, ids)
        .await
        .expect("counts");
    for id in ids {
        assert_eq!(
            stored[id],
            truth.get(id).copied().unwrap_or_default(),
            "[{}] {step}: tag {id:?}",
            t.backend
        );
    }
}

/// A recount of `key`, bounded: a recount that does not end within a
/// minute fails the test instead of hanging it.
async fn recount(
    db: &DatabaseConnection,
    key: Key,
    options: &Reconcile<String>,
) -> ReconcileReport<String> {
    recount_from(db, key, Truth::counter_cache::<tagging::Entity>(), options).await
}

/// [`recount`] from any truth.
async fn recount_from(
    db: &DatabaseConnection,
    key: Key,
    truth: Truth,
    options: &Reconcile<String>,
) -> ReconcileReport<String> {
    let run = tag::Entity::counters().reconcile(db, key, truth, options);
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("a recount ends within 60 s")
        .expect("the recount succeeds")
}

/// Asserts a dry run saw every id and found none drifted.
fn assert_no_drift(t: &TestDb, ids: &[String], report: &ReconcileReport<String>, what: &str) {
    assert_eq!(
        (report.owners_checked, report.owners_drifted),
        (ids.len() as u64, 0),
        "[{}] {what}: {:?}",
        t.backend,
        report.drifted
    );
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn recounts_keep_lookalike_string_ids_apart_in_every_batch_size(t: TestDb) {
        let ids: Vec<String> = LOOKALIKES.iter().map(|s| (*s).to_owned()).collect();
        let mut recounts = 0u64;
        for made in [Made::SchemaBuilder, Made::Migration] {
            let collation = setup(&t, made).await;
            let step = format!("{made:?}, {collation}");
            tag_rows(&t.db, &ids, |i| i + 1).await;
            assert_exact(&t, &ids, &format!("{step}: counted through the cache")).await;
            recounts += recount_in_every_batch_size(&t, &ids, &step).await;
            recounts += hand_written_truths(&t, &ids, &step).await;
            teardown(&t).await;
        }
        figures(
            "lookalike_recounts",
            t.backend,
            &[
                ("ids", ids.len() as u64),
                ("tables", 2),
                ("recounts", recounts),
            ],
        );
        t.finish().await;
    }
}

/// Dry runs over correct counters find nothing, and drift injected into
/// every counter is repaired owner by owner, in batches of 1, 2, 3 and
/// 1,000. Returns the recounts run.
async fn recount_in_every_batch_size(t: &TestDb, ids: &[String], step: &str) -> u64 {
    let mut recounts = 0u64;
    for batch in [1, 2, 3, 1_000] {
        for key in [Key::Uses, Key::Weight] {
            let dry = Reconcile::new().batch_size(batch).dry_run(true);
            let report = recount(&t.db, key, &dry).await;
            let what = format!("{step}: dry run of correct {key:?} counters, batch {batch}");
            assert_no_drift(t, ids, &report, &what);
            recounts += 1;
        }
        // Drift every counter, then repair it in this batch size.
        for id in ids {
            tag::Entity::counters()
                .add(&t.db, id.clone(), Key::Uses, 5)
                .await
                .unwrap();
            tag::Entity::counters()
                .add(&t.db, id.clone(), Key::Weight, -3)
                .await
                .unwrap();
        }
        for (key, drift) in [(Key::Uses, -5), (Key::Weight, 3)] {
            let report = recount(&t.db, key, &Reconcile::new().batch_size(batch)).await;
            assert_eq!(
                report.owners_drifted,
                ids.len() as u64,
                "[{}] {step}: {key:?}, batch {batch}",
                t.backend
            );
            assert!(
                report.drifted.iter().all(|d| d.drift == drift),
                "[{}] {step}: {key:?}, batch {batch}: each owner drifted by exactly {drift}: {:?}",
                t.backend,
                report.drifted
            );
            recounts += 1;
        }
        assert_exact(t, ids, &format!("{step}: repaired in batches of {batch}")).await;
    }
    recounts
}

/// A hand-written `Truth::statement` that groups in the exact collation,
/// as `Truth::query`'s docs say, finds no drift over exact counters in any
/// batch size; one that groups by the column as it is merges lookalikes
/// wherever the column's collation does (the reason the docs say so).
async fn hand_written_truths(t: &TestDb, ids: &[String], step: &str) -> u64 {
    let exact = match t.backend {
        Backend::Postgres => r#"CAST(tag_id AS TEXT) COLLATE "C""#,
        Backend::MySql => "CONVERT(tag_id USING utf8mb4) COLLATE utf8mb4_bin",
        Backend::Sqlite => "tag_id COLLATE BINARY",
    };
    let truth = |owner: Expr| {
        Truth::statement(
            Query::select()
                .expr(owner.clone())
                .expr(Expr::col(Asterisk).count())
                .from(Alias::new("taggings"))
                .add_group_by([owner])
                .to_owned(),
        )
    };
    let mut recounts = 0;
    for batch in [1, 3, 1_000] {
        let dry = Reconcile::new().batch_size(batch).dry_run(true);
        let report = recount_from(&t.db, Key::Uses, truth(Expr::cust(exact)), &dry).await;
        let what = format!("{step}: an exact hand-written truth, batch {batch}");
        assert_no_drift(t, ids, &report, &what);
        recounts += 1;
    }
    let dry = Reconcile::new().dry_run(true);
    let as_is = tag::Entity::counters()
        .reconcile(
            &t.db,
            Key::Uses,
            truth(Expr::col(Alias::new("tag_id"))),
            &dry,
        )
        .await
        .expect("the recount succeeds");
    assert!(
        as_is.owners_drifted > 0,
        "[{}] {step}: grouping by the insensitive column as it is merges lookalikes",
        t.backend
    );
    recounts + 1
}

/// Ids built to break SQL text, LIKE patterns, escaping, ordering (a tab
/// sorts before the padding space MySQL compares with), and length limits.
fn hostile_ids() -> Vec<String> {
    let mut ids: Vec<String> = [
        "'",
        "x'; DROP TABLE sentinel; --",
        "a;b",
        "--",
        "/* c */",
        "\\",
        "%",
        "_",
        "Zoë",
        "🚀🚀",
        "\u{202e}rtl",
        "",
        "\t",
        "a",
        "a\t",
        "a\u{1}",
        "ZOË",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    ids.push("é".repeat(255));
    ids
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_recount_over_hostile_ids_ends_and_is_exact(t: TestDb) {
        setup(&t, Made::SchemaBuilder).await;
        t.db.execute_unprepared("CREATE TABLE sentinel (id INTEGER)")
            .await
            .expect("create the sentinel");
        let ids = hostile_ids();
        tag_rows(&t.db, &ids, |i| i + 1).await;
        assert_exact(&t, &ids, "counted through the cache").await;
        for id in &ids {
            tag::Entity::counters()
                .add(&t.db, id.clone(), Key::Uses, 5)
                .await
                .unwrap();
        }
        let started = std::time::Instant::now();
        let report = recount(&t.db, Key::Uses, &Reconcile::new().batch_size(3)).await;
        let elapsed = started.elapsed();
        assert_eq!(
            (report.owners_checked, report.owners_drifted),
            (ids.len() as u64, ids.len() as u64),
            "[{}] {:?}",
            t.backend,
            report.drifted
        );
        assert!(
            report.batches <= ids.len() as u64 + 1,
            "[{}] at most one batch per owner, and the empty last one: {}",
            t.backend,
            report.batches
        );
        assert_exact(&t, &ids, "after the recount").await;
        let again = recount(
            &t.db,
            Key::Uses,
            &Reconcile::new().batch_size(3).dry_run(true),
        )
        .await;
        assert_eq!(
            again.owners_drifted, 0,
            "[{}] {:?}",
            t.backend, again.drifted
        );
        t.db.execute_unprepared("SELECT COUNT(*) FROM sentinel")
            .await
            .expect("the sentinel table survived");
        figures(
            "hostile_recount",
            t.backend,
            &[
                ("ids", ids.len() as u64),
                ("batches", report.batches),
                ("recount_ms", elapsed.as_millis() as u64),
            ],
        );
        t.finish().await;
    }
}
