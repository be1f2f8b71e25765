//! Login rate limiting: failed attempts counted per username and per
//! client address in a sliding window, so one attacker cannot guess one
//! account's password, nor spray many accounts from one address.
//!
//! In memory: a restart forgets the counts, which costs an attacker one
//! window at most and keeps the database out of the hot path.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use chrono::{DateTime, Duration, Utc};

/// Most keys remembered; beyond this the stalest are dropped, so a flood
/// of random usernames cannot exhaust memory.
const MAX_KEYS: usize = 100_000;

/// Failed-login counter.
#[derive(Debug)]
pub struct RateLimiter {
    max_failures: u32,
    window: Duration,
    failures: Mutex<HashMap<String, VecDeque<DateTime<Utc>>>>,
}

impl RateLimiter {
    /// Allows `max_failures` failures per key within `window`.
    pub fn new(max_failures: u32, window: Duration) -> Self {
        Self {
            max_failures,
            window,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// When the key may try again, if it is locked out now.
    pub fn locked_until(&self, key: &str, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut failures = self.failures.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = failures.get_mut(key)?;
        while entry.front().is_some_and(|at| *at + self.window <= now) {
            entry.pop_front();
        }
        if entry.len() >= self.max_failures as usize {
            entry.front().map(|first| *first + self.window)
        } else {
            None
        }
    }

    /// Counts one failure of `key`.
    pub fn record_failure(&self, key: &str, now: DateTime<Utc>) {
        let mut failures = self.failures.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if failures.len() >= MAX_KEYS && !failures.contains_key(key) {
            let window = self.window;
            failures.retain(|_, times| times.back().is_some_and(|at| *at + window > now));
            if failures.len() >= MAX_KEYS {
                failures.clear();
            }
        }
        failures.entry(key.to_owned()).or_default().push_back(now);
    }

    /// Forgets `key`'s failures (after a successful login).
    pub fn clear(&self, key: &str) {
        let mut failures = self.failures.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        failures.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_after_max_failures_and_unlocks_after_window() {
        let limiter = RateLimiter::new(3, Duration::minutes(10));
        let t0 = DateTime::<Utc>::UNIX_EPOCH;
        for i in 0..3 {
            assert_eq!(limiter.locked_until("user:a", t0), None, "attempt {i}");
            limiter.record_failure("user:a", t0 + Duration::seconds(i));
        }
        assert_eq!(
            limiter.locked_until("user:a", t0 + Duration::seconds(5)),
            Some(t0 + Duration::minutes(10))
        );
        assert_eq!(limiter.locked_until("user:b", t0), None);
        assert_eq!(
            limiter.locked_until("user:a", t0 + Duration::minutes(10) + Duration::seconds(1)),
            None
        );
        limiter.record_failure("user:c", t0);
        limiter.clear("user:c");
        assert_eq!(limiter.locked_until("user:c", t0), None);
    }
}
