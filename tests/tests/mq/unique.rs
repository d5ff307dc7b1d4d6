//! Observations of unique keys through each broker, published before any
//! consumer ran: members counted once whatever the repeats, the duplicate
//! publishes and the redeliveries, in the same messages as deltas.

use std::time::Duration;

use chrono::{TimeZone, Utc};
use counter_core::{CounterTable, Counters, Window, unique::Sketch};
use counter_mq::{Change, CounterMessage, Observation, Publish};
use counter_tests::{
    TestDb, backend_test, figures, members_missing,
    mq::{self, Bus},
};

use super::consumer;

const MESSAGES: usize = 400;

backend_test! {
    /// 400 messages each observing one member (250 distinct; a day bucket
    /// for `visitors`) and adding 1 to `views`, published before a
    /// consumer exists; 100 of them sent twice under the same id. The
    /// stored sketch is the one of the 250 members, `views` is 400.
    async fn observations_through_each_broker(t: TestDb) {
        for broker in mq::BROKERS {
            let Some(bus) = Bus::open(broker, t.backend, "unique_mq").await else {
                continue;
            };
            let table = format!("unique_mq_{broker}");
            let posts = Counters::<i64>::new(
                CounterTable::new(table.clone())
                    .and_then(|t| t.with_slots(4))
                    .and_then(|t| t.with_unique_key("viewers"))
                    .and_then(|t| t.with_unique_key("visitors"))
                    .and_then(|t| t.with_key_window("visitors", Window::Day))
                    .unwrap(),
            );
            posts.create_table(&t.db).await.unwrap();
            counter_mq::create_table(&t.db).await.unwrap();
            let day = Utc.with_ymd_and_hms(2026, 11, 20, 12, 0, 0).unwrap();
            let mut messages = Vec::with_capacity(MESSAGES);
            for i in 0..MESSAGES {
                let member = format!("user:{}", i % 250);
                let mut message = CounterMessage::with_id(format!("uq-{broker}-{i}"), &table);
                message.push(Change { owner: 7.into(), key: "views".into(), delta: 1, at: None });
                for key in ["viewers", "visitors"] {
                    message.push_observation(Observation {
                        owner: 7.into(),
                        key: key.into(),
                        member: member.clone(),
                        at: Some(day),
                    });
                }
                messages.push(message);
            }
            let publisher = bus.publisher().await;
            for message in messages.iter().chain(&messages[..100]) {
                publisher.send(message).await.unwrap();
            }
            // The typed path too: one more member, checked before sending.
            publisher.observe(&posts, 7, "viewers", "typed:1").await.unwrap();
            let stats = bus
                .consume(consumer(&t.db, &posts), &t.db, MESSAGES + 1, 0, Duration::from_secs(120))
                .await;
            bus.finish().await;
            let mut union = Sketch::new();
            for i in 0..250 {
                union.insert(format!("user:{i}").as_str());
            }
            let visitors = posts
                .unique_over(&t.db, 7, "visitors", day - chrono::Duration::hours(12), day + chrono::Duration::hours(12))
                .await
                .unwrap();
            assert_eq!(visitors, union.estimate(), "{broker}: the day's visitors");
            union.insert("typed:1");
            let stored = posts.sketch(&t.db, 7, "viewers").await.unwrap();
            assert!(stored.to_bytes() == union.to_bytes(), "{broker}: {stored:?} {union:?} {stats:?}");
            let views = posts.get(&t.db, 7, "views").await.unwrap();
            assert_eq!(views, MESSAGES as i64);
            let members: Vec<String> = (0..250).map(|i| format!("user:{i}")).collect();
            let missing = members_missing(
                &stored,
                members.iter().map(String::as_str).chain(["typed:1"]),
            );
            figures(
                &format!("unique_mq_{broker}"),
                t.backend,
                &[
                    ("messages", stats.messages),
                    ("applied", stats.applied),
                    ("duplicates_skipped", stats.duplicates_skipped),
                    ("distinct_members", 251),
                    ("estimate", stored.estimate()),
                    ("views_lost", MESSAGES as u64 - views as u64),
                    ("members_lost", missing),
                ],
            );
        }
        t.finish().await;
    }
}
