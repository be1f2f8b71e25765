use chrono::Duration;
use orchestrator_types::StepState;

/// The engine's knobs. Every duration is simulated time (read from the
/// shared clock) except the pass interval and lease renewal cadence, which
/// are how often the loop wakes in real time.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Identity recorded as the lease holder (host:pid, replica name).
    pub holder: String,
    /// How long a lease lasts without renewal; a standby takes over after it.
    /// Pushes and resets are only sent while at least half of it is left
    /// and are cut off (outcome unknown) when a quarter is left, whatever
    /// the BMC driver's retries; so three quarters of it should exceed a
    /// BMC request's timeout for a slow BMC's push to complete at all.
    pub lease_ttl: Duration,
    /// Real time between passes when nothing nudges the engine.
    pub pass_interval: std::time::Duration,
    /// BMC operations running at once in one pass (across all rollouts).
    pub bmc_concurrency: usize,
    /// Flashes in flight across every rollout, whatever the policies say.
    pub fleet_max_in_flight: u32,
    /// Transient failures a step retries before it fails.
    pub max_attempts: i32,
    /// First retry delay; doubles per attempt up to `max_backoff`.
    pub base_backoff: Duration,
    /// Longest retry delay.
    pub max_backoff: Duration,
    /// A BMC silent this long during a flash or activation is bricked:
    /// the node is quarantined and the rollout halts. Must exceed the
    /// longest manager reset.
    pub brick_timeout: Duration,
    /// How long after a reset the new version may take to appear before the
    /// reset is issued again (at most `max_resets` times).
    pub activation_timeout: Duration,
    /// Resets tried before a step that will not activate fails.
    pub max_resets: u32,
    /// Every step state that waits on a BMC has a deadline, measured from
    /// when the step entered it; past it the step fails with the reason, so
    /// a task that never ends cannot hold a rollout (or a rollback) for good.
    pub deadlines: StepDeadlines,
    /// Real (wall) time the controller stays degraded after a fault of its
    /// own (EMFILE, an exhausted pool, its image source failing): flashing
    /// pauses and resumes once no such fault was seen for this long. Not on
    /// the rollout clock, which may run thousands of times faster.
    pub controller_fault_hold: std::time::Duration,
    /// The workload scheduler nodes are drained through before a flash and
    /// resumed through after it; `None`: nodes are flashed as they are.
    pub scheduler: Option<WorkloadScheduler>,
}

/// The workload scheduler the engine drains nodes through, and how
/// Waveguard's node names map to the scheduler's.
#[derive(Debug, Clone)]
pub struct WorkloadScheduler {
    pub scheduler: std::sync::Arc<dyn orchestrator_scheduler::Scheduler>,
    pub names: orchestrator_scheduler::NameMapping,
}

/// Default [`EngineConfig::controller_fault_hold`]: a few engine passes, long
/// enough for descriptors held by closing sockets to come back.
pub const DEFAULT_CONTROLLER_FAULT_HOLD: std::time::Duration = std::time::Duration::from_secs(5);

/// Real time a BMC driver may go unused before the engine deletes its session and forgets it. Shorter
/// than the 30-minute session timeout BMCs commonly default to, so the controller closes its sessions
/// rather than leaving them to expire; longer than any poll or pass interval, so a node being watched
/// keeps its session.
pub const DRIVER_IDLE_LOGOUT: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// How often the engine looks for idle drivers ([`DRIVER_IDLE_LOGOUT`]).
pub const DRIVER_SWEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a step may stay in each state that waits on a BMC. Each must
/// exceed what a slow but healthy BMC takes, retries included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepDeadlines {
    /// Prechecked or pushing: the push accepted (with its retries and
    /// backoff, at most `max_attempts` × `max_backoff`).
    pub push: Duration,
    /// Flashing: the BMC's update task finished. A GPU flash takes minutes;
    /// hours mean the task is stuck.
    pub task: Duration,
    /// Activating: the new version runs (every reset with its activation
    /// timeout, `max_resets` × `activation_timeout`, and a brick timeout).
    pub activation: Duration,
    /// Verifying: inventory read back.
    pub verification: Duration,
}

impl Default for StepDeadlines {
    fn default() -> Self {
        Self {
            push: Duration::hours(1),
            task: Duration::hours(2),
            activation: Duration::hours(2),
            verification: Duration::minutes(45),
        }
    }
}

/// Name of the lease the executor holds.
pub const EXECUTOR_LEASE: &str = "executor";

/// Default fleet-wide cap on flashes in flight: a controller bug must never
/// be able to take more than this many nodes down at once.
pub const DEFAULT_FLEET_MAX_IN_FLIGHT: u32 = 512;

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            holder: format!("waveguard-{}", std::process::id()),
            // A pass starts with it renewed, leaving 45 s for a push: more
            // than the default 30 s BMC request timeout (see `lease_ttl`).
            lease_ttl: Duration::seconds(60),
            pass_interval: std::time::Duration::from_secs(2),
            bmc_concurrency: 64,
            fleet_max_in_flight: DEFAULT_FLEET_MAX_IN_FLIGHT,
            max_attempts: 5,
            base_backoff: Duration::seconds(30),
            max_backoff: Duration::minutes(10),
            brick_timeout: Duration::minutes(30),
            activation_timeout: Duration::minutes(20),
            max_resets: 3,
            deadlines: StepDeadlines::default(),
            controller_fault_hold: DEFAULT_CONTROLLER_FAULT_HOLD,
            scheduler: None,
        }
    }
}

impl EngineConfig {
    /// How long a step may stay in `state`; `None` for states that do not
    /// wait on a BMC (pending waits for admission, which other blockers
    /// explain) and for terminal states.
    pub fn step_deadline(&self, state: StepState) -> Option<Duration> {
        match state {
            StepState::Prechecked | StepState::Pushing => Some(self.deadlines.push),
            StepState::Flashing => Some(self.deadlines.task),
            StepState::Activating => Some(self.deadlines.activation),
            StepState::Verifying => Some(self.deadlines.verification),
            StepState::Pending
            | StepState::Succeeded
            | StepState::Failed
            | StepState::Skipped
            | StepState::Deferred => None,
        }
    }

    /// Delay before retry number `attempt` (1-based).
    pub fn backoff(&self, attempt: i32) -> Duration {
        let shift = u32::try_from(attempt.saturating_sub(1)).unwrap_or(0).min(16);
        let delay = self.base_backoff * (1i32 << shift);
        delay.min(self.max_backoff)
    }
}
