//! Reading rollout policies from a git repository with `gix` (no `git`
//! binary), and deciding which version of each policy is in force.
//!
//! The controller pins every rollout to the commit id and the blob id of the
//! policy file it started from; blobs are content-addressed, so a pinned
//! policy can always be read back and a later commit cannot change it.
//!
//! Reading and deciding are blocking (gix is); [`service`], the sync that
//! stores the decision, runs them on a blocking thread.

pub mod service;
mod source;
mod sync;

pub use source::{
    GitPolicySource, GitSourceError, MAX_POLICY_FILES, PolicyFile, RepoLocation, Snapshot, read_blob, redact_url,
};
pub use sync::{CriteriaCandidate, CriteriaPlan, InForce, Rejection, SyncReport, plan_criteria, plan_sync};
