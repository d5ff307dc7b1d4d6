//! The MQ tier (`counter-mq`) on every backend and both brokers: events
//! with known totals, duplicate publishes inside and beyond JetStream's
//! duplicate window, redeliveries, the consumer's process aborted at three
//! points, the database connection cut mid-batch, a nats-server killed and
//! restarted, a 3-node JetStream cluster losing its consumer's leader,
//! several consumers sharing one queue, the typed publisher, poison messages
//! and the retention check. Every test asserts totals = the sum over
//! distinct ids and writes figures (messages, redeliveries, duplicates
//! skipped, lost and doubled; lost and doubled must be 0: `.ci/run` checks).

mod buffered;
mod consumers;
mod edges;
mod faults;
mod flows;
mod poison;
mod unique;

use std::time::Duration;

use counter_core::Counters;
use counter_mq::{Consumer, ConsumerBuilder, Retention, Tables};
use counter_tests::{counters, figures, mq::Tally};
use sea_orm::DatabaseConnection;

/// A counter table and the dedup table on `db`.
pub async fn tables(db: &DatabaseConnection, table: &str) -> Counters<i64> {
    let posts = counters::<i64>(table, 4);
    posts
        .create_table(db)
        .await
        .expect("create the counter table");
    counter_mq::create_table(db)
        .await
        .expect("create the dedup table");
    posts
}

/// A consumer of `posts` with test settings: batches of 200, 48 h of
/// dedup retention.
pub fn consumer(db: &DatabaseConnection, posts: &Counters<i64>) -> ConsumerBuilder {
    Consumer::builder(db.clone(), Tables::new().with(posts))
        .batch_size(200)
        .max_wait(Duration::from_millis(50))
        .retention(Retention::keep_for(Duration::from_secs(48 * 3600)))
}

/// The figures every MQ row carries besides lost, doubled and wrong totals
/// (which [`report`] adds from its tally).
const REQUIRED: [&str; 3] = ["messages", "redeliveries", "duplicates_skipped"];

/// Asserts nothing was lost, doubled or wrong, and writes the figures:
/// `extra` (which must name every figure of [`REQUIRED`]), then lost,
/// doubled and wrong totals.
pub fn report(test: &str, backend: impl std::fmt::Display, tally: Tally, extra: &[(&str, u64)]) {
    for figure in REQUIRED {
        assert!(
            extra.iter().any(|(name, _)| *name == figure),
            "{test}: its figures must include `{figure}`"
        );
    }
    let mut pairs = extra.to_vec();
    pairs.extend([
        ("lost", tally.lost),
        ("doubled", tally.doubled),
        ("wrong_totals", tally.wrong_totals),
    ]);
    figures(test, backend, &pairs);
    assert_eq!(
        tally,
        Tally::default(),
        "{test}: messages lost or doubled, or totals wrong"
    );
}
