//! Time-bucketed counters: hour and day buckets, half-open ranges, zero-filled
//! series, batch reads, pruning and concurrent backfills, on every backend.

use std::collections::HashMap;

use chrono::{DateTime, Duration, TimeZone, Utc};
use counter_core::{
    CounterError, CounterTable, Counters, DeltaBatch, Series, Window, limits::MAX_SERIES_BUCKETS,
    prelude::*,
};
use counter_tests::{TestDb, backend_test, raw};
use sea_orm::{
    ConnectionTrait, TransactionTrait,
    sea_query::{Alias, Expr, ExprTrait, Query},
};

/// A typed entity with one plain key, one day-windowed and one hour-windowed key.
mod clip {
    use counter_core::SlottedCounter;
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, SlottedCounter)]
    #[sea_orm(table_name = "clips")]
    #[counter(
        keys(likes, views(window = day), plays(window = hour)),
        slots = 4,
        table = "clip_counters"
    )]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

use clip::counters::Key;

fn at(y: i32, m: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, m, d, h, mi, s).unwrap()
}

fn day(y: i32, m: u32, d: u32) -> DateTime<Utc> {
    at(y, m, d, 0, 0, 0)
}

/// Dynamic counters in `name`, with `slots` slots, `views` by day and
/// `plays` by hour.
fn windowed(name: &str, slots: u16) -> Counters<i64> {
    Counters::new(
        CounterTable::new(name.to_owned())
            .and_then(|t| t.with_slots(slots))
            .and_then(|t| t.with_key_window("views", Window::Day))
            .and_then(|t| t.with_key_window("plays", Window::Hour))
            .expect("a valid table"),
    )
}

/// The counts of a series, without the bucket starts.
fn counts(series: &Series) -> Vec<i64> {
    series.iter().map(|(_, n)| *n).collect()
}

/// The bucket starts of a series.
fn starts(series: &Series) -> Vec<DateTime<Utc>> {
    series.iter().map(|(b, _)| *b).collect()
}

/// The distinct stored `bucket` values of one counter, read behind the
/// crate's back, ascending.
async fn stored_buckets(t: &TestDb, table: &str, owner: i64, key: &str) -> Vec<i64> {
    let select = Query::select()
        .distinct()
        .column(Alias::new("bucket"))
        .from(Alias::new(table))
        .and_where(Expr::col(Alias::new("owner_id")).eq(owner))
        .and_where(Expr::col(Alias::new("count_key")).eq(key))
        .order_by(Alias::new("bucket"), sea_orm::Order::Asc)
        .to_owned();
    t.sql()
        .query_all(&select)
        .await
        .expect("read buckets")
        .iter()
        .map(|row| row.try_get::<i64>("", "bucket").expect("bucket"))
        .collect()
}

fn not_windowed<T>(result: &Result<T, CounterError>) -> bool {
    matches!(
        result,
        Err(CounterError::NotWindowed { table, key }) if table == "clip_counters" && key == "likes"
    )
}

fn is_invalid_range<T: std::fmt::Debug>(result: &Result<T, CounterError>) -> bool {
    matches!(result, Err(CounterError::InvalidRange { .. }))
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "window_boundaries"]
    async fn typed_day_and_hour_bucket_boundaries(t: TestDb) {
        clip::Entity::counters().create_table(&t.db).await.unwrap();
        let b = t.backend;

        // Day: the last millisecond of Nov 22 and the first instant of Nov 23.
        let last_ms = at(2026, 11, 22, 23, 59, 59) + Duration::milliseconds(999);
        let midnight = day(2026, 11, 23);
        clip::Entity::counters()
            .add_at(&t.db, 1, Key::Views, 3, last_ms)
            .await
            .unwrap();
        clip::Entity::counters()
            .add_at(&t.db, 1, Key::Views, 5, midnight)
            .await
            .unwrap();
        let series = clip::Entity::counters()
            .series(&t.db, 1, Key::Views, day(2026, 11, 22), day(2026, 11, 24))
            .await
            .unwrap();
        assert_eq!(
            series,
            vec![(day(2026, 11, 22), 3), (day(2026, 11, 23), 5)],
            "[{b}]"
        );
        let nov_22 = clip::Entity::counters()
            .range(&t.db, 1, Key::Views, day(2026, 11, 22), midnight)
            .await
            .unwrap();
        let nov_23 = clip::Entity::counters()
            .range(&t.db, 1, Key::Views, midnight, day(2026, 11, 24))
            .await
            .unwrap();
        assert_eq!((nov_22, nov_23), (3, 5), "[{b}]");
        assert_eq!(
            stored_buckets(&t, "clip_counters_buckets", 1, "views").await,
            [day(2026, 11, 22).timestamp(), midnight.timestamp()],
            "[{b}] buckets are stored as the Unix seconds of their start"
        );

        // Hour: 10:59:59.999 and 11:00:00.
        let ten = at(2026, 11, 22, 10, 0, 0);
        let eleven = at(2026, 11, 22, 11, 0, 0);
        clip::Entity::counters()
            .add_at(
                &t.db,
                1,
                Key::Plays,
                2,
                at(2026, 11, 22, 10, 59, 59) + Duration::milliseconds(999),
            )
            .await
            .unwrap();
        clip::Entity::counters()
            .add_at(&t.db, 1, Key::Plays, 7, eleven)
            .await
            .unwrap();
        let series = clip::Entity::counters()
            .series(&t.db, 1, Key::Plays, ten, eleven + Duration::hours(1))
            .await
            .unwrap();
        assert_eq!(series, vec![(ten, 2), (eleven, 7)], "[{b}]");
        assert_eq!(
            clip::Entity::counters()
                .range(&t.db, 1, Key::Plays, ten, eleven)
                .await
                .unwrap(),
            2,
            "[{b}]"
        );
        assert_eq!(
            clip::Entity::counters()
                .range(&t.db, 1, Key::Plays, eleven, eleven + Duration::hours(1))
                .await
                .unwrap(),
            7,
            "[{b}]"
        );
        // The hour key's day-long range holds both hours, and is not mixed
        // up with the day key of the same owner.
        assert_eq!(
            clip::Entity::counters()
                .range(&t.db, 1, Key::Plays, day(2026, 11, 22), midnight)
                .await
                .unwrap(),
            9,
            "[{b}]"
        );

        // All-time totals count every event; the plain key has no buckets.
        clip::Entity::counters()
            .increment(&t.db, 1, Key::Likes)
            .await
            .unwrap();
        let all = clip::Entity::counters().counts(&t.db, 1).await.unwrap();
        assert_eq!((all.likes, all.views, all.plays), (1, 8, 9), "[{b}]");
        assert!(
            stored_buckets(&t, "clip_counters_buckets", 1, "likes")
                .await
                .is_empty(),
            "[{b}] a key without a window wrote buckets"
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "window_half_open"]
    async fn ranges_are_half_open_at_bucket_starts(t: TestDb) {
        let c = windowed("half_open", 4);
        c.create_table(&t.db).await.unwrap();
        let b = t.backend;
        // Nov 1..=5 get 1, 2, 4, 8, 16: every sum names its days.
        for (i, n) in [1, 2, 4, 8, 16].into_iter().enumerate() {
            let noon = day(2026, 11, 1) + Duration::days(i as i64) + Duration::hours(12);
            c.add_at(&t.db, 1, "views", n, noon).await.unwrap();
        }
        let nov = |d| day(2026, 11, d);
        let range = |from, to| c.range(&t.db, 1, "views", from, to);

        // Aligned whole days.
        assert_eq!(range(nov(1), nov(4)).await.unwrap(), 1 + 2 + 4, "[{b}]");
        assert_eq!(range(nov(2), nov(3)).await.unwrap(), 2, "[{b}]");
        assert_eq!(range(nov(1), nov(6)).await.unwrap(), 31, "[{b}]");
        assert_eq!(range(nov(6), nov(9)).await.unwrap(), 0, "[{b}]");

        // Empty and reversed ranges.
        assert_eq!(range(nov(2), nov(2)).await.unwrap(), 0, "[{b}]");
        let noon_2 = nov(2) + Duration::hours(12);
        assert_eq!(range(noon_2, noon_2).await.unwrap(), 0, "[{b}]");
        assert!(
            c.series(&t.db, 1, "views", nov(2), nov(2))
                .await
                .unwrap()
                .is_empty(),
            "[{b}]"
        );
        assert!(is_invalid_range(&range(nov(3), nov(2)).await), "[{b}]");
        assert!(
            is_invalid_range(&range(nov(2) + Duration::nanoseconds(1), nov(2)).await),
            "[{b}]"
        );
        assert!(
            is_invalid_range(&c.series(&t.db, 1, "views", nov(3), nov(2)).await),
            "[{b}]"
        );
        assert!(
            is_invalid_range(&c.range_many(&t.db, &[1, 2], "views", nov(3), nov(2)).await),
            "[{b}]"
        );
        assert!(
            is_invalid_range(&c.series_many(&t.db, &[1], "views", nov(3), nov(2)).await),
            "[{b}]"
        );

        // An unaligned `from` leaves its own day out, even by a nanosecond.
        assert_eq!(
            range(nov(1) + Duration::hours(12), nov(4)).await.unwrap(),
            2 + 4,
            "[{b}]"
        );
        assert_eq!(
            range(nov(1) + Duration::nanoseconds(1), nov(4))
                .await
                .unwrap(),
            2 + 4,
            "[{b}]"
        );
        assert_eq!(
            range(nov(1) + Duration::seconds(1), nov(4)).await.unwrap(),
            2 + 4,
            "[{b}]"
        );
        // An unaligned `to` keeps the bucket that starts before it.
        assert_eq!(
            range(nov(1), nov(3) + Duration::hours(12)).await.unwrap(),
            1 + 2 + 4,
            "[{b}]"
        );
        assert_eq!(
            range(nov(1), nov(3) + Duration::nanoseconds(1))
                .await
                .unwrap(),
            1 + 2 + 4,
            "[{b}]"
        );
        assert_eq!(
            range(nov(1), nov(3) - Duration::nanoseconds(1))
                .await
                .unwrap(),
            1 + 2,
            "[{b}]"
        );
        // Within one day, not containing its start: nothing.
        assert_eq!(
            range(nov(2) + Duration::hours(1), nov(2) + Duration::hours(23))
                .await
                .unwrap(),
            0,
            "[{b}]"
        );

        // Series follow the same rule.
        let series = c
            .series(
                &t.db,
                1,
                "views",
                nov(1) + Duration::seconds(1),
                nov(3) + Duration::hours(12),
            )
            .await
            .unwrap();
        assert_eq!(series, vec![(nov(2), 2), (nov(3), 4)], "[{b}]");
        let series = c
            .series(
                &t.db,
                1,
                "views",
                nov(2) + Duration::hours(1),
                nov(2) + Duration::hours(23),
            )
            .await
            .unwrap();
        assert!(series.is_empty(), "[{b}] {series:?}");

        // Hours likewise: [10:00, 12:00) is two buckets, 10:30 leaves 10:00 out.
        let h = |hh| at(2026, 11, 2, hh, 0, 0);
        for (hh, n) in [(9, 1), (10, 2), (11, 4), (12, 8)] {
            c.add_at(&t.db, 1, "plays", n, h(hh) + Duration::minutes(30))
                .await
                .unwrap();
        }
        let plays = |from, to| c.range(&t.db, 1, "plays", from, to);
        assert_eq!(plays(h(10), h(12)).await.unwrap(), 2 + 4, "[{b}]");
        assert_eq!(
            plays(h(10) + Duration::minutes(30), h(12)).await.unwrap(),
            4,
            "[{b}]"
        );
        assert_eq!(
            plays(h(10), h(12) + Duration::minutes(1)).await.unwrap(),
            2 + 4 + 8,
            "[{b}]"
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "window_calendar"]
    async fn ranges_across_months_year_ends_and_leap_days(t: TestDb) {
        let c = windowed("calendar", 4);
        c.create_table(&t.db).await.unwrap();
        let b = t.backend;
        let writes = [
            (day(2026, 10, 30), 1),
            (day(2026, 10, 31), 2),
            (day(2026, 11, 1), 4),
            (day(2026, 11, 2), 8),
            (day(2026, 12, 31), 16),
            (day(2027, 1, 1), 32),
            (day(2028, 2, 28), 64),
            (day(2028, 2, 29), 128),
            (day(2028, 3, 1), 256),
        ];
        for (d, n) in writes {
            // The last second of the day: still that day.
            c.add_at(&t.db, 1, "views", n, d + Duration::seconds(86_399))
                .await
                .unwrap();
        }

        // Oct 30 up to (not including) Nov 2.
        let series = c
            .series(&t.db, 1, "views", day(2026, 10, 30), day(2026, 11, 2))
            .await
            .unwrap();
        assert_eq!(
            series,
            vec![
                (day(2026, 10, 30), 1),
                (day(2026, 10, 31), 2),
                (day(2026, 11, 1), 4)
            ],
            "[{b}]"
        );
        assert_eq!(
            c.range(&t.db, 1, "views", day(2026, 10, 30), day(2026, 11, 2))
                .await
                .unwrap(),
            7,
            "[{b}]"
        );
        assert_eq!(
            c.range(&t.db, 1, "views", day(2026, 10, 31), day(2026, 11, 3))
                .await
                .unwrap(),
            2 + 4 + 8,
            "[{b}]"
        );

        // Across the year end.
        let series = c
            .series(&t.db, 1, "views", day(2026, 12, 30), day(2027, 1, 3))
            .await
            .unwrap();
        assert_eq!(
            series,
            vec![
                (day(2026, 12, 30), 0),
                (day(2026, 12, 31), 16),
                (day(2027, 1, 1), 32),
                (day(2027, 1, 2), 0)
            ],
            "[{b}]"
        );
        assert_eq!(
            c.range(&t.db, 1, "views", day(2026, 12, 31), day(2027, 1, 1))
                .await
                .unwrap(),
            16,
            "[{b}]"
        );
        assert_eq!(
            c.range(&t.db, 1, "views", day(2027, 1, 1), day(2027, 1, 2))
                .await
                .unwrap(),
            32,
            "[{b}]"
        );

        // A leap day: its own bucket, between Feb 28 and Mar 1.
        let series = c
            .series(&t.db, 1, "views", day(2028, 2, 28), day(2028, 3, 2))
            .await
            .unwrap();
        assert_eq!(
            series,
            vec![
                (day(2028, 2, 28), 64),
                (day(2028, 2, 29), 128),
                (day(2028, 3, 1), 256)
            ],
            "[{b}]"
        );
        assert_eq!(
            c.range(&t.db, 1, "views", day(2028, 2, 29), day(2028, 3, 1))
                .await
                .unwrap(),
            128,
            "[{b}]"
        );
        // Whole year 2028 is 366 buckets; February 2028 is 29.
        let year = c
            .series(&t.db, 1, "views", day(2028, 1, 1), day(2029, 1, 1))
            .await
            .unwrap();
        assert_eq!(year.len(), 366, "[{b}]");
        assert_eq!(counts(&year).iter().sum::<i64>(), 64 + 128 + 256, "[{b}]");
        let feb = c
            .series(&t.db, 1, "views", day(2028, 2, 1), day(2028, 3, 1))
            .await
            .unwrap();
        assert_eq!(feb.len(), 29, "[{b}]");
        assert_eq!(feb[28], (day(2028, 2, 29), 128), "[{b}]");

        // The whole history in one range equals the all-time total.
        let all = c
            .range(&t.db, 1, "views", day(2000, 1, 1), day(2100, 1, 1))
            .await
            .unwrap();
        assert_eq!(all, 511, "[{b}]");
        assert_eq!(c.get(&t.db, 1, "views").await.unwrap(), 511, "[{b}]");

        // Hours across a month end.
        c.add_at(&t.db, 1, "plays", 3, at(2026, 10, 31, 23, 30, 0))
            .await
            .unwrap();
        c.add_at(&t.db, 1, "plays", 5, at(2026, 11, 1, 0, 30, 0))
            .await
            .unwrap();
        let series = c
            .series(
                &t.db,
                1,
                "plays",
                at(2026, 10, 31, 22, 0, 0),
                at(2026, 11, 1, 2, 0, 0),
            )
            .await
            .unwrap();
        assert_eq!(
            series,
            vec![
                (at(2026, 10, 31, 22, 0, 0), 0),
                (at(2026, 10, 31, 23, 0, 0), 3),
                (at(2026, 11, 1, 0, 0, 0), 5),
                (at(2026, 11, 1, 1, 0, 0), 0)
            ],
            "[{b}]"
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "window_zero_filled"]
    async fn series_are_zero_filled_oldest_first(t: TestDb) {
        let c = windowed("zero_filled", 4);
        c.create_table(&t.db).await.unwrap();
        let b = t.backend;
        let from = day(2026, 11, 20);
        // Unaligned writes on days 3 and 7 (twice on day 7, in two slots).
        c.add_at(
            &t.db,
            1,
            "views",
            4,
            from + Duration::days(3) + Duration::minutes(1065),
        )
        .await
        .unwrap();
        c.add_at(
            &t.db,
            1,
            "views",
            6,
            from + Duration::days(7) + Duration::hours(1),
        )
        .await
        .unwrap();
        c.add_at(
            &t.db,
            1,
            "views",
            -1,
            from + Duration::days(7) + Duration::hours(23),
        )
        .await
        .unwrap();
        // Another owner's writes are not in this series.
        c.add_at(&t.db, 2, "views", 100, from + Duration::days(5))
            .await
            .unwrap();

        let series = c
            .series(&t.db, 1, "views", from, from + Duration::days(10))
            .await
            .unwrap();
        assert_eq!(series.len(), 10, "[{b}] {series:?}");
        let expected_starts: Vec<_> = (0..10)
            .map(|i| Window::Day.start_of(from + Duration::days(i) + Duration::hours(13)))
            .collect();
        assert_eq!(starts(&series), expected_starts, "[{b}]");
        assert_eq!(
            expected_starts,
            (0..10)
                .map(|i| from + Duration::days(i))
                .collect::<Vec<_>>()
        );
        assert!(
            starts(&series).windows(2).all(|w| w[0] < w[1]),
            "[{b}] not oldest first"
        );
        assert_eq!(counts(&series), [0, 0, 0, 4, 0, 0, 0, 5, 0, 0], "[{b}]");
        let total = c
            .range(&t.db, 1, "views", from, from + Duration::days(10))
            .await
            .unwrap();
        assert_eq!(total, counts(&series).iter().sum::<i64>(), "[{b}]");

        // An owner never written: all zeros, the same starts.
        let none = c
            .series(&t.db, 9, "views", from, from + Duration::days(10))
            .await
            .unwrap();
        assert_eq!(starts(&none), expected_starts, "[{b}]");
        assert!(none.iter().all(|(_, n)| *n == 0), "[{b}]");

        // Hour series over a day: 24 starts of Window::Hour, oldest first.
        c.add_at(&t.db, 1, "plays", 2, from + Duration::minutes(5 * 60 + 59))
            .await
            .unwrap();
        let hours = c
            .series(&t.db, 1, "plays", from, from + Duration::days(1))
            .await
            .unwrap();
        assert_eq!(hours.len(), 24, "[{b}]");
        for (i, (start, n)) in hours.iter().enumerate() {
            let hour = from + Duration::hours(i as i64);
            assert_eq!(*start, Window::Hour.start_of(hour + Duration::minutes(59)));
            assert_eq!(*n, if i == 5 { 2 } else { 0 }, "[{b}] hour {i}");
        }
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "window_batch_reads"]
    async fn batch_ranges_and_series_are_zero_filled_per_owner(t: TestDb) {
        clip::Entity::counters().create_table(&t.db).await.unwrap();
        let b = t.backend;
        let from = day(2027, 3, 1);
        let to = from + Duration::days(4);
        // Owner o writes o * (d + 1) on day d, for owners 1..=3 and days 0..4,
        // plus one write just outside the range on each side.
        for owner in 1..=3i64 {
            for d in 0..4 {
                let when = from + Duration::days(d) + Duration::hours(owner);
                clip::Entity::counters()
                    .add_at(&t.db, owner, Key::Views, owner * (d + 1), when)
                    .await
                    .unwrap();
            }
            clip::Entity::counters()
                .add_at(
                    &t.db,
                    owner,
                    Key::Views,
                    1_000,
                    from - Duration::nanoseconds(1),
                )
                .await
                .unwrap();
            clip::Entity::counters()
                .add_at(&t.db, owner, Key::Views, 1_000, to)
                .await
                .unwrap();
        }
        let owners = [2, 1, 99, 1, 3, 2];

        let totals = clip::Entity::counters()
            .range_many(&t.db, &owners, Key::Views, from, to)
            .await
            .unwrap();
        assert_eq!(
            totals,
            HashMap::from([(1, 10), (2, 20), (3, 30), (99, 0)]),
            "[{b}]"
        );

        let series = clip::Entity::counters()
            .series_many(&t.db, &owners, Key::Views, from, to)
            .await
            .unwrap();
        assert_eq!(series.len(), 4, "[{b}] {series:?}");
        let days: Vec<_> = (0..4).map(|d| from + Duration::days(d)).collect();
        for owner in [1i64, 2, 3] {
            assert_eq!(starts(&series[&owner]), days, "[{b}] owner {owner}");
            assert_eq!(
                counts(&series[&owner]),
                (1..=4).map(|d| owner * d).collect::<Vec<_>>(),
                "[{b}] owner {owner}"
            );
            // The same as the one-owner read.
            let one = clip::Entity::counters()
                .series(&t.db, owner, Key::Views, from, to)
                .await
                .unwrap();
            assert_eq!(one, series[&owner], "[{b}] owner {owner}");
        }
        assert_eq!(starts(&series[&99]), days, "[{b}]");
        assert_eq!(counts(&series[&99]), [0, 0, 0, 0], "[{b}]");

        // Empty owner lists: empty maps.
        let c = &clip::Entity::counters().untyped();
        assert!(
            c.range_many(&t.db, &[], Key::Views, from, to)
                .await
                .unwrap()
                .is_empty(),
            "[{b}]"
        );
        assert!(
            clip::Entity::counters()
                .series_many(&t.db, &[], Key::Views, from, to)
                .await
                .unwrap()
                .is_empty(),
            "[{b}]"
        );
        // An empty range: every owner, with nothing.
        let empty = clip::Entity::counters()
            .series_many(&t.db, &owners, Key::Views, from, from)
            .await
            .unwrap();
        assert_eq!(empty.len(), 4, "[{b}]");
        assert!(empty.values().all(Vec::is_empty), "[{b}]");
        let zero = c
            .range_many(&t.db, &owners, Key::Views, to, to)
            .await
            .unwrap();
        assert_eq!(
            zero,
            HashMap::from([(1, 0), (2, 0), (3, 0), (99, 0)]),
            "[{b}]"
        );

        // Many owners: more than one chunk of binds on every backend.
        let many: Vec<i64> = (1..=40_000).collect();
        let totals = c
            .range_many(&t.db, &many, Key::Views, from, to)
            .await
            .unwrap();
        assert_eq!(totals.len(), 40_000, "[{b}]");
        assert_eq!(
            (totals[&1], totals[&3], totals[&40_000]),
            (10, 30, 0),
            "[{b}]"
        );
        assert_eq!(totals.values().sum::<i64>(), 60, "[{b}]");
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "window_totals"]
    async fn all_time_totals_sum_every_bucket_including_decrements(t: TestDb) {
        clip::Entity::counters().create_table(&t.db).await.unwrap();
        let b = t.backend;
        let writes = [
            (day(2025, 6, 1) + Duration::hours(3), 5),
            (day(2025, 6, 1) + Duration::hours(4), -2),
            (day(2025, 6, 2), 7),
            (day(2026, 1, 15) + Duration::minutes(1), -4),
            (day(2026, 1, 15) + Duration::minutes(2), 10),
        ];
        for (when, n) in writes {
            clip::Entity::counters()
                .add_at(&t.db, 5, Key::Views, n, when)
                .await
                .unwrap();
        }
        let everything = (day(1990, 1, 1), day(2200, 1, 1));
        let db = &t.db;
        let bucketed = |key| async move {
            clip::Entity::counters()
                .range(db, 5, key, everything.0, everything.1)
                .await
                .unwrap()
        };
        assert_eq!(bucketed(Key::Views).await, 16, "[{b}]");
        assert_eq!(
            clip::Entity::counters()
                .get(&t.db, 5, Key::Views)
                .await
                .unwrap(),
            16,
            "[{b}]"
        );
        // The negative delta reduced its own bucket.
        let june = clip::Entity::counters()
            .series(&t.db, 5, Key::Views, day(2025, 6, 1), day(2025, 6, 3))
            .await
            .unwrap();
        assert_eq!(counts(&june), [3, 7], "[{b}]");
        assert_eq!(
            clip::Entity::counters()
                .range(&t.db, 5, Key::Views, day(2026, 1, 15), day(2026, 1, 16))
                .await
                .unwrap(),
            6,
            "[{b}]"
        );

        // Writes of now: increment twice, decrement once, in today's buckets.
        let before = Utc::now();
        clip::Entity::counters()
            .increment(&t.db, 5, Key::Views)
            .await
            .unwrap();
        clip::Entity::counters()
            .increment(&t.db, 5, Key::Views)
            .await
            .unwrap();
        clip::Entity::counters()
            .decrement(&t.db, 5, Key::Views)
            .await
            .unwrap();
        clip::Entity::counters()
            .add(&t.db, 5, Key::Plays, 3)
            .await
            .unwrap();
        clip::Entity::counters()
            .decrement(&t.db, 5, Key::Plays)
            .await
            .unwrap();
        let after = Utc::now();
        // The days (hours) of the writes, however a midnight fell between them.
        let today = (
            Window::Day.start_of(before),
            Window::Day.start_of(after) + Duration::days(1),
        );
        let this_hour = (
            Window::Hour.start_of(before),
            Window::Hour.start_of(after) + Duration::hours(1),
        );
        assert_eq!(
            clip::Entity::counters()
                .range(&t.db, 5, Key::Views, today.0, today.1)
                .await
                .unwrap(),
            1,
            "[{b}]"
        );
        assert_eq!(
            clip::Entity::counters()
                .range(&t.db, 5, Key::Plays, this_hour.0, this_hour.1)
                .await
                .unwrap(),
            2,
            "[{b}]"
        );
        assert_eq!(bucketed(Key::Views).await, 17, "[{b}]");
        assert_eq!(bucketed(Key::Plays).await, 2, "[{b}]");
        let all = clip::Entity::counters().counts(&t.db, 5).await.unwrap();
        assert_eq!((all.likes, all.views, all.plays), (0, 17, 2), "[{b}]");

        // A batch of deltas at a time also lands in buckets and totals.
        let mut batch = DeltaBatch::new();
        let c = &clip::Entity::counters().untyped();
        batch
            .add_at(c, 5, "views", 100, day(2025, 6, 2) + Duration::hours(9))
            .unwrap();
        batch
            .add_at(c, 5, "views", -1, day(2025, 6, 1) + Duration::hours(9))
            .unwrap();
        batch
            .add_at(c, 6, "views", 8, day(2025, 6, 1) + Duration::hours(9))
            .unwrap();
        let txn = t.db.begin().await.unwrap();
        batch.apply(&txn).await.unwrap();
        txn.commit().await.unwrap();
        let june = clip::Entity::counters()
            .series(&t.db, 5, Key::Views, day(2025, 6, 1), day(2025, 6, 3))
            .await
            .unwrap();
        assert_eq!(counts(&june), [2, 107], "[{b}]");
        assert_eq!(
            clip::Entity::counters()
                .get(&t.db, 5, Key::Views)
                .await
                .unwrap(),
            116,
            "[{b}]"
        );
        assert_eq!(bucketed(Key::Views).await, 116, "[{b}]");
        assert_eq!(
            clip::Entity::counters()
                .get(&t.db, 6, Key::Views)
                .await
                .unwrap(),
            8,
            "[{b}]"
        );

        // A plain key's writes never touch the bucket table.
        let rows = raw::count_rows(&t.db, "clip_counters_buckets").await;
        clip::Entity::counters()
            .add_at(&t.db, 5, Key::Likes, 4, day(2025, 6, 1))
            .await
            .unwrap();
        clip::Entity::counters()
            .increment(&t.db, 5, Key::Likes)
            .await
            .unwrap();
        assert_eq!(
            raw::count_rows(&t.db, "clip_counters_buckets").await,
            rows,
            "[{b}]"
        );
        assert_eq!(
            clip::Entity::counters()
                .get(&t.db, 5, Key::Likes)
                .await
                .unwrap(),
            5,
            "[{b}]"
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "window_prune"]
    async fn prune_deletes_only_buckets_that_ended(t: TestDb) {
        // One slot: one row per (owner, key, bucket), so row counts are exact.
        let c = windowed("pruned", 1);
        c.create_table(&t.db).await.unwrap();
        let b = t.backend;
        let buckets = "pruned_buckets";
        let views_days = [
            day(2026, 10, 30),
            day(2026, 10, 31),
            day(2026, 11, 1),
            day(2026, 11, 2),
        ];
        for owner in [1i64, 2] {
            for (i, d) in views_days.iter().enumerate() {
                let n = owner * 10 + i as i64;
                c.add_at(&t.db, owner, "views", n, *d + Duration::hours(6))
                    .await
                    .unwrap();
            }
        }
        let plays_hours = [
            at(2026, 11, 1, 22, 0, 0),
            at(2026, 11, 1, 23, 0, 0),
            at(2026, 11, 2, 0, 0, 0),
            at(2026, 11, 2, 1, 0, 0),
        ];
        for (i, h) in plays_hours.iter().enumerate() {
            c.add_at(&t.db, 1, "plays", 1 + i as i64, *h + Duration::minutes(15))
                .await
                .unwrap();
        }
        c.add(&t.db, 1, "likes", 3).await.unwrap();
        assert_eq!(raw::count_rows(&t.db, buckets).await, 12, "[{b}]");
        let totals_rows = raw::count_rows(&t.db, "pruned").await;
        let (db, c) = (&t.db, &c);
        let totals = |owner: i64| async move {
            let all = c.get_all_keys(db, &[owner]).await.unwrap();
            all[&owner].clone()
        };
        let (totals_1, totals_2) = (totals(1).await, totals(2).await);
        assert_eq!(totals_1["views"], 10 + 11 + 12 + 13, "[{b}]");
        assert_eq!(totals_1["plays"], 10, "[{b}]");
        let views_series = |owner: i64| async move {
            c.series(db, owner, "views", day(2026, 10, 30), day(2026, 11, 3))
                .await
        };
        let plays_series = || {
            c.series(
                &t.db,
                1,
                "plays",
                plays_hours[0],
                plays_hours[3] + Duration::hours(1),
            )
        };
        assert_eq!(
            counts(&views_series(1).await.unwrap()),
            [10, 11, 12, 13],
            "[{b}]"
        );

        // A millisecond before Oct 31 ends: only Oct 30 has ended.
        let deleted = c
            .prune(&t.db, day(2026, 11, 1) - Duration::milliseconds(1))
            .await
            .unwrap();
        assert_eq!(deleted, 2, "[{b}]");
        assert_eq!(raw::count_rows(&t.db, buckets).await, 10, "[{b}]");
        assert_eq!(
            counts(&views_series(1).await.unwrap()),
            [0, 11, 12, 13],
            "[{b}]"
        );

        // At Nov 1, 00:00 Oct 31 has ended (exactly); no hour before 22:00 exists.
        let deleted = c.prune(&t.db, day(2026, 11, 1)).await.unwrap();
        assert_eq!(deleted, 2, "[{b}]");
        assert_eq!(raw::count_rows(&t.db, buckets).await, 8, "[{b}]");
        assert_eq!(
            counts(&views_series(1).await.unwrap()),
            [0, 0, 12, 13],
            "[{b}]"
        );
        assert_eq!(
            counts(&views_series(2).await.unwrap()),
            [0, 0, 22, 23],
            "[{b}]"
        );
        assert_eq!(
            counts(&plays_series().await.unwrap()),
            [1, 2, 3, 4],
            "[{b}]"
        );
        // Again: nothing left to delete.
        assert_eq!(c.prune(&t.db, day(2026, 11, 1)).await.unwrap(), 0, "[{b}]");

        // 23:30: the 22:00 hour ended, the Nov 1 day did not.
        let deleted = c.prune(&t.db, at(2026, 11, 1, 23, 30, 0)).await.unwrap();
        assert_eq!(deleted, 1, "[{b}]");
        assert_eq!(
            counts(&plays_series().await.unwrap()),
            [0, 2, 3, 4],
            "[{b}]"
        );
        assert_eq!(
            counts(&views_series(1).await.unwrap()),
            [0, 0, 12, 13],
            "[{b}]"
        );

        // Nov 2, 00:00: Nov 1 (both owners) and the 23:00 hour ended, the
        // 00:00 hour did not.
        let deleted = c.prune(&t.db, day(2026, 11, 2)).await.unwrap();
        assert_eq!(deleted, 3, "[{b}]");
        assert_eq!(raw::count_rows(&t.db, buckets).await, 4, "[{b}]");
        assert_eq!(
            counts(&views_series(1).await.unwrap()),
            [0, 0, 0, 13],
            "[{b}]"
        );
        assert_eq!(
            counts(&plays_series().await.unwrap()),
            [0, 0, 3, 4],
            "[{b}]"
        );
        assert_eq!(c.prune(&t.db, day(2026, 11, 2)).await.unwrap(), 0, "[{b}]");

        // Totals never changed, nor the counter table's rows.
        assert_eq!(totals(1).await, totals_1, "[{b}]");
        assert_eq!(totals(2).await, totals_2, "[{b}]");
        assert_eq!(raw::count_rows(&t.db, "pruned").await, totals_rows, "[{b}]");

        // Far in the future: everything goes, once.
        assert_eq!(c.prune(&t.db, day(2100, 1, 1)).await.unwrap(), 4, "[{b}]");
        assert_eq!(raw::count_rows(&t.db, buckets).await, 0, "[{b}]");
        assert_eq!(c.prune(&t.db, day(2100, 1, 1)).await.unwrap(), 0, "[{b}]");
        assert_eq!(totals(1).await, totals_1, "[{b}]");

        // A table without windows has nothing to prune.
        let plain = counter_tests::counters::<i64>("plain", 4);
        plain.create_table(&t.db).await.unwrap();
        plain.add(&t.db, 1, "views", 2).await.unwrap();
        assert_eq!(
            plain.prune(&t.db, day(2100, 1, 1)).await.unwrap(),
            0,
            "[{b}]"
        );
        assert_eq!(plain.get(&t.db, 1, "views").await.unwrap(), 2, "[{b}]");
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "window_prune_large"]
    async fn prune_covers_every_stretch_of_a_large_table(t: TestDb) {
        let c = windowed("pruned_large", 1);
        c.create_table(&t.db).await.unwrap();
        let b = t.backend;
        const OWNERS: i64 = 6_000;
        // Each owner: views on Jan 1 and Jan 2, plays at 00:00 of Jan 2.
        let mut batch = DeltaBatch::new();
        for owner in 1..=OWNERS {
            let n = owner % 7 + 1;
            batch
                .add_at(&c, owner, "views", n, day(2027, 1, 1) + Duration::hours(1))
                .unwrap();
            batch
                .add_at(
                    &c,
                    owner,
                    "views",
                    2 * n,
                    day(2027, 1, 2) + Duration::hours(1),
                )
                .unwrap();
            batch
                .add_at(
                    &c,
                    owner,
                    "plays",
                    n,
                    day(2027, 1, 2) + Duration::minutes(5),
                )
                .unwrap();
        }
        let txn = t.db.begin().await.unwrap();
        batch.apply(&txn).await.unwrap();
        txn.commit().await.unwrap();
        let rows = raw::count_rows(&t.db, "pruned_large_buckets").await;
        assert_eq!(rows, 3 * OWNERS, "[{b}]");

        // Jan 2, 00:30: every Jan 1 day bucket ended; no hour did.
        let deleted = c
            .prune(&t.db, day(2027, 1, 2) + Duration::minutes(30))
            .await
            .unwrap();
        assert_eq!(deleted, OWNERS as u64, "[{b}]");
        assert_eq!(
            raw::count_rows(&t.db, "pruned_large_buckets").await,
            2 * OWNERS,
            "[{b}]"
        );
        let owners: Vec<i64> = (1..=OWNERS).collect();
        let jan_1 = c
            .range_many(&t.db, &owners, "views", day(2027, 1, 1), day(2027, 1, 2))
            .await
            .unwrap();
        assert!(
            jan_1.values().all(|n| *n == 0),
            "[{b}] a Jan 1 bucket survived"
        );
        let jan_2 = c
            .range_many(&t.db, &owners, "views", day(2027, 1, 2), day(2027, 1, 3))
            .await
            .unwrap();
        for owner in 1..=OWNERS {
            assert_eq!(jan_2[&owner], 2 * (owner % 7 + 1), "[{b}] owner {owner}");
        }
        // Jan 2, 01:00: the 00:00 hour ended too.
        let deleted = c
            .prune(&t.db, day(2027, 1, 2) + Duration::hours(1))
            .await
            .unwrap();
        assert_eq!(deleted, OWNERS as u64, "[{b}]");
        assert_eq!(c.prune(&t.db, day(2027, 1, 2)).await.unwrap(), 0, "[{b}]");
        let totals = c
            .get_many(&t.db, &owners, &["views", "plays"])
            .await
            .unwrap();
        for owner in 1..=OWNERS {
            let n = owner % 7 + 1;
            assert_eq!(totals[&owner]["views"], 3 * n, "[{b}] owner {owner}");
            assert_eq!(totals[&owner]["plays"], n, "[{b}] owner {owner}");
        }
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    async fn window_errors(t: TestDb) {
        clip::Entity::counters().create_table(&t.db).await.unwrap();
        let b = t.backend;
        let (from, to) = (day(2026, 1, 1), day(2026, 1, 8));

        // A key without a window.
        let r = clip::Entity::counters()
            .series(&t.db, 1, Key::Likes, from, to)
            .await;
        assert!(not_windowed(&r), "[{b}] {r:?}");
        let r = clip::Entity::counters()
            .range(&t.db, 1, Key::Likes, from, to)
            .await;
        assert!(not_windowed(&r), "[{b}] {r:?}");
        let r = clip::Entity::counters()
            .range_many(&t.db, &[1], Key::Likes, from, to)
            .await;
        assert!(not_windowed(&r), "[{b}]");
        let r = clip::Entity::counters()
            .series_many(&t.db, &[], Key::Likes, from, to)
            .await;
        assert!(not_windowed(&r), "[{b}]");
        // A key that exists nowhere is not windowed either; a bad one is invalid.
        let r = clip::Entity::counters()
            .untyped()
            .series(&t.db, 1, "shares", from, to)
            .await;
        assert!(
            matches!(r, Err(CounterError::NotWindowed { .. })),
            "[{b}] {r:?}"
        );
        let r = clip::Entity::counters()
            .untyped()
            .series(&t.db, 1, "bad key", from, to)
            .await;
        assert!(
            matches!(r, Err(CounterError::InvalidKey { .. })),
            "[{b}] {r:?}"
        );

        // Series length: exactly MAX_SERIES_BUCKETS hours is fine, one more is not.
        let start = at(2020, 1, 1, 0, 0, 0);
        let max = MAX_SERIES_BUCKETS as i64;
        let longest = clip::Entity::counters()
            .series(&t.db, 1, Key::Plays, start, start + Duration::hours(max))
            .await
            .unwrap();
        assert_eq!(longest.len(), MAX_SERIES_BUCKETS, "[{b}]");
        assert_eq!(longest.last().unwrap().0, start + Duration::hours(max - 1));
        let r = clip::Entity::counters()
            .series(
                &t.db,
                1,
                Key::Plays,
                start,
                start + Duration::hours(max + 1),
            )
            .await;
        assert!(is_invalid_range(&r), "[{b}] {r:?}");
        // Unaligned: 100_000 hours plus a minute starts 100_001 buckets.
        let r = clip::Entity::counters()
            .series(
                &t.db,
                1,
                Key::Plays,
                start,
                start + Duration::hours(max) + Duration::minutes(1),
            )
            .await;
        assert!(is_invalid_range(&r), "[{b}] {r:?}");
        let r = clip::Entity::counters()
            .series_many(
                &t.db,
                &[1, 2],
                Key::Plays,
                start,
                start + Duration::hours(max + 1),
            )
            .await;
        assert!(is_invalid_range(&r), "[{b}]");
        // The same span is a short day series, and a range has no such limit.
        let days = clip::Entity::counters()
            .series(
                &t.db,
                1,
                Key::Views,
                start,
                start + Duration::hours(max + 1),
            )
            .await
            .unwrap();
        assert_eq!(days.len(), (max as usize + 1).div_ceil(24), "[{b}]");
        clip::Entity::counters()
            .add_at(&t.db, 1, Key::Plays, 2, start + Duration::hours(max))
            .await
            .unwrap();
        assert_eq!(
            clip::Entity::counters()
                .range(
                    &t.db,
                    1,
                    Key::Plays,
                    start,
                    start + Duration::hours(max + 1)
                )
                .await
                .unwrap(),
            2,
            "[{b}]"
        );
        t.finish().await;
    }
}

/// The table-name half of `window_errors` (no database: it was checked once
/// after the backends, and is now a test of its own).
#[test]
fn window_errors_in_table_names() {
    // Table names: the bucket table's name must fit too.
    let sixty = "t".repeat(60);
    let table = CounterTable::new(sixty.clone()).expect("60 bytes is a valid table name");
    let r = table.with_key_window("views", Window::Day);
    assert!(
        matches!(r, Err(CounterError::InvalidTableName { .. })),
        "{r:?}"
    );
    let fits = "t".repeat(55); // 55 + "_buckets" = 63
    let table = CounterTable::new(fits)
        .and_then(|t| t.with_key_window("views", Window::Hour))
        .unwrap();
    assert_eq!(
        table.bucket_table().as_deref(),
        Some(format!("{}_buckets", "t".repeat(55)).as_str())
    );
    assert_eq!(table.window_for("views"), Some(Window::Hour));
    assert_eq!(table.window_for("likes"), None);
    let r = CounterTable::new("t").and_then(|t| t.with_key_window("bad key", Window::Day));
    assert!(matches!(r, Err(CounterError::InvalidKey { .. })), "{r:?}");
}

const TASKS: i64 = 16;
const OPS_PER_TASK: i64 = 50;

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "window_concurrent"]
    async fn concurrent_backfills_land_in_their_days(t: TestDb) {
        let c = windowed("concurrent_windows", 4);
        c.create_table(&t.db).await.unwrap();
        let b = t.backend;
        let first = day(2026, 12, 30);
        let writers: Vec<_> = (0..TASKS)
            .map(|task| {
                let (db, c) = (t.db.clone(), c.clone());
                tokio::spawn(async move {
                    // Acknowledged deltas per day (0, 1, 2).
                    let mut acknowledged = [0i64; 3];
                    for op in 0..OPS_PER_TASK {
                        let d = ((task + op) % 3) as usize;
                        // Spread over each whole day, its first and last
                        // instants included.
                        let offset = match op % 10 {
                            0 => Duration::zero(),
                            1 => Duration::days(1) - Duration::milliseconds(1),
                            _ => Duration::seconds((task * 5_003 + op * 1_723) % 86_400),
                        };
                        let delta = if op % 7 == 3 { -1 } else { op % 4 + 1 };
                        let when = first + Duration::days(d as i64) + offset;
                        c.add_at(&db, 42, "views", delta, when).await?;
                        acknowledged[d] += delta;
                    }
                    Ok::<_, CounterError>(acknowledged)
                })
            })
            .collect();
        let mut expected = [0i64; 3];
        for writer in writers {
            let per_day = writer
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("[{b}] {e}"));
            for (total, n) in expected.iter_mut().zip(per_day) {
                *total += n;
            }
        }
        let series = c
            .series(
                &t.db,
                42,
                "views",
                first - Duration::days(1),
                first + Duration::days(4),
            )
            .await
            .unwrap();
        assert_eq!(
            counts(&series),
            [0, expected[0], expected[1], expected[2], 0],
            "[{b}]"
        );
        let total: i64 = expected.iter().sum();
        assert_eq!(c.get(&t.db, 42, "views").await.unwrap(), total, "[{b}]");
        assert_eq!(
            c.range(&t.db, 42, "views", first, first + Duration::days(3))
                .await
                .unwrap(),
            total,
            "[{b}]"
        );
        // Four slots per bucket at most.
        let rows = raw::count_rows(&t.db, "concurrent_windows_buckets").await;
        assert!((3..=12).contains(&rows), "[{b}] {rows} bucket rows");
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "window_no_bucket_table"]
    async fn tables_without_windowed_keys_have_no_bucket_table(t: TestDb) {
        let b = t.backend;
        let plain = counter_tests::counters::<i64>("plain_counters", 4);
        plain.create_table(&t.db).await.unwrap();
        assert_eq!(plain.table().bucket_table(), None);
        plain
            .add_at(&t.db, 1, "views", 5, day(2026, 1, 1))
            .await
            .unwrap();
        assert_eq!(plain.get(&t.db, 1, "views").await.unwrap(), 5, "[{b}]");
        let r = plain
            .range(&t.db, 1, "views", day(2026, 1, 1), day(2026, 1, 2))
            .await;
        assert!(
            matches!(&r, Err(CounterError::NotWindowed { table, key }) if table == "plain_counters" && key == "views"),
            "[{b}] {r:?}"
        );
        let count = Query::select()
            .expr_as(Expr::cust("COUNT(*)"), Alias::new("n"))
            .from(Alias::new("plain_counters_buckets"))
            .to_owned();
        let r = t.sql().query_one(&count).await;
        assert!(r.is_err(), "[{b}] the bucket table exists: {r:?}");
        // The counter table itself is there.
        assert_eq!(raw::count_rows(&t.db, "plain_counters").await, 1, "[{b}]");

        // A windowed table gets its bucket table, empty until written.
        let c = windowed("with_windows", 4);
        c.create_table(&t.db).await.unwrap();
        assert_eq!(
            raw::count_rows(&t.db, "with_windows_buckets").await,
            0,
            "[{b}]"
        );
        c.add(&t.db, 1, "likes", 1).await.unwrap();
        assert_eq!(
            raw::count_rows(&t.db, "with_windows_buckets").await,
            0,
            "[{b}]"
        );
        c.add(&t.db, 1, "views", 1).await.unwrap();
        assert_eq!(
            raw::count_rows(&t.db, "with_windows_buckets").await,
            1,
            "[{b}]"
        );
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test]
    #[label = "windowed_batches_are_all_or_nothing"]
    async fn windowed_batches_are_all_or_nothing_and_repairs_touch_no_bucket(t: TestDb) {
        use counter_core::{Reconcile, Truth};
        let b = t.backend;
        let counters = Counters::<i64>::new(
            CounterTable::new("atomic")
                .and_then(|c| c.with_key_window("views", Window::Day))
                .unwrap(),
        );
        counters.create_table(&t.db).await.unwrap();
        let before = Utc::now();

        // The total and the bucket are two statements: refused on a pool by
        // `apply_in`, before anything is written.
        let mut batch = DeltaBatch::new();
        batch.add(&counters, 1, "views", 2).unwrap();
        let err = batch.apply_in(&t.db).await.unwrap_err();
        assert!(
            matches!(err, CounterError::BatchNeedsTransaction { statements: 2 }),
            "[{b}] {err}"
        );
        assert_eq!(counters.get(&t.db, 1, "views").await.unwrap(), 0, "[{b}]");
        assert_eq!(raw::count_rows(&t.db, "atomic_buckets").await, 0, "[{b}]");

        // `apply` opens its own transaction for them.
        let mut batch = DeltaBatch::new();
        batch.add(&counters, 1, "views", 2).unwrap();
        let outcome = batch.apply(&t.db).await.unwrap();
        assert_eq!((outcome.rows, outcome.statements), (2, 2), "[{b}]");
        let after = Utc::now();
        let days = (
            Window::Day.start_of(before),
            Window::Day.start_of(after) + Duration::days(1),
        );
        assert_eq!(counters.get(&t.db, 1, "views").await.unwrap(), 2, "[{b}]");
        let in_buckets = counters
            .range(&t.db, 1, "views", days.0, days.1)
            .await
            .unwrap();
        assert_eq!(in_buckets, 2, "[{b}]");

        // A recount corrects the total, and no bucket: nothing happened today.
        t.db.execute_unprepared("CREATE TABLE truth_src (owner_id BIGINT, n BIGINT)")
            .await
            .unwrap();
        t.db.execute_unprepared("INSERT INTO truth_src VALUES (1, 5)")
            .await
            .unwrap();
        let truth = Query::select()
            .columns([Alias::new("owner_id"), Alias::new("n")])
            .from(Alias::new("truth_src"))
            .to_owned();
        let report = counters
            .reconcile(&t.db, "views", Truth::statement(truth), &Reconcile::new())
            .await
            .unwrap();
        assert_eq!(report.total_abs_drift, 3, "[{b}] {report:?}");
        assert_eq!(counters.get(&t.db, 1, "views").await.unwrap(), 5, "[{b}]");
        let in_buckets = counters
            .range(&t.db, 1, "views", days.0, days.1)
            .await
            .unwrap();
        assert_eq!(in_buckets, 2, "[{b}] the repair went into a bucket");
        t.finish().await;
    }
}
