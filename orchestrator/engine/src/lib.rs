//! The rollout engine: reconcilers with side effects. It executes stored
//! plans over Redfish, crash-safely, with one executing replica at a time.
//!
//! # Shape
//!
//! - [`start_rollout`] snapshots the fleet, asks the planner, and stores the
//!   plan (waves + per-node steps) in one transaction; a stored plan is never
//!   edited.
//! - [`Engine`] runs a loop: take or renew the executor lease, run one
//!   executor pass, sleep until the next tick or a [`Nudge`]. Every write of
//!   execution state carries the lease's fencing token and fails when
//!   another replica took over (see `orchestrator_db::execution`).
//! - A pass first moves every admitted step one state, then walks each
//!   unfinished rollout's current wave one state (planned → running → baking →
//!   awaiting approval → promoted, or halted / rolled back) and admits
//!   pending steps under the caps (fleet, rollout, wave, rack, NVLink domain,
//!   cluster percentage, one step per node) and inside maintenance windows.
//!   What holds a wave back is stored as [`Blocker`]s for the UI.
//! - The release's qualification is read on every pass: waves after the
//!   canary wait (`AwaitingQualification`) until the release is qualified and
//!   has passed the policy's required gates; a blocked release halts every
//!   rollout of it. A failed health verdict blocks the release with the
//!   verdict's evidence as the reason (audited), then rolls back when the
//!   policy says so.
//!
//! # The step machine and its replay table
//!
//! Intent is written before each side effect and the outcome after it. A
//! step found in a state after a crash is continued by the same code that
//! moves it normally; the table says why that never flashes twice nor skips
//! a node.
//!
//! | State found | Durable facts | What the next move does |
//! |---|---|---|
//! | `pending` | nothing done | precheck (read-only): at target → `skipped` (no flash); unexpected version → `failed` naming both; else → `prechecked` |
//! | `pending`, scheduler configured | a drain record (`scheduler_drains`) or none | drain, wait for the node to empty, then the row above; the scheduler keeping the node → `deferred` (not a failure); after the step ends, resume. Rows of their own in the `drain` module's table |
//! | `prechecked` | inventory was as expected | list BMC tasks, write `pushing` + that list (intent), push; accepted → `flashing` with the task URI; 503/unreachable (not accepted) → back to `prechecked` with backoff; ambiguous → stay `pushing` |
//! | `pushing` | a push may or may not have landed | list tasks again: a task not in the stored list is ours → adopt it (`flashing`), no second push; none and inventory at target → `verifying`; none and not at target → the push never landed → `prechecked` (push again). A BMC that cannot list tasks is never pushed twice: the step fails for a human |
//! | `flashing` | task URI stored | poll it: running → wait; completed → `activating`; exception → `failed`; task gone → inventory decides |
//! | `activating` | image staged; `reset_issued_at` if a reset was requested | new version already active → `verifying` and, from the same read, `succeeded` (no reset; both moves in one commit, nothing is sent between them); no reset requested → write `reset_issued_at` (intent) then reset; reset requested less than `activation_timeout` ago → wait; older → reset again (at most `max_resets`) |
//! | `verifying` | activation happened | inventory reads the target → `succeeded`; otherwise → `failed` with the versions read |
//! | any in flight | `unreachable_since` | BMC silent longer than `brick_timeout` (measured from the end of the controller's last degraded episode) → node quarantined, step `failed`, rollout halted |
//! | any | nothing new (a fault of the controller's own: EMFILE, its pool, its image source) | nothing written for the node (a reset that never left gives its attempt back): no attempt, no backoff, no brick timer; the controller is degraded and moves no step until a real-time hold passes without such a fault (`controller` module) |
//!
//! Safety limit: a replica only acts while it holds the lease. A fenced
//! write proves nobody has taken the lease over *yet*, not that nobody will
//! before the next BMC request lands; so a push or reset is only sent while
//! at least half the lease TTL is left, and the call, retries included, is
//! dropped when only a quarter is left (its outcome is then unknown and
//! resolved from the BMC's task list or inventory). A deposed leader's last
//! request has ended before a successor (which needs the lease expired) can
//! look at the BMC, however long the driver would have retried.
//!
//! # Time
//!
//! One [`orchestrator_types::Clock`] (the database handle's) for every
//! decision: bake ends, windows, backoff, brick and activation timeouts.

pub mod bmc_access;
mod config;
mod connector;
mod controller;
mod drain;
mod error;
mod executor;
mod health;
mod inventory;
pub mod metric_source;
pub mod prometheus;
pub mod retention;
pub mod rma;
mod runner;
mod start;
mod step;
pub mod watch;
pub mod wave;

pub use config::{
    DEFAULT_CONTROLLER_FAULT_HOLD, DEFAULT_FLEET_MAX_IN_FLIGHT, EXECUTOR_LEASE, EngineConfig, StepDeadlines,
    WorkloadScheduler,
};
pub use connector::{
    BmcConnector, ConnectError, EndpointResolver, RedfishConnector, ResolveError, logout_all, logout_idle,
};
pub use controller::{ControllerHealth, ControllerStatus};
pub use error::{EngineError, MissingSeries};
pub use health::{GatelessJudge, HealthJudge};
pub use inventory::{InventoryReadings, inventory_readings};
pub use orchestrator_db::execution::ENGINE_ACTOR;
pub use orchestrator_types::{Blocker, Outcome, WaveVerdict};
pub use runner::{Engine, LeaseHolder, Nudge};
pub use start::{StartChecks, start_rollout_checked, start_rollout_planned};
pub use start::{StartRollout, fleet_snapshot, parse_policy, plan_to_rows, rollout, start_rollout};
