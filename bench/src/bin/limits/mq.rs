//! The counting consumer of `counter-mq` beside a pipeline written by hand
//! (`mq_consume`), with `--nats-url`: the same machine, database, broker
//! and backlog. NATS JetStream only: RabbitMQ is not measured here
//! (mq-bench measures the consumer on it).
//!
//! Each round publishes `--mq-messages` messages to a fresh stream per
//! side, then drains the backlog, the consumer first, the hand-written
//! loop second. A message is one event as a service publishes it (as in
//! mq-bench): `views` +1 of an owner among 10,000, a distinct id, the
//! library's format (`CounterMessage::encode`). Both sides get the same
//! owners in the same order and the same bytes but for the table name
//! (`limits_mq_own` or `limits_mq_raw`, as long as each other): each side
//! writes a table of its own, 16 slots, with the same history.
//!
//! * **own**: a `counter_mq::Consumer` (batches of 500, mq-bench's
//!   default; `max_wait` 50 ms) bound to the stream through its durable
//!   pull consumer, timed from its start (binding and start-up checks
//!   included) until its stats count every message applied (read every
//!   millisecond; the dedup table is counted after).
//! * **raw**: a durable pull consumer of the same settings (explicit
//!   acknowledgements, `ack_wait` 30 s, unlimited deliveries, 20,000
//!   pending) and a loop: `fetch` of up to 500 (expiring after 50 ms),
//!   each message decoded with serde into the wire shape, then one
//!   transaction: the dedup insert returning the new ids (the library's
//!   statement: one string `unnest`ed on PostgreSQL, `INSERT IGNORE ...
//!   RETURNING` on MariaDB, `ON CONFLICT DO NOTHING RETURNING` on SQLite),
//!   one multi-row upsert of the new messages' deltas summed per (owner,
//!   key), each counter to a random slot of 16 (the library picks one of
//!   its slots per counter and batch too), without the library's slot cap
//!   guard (columns as strings `unnest`ed on PostgreSQL, as the library
//!   does there, since a `VALUES` list that long can wait out a delayed
//!   ACK; a `VALUES` list elsewhere), `COMMIT`; then each message
//!   acknowledged, one by one, as counter-mq does. In a task of its own,
//!   as the consumer runs; timed from binding until the commit of the last
//!   message (the consumer's clock stops there too, before its last
//!   acknowledgements).
//!
//! Figures (`mq.mq_consume` in the JSON): messages a second each way
//! (medians of the rounds), batches per round and statements per batch:
//! the consumer's from its stats (`BEGIN` and `COMMIT` included), the raw
//! loop's 4.
//!
//! Checked, not only timed: after each phase every owner's total in its
//! table must equal the messages published for it so far, and the dedup
//! table must hold one row per message of the phase. Each phase is bounded
//! (publishing and draining two minutes each). Each stream and its dedup
//! rows are deleted after its phase, the tables at the end (the dedup
//! table itself is shared, and stays, as mq-bench leaves it).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::{Duration, Instant},
};

use bench::{BoxError, stats::median};
use counter_core::{CounterTable, Counters};
use counter_mq::{
    Change, Consumer, ConsumerStats, CounterMessage, Retention, Tables,
    async_nats::{
        self,
        jetstream::{
            self, Context,
            consumer::{AckPolicy, PullConsumer, pull},
            message::PublishMessage,
        },
    },
    nats::{self, ConsumerSettings, JetStreamSource, StreamSettings},
};
use futures_util::{StreamExt, stream};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, Statement,
    TransactionTrait, Value,
};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::oneshot;

use crate::{Args, Limit, Section};

/// The consumer's table and the raw loop's: names of one length, so the
/// two sides' messages are the same size.
const OWN_TABLE: &str = "limits_mq_own";
const RAW_TABLE: &str = "limits_mq_raw";
const SLOTS: i16 = 16;
/// Owners of the messages: 1 to this (as mq-bench).
const OWNERS: i64 = 10_000;
/// Messages per transaction, both sides (mq-bench's default).
const BATCH: usize = 500;
/// How long a fetch may wait to fill (the consumer's default).
const MAX_WAIT: Duration = Duration::from_millis(50);
/// Publishes awaiting their confirmation at once.
const IN_FLIGHT: usize = 64;
/// How long the streams keep a message.
const BROKER_KEEP: Duration = Duration::from_secs(3600);
/// The consumer's dedup retention: the stream's keep plus counter-mq's
/// margin of an hour, with room to spare (as mq-bench).
const RETENTION: Duration = Duration::from_secs(3 * 3600);
/// The longest a backlog may take to publish, and to drain.
const PHASE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the consumer may take to stop.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// The durable consumer's name on every stream.
const DURABLE: &str = "limits";
/// Owners per read of the totals check.
const OWNER_CHUNK: usize = 1_000;

fn counters(table: &'static str) -> Result<Counters<i64>, BoxError> {
    Ok(Counters::new(CounterTable::new(table)?.with_slots(SLOTS)?))
}

/// One drained backlog: how long it took, its transactions and their
/// statements (`BEGIN` and `COMMIT` included).
struct Drained {
    secs: f64,
    batches: u64,
    statements: u64,
}

/// Which side drains a backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// The consumer of `counter-mq`.
    Own,
    /// The loop written by hand.
    Raw,
}

/// One phase: its stream (whose name is also the dedup source of its
/// messages) and the table its messages name.
struct Lane<'a> {
    db: &'a DatabaseConnection,
    publishing: &'a Context,
    consuming: &'a Context,
    stream: String,
    prefix: String,
    counters: &'a Counters<i64>,
}

pub(crate) async fn run(
    args: &Args,
    db: &DatabaseConnection,
    nats_url: &str,
) -> Result<Section, BoxError> {
    let own = counters(OWN_TABLE)?;
    let raw = counters(RAW_TABLE)?;
    for table in [&own, &raw] {
        let _ = table.drop_table(db).await;
        table.create_table(db).await?;
    }
    counter_mq::create_table(db).await?;
    let outcome = measure(args, db, nats_url, [&own, &raw]).await;
    for table in [&own, &raw] {
        let _ = table.drop_table(db).await;
    }
    outcome
}

async fn measure(
    args: &Args,
    db: &DatabaseConnection,
    nats_url: &str,
    tables: [&Counters<i64>; 2],
) -> Result<Section, BoxError> {
    // Publishers and consumers on connections of their own, as separate
    // processes would be.
    let connect = async || {
        async_nats::connect(nats_url)
            .await
            .map(jetstream::new)
            .map_err(|e| format!("connecting to NATS at {nats_url}: {e}"))
    };
    let publishing = connect().await?;
    let consuming = connect().await?;
    let tag = format!("{:08x}", rand::random::<u32>());
    let m = args.mq_messages;
    let mut rng = StdRng::seed_from_u64(rand::random());
    let mut section = Section {
        ok: true,
        ..Section::default()
    };
    // What every owner's `views` must be in either table: both get the
    // same messages.
    let mut expected: HashMap<i64, i64> = HashMap::new();
    let mut rates: [Vec<f64>; 2] = Default::default();
    let mut batches = [0u64; 2];
    let mut statements = [0u64; 2];
    for round in 0..args.rounds {
        let plan: Vec<i64> = (0..m).map(|_| rng.random_range(1..=OWNERS)).collect();
        for &owner in &plan {
            *expected.entry(owner).or_default() += 1;
        }
        for (i, side) in [Side::Own, Side::Raw].into_iter().enumerate() {
            let letter = if side == Side::Own { "o" } else { "r" };
            let lane = Lane {
                db,
                publishing: &publishing,
                consuming: &consuming,
                stream: format!("LIMQ{}{}{round}", tag.to_uppercase(), letter.to_uppercase()),
                prefix: format!("limq{tag}{letter}{round}"),
                counters: tables[i],
            };
            let (drained, dedup_rows) = lane.phase(side, &plan, &format!("{tag}-{round}")).await?;
            let rate = m as f64 / drained.secs;
            let name = lane.counters.table().name();
            println!(
                "mq_consume round {round}, {}: {m} messages in {:.3} s, {rate:.0}/s, {} batches, {:.1} statements a batch",
                if side == Side::Own {
                    "consumer"
                } else {
                    "by hand"
                },
                drained.secs,
                drained.batches,
                ratio(drained.statements, drained.batches)
            );
            if dedup_rows != m {
                eprintln!(
                    "FAIL: mq_consume: the dedup table holds {dedup_rows} ids of {}, {m} were published",
                    lane.stream
                );
                section.ok = false;
            }
            let wrong = check(db, lane.counters, &expected).await?;
            if wrong > 0 {
                eprintln!(
                    "FAIL: mq_consume: {wrong} owners of {name} differ from the messages published for them"
                );
                section.ok = false;
            }
            rates[i].push(rate);
            batches[i] += drained.batches;
            statements[i] += drained.statements;
        }
    }
    let [own_rates, raw_rates] = rates;
    let (own_rate, raw_rate) = (median(own_rates), median(raw_rates));
    println!(
        "mq_consume: {own_rate:.0} messages/s through the consumer, {raw_rate:.0}/s by hand \
         ({m} messages, batches of {BATCH}, {:.1} and {:.1} statements a batch)",
        ratio(statements[0], batches[0]),
        ratio(statements[1], batches[1])
    );
    section.limits.push((
        "mq_consume",
        Limit {
            own_us: 1e6 / own_rate,
            raw_us: 1e6 / raw_rate,
        },
    ));
    section.figures.insert(
        "mq_consume".to_owned(),
        json!({
            "broker": "nats",
            "messages": m,
            "batch": BATCH,
            "owners": OWNERS,
            "slots": SLOTS,
            "own_messages_per_s": own_rate,
            "raw_messages_per_s": raw_rate,
            "own_batches_per_round": ratio(batches[0], args.rounds),
            "raw_batches_per_round": ratio(batches[1], args.rounds),
            "own_statements_per_batch": ratio(statements[0], batches[0]),
            "raw_statements_per_batch": ratio(statements[1], batches[1]),
        }),
    );
    Ok(section)
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        f64::NAN
    } else {
        a as f64 / b as f64
    }
}

impl Lane<'_> {
    /// A fresh stream, `plan` published to it (one message per owner, ids
    /// `<ids>-<i>`), drained by `side`; then the ids the dedup table holds
    /// for the stream. The stream and its dedup rows are deleted whatever
    /// happened.
    async fn phase(&self, side: Side, plan: &[i64], ids: &str) -> Result<(Drained, u64), BoxError> {
        let outcome = async {
            let settings = StreamSettings {
                name: self.stream.clone(),
                subjects: vec![format!("{}.>", self.prefix)],
                max_age: BROKER_KEEP,
                ..StreamSettings::default()
            };
            nats::ensure_stream(self.publishing, &settings).await?;
            self.publish(plan, ids).await?;
            let drained = match side {
                Side::Own => self.own(plan.len() as u64).await?,
                Side::Raw => self.raw(plan.len() as u64).await?,
            };
            let rows = counter_mq::applied_count(self.db, &self.stream).await?;
            Ok::<_, BoxError>((drained, rows))
        }
        .await;
        if let Err(e) = self.publishing.delete_stream(&self.stream).await {
            eprintln!("limits: deleting stream {}: {e}", self.stream);
        }
        let delete = Statement::from_sql_and_values(
            self.db.get_database_backend(),
            format!(
                "DELETE FROM {} WHERE source = {}",
                counter_mq::APPLIED_MESSAGES,
                placeholder(self.db.get_database_backend(), 1)
            ),
            [Value::from(self.stream.as_str())],
        );
        if let Err(e) = self.db.execute_raw(delete).await {
            eprintln!("limits: deleting the dedup rows of {}: {e}", self.stream);
        }
        outcome
    }

    /// Publishes one event per owner of `plan`, [`IN_FLIGHT`] sends
    /// awaiting the stream's confirmation at once.
    async fn publish(&self, plan: &[i64], ids: &str) -> Result<(), BoxError> {
        let table = self.counters.table().name();
        let subject = format!("{}.{table}", self.prefix);
        let js = self.publishing;
        let mut sends = stream::iter(plan.iter().enumerate())
            .map(|(i, &owner)| {
                let mut message = CounterMessage::with_id(format!("{ids}-{i:07}"), table);
                message.push(Change {
                    owner: owner.into(),
                    key: "views".into(),
                    delta: 1,
                    at: None,
                });
                let subject = subject.clone();
                async move {
                    let payload = message.encode()?;
                    let publish = PublishMessage::build()
                        .payload(payload.into())
                        .message_id(message.id());
                    let ack = js.send_publish(subject, publish).await?.await?;
                    if ack.duplicate {
                        return Err(
                            format!("the stream took {} for a duplicate", message.id()).into()
                        );
                    }
                    Ok::<_, BoxError>(())
                }
            })
            .buffer_unordered(IN_FLIGHT);
        let all = async {
            while let Some(sent) = sends.next().await {
                sent?;
            }
            Ok::<_, BoxError>(())
        };
        tokio::time::timeout(PHASE_TIMEOUT, all)
            .await
            .map_err(|_| format!("publishing to {} took over {PHASE_TIMEOUT:?}", self.stream))?
    }

    /// The consumer of `counter-mq` on the backlog of `m` messages, until
    /// its stats count them all applied.
    async fn own(&self, m: u64) -> Result<Drained, BoxError> {
        let started = Instant::now();
        let settings = ConsumerSettings {
            durable: DURABLE.into(),
            ..ConsumerSettings::default()
        };
        let source = JetStreamSource::new(self.consuming.clone(), &self.stream, settings).await?;
        let consumer = Consumer::builder(self.db.clone(), Tables::new().with(self.counters))
            .batch_size(BATCH)
            .max_wait(MAX_WAIT)
            .retention(Retention::keep_for(RETENTION))
            .build(source)
            .await?;
        let stats = consumer.stats_handle();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(consumer.run(async move {
            let _ = stopped.await;
        }));
        let drained = loop {
            let now = stats.get();
            if now.applied >= m {
                break Ok(started.elapsed());
            }
            if now.rejected > 0 || now.duplicates_skipped > 0 || task.is_finished() {
                break Err(format!(
                    "the consumer of {} went wrong: {now:?}",
                    self.stream
                ));
            }
            if started.elapsed() > PHASE_TIMEOUT {
                break Err(format!(
                    "the consumer of {} applied {} of {m} messages in {PHASE_TIMEOUT:?}",
                    self.stream, now.applied
                ));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        let _ = stop.send(());
        let stats: ConsumerStats = tokio::time::timeout(STOP_TIMEOUT, task)
            .await
            .map_err(|_| format!("the consumer of {} did not stop", self.stream))???;
        Ok(Drained {
            secs: drained?.as_secs_f64(),
            batches: stats.batches,
            statements: stats.statements,
        })
    }

    /// The loop written by hand on the backlog of `m` messages, until it
    /// committed them all; in a task of its own, as the consumer runs (the
    /// caller's task runs on the runtime's main thread, where every wake-up
    /// would cross threads).
    async fn raw(&self, m: u64) -> Result<Drained, BoxError> {
        let (db, js) = (self.db.clone(), self.consuming.clone());
        let stream = self.stream.clone();
        let table = self.counters.table().name().to_owned();
        tokio::spawn(async move { raw_loop(&db, &js, &stream, &table, m).await }).await?
    }
}

/// The raw loop: binds a pull consumer to `stream`, then fetches,
/// decodes, applies in one transaction and acknowledges until `m` messages
/// are committed.
async fn raw_loop(
    db: &DatabaseConnection,
    js: &Context,
    stream: &str,
    table: &str,
    m: u64,
) -> Result<Drained, BoxError> {
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(rand::random());
    let consumer: PullConsumer = js
        .get_stream(stream)
        .await?
        .create_consumer(pull::Config {
            durable_name: Some(DURABLE.into()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: Duration::from_secs(30),
            max_deliver: -1,
            max_ack_pending: 20_000,
            ..Default::default()
        })
        .await?;
    let (mut applied, mut batches) = (0u64, 0u64);
    let mut secs = None;
    // Each fetch brings a message or waits out its expiry: bounded by
    // the time, and the count besides.
    for _ in 0..m + 10_000 {
        if applied >= m {
            break;
        }
        if started.elapsed() > PHASE_TIMEOUT {
            break;
        }
        let mut fetched = consumer
            .fetch()
            .max_messages(BATCH)
            .expires(MAX_WAIT)
            .messages()
            .await?;
        let mut messages = Vec::with_capacity(BATCH);
        while let Some(message) = fetched.next().await {
            messages.push(message?);
        }
        if messages.is_empty() {
            continue;
        }
        let mut decoded = Vec::with_capacity(messages.len());
        for message in &messages {
            let wire: Wire = serde_json::from_slice(&message.payload)?;
            if wire.v != 1 || wire.t != table {
                return Err(format!("an unexpected message: v {} t {}", wire.v, wire.t).into());
            }
            decoded.push(wire);
        }
        let txn = db.begin().await?;
        let ids: Vec<&str> = decoded.iter().map(|w| w.id.as_str()).collect();
        let new = record_new(&txn, stream, &ids).await?;
        // The new messages' deltas summed per counter (an id twice in
        // one batch counts once), each counter to a slot of its own.
        let mut seen = HashSet::with_capacity(new.len());
        let mut sums: BTreeMap<(i64, &str), i64> = BTreeMap::new();
        for wire in &decoded {
            if new.contains(wire.id.as_str()) && seen.insert(wire.id.as_str()) {
                for (owner, key, delta) in &wire.d {
                    *sums.entry((*owner, key.as_str())).or_default() += delta;
                }
            }
        }
        let rows: Vec<Row<'_>> = sums
            .into_iter()
            .map(|((owner, key), delta)| (owner, key, rng.random_range(0..SLOTS), delta))
            .collect();
        upsert(&txn, table, &rows).await?;
        txn.commit().await?;
        applied += seen.len() as u64;
        batches += 1;
        if applied >= m {
            secs = Some(started.elapsed().as_secs_f64());
        }
        for message in &messages {
            message.ack().await?;
        }
    }
    let secs = secs.ok_or_else(|| {
        format!("the loop on {stream} applied {applied} of {m} messages in {PHASE_TIMEOUT:?}")
    })?;
    Ok(Drained {
        secs,
        batches,
        // BEGIN, the dedup insert, the upsert, COMMIT.
        statements: batches * 4,
    })
}

/// A message as the raw loop reads it: the library's wire shape, changes
/// without a time (`[owner, key, delta]`).
#[derive(Deserialize)]
struct Wire {
    v: u64,
    id: String,
    t: String,
    d: Vec<(i64, String, i64)>,
}

fn placeholder(backend: DbBackend, n: usize) -> String {
    match backend {
        DbBackend::Postgres => format!("${n}"),
        _ => "?".to_owned(),
    }
}

/// The dedup insert by hand: the ids of `source` not recorded yet are
/// inserted and returned.
async fn record_new(
    txn: &DatabaseTransaction,
    source: &str,
    ids: &[&str],
) -> Result<HashSet<String>, BoxError> {
    let backend = txn.get_database_backend();
    let table = counter_mq::APPLIED_MESSAGES;
    let statement = match backend {
        DbBackend::Postgres => Statement::from_sql_and_values(
            backend,
            format!(
                "INSERT INTO {table} (source, msg_id, applied_at) \
                 SELECT $1, id, CAST(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) AS BIGINT) \
                 FROM unnest(string_to_array($2, ' ')) AS t(id) \
                 ON CONFLICT DO NOTHING RETURNING msg_id"
            ),
            [Value::from(source), Value::from(ids.join(" "))],
        ),
        _ => {
            let (insert, now, conflict) = match backend {
                DbBackend::MySql => ("INSERT IGNORE INTO", "CAST(UNIX_TIMESTAMP() AS SIGNED)", ""),
                _ => (
                    "INSERT INTO",
                    "CAST(strftime('%s', 'now') AS INTEGER)",
                    " ON CONFLICT DO NOTHING",
                ),
            };
            let rows = vec![format!("(?, ?, {now})"); ids.len()].join(",");
            let values = ids
                .iter()
                .flat_map(|id| [Value::from(source), Value::from(*id)]);
            Statement::from_sql_and_values(
                backend,
                format!(
                    "{insert} {table} (source, msg_id, applied_at) VALUES {rows}{conflict} RETURNING msg_id"
                ),
                values,
            )
        }
    };
    let rows = txn.query_all_raw(statement).await?;
    Ok(rows
        .iter()
        .map(|row| row.try_get_by_index::<String>(0))
        .collect::<Result<_, _>>()?)
}

/// A slot row to add to: `(owner, key, slot, delta)`.
type Row<'a> = (i64, &'a str, i16, i64);

/// The upsert by hand: `rows` added to their slot rows of `table`, in one
/// statement.
async fn upsert(txn: &DatabaseTransaction, table: &str, rows: &[Row<'_>]) -> Result<(), BoxError> {
    if rows.is_empty() {
        return Ok(());
    }
    let backend = txn.get_database_backend();
    let statement = match backend {
        DbBackend::Postgres => {
            let column =
                |f: &dyn Fn(&Row<'_>) -> String| rows.iter().map(f).collect::<Vec<_>>().join(",");
            Statement::from_sql_and_values(
                backend,
                format!(
                    "INSERT INTO \"{table}\" (owner_id, count_key, slot, value) \
                     SELECT * FROM unnest(string_to_array($1, ',')::bigint[], string_to_array($2, ','), \
                     string_to_array($3, ',')::smallint[], string_to_array($4, ',')::bigint[]) \
                     ON CONFLICT (owner_id, count_key, slot) DO UPDATE SET value = \"{table}\".value + excluded.value"
                ),
                [
                    Value::from(column(&|r| r.0.to_string())),
                    Value::from(column(&|r| r.1.to_owned())),
                    Value::from(column(&|r| r.2.to_string())),
                    Value::from(column(&|r| r.3.to_string())),
                ],
            )
        }
        _ => {
            let list = vec!["(?, ?, ?, ?)"; rows.len()].join(",");
            let update = match backend {
                DbBackend::MySql => "ON DUPLICATE KEY UPDATE value = value + VALUES(value)",
                _ => {
                    "ON CONFLICT (owner_id, count_key, slot) DO UPDATE SET value = value + excluded.value"
                }
            };
            let values = rows.iter().flat_map(|&(owner, key, slot, delta)| {
                [
                    Value::from(owner),
                    Value::from(key),
                    Value::from(slot),
                    Value::from(delta),
                ]
            });
            Statement::from_sql_and_values(
                backend,
                format!(
                    "INSERT INTO {table} (owner_id, count_key, slot, value) VALUES {list} {update}"
                ),
                values,
            )
        }
    };
    txn.execute_raw(statement).await?;
    Ok(())
}

/// Owners of `counters` whose `views` differ from `expected` (read back
/// with the library's batch read, a thousand owners at a time).
async fn check(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    expected: &HashMap<i64, i64>,
) -> Result<u64, BoxError> {
    let owners: Vec<i64> = (1..=OWNERS).collect();
    let mut wrong = 0;
    for chunk in owners.chunks(OWNER_CHUNK) {
        let got = counters.get_many(db, chunk, &["views"]).await?;
        for owner in chunk {
            let views = got
                .get(owner)
                .and_then(|t| t.get("views"))
                .copied()
                .unwrap_or(0);
            let want = expected.get(owner).copied().unwrap_or(0);
            if views != want {
                if wrong < 5 {
                    eprintln!(
                        "mq_consume: owner {owner} of {}: {views} views, {want} published",
                        counters.table().name()
                    );
                }
                wrong += 1;
            }
        }
    }
    Ok(wrong)
}
