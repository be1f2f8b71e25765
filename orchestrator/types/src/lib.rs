//! Waveguard's vocabulary: ids, firmware versions and their ordering, domain
//! enums and the release qualification state machine.
//!
//! Invariant: this crate does no I/O and depends on no runtime, database or
//! HTTP crate, so every other crate (including the pure planner and
//! detector) can share it.

mod clock;
mod ids;
mod kinds;
mod qualification;
mod version;

pub use clock::{Clock, ManualClock, SystemClock};
pub use ids::{NodeId, ReleaseId, RolloutId, StepId, UserId, WaveId};
pub use kinds::{ComponentKind, NodeState, ParseEnumError, Role};
pub use qualification::{QualificationState, TransitionError, TransitionRequest};
pub use version::{FirmwareVersion, MAX_VERSION_LEN, ORDERED_EXAMPLES, VersionError};
