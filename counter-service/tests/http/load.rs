//! Keyed adds at a steady rate through a front (HAProxy), as a careful
//! client sends them: each add under a key of its own, resent with that key
//! after a 503 or no answer until it is answered 200, and after every tenth
//! the client's own total read back. What each client saw is kept, so a test
//! can check the totals exactly (each owner's total must equal its client's
//! count of keys answered 200) and measure windows.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use hyper::Method;
use serde_json::json;
use tokio::task::JoinHandle;

use crate::support::Api;

/// The longest one add may take to be answered 200, retries included.
const ADD_DEADLINE: Duration = Duration::from_secs(90);
/// The pause before a key is resent.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// One answer to an add: when, and its status (`None`: no answer).
#[derive(Clone, Copy)]
pub struct Answer {
    /// The owner the add was for.
    pub owner: u64,
    pub at: Instant,
    pub status: Option<u16>,
    /// A 503 that is the service's problem+json with `Retry-After`, not a
    /// balancer's page.
    pub retry_after: bool,
}

/// The load under way: one client per owner `0..clients` of `posts`'
/// `likes`.
pub struct Load {
    front: Api,
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<Answer>>>,
    clients: Vec<JoinHandle<ClientRun>>,
}

/// What one client saw.
pub struct ClientRun {
    /// Keys answered 200.
    pub acked: u64,
    /// Reads of its own total below what it had been answered 200 for.
    pub stale: u64,
}

/// What the load saw, once stopped.
pub struct Outcome {
    pub answers: Vec<Answer>,
    pub acked: u64,
    /// The owners' totals read through the front once the load stopped.
    pub stored: u64,
    pub lost: u64,
    pub doubled: u64,
    pub stale: u64,
}

impl Outcome {
    /// Answers other than 200 and 503.
    pub fn failed(&self) -> Vec<u16> {
        self.answers
            .iter()
            .filter_map(|a| a.status)
            .filter(|s| *s != 200 && *s != 503)
            .collect()
    }

    /// Requests that got no answer (a connection cut).
    pub fn unanswered(&self) -> u64 {
        self.answers.iter().filter(|a| a.status.is_none()).count() as u64
    }

    /// 503s that are not the service's problem+json with `Retry-After`.
    pub fn bare_503(&self) -> u64 {
        self.answers
            .iter()
            .filter(|a| a.status == Some(503) && !a.retry_after)
            .count() as u64
    }

    /// Answers other than 200: each a resend.
    pub fn retries(&self) -> u64 {
        self.answers
            .iter()
            .filter(|a| a.status != Some(200))
            .count() as u64
    }

    /// The longest time between `from` and `until` that no add was answered
    /// 200, in milliseconds.
    pub fn window_ms(&self, from: Instant, until: Instant) -> u64 {
        let mut done: Vec<Instant> = self
            .answers
            .iter()
            .filter(|a| a.status == Some(200) && a.at >= from && a.at <= until)
            .map(|a| a.at)
            .collect();
        done.sort_unstable();
        let mut previous = from;
        let mut longest = Duration::ZERO;
        for at in done {
            longest = longest.max(at - previous);
            previous = at;
        }
        longest.as_millis() as u64
    }
}

impl Load {
    /// Starts `clients` clients on `front`.
    pub fn start(front: Api, clients: u64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(Mutex::new(Vec::new()));
        let clients = (0..clients)
            .map(|owner| tokio::spawn(client(front.clone(), owner, stop.clone(), answers.clone())))
            .collect();
        Load {
            front,
            stop,
            answers,
            clients,
        }
    }

    /// Stops the clients once each has its last key answered, and checks
    /// every owner's total, read through the front, against its client.
    pub async fn stop(self) -> Outcome {
        self.stop.store(true, Ordering::Relaxed);
        let mut runs = Vec::new();
        for client in self.clients {
            runs.push(client.await.expect("a client"));
        }
        let owners: Vec<usize> = (0..runs.len()).collect();
        let counts = self
            .front
            .totals("posts", None, json!(owners), json!(["likes"]))
            .await;
        let (mut lost, mut doubled, mut stored) = (0, 0, 0);
        for (owner, run) in runs.iter().enumerate() {
            let total = counts[owner.to_string()]["likes"].as_u64().unwrap_or(0);
            stored += total;
            lost += run.acked.saturating_sub(total);
            doubled += total.saturating_sub(run.acked);
        }
        Outcome {
            answers: self.answers.lock().unwrap().clone(),
            acked: runs.iter().map(|r| r.acked).sum(),
            stored,
            lost,
            doubled,
            stale: runs.iter().map(|r| r.stale).sum(),
        }
    }
}

/// Adds of 1 to `owner` until `stop`, each key resent until answered 200.
async fn client(
    api: Api,
    owner: u64,
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<Answer>>>,
) -> ClientRun {
    let body = json!({"owner": owner, "key": "likes", "delta": 1}).to_string();
    let mut run = ClientRun { acked: 0, stale: 0 };
    while !stop.load(Ordering::Relaxed) {
        let key = format!("load-{owner}-{}", run.acked);
        let first = Instant::now();
        loop {
            let reply = api
                .try_call(
                    Method::POST,
                    "/v1/posts/counters:add",
                    None,
                    &[("idempotency-key", &key)],
                    Some(body.clone()),
                )
                .await;
            let status = reply.as_ref().ok().map(|r| r.status);
            let retry_after = reply.as_ref().is_ok_and(|r| {
                r.header("content-type") == Some("application/problem+json")
                    && r.header("retry-after").is_some()
            });
            answers.lock().unwrap().push(Answer {
                owner,
                at: Instant::now(),
                status,
                retry_after,
            });
            if status == Some(200) {
                run.acked += 1;
                break;
            }
            assert!(
                first.elapsed() < ADD_DEADLINE,
                "key {key} not answered 200 within {ADD_DEADLINE:?}: {reply:?}"
            );
            tokio::time::sleep(RETRY_PAUSE).await;
        }
        if run.acked.is_multiple_of(10) {
            run.stale += u64::from(read_own(&api, owner).await.is_some_and(|t| t < run.acked));
        }
    }
    run
}

/// `owner`'s total as the front answers it now (`None`: not answered 200).
async fn read_own(api: &Api, owner: u64) -> Option<u64> {
    let body = json!({"owners": [owner], "keys": ["likes"]}).to_string();
    let reply = api
        .try_call(
            Method::POST,
            "/v1/posts/counts:batchGet",
            None,
            &[],
            Some(body),
        )
        .await
        .ok()?;
    (reply.status == 200)
        .then(|| reply.json["counts"][owner.to_string()]["likes"].as_u64())
        .flatten()
}

/// The `p`th percentile of sorted `values` (0 when empty).
pub fn percentile(values: &[u64], p: usize) -> u64 {
    if values.is_empty() {
        return 0;
    }
    values[((values.len() - 1) * p).div_ceil(100)]
}
