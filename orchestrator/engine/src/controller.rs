//! The controller's own health, as opposed to any node's: whether the
//! controller itself is short of something (file descriptors, local ports,
//! its image source, its database pool) right now.
//!
//! A fault reported here is never evidence about a BMC. While one has been
//! seen within the last [`EngineConfig::controller_fault_hold`] of *real*
//! time the controller is degraded: the executor moves no step and starts no
//! flash, and no brick timer or step deadline runs against a node. The hold
//! is wall time on purpose: the rollout clock may run thousands of times
//! faster than real time, and a descriptor storm does not clear any sooner
//! for it.
//!
//! [`EngineConfig::controller_fault_hold`]: crate::EngineConfig::controller_fault_hold

use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

/// What the UI, the API and `/metrics` show about the controller itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControllerStatus {
    /// Flashing is paused because of a fault of the controller's own.
    pub degraded: bool,
    /// What the last fault was (`BmcError::kind` or a database failure), for
    /// the banner and the logs. Never carries secrets: it is built from error
    /// kinds and OS error labels only.
    pub reason: Option<String>,
    /// How many controller faults were seen since the process started.
    pub faults_total: u64,
    /// How many times the controller became degraded.
    pub episodes_total: u64,
    /// Scheduler nodes drained with a Waveguard reason tag that Waveguard
    /// has no open drain record for (the periodic check): reported for a
    /// human, never resumed by Waveguard (a tag proves nothing).
    pub orphaned_drains: Vec<String>,
    /// Why the workload scheduler could not be read on the last pass, if
    /// it could not (nothing is drained or resumed meanwhile).
    pub scheduler_error: Option<String>,
}

#[derive(Debug, Default)]
struct Inner {
    last_fault: Option<Instant>,
    status: ControllerStatus,
    /// On the rollout clock: when the last degraded episode ended (or, while
    /// one lasts, the last time it was confirmed). Silence and deadlines
    /// measured from before it are not held against a node.
    episode_end: Option<DateTime<Utc>>,
}

/// Shared between the executor, its step moves and whoever shows the status.
#[derive(Debug)]
pub struct ControllerHealth {
    hold: Duration,
    inner: Mutex<Inner>,
}

impl Default for ControllerHealth {
    fn default() -> Self {
        Self::new(crate::config::DEFAULT_CONTROLLER_FAULT_HOLD)
    }
}

impl ControllerHealth {
    /// Healthy, staying degraded for `hold` of real time after each fault.
    pub fn new(hold: Duration) -> Self {
        Self {
            hold,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The state is a few plain fields, valid even if a holder panicked.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a fault of the controller's own; `now` is the rollout clock.
    pub fn report_fault(&self, reason: &str, now: DateTime<Utc>) {
        let mut inner = self.lock();
        inner.last_fault = Some(Instant::now());
        inner.status.faults_total += 1;
        inner.episode_end = Some(now);
        if !inner.status.degraded {
            inner.status.degraded = true;
            inner.status.episodes_total += 1;
            tracing::warn!(
                %reason,
                hold_ms = self.hold.as_millis() as u64,
                "controller degraded: pausing new flashes; no node is charged for this"
            );
        }
        inner.status.reason = Some(reason.to_owned());
    }

    /// Whether the controller is degraded now, ending the episode when no
    /// fault was seen for the hold (in real time); `now` is the rollout clock.
    pub fn refresh(&self, now: DateTime<Utc>) -> bool {
        let mut inner = self.lock();
        if !inner.status.degraded {
            return false;
        }
        let quiet = inner.last_fault.is_none_or(|at| at.elapsed() >= self.hold);
        inner.episode_end = Some(now);
        if quiet {
            inner.status.degraded = false;
            tracing::info!(
                reason = inner.status.reason.as_deref().unwrap_or(""),
                "controller recovered: resuming flashes"
            );
        }
        inner.status.degraded
    }

    /// Whether the controller is degraded, without ending an episode.
    pub fn is_degraded(&self) -> bool {
        self.lock().status.degraded
    }

    /// When the last degraded episode ended (rollout clock); `None` if there
    /// was none.
    pub fn episode_end(&self) -> Option<DateTime<Utc>> {
        self.lock().episode_end
    }

    /// Records what the last pass found on the scheduler's side.
    pub(crate) fn set_scheduler_report(&self, orphaned: Vec<String>, error: Option<String>) {
        let mut inner = self.lock();
        if orphaned != inner.status.orphaned_drains && !orphaned.is_empty() {
            tracing::warn!(
                nodes = ?orphaned,
                "nodes drained with a Waveguard tag but no drain record: left for a human"
            );
        }
        inner.status.orphaned_drains = orphaned;
        inner.status.scheduler_error = error;
    }

    /// A copy of the status for display.
    pub fn status(&self) -> ControllerStatus {
        self.lock().status.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn degraded_until_a_real_time_hold_passes_without_faults() {
        let health = ControllerHealth::new(Duration::from_millis(50));
        let t0 = Utc::now();
        assert!(!health.refresh(t0));
        health.report_fault("controller_resource", t0);
        assert!(health.refresh(t0));
        // However far the rollout clock jumps, the hold is real time.
        assert!(health.refresh(t0 + chrono::Duration::days(1)));
        std::thread::sleep(Duration::from_millis(60));
        let t1 = t0 + chrono::Duration::days(2);
        assert!(!health.refresh(t1));
        assert_eq!(health.episode_end(), Some(t1));
        let status = health.status();
        assert_eq!((status.faults_total, status.episodes_total), (1, 1));
        assert_eq!(status.reason.as_deref(), Some("controller_resource"));
        health.report_fault("db_pool", t1);
        assert_eq!(health.status().episodes_total, 2);
    }
}
