//! Admission to a namespace's add or observe queue, bounded twice: in items
//! (what admitted requests hold in memory, `server.max_queued_items`) and
//! in time (how long an admitted request waits for its answer,
//! `server.max_queue_wait_ms`).
//!
//! A queue bounded only by items is a queue bounded by seconds: 20,000
//! items draining at 5,000 a second are four seconds of waiting, and a
//! caller that waited that long has often given up, so the work done for it
//! is wasted and goodput falls as the load rises. So a request is admitted
//! only while its expected wait stays within the bound: the time since the
//! service received it (being read, parsed, waiting for a core: under
//! overload on a small machine that is as long as the queue's own wait)
//! plus the items ahead of it and its own over the rate the workers drain
//! them. Otherwise it is refused at once with nothing applied, and its
//! `Retry-After` is the time the queue needs to drain to where the request
//! would fit.
//!
//! The drain rate is measured, not configured. It is the items the workers
//! answered over the time they spent on them, with idle time left out, as
//! a moving average of about the last ten groups. While the workers make no
//! progress (a stalled database), the time since their last answer counts
//! as one drain, so the estimate falls and the queue stops admitting. An
//! idle queue admits any request, since nothing waits ahead of it, and so
//! does a queue whose rate is not known yet.
//!
//! Group commit makes the rate depend on the depth: a queue that holds
//! little drains in small groups, each paying a whole transaction, and a
//! rate measured on small groups would admit less and less. So a queue
//! always admits up to a full group for each of its workers (the `floor`),
//! whatever the rate: that much is drained by the next groups anyway.
//!
//! Under overload most requests are refused, so a refusal must cost little:
//! a refused request whose body was read and parsed took as much of the
//! cores as one the workers then serve. So before the body is read
//! ([`Admission::has_room`]) the request is checked with the time it has
//! already waited and the items its `Content-Length` suggests: the queue
//! learns the bytes per item of the bodies it parses, and a body is taken
//! to hold half the items its length gives at that rate. So a body is
//! refused for its length only if it would be refused were it twice as
//! verbose per item as the average (whitespace, longer keys): never one the
//! check after parsing would admit, whatever its shape within that. An
//! idle queue reads any body.

use std::{
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use crate::problem::Problem;

/// The newest group's weight in the drain averages (about the last ten).
const WEIGHT: f64 = 0.1;
/// The longest `Retry-After` a refusal announces, in seconds.
const MAX_RETRY_AFTER_S: u64 = 60;

/// The newest body's weight in the bytes-per-item average.
const BYTES_WEIGHT: f64 = 0.05;

/// What admission knows of a request before its body is parsed: when the
/// service received it, and how long its body says it is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arrival {
    pub received: Instant,
    /// The body's `Content-Length`, when it declared one.
    pub body_bytes: Option<u64>,
}

impl Arrival {
    /// A request arriving now with no declared body (the in-process path).
    pub fn now() -> Self {
        Self {
            received: Instant::now(),
            body_bytes: None,
        }
    }
}

/// Which queue: what a refusal and the metrics name.
#[derive(Debug, Clone, Copy)]
pub(crate) enum QueueKind {
    Adds,
    Observes,
}

impl QueueKind {
    /// The `bound` a refusal at the item bound names.
    fn items_bound(self) -> &'static str {
        match self {
            QueueKind::Adds => "queued add items",
            QueueKind::Observes => "queued observations",
        }
    }

    /// The `bound` a refusal at the time bound names.
    fn wait_bound(self) -> &'static str {
        match self {
            QueueKind::Adds => "add queue wait",
            QueueKind::Observes => "observe queue wait",
        }
    }

    fn label(self) -> &'static str {
        match self {
            QueueKind::Adds => "add",
            QueueKind::Observes => "observe",
        }
    }
}

/// A queue's admission: its bounds, what it holds and how fast it drains.
pub(crate) struct Admission {
    kind: QueueKind,
    max_items: usize,
    floor: usize,
    max_wait: Duration,
    state: Arc<Mutex<State>>,
    shed_items: metrics::Counter,
    shed_wait: metrics::Counter,
    expected_wait: metrics::Gauge,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state();
        f.debug_struct("Admission")
            .field("kind", &self.kind)
            .field("queued", &state.queued)
            .field("drain_items_per_s", &state.rate(Instant::now()))
            .finish()
    }
}

#[derive(Default)]
struct State {
    /// Items admitted and not yet answered.
    queued: usize,
    /// Since when `queued` has been above 0.
    busy_since: Option<Instant>,
    /// When the workers last answered a group.
    last_drain: Option<Instant>,
    /// Moving averages of a group's items and of the busy time it took.
    items_avg: f64,
    secs_avg: f64,
    /// The bytes per item of the bodies parsed so far (moving average; 0
    /// until one is).
    bytes_per_item: f64,
}

impl State {
    /// Items drained per second; `None` until a group has been answered.
    fn rate(&self, now: Instant) -> Option<f64> {
        let last = self.last_drain?;
        // A stall: no answer for longer than a group takes on average.
        let since = self.busy_since.map_or(Duration::ZERO, |busy| {
            now.saturating_duration_since(last.max(busy))
        });
        let secs = self.secs_avg.max(since.as_secs_f64());
        (secs > 0.0 && self.items_avg > 0.0).then(|| self.items_avg / secs)
    }

    /// How long `items` more would wait for their answer; `None` when the
    /// queue is idle (nothing ahead) or its rate is not known yet.
    fn expected_wait(&self, items: usize, now: Instant) -> Option<Duration> {
        if self.queued == 0 {
            return None;
        }
        let rate = self.rate(now)?;
        Some(Duration::from_secs_f64(
            ((self.queued + items) as f64 / rate).min(86_400.0),
        ))
    }

    /// Takes a parsed body of `bytes` holding `items` items as the bytes
    /// per item's next sample.
    fn learn(&mut self, bytes: u64, items: usize) {
        let sample = bytes as f64 / items as f64;
        if self.bytes_per_item == 0.0 {
            self.bytes_per_item = sample;
        } else {
            self.bytes_per_item += BYTES_WEIGHT * (sample - self.bytes_per_item);
        }
    }

    /// The items a body of `bytes` is taken to hold before it is parsed:
    /// half what the bytes per item seen so far give, at least 1.
    fn estimate(&self, bytes: Option<u64>) -> usize {
        match bytes {
            Some(bytes) if self.bytes_per_item > 0.0 => {
                ((bytes as f64 / (2.0 * self.bytes_per_item)) as usize).max(1)
            }
            _ => 1,
        }
    }
}

impl Admission {
    /// Admission to the `kind` queue of `namespace`: at most `max_items`
    /// items at once, and past `floor` items nothing expected to wait past
    /// `max_wait`.
    pub fn new(
        kind: QueueKind,
        namespace: &str,
        max_items: usize,
        floor: usize,
        max_wait: Duration,
    ) -> Self {
        let shed = |bound: &'static str| metrics::counter!(crate::metrics::SHED, "bound" => bound);
        Self {
            kind,
            max_items: max_items.max(1),
            floor,
            max_wait,
            state: Arc::default(),
            shed_items: shed("queued_items"),
            shed_wait: shed("queue_wait"),
            expected_wait: metrics::gauge!(
                crate::metrics::QUEUE_EXPECTED_WAIT,
                "namespace" => namespace.to_owned(),
                "queue" => kind.label()
            ),
        }
    }

    /// Items admitted at once at most.
    pub fn max_items(&self) -> usize {
        self.max_items
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a request of `items` items (at least one counts) that
    /// arrived as `arrival` says, held until the returned [`Admitted`] is
    /// dropped; 503 `overloaded` at once when either bound would be passed.
    pub fn admit(&self, items: usize, arrival: Arrival) -> Result<Admitted, Problem> {
        let items = items.max(1);
        let now = Instant::now();
        let mut state = self.state();
        if let Some(bytes) = arrival.body_bytes {
            state.learn(bytes, items);
        }
        self.check(
            &state,
            items,
            now,
            now.saturating_duration_since(arrival.received),
        )?;
        if state.queued == 0 {
            state.busy_since = Some(now);
        }
        state.queued += items;
        Ok(Admitted {
            state: self.state.clone(),
            items,
        })
    }

    /// Whether a request arriving as `arrival` says would be admitted now,
    /// judged by the time it has waited and the items its body's length
    /// suggests (see the module's doc): it is refused before its body is
    /// read when not. An idle queue reads any body.
    pub fn has_room(&self, arrival: Arrival) -> Result<(), Problem> {
        let state = self.state();
        let items = match state.queued {
            0 => 1,
            _ => state.estimate(arrival.body_bytes),
        };
        let now = Instant::now();
        self.check(
            &state,
            items,
            now,
            now.saturating_duration_since(arrival.received),
        )
        .map_err(|refusal| match items {
            1 => refusal,
            estimated => refusal.with("estimated_items", estimated as u64),
        })
    }

    /// Whether `items` more, received `waited` ago, fit both bounds now.
    fn check(
        &self,
        state: &State,
        items: usize,
        now: Instant,
        waited: Duration,
    ) -> Result<(), Problem> {
        if state.queued + items > self.max_items {
            self.shed_items.increment(1);
            return Err(Problem::overloaded(self.kind.items_bound()));
        }
        // The gauge shows the expected wait whether or not the floor admits.
        let wait = state.expected_wait(items, now);
        self.expected_wait
            .set(wait.map_or(0.0, |wait| wait.as_secs_f64()));
        let Some(wait) = wait else { return Ok(()) };
        if state.queued + items <= self.floor || waited + wait <= self.max_wait {
            return Ok(());
        }
        self.shed_wait.increment(1);
        // When the queue will have drained to where a request fits: a
        // retry is a new request, its own wait so far starting again.
        let over = wait.saturating_sub(self.max_wait).as_secs_f64().ceil() as u64;
        Err(Problem::overloaded(self.kind.wait_bound())
            .retry_in(over.clamp(1, MAX_RETRY_AFTER_S))
            .with("expected_wait_ms", (waited + wait).as_millis() as u64)
            .with("waited_ms", waited.as_millis() as u64)
            .with("max_wait_ms", self.max_wait.as_millis() as u64))
    }

    /// Runs `group`, a worker's group of `items` items, and takes its
    /// answer as the drain rate's next sample. The group's busy time
    /// starts when it was taken or when the last group was answered,
    /// whichever is later, so groups in flight together are not counted
    /// twice and time with nothing to do is not counted at all.
    pub async fn draining<T>(&self, items: usize, group: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let answered = group.await;
        self.drained_at(items, started, Instant::now());
        answered
    }

    fn drained_at(&self, items: usize, started: Instant, now: Instant) {
        let mut state = self.state();
        let from = state.last_drain.map_or(started, |last| last.max(started));
        let secs = now.saturating_duration_since(from).as_secs_f64();
        if state.last_drain.is_none() {
            (state.items_avg, state.secs_avg) = (items as f64, secs);
        } else {
            state.items_avg += WEIGHT * (items as f64 - state.items_avg);
            state.secs_avg += WEIGHT * (secs - state.secs_avg);
        }
        state.last_drain = Some(now);
    }
}

/// A request's place in its queue, given back when it is answered or
/// dropped unrun.
pub(crate) struct Admitted {
    state: Arc<Mutex<State>>,
    items: usize,
}

impl std::fmt::Debug for Admitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("items", &self.items)
            .finish()
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.queued = state.queued.saturating_sub(self.items);
        if state.queued == 0 {
            state.busy_since = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(max_items: usize, max_wait_ms: u64) -> Admission {
        Admission::new(
            QueueKind::Adds,
            "test",
            max_items,
            0,
            Duration::from_millis(max_wait_ms),
        )
    }

    /// The workers answered a group of `items` every `every`, one at a
    /// time, for `groups` groups ending now.
    fn steady(a: &Admission, items: usize, every: Duration, groups: u32) {
        let end = Instant::now();
        for g in (1..=groups).rev() {
            let started = end - every * g;
            a.drained_at(items, started, started + every);
        }
    }

    #[test]
    fn an_idle_queue_or_an_unknown_rate_admits() {
        let a = admission(100, 250);
        let first = a.admit(90, Arrival::now()).expect("an idle queue admits");
        // No group answered yet: no rate, so only the item bound holds.
        let _second = a.admit(10, Arrival::now()).expect("no rate known yet");
        let refused = a.admit(1, Arrival::now()).unwrap_err();
        assert_eq!(refused.document()["bound"], "queued add items");
        drop(first);
        assert!(a.admit(90, Arrival::now()).is_ok());
    }

    #[test]
    fn the_wait_bounds_admission_and_retry_after_says_how_long() {
        let a = admission(1_000_000, 250);
        // 1,000 items a second.
        steady(&a, 100, Duration::from_millis(100), 20);
        let ahead = a.admit(200, Arrival::now()).expect("an idle queue admits");
        // 200 ahead + 40 = 240 ms: admitted.
        let _fits = a.admit(40, Arrival::now()).expect("within the bound");
        // 240 ahead + 2,000 = 2.24 s: refused, about 2 s to wait.
        let refused = a.admit(2_000, Arrival::now()).unwrap_err();
        let doc = refused.document();
        assert_eq!(doc["bound"], "add queue wait");
        let wait = doc["expected_wait_ms"].as_u64().unwrap();
        assert!((2_200..=2_300).contains(&wait), "{wait}");
        assert_eq!(refused.retry_after(), Some(2));
        assert!(
            a.has_room(Arrival::now()).is_ok(),
            "one more item still fits"
        );
        drop(ahead);
        assert!(a.admit(200, Arrival::now()).is_ok(), "the queue drained");
    }

    #[test]
    fn the_time_since_a_request_was_received_is_part_of_its_wait() {
        let a = admission(1_000_000, 250);
        // 1,000 items a second, 100 ahead: 100 ms for the queue.
        steady(&a, 100, Duration::from_millis(100), 20);
        let _ahead = a.admit(100, Arrival::now()).expect("an idle queue admits");
        let now = Instant::now();
        // Received 100 ms ago: 100 + 101 ms, within 250 ms.
        let _fresh = a
            .admit(1, received(now - Duration::from_millis(100)))
            .expect("within the bound");
        // Received 200 ms ago: 200 + 102 ms is past it, although the
        // queue alone would answer in time.
        let refused = a
            .admit(1, received(now - Duration::from_millis(200)))
            .unwrap_err();
        let doc = refused.document();
        assert_eq!(doc["bound"], "add queue wait");
        assert!(doc["waited_ms"].as_u64().unwrap() >= 200, "{doc}");
        let expected = doc["expected_wait_ms"].as_u64().unwrap();
        assert!((300..=320).contains(&expected), "{expected}");
        assert_eq!(refused.retry_after(), Some(1));
        // An idle queue admits whatever the request waited before it.
        let b = admission(1_000_000, 250);
        steady(&b, 100, Duration::from_millis(100), 20);
        assert!(b.admit(1, received(now - Duration::from_secs(5))).is_ok());
    }

    #[test]
    fn a_stalled_queue_stops_admitting() {
        let a = admission(1_000_000, 250);
        // 100,000 items a second until a second ago.
        let stalled = Instant::now() - Duration::from_secs(1);
        for g in (1..=20).rev() {
            let started = stalled - Duration::from_millis(10) * g;
            a.drained_at(1_000, started, started + Duration::from_millis(10));
        }
        let _ahead = a.admit(10, Arrival::now()).unwrap();
        let big = a
            .admit(20_000, Arrival::now())
            .expect("200 ms at the rate before the stall");
        drop(big);
        // Busy for the whole second since, with nothing answered: at most
        // 1,000 items in that second, so 300 more would wait ~330 ms.
        a.state().busy_since = Some(stalled);
        assert!(
            a.admit(10, Arrival::now()).is_ok(),
            "30 ms at the rate the stall allows"
        );
        assert!(
            a.admit(300, Arrival::now()).is_err(),
            "the stall slows the estimate"
        );
    }

    #[test]
    fn groups_in_flight_together_are_not_counted_twice() {
        let a = admission(1_000_000, 250);
        // Two workers, each answering a group of 100 every 20 ms, side by
        // side: 10,000 items a second, not 5,000.
        let end = Instant::now();
        for g in (1..=50).rev() {
            let started = end - Duration::from_millis(20) * g;
            a.drained_at(100, started, started + Duration::from_millis(20));
            a.drained_at(100, started, started + Duration::from_millis(20));
        }
        let rate = a.state().rate(Instant::now()).unwrap();
        assert!((9_000.0..=11_000.0).contains(&rate), "{rate}");
    }

    #[test]
    fn a_full_group_per_worker_is_admitted_whatever_the_rate() {
        let a = Admission::new(
            QueueKind::Adds,
            "test",
            1_000_000,
            4_000,
            Duration::from_millis(250),
        );
        // 100 items a second: 4,000 would wait 40 s.
        steady(&a, 10, Duration::from_millis(100), 20);
        let _ahead = a.admit(1, Arrival::now()).unwrap();
        let _within = a.admit(3_999, Arrival::now()).expect("within the floor");
        assert!(
            a.admit(1, Arrival::now()).is_err(),
            "past the floor, the wait bounds"
        );
    }

    /// A request received at `at`, with no body declared.
    fn received(at: Instant) -> Arrival {
        Arrival {
            received: at,
            body_bytes: None,
        }
    }

    /// A request of `bytes` received now.
    fn body(bytes: u64) -> Arrival {
        Arrival {
            received: Instant::now(),
            body_bytes: Some(bytes),
        }
    }

    #[test]
    fn a_body_is_refused_before_it_is_read_by_the_items_its_length_suggests() {
        let a = admission(1_000, 60_000);
        // Nothing learned yet: a body counts as one item.
        assert!(a.has_room(body(1_000_000)).is_ok());
        // Two bodies of 100 items at 40 bytes each: 40 bytes an item.
        let _first = a.admit(100, body(4_000)).unwrap();
        let _second = a.admit(100, body(4_000)).unwrap();
        // 200 queued. 32,000 bytes are taken for half their 800 items:
        // 200 + 400 fit the 1,000.
        assert!(a.has_room(body(32_000)).is_ok());
        // 80,000 bytes: 200 + 1,000 do not, refused unread.
        let refused = a.has_room(body(80_000)).unwrap_err();
        let doc = refused.document();
        assert_eq!(doc["bound"], "queued add items");
        assert_eq!(doc["estimated_items"], 1_000);
        // No length declared: one item, as before.
        assert!(a.has_room(Arrival::now()).is_ok());
    }

    #[test]
    fn an_idle_queue_reads_any_body() {
        let a = admission(1_000, 60_000);
        drop(a.admit(100, body(4_000)).unwrap());
        // Idle again: the body is read, and admit judges its real items.
        assert!(a.has_room(body(400_000)).is_ok());
    }

    #[test]
    fn the_time_a_request_already_waited_refuses_it_before_its_body_is_read() {
        let a = admission(1_000_000, 250);
        // 1,000 items a second, 100 queued: 100 ms ahead of a new request.
        steady(&a, 100, Duration::from_millis(100), 20);
        let _ahead = a.admit(100, Arrival::now()).unwrap();
        assert!(a.has_room(Arrival::now()).is_ok());
        let refused = a
            .has_room(received(Instant::now() - Duration::from_millis(200)))
            .unwrap_err();
        assert_eq!(refused.document()["bound"], "add queue wait");
    }
}
