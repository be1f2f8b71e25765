//! The one source of "now", so bake times, maintenance windows and timeouts
//! can run on simulated time.

use std::fmt;
use std::sync::Mutex;

use chrono::{DateTime, Duration, Utc};

/// Where every component reads the current time from.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current instant.
    fn now(&self) -> DateTime<Utc>;

    /// Real time that `span` of this clock's time takes to pass, for the
    /// few places that must bound a real-time operation (a BMC call) by a
    /// clock-time limit (the lease). A warped clock divides by its speed;
    /// a negative span is zero.
    fn real_time(&self, span: Duration) -> std::time::Duration {
        span.to_std().unwrap_or(std::time::Duration::ZERO)
    }
}

/// Wall-clock time.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that only moves when told to; for tests.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<DateTime<Utc>>,
}

impl ManualClock {
    /// A clock stopped at `start`.
    pub fn new(start: DateTime<Utc>) -> Self {
        Self { now: Mutex::new(start) }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *now += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
