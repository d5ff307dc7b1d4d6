//! `counts:watch` streams kept open through a topology's events, as a
//! client keeps them: each on the load's owners ([`crate::load`], adds of
//! 1 only, so a total never falls), opened again 250 ms after it ends. What
//! each saw is kept: a total lower than one the same watcher was shown
//! before (a step back), the streams that ended and why, the longest time
//! without an event, and the last total of each owner, which a test
//! compares with the database once the load has stopped.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::task::JoinHandle;

use crate::watch::Watcher;

/// How long a watcher waits before it opens its stream again.
const REOPEN_PAUSE: Duration = Duration::from_millis(250);

/// What one watcher saw so far.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// Where it watched (`127.0.0.1:port`).
    pub addr: String,
    pub events: u64,
    /// Totals lower than one this watcher was shown before.
    pub stepped_back: u64,
    /// Streams ended (a `closed` event, or the connection), and why.
    pub ended: Vec<String>,
    /// Opens refused (a status) or unanswered.
    pub refused: u64,
    /// The longest time between two events of one stream (the pauses
    /// between a stream's end and the next one's first event not counted).
    pub longest_gap: Duration,
    /// The last total shown of each owner.
    pub last: BTreeMap<String, i64>,
}

impl Seen {
    /// The sum of the last totals shown.
    pub fn sum(&self) -> i64 {
        self.last.values().sum()
    }
}

impl std::fmt::Display for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "watcher on {}: {} events, {} steps back, longest gap {:?}, ended {:?}, {} opens refused, last totals sum {}",
            self.addr,
            self.events,
            self.stepped_back,
            self.longest_gap,
            self.ended,
            self.refused,
            self.sum()
        )
    }
}

/// The watchers' figures for a test's `figures` line: what `seen` saw, and
/// how long after the load's end they showed its totals (`converged`).
pub fn figures(seen: &[Seen], converged: Option<Duration>) -> Vec<(&'static str, u64)> {
    let sum = |of: fn(&Seen) -> u64| seen.iter().map(of).sum::<u64>();
    vec![
        ("watch_streams", seen.len() as u64),
        ("watch_events", sum(|w| w.events)),
        ("watch_stepped_back", sum(|w| w.stepped_back)),
        ("watch_ended", sum(|w| w.ended.len() as u64)),
        ("watch_opens_refused", sum(|w| w.refused)),
        (
            "watch_longest_gap_ms",
            seen.iter()
                .map(|w| w.longest_gap.as_millis() as u64)
                .max()
                .unwrap_or(0),
        ),
        (
            "watch_converged_ms",
            converged.map_or(u64::MAX, |d| d.as_millis() as u64),
        ),
    ]
}

/// Watchers under way.
pub struct Watchers {
    stop: Arc<AtomicBool>,
    seen: Vec<Arc<Mutex<Seen>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Watchers {
    /// One watcher on each of `bases` (`http://host:port`), on `posts`'
    /// `likes` of owners `0..owners`.
    pub fn start(bases: &[String], owners: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let owners: Vec<String> = (0..owners).map(|o| o.to_string()).collect();
        let path = format!(
            "/v1/posts/counts:watch?owners={}&keys=likes",
            owners.join(",")
        );
        let mut seen = Vec::new();
        let mut tasks = Vec::new();
        for base in bases {
            let addr = base.trim_start_matches("http://").to_owned();
            let state = Arc::new(Mutex::new(Seen {
                addr: addr.clone(),
                ..Seen::default()
            }));
            seen.push(state.clone());
            tasks.push(tokio::spawn(watch(addr, path.clone(), state, stop.clone())));
        }
        Self { stop, seen, tasks }
    }

    /// What each watcher saw so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen
            .iter()
            .map(|s| s.lock().unwrap().clone())
            .collect()
    }

    /// Waits until every watcher's last totals sum to `total`, at most
    /// `within`; how long that took (`None`: not within it).
    pub async fn converge(&self, total: i64, within: Duration) -> Option<Duration> {
        let began = Instant::now();
        while began.elapsed() < within {
            if self.seen().iter().all(|s| s.sum() == total) {
                return Some(began.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// Stops every watcher; what each saw.
    pub async fn stop(self) -> Vec<Seen> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.expect("a watcher");
        }
        self.seen
            .iter()
            .map(|s| s.lock().unwrap().clone())
            .collect()
    }
}

/// One watcher: its stream on `addr`, opened again whenever it ends, until
/// `stop`.
async fn watch(addr: String, path: String, seen: Arc<Mutex<Seen>>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let opened = tokio::time::timeout(
            Duration::from_secs(5),
            Watcher::open(&addr, &path, None, &[], None),
        )
        .await;
        let Ok(Ok(mut stream)) = opened else {
            seen.lock().unwrap().refused += 1;
            tokio::time::sleep(REOPEN_PAUSE).await;
            continue;
        };
        let mut previous = Instant::now();
        let ended = loop {
            if stop.load(Ordering::Relaxed) {
                break None;
            }
            let Ok(next) = tokio::time::timeout(Duration::from_millis(200), stream.next()).await
            else {
                continue;
            };
            let Some(event) = next else {
                break Some("connection".to_owned());
            };
            let mut seen = seen.lock().unwrap();
            seen.longest_gap = seen.longest_gap.max(event.at - previous);
            previous = event.at;
            seen.events += 1;
            if event.event == "closed" {
                break Some(format!(
                    "closed: {}",
                    event.data["reason"].as_str().unwrap_or("no reason")
                ));
            }
            for (owner, keys) in event.data["counts"].as_object().into_iter().flatten() {
                let Some(total) = keys["likes"].as_i64() else {
                    continue;
                };
                let last = seen.last.insert(owner.clone(), total);
                if last.is_some_and(|last| total < last) {
                    seen.stepped_back += 1;
                }
            }
        };
        if let Some(why) = ended {
            seen.lock().unwrap().ended.push(why);
            tokio::time::sleep(REOPEN_PAUSE).await;
        }
    }
}
