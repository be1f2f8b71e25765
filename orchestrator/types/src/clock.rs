//! The one source of "now", so bake times, maintenance windows and timeouts
//! can run on simulated time.
//!
//! There are two clocks, and their types keep them apart: the
//! [`RolloutClock`] (bakes, maintenance windows, step deadlines, the lease,
//! every stored timestamp; accelerated in simulations) and the
//! [`WallClock`] (logins, sessions and their throttles: what a person
//! experiences). Code that takes one cannot be handed the other; both wrap
//! a [`Clock`], chosen where a process is wired.

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

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

/// The rollout clock of simulations and tests: `speedup` times faster than
/// real time, plus forward jumps over idle stretches. The one accelerated
/// clock: `serve --clock-speedup`, the simulated world and bmc-sim all use it,
/// so a controller and a simulated fleet sharing one always agree on now.
///
/// Never goes backwards: jumps only add.
#[derive(Debug)]
pub struct AcceleratedClock {
    anchor: Anchor,
    speedup: f64,
    skipped_nanos: AtomicI64,
}

/// Where simulated time is counted from.
#[derive(Debug, Clone, Copy)]
enum Anchor {
    /// From this process's monotonic clock at construction, when simulated
    /// time was `sim`: a wall-clock step (NTP) cannot move simulated time.
    Started { sim: DateTime<Utc>, real: Instant },
    /// From the wall-clock instant at which simulated time equals real time:
    /// separate processes (a restarted controller, a bmc-sim started at the
    /// epoch) compute the same now without sharing anything.
    WallEpoch(DateTime<Utc>),
}

impl AcceleratedClock {
    /// Starts at `start` (simulated) now, advancing `speedup` simulated
    /// seconds per real second. A non-finite or non-positive speedup is
    /// treated as 1.
    pub fn new(start: DateTime<Utc>, speedup: f64) -> Self {
        Self::anchored(
            Anchor::Started {
                sim: start,
                real: Instant::now(),
            },
            speedup,
        )
    }

    /// Starts at the current wall-clock time.
    pub fn starting_now(speedup: f64) -> Self {
        Self::new(Utc::now(), speedup)
    }

    /// Counted on the wall clock from `epoch`, at which simulated time
    /// equals real time (`serve --clock-epoch`).
    pub fn from_wall_epoch(epoch: DateTime<Utc>, speedup: f64) -> Self {
        Self::anchored(Anchor::WallEpoch(epoch), speedup)
    }

    fn anchored(anchor: Anchor, speedup: f64) -> Self {
        let speedup = if speedup.is_finite() && speedup > 0.0 {
            speedup
        } else {
            1.0
        };
        Self {
            anchor,
            speedup,
            skipped_nanos: AtomicI64::new(0),
        }
    }

    /// Simulated seconds per real second.
    pub fn speedup(&self) -> f64 {
        self.speedup
    }

    /// Jumps forward to `at` (no-op when `at` is not in the future).
    pub fn skip_to(&self, at: DateTime<Utc>) {
        let gap = at - self.now();
        if let Some(nanos) = gap.num_nanoseconds().filter(|n| *n > 0) {
            self.skipped_nanos.fetch_add(nanos, Ordering::SeqCst);
        }
    }

    /// Simulated time that `real` real time covers.
    pub fn sim_duration(&self, real: std::time::Duration) -> Duration {
        let nanos = (real.as_nanos() as f64 * self.speedup).min(i64::MAX as f64) as i64;
        Duration::nanoseconds(nanos)
    }
}

impl Clock for AcceleratedClock {
    fn now(&self) -> DateTime<Utc> {
        let run = match self.anchor {
            Anchor::Started { sim, real } => sim + self.sim_duration(real.elapsed()),
            Anchor::WallEpoch(epoch) => {
                // Signed: a wall clock stepped back before the epoch runs
                // simulated time back with it rather than failing.
                let real = Utc::now() - epoch;
                let nanos = real.num_nanoseconds().unwrap_or(i64::MAX) as f64 * self.speedup;
                epoch + Duration::nanoseconds(nanos.clamp(i64::MIN as f64, i64::MAX as f64) as i64)
            }
        };
        run + Duration::nanoseconds(self.skipped_nanos.load(Ordering::SeqCst))
    }

    // At most this long: a skip only makes simulated time pass sooner.
    fn real_time(&self, span: Duration) -> std::time::Duration {
        let nanos = span.num_nanoseconds().unwrap_or(i64::MAX).max(0) as f64 / self.speedup;
        std::time::Duration::from_nanos(nanos as u64)
    }
}

/// The rollout clock: what bakes, maintenance windows, step deadlines, the
/// executor lease and every stored timestamp are read on. Accelerated in
/// simulations, so a simulated day passes in seconds.
#[derive(Debug, Clone)]
pub struct RolloutClock(Arc<dyn Clock>);

/// The wall clock: what a person's login, session and login throttle are
/// read on. A simulation that accelerates the rollout clock must not end a
/// 12-hour session or a 15-minute lockout in real seconds.
#[derive(Debug, Clone)]
pub struct WallClock(Arc<dyn Clock>);

macro_rules! clock_role {
    ($role:ident) => {
        impl $role {
            /// This role played by `clock`.
            pub fn new(clock: Arc<dyn Clock>) -> Self {
                Self(clock)
            }

            /// The current instant.
            pub fn now(&self) -> DateTime<Utc> {
                self.0.now()
            }

            /// Real time that `span` of this clock's time takes to pass
            /// (see [`Clock::real_time`]).
            pub fn real_time(&self, span: Duration) -> std::time::Duration {
                self.0.real_time(span)
            }
        }

        impl<C: Clock + 'static> From<Arc<C>> for $role {
            fn from(clock: Arc<C>) -> Self {
                Self(clock)
            }
        }

        impl From<Arc<dyn Clock>> for $role {
            fn from(clock: Arc<dyn Clock>) -> Self {
                Self(clock)
            }
        }
    };
}

clock_role!(RolloutClock);
clock_role!(WallClock);

impl WallClock {
    /// Real time.
    pub fn system() -> Self {
        Self(Arc::new(SystemClock))
    }
}

impl Default for WallClock {
    fn default() -> Self {
        Self::system()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accelerated_runs_faster_and_skips_forward_only() {
        let start = Utc::now();
        let c = AcceleratedClock::new(start, 1000.0);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let elapsed = c.now() - start;
        assert!(elapsed >= Duration::seconds(19), "{elapsed}");
        let before = c.now();
        c.skip_to(before + Duration::hours(5));
        assert!(c.now() >= before + Duration::hours(5));
        let after = c.now();
        c.skip_to(start);
        assert!(c.now() >= after, "a skip into the past is ignored");
        assert_eq!(c.real_time(Duration::seconds(10)), std::time::Duration::from_millis(10));
        assert_eq!(c.real_time(Duration::seconds(-10)), std::time::Duration::ZERO);
        assert_eq!(AcceleratedClock::new(start, -3.0).speedup(), 1.0);
        assert_eq!(AcceleratedClock::new(start, f64::NAN).speedup(), 1.0);
    }

    #[test]
    fn each_role_reads_the_clock_it_was_given() {
        let start = Utc::now() - Duration::days(30);
        let manual = Arc::new(ManualClock::new(start));
        let rollout = RolloutClock::from(manual.clone());
        manual.advance(Duration::hours(1));
        assert_eq!(rollout.now(), start + Duration::hours(1));
        assert!(WallClock::system().now() > rollout.now() + Duration::days(29));
    }

    #[test]
    fn a_wall_epoch_clock_agrees_across_instances() {
        let epoch = Utc::now() - Duration::seconds(2);
        let (a, b) = (
            AcceleratedClock::from_wall_epoch(epoch, 60.0),
            AcceleratedClock::from_wall_epoch(epoch, 60.0),
        );
        let gap = (a.now() - b.now()).num_seconds().abs();
        assert!(gap <= 1, "{gap}");
        // Two real seconds since the epoch are two simulated minutes.
        let elapsed = a.now() - epoch;
        assert!(elapsed >= Duration::seconds(119), "{elapsed}");
    }
}
