//! Recounts are exact in any collation: string parent ids that a child
//! table's column compares as equal (MySQL's default `utf8mb4_general_ci`,
//! as SeaORM's schema builder leaves it; a case- and accent-insensitive ICU
//! collation on PostgreSQL; `COLLATE NOCASE` on SQLite) stay apart through
//! counter caches and dry and real recounts in every batch size, and a
//! recount over hostile ids ends, exact.

use std::{collections::HashMap, time::Duration};

use counter_core::{Reconcile, ReconcileReport, Truth, prelude::*};
use counter_tests::{Backend, TestDb, backends, figures};
use sea_orm::{ConnectionTrait, DatabaseConnection, EntityTrait, Schema, Set};

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

/// The child table as users get it: SeaORM's schema builder, whose string
/// column takes the server's default collation (case-insensitive on
/// MariaDB); on PostgreSQL and SQLite, whose defaults are exact, the column
/// is then given an insensitive collation by hand, as a user's migration may.
/// Returns the collation the column ended up with.
async fn setup(t: &TestDb) -> String {
    tag::Entity::counters()
        .create_table(&t.db)
        .await
        .expect("create tag_counters");
    let db = &t.db;
    match t.backend {
        Backend::Sqlite => {
            db.execute_unprepared(
                "CREATE TABLE taggings (id INTEGER PRIMARY KEY AUTOINCREMENT, \
                 tag_id TEXT NOT NULL COLLATE NOCASE, weight INTEGER NOT NULL)",
            )
            .await
            .expect("create taggings");
            "NOCASE".to_owned()
        }
        Backend::Postgres => {
            create_from_entity(db).await;
            db.execute_unprepared(
                "CREATE COLLATION ci_ai (provider = icu, locale = 'und-u-ks-level1', deterministic = false)",
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
            create_from_entity(db).await;
            let row = db
                .query_one_raw(sea_orm::Statement::from_string(
                    db.get_database_backend(),
                    "SELECT COLLATION_NAME AS c FROM information_schema.COLUMNS \
                     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'taggings' AND COLUMN_NAME = 'tag_id'",
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

async fn create_from_entity(db: &DatabaseConnection) {
    let schema = Schema::new(db.get_database_backend());
    db.execute(&schema.create_table_from_entity(tagging::Entity))
        .await
        .expect("create taggings from the entity");
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
        .all(db)
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
    let stored = tag::Entity::counts_many(&t.db, ids).await.expect("counts");
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
    let run = tag::Entity::reconcile(db, key, Truth::counter_cache::<tagging::Entity>(), options);
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("a recount ends within 60 s")
        .expect("the recount succeeds")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recounts_keep_lookalike_string_ids_apart_in_every_batch_size() {
    for t in backends("recounts_keep_lookalike_string_ids_apart_in_every_batch_size").await {
        let collation = setup(&t).await;
        let ids: Vec<String> = LOOKALIKES.iter().map(|s| (*s).to_owned()).collect();
        tag_rows(&t.db, &ids, |i| i + 1).await;
        assert_exact(
            &t,
            &ids,
            &format!("counted through the cache ({collation})"),
        )
        .await;

        let mut recounts = 0u64;
        for batch in [1, 2, 3, 1_000] {
            for key in [Key::Uses, Key::Weight] {
                let dry = Reconcile::new().batch_size(batch).dry_run(true);
                let report = recount(&t.db, key, &dry).await;
                assert_eq!(
                    (report.owners_checked, report.owners_drifted),
                    (ids.len() as u64, 0),
                    "[{}] dry run of correct {key:?} counters, batch {batch}: {:?}",
                    t.backend,
                    report.drifted
                );
                recounts += 1;
            }
            // Drift every counter by +5, then repair it in this batch size.
            for id in &ids {
                tag::Entity::add(&t.db, id.clone(), Key::Uses, 5)
                    .await
                    .unwrap();
                tag::Entity::add(&t.db, id.clone(), Key::Weight, -3)
                    .await
                    .unwrap();
            }
            for (key, drift) in [(Key::Uses, -5), (Key::Weight, 3)] {
                let report = recount(&t.db, key, &Reconcile::new().batch_size(batch)).await;
                assert_eq!(
                    report.owners_drifted,
                    ids.len() as u64,
                    "[{}] {key:?}, batch {batch}",
                    t.backend
                );
                assert!(
                    report.drifted.iter().all(|d| d.drift == drift),
                    "[{}] {key:?}, batch {batch}: each owner drifted by exactly {drift}: {:?}",
                    t.backend,
                    report.drifted
                );
                recounts += 1;
            }
            assert_exact(&t, &ids, &format!("repaired in batches of {batch}")).await;
        }
        figures(
            "lookalike_recounts",
            t.backend,
            &[("ids", ids.len() as u64), ("recounts", recounts)],
        );
        t.finish().await;
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recount_over_hostile_ids_ends_and_is_exact() {
    for t in backends("a_recount_over_hostile_ids_ends_and_is_exact").await {
        setup(&t).await;
        t.db.execute_unprepared("CREATE TABLE sentinel (id INTEGER)")
            .await
            .expect("create the sentinel");
        let ids = hostile_ids();
        tag_rows(&t.db, &ids, |i| i + 1).await;
        assert_exact(&t, &ids, "counted through the cache").await;
        for id in &ids {
            tag::Entity::add(&t.db, id.clone(), Key::Uses, 5)
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
