//! Typed row ids, so a node id can never be passed where a release id is
//! expected.

use serde::{Deserialize, Serialize};

macro_rules! id_type {
    ($(#[$doc:meta] $name:ident),* $(,)?) => {$(
        #[$doc]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub i64);

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }
    )*};
}

id_type!(
    /// A server with a BMC.
    NodeId,
    /// A firmware release.
    ReleaseId,
    /// A rollout of one release under one policy.
    RolloutId,
    /// One wave of a rollout.
    WaveId,
    /// One per-node update (or rollback) step.
    StepId,
    /// A local user.
    UserId,
);
