//! Rollout policies: the YAML format fleet engineers keep in git, its
//! validation with `file:line:col` diagnostics, and the pure queries the
//! planner and engine ask of a policy (is a node targeted, is a window open,
//! how big is a wave).
//!
//! Invariant: this crate does no I/O and depends on no runtime, database or
//! HTTP crate. Reading files and git belongs to the callers
//! (`orchestrator-policy-git`, the CLI).
//!
//! The format is documented in `policies/README.md`, with a JSON Schema
//! beside it.

mod detection;
mod diag;
mod duration;
pub mod exporter;
mod health;
mod lint;
mod model;
mod raw;
mod validate;
mod version_constraint;
mod window;

pub use detection::{DEFAULT_FALSE_PASS, DEFAULT_FALSE_ROLLBACK, Detection, Soak};
pub use diag::{Diagnostic, Position, Severity};
pub use duration::{DurationError, MAX_DURATION_DAYS, format_duration, parse_duration};
pub use health::{
    AlertAction, AlertRule, Direction, GateKind, GateSource, HealthGate, LabelMatcher, MatchOp, MatcherError,
    RedfishMetric,
};
pub use lint::{
    Checked, FileReport, MAX_POLICY_BYTES, PolicyError, check_bytes, check_source, lint_files, parse_policy,
};
pub use model::{
    ApplyTimeRule, Approval, Concurrency, DEFAULT_ALPHA, DEFAULT_DRAIN_TIMEOUT_HOURS, DrainRules, FailureBudget,
    Health, IdPattern, LabelSelector, OnDrainTimeout, Policy, QualificationRules, RollbackPolicy, RollbackScope,
    Target, UpdatePathRule, UpdateRules, VersionRules, Wave, WaveSize, next_window_start, window_open_at,
};
pub use version_constraint::{Comparator, ConstraintError, Op, VersionConstraint};
pub use window::MaintenanceWindow;
