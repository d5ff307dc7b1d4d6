//! The service's adds beside the same adds without HTTP: `--clients`
//! clients add to one hot counter through `counters:add`, with an
//! `Idempotency-Key` each (`service_keyed_add`) and without
//! (`service_plain_add`), against as many tasks calling the same write
//! path in process ([`counter_service::Local`]: the same checks, add
//! queue, groups, ledger inserts, upserts and stored replies; no HTTP).
//!
//! Both load one service in interleaved rounds. Each phase's mean group
//! size is read from the service's own histogram, so the ratio is reported
//! beside the group sizes it was measured at. Every acknowledged add must
//! be in the counter's total, and the run fails otherwise.

use std::future::Future;

use bench::{
    BoxError,
    http::{self, HttpClient},
    load::closed_loop,
    stats::median,
};
use counter_core::{CounterTable, Counters};
use counter_service::{Local, api::BatchItem};
use hyper::Method;
use sea_orm::DatabaseConnection;
use serde_json::json;

use crate::{Args, Limit, Section};

const TABLE: &str = "limits_adds";
const GROUPS: &str = "counter_service_add_group_requests";

fn config(url: &str, add_workers: Option<u64>) -> String {
    let workers = add_workers.map_or_else(String::new, |n| format!("add_workers = {n}\n"));
    format!(
        "[server]\nopen = true\n{workers}[database]\nurl = \"{url}\"\nmax_connections = 24\n\n\
         [namespaces.hot]\ntable = \"{TABLE}\"\nowner = \"integer\"\nslots = 32\nkeys.likes = {{}}\n"
    )
}

/// One phase's figures: adds a second, acknowledged adds, mean group.
struct Phase {
    rate: f64,
    acked: u64,
    group: f64,
}

pub(crate) async fn run(
    args: &Args,
    db: &DatabaseConnection,
    url: &str,
) -> Result<Section, BoxError> {
    let counters = Counters::<i64>::new(CounterTable::new(TABLE)?.with_slots(32)?);
    let _ = counters.drop_table(db).await;
    let (service, local) = http::serve_local(&config(url, args.add_workers), "limits").await?;
    let client = http::client(1_024);
    // Keys no earlier run recorded (a recorded key would be a replay).
    let run_id = format!(
        "{}-{}",
        std::process::id(),
        chrono::Utc::now().timestamp_millis()
    );
    let mut section = Section {
        ok: true,
        ..Section::default()
    };
    let mut acked = 0;
    for (name, keyed) in [("service_keyed_add", true), ("service_plain_add", false)] {
        let (mut own, mut raw) = (Vec::new(), Vec::new());
        let (mut own_groups, mut raw_groups) = (Vec::new(), Vec::new());
        for round in 0..args.rounds {
            let prefix = keyed.then(|| format!("{run_id}-{round}"));
            let over_http = http_phase(args, &client, &service, prefix.as_deref()).await?;
            let prefix = keyed.then(|| format!("{run_id}-{round}-local"));
            let in_process =
                local_phase(args, &client, &service, &local, prefix.as_deref()).await?;
            acked += over_http.acked + in_process.acked;
            own.push(over_http.rate);
            raw.push(in_process.rate);
            own_groups.push(over_http.group);
            raw_groups.push(in_process.group);
        }
        let (own, raw) = (median(own), median(raw));
        let (own_group, raw_group) = (median(own_groups), median(raw_groups));
        println!(
            "{name}: {own:.0}/s over HTTP (groups of {own_group:.1}), {raw:.0}/s in process (groups of {raw_group:.1})"
        );
        section.limits.push((
            name,
            Limit {
                own_us: 1e6 / own,
                raw_us: 1e6 / raw,
            },
        ));
        section.figures.insert(
            name.to_owned(),
            json!({
                "http_adds_per_s": own,
                "in_process_adds_per_s": raw,
                "http_mean_group": own_group,
                "in_process_mean_group": raw_group,
            }),
        );
    }
    let total = counters.get(db, 1, "likes").await?;
    if total != acked as i64 {
        eprintln!("adds: the hot counter holds {total}, {acked} adds were acknowledged");
        section.ok = false;
    }
    let _ = counters.drop_table(db).await;
    Ok(section)
}

/// Runs `load` and reads the mean group of the adds it made.
async fn with_groups<Fut>(client: &HttpClient, service: &str, load: Fut) -> Result<Phase, BoxError>
where
    Fut: Future<Output = Result<(f64, u64), BoxError>>,
{
    let (sum, count) = http::histogram(client, service, GROUPS).await?;
    let (rate, acked) = load.await?;
    let (sum_after, count_after) = http::histogram(client, service, GROUPS).await?;
    let groups = count_after - count;
    let group = if groups > 0.0 {
        (sum_after - sum) / groups
    } else {
        0.0
    };
    Ok(Phase { rate, acked, group })
}

/// One round of `counters:add` over HTTP, each with a key of its own
/// under `prefix` (without one when `None`).
async fn http_phase(
    args: &Args,
    client: &HttpClient,
    service: &str,
    prefix: Option<&str>,
) -> Result<Phase, BoxError> {
    let url = format!("{service}/v1/hot/counters:add");
    let (client_, prefix) = (client.clone(), prefix.map(str::to_owned));
    let load = closed_loop(args.clients, args.secs, move |task, n| {
        let (client, url) = (client_.clone(), url.clone());
        let key = prefix.as_ref().map(|p| format!("{p}-{task}-{n}"));
        async move {
            let body = json!({"owner": 1, "key": "likes"}).to_string();
            let (status, text) =
                http::call(&client, Method::POST, &url, key.as_deref(), Some(body)).await?;
            if status != 200 {
                return Err(format!("{url}: {status} {}", String::from_utf8_lossy(&text)).into());
            }
            Ok(())
        }
    });
    with_groups(client, service, load).await
}

/// The same adds through the service's write path in process.
async fn local_phase(
    args: &Args,
    client: &HttpClient,
    service: &str,
    local: &Local,
    prefix: Option<&str>,
) -> Result<Phase, BoxError> {
    let (local, prefix) = (local.clone(), prefix.map(str::to_owned));
    let load = closed_loop(args.clients, args.secs, move |task, n| {
        let local = local.clone();
        let key = prefix.as_ref().map(|p| format!("{p}-{task}-{n}"));
        async move {
            let item = BatchItem {
                id: None,
                owner: json!(1),
                key: "likes".into(),
                delta: 1,
                at: None,
            };
            let reply = local.batch_add("hot", vec![item], key.as_deref()).await?;
            if reply.applied != 1 {
                return Err(format!("an in-process add applied {}", reply.applied).into());
            }
            Ok(())
        }
    });
    with_groups(client, service, load).await
}
