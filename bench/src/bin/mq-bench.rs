//! What the counting consumer of `counter-mq` applies per second, how long
//! a message waits between its publish and its commit, and whether any
//! message was lost or applied twice; on one database and one broker.
//!
//! Everything lives under a tag drawn per run (8 hex digits): the counter
//! table `mqb_<tag>` (16 slots), and on NATS the streams `MQB<TAG>` and
//! `MQBN<TAG>` (subjects `mqb<tag>.>` and `mqbn<tag>.>`, `max_age` 1 h,
//! durables `mqb` and `mqbn`), on RabbitMQ the quorum queues `mqb.<tag>`
//! and `mqbn.<tag>` (message TTL 1 h, with their `.dead` queues). The
//! consumers keep their dedup rows 3 h (the brokers' horizon is 1 h plus a
//! margin of 1 h). Every message is one event, as a service publishes it:
//! `views` +1 of one owner (so an owner's total counts its applied
//! messages, and a lost or doubled message shows as such).
//!
//! 1. **batched** (`applied_per_s`): `--messages` messages (owners 1 to
//!    10,000) published first, 64 sends in flight, each awaiting the
//!    broker's confirmation; then a consumer (`--batch` messages per
//!    transaction) is started on the backlog, and timed from its start
//!    (binding to the stream or queue included) until the dedup table holds
//!    every id of the phase (polled every 20 ms, at most 10 minutes).
//! 2. **latency** (`p50_ms`, `p99_ms`): the same consumer keeps running
//!    while `--rate` messages per second are offered for `--latency-secs`
//!    seconds (a 10 ms tick sends its share; each send is a task of its
//!    own, so a slow confirmation does not slow the pacing), each to an
//!    owner of its own (1,000,000 + i). A commit observer
//!    (`counter_core::observe`) sees the owners of every committed batch:
//!    a message's latency is from just before its send to the observer
//!    call after its `COMMIT`. Every message must be seen committed within
//!    60 s of the last confirmation. `statements_per_batch` is then the
//!    consumer's statements over its batches (`BEGIN` and `COMMIT`
//!    included), from the stats it returns at its graceful shutdown.
//! 3. **naive** (`naive.applied_per_s`): `--naive-messages` messages on a
//!    stream or queue of their own, applied by a consumer with
//!    `batch_size(1)`, one transaction per message, timed the same way.
//!    `ratio_batched_over_naive` compares the two rates.
//! 4. **totals**: the bench keeps what every distinct id must add; each
//!    owner's `views` are read back a thousand owners at a time. `lost` and
//!    `doubled` count message applications missing or in excess, and
//!    `totals_ok` needs every owner right.
//!
//! The run fails (exit 1) unless the totals are right and every latency
//! message was seen committed. The streams or queues, the counter table and
//! the run's dedup rows are deleted at the end (the dedup table itself is
//! shared, and stays). `sqlite::memory:` runs on a pool of one connection.
//!
//! `cargo run --release -p bench --bin mq-bench -- --database-url <URL>
//! --broker nats|amqp [--json <PATH>]` (`RUST_LOG=counter_mq=debug` logs
//! each batch's timing to stderr).

use std::{
    collections::HashMap,
    path::PathBuf,
    process::ExitCode,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bench::stats::percentile;
use clap::{Parser, ValueEnum};
use counter_core::{
    CounterTable, Counters,
    observe::{self, CommitObserver, ObserverFuture},
};
use counter_mq::async_nats::{self, jetstream};
use counter_mq::{
    Change, Consumer, ConsumerStats, CounterMessage, MqError, Publish, Retention, Source,
    StatsHandle, Tables,
    amqp::{self, AmqpPublisher, AmqpSource, QueueSettings},
    nats::{self, ConsumerSettings, JetStreamPublisher, JetStreamSource, StreamSettings},
};
use futures_util::{StreamExt, stream};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, Value};
use serde::Serialize;
use tokio::{
    sync::oneshot,
    task::{JoinHandle, JoinSet},
};

/// Measures the counting consumer of `counter-mq` on one database and one
/// broker: batched and one-by-one throughput, publish-to-commit latency at
/// a fixed rate, and the totals.
///
/// The ranges bound the work before anything is created.
#[derive(Debug, Parser)]
struct Args {
    /// Database to measure (`sqlite::memory:`, `postgres://...`,
    /// `mysql://...`).
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// The broker the messages go through.
    #[arg(long, value_enum)]
    broker: Broker,
    /// Where to write the results as JSON.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// NATS server with JetStream (`--broker nats`).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// RabbitMQ (`--broker amqp`).
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    amqp_url: String,
    /// Messages of the batched throughput phase, 1 to 1,000,000.
    #[arg(long, default_value_t = 50_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    messages: u64,
    /// Messages of the one-transaction-per-message phase, 1 to 100,000.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    naive_messages: u64,
    /// Messages per second offered in the latency phase, 100 to 20,000.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(100..=20_000))]
    rate: u64,
    /// Length of the latency phase in seconds, 1 to 300.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=300))]
    latency_secs: u64,
    /// Messages per transaction of the batched consumer, 1 to 5,000.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=5_000))]
    batch: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Broker {
    /// NATS JetStream.
    Nats,
    /// RabbitMQ (AMQP 0-9-1).
    Amqp,
}

impl Broker {
    fn name(self) -> &'static str {
        match self {
            Broker::Nats => "nats",
            Broker::Amqp => "amqp",
        }
    }
}

const SLOTS: u16 = 16;
/// Owners of the batched and naive messages: 1 to this.
const OWNERS: i64 = 10_000;
/// The owner of latency message `i` is this + `i`: one owner per message,
/// so that its commit can be told from every other.
const LATENCY_BASE: i64 = 1_000_000;
/// Sends awaiting their confirmation at once while pre-publishing.
const IN_FLIGHT: usize = 64;
/// How long the streams and queues keep a message.
const BROKER_KEEP: Duration = Duration::from_secs(3600);
/// How long the consumers keep dedup rows: the brokers' horizon (their
/// keep plus counter-mq's margin of one hour) with room to spare.
const RETENTION: Duration = Duration::from_secs(3 * 3600);
/// Unacknowledged RabbitMQ deliveries per consumer (at least a batch).
const PREFETCH: u16 = 2_000;
/// How often the dedup table is counted while a backlog drains.
const POLL: Duration = Duration::from_millis(20);
/// The longest a backlog may take to drain.
const APPLY_TIMEOUT: Duration = Duration::from_secs(600);
/// How long after the last confirmed latency message its commit may come.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a consumer may take to finish its batch in hand and stop.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// The pacing tick of the latency phase.
const TICK: Duration = Duration::from_millis(10);
/// Owners per read of the totals check.
const OWNER_CHUNK: usize = 1_000;
/// How many wrong owners are printed.
const SHOWN: u64 = 10;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The results, in the JSON shape of the issue plus extras.
#[derive(Debug, Serialize)]
struct Report {
    backend: &'static str,
    broker: &'static str,
    batched: BatchedReport,
    naive: NaiveReport,
    lost: u64,
    doubled: u64,
    totals_ok: bool,
    /// Messages of the batched throughput phase.
    messages: u64,
    batch: u64,
    offered_rate: u64,
    latency_messages: u64,
    /// Latency messages never seen committed (must be 0).
    latency_uncommitted: u64,
    ratio_batched_over_naive: f64,
    /// Owners whose `views` differ from what was published.
    wrong_owners: u64,
    run_tag: String,
    wall_secs: f64,
}

#[derive(Debug, Serialize)]
struct BatchedReport {
    applied_per_s: f64,
    /// Over the consumer's whole run (throughput and latency phases).
    statements_per_batch: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    /// Seconds until the backlog of `messages` was applied.
    secs: f64,
    /// The pre-publishing rate (64 sends in flight).
    publish_per_s: f64,
    /// Batches and messages per batch of the throughput phase alone.
    throughput_batches: u64,
    throughput_messages_per_batch: f64,
    throughput_statements_per_batch: f64,
    /// The rate the latency phase achieved (messages / seconds of pacing).
    latency_achieved_rate: f64,
    stats: StatsReport,
}

#[derive(Debug, Serialize)]
struct NaiveReport {
    applied_per_s: f64,
    messages: u64,
    secs: f64,
    publish_per_s: f64,
    statements_per_batch: f64,
    stats: StatsReport,
}

/// A consumer's final [`ConsumerStats`] (not `Serialize` itself).
#[derive(Debug, Serialize)]
struct StatsReport {
    batches: u64,
    messages: u64,
    applied: u64,
    duplicates_skipped: u64,
    rejected: u64,
    redeliveries: u64,
    failed_attempts: u64,
    statements: u64,
    ack_failures: u64,
}

impl From<ConsumerStats> for StatsReport {
    fn from(s: ConsumerStats) -> Self {
        Self {
            batches: s.batches,
            messages: s.messages,
            applied: s.applied,
            duplicates_skipped: s.duplicates_skipped,
            rejected: s.rejected,
            redeliveries: s.redeliveries,
            failed_attempts: s.failed_attempts,
            statements: s.statements,
            ack_failures: s.ack_failures,
        }
    }
}

/// What the broker phases measured, before the totals check.
#[derive(Debug)]
struct Figures {
    batched: BatchedReport,
    naive: NaiveReport,
    latency_messages: u64,
    latency_uncommitted: u64,
}

/// What every distinct message id must add, by owner.
#[derive(Debug, Default)]
struct Ledger {
    owners: HashMap<i64, Expected>,
    messages: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Expected {
    views: i64,
    events: i64,
}

impl Ledger {
    fn add(&mut self, owner: i64, views: i64) {
        let expected = self.owners.entry(owner).or_default();
        expected.views += views;
        expected.events += 1;
        self.messages += 1;
    }

    /// `n` messages to random owners (1 to [`OWNERS`]), recorded: their
    /// owners and `views` deltas.
    fn draw(&mut self, rng: &mut StdRng, n: u64) -> Vec<(i64, i64)> {
        (0..n)
            .map(|_| {
                let owner = rng.random_range(1..=OWNERS);
                let views = 1;
                self.add(owner, views);
                (owner, views)
            })
            .collect()
    }
}

/// The message of one event: `views` of `owner`.
fn message(id: String, table: &str, owner: i64, views: i64) -> CounterMessage {
    let mut message = CounterMessage::with_id(id, table);
    message.push(Change {
        owner: owner.into(),
        key: "views".into(),
        delta: views,
        at: None,
    });
    message
}

/// What every phase works with.
struct Ctx<'a> {
    db: &'a DatabaseConnection,
    counters: &'a Counters<i64>,
    args: &'a Args,
    tag: &'a str,
    table: &'a str,
}

#[tokio::main]
async fn main() -> ExitCode {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    match run(Args::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("mq-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<bool, BoxError> {
    let wall = Instant::now();
    let mut options = ConnectOptions::new(&args.database_url);
    if args.database_url.contains(":memory:") || args.database_url.contains("mode=memory") {
        // Each connection to an in-memory SQLite is a database of its own:
        // one connection, never recycled.
        options
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None);
    } else {
        // The consumer, the dedup-table polls, the reads of the check.
        options.max_connections(8);
    }
    options.sqlx_logging(false);
    let db = Database::connect(options).await?;
    let backend = backend_name(db.get_database_backend())?;
    if db.get_database_backend() == DbBackend::Sqlite && !args.database_url.contains("memory") {
        db.execute_unprepared("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL")
            .await?;
    }

    let tag = format!("{:08x}", rand::random::<u32>());
    let table = format!("mqb_{tag}");
    let counters = Counters::<i64>::new(CounterTable::new(table.clone())?.with_slots(SLOTS)?);
    counters.create_table(&db).await?;
    counter_mq::create_table(&db).await?;
    let broker = args.broker;
    println!(
        "mq-bench: {backend} + {}, run tag {tag}, table {table}",
        broker.name()
    );
    let sources = match broker {
        Broker::Nats => [
            format!("MQB{}", tag.to_uppercase()),
            format!("MQBN{}", tag.to_uppercase()),
        ],
        Broker::Amqp => [format!("mqb.{tag}"), format!("mqbn.{tag}")],
    };
    let ctx = Ctx {
        db: &db,
        counters: &counters,
        args: &args,
        tag: &tag,
        table: &table,
    };
    let mut ledger = Ledger::default();
    let outcome = match broker {
        Broker::Nats => with_nats(&ctx, &sources, &mut ledger).await,
        Broker::Amqp => with_amqp(&ctx, &sources, &mut ledger).await,
    };
    let checked = match &outcome {
        Ok(_) => Some(check_totals(&db, &counters, &ledger).await),
        Err(_) => None,
    };

    // Leave nothing behind, whatever happened.
    let dropped = counters.drop_table(&db).await;
    for source in &sources {
        let delete = format!(
            "DELETE FROM {} WHERE source = '{source}'",
            counter_mq::APPLIED_MESSAGES
        );
        if let Err(e) = db.execute_unprepared(&delete).await {
            eprintln!("mq-bench: deleting the dedup rows of {source}: {e}");
        }
    }
    db.close().await?;
    let figures = outcome?;
    let totals = checked.expect("checked after a run that succeeded")?;
    dropped?;

    let ratio = figures.batched.applied_per_s / figures.naive.applied_per_s;
    let report = Report {
        backend,
        broker: broker.name(),
        lost: totals.lost,
        doubled: totals.doubled,
        totals_ok: totals.ok(),
        messages: args.messages,
        batch: args.batch,
        offered_rate: args.rate,
        latency_messages: figures.latency_messages,
        latency_uncommitted: figures.latency_uncommitted,
        ratio_batched_over_naive: ratio,
        wrong_owners: totals.wrong_owners,
        run_tag: tag,
        wall_secs: wall.elapsed().as_secs_f64(),
        batched: figures.batched,
        naive: figures.naive,
    };
    print_summary(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")?;
        println!("wrote {}", path.display());
    }
    let ok = report.totals_ok && report.latency_uncommitted == 0;
    if !ok {
        eprintln!(
            "mq-bench: a message was lost or doubled, a total is wrong, or a commit was never seen"
        );
    }
    Ok(ok)
}

/// The backend's name in the JSON.
fn backend_name(backend: DbBackend) -> Result<&'static str, BoxError> {
    match backend {
        DbBackend::Sqlite => Ok("sqlite"),
        DbBackend::Postgres => Ok("postgres"),
        DbBackend::MySql => Ok("mysql"),
        other => Err(format!("unsupported database backend {other:?}").into()),
    }
}

/// The phases on NATS JetStream: publishers and consumers on connections
/// of their own, as separate processes would be; the streams deleted at
/// the end.
async fn with_nats(
    ctx: &Ctx<'_>,
    [batched, naive]: &[String; 2],
    ledger: &mut Ledger,
) -> Result<Figures, BoxError> {
    let url = &ctx.args.nats_url;
    let connect = async || {
        async_nats::connect(url)
            .await
            .map(jetstream::new)
            .map_err(|e| format!("connecting to NATS at {url}: {e}"))
    };
    let publishing = connect().await?;
    let consuming = connect().await?;
    let lanes = [
        (batched, format!("mqb{}", ctx.tag), "mqb"),
        (naive, format!("mqbn{}", ctx.tag), "mqbn"),
    ];
    let outcome = async {
        for (stream, prefix, _) in &lanes {
            let settings = StreamSettings {
                name: stream.to_string(),
                subjects: vec![format!("{prefix}.>")],
                max_age: BROKER_KEEP,
                ..StreamSettings::default()
            };
            nats::ensure_stream(&publishing, &settings).await?;
        }
        let publisher = |(_, prefix, _): &(&String, String, &str)| {
            JetStreamPublisher::new(publishing.clone()).subject_prefix(prefix.clone())
        };
        let open = |(stream, _, durable): &(&String, String, &str)| {
            let (js, stream) = (consuming.clone(), stream.to_string());
            let settings = ConsumerSettings {
                durable: (*durable).into(),
                ..ConsumerSettings::default()
            };
            async move || JetStreamSource::new(js, &stream, settings).await
        };
        measure(
            ctx,
            ledger,
            (publisher(&lanes[0]), open(&lanes[0])),
            (publisher(&lanes[1]), open(&lanes[1])),
        )
        .await
    }
    .await;
    for (stream, ..) in &lanes {
        if let Err(e) = publishing.delete_stream(stream).await {
            eprintln!("mq-bench: deleting stream {stream}: {e}");
        }
    }
    outcome
}

/// The phases on RabbitMQ: the queues declared before publishing (a
/// consumer binds to its queue only when its phase starts, so no prefetch
/// fills before the clock runs); publishers and consumers on connections
/// of their own; the queues and their dead-letter queues deleted at the
/// end.
async fn with_amqp(
    ctx: &Ctx<'_>,
    [batched, naive]: &[String; 2],
    ledger: &mut Ledger,
) -> Result<Figures, BoxError> {
    let url = &ctx.args.amqp_url;
    // Declares the queues before anything is published, and deletes them.
    let control = counter_mq::lapin::Connection::connect(url, Default::default())
        .await
        .map_err(|e| format!("connecting to RabbitMQ at {url}: {e}"))?;
    let queues = [batched, naive].map(|name| QueueSettings {
        message_ttl: Some(BROKER_KEEP),
        ..QueueSettings::named(name.as_str())
    });
    let prefetch = PREFETCH.max(u16::try_from(ctx.args.batch).unwrap_or(u16::MAX));
    let outcome = async {
        let channel = control.create_channel().await?;
        for queue in &queues {
            amqp::declare_queue(&channel, queue).await?;
        }
        let mut lanes = Vec::new();
        for queue in &queues {
            let publisher = AmqpPublisher::connect(url, queue.clone()).await?;
            let queue = queue.clone();
            lanes.push((publisher, async move || {
                AmqpSource::connect(url, queue, prefetch).await
            }));
        }
        let naive = lanes.pop().expect("two lanes");
        let batched = lanes.pop().expect("two lanes");
        measure(ctx, ledger, batched, naive).await
    }
    .await;
    match control.create_channel().await {
        Ok(channel) => {
            let names = queues
                .iter()
                .flat_map(|q| [Some(q.name.clone()), q.dead_letter_queue.clone()])
                .flatten();
            for name in names {
                if let Err(e) = channel
                    .queue_delete(name.as_str().into(), Default::default())
                    .await
                {
                    eprintln!("mq-bench: deleting queue {name}: {e}");
                }
            }
        }
        Err(e) => eprintln!("mq-bench: no channel to delete the queues: {e}"),
    }
    let _ = control.close(0, "done".into()).await;
    outcome
}

/// Steps 1 to 3 of the module docs, on either broker.
async fn measure<P, S>(
    ctx: &Ctx<'_>,
    ledger: &mut Ledger,
    (batched, open_batched): (P, impl AsyncFnOnce() -> Result<S, MqError>),
    (naive, open_naive): (P, impl AsyncFnOnce() -> Result<S, MqError>),
) -> Result<Figures, BoxError>
where
    P: Publish + Clone + 'static,
    S: Source + 'static,
{
    let args = ctx.args;
    let mut rng = StdRng::seed_from_u64(rand::random());

    // 1. The backlog, then the batched consumer on it.
    let plan = ledger.draw(&mut rng, args.messages);
    let publish_per_s = publish_all(&batched, ctx.table, &format!("t-{}", ctx.tag), &plan).await?;
    println!(
        "batched: published {} messages at {publish_per_s:.0}/s",
        args.messages
    );
    let started = Instant::now();
    let consumer = start(ctx, args.batch, open_batched().await?).await?;
    let secs = wait_applied(ctx.db, &consumer, args.messages, started)
        .await?
        .as_secs_f64();
    let applied_per_s = args.messages as f64 / secs;
    let phase = settled(&consumer.stats, args.messages).await;
    println!(
        "batched: applied {} messages in {secs:.2} s: {applied_per_s:.0}/s, {} batches, {:.1} statements per batch",
        args.messages,
        phase.batches,
        ratio(phase.statements, phase.batches)
    );

    // 2. Latency at a fixed offered rate, through the same consumer.
    let latency = latency_phase(ctx, &batched, ledger).await;
    let stats = consumer.stop().await?;
    let latency = latency?;
    println!(
        "latency: {} messages offered at {}/s (achieved {:.0}/s): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms{}",
        latency.messages,
        args.rate,
        latency.achieved_rate,
        latency.p50_ms,
        latency.p99_ms,
        latency.max_ms,
        if latency.uncommitted > 0 {
            format!(", {} NEVER SEEN COMMITTED", latency.uncommitted)
        } else {
            String::new()
        }
    );

    // 3. The naive consumer: one transaction per message.
    let plan = ledger.draw(&mut rng, args.naive_messages);
    let naive_publish_per_s =
        publish_all(&naive, ctx.table, &format!("n-{}", ctx.tag), &plan).await?;
    let started = Instant::now();
    let consumer = start(ctx, 1, open_naive().await?).await?;
    let naive_secs = wait_applied(ctx.db, &consumer, args.naive_messages, started)
        .await?
        .as_secs_f64();
    let naive_stats = consumer.stop().await?;
    let naive_per_s = args.naive_messages as f64 / naive_secs;
    println!(
        "naive: applied {} messages in {naive_secs:.2} s: {naive_per_s:.0}/s",
        args.naive_messages
    );
    Ok(Figures {
        batched: BatchedReport {
            applied_per_s,
            statements_per_batch: ratio(stats.statements, stats.batches),
            p50_ms: latency.p50_ms,
            p99_ms: latency.p99_ms,
            max_ms: latency.max_ms,
            secs,
            publish_per_s,
            throughput_batches: phase.batches,
            throughput_messages_per_batch: ratio(args.messages, phase.batches),
            throughput_statements_per_batch: ratio(phase.statements, phase.batches),
            latency_achieved_rate: latency.achieved_rate,
            stats: stats.into(),
        },
        naive: NaiveReport {
            applied_per_s: naive_per_s,
            messages: args.naive_messages,
            secs: naive_secs,
            publish_per_s: naive_publish_per_s,
            statements_per_batch: ratio(naive_stats.statements, naive_stats.batches),
            stats: naive_stats.into(),
        },
        latency_messages: latency.messages,
        latency_uncommitted: latency.uncommitted,
    })
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        f64::NAN
    } else {
        a as f64 / b as f64
    }
}

/// Publishes one message per `(owner, views)` of `plan`, with ids
/// `<prefix>-<i>`, [`IN_FLIGHT`] sends awaiting their confirmation at
/// once; returns the messages per second.
async fn publish_all<P: Publish>(
    publisher: &P,
    table: &str,
    prefix: &str,
    plan: &[(i64, i64)],
) -> Result<f64, BoxError> {
    let started = Instant::now();
    let mut sends = stream::iter(plan.iter().enumerate())
        .map(|(i, &(owner, views))| {
            let message = message(format!("{prefix}-{i}"), table, owner, views);
            async move { publisher.send(&message).await }
        })
        .buffer_unordered(IN_FLIGHT);
    while let Some(sent) = sends.next().await {
        let sent = sent?;
        if sent.duplicate {
            // Ids are unique per run: the stream must store every one.
            return Err(format!("the broker took {} for a duplicate", sent.id).into());
        }
    }
    Ok(plan.len() as f64 / started.elapsed().as_secs_f64())
}

/// A consumer running in a task of its own, until [`Running::stop`].
struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<ConsumerStats, MqError>>,
    stats: StatsHandle,
    source: String,
}

/// Builds the consumer of `source` for the bench's table and starts it.
/// Dropped without [`Running::stop`] (an error), it stops on its own: the
/// dropped sender is its shutdown signal.
async fn start<S: Source + 'static>(
    ctx: &Ctx<'_>,
    batch: u64,
    source: S,
) -> Result<Running, MqError> {
    let consumer = Consumer::builder(ctx.db.clone(), Tables::new().with(ctx.counters))
        .batch_size(batch as usize)
        .retention(Retention::keep_for(RETENTION))
        .build(source)
        .await?;
    let (stop, stopped) = oneshot::channel::<()>();
    let stats = consumer.stats_handle();
    let source = consumer.source_name().to_owned();
    let task = tokio::spawn(consumer.run(async move {
        let _ = stopped.await;
    }));
    Ok(Running {
        stop,
        task,
        stats,
        source,
    })
}

impl Running {
    /// Graceful shutdown: the batch in hand commits and is acknowledged;
    /// the consumer's final stats.
    async fn stop(self) -> Result<ConsumerStats, BoxError> {
        let _ = self.stop.send(());
        Ok(tokio::time::timeout(STOP_TIMEOUT, self.task).await???)
    }
}

/// Polls the dedup table until it holds `target` ids of the consumer's
/// source; the time since `started`. An error after [`APPLY_TIMEOUT`], or
/// if the consumer stopped.
async fn wait_applied(
    db: &DatabaseConnection,
    consumer: &Running,
    target: u64,
    started: Instant,
) -> Result<Duration, BoxError> {
    loop {
        let applied = counter_mq::applied_count(db, &consumer.source).await?;
        if applied >= target {
            return Ok(started.elapsed());
        }
        if consumer.task.is_finished() {
            return Err(format!(
                "the consumer of {} stopped with {applied} of {target} messages applied",
                consumer.source
            )
            .into());
        }
        if started.elapsed() > APPLY_TIMEOUT {
            return Err(format!(
                "{applied} of {target} messages of {} applied after {} s; stats {:?}",
                consumer.source,
                APPLY_TIMEOUT.as_secs(),
                consumer.stats.get()
            )
            .into());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The consumer's stats once they count `applied` messages (a batch's
/// stats are bumped just after its dedup rows are visible), or after 5 s.
async fn settled(stats: &StatsHandle, applied: u64) -> ConsumerStats {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = stats.get();
        if now.applied >= applied || Instant::now() >= deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// When each latency owner was first reported committed: the observer is
/// called by the consumer after each batch's `COMMIT`, with the batch's
/// owners.
struct CommitTimes {
    table: String,
    at: Mutex<Vec<Option<Instant>>>,
    seen: AtomicU64,
}

impl CommitObserver for CommitTimes {
    fn committed<'a>(&'a self, table: &'a str, owners: &'a [Value]) -> ObserverFuture<'a> {
        if table == self.table {
            let now = Instant::now();
            let mut at = self.at.lock().unwrap_or_else(|e| e.into_inner());
            for owner in owners {
                let Value::BigInt(Some(owner)) = owner else {
                    continue;
                };
                let slot = owner
                    .checked_sub(LATENCY_BASE)
                    .and_then(|i| usize::try_from(i).ok())
                    .and_then(|i| at.get_mut(i));
                if let Some(slot @ None) = slot {
                    *slot = Some(now);
                    self.seen.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Box::pin(std::future::ready(()))
    }

    fn uncommitted(&self, _: &str, _: &[Value]) {}

    fn cleared<'a>(&'a self, _: &'a str) -> ObserverFuture<'a> {
        Box::pin(std::future::ready(()))
    }

    fn uncommitted_clear(&self, _: &str) {}
}

/// What the latency phase measured.
#[derive(Debug)]
struct Latency {
    messages: u64,
    uncommitted: u64,
    achieved_rate: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

/// Step 2: `--rate` messages per second for `--latency-secs`, message `i`
/// to owner [`LATENCY_BASE`] + `i`, its publish time taken just before its
/// send; then waits for every commit (at most [`COMMIT_TIMEOUT`] after the
/// last confirmation).
async fn latency_phase<P: Publish + Clone + 'static>(
    ctx: &Ctx<'_>,
    publisher: &P,
    ledger: &mut Ledger,
) -> Result<Latency, BoxError> {
    let args = ctx.args;
    // Bounded by the CLI ranges: at most 6,000,000.
    let total = args.rate * args.latency_secs;
    let times = Arc::new(CommitTimes {
        table: ctx.table.to_owned(),
        at: Mutex::new(vec![None; total as usize]),
        seen: AtomicU64::new(0),
    });
    let observer: Arc<dyn CommitObserver> = times.clone();
    observe::register(ctx.table, &observer);

    let ticks = (args.latency_secs * 1_000 / TICK.as_millis() as u64).max(1);
    let mut interval = tokio::time::interval(TICK);
    let mut published: Vec<Instant> = Vec::with_capacity(total as usize);
    let mut sends = JoinSet::new();
    let started = Instant::now();
    for tick in 1..=ticks {
        interval.tick().await;
        let due = total * tick / ticks;
        while (published.len() as u64) < due {
            let i = published.len() as i64;
            let owner = LATENCY_BASE + i;
            let views = 1;
            ledger.add(owner, views);
            let message = message(format!("l-{}-{i}", ctx.tag), ctx.table, owner, views);
            let publisher = publisher.clone();
            published.push(Instant::now());
            sends.spawn(async move { publisher.send(&message).await });
        }
        while let Some(sent) = sends.try_join_next() {
            sent??;
        }
    }
    let pacing = started.elapsed().as_secs_f64();
    // Bounded by the publishers' retries (a minute each).
    while let Some(sent) = sends.join_next().await {
        sent??;
    }
    let deadline = Instant::now() + COMMIT_TIMEOUT;
    while times.seen.load(Ordering::Relaxed) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(observer);

    let at = times.at.lock().unwrap_or_else(|e| e.into_inner());
    let mut ms: Vec<f64> = published
        .iter()
        .zip(at.iter())
        .filter_map(|(sent, committed)| {
            committed.map(|c| c.saturating_duration_since(*sent).as_secs_f64() * 1e3)
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    Ok(Latency {
        messages: total,
        uncommitted: total - ms.len() as u64,
        achieved_rate: total as f64 / pacing,
        p50_ms: percentile(&ms, 0.50),
        p99_ms: percentile(&ms, 0.99),
        max_ms: ms.last().copied().unwrap_or(f64::NAN),
    })
}

/// What the totals check found.
#[derive(Debug, Default)]
struct Totals {
    lost: u64,
    doubled: u64,
    wrong_owners: u64,
}

impl Totals {
    fn ok(&self) -> bool {
        self.lost == 0 && self.doubled == 0 && self.wrong_owners == 0
    }
}

/// Step 4: every owner's `views` against the ledger (one per message).
async fn check_totals(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    ledger: &Ledger,
) -> Result<Totals, BoxError> {
    let mut owners: Vec<i64> = ledger.owners.keys().copied().collect();
    owners.sort_unstable();
    let mut totals = Totals::default();
    let mut events = 0i64;
    for chunk in owners.chunks(OWNER_CHUNK) {
        let got = counters.get_many(db, chunk, &["views"]).await?;
        for owner in chunk {
            let want = ledger.owners[owner];
            let read = |key: &str| got.get(owner).and_then(|t| t.get(key)).copied();
            let views = read("views").unwrap_or(0);
            let seen = views;
            events += seen;
            totals.lost += want.events.saturating_sub(seen).max(0) as u64;
            totals.doubled += seen.saturating_sub(want.events).max(0) as u64;
            if views != want.views || seen != want.events {
                if totals.wrong_owners < SHOWN {
                    eprintln!(
                        "mq-bench: owner {owner}: views {views} and events {seen} in the database, {} and {} published",
                        want.views, want.events
                    );
                }
                totals.wrong_owners += 1;
            }
        }
    }
    println!(
        "totals: {} owners, {events} message applications of {} distinct messages, {} lost, {} doubled",
        owners.len(),
        ledger.messages,
        totals.lost,
        totals.doubled
    );
    Ok(totals)
}

fn print_summary(r: &Report) {
    println!(
        "\n| backend | broker | applied/s | statements/batch | p50 ms | p99 ms | naive/s | ratio | lost | doubled | totals |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    println!(
        "| {} | {} | {:.0} | {:.2} | {:.1} | {:.1} | {:.0} | {:.1}x | {} | {} | {} |",
        r.backend,
        r.broker,
        r.batched.applied_per_s,
        r.batched.statements_per_batch,
        r.batched.p50_ms,
        r.batched.p99_ms,
        r.naive.applied_per_s,
        r.ratio_batched_over_naive,
        r.lost,
        r.doubled,
        if r.totals_ok { "ok" } else { "WRONG" },
    );
    println!("wall time {:.1} s", r.wall_secs);
}
