//! What can go wrong running a simulation, shared by the run, its watch and its report.

use orchestrator_db::DbError;
use orchestrator_engine::EngineError;

/// What went wrong running a simulation.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("approving wave {wave:?}")]
    Approve {
        wave: String,
        #[source]
        source: DbError,
    },
    #[error("cannot register the release")]
    RegisterRelease(#[source] DbError),
    #[error("cannot register the fleet's current version")]
    RegisterCurrent(#[source] DbError),
    /// The engine refused the rollout for what was asked (a caller error).
    #[error("the rollout cannot start")]
    RolloutRefused(#[source] EngineError),
    #[error("cannot start the rollout")]
    StartRollout(#[source] EngineError),
    #[error(
        "the policy {policy:?} selects no node of the scenario's fleet for {release} (check target platforms, \
         selector, versions.from against the scenario)"
    )]
    NothingSelected { policy: String, release: String },
    /// The fleet's processes did not answer their control API.
    #[error("cannot read the simulated fleet")]
    Fleet(#[source] bmc_sim::ProcessError),
}

impl SimError {
    /// True when the inputs (scenario, policy, release) are at fault rather
    /// than the system: a command reports it as bad input.
    pub fn is_caller_error(&self) -> bool {
        match self {
            SimError::Db(e) | SimError::RegisterRelease(e) | SimError::RegisterCurrent(e) => e.is_caller_error(),
            SimError::Approve { source, .. } => source.is_caller_error(),
            SimError::RolloutRefused(_) | SimError::NothingSelected { .. } => true,
            SimError::StartRollout(_) | SimError::Fleet(_) => false,
        }
    }
}
