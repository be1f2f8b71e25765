//! The planner's output: an immutable, serialisable plan. The engine stores
//! it as is and executes it without making choices of its own; a changed
//! plan is a new plan (a new fingerprint), never an edit.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use orchestrator_types::{ComponentKind, FirmwareVersion, NodeId, NodeState, QualificationState, ReleaseId, WaveRole};
use serde::{Deserialize, Serialize};

/// Bumped whenever the algorithm changes what it produces for the same
/// inputs, so a stored plan says which planner made it.
pub const PLAN_FORMAT_VERSION: u32 = 1;

/// A rollout plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// [`PLAN_FORMAT_VERSION`] of the planner that made this plan.
    pub format_version: u32,
    /// sha256 over the inputs (snapshot, policy, release, seed, instant);
    /// equal fingerprints mean the same inputs and hence the same plan.
    pub fingerprint: String,
    /// Policy name.
    pub policy: String,
    /// What is rolled out.
    pub release: ReleaseSummary,
    /// Seed of the stratified shuffles.
    pub seed: u64,
    /// Planning instant (passed in, never read from a clock).
    pub planned_at: DateTime<Utc>,
    /// Whether the rollout can be undone; placed before the waves because a
    /// human must read it before approving the first one.
    pub rollback: RollbackAssessment,
    /// Counts, for the UI's header.
    pub summary: PlanSummary,
    /// Waves in policy order; a wave the eligible nodes do not reach is
    /// left out and named in `notes`.
    pub waves: Vec<WavePlan>,
    /// Every node of the snapshot, planned or excluded with its reason.
    pub eligibility: Vec<NodeEligibility>,
    /// Remarks for humans (empty waves, relaxed caps, short control cohorts).
    pub notes: Vec<String>,
    /// The soak and its holdback (issue 22), when the policy has a `detection.soak`; absent from
    /// plans without one, so their rendering is unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak: Option<SoakPlan>,
}

/// The soak after the last wave: the fleet on the release against a stratified holdback on the old
/// version. The holdback is the plan's last wave ([`orchestrator_types::HOLDBACK_WAVE`]), updated
/// with its own steps once the soak passed; the soak is the bake of the wave before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SoakPlan {
    /// The wave whose bake is the soak (the last wave of the policy the plan reaches).
    pub soak_wave: String,
    /// Shortest soak: the soak wave bakes at least this long (and at least its own bake).
    pub min_seconds: i64,
    /// Longest soak before a hold for a human.
    pub max_seconds: i64,
    /// How the holdback was sized, with the statement `policy lint` and `policy power` print.
    pub sizing: crate::soak::SoakSizing,
    /// The held-back nodes.
    pub holdback: Vec<NodeId>,
}

impl Plan {
    /// The index (into [`Plan::waves`]) of the wave that updates `node`.
    pub fn wave_of(&self, node: NodeId) -> Option<usize> {
        self.waves
            .iter()
            .position(|wave| wave.nodes.iter().any(|n| n.node == node))
    }

    /// Every step of the plan with its wave index and node, in execution
    /// order.
    pub fn steps(&self) -> impl Iterator<Item = (usize, &NodePlan, &StepPlan)> {
        self.waves.iter().enumerate().flat_map(|(i, wave)| {
            wave.nodes
                .iter()
                .flat_map(move |n| n.steps.iter().map(move |s| (i, n, s)))
        })
    }

    /// Exactly which inventory ids the plan's steps push to, grouped: nodes whose steps touch the same
    /// set of ids form one group (a homogeneous fleet is one line), largest group first. What a human
    /// checks before the first flash, so that an ERoT or a host BMC in the list is seen, not flashed.
    pub fn targets(&self) -> Vec<TargetGroup> {
        let mut groups: BTreeMap<Vec<String>, Vec<String>> = BTreeMap::new();
        for wave in &self.waves {
            for node in &wave.nodes {
                let mut ids: Vec<String> = node.steps.iter().map(|s| s.inventory_id.clone()).collect();
                ids.sort();
                ids.dedup();
                groups.entry(ids).or_default().push(node.name.clone());
            }
        }
        let mut out: Vec<TargetGroup> = groups
            .into_iter()
            .map(|(inventory_ids, mut nodes)| {
                nodes.sort();
                TargetGroup {
                    inventory_ids,
                    nodes: nodes.len(),
                    examples: nodes.into_iter().take(TARGET_EXAMPLES).collect(),
                }
            })
            .collect();
        out.sort_by(|a, b| {
            b.nodes
                .cmp(&a.nodes)
                .then_with(|| a.inventory_ids.cmp(&b.inventory_ids))
        });
        out
    }
}

/// Node names shown per [`TargetGroup`]: enough to find one, few enough for 100,000 nodes.
pub const TARGET_EXAMPLES: usize = 3;

/// Nodes whose steps push to the same inventory ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetGroup {
    /// The FirmwareInventory ids each of these nodes' steps push to, sorted.
    pub inventory_ids: Vec<String>,
    /// How many nodes.
    pub nodes: usize,
    /// The first few node names, sorted.
    pub examples: Vec<String>,
}

/// The release as the plan records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReleaseSummary {
    /// Database id.
    pub id: ReleaseId,
    /// Component kind.
    pub kind: ComponentKind,
    /// Target version.
    pub version: FirmwareVersion,
    /// Image location.
    pub image_uri: String,
    /// Image sha256.
    pub sha256: String,
    /// Qualification state when planned.
    pub qualification: QualificationState,
}

/// Node counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanSummary {
    /// Nodes in the snapshot.
    pub nodes: usize,
    /// Nodes planned into a wave.
    pub planned: usize,
    /// Update steps (components) planned.
    pub steps: usize,
    /// Excluded nodes per reason code.
    pub excluded: BTreeMap<String, usize>,
}

/// Can the rollout be rolled back?
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RollbackAssessment {
    /// False when any blocker applies: the UI shows "rollback impossible".
    pub possible: bool,
    /// Why not; empty when possible.
    pub blockers: Vec<RollbackBlocker>,
    /// Whether the policy rolls back without a human.
    pub automatic: bool,
    /// `wave` or `rollout`.
    pub scope: String,
}

/// A reason the planned update cannot be undone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum RollbackBlocker {
    /// Release metadata: once installed, the image refuses older ones.
    ReleaseForbidsDowngrade {
        /// The vendor's reason.
        reason: String,
    },
    /// Release metadata: these nodes update from below the image's
    /// rollback floor, so their previous version cannot be restored.
    BelowRollbackFloor {
        /// The floor.
        floor: FirmwareVersion,
        /// `node/inventory_id` of each affected step.
        steps: Vec<String>,
    },
    /// Components known to refuse older images.
    ComponentForbidsDowngrade {
        /// `node/inventory_id` of each affected step.
        steps: Vec<String>,
    },
}

impl fmt::Display for RollbackBlocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RollbackBlocker::ReleaseForbidsDowngrade { reason } => {
                write!(f, "rollback impossible: the release forbids downgrades ({reason})")
            }
            RollbackBlocker::BelowRollbackFloor { floor, steps } => write!(
                f,
                "rollback impossible: {} component(s) update from below the release's rollback floor {floor}",
                steps.len()
            ),
            RollbackBlocker::ComponentForbidsDowngrade { steps } => write!(
                f,
                "rollback impossible: {} component(s) refuse older images",
                steps.len()
            ),
        }
    }
}

/// How a wave's size was given.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum SizeRule {
    /// A fixed number of nodes.
    Count {
        /// Nodes.
        count: u32,
    },
    /// A percentage of all eligible nodes, rounded up.
    Percent {
        /// Percent.
        percent: f64,
    },
    /// Everything left.
    Rest,
}

/// Who lets a wave start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ApprovalRule {
    /// After the previous wave baked and passed.
    Auto,
    /// Also needs this many distinct approvers.
    Manual {
        /// Distinct approvals.
        approvers: u32,
    },
}

/// Why a planned wave may not start yet. Data, not an error: the UI shows
/// it and the engine waits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum WaveBlocker {
    /// The release may only run the canary until it is qualified.
    AwaitingQualification {
        /// Qualification state when planned.
        state: QualificationState,
        /// Gates the policy requires that the release has not passed.
        missing_gates: Vec<String>,
    },
}

/// The dimensions a wave's blast radius is capped in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapDimension {
    /// A rack (keyed `cluster/rack`).
    Rack,
    /// An NVLink domain (keyed `cluster/domain`).
    NvlinkDomain,
    /// A cluster.
    Cluster,
}

/// The membership caps of one (non-final) wave.
///
/// Interpretation of the policy's `concurrency` block for wave membership:
/// the policy gives in-flight limits (`per_rack: 2` flashes at once), which
/// the engine enforces at run time. The planner additionally keeps each
/// wave from concentrating in one stratum: a wave of `wave_size` nodes
/// drawn from `pool` remaining eligible nodes takes from a stratum with `n`
/// remaining eligible nodes at most
/// `max(ceil(wave_size * n / pool), policy allowance)`, i.e. its fair share
/// rounded up, or what the engine would allow in flight there anyway,
/// whichever is larger. The policy allowance is `per_rack`,
/// `per_nvlink_domain`, or `ceil(per_cluster_percent% of the cluster's
/// nodes in the snapshot)`. A dimension the policy does not cap is not
/// capped here either. The last wave takes every remaining node and has no
/// caps. Every cap is at least the stratum's fair share, so a choice of
/// exactly `wave_size` nodes within all caps always exists (racks and
/// domains are keyed within their cluster; see the `select` module for the
/// argument), and the planner finds one: greedily in stratified order,
/// completed by maximum flow when racks and domains cross. A
/// [`CapRelaxation`] is recorded only if that ever failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaveCaps {
    /// Nodes the wave takes.
    pub wave_size: usize,
    /// Eligible nodes not in an earlier wave when this wave was planned.
    pub pool: usize,
    /// Policy `concurrency.per_rack`.
    pub per_rack: Option<u32>,
    /// Policy `concurrency.per_nvlink_domain`.
    pub per_nvlink_domain: Option<u32>,
    /// Policy `concurrency.per_cluster_percent`.
    pub per_cluster_percent: Option<f64>,
}

impl WaveCaps {
    /// Most nodes the wave may take from one stratum of `dimension` that
    /// has `stratum_pool` eligible nodes left in the pool; `cluster_nodes`
    /// is the stratum's cluster size in the snapshot (used by the
    /// per-cluster percentage). `None`: the policy does not cap this
    /// dimension.
    pub fn limit(&self, dimension: CapDimension, stratum_pool: usize, cluster_nodes: usize) -> Option<usize> {
        let allowance = match dimension {
            CapDimension::Rack => self.per_rack.map(|n| n as usize),
            CapDimension::NvlinkDomain => self.per_nvlink_domain.map(|n| n as usize),
            CapDimension::Cluster => self.per_cluster_percent.map(|pct| {
                // Bounded by the cluster size, so the cast cannot truncate.
                ((cluster_nodes as f64) * pct / 100.0)
                    .ceil()
                    .clamp(0.0, cluster_nodes as f64) as usize
            }),
        }?;
        let fair = if self.pool == 0 {
            0
        } else {
            (self.wave_size.saturating_mul(stratum_pool)).div_ceil(self.pool)
        };
        Some(allowance.max(fair))
    }
}

/// A cap the greedy pass could not keep (only possible with strata that are
/// not nested, e.g. an NVLink domain spanning racks).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapRelaxation {
    /// Which dimension.
    pub dimension: CapDimension,
    /// The stratum key.
    pub stratum: String,
    /// The cap.
    pub limit: usize,
    /// Nodes the wave takes from it.
    pub planned: usize,
}

/// One wave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WavePlan {
    /// Position in the policy (0 is the canary).
    pub index: usize,
    /// Policy wave name.
    pub name: String,
    /// Size as the policy gave it.
    pub size_rule: SizeRule,
    /// Set when the wave may not start yet whatever happens before it.
    pub blocked: Option<WaveBlocker>,
    /// Bake time after the wave's last flash, in seconds.
    pub bake_seconds: i64,
    /// The same, for humans (`24h`).
    pub bake: String,
    /// Who lets the wave start.
    pub approval: ApprovalRule,
    /// Flashes in flight at once in this wave (the lower of the wave's and
    /// the rollout's limit).
    pub max_in_flight: u32,
    /// Health gates evaluated during the bake.
    pub gates: Vec<String>,
    /// Labels the wave was spread across, coarsest first.
    pub stratified_by: Vec<String>,
    /// Membership caps; `None` for the last wave, which takes the rest.
    pub caps: Option<WaveCaps>,
    /// Caps the wave had to exceed to reach its size.
    pub cap_relaxations: Vec<CapRelaxation>,
    /// The nodes, in the order the engine should start them (spread, so
    /// in-flight caps rarely stall it).
    pub nodes: Vec<NodePlan>,
    /// Who the wave's health is compared against.
    pub control: ControlPlan,
    /// The wave's part in the soak, if any (absent for most waves and from older plans).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<WaveRole>,
}

/// One node of a wave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePlan {
    /// Node id.
    pub node: NodeId,
    /// Hostname.
    pub name: String,
    /// Platform.
    pub platform: String,
    /// Cluster.
    pub cluster: String,
    /// Rack.
    pub rack: String,
    /// NVLink domain.
    pub nvlink_domain: String,
    /// The component updates, by inventory id.
    pub steps: Vec<StepPlan>,
    /// Matching components already at the target version (no step).
    pub already_at_target: Vec<String>,
}

/// One component update: everything the executor needs, including what it
/// must find before (precheck) and read back after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepPlan {
    /// FirmwareInventory id.
    pub inventory_id: String,
    /// The version read in the snapshot; precheck expects exactly it.
    pub expected_current: String,
    /// The version to read back after activation. This and the image are the release's, shared by
    /// every step of the plan (a 100,000-node GPU plan has 800,000 steps).
    pub target: Arc<str>,
    /// Image location.
    pub image_uri: Arc<str>,
    /// Image sha256.
    pub image_sha256: Arc<str>,
}

/// A wave's control cohort, or why it has none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ControlPlan {
    /// Comparable nodes that stay on the old version while the wave bakes.
    Cohort {
        /// Nodes wanted in total.
        wanted: usize,
        /// The members.
        members: Vec<ControlMember>,
        /// Comparability classes with fewer controls than wanted.
        shortfalls: Vec<ControlShortfall>,
    },
    /// No comparable node stays on the old version.
    Unavailable {
        /// Why.
        reason: String,
    },
}

impl ControlPlan {
    /// Member nodes (empty when unavailable).
    pub fn members(&self) -> &[ControlMember] {
        match self {
            ControlPlan::Cohort { members, .. } => members,
            ControlPlan::Unavailable { .. } => &[],
        }
    }
}

/// One control node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlMember {
    /// Node id.
    pub node: NodeId,
    /// Hostname.
    pub name: String,
    /// Cluster.
    pub cluster: String,
    /// Where it comes from.
    pub source: ControlSource,
}

/// Where a control node comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ControlSource {
    /// A node of a later wave, still on the old version while this one bakes.
    LaterWave {
        /// That wave's name.
        wave: String,
    },
    /// A healthy active node the rollout does not update.
    OutsideRollout {
        /// Its exclusion reason code.
        excluded: String,
    },
}

/// A comparability class (platform + current versions) short of controls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlShortfall {
    /// Platform.
    pub platform: String,
    /// Current versions of the target components.
    pub versions: Vec<String>,
    /// Wanted.
    pub wanted: usize,
    /// Found.
    pub found: usize,
}

/// One node's fate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEligibility {
    /// Node id.
    pub node: NodeId,
    /// Hostname.
    pub name: String,
    /// Planned or excluded.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// Planned into a wave, or excluded with a reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    /// In a wave.
    Planned {
        /// The wave's name.
        wave: String,
    },
    /// Not updated by this rollout.
    Excluded {
        /// Why.
        reason: ExclusionReason,
    },
}

/// Why a node is not updated. Checked in the order of the variants; the
/// first that applies is reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum ExclusionReason {
    /// The policy does not cover the node's platform.
    PlatformNotTargeted {
        /// The node's platform.
        platform: String,
    },
    /// The release is not built for the node's platform.
    ReleaseNotForPlatform {
        /// The node's platform.
        platform: String,
    },
    /// The node does not match the policy's label selector.
    SelectorMismatch {
        /// The first label that failed.
        label: String,
        /// Values the selector accepts.
        wanted: Vec<String>,
        /// The node's value, if any.
        actual: Option<String>,
    },
    /// The node matches one of the policy's exclusion selectors.
    ExcludedBySelector {
        /// The matching selector.
        selector: BTreeMap<String, Vec<String>>,
    },
    /// The policy excludes the node by name.
    ExcludedByName,
    /// The node has no component of the release's kind.
    NoComponentOfKind {
        /// The kind.
        kind: ComponentKind,
    },
    /// No component of the kind matches the policy's inventory id pattern.
    InventoryIdMismatch {
        /// The pattern.
        pattern: String,
        /// The ids of that kind the node has.
        ids: Vec<String>,
    },
    /// A matching component's version could not be parsed, so the planner
    /// cannot tell an upgrade from a downgrade.
    CurrentVersionUnparseable {
        /// Component.
        inventory_id: String,
        /// The raw version.
        version: String,
    },
    /// Every matching component already runs the target; nothing to do.
    AlreadyAtTarget {
        /// The target version.
        version: String,
    },
    /// The node is quarantined or in maintenance.
    NotActive {
        /// Its state.
        state: NodeState,
    },
    /// An open RMA case holds the node (a part awaits its vendor or a
    /// replacement) until a human verifies or closes it.
    OpenRmaCase {
        /// The case(s), as the planner shows them.
        reason: String,
    },
    /// The last health reading found a problem.
    Unhealthy {
        /// What it said.
        summary: Option<String>,
    },
    /// A component that needs the update is not updateable.
    ComponentNotUpdateable {
        /// Component.
        inventory_id: String,
    },
    /// A component's current version is outside the policy's `from`.
    VersionConstraintNotMet {
        /// Component.
        inventory_id: String,
        /// Its version.
        current: String,
        /// The constraint.
        constraint: String,
    },
    /// The release is older than a component's version and the policy
    /// forbids downgrades.
    DowngradeForbidden {
        /// Component.
        inventory_id: String,
        /// Its version.
        current: String,
        /// The release version.
        target: String,
    },
}

impl ExclusionReason {
    /// Stable code, used for counts.
    pub fn code(&self) -> &'static str {
        match self {
            ExclusionReason::PlatformNotTargeted { .. } => "platform_not_targeted",
            ExclusionReason::ReleaseNotForPlatform { .. } => "release_not_for_platform",
            ExclusionReason::SelectorMismatch { .. } => "selector_mismatch",
            ExclusionReason::ExcludedBySelector { .. } => "excluded_by_selector",
            ExclusionReason::ExcludedByName => "excluded_by_name",
            ExclusionReason::NoComponentOfKind { .. } => "no_component_of_kind",
            ExclusionReason::InventoryIdMismatch { .. } => "inventory_id_mismatch",
            ExclusionReason::CurrentVersionUnparseable { .. } => "current_version_unparseable",
            ExclusionReason::AlreadyAtTarget { .. } => "already_at_target",
            ExclusionReason::NotActive { .. } => "not_active",
            ExclusionReason::OpenRmaCase { .. } => "open_rma_case",
            ExclusionReason::Unhealthy { .. } => "unhealthy",
            ExclusionReason::ComponentNotUpdateable { .. } => "component_not_updateable",
            ExclusionReason::VersionConstraintNotMet { .. } => "version_constraint_not_met",
            ExclusionReason::DowngradeForbidden { .. } => "downgrade_forbidden",
        }
    }
}

impl fmt::Display for ExclusionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExclusionReason::PlatformNotTargeted { platform } => {
                write!(f, "platform {platform} is not targeted by the policy")
            }
            ExclusionReason::ReleaseNotForPlatform { platform } => {
                write!(f, "the release is not built for platform {platform}")
            }
            ExclusionReason::SelectorMismatch { label, wanted, actual } => match actual {
                Some(actual) => write!(f, "label {label}={actual} is not one of {}", wanted.join(", ")),
                None => write!(f, "label {label} is missing (wanted one of {})", wanted.join(", ")),
            },
            ExclusionReason::ExcludedBySelector { selector } => {
                let parts: Vec<String> = selector
                    .iter()
                    .map(|(k, v)| format!("{k} in [{}]", v.join(", ")))
                    .collect();
                write!(f, "excluded by the policy's selector {{{}}}", parts.join(", "))
            }
            ExclusionReason::ExcludedByName => f.write_str("excluded by name in the policy"),
            ExclusionReason::NoComponentOfKind { kind } => write!(f, "no {kind} component in the inventory"),
            ExclusionReason::InventoryIdMismatch { pattern, ids } => {
                write!(f, "no inventory id matches {pattern} (has: {})", ids.join(", "))
            }
            ExclusionReason::CurrentVersionUnparseable { inventory_id, version } => {
                write!(f, "{inventory_id} reports version {version:?}, which cannot be ordered")
            }
            ExclusionReason::AlreadyAtTarget { version } => write!(f, "already at target {version}"),
            ExclusionReason::NotActive { state } => write!(f, "node is {state}, not active"),
            ExclusionReason::OpenRmaCase { reason } => write!(f, "held for RMA: {reason}"),
            ExclusionReason::Unhealthy { summary } => match summary {
                Some(s) => write!(f, "unhealthy: {s}"),
                None => f.write_str("unhealthy"),
            },
            ExclusionReason::ComponentNotUpdateable { inventory_id } => {
                write!(f, "{inventory_id} is not updateable")
            }
            ExclusionReason::VersionConstraintNotMet {
                inventory_id,
                current,
                constraint,
            } => write!(
                f,
                "{inventory_id} runs {current}, outside the policy's `from` ({constraint})"
            ),
            ExclusionReason::DowngradeForbidden {
                inventory_id,
                current,
                target,
            } => write!(
                f,
                "{inventory_id} runs {current}; {target} would be a downgrade, which the policy forbids"
            ),
        }
    }
}
