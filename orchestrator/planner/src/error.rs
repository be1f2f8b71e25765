//! Why no plan could be made. Conditions a human can wait out (an
//! unqualified release under a policy that allows a canary) are not errors:
//! they are blockers inside the plan.

use orchestrator_types::{ComponentKind, NodeId, QualificationState, ReleaseId};

/// A plan cannot be made from these inputs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// Blocked releases are refused by every rollout until unblocked.
    #[error("release {release} ({version}) is blocked and may not be rolled out")]
    ReleaseBlocked {
        /// The release.
        release: ReleaseId,
        /// Its version.
        version: String,
    },
    /// A deprecated release has been superseded; rolling it out again is
    /// almost certainly a mistake.
    #[error("release {release} ({version}) is deprecated and may not be rolled out")]
    ReleaseDeprecated {
        /// The release.
        release: ReleaseId,
        /// Its version.
        version: String,
    },
    /// The release is not qualified and the policy does not allow an
    /// unqualified canary.
    #[error(
        "release {release} is {state} and policy {policy} requires a qualified release (missing gates: {})",
        missing_gates.join(", ")
    )]
    NotQualified {
        /// The release.
        release: ReleaseId,
        /// Its state.
        state: QualificationState,
        /// The policy.
        policy: String,
        /// Required gates not passed.
        missing_gates: Vec<String>,
    },
    /// The policy updates a different component kind than the release.
    #[error("policy {policy} updates {policy_kind} firmware but release {release} is {release_kind} firmware")]
    KindMismatch {
        /// The policy.
        policy: String,
        /// Its kind.
        policy_kind: ComponentKind,
        /// The release.
        release: ReleaseId,
        /// Its kind.
        release_kind: ComponentKind,
    },
    /// The release has no image digest the executor could verify.
    #[error("release {release} has sha256 {sha256:?}, which is not 64 hex digits")]
    BadImageDigest {
        /// The release.
        release: ReleaseId,
        /// The digest given.
        sha256: String,
    },
    /// The policy has no waves (validation forbids this; checked again
    /// because the planner must not index into an empty list).
    #[error("policy {policy} has no waves")]
    NoWaves {
        /// The policy.
        policy: String,
    },
    /// The same node id appears twice in the snapshot.
    #[error("node id {node} appears twice in the fleet snapshot")]
    DuplicateNodeId {
        /// The id.
        node: NodeId,
    },
    /// The same hostname appears twice in the snapshot; exclusions by name
    /// would be ambiguous.
    #[error("node name {name:?} appears twice in the fleet snapshot")]
    DuplicateNodeName {
        /// The name.
        name: String,
    },
}
