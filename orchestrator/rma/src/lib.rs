//! The RMA pipeline as pure code: vendor criteria, candidate rules, the case state machine, the
//! submission quota, velocity figures, evidence packages and defect-cluster statistics.
//!
//! Invariant: this crate does no I/O and depends on no tokio, reqwest, sea-orm or axum. The
//! collector feeds it observations, the database stores what it returns, the web layer shows it.
//! Its statistics reuse the detector's exact rate test (`orchestrator_detect::stats`), so a
//! cluster report and a rollout verdict read the same way.
//!
//! The method, its references and what it guarantees are in this crate's `README.md`.

pub mod candidate;
pub mod case;
pub mod cluster;
pub mod criteria;
pub mod evidence;
pub mod queue;
pub mod synthetic;
pub mod velocity;

pub use candidate::{
    Candidate, CandidateStatus, FirmwareChange, FirmwareSuspicion, Observation, ObservationKind, PartRecord,
    find_candidates,
};
pub use case::{Actor, Case, CaseError, CaseEvent, CaseState, TransitionRecord, quarantined_nodes};
pub use cluster::{
    Attribute, Cluster, ClusterConfig, ClusterError, ClusterReport, FleetPart, GroupKey, GroupTest, PartFailure, scan,
};
pub use criteria::{
    CheckedCriteria, Condition, Criteria, CriteriaError, CriteriaReport, EvidenceKind, HealthFlag, Quota, Rule,
    Severity, SourceDocument, check_source, lint_files, parse_criteria,
};
pub use evidence::{
    EvidenceError, EvidenceFile, EvidencePackage, Manifest, ManifestEntry, build_package, secret_sweep,
};
pub use queue::{Admission, QuotaError, QuotaStatus, Waiting, queue_order, quota_status, request_submission};
pub use velocity::{Acceptance, StateDays, Velocity, percentile, submissions_of, velocity};
