//! Simulated time that runs faster than real time.

use std::time::Instant;

use chrono::{DateTime, Duration, Utc};
use orchestrator_types::Clock;

/// A clock that starts at a chosen instant and advances `speedup` times faster than real time.
///
/// Share one `Arc<SimClock>` between the simulator and an in-process controller so that both agree on
/// "now" while hours of bake time pass in seconds.
#[derive(Debug, Clone)]
pub struct SimClock {
    start_sim: DateTime<Utc>,
    start_real: Instant,
    speedup: f64,
}

impl SimClock {
    /// Starts at `start` (simulated) now, advancing `speedup` simulated seconds per real second.
    /// A non-finite or non-positive speedup is treated as 1.
    pub fn new(start: DateTime<Utc>, speedup: f64) -> Self {
        let speedup = if speedup.is_finite() && speedup > 0.0 {
            speedup
        } else {
            1.0
        };
        Self {
            start_sim: start,
            start_real: Instant::now(),
            speedup,
        }
    }

    /// Starts at the current wall-clock time.
    pub fn starting_now(speedup: f64) -> Self {
        Self::new(Utc::now(), speedup)
    }

    /// The speedup factor in force.
    pub fn speedup(&self) -> f64 {
        self.speedup
    }

    /// Real time that corresponds to `sim` simulated time (for sleeping).
    pub fn real_duration(&self, sim: std::time::Duration) -> std::time::Duration {
        sim.div_f64(self.speedup)
    }
}

impl Clock for SimClock {
    fn now(&self) -> DateTime<Utc> {
        let real = self.start_real.elapsed();
        let sim_nanos = (real.as_nanos() as f64 * self.speedup).min(i64::MAX as f64) as i64;
        self.start_sim + Duration::nanoseconds(sim_nanos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_faster() {
        let start = Utc::now();
        let c = SimClock::new(start, 1000.0);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let elapsed = c.now() - start;
        assert!(elapsed >= Duration::seconds(19), "{elapsed}");
        assert_eq!(SimClock::new(start, -3.0).speedup(), 1.0);
    }
}
