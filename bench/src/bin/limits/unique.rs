//! Unique counts beside their raw limits: the service's observes against
//! a membership table's inserts by the same clients, batches spread over
//! many owners, the sketch table's size on disk, a union over days, and a
//! unique read against its raw `SELECT` plus merge.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use bench::{
    BoxError,
    http::{self, HttpClient},
    members, sizes,
    stats::{median, percentile},
};
use chrono::{DateTime, Days, Utc};
use counter_core::{CounterTable, Counters, Window, unique::Sketch};
use futures_util::StreamExt;
use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend,
    sea_query::{Alias, Expr, ExprTrait, Query},
};
use serde_json::json;

use crate::{Args, Limit, Section};

const TABLE: &str = "limits_unique";
const SKETCHES: &str = "limits_unique_sketches";
const MEMBERS: &str = "limits_members";
/// Members are drawn from this many (integers, as a user id would be).
const MEMBER_SPACE: u64 = 10_000_000;
/// Items of one spread request (the service's default `max_batch_items`).
const BATCH_ITEMS: usize = 1_000;

/// The sketches of what the service acknowledged, by owner: what the
/// stored ones must equal.
type Observed = HashMap<i64, Sketch>;

fn config(url: &str, add_workers: Option<u64>) -> String {
    let workers = add_workers.map_or_else(String::new, |n| format!("add_workers = {n}\n"));
    format!(
        "[server]\nopen = true\n{workers}[database]\nurl = \"{url}\"\nmax_connections = 24\n\n\
         [namespaces.uniq]\ntable = \"{TABLE}\"\nowner = \"integer\"\n\
         keys.viewers = {{ unique = true }}\nkeys.visitors = {{ unique = true, window = \"day\" }}\n"
    )
}

fn counters() -> Result<Counters<i64>, BoxError> {
    let table = CounterTable::new(TABLE)?
        .with_unique_key("viewers")?
        .with_unique_key("visitors")?
        .with_key_window("visitors", Window::Day)?;
    Ok(Counters::new(table))
}

pub(crate) async fn run(
    args: &Args,
    db: &DatabaseConnection,
    url: &str,
) -> Result<Section, BoxError> {
    let counters = counters()?;
    drop_tables(db, &counters).await;
    members::create(db, MEMBERS).await?;
    let service = http::serve(&config(url, args.add_workers), "limits").await?;
    let client = http::client(1_024);
    let observe_url = format!("{service}/v1/uniq/counters:observe");
    let mut section = Section {
        ok: true,
        ..Section::default()
    };
    let mut observed = Observed::new();

    // One member a request, the same clients each way.
    let (mut observes, mut inserts) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        observes.push(single_observes(args, &client, &observe_url, round, &mut observed).await?);
        inserts.push(membership_inserts(args, db, round).await?);
    }
    let (observes, inserts) = (median(observes), median(inserts));
    println!("one-member observes {observes:.0}/s, membership inserts {inserts:.0}/s");
    section.figures.insert(
        "service_observe_vs_membership_insert".into(),
        json!(observes / inserts),
    );
    section
        .figures
        .insert("service_observes_per_s".into(), json!(observes));
    section
        .figures
        .insert("membership_inserts_per_s".into(), json!(inserts));

    // Batches of 1,000 items spread over the owners.
    let (mut rates, mut latencies) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        let (rate, mut times) =
            spread_observes(args, &client, &observe_url, round, &mut observed).await?;
        rates.push(rate);
        latencies.append(&mut times);
    }
    latencies.sort_by(f64::total_cmp);
    let (rate, p99) = (median(rates), percentile(&latencies, 0.99));
    println!("spread observes {rate:.0} items/s, p99 {p99:.0} ms a request");
    section
        .figures
        .insert("spread_observe_items_per_s".into(), json!(rate));
    section
        .figures
        .insert("spread_observe_p99_ms".into(), json!(p99));

    section.ok &= stored_equal_observed(db, &counters, &observed).await?;

    // A range of days, never cached: the union of each owner's buckets.
    let union_ms = union(args, &client, &service).await?;
    match union_ms {
        Some(ms) => {
            println!(
                "{}-day union of {} owners {ms:.1} ms",
                args.days, args.owners
            );
            section.figures.insert("union_30d_ms".into(), json!(ms));
        }
        None => section.ok = false,
    }

    let (read, ok) = unique_read(args, db, &counters).await?;
    section.ok &= ok;
    section.limits.push(("unique_read", read));

    let (disk, live) = sketch_bytes(db).await?;
    section
        .figures
        .insert("sketch_disk_bytes".into(), json!(disk));
    section
        .figures
        .insert("sketch_live_bytes".into(), json!(live));
    section.figures.insert(
        "sketch_disk_vs_live".into(),
        json!(disk.map(|disk| disk as f64 / Ord::max(live, 1) as f64)),
    );
    // A full compaction of what the loads left (every counter's slot
    // rows merged into one), then the read again: it must not change.
    let before = counters
        .unique_many(db, &all_owners(args), &["viewers"])
        .await?;
    let started = Instant::now();
    let report = counters.compact(db, &Default::default()).await?;
    let secs = started.elapsed().as_secs_f64();
    let folded = report.sketches.rows_before - report.sketches.rows_after;
    println!(
        "compaction: {} sketch rows to {} in {secs:.1} s ({:.0} rows folded a second)",
        report.sketches.rows_before,
        report.sketches.rows_after,
        folded as f64 / secs
    );
    section.figures.insert(
        "compaction_sketch_rows".into(),
        json!(report.sketches.rows_before),
    );
    section
        .figures
        .insert("compaction_secs".into(), json!(secs));
    section.figures.insert(
        "compaction_rows_folded_per_s".into(),
        json!(folded as f64 / secs),
    );
    let after = counters
        .unique_many(db, &all_owners(args), &["viewers"])
        .await?;
    if before != after {
        eprintln!("FAIL: a compaction changed an estimate");
        section.ok = false;
    }

    drop_tables(db, &counters).await;
    Ok(section)
}

async fn drop_tables(db: &DatabaseConnection, counters: &Counters<i64>) {
    let _ = counters.drop_table(db).await;
    members::drop(db, MEMBERS).await;
}

/// `--clients` tasks for `--secs`, each running `op` on a random owner
/// and member until the deadline: operations a second, and what each
/// task's successful operations observed.
async fn load<F, Fut>(args: &Args, seed: u64, op: F) -> Result<(f64, Observed), BoxError>
where
    F: Fn(i64, u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), BoxError>> + Send,
{
    let deadline = Instant::now() + Duration::from_secs_f64(args.secs);
    let started = Instant::now();
    let owners = args.owners as i64;
    let tasks: Vec<_> = (0..args.clients)
        .map(|task| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed * 10_000 + task);
                let (mut done, mut observed) = (0_u64, Observed::new());
                while Instant::now() < deadline {
                    let (owner, member) = (
                        rng.random_range(1..=owners),
                        rng.random_range(0..MEMBER_SPACE),
                    );
                    op(owner, member).await?;
                    observed
                        .entry(owner)
                        .or_default()
                        .insert(member.to_string().as_str());
                    done += 1;
                }
                Ok::<_, BoxError>((done, observed))
            })
        })
        .collect();
    let mut done = 0;
    let mut observed = Observed::new();
    for task in tasks {
        let (n, theirs) = task.await??;
        done += n;
        merge_into(&mut observed, theirs);
    }
    Ok((done as f64 / started.elapsed().as_secs_f64(), observed))
}

fn merge_into(observed: &mut Observed, theirs: Observed) {
    for (owner, sketch) in theirs {
        observed.entry(owner).or_default().merge(&sketch);
    }
}

/// One round of one-member observes through the service.
async fn single_observes(
    args: &Args,
    client: &HttpClient,
    url: &str,
    round: u64,
    observed: &mut Observed,
) -> Result<f64, BoxError> {
    let (client, url) = (client.clone(), url.to_owned());
    let (rate, theirs) = load(args, round, move |owner, member| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let body =
                json!({"observations": [{"owner": owner, "key": "viewers", "member": member}]});
            http::post_ok(&client, &url, body.to_string()).await?;
            Ok(())
        }
    })
    .await?;
    merge_into(observed, theirs);
    Ok(rate)
}

/// One round of the same load as `INSERT .. ON CONFLICT DO NOTHING` into
/// the membership table (MySQL: `ON DUPLICATE KEY UPDATE`), autocommit.
async fn membership_inserts(
    args: &Args,
    db: &DatabaseConnection,
    round: u64,
) -> Result<f64, BoxError> {
    let db = db.clone();
    let (rate, _) = load(args, round, move |owner, member| {
        let db = db.clone();
        async move { members::insert(&db, MEMBERS, owner, member as i64).await }
    })
    .await?;
    Ok(rate)
}

/// One round of `--batch-clients` tasks sending 1,000-item observes over
/// the owners: items a second, and each request's milliseconds.
async fn spread_observes(
    args: &Args,
    client: &HttpClient,
    url: &str,
    round: u64,
    observed: &mut Observed,
) -> Result<(f64, Vec<f64>), BoxError> {
    let deadline = Instant::now() + Duration::from_secs_f64(args.secs);
    let started = Instant::now();
    let owners = args.owners as i64;
    let tasks: Vec<_> = (0..args.batch_clients)
        .map(|task| {
            let (client, url) = (client.clone(), url.to_owned());
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(1_000_000 + round * 10_000 + task);
                let (mut items, mut times, mut observed) = (0, Vec::new(), Observed::new());
                while Instant::now() < deadline {
                    let batch: Vec<(i64, u64)> = (0..BATCH_ITEMS)
                        .map(|_| (rng.random_range(1..=owners), rng.random_range(0..MEMBER_SPACE)))
                        .collect();
                    let observations: Vec<_> = batch
                        .iter()
                        .map(|(owner, member)| json!({"owner": owner, "key": "viewers", "member": member}))
                        .collect();
                    let body = json!({ "observations": observations }).to_string();
                    let sent = Instant::now();
                    http::post_ok(&client, &url, body).await?;
                    times.push(sent.elapsed().as_secs_f64() * 1_000.0);
                    for (owner, member) in batch {
                        observed.entry(owner).or_default().insert(member.to_string().as_str());
                    }
                    items += BATCH_ITEMS;
                }
                Ok::<_, BoxError>((items, times, observed))
            })
        })
        .collect();
    let (mut items, mut times) = (0, Vec::new());
    for task in tasks {
        let (n, mut theirs, sketches) = task.await??;
        items += n;
        times.append(&mut theirs);
        merge_into(observed, sketches);
    }
    Ok((items as f64 / started.elapsed().as_secs_f64(), times))
}

/// Whether every owner's stored sketch is exactly the sketch of what the
/// service acknowledged: nothing lost, nothing else written.
async fn stored_equal_observed(
    db: &DatabaseConnection,
    counters: &Counters<i64>,
    observed: &Observed,
) -> Result<bool, BoxError> {
    let mut wrong = 0;
    for (owner, expected) in observed {
        let stored = counters.sketch(db, *owner, "viewers").await?;
        if stored.to_bytes() != expected.to_bytes() {
            wrong += 1;
        }
    }
    if wrong > 0 {
        eprintln!(
            "FAIL: {wrong} of {} owners' stored sketches differ from what was acknowledged",
            observed.len()
        );
    }
    Ok(wrong == 0)
}

/// `--members-per-day` new members for every owner on each of `--days`
/// days (observed with `at`), then the union of the range for all owners
/// over HTTP: the median milliseconds of `--reads` reads, `None` (and a
/// message) if an estimate is off by more than 5 standard errors.
async fn union(args: &Args, client: &HttpClient, service: &str) -> Result<Option<f64>, BoxError> {
    let today = Utc::now()
        .date_naive()
        .and_hms_opt(0, 0, 0)
        .unwrap_or_default()
        .and_utc();
    let from = today - Days::new(u64::from(args.days));
    let observe_url = format!("{service}/v1/uniq/counters:observe");
    let mut pending = Vec::new();
    for day in 0..args.days {
        let at: DateTime<Utc> = from + Days::new(u64::from(day)) + chrono::Duration::hours(12);
        for owner in 1..=args.owners {
            for i in 0..args.members_per_day {
                let member = format!("d{day}-o{owner}-{i}");
                pending
                    .push(json!({"owner": owner, "key": "visitors", "member": member, "at": at}));
            }
        }
    }
    let bodies: Vec<String> = pending
        .chunks(BATCH_ITEMS)
        .map(|chunk| json!({ "observations": chunk }).to_string())
        .collect();
    let ingest = futures_util::stream::iter(bodies.into_iter().map(|body| {
        let (client, url) = (client.clone(), observe_url.clone());
        async move { http::post_ok(&client, &url, body).await }
    }));
    let results: Vec<_> = ingest
        .buffer_unordered(args.batch_clients as usize)
        .collect()
        .await;
    for result in results {
        result?;
    }
    let read_url = format!("{service}/v1/uniq/uniques:batchGet");
    let owners: Vec<u64> = (1..=args.owners).collect();
    let body =
        json!({"owners": owners, "keys": ["visitors"], "from": from, "to": today}).to_string();
    let expected = f64::from(args.days * args.members_per_day);
    let mut times = Vec::new();
    for _ in 0..args.reads {
        let started = Instant::now();
        let answer = http::post_ok(client, &read_url, body.clone()).await?;
        times.push(started.elapsed().as_secs_f64() * 1_000.0);
        for owner in &owners {
            let estimate = answer["uniques"][owner.to_string()]["visitors"]
                .as_f64()
                .unwrap_or(-1.0);
            let error = (estimate - expected).abs() / expected;
            if error > 5.0 * counter_core::unique::sketch::STANDARD_ERROR.max(1.0 / expected) {
                eprintln!(
                    "FAIL: owner {owner}'s {}-day union is {estimate}, {expected} were observed",
                    args.days
                );
                return Ok(None);
            }
        }
    }
    Ok(Some(median(times)))
}

fn all_owners(args: &Args) -> Vec<i64> {
    (1..=args.owners as i64).collect()
}

/// A unique read of every owner through the library, against the same
/// rows read with a plain `SELECT` and merged by hand, interleaved: the
/// microseconds of each read of all owners, and whether both agree.
async fn unique_read(
    args: &Args,
    db: &DatabaseConnection,
    counters: &Counters<i64>,
) -> Result<(Limit, bool), BoxError> {
    let owners = all_owners(args);
    let select = Query::select()
        .columns([Alias::new("owner_id"), Alias::new("sketch")])
        .from(Alias::new(SKETCHES))
        .and_where(Expr::col(Alias::new("owner_id")).is_in(owners.clone()))
        .and_where(Expr::col(Alias::new("count_key")).eq("viewers"))
        .and_where(Expr::col(Alias::new("bucket")).eq(i64::MIN))
        .to_owned();
    let raw = db.get_database_backend().build(&select);
    let raw_read = || async {
        let mut merged: HashMap<i64, Sketch> = HashMap::new();
        for row in db.query_all_raw(raw.clone()).await? {
            let owner: i64 = row.try_get("", "owner_id")?;
            let bytes: Vec<u8> = row.try_get("", "sketch")?;
            merged
                .entry(owner)
                .or_default()
                .merge(&Sketch::from_bytes(&bytes)?);
        }
        Ok::<_, BoxError>(
            merged
                .into_iter()
                .map(|(o, s)| (o, s.estimate()))
                .collect::<HashMap<_, _>>(),
        )
    };
    let (mut own, mut by_hand) = (Vec::new(), Vec::new());
    let mut agree = true;
    for _ in 0..args.rounds {
        let started = Instant::now();
        let mut ours = HashMap::new();
        for _ in 0..args.reads {
            ours = counters.unique_many(db, &owners, &["viewers"]).await?;
        }
        own.push(started.elapsed().as_secs_f64() * 1e6 / args.reads as f64);
        let started = Instant::now();
        let mut theirs = HashMap::new();
        for _ in 0..args.reads {
            theirs = raw_read().await?;
        }
        by_hand.push(started.elapsed().as_secs_f64() * 1e6 / args.reads as f64);
        for owner in &owners {
            let a = ours
                .get(owner)
                .and_then(|keys| keys.get("viewers"))
                .copied()
                .unwrap_or(0);
            agree &= a == theirs.get(owner).copied().unwrap_or(0);
        }
    }
    if !agree {
        eprintln!("FAIL: the library's unique read and the raw one disagree");
    }
    Ok((
        Limit {
            own_us: median(own),
            raw_us: median(by_hand),
        },
        agree,
    ))
}

/// The sketch table's bytes on disk ([`sizes::table_bytes`]) and the
/// bytes of its live sketches.
async fn sketch_bytes(db: &DatabaseConnection) -> Result<(Option<u64>, u64), BoxError> {
    let (length, integer) = match db.get_database_backend() {
        DbBackend::Postgres => ("octet_length", "BIGINT"),
        DbBackend::MySql => ("LENGTH", "SIGNED"),
        _ => ("LENGTH", "INTEGER"),
    };
    // The table's name is this bench's constant: no input reaches the SQL.
    let live = sizes::number(
        db,
        format!(
            "SELECT CAST(COALESCE(SUM({length}(sketch)), 0) AS {integer}) AS n FROM {SKETCHES}"
        ),
    )
    .await?;
    Ok((sizes::table_bytes(db, SKETCHES).await?, live))
}
