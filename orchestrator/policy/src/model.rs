//! The validated policy: every value parsed and checked, no source positions.
//! This is what the planner, the engine and the detector consume.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, Utc};
use orchestrator_types::{ComponentKind, FirmwareVersion};

use crate::health::{AlertRule, HealthGate};
use crate::version_constraint::VersionConstraint;
use crate::window::MaintenanceWindow;

/// False-alarm rate used by the detector when a policy does not set one.
pub const DEFAULT_ALPHA: f64 = 0.05;

/// A validated rollout policy.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Unique name; rollouts refer to a policy by it.
    pub name: String,
    /// Free text for humans.
    pub description: Option<String>,
    /// Which nodes the policy may touch.
    pub target: Target,
    /// Which current versions may be updated.
    pub versions: VersionRules,
    /// What a release must have passed.
    pub qualification: QualificationRules,
    /// Ordered waves; the last one is [`WaveSize::Rest`].
    pub waves: Vec<Wave>,
    /// Blast-radius limits across the whole rollout.
    pub concurrency: Concurrency,
    /// When new flashes may start; empty means at any time.
    pub maintenance_windows: Vec<MaintenanceWindow>,
    /// Health gates, alert rules and the false-alarm rate.
    pub health: Health,
    /// How many failed updates a wave tolerates.
    pub failure_budget: FailureBudget,
    /// What happens on a regression.
    pub rollback: RollbackPolicy,
    /// Error budgets, soak and holdback of fleet-scale detection.
    pub detection: crate::detection::Detection,
    /// How images reach the BMCs (`update:`, optional).
    pub update: UpdateRules,
}

impl Policy {
    /// What `gate` must rule out for wave `wave` to pass: the wave's own `must_detect` for the gate
    /// when it states one, else the gate's. A wave the policy does not name (the planner's holdback)
    /// takes the gate's.
    pub fn must_detect(&self, wave: &str, gate: &HealthGate) -> f64 {
        self.waves
            .iter()
            .find(|w| w.name == wave)
            .and_then(|w| w.must_detect.get(&gate.name))
            .copied()
            .unwrap_or(gate.must_detect)
    }
}

/// `update:`: which Redfish update path and apply time the steps use. Both default to `auto`: the
/// driver takes the first path the BMC offers that can restrict the update to the step's targets
/// (SimpleUpdate, then multipart push, then HttpPushUri) and prefers `OnReset`, falling back to
/// what the path supports. A value set here is a requirement: a BMC that cannot meet it is refused
/// at `rollout start` (the first wave's BMCs are asked) and its step fails before any push.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UpdateRules {
    /// Only this path; `None` is `auto`.
    pub path: Option<UpdatePathRule>,
    /// Exactly this apply time; `None` is `auto`.
    pub apply_time: Option<ApplyTimeRule>,
}

/// A Redfish update path a policy may require.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdatePathRule {
    /// `UpdateService.SimpleUpdate` (the BMC pulls the image).
    SimpleUpdate,
    /// POST multipart to `MultipartHttpPushUri`.
    MultipartPush,
    /// POST the image to `HttpPushUri`.
    HttpPush,
}

impl UpdatePathRule {
    /// The policy's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            UpdatePathRule::SimpleUpdate => "simple_update",
            UpdatePathRule::MultipartPush => "multipart_push",
            UpdatePathRule::HttpPush => "http_push",
        }
    }
}

/// When a pushed image takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyTimeRule {
    /// At the next reset, which the step issues.
    OnReset,
    /// As soon as the update completes.
    Immediate,
}

/// Label selector: every listed label must have one of the listed values.
pub type LabelSelector = BTreeMap<String, Vec<String>>;

/// Which nodes a policy applies to.
#[derive(Debug, Clone)]
pub struct Target {
    /// Component the releases under this policy update.
    pub component: ComponentKind,
    /// Redfish FirmwareInventory id pattern (`*` and `?` wildcards), e.g.
    /// `HGX_FW_GPU_*`; `None` matches any id of the component.
    pub inventory_id: Option<IdPattern>,
    /// Platforms (server SKUs) the policy covers.
    pub platforms: Vec<String>,
    /// Nodes must match this selector.
    pub selector: LabelSelector,
    /// A node matching any of these selectors is excluded.
    pub exclude: Vec<LabelSelector>,
    /// Hostnames excluded by name.
    pub exclude_nodes: Vec<String>,
}

impl Target {
    /// Whether a node is eligible under this target. Pure, so the planner
    /// can call it on a fleet snapshot.
    pub fn includes_node(&self, hostname: &str, platform: &str, labels: &BTreeMap<String, String>) -> bool {
        self.platforms.iter().any(|p| p == platform)
            && selector_matches(&self.selector, labels)
            && !self.exclude.iter().any(|sel| selector_matches(sel, labels))
            && !self.exclude_nodes.iter().any(|n| n == hostname)
    }
}

fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    selector
        .iter()
        .all(|(key, values)| labels.get(key).is_some_and(|v| values.iter().any(|want| want == v)))
}

/// A glob over FirmwareInventory ids: `*` is any run of characters, `?` one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdPattern(String);

impl IdPattern {
    pub(crate) fn new(pattern: String) -> Self {
        Self(pattern)
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether an inventory id matches the pattern (case-sensitive, as
    /// Redfish ids are).
    pub fn matches(&self, id: &str) -> bool {
        glob_match(self.0.as_bytes(), id.as_bytes())
    }
}

/// Iterative glob matching with single-star backtracking: linear in
/// practice and no recursion, so a hostile pattern cannot blow the stack.
fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == b'?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p.min(pattern.len())..].iter().all(|&c| c == b'*')
}

/// Which current versions may be updated.
#[derive(Debug, Clone)]
pub struct VersionRules {
    /// `None`: any current version.
    pub from: Option<VersionConstraint>,
    /// Whether the target release may be older than the current version.
    pub allow_downgrade: bool,
}

impl VersionRules {
    /// Whether a node at `current` may be moved to `target` under this policy.
    pub fn permits(&self, current: &FirmwareVersion, target: &FirmwareVersion) -> bool {
        let from_ok = self.from.as_ref().is_none_or(|c| c.matches(current));
        let direction_ok = self.allow_downgrade || current.is_equivalent(target) || target > current;
        from_ok && direction_ok
    }
}

/// What a release must have passed.
#[derive(Debug, Clone, Default)]
pub struct QualificationRules {
    /// Qualification gate names that must all have passed.
    pub required_gates: Vec<String>,
    /// Whether a release that is not yet qualified may run the first (canary)
    /// wave; it may never go past it.
    pub allow_unqualified_canary: bool,
}

/// How many nodes a wave takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WaveSize {
    /// A fixed number of nodes.
    Count(u32),
    /// A percentage of the eligible nodes (of the whole rollout, not of
    /// what remains), in (0, 100).
    Percent(f64),
    /// Every eligible node not covered by an earlier wave.
    Rest,
}

impl WaveSize {
    /// Nodes this wave takes, given the rollout's eligible node count and
    /// how many are not yet in an earlier wave. A percentage rounds up so a
    /// small fleet still gets at least one node per wave.
    pub fn nodes(self, eligible: usize, remaining: usize) -> usize {
        let want = match self {
            WaveSize::Count(n) => usize::try_from(n).unwrap_or(usize::MAX),
            WaveSize::Percent(p) => {
                let exact = (eligible as f64) * p / 100.0;
                // Bounded by `eligible`, so the cast cannot truncate.
                exact.ceil().clamp(0.0, eligible as f64) as usize
            }
            WaveSize::Rest => remaining,
        };
        want.min(remaining)
    }
}

/// Who lets a wave start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approval {
    /// Starts when the previous wave has baked and passed its gates.
    Auto,
    /// Additionally needs this many distinct approvers, none of them the
    /// rollout's author (the engine enforces that rule).
    Manual {
        /// Distinct approvals required.
        approvers: u32,
    },
}

/// One wave.
#[derive(Clone)]
pub struct Wave {
    /// Unique within the policy.
    pub name: String,
    /// How many nodes.
    pub size: WaveSize,
    /// How long health is watched after the wave's last flash before the
    /// next wave may start.
    pub bake: TimeDelta,
    /// The longest the bake may extend, on the evidence, before a human decides (>= `bake`; the bake
    /// when the policy does not say, so the wave never extends).
    pub max_bake: TimeDelta,
    /// Auto or manual.
    pub approval: Approval,
    /// Flashes in flight at once within this wave (never above the
    /// fleet-wide limit).
    pub max_in_flight: u32,
    /// Labels the planner spreads the wave's nodes across (e.g. `rack`), so
    /// a canary sees many racks rather than one.
    pub stratify_by: Vec<String>,
    /// Names of the health gates evaluated during this wave's bake.
    pub gates: Vec<String>,
    /// Per gate, the `must_detect` this wave holds the gate to instead of the gate's own (a canary
    /// held to a gross regression, a larger wave to a finer one); absent gates keep theirs. See
    /// [`Policy::must_detect`].
    pub must_detect: BTreeMap<String, f64>,
    /// Draining nodes through their workload scheduler before the flash.
    pub drain: DrainRules,
}

/// Written out so that a wave without its own `must_detect` reads as it did before the key existed:
/// the plan fingerprint hashes this text, and a policy that does not use the key must keep its
/// fingerprint.
impl std::fmt::Debug for Wave {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = f.debug_struct("Wave");
        s.field("name", &self.name)
            .field("size", &self.size)
            .field("bake", &self.bake)
            .field("max_bake", &self.max_bake)
            .field("approval", &self.approval)
            .field("max_in_flight", &self.max_in_flight)
            .field("stratify_by", &self.stratify_by)
            .field("gates", &self.gates);
        if !self.must_detect.is_empty() {
            s.field("must_detect", &self.must_detect);
        }
        s.field("drain", &self.drain).finish()
    }
}

/// How long a wave waits for a drained node to empty, and what then.
/// Only used where a scheduler is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainRules {
    /// Longest wait for a node's jobs to finish after its drain.
    pub timeout: TimeDelta,
    /// What to do with a node still busy after `timeout`.
    pub on_timeout: OnDrainTimeout,
}

/// Default `drain_timeout`: long enough for typical batch jobs to end,
/// short enough that a wave does not stall for a day on one long job.
pub const DEFAULT_DRAIN_TIMEOUT_HOURS: i64 = 4;

impl Default for DrainRules {
    fn default() -> Self {
        Self {
            timeout: TimeDelta::hours(DEFAULT_DRAIN_TIMEOUT_HOURS),
            on_timeout: OnDrainTimeout::Skip,
        }
    }
}

/// What happens to a node that does not empty within `drain_timeout`.
/// Neither counts against the failure budget: a busy node is not a
/// firmware failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDrainTimeout {
    /// Resume it (Waveguard drained it) and leave it out of this wave.
    Skip,
    /// Keep it drained and hold the wave for a human.
    Hold,
}

/// Blast-radius limits.
#[derive(Clone, PartialEq)]
pub struct Concurrency {
    /// Flashes in flight across the rollout.
    pub max_in_flight: u32,
    /// Per rack.
    pub per_rack: Option<u32>,
    /// Per scale-up domain: the nodes one accelerator fabric joins (an
    /// NVLink domain, a Trainium UltraServer), named by the node's domain
    /// label (`nvlink_domain` in the fleet file). One bad flash in a domain
    /// takes the whole domain's jobs down, so this bounds the blast radius
    /// where racks do not. Policy key `per_domain`, or its older name
    /// `per_nvlink_domain` with the same meaning.
    pub per_domain: Option<u32>,
    /// Percent of a cluster's nodes, in (0, 100].
    pub per_cluster_percent: Option<f64>,
    /// Percent of a cluster's GPUs out of service at once (drained,
    /// draining or flashing), in (0, 100]; counts drains, not only flashes.
    pub max_out_of_service_percent: Option<f64>,
}

/// Written by hand to keep the field's historical name: the planner's plan
/// fingerprint hashes this text, and renaming `per_nvlink_domain` to
/// `per_domain` must not change the fingerprint of an unchanged policy.
impl std::fmt::Debug for Concurrency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Concurrency")
            .field("max_in_flight", &self.max_in_flight)
            .field("per_rack", &self.per_rack)
            .field("per_nvlink_domain", &self.per_domain)
            .field("per_cluster_percent", &self.per_cluster_percent)
            .field("max_out_of_service_percent", &self.max_out_of_service_percent)
            .finish()
    }
}

/// Health gates and alert rules.
#[derive(Debug, Clone)]
pub struct Health {
    /// False-alarm rate the detector uses for every gate, in (0, 0.5].
    pub alpha: f64,
    /// The gates, by unique name.
    pub gates: Vec<HealthGate>,
    /// Alertmanager rules.
    pub alerts: Vec<AlertRule>,
}

impl Health {
    /// Looks a gate up by name.
    pub fn gate(&self, name: &str) -> Option<&HealthGate> {
        self.gates.iter().find(|g| g.name == name)
    }
}

/// How many failed updates a wave tolerates before it halts. Independently
/// of this budget, any bricked BMC halts the rollout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FailureBudget {
    /// At most this many failed updates per wave (0: the first failure halts).
    Count(u32),
    /// At most this percentage of the wave's nodes.
    Percent(f64),
}

impl FailureBudget {
    /// Whether `failed` failures in a wave of `wave_nodes` nodes exceed the
    /// budget.
    pub fn exceeded(self, failed: usize, wave_nodes: usize) -> bool {
        match self {
            FailureBudget::Count(n) => failed > usize::try_from(n).unwrap_or(usize::MAX),
            FailureBudget::Percent(p) => (failed as f64) > (wave_nodes as f64) * p / 100.0,
        }
    }
}

/// What a rollback undoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RollbackScope {
    /// Only the nodes of the failing wave.
    Wave,
    /// Every node the rollout updated.
    Rollout,
}

/// What happens on a regression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RollbackPolicy {
    /// Roll back without a human; otherwise the rollout pauses and pages.
    pub automatic: bool,
    /// What is rolled back.
    pub scope: RollbackScope,
}

/// Whether new flashes may start at `at` under `policy`. A policy without
/// windows is always open (the lint warns about that).
pub fn window_open_at(policy: &Policy, at: DateTime<Utc>) -> bool {
    policy.maintenance_windows.is_empty() || policy.maintenance_windows.iter().any(|w| w.open_until(at).is_some())
}

/// When the next window opens strictly after `at`, for "waiting on:
/// maintenance window opens 02:00 UTC" blockers. `None` for a policy without
/// windows (never blocked) or whose schedules never fire again.
pub fn next_window_start(policy: &Policy, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
    policy
        .maintenance_windows
        .iter()
        .filter_map(|w| w.next_start_after(at))
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_patterns() {
        let cases = [
            ("HGX_FW_GPU_*", "HGX_FW_GPU_SXM_1", true),
            ("HGX_FW_GPU_*", "HGX_FW_NVSwitch_0", false),
            ("BMC_Firmware", "BMC_Firmware", true),
            ("*_GPU_?", "HGX_GPU_3", true),
            ("*_GPU_?", "HGX_GPU_13", false),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
            ("*", "", true),
        ];
        for (pattern, id, expected) in cases {
            assert_eq!(IdPattern::new(pattern.into()).matches(id), expected, "{pattern} {id}");
        }
    }

    #[test]
    fn wave_sizes_round_up_and_stop_at_remaining() {
        assert_eq!(WaveSize::Count(8).nodes(1000, 1000), 8);
        assert_eq!(WaveSize::Count(8).nodes(5, 5), 5);
        assert_eq!(WaveSize::Percent(10.0).nodes(1000, 992), 100);
        assert_eq!(WaveSize::Percent(10.0).nodes(5, 5), 1);
        assert_eq!(WaveSize::Percent(50.0).nodes(1000, 100), 100);
        assert_eq!(WaveSize::Rest.nodes(1000, 392), 392);
    }

    #[test]
    fn failure_budget() {
        assert!(!FailureBudget::Count(0).exceeded(0, 10));
        assert!(FailureBudget::Count(0).exceeded(1, 10));
        assert!(!FailureBudget::Percent(10.0).exceeded(1, 10));
        assert!(FailureBudget::Percent(10.0).exceeded(2, 10));
    }

    #[test]
    fn target_selection() {
        let target = Target {
            component: ComponentKind::Gpu,
            inventory_id: None,
            platforms: vec!["hgx-h100".into()],
            selector: [("region".to_owned(), vec!["us-east".to_owned()])].into(),
            exclude: vec![[("rack".to_owned(), vec!["r9".to_owned()])].into()],
            exclude_nodes: vec!["gpu-007".into()],
        };
        let labels = |region: &str, rack: &str| -> BTreeMap<String, String> {
            [
                ("region".to_owned(), region.to_owned()),
                ("rack".to_owned(), rack.to_owned()),
            ]
            .into()
        };
        assert!(target.includes_node("gpu-001", "hgx-h100", &labels("us-east", "r1")));
        assert!(!target.includes_node("gpu-001", "hgx-b200", &labels("us-east", "r1")));
        assert!(!target.includes_node("gpu-001", "hgx-h100", &labels("eu-west", "r1")));
        assert!(!target.includes_node("gpu-001", "hgx-h100", &labels("us-east", "r9")));
        assert!(!target.includes_node("gpu-007", "hgx-h100", &labels("us-east", "r1")));
    }

    #[test]
    fn version_rules_refuse_downgrades_unless_allowed() {
        let v = |s: &str| FirmwareVersion::parse(s).unwrap();
        let mut rules = VersionRules {
            from: Some(VersionConstraint::parse(">= 1.0").unwrap()),
            allow_downgrade: false,
        };
        assert!(rules.permits(&v("1.0"), &v("1.1")));
        assert!(!rules.permits(&v("1.1"), &v("1.0")));
        assert!(!rules.permits(&v("0.9"), &v("1.1")), "current version outside `from`");
        rules.allow_downgrade = true;
        assert!(rules.permits(&v("1.1"), &v("1.0")));
    }
}
