//! Rankings: `top`, `top_after` and `top_models`, highest total first and
//! ties by owner id, checked against rankings computed in Rust, on every
//! backend.

use std::collections::{BTreeMap, HashSet};

use counter_core::{CounterError, Counters, Ranked, limits::MAX_RANK_PAGE, prelude::*};
use counter_tests::{TestDb, backend_test, counters, raw, sql};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::{ActiveModelTrait, ConnectionTrait, EntityTrait, Schema, Set};

/// A typed owner with a row of its own, for `top_models`.
mod song {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "songs")]
    #[counter(keys(likes, plays), slots = 8, table = "song_counters")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: i64,
        pub title: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

use song::counters::Key;

/// The ranking of `totals` computed in Rust: highest total first, ties by
/// owner ascending.
fn expected_ranking<I: Ord + Clone>(totals: &BTreeMap<I, i64>) -> Vec<Ranked<I>> {
    let mut ranked: Vec<Ranked<I>> = totals
        .iter()
        .map(|(owner, total)| Ranked {
            owner: owner.clone(),
            total: *total,
        })
        .collect();
    ranked.sort_by(|a, b| b.total.cmp(&a.total).then_with(|| a.owner.cmp(&b.owner)));
    ranked
}

/// Writes each owner's total as several deltas in separate batches, so it is
/// spread over several slot rows; `0` totals are also written as `+3` and `-3`.
async fn write_totals<I: counter_core::OwnerId>(
    t: &TestDb,
    c: &Counters<I>,
    key: &str,
    totals: &BTreeMap<I, i64>,
    rng: &mut StdRng,
) {
    let mut rounds: Vec<Vec<(I, String, i64)>> = vec![Vec::new(); 3];
    for (owner, total) in totals {
        let first = rng.random_range(-20..=20i64);
        let second = rng.random_range(-20..=20i64);
        let parts = [first, second, total - first - second];
        for (round, delta) in rounds.iter_mut().zip(parts) {
            round.push((owner.clone(), key.to_owned(), delta));
        }
    }
    for round in rounds {
        c.add_many(&t.db, round).await.unwrap();
    }
    // A zero total may have folded away: written, it is still a row.
    for (owner, _) in totals.iter().filter(|(_, total)| **total == 0) {
        c.add(&t.db, owner.clone(), key, 3).await.unwrap();
        c.add(&t.db, owner.clone(), key, -3).await.unwrap();
    }
}

/// Reads the whole ranking page by page with `top_after`.
async fn paginate<I: counter_core::OwnerId>(
    t: &TestDb,
    c: &Counters<I>,
    key: &str,
    page: usize,
) -> Vec<Ranked<I>> {
    let mut all = c.top(&t.db, key, page).await.unwrap();
    assert!(all.len() <= page);
    let mut last_len = all.len();
    while last_len == page {
        let last = all.last().unwrap().clone();
        let next = c.top_after(&t.db, key, &last, page).await.unwrap();
        assert!(next.len() <= page);
        last_len = next.len();
        all.extend(next);
    }
    // Past the end: nothing more.
    if let Some(last) = all.last() {
        let rest = c.top_after(&t.db, key, last, page).await.unwrap();
        assert!(rest.is_empty(), "[{}] after the last: {rest:?}", t.backend);
    }
    all
}

fn assert_each_once<I: counter_core::OwnerId + std::fmt::Debug>(t: &TestDb, ranked: &[Ranked<I>]) {
    let mut seen = HashSet::new();
    for r in ranked {
        assert!(
            seen.insert(r.owner.clone()),
            "[{}] {:?} listed twice",
            t.backend,
            r.owner
        );
    }
}

fn ranked<I>(pairs: impl IntoIterator<Item = (I, i64)>) -> Vec<Ranked<I>> {
    pairs
        .into_iter()
        .map(|(owner, total)| Ranked { owner, total })
        .collect()
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "rank_ties"]
    async fn ties_break_by_owner_id_and_other_keys_are_not_listed(t: TestDb) {
        let c = counters::<i64>("rank_ties", 4);
        c.create_table(&t.db).await.unwrap();
        let b = t.backend;
        // Written out of id order; negative ids sort first among ties.
        for (owner, n) in [(5, 10), (3, 10), (9, 7), (1, 10), (-4, 10), (12, 7)] {
            c.add(&t.db, owner, "likes", n).await.unwrap();
        }
        // Owners only in other keys, and a big total in another key.
        c.add(&t.db, 7, "plays", 1_000).await.unwrap();
        c.add(&t.db, 8, "plays", 1).await.unwrap();
        c.add(&t.db, 1, "plays", 2).await.unwrap();

        let top = c.top(&t.db, "likes", 10).await.unwrap();
        assert_eq!(
            top,
            ranked([(-4, 10), (1, 10), (3, 10), (5, 10), (9, 7), (12, 7)]),
            "[{b}]"
        );
        // Pages cut inside a tie.
        let first = c.top(&t.db, "likes", 2).await.unwrap();
        assert_eq!(first, top[..2], "[{b}]");
        let second = c.top_after(&t.db, "likes", &first[1], 3).await.unwrap();
        assert_eq!(second, top[2..5], "[{b}]");
        let third = c.top_after(&t.db, "likes", &second[2], 3).await.unwrap();
        assert_eq!(third, top[5..], "[{b}]");

        let plays = c.top(&t.db, "plays", 10).await.unwrap();
        assert_eq!(plays, ranked([(7, 1_000), (1, 2), (8, 1)]), "[{b}]");
        // A key never written: nobody.
        assert!(
            c.top(&t.db, "shares", 10).await.unwrap().is_empty(),
            "[{b}]"
        );
        // The same again, as one page of one.
        assert_eq!(
            c.top(&t.db, "likes", 1).await.unwrap(),
            ranked([(-4, 10)]),
            "[{b}]"
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "rank_negative"]
    async fn negative_and_zero_totals_rank_below_positive_ones(t: TestDb) {
        let c = counters::<i64>("rank_negative", 4);
        c.create_table(&t.db).await.unwrap();
        let b = t.backend;
        c.add(&t.db, 1, "likes", 3).await.unwrap();
        // Written, then back to zero: listed with 0.
        c.add(&t.db, 2, "likes", 5).await.unwrap();
        c.add(&t.db, 2, "likes", -5).await.unwrap();
        c.decrement(&t.db, 3, "likes").await.unwrap();
        c.decrement(&t.db, 3, "likes").await.unwrap();
        c.add(&t.db, 4, "likes", -2).await.unwrap();
        c.add(&t.db, 5, "likes", 1).await.unwrap();
        c.add(&t.db, 6, "likes", -100).await.unwrap();
        c.add(&t.db, 0, "likes", 5).await.unwrap();
        c.add(&t.db, 0, "likes", -5).await.unwrap();
        // Never written for likes: not listed.
        c.add(&t.db, 7, "plays", -1).await.unwrap();

        let top = c.top(&t.db, "likes", 100).await.unwrap();
        assert_eq!(
            top,
            ranked([(1, 3), (5, 1), (0, 0), (2, 0), (3, -2), (4, -2), (6, -100)]),
            "[{b}]"
        );
        // Keyset cursors on a zero and on a negative total.
        let after_zero = c.top_after(&t.db, "likes", &top[2], 2).await.unwrap();
        assert_eq!(after_zero, top[3..5], "[{b}]");
        let after_negative = c.top_after(&t.db, "likes", &top[4], 5).await.unwrap();
        assert_eq!(after_negative, top[5..], "[{b}]");
        // A cursor that is not a listed row still splits the order.
        let cursor = Ranked {
            owner: 2,
            total: -1,
        };
        assert_eq!(
            c.top_after(&t.db, "likes", &cursor, 10).await.unwrap(),
            top[4..],
            "[{b}]"
        );
        let cursor = Ranked { owner: 3, total: 0 };
        assert_eq!(
            c.top_after(&t.db, "likes", &cursor, 10).await.unwrap(),
            top[4..],
            "[{b}]"
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "rank_errors"]
    async fn page_size_and_key_are_checked(t: TestDb) {
        let c = counters::<i64>("rank_errors", 4);
        c.create_table(&t.db).await.unwrap();
        let b = t.backend;
        c.add(&t.db, 1, "likes", 1).await.unwrap();
        let cursor = Ranked { owner: 1, total: 1 };

        for n in [0, MAX_RANK_PAGE + 1, usize::MAX] {
            let r = c.top(&t.db, "likes", n).await;
            assert!(
                matches!(r, Err(CounterError::OutOfRange { value, .. }) if value == n as i128),
                "[{b}] n = {n}: {r:?}"
            );
            let r = c.top_after(&t.db, "likes", &cursor, n).await;
            assert!(
                matches!(r, Err(CounterError::OutOfRange { value, .. }) if value == n as i128),
                "[{b}] n = {n}: {r:?}"
            );
        }
        // The largest page is fine.
        assert_eq!(
            c.top(&t.db, "likes", MAX_RANK_PAGE).await.unwrap(),
            ranked([(1, 1)]),
            "[{b}]"
        );
        for bad in ["", "bad key", "likes;drop", &"k".repeat(65)] {
            let r = c.top(&t.db, bad, 10).await;
            assert!(
                matches!(r, Err(CounterError::InvalidKey { .. })),
                "[{b}] {bad:?}: {r:?}"
            );
            let r = c.top_after(&t.db, bad, &cursor, 10).await;
            assert!(
                matches!(r, Err(CounterError::InvalidKey { .. })),
                "[{b}] {bad:?}: {r:?}"
            );
        }
        // A string cursor that is no valid owner id.
        let s = counters::<String>("rank_errors_s", 4);
        s.create_table(&t.db).await.unwrap();
        let bad_cursor = Ranked {
            owner: "x".repeat(1_000),
            total: 0,
        };
        let r = s.top_after(&t.db, "likes", &bad_cursor, 10).await;
        assert!(
            matches!(r, Err(CounterError::InvalidOwner { .. })),
            "[{b}] {r:?}"
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "rank_slots"]
    async fn totals_spread_over_many_slots_rank_by_their_sum(t: TestDb) {
        let c = counters::<i64>("rank_slots", 4);
        c.create_table(&t.db).await.unwrap();
        let b = t.backend;
        let table = "rank_slots";
        // Owner 1: ten rows of 1 = 10; its largest row is the smallest here.
        for slot in 0..10 {
            raw::insert_slot(&t.db, table, 1i64, "likes", slot, 1).await;
        }
        // Owner 2: one row of 9.
        raw::insert_slot(&t.db, table, 2i64, "likes", 0, 9).await;
        // Owner 3: +20 and -15 = 5; its largest row is the largest here.
        raw::insert_slot(&t.db, table, 3i64, "likes", 0, 20).await;
        raw::insert_slot(&t.db, table, 3i64, "likes", 1, -15).await;
        // Owners 4 and 5: beyond f64's exact integers, one apart.
        let big = 1i64 << 60;
        raw::insert_slot(&t.db, table, 4i64, "likes", 0, big).await;
        raw::insert_slot(&t.db, table, 5i64, "likes", 0, big / 2).await;
        raw::insert_slot(&t.db, table, 5i64, "likes", 1, big / 2 + 1).await;
        // Another key's rows of owner 2 do not count.
        raw::insert_slot(&t.db, table, 2i64, "plays", 0, 1_000).await;

        let top = c.top(&t.db, "likes", 10).await.unwrap();
        assert_eq!(
            top,
            ranked([(5, big + 1), (4, big), (1, 10), (2, 9), (3, 5)]),
            "[{b}]"
        );
        // Written through the crate: many increments over four slots.
        for _ in 0..12 {
            c.increment(&t.db, 6, "likes").await.unwrap();
        }
        assert!(
            raw::slot_rows(&t.db, table, 6i64, "likes").await.len() > 1,
            "[{b}] expected several slot rows"
        );
        let top = c.top(&t.db, "likes", 3).await.unwrap();
        assert_eq!(
            top[2],
            Ranked {
                owner: 6,
                total: 12
            },
            "[{b}]"
        );
        let next = c.top_after(&t.db, "likes", &top[2], 2).await.unwrap();
        assert_eq!(next, ranked([(1, 10), (2, 9)]), "[{b}]");
        // Each total is also what `get` reads.
        for r in c.top(&t.db, "likes", 10).await.unwrap() {
            assert_eq!(
                c.get(&t.db, r.owner, "likes").await.unwrap(),
                r.total,
                "[{b}]"
            );
        }
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "rank_random_i64"]
    async fn seeded_random_i64_rankings_match_rust_and_paginate(t: TestDb) {
        let c = counters::<i64>("rank_random", 8);
        c.create_table(&t.db).await.unwrap();
        let b = t.backend;
        let mut rng = StdRng::seed_from_u64(6);
        let mut likes = BTreeMap::new();
        let mut plays = BTreeMap::new();
        while likes.len() < 200 {
            let owner = rng.random_range(-1_000..100_000i64);
            // A narrow range of totals: many ties.
            likes.insert(owner, rng.random_range(-5..=15i64));
            if rng.random_bool(0.3) {
                plays.insert(owner, rng.random_range(0..=3i64));
            }
        }
        // Owners only in plays.
        for owner in 200_000..200_020 {
            plays.insert(owner, rng.random_range(1..=100i64));
        }
        write_totals(&t, &c, "likes", &likes, &mut rng).await;
        write_totals(&t, &c, "plays", &plays, &mut rng).await;
        let expected = expected_ranking(&likes);
        assert!(
            expected.windows(2).any(|w| w[0].total == w[1].total),
            "the data has ties"
        );

        let top = c.top(&t.db, "likes", 1_000).await.unwrap();
        assert_eq!(top, expected, "[{b}]");
        assert_eq!(
            c.top(&t.db, "likes", 25).await.unwrap(),
            expected[..25],
            "[{b}]"
        );
        assert_eq!(
            c.top(&t.db, "plays", 1_000).await.unwrap(),
            expected_ranking(&plays),
            "[{b}]"
        );
        for page in [1, 7, 50, 199, 200, 201] {
            let pages = paginate(&t, &c, "likes", page).await;
            assert_each_once(&t, &pages);
            assert_eq!(pages, expected, "[{b}] pages of {page}");
        }
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "rank_random_string"]
    async fn string_owner_rankings_match_rust_and_tie_by_id(t: TestDb) {
        let c = counters::<String>("rank_strings", 8);
        c.create_table(&t.db).await.unwrap();
        let b = t.backend;

        // Hand-picked ties: case, digits, prefixes and non-ASCII.
        for owner in ["b", "B", "a", "ab", "a0", "A_", "a-b", "é", "z", "Z9"] {
            c.add(&t.db, owner.to_owned(), "likes", 4).await.unwrap();
        }
        let mut hand: Vec<&str> = vec!["b", "B", "a", "ab", "a0", "A_", "a-b", "é", "z", "Z9"];
        hand.sort(); // byte order
        let top = c.top(&t.db, "likes", 100).await.unwrap();
        assert_eq!(
            top,
            ranked(hand.iter().map(|o| (o.to_string(), 4))),
            "[{b}]"
        );

        // ~200 seeded random owners.
        let s = counters::<String>("rank_strings_random", 8);
        s.create_table(&t.db).await.unwrap();
        let mut rng = StdRng::seed_from_u64(66);
        let alphabet: Vec<char> = "abcXYZ019_-".chars().chain(['é', 'ß']).collect();
        let mut likes = BTreeMap::new();
        while likes.len() < 200 {
            let len = rng.random_range(1..=6);
            let owner: String = (0..len)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect();
            likes.insert(owner, rng.random_range(-3..=8i64));
        }
        write_totals(&t, &s, "likes", &likes, &mut rng).await;
        let expected = expected_ranking(&likes);
        assert_eq!(
            s.top(&t.db, "likes", 1_000).await.unwrap(),
            expected,
            "[{b}]"
        );
        for page in [1, 9, 64] {
            let pages = paginate(&t, &s, "likes", page).await;
            assert_each_once(&t, &pages);
            assert_eq!(pages, expected, "[{b}] pages of {page}");
        }
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "rank_models"]
    async fn top_models_loads_models_and_skips_deleted_owners(t: TestDb) {
        let b = t.backend;
        let schema = Schema::new(t.db.get_database_backend());
        t.sql()
            .execute(&schema.create_table_from_entity(song::Entity))
            .await
            .unwrap();
        song::Entity::counters().create_table(&t.db).await.unwrap();
        for id in 1..=5i64 {
            song::ActiveModel {
                id: Set(id),
                title: Set(format!("song {id}")),
            }
            .insert(&t.sql())
            .await
            .unwrap();
        }
        // Owner 6 has counters but never had a row.
        for (id, likes) in [(1, 4), (2, 9), (3, 20), (4, 4), (5, -1), (6, 50)] {
            song::Entity::counters()
                .add(&t.db, id, Key::Likes, likes)
                .await
                .unwrap();
        }
        song::Entity::counters()
            .add(&t.db, 5, Key::Plays, 99)
            .await
            .unwrap();
        song::Entity::delete_by_id(3)
            .exec(&t.sql())
            .await
            .unwrap();

        let model = |id: i64| song::Model {
            id,
            title: format!("song {id}"),
        };
        // The typed ranking still lists every counted owner.
        let top = song::Entity::counters()
            .top(&t.db, Key::Likes, 10)
            .await
            .unwrap();
        assert_eq!(
            top,
            ranked([(6, 50), (3, 20), (2, 9), (1, 4), (4, 4), (5, -1)]),
            "[{b}]"
        );
        // Models: in rank order, without the owners that have no row.
        let models = song::Entity::counters()
            .top_models(&t.db, Key::Likes, 10)
            .await
            .unwrap();
        assert_eq!(
            models,
            vec![(model(2), 9), (model(1), 4), (model(4), 4), (model(5), -1)],
            "[{b}]"
        );
        // A page is the top `n` owners, so skipped owners shorten it.
        let models = song::Entity::counters()
            .top_models(&t.db, Key::Likes, 3)
            .await
            .unwrap();
        assert_eq!(models, vec![(model(2), 9)], "[{b}]");
        let plays = song::Entity::counters()
            .top_models(&t.db, Key::Plays, 10)
            .await
            .unwrap();
        assert_eq!(plays, vec![(model(5), 99)], "[{b}]");
        let r = song::Entity::counters()
            .top_models(&t.db, Key::Likes, 0)
            .await;
        assert!(
            matches!(r, Err(CounterError::OutOfRange { .. })),
            "[{b}] {r:?}"
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test]
    #[label = "tables_with_the_longest_names"]
    async fn tables_with_the_longest_names_get_their_own_key_index(t: TestDb) {
        let b = t.backend;
        // 63 bytes: `<name>_by_key` would pass the identifier limit, and
        // cut short it would be the table's own name.
        let names = ["k".repeat(63), format!("{}x", "k".repeat(62))];
        let mut indexes = HashSet::new();
        for name in &names {
            let table = counter_core::CounterTable::new(name.clone()).unwrap();
            let long = Counters::<i64>::new(table);
            long.create_table(&t.db).await.unwrap();
            long.create_table(&t.db).await.unwrap(); // idempotent
            long.add_many(&t.db, [(1, "likes", 2), (2, "likes", 5)])
                .await
                .unwrap();
            let top = long.top(&t.db, "likes", 1).await.unwrap();
            assert_eq!(top, [Ranked { owner: 2, total: 5 }], "[{b}]");
            let index = indexes_of(&t, name).await;
            assert_eq!(index.len(), 1, "[{b}] {name}: {index:?}");
            let schema = sql::schema(&t.db).await;
            assert!(
                schema.has_index(name.as_str(), &index[0]).await.unwrap(),
                "[{b}]"
            );
            sql::done(schema).await;
            assert!(index[0].len() <= 63 && index[0] != *name, "[{b}] {index:?}");
            indexes.insert(index[0].clone());
        }
        assert_eq!(indexes.len(), 2, "[{b}] two tables, two indexes");
        t.finish().await;
    }
}

/// The secondary indexes of `table` (not the primary key).
async fn indexes_of(t: &TestDb, table: &str) -> Vec<String> {
    let sql = match t.backend {
        counter_tests::Backend::Sqlite => format!(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = '{table}' \
             AND name NOT LIKE 'sqlite_autoindex%'"
        ),
        counter_tests::Backend::Postgres => format!(
            "SELECT indexname AS name FROM pg_indexes WHERE tablename = '{table}' \
             AND schemaname = current_schema() AND indexdef NOT LIKE 'CREATE UNIQUE%'"
        ),
        counter_tests::Backend::MySql => format!(
            "SELECT DISTINCT index_name AS name FROM information_schema.statistics \
             WHERE table_schema = DATABASE() AND table_name = '{table}' AND index_name <> 'PRIMARY'"
        ),
    };
    let rows = t
        .sql()
        .query_all_raw(sea_orm::Statement::from_string(
            t.db.get_database_backend(),
            sql,
        ))
        .await
        .unwrap();
    rows.iter()
        .map(|r| r.try_get::<String>("", "name").unwrap())
        .collect()
}
