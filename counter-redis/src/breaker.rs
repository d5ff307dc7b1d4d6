//! A circuit breaker: after a run of Redis failures, reads skip Redis for a
//! while and go straight to the database, so a dead or slow Redis costs one
//! timeout per breaker period instead of one per read.

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

#[derive(Debug)]
pub(crate) struct Breaker {
    threshold: u32,
    open_for: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    failures: u32,
    open_until: Option<Instant>,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, open_for: Duration) -> Self {
        Self {
            threshold: threshold.max(1),
            open_for,
            state: Mutex::default(),
        }
    }

    /// Whether Redis may be tried now. Once the open period is over, calls
    /// go through again (the first failure reopens it).
    pub(crate) fn allows(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.open_until.is_none_or(|until| Instant::now() >= until)
    }

    pub(crate) fn success(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.failures = 0;
        state.open_until = None;
    }

    /// Records a failure; returns true if it opened the breaker.
    pub(crate) fn failure(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.failures = state.failures.saturating_add(1);
        let reopen = state.open_until.is_some();
        if state.failures >= self.threshold || reopen {
            state.open_until = Some(Instant::now() + self.open_for);
            return !reopen || state.failures == self.threshold;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_the_threshold_and_closes_after_the_period() {
        let breaker = Breaker::new(3, Duration::from_millis(30));
        assert!(breaker.allows());
        assert!(!breaker.failure());
        assert!(!breaker.failure());
        assert!(breaker.failure());
        assert!(!breaker.allows());
        std::thread::sleep(Duration::from_millis(40));
        assert!(breaker.allows());
        breaker.success();
        assert!(!breaker.failure());
        assert!(breaker.allows());
    }
}
