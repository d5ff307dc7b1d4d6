//! Hostile input: injection payloads, look-alikes, huge strings and values at
//! the edge of `i64`, on every backend.
//!
//! * Dynamic keys carrying SQL injection attempts, NUL bytes, Unicode
//!   confusables and 10 KB strings are refused with `InvalidKey` by every
//!   entry point (add, get, get_many, `DeltaBatch`, the buffer, compaction,
//!   recounts, table configuration) *before any SQL*: the same calls on a
//!   table that does not exist still say `InvalidKey`, not `MissingTable`,
//!   and the real table keeps exactly its rows and keeps working.
//! * Table names carrying the same payloads are `InvalidTableName`, never a
//!   panic.
//! * String owners carrying them are data: stored byte for byte and read
//!   back exactly by every read path, never executed; an owner that cannot
//!   be stored exactly on every backend (too long, a trailing space, a NUL,
//!   which PostgreSQL cannot store) is `InvalidOwner` everywhere.
//! * Property tests: `validate_key` and `validate_table_name` accept exactly
//!   their documented grammars and never panic, and any accepted key and
//!   string owner round-trips through SQLite verbatim.
//! * `i64` boundaries through every write path: the last step to
//!   `i64::MAX`/`MIN` is fine, the next is `Overflow` with nothing changed,
//!   and a batch with one overflowing counter applies nothing.
//! * Extremes of size: a batch read of 0 owners sends no query, one of
//!   1,000,000 owners is one call, zero-filled; a 100,000-row batch write is
//!   exact, chunked as documented, and all or nothing.

use std::{
    collections::{BTreeSet, HashMap},
    time::{Duration, Instant},
};

use counter_core::{
    Compact, CounterBuffer, CounterError, CounterTable, DeltaBatch, FlushLedger, Reconcile, Truth,
    Window,
    limits::{MAX_KEY_LEN, MAX_STRING_OWNER_LEN, MAX_TABLE_NAME_LEN, UPSERT_ROWS_PER_STATEMENT},
    validate_key, validate_table_name,
};
use counter_tests::{TestDb, backend_test, counters, figures, raw, sql::Sql};
use proptest::{
    prelude::*,
    test_runner::{FileFailurePersistence, TestRunner},
};
use sea_orm::{
    ConnectionTrait, Database, DatabaseConnection,
    sea_query::{Alias, Expr, Query},
};

/// Strings an attacker would try, as keys, table names and owner ids.
fn payloads() -> Vec<String> {
    let mut p: Vec<String> = [
        "'",
        "''",
        "\"",
        "`",
        "likes'; DROP TABLE x; --",
        "likes\"; DROP TABLE x; --",
        "likes`; DROP TABLE x; --",
        "x' OR '1'='1",
        "1; DELETE FROM x",
        "a/* */b",
        "/*",
        "*/",
        "#",
        "likes#",
        "--",
        "-- ",
        "\\",
        "a\\b",
        "\\'",
        "\\0",
        ";",
        "a;b",
        "\0",
        "likes\0",
        "a\0b",
        "",
        " ",
        "likes ",
        " likes",
        "a\tb",
        "a\nb",
        "a\r\n",
        "%",
        "_%",
        "?",
        "$1",
        ":name",
        "NULL",
        "excluded",
        // Fullwidth `ｌｉｋｅｓ`, and `likes` with Cyrillic і and е.
        "\u{ff4c}\u{ff49}\u{ff4b}\u{ff45}\u{ff53}",
        "l\u{456}k\u{435}s",
        "\u{430}",
        // Zero-width joiner, zero-width space, BOM, right-to-left override.
        "li\u{200d}kes",
        "likes\u{200b}",
        "\u{feff}likes",
        "\u{202e}sekil",
        "likes\u{a0}",
        "e\u{301}",
        "\u{e9}",
        "🚀",
        "\u{7f}",
        // PostgreSQL array-literal syntax (string owners travel in one).
        "a,b",
        "{",
        "}",
        "{a,b}",
        "\"a\",\"b\"",
        "a\\,b",
    ]
    .map(str::to_owned)
    .to_vec();
    p.push("k".repeat(10_000));
    p.push("'".repeat(10_000));
    p.push("\u{430}".repeat(5_000));
    p.push("k".repeat(MAX_KEY_LEN + 1));
    p.push("\u{ff4b}".repeat(MAX_STRING_OWNER_LEN));
    p.push("x".repeat(MAX_STRING_OWNER_LEN + 1));
    let unique: BTreeSet<&String> = p.iter().collect();
    assert_eq!(unique.len(), p.len(), "a payload is listed twice");
    p
}

fn is_invalid_key<T>(r: &Result<T, CounterError>) -> bool {
    matches!(r, Err(CounterError::InvalidKey { .. }))
}

fn is_invalid_owner<T>(r: &Result<T, CounterError>) -> bool {
    matches!(r, Err(CounterError::InvalidOwner { .. }))
}

fn is_overflow<T>(r: &Result<T, CounterError>) -> bool {
    matches!(r, Err(CounterError::Overflow { .. }))
}

/// Whether `owner` can be a string owner id on every backend: at most
/// 255 characters, no trailing space (MySQL would merge it), no NUL
/// (PostgreSQL cannot store it).
fn storable_owner(owner: &str) -> bool {
    owner.chars().count() <= MAX_STRING_OWNER_LEN && !owner.ends_with(' ') && !owner.contains('\0')
}

/// The documented key grammar, written independently of `validate_key`.
fn key_grammar(key: &str) -> bool {
    (1..=MAX_KEY_LEN).contains(&key.len())
        && key
            .chars()
            .all(|c| matches!(c, 'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | '-' | '.' | ':'))
}

/// The documented table-name grammar, likewise.
fn table_grammar(name: &str) -> bool {
    (1..=MAX_TABLE_NAME_LEN).contains(&name.len())
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| matches!(c, 'a'..='z' | 'A'..='Z' | '0'..='9' | '_'))
        && name.to_lowercase() != "excluded"
}

/// A truth query over a table that does not exist: a recount that reached
/// SQL would fail with a database error.
fn phantom_truth() -> Truth {
    Truth::statement(
        Query::select()
            .column(Alias::new("owner"))
            .expr(Expr::val(1))
            .from(Alias::new("no_such_truth"))
            .to_owned(),
    )
}

/// The distinct `owner_id`s of a string-owned table, as the database holds them.
async fn stored_string_owners(db: &DatabaseConnection, table: &str) -> BTreeSet<String> {
    let select = Query::select()
        .column(Alias::new("owner_id"))
        .from(Alias::new(table))
        .to_owned();
    Sql::new(db)
        .query_all(&select)
        .await
        .expect("read owners")
        .iter()
        .map(|r| r.try_get::<String>("", "owner_id").unwrap())
        .collect()
}

/// Every entry point refuses every payload as a key, with `InvalidKey`,
/// before SQL. Returns the number of refused calls.
async fn keys_are_refused(t: &TestDb, payloads: &[String]) -> u64 {
    let b = t.backend;
    let db = &t.db;
    let c = counters::<i64>("hostile_c", 4);
    // Never created: any call that reached SQL would say `MissingTable`.
    let ghost = counters::<i64>("hostile_ghost", 4);
    FlushLedger::default().create_table(db).await.unwrap();
    let buffer = CounterBuffer::builder(db)
        .interval(Duration::from_secs(3600))
        .start()
        .await
        .unwrap();
    let mut rejected = 0u64;
    let mut check = |what: &str, key: &str, r: Result<(), CounterError>| {
        assert!(
            is_invalid_key(&r),
            "[{b}] {what} {:?}: {r:?}",
            key.chars().take(40).collect::<String>()
        );
        rejected += 1;
    };
    for key in payloads.iter().filter(|k| !key_grammar(k)) {
        let key = key.as_str();
        assert!(validate_key(key).is_err(), "{key:?} is a valid key");
        for target in [&c, &ghost] {
            check("add", key, target.add(db, 1, key, 1).await);
            check("add 0", key, target.add(db, 1, key, 0).await);
            check("increment", key, target.increment(db, 1, key).await);
            check("decrement", key, target.decrement(db, 1, key).await);
            let (from, to) = (
                chrono::Utc::now() - chrono::Duration::days(2),
                chrono::Utc::now(),
            );
            check("add_at", key, target.add_at(db, 1, key, 1, from).await);
            check(
                "range",
                key,
                target.range(db, 1, key, from, to).await.map(drop),
            );
            check(
                "range_many",
                key,
                target
                    .range_many(db, &[1, 2], key, from, to)
                    .await
                    .map(drop),
            );
            check(
                "series",
                key,
                target.series(db, 1, key, from, to).await.map(drop),
            );
            check(
                "series_many",
                key,
                target
                    .series_many(db, &[1, 2], key, from, to)
                    .await
                    .map(drop),
            );
            check("top", key, target.top(db, key, 10).await.map(drop));
            check("get", key, target.get(db, 1, key).await.map(drop));
            check(
                "get_many",
                key,
                target
                    .get_many(db, &[1, 2], &["likes", key])
                    .await
                    .map(drop),
            );
            check(
                "add_many",
                key,
                target
                    .add_many(db, [(1, "likes", 1), (2, key, 1)])
                    .await
                    .map(drop),
            );
            let mut batch = DeltaBatch::new();
            batch.add(target, 1, "likes", 1).unwrap();
            check(
                "DeltaBatch::add",
                key,
                batch.add(target, 2, key, 1).map(drop),
            );
            check("buffer add", key, buffer.add(target, 1, key, 1));
            check(
                "buffer get",
                key,
                buffer.get(target, 1, key).await.map(drop),
            );
            check(
                "compact keys",
                key,
                target
                    .compact(db, &Compact::new().keys(["likes", key]))
                    .await
                    .map(drop),
            );
            check(
                "reconcile",
                key,
                target
                    .reconcile(db, key, phantom_truth(), &Reconcile::new())
                    .await
                    .map(drop),
            );
        }
        let table = CounterTable::new("hostile_cfg").unwrap();
        check(
            "with_key_slots",
            key,
            table.clone().with_key_slots(key, 4).map(drop),
        );
        check(
            "with_key_window",
            key,
            table.with_key_window(key, Window::Day).map(drop),
        );
    }
    // The buffer took nothing: its shutdown flushes nothing.
    assert_eq!(buffer.unflushed(&c, 1, "likes"), 0, "[{b}]");
    buffer.shutdown().await.unwrap();
    rejected
}

/// Payloads as string owners: stored verbatim by every write path and read
/// back exactly, or refused with `InvalidOwner` if no backend may store
/// them exactly. Returns (stored verbatim, rejected calls, increments lost).
async fn owners_are_data(t: &TestDb, payloads: &[String]) -> (u64, u64, u64) {
    let b = t.backend;
    let db = &t.db;
    let s = counters::<String>("hostile_owners", 4);
    s.create_table(db).await.unwrap();
    let (good, bad): (Vec<&String>, Vec<&String>) =
        payloads.iter().partition(|p| storable_owner(p));
    let mut rejected = 0u64;
    for owner in &bad {
        let owner = (*owner).clone();
        let rs = [
            s.add(db, owner.clone(), "likes", 1).await,
            s.get(db, owner.clone(), "likes").await.map(drop),
            s.get_many(db, std::slice::from_ref(&owner), &["likes"])
                .await
                .map(drop),
            s.get_all_keys(db, std::slice::from_ref(&owner))
                .await
                .map(drop),
            s.add_many(
                db,
                [("ok".to_owned(), "likes", 1), (owner.clone(), "likes", 1)],
            )
            .await
            .map(drop),
            DeltaBatch::new()
                .add(&s, owner.clone(), "likes", 1)
                .map(drop),
        ];
        for r in rs {
            assert!(
                is_invalid_owner(&r),
                "[{b}] owner {:?}: {r:?}",
                owner.chars().take(40).collect::<String>()
            );
            rejected += 1;
        }
    }
    assert_eq!(
        raw::count_rows(db, "hostile_owners").await,
        0,
        "[{b}] a refused owner wrote"
    );

    // One add each (distinct deltas), then one batch of all, then a buffer.
    let mut expected: HashMap<String, i64> = HashMap::new();
    for (i, owner) in good.iter().enumerate() {
        let delta = i as i64 + 1;
        s.add(db, (*owner).clone(), "likes", delta).await.unwrap();
        expected.insert((*owner).clone(), delta);
    }
    let mut batch = DeltaBatch::new();
    for owner in &good {
        batch.add(&s, (*owner).clone(), "likes", 1000).unwrap();
        batch.add(&s, (*owner).clone(), "shares", 7).unwrap();
    }
    let outcome = batch.apply(db).await.unwrap();
    assert_eq!(outcome.rows, 2 * good.len(), "[{b}]");
    let buffer = CounterBuffer::builder(db)
        .interval(Duration::from_secs(3600))
        .start()
        .await
        .unwrap();
    for owner in &good {
        buffer.add(&s, (*owner).clone(), "likes", 1).unwrap();
    }
    buffer.shutdown().await.unwrap();
    for v in expected.values_mut() {
        *v += 1001;
    }

    let owners: Vec<String> = good.iter().map(|o| (*o).clone()).collect();
    let mut lost = 0u64;
    for owner in &owners {
        let got = s.get(db, owner.clone(), "likes").await.unwrap();
        lost += got.abs_diff(expected[owner]);
        assert_eq!(got, expected[owner], "[{b}] get {owner:?}");
    }
    let many = s.get_many(db, &owners, &["likes", "shares"]).await.unwrap();
    let all = s.get_all_keys(db, &owners).await.unwrap();
    assert_eq!(many.len(), owners.len(), "[{b}] owners merged or split");
    for owner in &owners {
        let want = HashMap::from([
            ("likes".to_owned(), expected[owner]),
            ("shares".to_owned(), 7),
        ]);
        assert_eq!(many[owner], want, "[{b}] get_many {owner:?}");
        assert_eq!(all[owner], want, "[{b}] get_all_keys {owner:?}");
        let slots = raw::slot_rows(db, "hostile_owners", owner.clone(), "likes").await;
        assert_eq!(
            slots.iter().map(|(_, v)| v).sum::<i64>(),
            expected[owner],
            "[{b}] rows of {owner:?}"
        );
    }
    // Byte for byte: the stored ids are exactly the inputs, none altered,
    // trimmed, normalised or merged.
    let stored = stored_string_owners(db, "hostile_owners").await;
    let input: BTreeSet<String> = owners.iter().cloned().collect();
    assert_eq!(
        stored, input,
        "[{b}] stored owner ids differ from the input"
    );
    (owners.len() as u64, rejected, lost)
}

backend_test! {
    /// Keys refused before SQL, and owners kept as data, on every backend; the
    /// tables around them untouched.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "hostile_input"]
    async fn hostile_keys_are_refused_and_hostile_owners_are_data(t: TestDb) {
        let payloads = payloads();
        let b = t.backend;
        let db = &t.db;
        // The victim the payloads name, and the table the keys are tried on.
        let x = counters::<i64>("x", 4);
        x.create_table(db).await.unwrap();
        x.add(db, 1, "likes", 42).await.unwrap();
        let c = counters::<i64>("hostile_c", 4);
        c.create_table(db).await.unwrap();
        c.add(db, 1, "likes", 5).await.unwrap();
        let before = raw::all_slot_rows(db, "hostile_c").await;

        let mut rejected = keys_are_refused(&t, &payloads).await;
        assert_eq!(
            raw::all_slot_rows(db, "hostile_c").await,
            before,
            "[{b}] a refused key wrote"
        );
        // The table still works.
        c.add(db, 2, "likes", 3).await.unwrap();
        let counts = c.get_all_keys(db, &[1, 2]).await.unwrap();
        assert_eq!(
            counts[&1],
            HashMap::from([("likes".to_owned(), 5)]),
            "[{b}]"
        );
        assert_eq!(
            counts[&2],
            HashMap::from([("likes".to_owned(), 3)]),
            "[{b}]"
        );

        // The payloads that are valid keys (`--`, `:name`, `NULL`,
        // `excluded`) are data like any other key.
        let valid_keys: Vec<&String> = payloads.iter().filter(|k| key_grammar(k)).collect();
        assert_eq!(valid_keys.len(), 4, "[{b}] {valid_keys:?}");
        let mut want = HashMap::new();
        for (i, key) in valid_keys.iter().enumerate() {
            c.add(db, 3, key.as_str(), i as i64 + 1).await.unwrap();
            want.insert((*key).clone(), i as i64 + 1);
        }
        assert_eq!(c.get_all_keys(db, &[3]).await.unwrap()[&3], want, "[{b}]");

        let (owners_kept, owner_rejections, mut lost) = owners_are_data(&t, &payloads).await;
        let verbatim = owners_kept + valid_keys.len() as u64;
        rejected += owner_rejections;

        // Nothing else was touched.
        assert_eq!(
            raw::count_rows(db, "x").await,
            1,
            "[{b}] the victim table changed"
        );
        let victim = x.get(db, 1, "likes").await.unwrap();
        lost += victim.abs_diff(42);
        assert_eq!(victim, 42, "[{b}]");
        lost += c.get(db, 1, "likes").await.unwrap().abs_diff(5);
        assert_eq!(lost, 0, "[{b}]");
        figures(
            "hostile_input",
            b,
            &[
                ("payloads", payloads.len() as u64),
                ("rejected", rejected),
                ("stored_verbatim", verbatim),
                ("increments_lost", lost),
            ],
        );
        t.finish().await;
    }
}

backend_test! {
    /// Regression (found by `accepted_keys_and_owners_round_trip_through_sqlite`,
    /// seed in `hostile.proptest-regressions`): a string owner with a NUL was
    /// accepted, stored on SQLite and MySQL, and failed on PostgreSQL with a raw
    /// database error (22021) after reaching SQL. It is `InvalidOwner` on every
    /// backend now, before any SQL, so an id valid on one backend is valid on all.
    #[tokio::test(flavor = "multi_thread")]
    #[label = "nul_string_owner"]
    async fn a_nul_in_a_string_owner_is_refused_on_every_backend(t: TestDb) {
        let b = t.backend;
        let s = counters::<String>("nul_owners", 4);
        s.create_table(&t.db).await.unwrap();
        for owner in ["\0", "a\0b", "alice\0"] {
            let owner = owner.to_owned();
            let r = s.add(&t.db, owner.clone(), "likes", 1).await;
            assert!(is_invalid_owner(&r), "[{b}] add {owner:?}: {r:?}");
            let r = s.get(&t.db, owner.clone(), "likes").await;
            assert!(is_invalid_owner(&r), "[{b}] get {owner:?}: {r:?}");
        }
        assert_eq!(raw::count_rows(&t.db, "nul_owners").await, 0, "[{b}]");
        t.finish().await;
    }
}

/// Table names are checked, never panicked on, whatever they hold.
#[test]
fn hostile_table_names_are_refused() {
    let mut names = payloads();
    names.extend(
        [
            "1abc",
            "9",
            "EXCLUDED",
            "Excluded",
            "a-b",
            "a.b",
            "schema.table",
            "t\u{e9}",
            "\u{442}",
            "\u{ff54}",
        ]
        .map(str::to_owned),
    );
    names.push("t".repeat(MAX_TABLE_NAME_LEN + 1));
    names.push("t".repeat(10_000));
    let mut refused = 0;
    for name in &names {
        // Only `NULL` is a valid name among them: a quoted identifier.
        let valid = table_grammar(name);
        refused += usize::from(!valid);
        for r in [
            validate_table_name(name),
            CounterTable::new(name.clone()).map(drop),
        ] {
            match r {
                Ok(()) => assert!(valid, "{name:?} accepted"),
                Err(CounterError::InvalidTableName { name: shown, .. }) => {
                    assert!(!valid, "{name:?} refused");
                    assert!(shown.chars().count() <= 81, "{shown}");
                }
                Err(e) => panic!("{name:?}: {e:?}"),
            }
        }
    }
    assert_eq!(refused, names.len() - 1);
    // The longest valid name, and its bucket table one byte too long.
    let longest = "t".repeat(MAX_TABLE_NAME_LEN);
    assert!(CounterTable::new(longest.clone()).is_ok());
    assert!(matches!(
        CounterTable::new(longest)
            .unwrap()
            .with_key_window("views", Window::Day),
        Err(CounterError::InvalidTableName { .. })
    ));
}

/// Arbitrary strings, and strings built near the rules: the allowed bytes
/// at lengths around the limit, with at most one byte that breaks them.
fn near_grammar(allowed: &'static str, max: usize) -> BoxedStrategy<String> {
    let bytes: Vec<char> = allowed.chars().collect();
    let bad = prop_oneof![
        Just(' '),
        Just('\''),
        Just(';'),
        Just('\0'),
        Just('/'),
        Just('\u{430}'),
        Just('\u{200d}'),
        Just('\u{ff41}'),
        any::<char>(),
    ];
    // Half the lengths at the limit or one off it.
    let len = prop_oneof![0..=max + 2, max - 1..=max + 1];
    let base = len.prop_flat_map(move |n| {
        proptest::collection::vec(proptest::sample::select(bytes.clone()), n)
    });
    let plain = base.clone().prop_map(String::from_iter);
    let spoiled = (base, bad, any::<prop::sample::Index>()).prop_map(|(mut chars, bad, at)| {
        let at = at.index(chars.len() + 1);
        chars.insert(at, bad);
        String::from_iter(chars)
    });
    let any_string = proptest::collection::vec(any::<char>(), 0..100).prop_map(String::from_iter);
    prop_oneof![plain, spoiled, any_string].boxed()
}

const KEY_BYTES: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:";
const TABLE_BYTES: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_";

fn excluded_any_case() -> impl Strategy<Value = String> {
    proptest::collection::vec(any::<bool>(), 8).prop_map(|upper| {
        "excluded"
            .chars()
            .zip(upper)
            .map(|(c, u)| if u { c.to_ascii_uppercase() } else { c })
            .collect()
    })
}

/// `cases` generated cases, after the seeds of past failures in
/// `hostile.proptest-regressions`, next to this file. (proptest's default
/// would look for them in `tests/tests/proptest-regressions/hostile.txt` now
/// that a `main.rs` is beside this file.)
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        source_file: Some(file!()),
        ..ProptestConfig::with_cases(cases)
    }
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn validate_key_accepts_exactly_the_grammar(key in near_grammar(KEY_BYTES, MAX_KEY_LEN)) {
        let verdict = validate_key(&key);
        prop_assert_eq!(verdict.is_ok(), key_grammar(&key), "{:?}: {:?}", key, verdict);
        if let Err(e) = verdict {
            let typed = matches!(e, CounterError::InvalidKey { .. });
            prop_assert!(typed, "{:?}", e);
            prop_assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn validate_table_name_accepts_exactly_the_grammar(
        name in prop_oneof![
            4 => near_grammar(TABLE_BYTES, MAX_TABLE_NAME_LEN),
            1 => excluded_any_case(),
        ]
    ) {
        let verdict = validate_table_name(&name);
        prop_assert_eq!(verdict.is_ok(), table_grammar(&name), "{:?}: {:?}", name, verdict);
        prop_assert_eq!(CounterTable::new(name.clone()).is_ok(), verdict.is_ok());
        if let Err(e) = verdict {
            let typed = matches!(e, CounterError::InvalidTableName { .. });
            prop_assert!(typed, "{:?}", e);
        }
    }
}

/// Any accepted key and any accepted string owner is stored and read back
/// verbatim (SQLite; the payload test above covers the servers).
#[test]
fn accepted_keys_and_owners_round_trip_through_sqlite() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let db = rt.block_on(async {
        let db = Database::connect("sqlite::memory:").await.unwrap();
        counters::<String>("rt", 4).create_table(&db).await.unwrap();
        db
    });
    let s = counters::<String>("rt", 4);
    let owner = prop_oneof![
        near_grammar(KEY_BYTES, MAX_KEY_LEN),
        proptest::collection::vec(any::<char>(), 0..=MAX_STRING_OWNER_LEN + 1)
            .prop_map(String::from_iter),
    ];
    let mut runner = TestRunner::new(config(128));
    let strategy = (near_grammar(KEY_BYTES, MAX_KEY_LEN), owner, any::<i64>());
    runner
        .run(&strategy, |(key, owner, delta)| {
            rt.block_on(async {
                db.execute_unprepared("DELETE FROM rt").await.unwrap();
                let added = s.add(&db, owner.clone(), key.as_str(), delta).await;
                match (validate_key(&key).is_ok(), storable_owner(&owner)) {
                    (false, _) => prop_assert!(is_invalid_key(&added), "{:?}", added),
                    (true, false) => prop_assert!(is_invalid_owner(&added), "{:?}", added),
                    (true, true) => {
                        prop_assert!(added.is_ok(), "{:?}", added);
                        let got = s.get(&db, owner.clone(), key.as_str()).await.unwrap();
                        prop_assert_eq!(got, delta);
                        let all = s
                            .get_all_keys(&db, std::slice::from_ref(&owner))
                            .await
                            .unwrap();
                        let want = if delta == 0 {
                            HashMap::new()
                        } else {
                            HashMap::from([(key.clone(), delta)])
                        };
                        prop_assert_eq!(&all[&owner], &want);
                        let stored = stored_string_owners(&db, "rt").await;
                        let expected: BTreeSet<String> =
                            (delta != 0).then(|| owner.clone()).into_iter().collect();
                        prop_assert_eq!(stored, expected);
                    }
                }
                Ok(())
            })
        })
        .unwrap();
}

backend_test! {
    /// The last step to each end of `i64` is fine, the next is `Overflow` and
    /// changes nothing, through `add` and `DeltaBatch`; a batch with one
    /// overflowing counter (even in its last chunk) applies nothing; slots
    /// that each fit but whose sum does not are never read or folded as a
    /// wrong number.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "overflow_boundaries"]
    async fn overflow_at_the_i64_boundaries(t: TestDb) {
        let b = t.backend;
        let db = &t.db;
        let c = counters::<i64>("edge", 1);
        c.create_table(db).await.unwrap();

        c.add(db, 1, "up", i64::MAX - 1).await.unwrap();
        c.add(db, 1, "up", 1).await.unwrap();
        assert_eq!(c.get(db, 1, "up").await.unwrap(), i64::MAX, "[{b}]");
        assert!(
            is_overflow(&c.add(db, 1, "up", 1).await),
            "[{b}] +1 past MAX"
        );
        assert_eq!(c.get(db, 1, "up").await.unwrap(), i64::MAX, "[{b}]");

        c.add(db, 1, "down", i64::MIN + 1).await.unwrap();
        c.add(db, 1, "down", -1).await.unwrap();
        assert_eq!(c.get(db, 1, "down").await.unwrap(), i64::MIN, "[{b}]");
        assert!(
            is_overflow(&c.add(db, 1, "down", -1).await),
            "[{b}] -1 past MIN"
        );
        assert_eq!(c.get(db, 1, "down").await.unwrap(), i64::MIN, "[{b}]");

        // A DeltaBatch whose folds fit, one of whose counters the database
        // cannot take: nothing is applied, in one statement or many.
        let before = raw::all_slot_rows(db, "edge").await;
        for (key, delta) in [("up", 1), ("down", -1)] {
            let mut small = DeltaBatch::new();
            small.add(&c, 2, "a", 5).unwrap();
            small.add(&c, 1, key, delta).unwrap();
            small.add(&c, 3, "b", 7).unwrap();
            let r = small.apply(db).await;
            assert!(is_overflow(&r), "[{b}] batch over {key}: {r:?}");

            // Owner 1 sorts first: put the overflow in the last of 3 chunks.
            let edge_owner = i64::MAX;
            let edge = if delta > 0 { i64::MAX } else { i64::MIN };
            c.add(db, edge_owner, key, edge).await.unwrap();
            let mut big = DeltaBatch::new();
            for owner in 10..(10 + 2 * UPSERT_ROWS_PER_STATEMENT as i64) {
                big.add(&c, owner, "a", 1).unwrap();
            }
            big.add(&c, edge_owner, key, delta).unwrap();
            let r = big.apply(db).await;
            assert!(is_overflow(&r), "[{b}] 3-chunk batch over {key}: {r:?}");
            let others: Vec<_> = raw::all_slot_rows(db, "edge")
                .await
                .into_iter()
                .filter(|r| r.0 != edge_owner)
                .collect();
            assert_eq!(others, before, "[{b}] a failed batch left rows behind");
            assert_eq!(c.get(db, edge_owner, key).await.unwrap(), edge, "[{b}]");
        }
        // The same boundary folded inside one batch.
        let mut folded = DeltaBatch::new();
        folded.add(&c, 5, "k", i64::MIN + 1).unwrap();
        folded.add(&c, 5, "k", -1).unwrap();
        assert!(
            is_overflow(&folded.add(&c, 5, "k", -1)),
            "[{b}] folded past MIN"
        );
        assert_eq!(folded.apply(db).await.unwrap().rows, 1, "[{b}]");
        assert_eq!(c.get(db, 5, "k").await.unwrap(), i64::MIN, "[{b}]");

        // Several slots: each fits, their sum may not. The write either
        // overflows its slot (and changes nothing) or lands; a read of a
        // sum past MAX is `Overflow`, never a wrapped or clamped number,
        // and compaction refuses to fold it.
        let wide = counters::<i64>("edge_wide", 4);
        wide.create_table(db).await.unwrap();
        wide.add(db, 1, "k", i64::MAX - 1).await.unwrap();
        wide.add(db, 1, "k", 1).await.unwrap();
        assert_eq!(wide.get(db, 1, "k").await.unwrap(), i64::MAX, "[{b}]");
        let past = wide.add(db, 1, "k", 1).await;
        let rows = raw::slot_rows(db, "edge_wide", 1i64, "k").await;
        match past {
            Err(CounterError::Overflow { .. }) => {
                assert_eq!(wide.get(db, 1, "k").await.unwrap(), i64::MAX, "[{b}]");
            }
            Ok(()) => {
                assert!(is_overflow(&wide.get(db, 1, "k").await), "[{b}] {rows:?}");
                assert!(
                    is_overflow(&wide.get_many(db, &[1, 2], &["k"]).await),
                    "[{b}] {rows:?}"
                );
                assert!(
                    is_overflow(&wide.get_all_keys(db, &[1]).await),
                    "[{b}] {rows:?}"
                );
                let r = wide.compact(db, &Compact::new()).await;
                assert!(
                    is_overflow(&r),
                    "[{b}] compaction folded an overflow: {r:?}"
                );
                assert_eq!(
                    raw::slot_rows(db, "edge_wide", 1i64, "k").await,
                    rows,
                    "[{b}] a failed compaction changed rows"
                );
            }
            Err(e) => panic!("[{b}] {e:?}"),
        }
        t.finish().await;
    }
}

backend_test! {
    /// 0 owners: an empty map and no query (the table does not even exist).
    /// 1,000,000 owners: one call, every owner zero-filled but the few written.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "million_owner_read"]
    async fn batch_reads_of_zero_and_a_million_owners(t: TestDb) {
        const OWNERS: i64 = 1_000_000;
        let b = t.backend;
        let db = &t.db;
        let ghost = counters::<i64>("never_created", 4);
        assert!(
            ghost
                .get_many(db, &[], &["likes"])
                .await
                .unwrap()
                .is_empty(),
            "[{b}]"
        );
        assert!(
            ghost.get_all_keys(db, &[]).await.unwrap().is_empty(),
            "[{b}]"
        );
        let no_keys: [&str; 0] = [];
        let empty = ghost.get_many(db, &[1, 2], &no_keys).await.unwrap();
        assert!(
            empty.len() == 2 && empty.values().all(HashMap::is_empty),
            "[{b}]"
        );

        let c = counters::<i64>("wide_read", 4);
        c.create_table(db).await.unwrap();
        let written = [(0, 3), (1, -1), (499_999, 7), (OWNERS - 1, 11)];
        c.add_many(db, written.map(|(o, v)| (o, "likes", v)))
            .await
            .unwrap();
        let owners: Vec<i64> = (0..OWNERS).collect();
        let started = Instant::now();
        let counts = c.get_many(db, &owners, &["likes"]).await.unwrap();
        let millis = started.elapsed().as_millis() as u64;
        eprintln!("[{b}] get_many of {OWNERS} owners: {millis} ms");
        assert_eq!(counts.len(), OWNERS as usize, "[{b}]");
        let mut nonzero = 0;
        for (owner, keys) in &counts {
            assert_eq!(keys.len(), 1, "[{b}] owner {owner}");
            let want = written
                .iter()
                .find(|(o, _)| o == owner)
                .map_or(0, |(_, v)| *v);
            assert_eq!(keys["likes"], want, "[{b}] owner {owner}");
            nonzero += usize::from(want != 0);
        }
        assert_eq!(nonzero, written.len(), "[{b}]");
        figures(
            "million_owner_read",
            b,
            &[
                ("owners_read", OWNERS as u64),
                ("owners_written", written.len() as u64),
                ("read_ms", millis),
                ("increments_lost", 0),
            ],
        );
        t.finish().await;
    }
}

backend_test! {
    /// 100,000 distinct rows in one `add_many`: all stored exactly, in one
    /// statement per `UPSERT_ROWS_PER_STATEMENT` rows; and a batch of as many
    /// whose last row overflows applies none of them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "batch_100k_rows"]
    async fn a_batch_of_100k_rows_is_exact_chunked_and_atomic(t: TestDb) {
        const ROWS: i64 = 100_000;
        let b = t.backend;
        let db = &t.db;
        let c = counters::<i64>("big_batch", 4);
        c.create_table(db).await.unwrap();
        let value = |owner: i64| owner % 97 + 1;
        let started = Instant::now();
        let outcome = c
            .add_many(db, (0..ROWS).map(|o| (o, "k", value(o))))
            .await
            .unwrap();
        let millis = started.elapsed().as_millis() as u64;
        eprintln!("[{b}] add_many of {ROWS} rows: {millis} ms");
        assert_eq!(outcome.rows, ROWS as usize, "[{b}]");
        assert_eq!(
            outcome.statements,
            (ROWS as usize).div_ceil(UPSERT_ROWS_PER_STATEMENT),
            "[{b}]"
        );
        assert_eq!(raw::count_rows(db, "big_batch").await, ROWS, "[{b}]");
        let owners: Vec<i64> = (0..ROWS).collect();
        let counts = c.get_many(db, &owners, &["k"]).await.unwrap();
        let mut lost = 0u64;
        for o in 0..ROWS {
            lost += counts[&o]["k"].abs_diff(value(o));
        }
        assert_eq!(lost, 0, "[{b}]");

        // The same 100,000 counters again, the last at the edge of i64:
        // the last chunk overflows, and the first 99 are rolled back.
        // Every slot of the last counter at i64::MAX, so whichever slot the
        // batch picks for it overflows.
        for slot in 0..4 {
            raw::insert_slot(db, "big_batch", ROWS, "k", slot, i64::MAX).await;
        }
        let r = c.add_many(db, (0..=ROWS).map(|o| (o, "k", 1))).await;
        assert!(is_overflow(&r), "[{b}] {r:?}");
        assert_eq!(raw::count_rows(db, "big_batch").await, ROWS + 4, "[{b}]");
        let after = c.get_many(db, &owners, &["k"]).await.unwrap();
        let changed = (0..ROWS).filter(|o| after[o]["k"] != value(*o)).count();
        assert_eq!(changed, 0, "[{b}] a failed batch was partly applied");
        figures(
            "batch_100k_rows",
            b,
            &[
                ("batch_rows", ROWS as u64),
                ("statements", outcome.statements as u64),
                ("batch_ms", millis),
                ("increments_lost", lost),
            ],
        );
        t.finish().await;
    }
}
