//! Unique counts on every backend: accuracy from 10 to 1,000,000 members,
//! merges across slots, connections and flushes equal to one sketch of the
//! union, idempotent re-sends, windowed unions, concurrent writers racing a
//! compaction, misuse and hostile members.

use std::sync::Arc;

use chrono::{DateTime, Duration, TimeZone, Utc};
use counter_core::{
    CounterError, ErrorKind,
    unique::{Sketch, sketch::STANDARD_ERROR},
};
use counter_tests::{TestDb, backend_test, figures, members_missing, raw, sql, uniques};
use sea_orm::ConnectionTrait;

fn day(d: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, d, 0, 0, 0).unwrap()
}

/// Whether two sketches hold the same registers (compared by their bytes,
/// which are canonical; a mismatch is printed as the sketches' summaries,
/// not 12 kB of bytes).
fn same(a: &Sketch, b: &Sketch) -> bool {
    a.to_bytes() == b.to_bytes()
}

/// The one sketch of `members`, built in memory: what every merge must equal.
fn sketch_of<'a>(members: impl IntoIterator<Item = &'a str>) -> Sketch {
    let mut sketch = Sketch::new();
    for member in members {
        sketch.insert(member);
    }
    sketch
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "unique_accuracy"]
    async fn estimates_stay_within_three_standard_errors_up_to_a_million(t: TestDb) {
        let c = uniques("unique_accuracy", 4);
        c.create_table(&t.db).await.unwrap();
        let mut seen = Vec::new();
        for (owner, n) in [(1_i64, 10_u64), (2, 1_000), (3, 100_000), (4, 1_000_000)] {
            let members: Vec<String> = (0..n).map(|i| format!("user:{i}")).collect();
            // Chunks of 50,000 members: each one sketch, merged into a slot.
            for chunk in members.chunks(50_000) {
                let items = chunk.iter().map(|m| (owner, "viewers", m.as_str()));
                c.observe_many(&t.db, items).await.unwrap();
            }
            let estimate = c.unique(&t.db, owner, "viewers").await.unwrap();
            let expected = sketch_of(members.iter().map(String::as_str));
            let stored = c.sketch(&t.db, owner, "viewers").await.unwrap();
            assert!(
                same(&stored, &expected),
                "{n}: the stored slots merge to the sketch of the whole set"
            );
            let error = (estimate as f64 - n as f64).abs() / n as f64;
            assert!(
                error <= 3.0 * STANDARD_ERROR,
                "{n} members estimated {estimate}: error {error:.4} > 3 standard errors"
            );
            seen.push((n, estimate));
        }
        // At 10 members the estimate is exact (linear counting over the
        // sparse registers; 1,000 already reads a few off).
        assert_eq!(seen[0], (10, 10));
        let error_ppm = |(n, e): (u64, u64)| (e.abs_diff(n) * 1_000_000) / n;
        figures(
            "unique_accuracy",
            t.backend,
            &[
                ("estimate_at_10", seen[0].1),
                ("estimate_at_1k", seen[1].1),
                ("estimate_at_100k", seen[2].1),
                ("estimate_at_1m", seen[3].1),
                ("error_ppm_at_1m", error_ppm(seen[3])),
            ],
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "unique_merges"]
    async fn merges_across_slots_connections_and_flushes_equal_one_sketch(t: TestDb) {
        let c = uniques("unique_merges", 8);
        c.create_table(&t.db).await.unwrap();
        let members: Vec<String> = (0..5_000).map(|i| format!("m{i}")).collect();
        // A second pool on the same database: another process's writes.
        let other = match t.server_addr() {
            Some(addr) => t.connect_via(&addr, 2).await.unwrap(),
            None => t.db.clone(),
        };
        for (i, member) in members[..400].iter().enumerate() {
            let db = if i % 2 == 0 { &t.db } else { &other };
            c.observe(db, 1, "viewers", member.as_str()).await.unwrap();
        }
        let slots = raw::slot_rows_of(&t.db, "unique_merges_sketches", 1, "viewers").await;
        assert!(slots > 1, "single observes spread over the slots: {slots} rows");
        // Flushes of sketches built in memory, each of an overlapping part.
        for part in members.chunks(1_500) {
            let flush = sketch_of(part.iter().map(String::as_str));
            c.observe_sketch(&t.db, 1, "viewers", &flush).await.unwrap();
        }
        let union = sketch_of(members.iter().map(String::as_str));
        let stored = c.sketch(&t.db, 1, "viewers").await.unwrap();
        assert!(same(&stored, &union), "{stored:?} {union:?}");
        if t.server_addr().is_some() {
            other.close().await.unwrap();
        }
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "unique_resent"]
    async fn a_flush_sent_twice_or_a_member_seen_twice_changes_nothing(t: TestDb) {
        let c = uniques("unique_resent", 1);
        c.create_table(&t.db).await.unwrap();
        let flush = sketch_of(["ann", "bob", "cy"]);
        c.observe_sketch(&t.db, 1, "viewers", &flush).await.unwrap();
        let first = raw::sketch_bytes(&t.db, "unique_resent_sketches", 1, "viewers").await;
        // The same flush again (a redelivered message), then its members
        // one by one, then an empty sketch: the stored bytes never change.
        c.observe_sketch(&t.db, 1, "viewers", &flush).await.unwrap();
        for member in ["cy", "bob", "ann"] {
            c.observe(&t.db, 1, "viewers", member).await.unwrap();
        }
        c.observe_sketch(&t.db, 1, "viewers", &Sketch::new()).await.unwrap();
        let again = raw::sketch_bytes(&t.db, "unique_resent_sketches", 1, "viewers").await;
        assert_eq!(first, again);
        assert_eq!(first.len(), 1, "one slot row");
        assert_eq!(c.unique(&t.db, 1, "viewers").await.unwrap(), 3);
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "unique_windows"]
    async fn a_range_is_the_union_of_its_days_not_their_sum(t: TestDb) {
        let c = uniques("unique_windows", 2);
        c.create_table(&t.db).await.unwrap();
        let noon = |d| day(d) + Duration::hours(12);
        for member in ["ann", "bob", "cy"] {
            c.observe_at(&t.db, 1, "visitors", member, noon(2)).await.unwrap();
        }
        for member in ["bob", "cy", "dee"] {
            c.observe_at(&t.db, 1, "visitors", member, noon(3)).await.unwrap();
        }
        c.observe_at(&t.db, 2, "visitors", "eve", noon(3)).await.unwrap();
        let over = |owner, from, to| c.unique_over(&t.db, owner, "visitors", from, to);
        assert_eq!(over(1, day(2), day(3)).await.unwrap(), 3, "Monday");
        assert_eq!(over(1, day(3), day(4)).await.unwrap(), 3, "Tuesday");
        assert_eq!(over(1, day(2), day(4)).await.unwrap(), 4, "both days: 4 people, not 6");
        assert_eq!(over(1, day(4), day(9)).await.unwrap(), 0, "no visit");
        assert_eq!(c.unique(&t.db, 1, "visitors").await.unwrap(), 4, "all time");
        let many = c
            .unique_over_many(&t.db, &[1, 2, 3], "visitors", day(1), day(9))
            .await
            .unwrap();
        assert_eq!((many[&1], many[&2], many[&3]), (4, 1, 0));
        let err = over(1, day(4), day(2)).await.unwrap_err();
        assert!(matches!(err, CounterError::InvalidRange { .. }), "{err}");
        let err = c
            .unique_over(&t.db, 1, "viewers", day(2), day(4))
            .await
            .unwrap_err();
        assert!(matches!(err, CounterError::NotWindowed { .. }), "{err}");
        // Pruning Monday leaves Tuesday and the all-time sketch.
        let deleted = c.prune(&t.db, day(3)).await.unwrap();
        assert_eq!(deleted, 2, "Monday's rows (2 slots)");
        assert_eq!(over(1, day(2), day(4)).await.unwrap(), 3);
        assert_eq!(c.unique(&t.db, 1, "visitors").await.unwrap(), 4);
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "unique_concurrency"]
    async fn concurrent_writers_on_one_owner_race_a_compaction(t: TestDb) {
        const WRITERS: usize = 12;
        const EACH: usize = 150;
        let c = Arc::new(uniques("unique_concurrency", 8));
        c.create_table(&t.db).await.unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let compactor = {
            let (c, db, stop) = (c.clone(), t.db.clone(), stop.clone());
            tokio::spawn(async move {
                let mut folded = 0;
                // Bounded: at most 2,000 passes, and stopped once writers end.
                for _ in 0..2_000 {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let report = c.compact(&db, &Default::default()).await.unwrap();
                    folded += report.sketches.counters_folded;
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                folded
            })
        };
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (c, db) = (c.clone(), t.db.clone());
                tokio::spawn(async move {
                    for i in 0..EACH {
                        let member = format!("w{w}:{i}");
                        c.observe(&db, 1, "viewers", member.as_str()).await.unwrap();
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.await.unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let folded = compactor.await.unwrap();
        let members: Vec<String> = (0..WRITERS)
            .flat_map(|w| (0..EACH).map(move |i| format!("w{w}:{i}")))
            .collect();
        let union = sketch_of(members.iter().map(String::as_str));
        let stored = c.sketch(&t.db, 1, "viewers").await.unwrap();
        assert!(same(&stored, &union), "no member lost: {stored:?} {union:?}");
        let report = c.compact(&t.db, &Default::default()).await.unwrap();
        let rows = raw::slot_rows_of(&t.db, "unique_concurrency_sketches", 1, "viewers").await;
        assert_eq!(rows, 1, "compacted into one row: {report:?}");
        assert!(same(&c.sketch(&t.db, 1, "viewers").await.unwrap(), &union));
        figures(
            "unique_concurrency",
            t.backend,
            &[
                ("observes", (WRITERS * EACH) as u64),
                ("members_lost", members_missing(&stored, members.iter().map(String::as_str))),
                ("compactions_folding", folded),
                ("estimate", stored.estimate()),
            ],
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "unique_misuse"]
    async fn wrong_key_kinds_are_misuse_and_hostile_members_count(t: TestDb) {
        let c = uniques("unique_misuse", 2);
        c.create_table(&t.db).await.unwrap();
        assert!(c.check_table(&t.db).await.unwrap().is_empty());
        let misuse = |e: CounterError| {
            assert!(matches!(e, CounterError::WrongKeyKind { .. }), "{e}");
            assert_eq!(e.kind(), ErrorKind::Misuse);
        };
        misuse(c.add(&t.db, 1, "viewers", 1).await.unwrap_err());
        misuse(c.add_many(&t.db, [(1, "viewers", 1)]).await.unwrap_err());
        misuse(c.get(&t.db, 1, "viewers").await.unwrap_err());
        misuse(c.get_many(&t.db, &[1], &["likes", "viewers"]).await.unwrap_err());
        misuse(c.observe(&t.db, 1, "likes", "ann").await.unwrap_err());
        misuse(c.unique(&t.db, 1, "likes").await.unwrap_err());
        misuse(c.unique_many(&t.db, &[1], &["likes"]).await.unwrap_err());
        let err = c.observe(&t.db, 1, "bad key", "ann").await.unwrap_err();
        assert!(matches!(err, CounterError::InvalidKey { .. }), "{err}");
        // Nothing was written by any of them.
        assert_eq!(raw::count_rows(&t.db, "unique_misuse").await, 0);
        assert_eq!(raw::count_rows(&t.db, "unique_misuse_sketches").await, 0);

        let huge = "x".repeat(1 << 20);
        let hostile = ["", "ü", "\0", "'; DROP TABLE unique_misuse; --", huge.as_str(), "😀"];
        for member in hostile {
            c.observe(&t.db, 1, "viewers", member).await.unwrap();
        }
        let bytes: &[u8] = &[0xff, 0xfe];
        c.observe(&t.db, 1, "viewers", bytes).await.unwrap();
        assert_eq!(c.unique(&t.db, 1, "viewers").await.unwrap(), 7);
        let counts = c.unique_many(&t.db, &[1, 2, 1], &["viewers"]).await.unwrap();
        assert_eq!((counts[&1]["viewers"], counts[&2]["viewers"]), (7, 0));
        // Plain keys of the same table still count deltas.
        c.add(&t.db, 1, "likes", 2).await.unwrap();
        assert_eq!(c.get(&t.db, 1, "likes").await.unwrap(), 2);
        // A purge removes an owner's sketches with its counts.
        assert!(c.purge(&t.db, &[1]).await.unwrap() >= 2);
        assert_eq!(c.unique(&t.db, 1, "viewers").await.unwrap(), 0);
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "unique_rebuild"]
    async fn a_rebuild_merges_the_members_table_in(t: TestDb) {
        use counter_core::unique::Members;
        use sea_orm::{
            ConnectionTrait,
            sea_query::{Alias, ColumnDef, Index, Query, Table},
        };
        let c = uniques("unique_rebuild", 2);
        c.create_table(&t.db).await.unwrap();
        // The app's own record: a join table made by the schema builder.
        let create = Table::create()
            .table(Alias::new("post_views"))
            .col(ColumnDef::new(Alias::new("post_id")).big_integer().not_null())
            .col(ColumnDef::new(Alias::new("user_id")).big_integer().not_null())
            .primary_key(Index::create().col(Alias::new("post_id")).col(Alias::new("user_id")))
            .to_owned();
        t.sql().execute(&create).await.unwrap();
        // 1,200 posts (two chunks of owners); post p has p % 50 + 1 viewers,
        // post 7 has 3,000.
        let views = |post: i64| if post == 7 { 3_000 } else { post % 50 + 1 };
        let rows: Vec<(i64, i64)> = (1..=1_200)
            .flat_map(|post| (0..views(post)).map(move |user| (post, user * 31 + post)))
            .collect();
        for chunk in rows.chunks(2_000) {
            let mut insert = Query::insert();
            insert
                .into_table(Alias::new("post_views"))
                .columns([Alias::new("post_id"), Alias::new("user_id")]);
            for &(post, user) in chunk {
                insert.values_panic([post.into(), user.into()]);
            }
            t.sql().execute(&insert).await.unwrap();
        }
        // One viewer was observed already, one is new: both stay counted.
        c.observe(&t.db, 7, "viewers", &7_i64).await.unwrap();
        c.observe(&t.db, 7, "viewers", "not-in-the-table").await.unwrap();
        let members = Members::of("post_views", "post_id", "user_id").unwrap();
        let report = c.rebuild(&t.db, "viewers", &members).await.unwrap();
        assert_eq!((report.owners, report.members), (1_200, rows.len() as u64));
        for post in [1_i64, 7, 49, 50, 1_000, 1_200] {
            let mut expected = Sketch::new();
            for user in (0..views(post)).map(|u| u * 31 + post) {
                expected.insert(&user);
            }
            if post == 7 {
                expected.insert("not-in-the-table");
            }
            let stored = c.sketch(&t.db, post, "viewers").await.unwrap();
            assert!(same(&stored, &expected), "post {post}: {stored:?}, {expected:?}");
        }
        // Again: nothing changes.
        c.rebuild(&t.db, "viewers", &members).await.unwrap();
        assert_eq!(c.unique(&t.db, 50, "viewers").await.unwrap(), 1);
        let bad = Members::of("post_views; --", "post_id", "user_id").unwrap_err();
        assert!(matches!(bad, CounterError::InvalidTableName { .. }), "{bad}");
        t.finish().await;
    }
}

backend_test! {
    /// A rebuild given the members' time column fills the day buckets of a
    /// windowed key as well as its all-time sketch: each day's union, and
    /// the three days', equal sketches of that day's members made in
    /// memory. Read once from a timestamp without a time zone and once
    /// from one with (the second run changes nothing); a `NULL` time counts
    /// all-time only; a time column for a key without a window is refused.
    #[tokio::test(flavor = "multi_thread")]
    #[label = "unique_rebuild_buckets"]
    async fn a_rebuild_with_a_time_column_fills_the_day_buckets(t: TestDb) {
        use counter_core::unique::Members;
        use sea_orm::{
            ConnectionTrait,
            sea_query::{Alias, ColumnDef, Query, Table},
        };
        let c = uniques("unique_rebuild_days", 2);
        c.create_table(&t.db).await.unwrap();
        let create = Table::create()
            .table(Alias::new("post_visits"))
            .col(ColumnDef::new(Alias::new("post_id")).big_integer().not_null())
            .col(ColumnDef::new(Alias::new("user_id")).big_integer().not_null())
            .col(ColumnDef::new(Alias::new("visited_at")).date_time().null())
            .col(ColumnDef::new(Alias::new("visited_tz")).timestamp_with_time_zone().null())
            .to_owned();
        t.sql().execute(&create).await.unwrap();
        // 40 posts, visits on November 2, 3 and 4 at several hours; users
        // return on later days; post 5 also has a visit of unknown time.
        let mut rows: Vec<(i64, i64, Option<DateTime<Utc>>)> = Vec::new();
        for post in 1..=40_i64 {
            for d in 2..=4_u32 {
                for user in 0..(post % 7 + 3) {
                    let user = user + i64::from(d) * 2; // overlaps the day before
                    let at = day(d) + Duration::minutes(user * 97 % 1_440);
                    rows.push((post, user, Some(at)));
                }
            }
        }
        rows.push((5, 9_999, None));
        for chunk in rows.chunks(500) {
            let mut insert = Query::insert();
            insert.into_table(Alias::new("post_visits")).columns([
                Alias::new("post_id"),
                Alias::new("user_id"),
                Alias::new("visited_at"),
                Alias::new("visited_tz"),
            ]);
            for &(post, user, at) in chunk {
                insert.values_panic([
                    post.into(),
                    user.into(),
                    at.map(|at| at.naive_utc()).into(),
                    at.into(),
                ]);
            }
            t.sql().execute(&insert).await.unwrap();
        }
        let members = Members::of("post_visits", "post_id", "user_id").unwrap();
        let refused = c.rebuild(&t.db, "viewers", &members.clone().at("visited_at").unwrap()).await.unwrap_err();
        assert!(matches!(refused, CounterError::NotWindowed { .. }), "{refused}");
        let report = c.rebuild(&t.db, "visitors", &members.clone().at("visited_at").unwrap()).await.unwrap();
        assert_eq!((report.owners, report.members, report.buckets), (40, rows.len() as u64, 120));
        let again = c.rebuild(&t.db, "visitors", &members.at("visited_tz").unwrap()).await.unwrap();
        assert_eq!(again.buckets, 120);
        let mut checked = 0;
        for post in [1_i64, 5, 6, 40] {
            let of = |keep: &dyn Fn(&Option<DateTime<Utc>>) -> bool| {
                let mut sketch = Sketch::new();
                for (_, user, _) in rows.iter().filter(|(p, _, at)| *p == post && keep(at)) {
                    sketch.insert(user);
                }
                sketch.estimate()
            };
            for d in 2..=4_u32 {
                let stored = c.unique_over(&t.db, post, "visitors", day(d), day(d + 1)).await.unwrap();
                let expected = of(&|at| at.is_some_and(|at| at >= day(d) && at < day(d + 1)));
                assert_eq!(stored, expected, "post {post}, November {d}");
                checked += 1;
            }
            let days = c.unique_over(&t.db, post, "visitors", day(2), day(5)).await.unwrap();
            assert_eq!(days, of(&|at| at.is_some()), "post {post}: the three days' union");
            let all = c.unique(&t.db, post, "visitors").await.unwrap();
            assert_eq!(all, of(&|_| true), "post {post}: all time, the untimed visit too");
        }
        figures(
            "unique_rebuild_buckets",
            t.backend,
            &[("rows", rows.len() as u64), ("buckets", report.buckets), ("days_checked", checked)],
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "unique_migration"]
    async fn a_unique_key_added_to_an_existing_table_gets_its_sketch_table(t: TestDb) {
        use blog_migration::MigrationTrait;
        // Last release: plain counters only, with rows.
        let before = counter_tests::counters::<i64>("unique_migration", 4);
        before.create_table(&t.db).await.unwrap();
        before.add(&t.db, 1, "likes", 5).await.unwrap();
        // This release declares `viewers(unique)`: the check names the
        // missing table, the migration creates it, twice is harmless.
        let after = uniques("unique_migration", 4);
        let drift = after.check_table(&t.db).await.unwrap();
        assert_eq!(drift.len(), 1, "{drift:?}");
        let err = after.observe(&t.db, 1, "viewers", "ann").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::SchemaMissing, "{err}");
        let schema = sql::schema(&t.db).await;
        let migration = after.sketch_migration();
        assert_eq!(
            blog_migration::MigrationName::name(&migration),
            "counter_core_sketches_unique_migration"
        );
        migration.up(&schema).await.unwrap();
        migration.up(&schema).await.unwrap();
        sql::done(schema).await;
        assert!(after.check_table(&t.db).await.unwrap().is_empty());
        after.observe(&t.db, 1, "viewers", "ann").await.unwrap();
        assert_eq!(after.unique(&t.db, 1, "viewers").await.unwrap(), 1);
        assert_eq!(after.get(&t.db, 1, "likes").await.unwrap(), 5);
        let schema = sql::schema(&t.db).await;
        migration.down(&schema).await.unwrap();
        sql::done(schema).await;
        assert_eq!(after.check_table(&t.db).await.unwrap().len(), 1);
        let schema = sql::schema(&t.db).await;
        assert!(before.sketch_migration().up(&schema).await.is_err(), "no unique key");
        sql::done(schema).await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "unique_dropped_calls"]
    async fn observes_dropped_mid_flight_strand_nothing(t: TestDb) {
        use std::time::Duration;
        let c = uniques("unique_dropped_calls", 4);
        c.create_table(&t.db).await.unwrap();
        // Each observe given up after 0 to 2 ms, as axum drops a handler
        // whose client left: done or not, nothing may be left behind.
        let mut acknowledged = Vec::new();
        for i in 0..300_u64 {
            let member = format!("m{i}");
            let limit = Duration::from_micros(i % 2_000);
            let call = c.observe(&t.db, 1, "viewers", member.as_str());
            if let Ok(done) = tokio::time::timeout(limit, call).await {
                done.unwrap();
                acknowledged.push(member);
            }
        }
        // The pool still serves every call, promptly.
        let again = tokio::time::timeout(Duration::from_secs(30), async {
            for i in 0..50 {
                c.observe(&t.db, 2, "viewers", format!("n{i}").as_str()).await?;
            }
            c.sketch(&t.db, 1, "viewers").await
        })
        .await
        .expect("no connection stranded by the dropped calls")
        .unwrap();
        let lost = members_missing(&again, acknowledged.iter().map(String::as_str));
        assert_eq!(lost, 0, "every acknowledged observe is counted");
        assert_eq!(c.unique(&t.db, 2, "viewers").await.unwrap(), 50);
        figures(
            "unique_dropped_calls",
            t.backend,
            &[("acknowledged", acknowledged.len() as u64), ("given_up", 300 - acknowledged.len() as u64), ("members_lost", lost)],
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "unique_set_merges"]
    async fn batches_of_many_counters_merge_in_chunks_into_new_and_existing_rows(t: TestDb) {
        // 600 owners: more than one chunk of set statements (256 cells),
        // first into rows that do not exist, then into the same rows.
        let c = uniques("unique_chunks", 2);
        c.create_table(&t.db).await.unwrap();
        let owners = 1..=600_i64;
        let first = owners.clone().flat_map(|o| [(o, "viewers", format!("a{o}")), (o, "viewers", format!("b{o}"))]);
        c.observe_many(&t.db, first).await.unwrap();
        let second = owners.clone().flat_map(|o| [(o, "viewers", format!("b{o}")), (o, "viewers", format!("c{o}"))]);
        c.observe_many(&t.db, second).await.unwrap();
        // Seen before, nothing new: no row changes.
        let again = owners.clone().map(|o| (o, "viewers", format!("a{o}")));
        c.observe_many(&t.db, again).await.unwrap();
        let all: Vec<i64> = owners.clone().collect();
        let estimates = c.unique_many(&t.db, &all, &["viewers"]).await.unwrap();
        for owner in owners {
            let expected = sketch_of([format!("a{owner}"), format!("b{owner}"), format!("c{owner}")].iter().map(String::as_str));
            let stored = c.sketch(&t.db, owner, "viewers").await.unwrap();
            assert!(same(&stored, &expected), "[{}] owner {owner}", t.backend);
            assert_eq!(estimates[&owner]["viewers"], 3, "[{}] owner {owner}", t.backend);
        }
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "unique_lookalike_owners"]
    async fn owners_a_collation_calls_equal_merge_into_the_row_it_finds(t: TestDb) {
        // A sketch table whose owner column compares case-insensitively
        // (MySQL's default collations, in a table made by a migration):
        // "Ann", "ann" and "ANN" are one row there, three elsewhere. A
        // batch holding all three merges each into the row the database
        // finds, never inserting beside it or losing a member.
        let table = counter_core::CounterTable::new("unique_lookalike")
            .and_then(|t| t.with_slots(1))
            .and_then(|t| t.with_unique_key("viewers"))
            .unwrap();
        let c = counter_core::Counters::<String>::new(table);
        c.create_table(&t.db).await.unwrap();
        let case_insensitive = t.backend == counter_tests::Backend::MySql;
        if case_insensitive {
            t.db.execute_unprepared(
                "ALTER TABLE unique_lookalike_sketches MODIFY owner_id \
                 VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL",
            )
            .await
            .unwrap();
        }
        c.observe(&t.db, "Ann".to_owned(), "viewers", "m1").await.unwrap();
        let batch = [("ann", "m2"), ("ANN", "m3"), ("Bob", "m4")]
            .map(|(owner, member)| (owner.to_owned(), "viewers", member));
        c.observe_many(&t.db, batch).await.unwrap();
        let rows = raw::count_rows(&t.db, "unique_lookalike_sketches").await;
        if case_insensitive {
            // Read by the spelling stored (reads key their answer by it).
            let ann = c.sketch(&t.db, "Ann".to_owned(), "viewers").await.unwrap();
            assert!(
                same(&ann, &sketch_of(["m1", "m2", "m3"])),
                "one row holds all three: {} rows, estimate {}",
                rows,
                ann.estimate()
            );
            assert_eq!(rows, 2, "Ann's row and Bob's");
        } else {
            for (owner, member) in [("Ann", "m1"), ("ann", "m2"), ("ANN", "m3"), ("Bob", "m4")] {
                let stored = c.sketch(&t.db, owner.to_owned(), "viewers").await.unwrap();
                assert!(same(&stored, &sketch_of([member])), "[{}] {owner}", t.backend);
            }
            assert_eq!(rows, 4);
        }
        t.finish().await;
    }
}
