//! A per-token rate limit: a token bucket refilled at `rate_per_second`,
//! holding at most `burst` requests.
//!
//! Hand-written rather than `governor`: one bucket per token behind a
//! mutex is the whole need (about 30 lines, tested below), and the wait a
//! refused request must announce in `Retry-After` falls out of it.

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

/// One token's bucket.
#[derive(Debug)]
pub(crate) struct RateLimit {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl RateLimit {
    /// `rate` requests per second on average, `burst` at once (both > 0).
    pub fn new(rate: f64, burst: f64) -> Self {
        Self {
            rate,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Takes one request from the bucket, or says how long until one is
    /// there.
    pub fn take(&self, now: Instant) -> Result<(), Duration> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (tokens, last) = &mut *state;
        let elapsed = now.saturating_duration_since(*last).as_secs_f64();
        *tokens = (*tokens + elapsed * self.rate).min(self.burst);
        *last = now.max(*last);
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - *tokens) / self.rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate() {
        let limit = RateLimit::new(10.0, 3.0);
        let start = Instant::now();
        for _ in 0..3 {
            limit.take(start).unwrap();
        }
        let wait = limit.take(start).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        // A tenth of a second later, one more.
        limit.take(start + Duration::from_millis(100)).unwrap();
        assert!(limit.take(start + Duration::from_millis(100)).is_err());
        // A long pause refills to the burst, not beyond.
        let later = start + Duration::from_secs(60);
        for _ in 0..3 {
            limit.take(later).unwrap();
        }
        assert!(limit.take(later).is_err());
    }
}
