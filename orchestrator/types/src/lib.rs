//! Waveguard's vocabulary: ids, firmware versions and their ordering, domain
//! enums, the release qualification state machine, and where rollouts,
//! waves and steps stand (states and blockers).
//!
//! Invariant: this crate does no I/O and depends on no runtime, database or
//! HTTP crate, so every other crate (including the pure planner and
//! detector) can share it.

mod clock;
mod error;
mod execution;
mod ids;
mod kinds;
mod qualification;
mod verdict;
mod version;

pub use clock::{AcceleratedClock, Clock, ManualClock, RolloutClock, SystemClock, WallClock};
pub use error::{error_chain, error_sources};
pub use execution::{
    Blocker, DrainPhase, HOLDBACK_WAVE, RolloutState, StepPurpose, StepState, WaveKind, WaveRole, WaveState,
};
pub use ids::{NodeId, ReleaseId, RolloutId, StepId, UserId, WaveId};
pub use kinds::{ComponentKind, NodeState, ParseEnumError, Role};
pub use qualification::{QualificationState, TransitionError, TransitionRequest, qualification_hold};
pub use verdict::{FleetCohort, FleetEvidence, FleetGateLook, FleetNodeLook, NodeInError, Outcome, WaveVerdict};
pub use version::{FirmwareVersion, MAX_VERSION_LEN, ORDERED_EXAMPLES, VersionError};
