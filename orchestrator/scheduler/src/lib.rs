//! The scheduler seam: taking a node out of service through its workload
//! scheduler before a firmware update, waiting until it is empty, and
//! returning it afterwards — without ever overriding or resuming an
//! operator's drain.
//!
//! - [`Scheduler`]: the trait the engine drives (state, drain with a reason
//!   tag carrying the rollout id, resume), with two adapters:
//!   [`slurm::SlurmScheduler`] (`scontrol` for changes, `sinfo --json` or
//!   `scontrol show node` for state; Slurm 22.05 semantics) and
//!   [`command::CommandScheduler`] (site-configured commands with templated
//!   node names, exit codes and JSON output). Kubernetes (cordon, evictions
//!   that respect PodDisruptionBudgets, uncordon) is not here yet: it needs a
//!   real API server to test against.
//! - [`rules`]: the pure decisions (drain? flash now? resume? give up on a
//!   node that never empties? capacity cap? drains left behind?) over a
//!   [`NodeState`] and Waveguard's durable [`rules::DrainRecord`].
//! - [`config`]: the `[scheduler]` configuration section and building the
//!   adapter from it (read by `serve`).
//! - [`name`]: validated scheduler node names and the configurable mapping
//!   from a Waveguard node name.
//!
//! The engine is expected to drive it as: read state -> [`rules::decide_drain`]
//! -> record intent -> [`Scheduler::drain`] -> [`confirm_drain`] -> record
//! held -> poll [`rules::flash_readiness`] -> flash -> [`rules::after_update`]
//! -> record resume intent -> [`Scheduler::resume`]. See the crate README
//! for the step-table rows.

pub mod command;
pub mod config;
mod error;
pub mod exec;
pub mod name;
pub mod rules;
pub mod slurm;
mod state;
#[cfg(feature = "testing")]
pub mod testing;

use async_trait::async_trait;

pub use error::{NameError, ParseError, SchedulerError};
pub use name::{NameMapping, SchedulerNodeName};
pub use state::{BaseState, NodeState, Reason, ReasonTag, Service, TAG_PREFIX, TagKind, UNEXPECTED_REBOOT_REASON};

/// A workload scheduler that can take nodes out of service and return them.
///
/// Implementations only report and act; every decision is in [`rules`].
/// Each method is one scheduler operation, safe to repeat.
#[async_trait]
pub trait Scheduler: Send + Sync + std::fmt::Debug {
    /// Short name for logs and pages (`slurm`, `command`).
    fn kind(&self) -> &'static str;

    /// The node's current state (reboot-aware: a node whose daemon has not
    /// registered since a reboot reports `responding: false`).
    async fn node_state(&self, node: &SchedulerNodeName) -> Result<NodeState, SchedulerError>;

    /// Every node the scheduler knows (for the periodic check).
    async fn all_states(&self) -> Result<Vec<NodeState>, SchedulerError>;

    /// Whether [`Scheduler::all_states`] is available; without it the
    /// engine asks node by node (and cannot run the periodic check for
    /// tags without a record).
    fn can_list(&self) -> bool {
        true
    }

    /// Sets the drain flag with `reason` (no new jobs; running jobs finish).
    /// Replaces any existing reason: callers check first
    /// ([`rules::decide_drain`]).
    async fn drain(&self, node: &SchedulerNodeName, reason: &ReasonTag) -> Result<(), SchedulerError>;

    /// Returns the node to service (clears the drain flag and its reason;
    /// for Slurm also a DOWN state). Succeeds when the node already is in
    /// service.
    async fn resume(&self, node: &SchedulerNodeName) -> Result<(), SchedulerError>;
}

/// Reads the node back after [`Scheduler::drain`] and checks that it
/// carries `tag`: only then may the engine record the drain as held.
/// Returns the state read (DRAINING or DRAINED).
pub async fn confirm_drain(
    scheduler: &dyn Scheduler,
    node: &SchedulerNodeName,
    tag: &ReasonTag,
) -> Result<NodeState, SchedulerError> {
    let state = scheduler.node_state(node).await?;
    if state.drain && state.tag().as_ref() == Some(tag) {
        return Ok(state);
    }
    Err(SchedulerError::DrainNotApplied {
        node: node.to_string(),
        expected: tag.render(),
        found: state.reason.map(|r| r.text),
    })
}
