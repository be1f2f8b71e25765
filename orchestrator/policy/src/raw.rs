//! The policy file exactly as written: serde types that keep the position of
//! every value that a semantic check may need to point at. Validation turns
//! this into the typed [`crate::Policy`].
//!
//! Every struct denies unknown fields so that a typo (`bake_tme`) is an error,
//! not a silently ignored key.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::diag::Position;

pub(crate) type S<T> = Spanned<T>;

/// Where a value was written, for a diagnostic about it.
pub(crate) fn at<T>(s: &S<T>) -> Position {
    Position::from_location(s.referenced, Position::START)
}

/// `label: [values]` as written.
pub(crate) type RawSelector = BTreeMap<String, S<Vec<S<String>>>>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPolicy {
    pub name: S<String>,
    #[serde(default)]
    pub description: Option<String>,
    pub target: S<RawTarget>,
    #[serde(default)]
    pub versions: Option<S<RawVersions>>,
    #[serde(default)]
    pub qualification: Option<S<RawQualification>>,
    pub waves: S<Vec<S<RawWave>>>,
    pub concurrency: S<RawConcurrency>,
    #[serde(default)]
    pub maintenance_windows: Option<S<Vec<S<RawWindow>>>>,
    #[serde(default)]
    pub health: Option<S<RawHealth>>,
    pub failure_budget: S<RawFailureBudget>,
    pub rollback: S<RawRollback>,
    #[serde(default)]
    pub detection: Option<S<RawDetection>>,
    #[serde(default)]
    pub update: Option<S<RawUpdate>>,
}

/// `update:` as written: how images reach the BMCs.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUpdate {
    #[serde(default)]
    pub path: Option<S<UpdatePathRaw>>,
    #[serde(default)]
    pub apply_time: Option<S<ApplyTimeRaw>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum UpdatePathRaw {
    Auto,
    SimpleUpdate,
    MultipartPush,
    HttpPush,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ApplyTimeRaw {
    Auto,
    OnReset,
    Immediate,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTarget {
    pub component: S<String>,
    #[serde(default)]
    pub inventory_id: Option<S<String>>,
    pub platforms: S<Vec<S<String>>>,
    #[serde(default)]
    pub selector: RawSelector,
    #[serde(default)]
    pub exclude: Vec<S<RawSelector>>,
    #[serde(default)]
    pub exclude_nodes: Vec<S<String>>,
}

/// A string or a list of strings; untagged, so the whole value is wrapped in
/// `Spanned` (spans inside untagged enums are lost by serde's buffering).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawVersions {
    #[serde(default)]
    pub from: Option<S<OneOrMany>>,
    #[serde(default)]
    pub allow_downgrade: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawQualification {
    #[serde(default)]
    pub required_gates: Vec<S<String>>,
    #[serde(default)]
    pub allow_unqualified_canary: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawWave {
    pub name: S<String>,
    #[serde(default)]
    pub count: Option<S<i64>>,
    #[serde(default)]
    pub percent: Option<S<f64>>,
    #[serde(default)]
    pub rest: Option<S<bool>>,
    pub bake: S<String>,
    #[serde(default)]
    pub approval: Option<S<ApprovalKind>>,
    #[serde(default)]
    pub approvers: Option<S<i64>>,
    #[serde(default)]
    pub max_in_flight: Option<S<i64>>,
    #[serde(default)]
    pub stratify_by: Vec<S<String>>,
    #[serde(default)]
    pub gates: Option<Vec<S<String>>>,
    #[serde(default)]
    pub max_bake: Option<S<String>>,
    /// `gate: value` overrides of the gates' `must_detect` for this wave.
    #[serde(default)]
    pub must_detect: BTreeMap<String, S<f64>>,
    #[serde(default)]
    pub drain_timeout: Option<S<String>>,
    #[serde(default)]
    pub on_drain_timeout: Option<S<OnDrainTimeoutRaw>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OnDrainTimeoutRaw {
    Skip,
    Hold,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ApprovalKind {
    Auto,
    Manual,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConcurrency {
    pub max_in_flight: S<i64>,
    #[serde(default)]
    pub per_rack: Option<S<i64>>,
    /// Per scale-up domain (an NVLink domain, a Trainium UltraServer).
    #[serde(default)]
    pub per_domain: Option<S<i64>>,
    /// The older name of `per_domain`, kept because policies are users'
    /// code: one written with it keeps its meaning.
    #[serde(default)]
    pub per_nvlink_domain: Option<S<i64>>,
    #[serde(default)]
    pub per_cluster_percent: Option<S<f64>>,
    #[serde(default)]
    pub max_out_of_service_percent: Option<S<f64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawWindow {
    pub cron: S<String>,
    pub duration: S<String>,
    pub timezone: S<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHealth {
    #[serde(default)]
    pub alpha: Option<S<f64>>,
    #[serde(default)]
    pub gates: Vec<S<RawGate>>,
    #[serde(default)]
    pub alerts: Vec<S<RawAlert>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SourceKind {
    Redfish,
    Prometheus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum KindRaw {
    Rate,
    Level,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DirectionRaw {
    IncreaseIsBad,
    DecreaseIsBad,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGate {
    pub name: S<String>,
    pub source: S<SourceKind>,
    #[serde(default)]
    pub metric: Option<S<String>>,
    #[serde(default)]
    pub query: Option<S<String>>,
    pub kind: S<KindRaw>,
    pub direction: S<DirectionRaw>,
    pub min_effect: S<f64>,
    #[serde(default)]
    pub must_detect: Option<S<f64>>,
    #[serde(default)]
    pub baseline: Option<S<f64>>,
    pub interval: S<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ActionRaw {
    Pause,
    Rollback,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAlert {
    pub matchers: S<Vec<S<String>>>,
    pub action: S<ActionRaw>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFailureBudget {
    #[serde(default)]
    pub max_failed: Option<S<i64>>,
    #[serde(default)]
    pub max_failed_percent: Option<S<f64>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ScopeRaw {
    Wave,
    Rollout,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRollback {
    pub automatic: S<bool>,
    pub scope: S<ScopeRaw>,
}

/// The `detection` block as written (validated in [`crate::detection`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDetection {
    #[serde(default)]
    pub false_rollback: Option<S<f64>>,
    #[serde(default)]
    pub false_pass: Option<S<f64>>,
    #[serde(default)]
    pub reset_exclusion: Option<S<String>>,
    #[serde(default)]
    pub pre_period: Option<S<String>>,
    #[serde(default)]
    pub soak: Option<S<RawSoak>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSoak {
    pub min: S<String>,
    pub max: S<String>,
    #[serde(default)]
    pub holdback_percent: Option<S<f64>>,
    #[serde(default)]
    pub detect: Option<S<f64>>,
    #[serde(default)]
    pub power: Option<S<f64>>,
    #[serde(default)]
    pub onset: Option<S<String>>,
}
