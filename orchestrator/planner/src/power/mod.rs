//! Power analysis of a policy: for each wave and health gate, the smallest
//! regression the wave detects with 80% power at the policy's false-alarm
//! rate, given its canary and control sizes, bake and baselines. Behind
//! `waveguard policy power` and the lint warning for an underpowered canary.
//!
//! The statistics are `orchestrator_detect::power`; the sequential plan,
//! the look schedule and the minimum-events rule are the judge's own
//! (`orchestrator_detect::judging`), so the power quoted is the power of the
//! test that will run. Everything here is pure: the command reads files and
//! hands in plain numbers.

use std::collections::BTreeMap;

use orchestrator_detect::judging::{
    DEFAULT_SPENDING, MIN_CANARY_EVENTS_FOR_FAIL, MIN_LEVEL_UNITS, gate_plan, planned_looks,
};
use orchestrator_detect::power::{PowerLimit, TARGET_POWER};
use orchestrator_detect::{LevelPowerInput, RatePowerInput, level_min_detectable_shift, rate_min_detectable_ratio};
use orchestrator_policy::{GateKind, GateSource, HealthGate, Policy, RedfishMetric, format_duration};
use orchestrator_types::{FirmwareVersion, NodeId, NodeState, QualificationState, ReleaseId};
use serde::Serialize;

mod baselines;

use crate::baseline::lookup;
pub use crate::baseline::{
    BaselineSource, DEFAULT_GPUS_PER_NODE, HISTORY_DAYS, MIN_HISTORY_EVENTS, base_rate, default_baseline,
    history_metric, history_rates, rate_exposure_unit, stated_or_default,
};
pub use crate::soak::{DEFAULT_HOLDBACK_PERCENT, MAX_HOLDBACK_PERCENT, SoakSizing, holdback_nodes, soak_sizing};
pub use baselines::{BaselineError, parse_baselines};

/// A node of a fleet file as the power analysis plans it: only the labels a
/// fleet file carries, so the planner needs no database record to quote power.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FleetNode {
    /// Node name.
    pub name: String,
    /// Platform SKU.
    pub platform: String,
    /// Region label.
    pub region: String,
    /// Cluster label.
    pub cluster: String,
    /// Rack label.
    pub rack: String,
    /// Scale-up (NVLink) domain label.
    pub nvlink_domain: String,
}

/// Why a fleet gives no wave shapes.
#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    /// A version the analysis plans with did not parse.
    #[error("version {text:?}")]
    Version {
        /// The version text.
        text: String,
        /// Why it did not parse.
        #[source]
        source: orchestrator_types::VersionError,
    },
    /// The planner refused the policy or release.
    #[error(transparent)]
    Plan(#[from] crate::PlanError),
    /// Every node was excluded.
    #[error(
        "no node of the fleet is planned under policy {policy:?} ({nodes} node(s): {})",
        if excluded.is_empty() { "none".to_owned() } else { excluded.join(", ") }
    )]
    NothingPlanned {
        /// Policy name.
        policy: String,
        /// Nodes in the fleet.
        nodes: usize,
        /// `<count> <reason code>` per exclusion reason.
        excluded: Vec<String>,
    },
}

/// Baselines given on the command line, by gate name or metric name (a gate
/// name wins over its metric's).
#[derive(Debug, Clone, Default)]
pub struct Baselines {
    /// Event rates per unit exposure, for rate gates.
    pub rates: BTreeMap<String, f64>,
    /// Between-unit standard deviations, for level gates.
    pub sds: BTreeMap<String, f64>,
}

/// What the analysis of a whole policy needs besides the policy.
#[derive(Debug, Clone)]
pub struct PowerOptions {
    /// Given baselines.
    pub baselines: Baselines,
    /// GPUs per node, for per-GPU metrics.
    pub gpus_per_node: u32,
    /// Base rates measured over the fleet's history ([`history_rates`]), by metric name: used for a
    /// rate gate without a given baseline, before the policy's stated one and the default.
    pub history_rates: BTreeMap<String, f64>,
}

impl Default for PowerOptions {
    fn default() -> Self {
        Self {
            baselines: Baselines::default(),
            gpus_per_node: DEFAULT_GPUS_PER_NODE,
            history_rates: BTreeMap::new(),
        }
    }
}

/// A wave as far as power is concerned.
#[derive(Debug, Clone, PartialEq)]
pub struct WaveShape {
    /// Policy wave name.
    pub name: String,
    /// Nodes updated by the wave.
    pub canary_nodes: usize,
    /// Nodes of its control cohort.
    pub control_nodes: usize,
    /// Why there is no control, when `control_nodes` is 0.
    pub no_control_reason: Option<String>,
    /// Bake, seconds.
    pub bake_seconds: i64,
    /// Gates the wave watches (all count for the alpha split).
    pub gates: Vec<String>,
}

/// Whether a gate could be analysed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GateStatus {
    /// Analysed; `mde` is set.
    Ok,
    /// The judge does not evaluate this gate (flash failures).
    NotJudged,
    /// No baseline given and no default for it (Prometheus levels).
    NoBaseline,
    /// The wave has no control cohort, so nothing can be detected.
    NoControl,
}

/// The baseline a gate was analysed with.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BaselineUsed {
    /// Rate per unit exposure (rate gates) or standard deviation (level gates).
    pub value: f64,
    /// `rate` or `sd`.
    pub measure: &'static str,
    /// Where it came from.
    pub source: BaselineSource,
}

/// The minimum detectable effect of a gate at [`TARGET_POWER`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mde {
    /// Rate gates: the canary/control rate ratio; `null` when no ratio up to
    /// 1e12 is detectable.
    pub ratio: Option<f64>,
    /// Rate gates: canary events expected over the bake at that ratio.
    pub expected_canary_events: Option<f64>,
    /// Rate gates: control events expected over the bake.
    pub expected_control_events: Option<f64>,
    /// Level gates: the shift in the metric's unit, harmful direction.
    pub shift: Option<f64>,
    /// `statistics` (sampling noise against the boundaries), `min_events`
    /// (the rule that a Fail needs 3 canary events) or `nothing_detectable`.
    pub limited_by: &'static str,
}

/// One gate of one wave.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GatePower {
    /// Gate name.
    pub gate: String,
    /// `rate` or `level`.
    pub kind: &'static str,
    /// Redfish metric, or `prometheus`.
    pub metric: String,
    /// Whether it could be analysed.
    pub status: GateStatus,
    /// Why not, or a remark.
    pub note: Option<String>,
    /// What a unit is: `gpu` or `node`.
    pub unit: &'static str,
    /// Units in the canary.
    pub canary_units: u64,
    /// Units in the control cohort.
    pub control_units: u64,
    /// Rate gates: the exposure unit (`gpu-hour`, `node-hour`, `node-day`).
    pub exposure_unit: Option<&'static str>,
    /// Rate gates: canary exposure over the whole bake.
    pub canary_exposure: Option<f64>,
    /// Rate gates: control exposure over the whole bake.
    pub control_exposure: Option<f64>,
    /// Looks the judge plans over the bake.
    pub planned_looks: u32,
    /// This gate's share of the policy's alpha (Bonferroni over the wave's gates).
    pub gate_alpha: f64,
    /// The p-value threshold at each look, first to last.
    pub per_look_alpha: Vec<f64>,
    /// The baseline used.
    pub baseline: Option<BaselineUsed>,
    /// The policy's smallest effect that matters.
    pub min_effect: f64,
    /// The effect the policy says the canary must catch.
    pub must_detect: f64,
    /// The minimum detectable effect at 80% power.
    pub mde: Option<Mde>,
    /// Whether the MDE is at most `must_detect`; `null` when not analysed.
    pub detects_must_detect: Option<bool>,
}

/// One wave.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WavePower {
    /// Wave name.
    pub wave: String,
    /// Canary nodes.
    pub canary_nodes: usize,
    /// Control nodes.
    pub control_nodes: usize,
    /// Bake, seconds.
    pub bake_seconds: i64,
    /// Bake, for humans.
    pub bake: String,
    /// Its gates.
    pub gates: Vec<GatePower>,
}

fn fixed_at_judge(gate: &HealthGate) -> Option<(Option<RedfishMetric>, String)> {
    // Mirrors the judge's resolve_gate: what it evaluates and what it holds for a human.
    match (&gate.source, gate.kind) {
        (
            GateSource::Redfish {
                metric: RedfishMetric::FlashFailures,
            },
            _,
        ) => Some((
            Some(RedfishMetric::FlashFailures),
            "flash failures have no control cohort to compare with; the failure budget covers them".into(),
        )),
        _ => None,
    }
}

/// The analysis of one gate in one wave.
pub fn gate_power(policy: &Policy, wave: &WaveShape, gate: &HealthGate, options: &PowerOptions) -> GatePower {
    let metric = match &gate.source {
        GateSource::Redfish { metric } => Some(*metric),
        GateSource::Prometheus { .. } => None,
    };
    let looks = planned_looks(wave.bake_seconds, gate.interval.num_seconds());
    let plan = gate_plan(policy.health.alpha, wave.gates.len().max(1), looks, DEFAULT_SPENDING);
    let gpus = u64::from(options.gpus_per_node.max(1));
    let (unit, per_node, exposure_unit, per_unit_hour) = match (gate.kind, metric) {
        (GateKind::Rate, Some(m)) => {
            let (unit, exposure, per_hour) = rate_exposure_unit(m);
            (unit, if unit == "gpu" { gpus } else { 1 }, Some(exposure), per_hour)
        }
        // A Prometheus rate gate's exposure is series-hours; exporters such
        // as dcgm-exporter publish one series per GPU.
        (GateKind::Rate, None) => ("gpu", gpus, Some("gpu-hour"), 1.0),
        // Redfish levels are judged per GPU; a PromQL query gives a series per node.
        (GateKind::Level, Some(_)) => ("gpu", gpus, None, 0.0),
        (GateKind::Level, None) => ("node", 1, None, 0.0),
    };
    let canary_units = wave.canary_nodes as u64 * per_node;
    let control_units = wave.control_nodes as u64 * per_node;
    let hours = wave.bake_seconds.max(0) as f64 / 3600.0;
    let exposure = |units: u64| exposure_unit.map(|_| units as f64 * hours * per_unit_hour);
    let mut out = GatePower {
        gate: gate.name.clone(),
        kind: gate.kind.as_str(),
        metric: metric.map_or_else(|| "prometheus".to_owned(), |m| m.as_str().to_owned()),
        status: GateStatus::Ok,
        note: None,
        unit,
        canary_units,
        control_units,
        exposure_unit,
        canary_exposure: exposure(canary_units),
        control_exposure: exposure(control_units),
        planned_looks: looks,
        gate_alpha: plan.as_ref().map_or(f64::NAN, |p| p.alpha),
        per_look_alpha: plan
            .as_ref()
            .map(|p| p.looks.iter().map(|l| l.nominal_alpha).collect())
            .unwrap_or_default(),
        baseline: None,
        min_effect: gate.min_effect,
        must_detect: policy.must_detect(&wave.name, gate),
        mde: None,
        detects_must_detect: None,
    };
    if let Some((_, reason)) = fixed_at_judge(gate) {
        out.status = GateStatus::NotJudged;
        out.note = Some(reason);
        return out;
    }
    let found = match (gate.kind, metric) {
        (GateKind::Rate, Some(m)) => base_rate(&options.baselines.rates, &options.history_rates, gate, m),
        (GateKind::Rate, None) => lookup(&options.baselines.rates, gate, None)
            .map(|v| (*v, BaselineSource::Given))
            .or_else(|| stated_or_default(gate, None)),
        (GateKind::Level, _) => lookup(&options.baselines.sds, gate, metric)
            .map(|v| (*v, BaselineSource::Given))
            .or_else(|| stated_or_default(gate, metric)),
    };
    let measure = match gate.kind {
        GateKind::Rate => "rate",
        GateKind::Level => "sd",
    };
    let baseline = match found {
        Some((value, source)) => BaselineUsed { value, measure, source },
        None => {
            out.status = GateStatus::NoBaseline;
            out.note = Some(match gate.kind {
                GateKind::Rate => format!(
                    "no default baseline for a Prometheus query; state `baseline:` on the gate or give --baseline {}=RATE in events per series-hour",
                    gate.name
                ),
                GateKind::Level => format!(
                    "no default baseline for a Prometheus query; state `baseline:` on the gate or give --sd {}=SD in the query's unit",
                    gate.name
                ),
            });
            return out;
        }
    };
    out.baseline = Some(baseline.clone());
    if wave.control_nodes == 0 || wave.canary_nodes == 0 {
        out.status = GateStatus::NoControl;
        out.note = Some(
            wave.no_control_reason
                .clone()
                .unwrap_or_else(|| "the wave has no control cohort".into()),
        );
        return out;
    }
    let plan = match plan {
        Ok(plan) => plan,
        Err(err) => {
            out.status = GateStatus::NoBaseline;
            out.note = Some(format!("no sequential plan: {err}"));
            return out;
        }
    };
    let mde = match gate.kind {
        GateKind::Rate => rate_min_detectable_ratio(
            &RatePowerInput {
                canary_exposure: out.canary_exposure.unwrap_or(0.0),
                control_exposure: out.control_exposure.unwrap_or(0.0),
                baseline_rate: baseline.value,
                min_effect_ratio: gate.min_effect,
                min_canary_events_for_fail: MIN_CANARY_EVENTS_FOR_FAIL,
            },
            &plan,
        )
        .map(|r| Mde {
            ratio: r.min_detectable_ratio,
            expected_canary_events: r.expected_canary_events,
            expected_control_events: Some(r.expected_control_events),
            shift: None,
            limited_by: match (r.min_detectable_ratio, r.limited_by) {
                (None, _) => "nothing_detectable",
                (Some(_), PowerLimit::Statistics) => "statistics",
                (Some(_), PowerLimit::MinEvents) => "min_events",
            },
        }),
        GateKind::Level => level_min_detectable_shift(
            &LevelPowerInput {
                canary_samples: canary_units,
                control_samples: control_units,
                sd: baseline.value,
                min_shift: gate.min_effect,
            },
            &plan,
        )
        .map(|l| Mde {
            ratio: None,
            expected_canary_events: None,
            expected_control_events: None,
            shift: Some(l.min_detectable_shift),
            limited_by: "statistics",
        }),
    };
    match mde {
        Ok(mde) => {
            let value = mde.ratio.or(mde.shift);
            out.detects_must_detect = Some(value.is_some_and(|v| v <= out.must_detect));
            if gate.kind == GateKind::Level && canary_units.min(control_units) < MIN_LEVEL_UNITS {
                out.note = Some(format!(
                    "fewer than {MIN_LEVEL_UNITS} units in a cohort: the gate can fail but never pass"
                ));
            }
            out.mde = Some(mde);
        }
        Err(err) => {
            // Only a bad baseline (validated by the caller) or a zero-length
            // bake gets here; say so rather than quote a number.
            out.status = GateStatus::NoBaseline;
            out.note = Some(format!("cannot compute power: {err}"));
        }
    }
    out
}

/// The analysis of every wave and gate.
pub fn power_table(policy: &Policy, waves: &[WaveShape], options: &PowerOptions) -> Vec<WavePower> {
    waves
        .iter()
        .map(|wave| WavePower {
            wave: wave.name.clone(),
            canary_nodes: wave.canary_nodes,
            control_nodes: wave.control_nodes,
            bake_seconds: wave.bake_seconds,
            bake: chrono::TimeDelta::try_seconds(wave.bake_seconds).map_or_else(String::new, format_duration),
            gates: wave
                .gates
                .iter()
                .filter_map(|name| policy.health.gate(name))
                .map(|gate| gate_power(policy, wave, gate, options))
                .collect(),
        })
        .collect()
}

/// The waves of the plan the planner makes for `policy` on the nodes of a
/// fleet file, as [`WaveShape`]s.
///
/// A fleet file names nodes and their placement but not their firmware, so
/// every node gets one component of the policy's kind (an inventory id the
/// policy's pattern matches) at a version below the release, and the
/// policy's version rules (`from`, downgrades) are set aside: the answer is
/// "if every targeted node needed this update". Nor does it carry labels
/// beyond platform, region, cluster, rack and NVLink domain, so selector
/// keys on other labels are set aside too (returned, for the output).
/// Targeting by platform, the remaining selector and exclusions, wave sizes,
/// caps and control cohorts are the planner's own, and so is the soak's
/// holdback, sized at `base_rates` (measured over history, by metric name;
/// empty for the defaults) as a rollout's plan is.
pub fn fleet_shapes(
    policy: &Policy,
    nodes: &[FleetNode],
    release: Option<&FirmwareVersion>,
    seed: u64,
    base_rates: &BTreeMap<String, f64>,
) -> Result<(Vec<WaveShape>, Vec<String>), ShapeError> {
    use crate::{ComponentSnapshot, FleetSnapshot, NodeHealth, NodeSnapshot, PlanInput, ReleaseSpec};
    let parse = |text: &str| {
        FirmwareVersion::parse(text).map_err(|source| ShapeError::Version {
            text: text.to_owned(),
            source,
        })
    };
    let target = match release {
        Some(v) => v.clone(),
        None => parse("1")?,
    };
    let current = if target.is_equivalent(&parse("0")?) {
        parse("1")?
    } else {
        parse("0")?
    };
    let inventory_id = policy.target.inventory_id.as_ref().map_or_else(
        || format!("{}_0", policy.target.component.as_str().to_ascii_uppercase()),
        |p| p.as_str().replace(['*', '?'], "0"),
    );
    let snapshot = FleetSnapshot {
        nodes: nodes
            .iter()
            .enumerate()
            .map(|(i, n)| NodeSnapshot {
                id: NodeId(i64::try_from(i).unwrap_or(i64::MAX - 1) + 1),
                name: n.name.clone(),
                platform: n.platform.clone(),
                region: n.region.clone(),
                cluster: n.cluster.clone(),
                rack: n.rack.clone(),
                nvlink_domain: n.nvlink_domain.clone(),
                labels: BTreeMap::new(),
                state: NodeState::Active,
                health: NodeHealth::ok(),
                components: vec![ComponentSnapshot {
                    inventory_id: inventory_id.clone(),
                    kind: policy.target.component,
                    version: current.as_str().to_owned(),
                    updateable: true,
                    downgrade_forbidden: false,
                }],
            })
            .collect(),
    };
    let mut policy = policy.clone();
    policy.versions.from = None;
    policy.versions.allow_downgrade = true;
    const FILE_LABELS: [&str; 5] = ["platform", "region", "cluster", "rack", "nvlink_domain"];
    let ignored: Vec<String> = policy
        .target
        .selector
        .keys()
        .filter(|k| !FILE_LABELS.contains(&k.as_str()))
        .cloned()
        .collect();
    policy.target.selector.retain(|k, _| FILE_LABELS.contains(&k.as_str()));
    let release = ReleaseSpec {
        id: ReleaseId(0),
        kind: policy.target.component,
        version: target,
        platforms: policy.target.platforms.clone(),
        image_uri: "power-analysis".into(),
        sha256: "0".repeat(64),
        qualification: QualificationState::Qualified,
        passed_gates: policy.qualification.required_gates.iter().cloned().collect(),
        downgrade_forbidden: None,
        rollback_floor: None,
    };
    let plan = crate::plan(&PlanInput {
        snapshot: &snapshot,
        policy: &policy,
        release: &release,
        seed,
        planned_at: chrono::DateTime::UNIX_EPOCH,
        base_rates,
    })?;
    if plan.waves.is_empty() {
        let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
        for e in &plan.eligibility {
            if let crate::Outcome::Excluded { reason } = &e.outcome {
                *reasons.entry(reason.code()).or_default() += 1;
            }
        }
        return Err(ShapeError::NothingPlanned {
            policy: policy.name.clone(),
            nodes: nodes.len(),
            excluded: reasons.iter().map(|(code, n)| format!("{n} {code}")).collect(),
        });
    }
    let shapes = plan
        .waves
        .iter()
        .map(|w| WaveShape {
            name: w.name.clone(),
            canary_nodes: w.nodes.len(),
            control_nodes: w.control.members().len(),
            no_control_reason: match &w.control {
                crate::ControlPlan::Unavailable { reason } => Some(reason.clone()),
                crate::ControlPlan::Cohort { .. } => None,
            },
            bake_seconds: w.bake_seconds,
            gates: w.gates.clone(),
        })
        .collect();
    Ok((shapes, ignored))
}

/// How an effect reads: `x3.41` for a ratio, `+4.2` for a shift.
pub fn effect_text(kind: &str, value: f64) -> String {
    if kind == "rate" {
        format!("x{}", round2(value))
    } else {
        format!("+{}", round2(value))
    }
}

fn round2(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_owned()
}

/// The canary (first wave) as the lint sees it without a fleet: its `count`
/// and the control the planner would want for it. `None` when its size
/// depends on the fleet (`percent`) or it is not a canary (`rest`).
pub fn canary_without_fleet(policy: &Policy) -> Option<WaveShape> {
    let wave = policy.waves.first()?;
    let orchestrator_policy::WaveSize::Count(n) = wave.size else {
        return None;
    };
    let n = usize::try_from(n).ok()?;
    Some(WaveShape {
        name: wave.name.clone(),
        canary_nodes: n,
        // The planner sizes a control max(wave, MIN_CONTROL_COHORT), capped.
        control_nodes: n.clamp(crate::MIN_CONTROL_COHORT, crate::MAX_CONTROL_COHORT),
        no_control_reason: None,
        bake_seconds: wave.bake.num_seconds(),
        gates: wave.gates.clone(),
    })
}

/// Lint findings for an underpowered canary: `(gate, message)` for every
/// gate of `canary` whose 80%-power MDE (at `options`' baselines, else the
/// policy's stated ones, else the defaults) exceeds its
/// `must_detect`. Gates that cannot be analysed without more input
/// (Prometheus levels, unjudged gates) are skipped.
pub fn canary_findings(policy: &Policy, canary: &WaveShape, options: &PowerOptions) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for gate in canary.gates.iter().filter_map(|g| policy.health.gate(g)) {
        let p = gate_power(policy, canary, gate, options);
        if p.status != GateStatus::Ok || p.detects_must_detect != Some(false) {
            continue;
        }
        let bake = chrono::TimeDelta::try_seconds(canary.bake_seconds).map_or_else(String::new, format_duration);
        let must = effect_text(p.kind, p.must_detect);
        let detects = match p.mde.as_ref().and_then(|m| m.ratio.or(m.shift)) {
            Some(v) => format!("detects {}", effect_text(p.kind, v)),
            None => "detects no rate ratio".to_owned(),
        };
        let unit = if gate.kind == GateKind::Level {
            format!(" {}", p.metric)
        } else {
            String::new()
        };
        let baseline = match p.baseline.as_ref().map(|b| b.source) {
            Some(BaselineSource::Policy) => "the baseline the policy states",
            Some(BaselineSource::Given) => "the given baseline",
            Some(BaselineSource::History) => "the baseline measured over history",
            Some(BaselineSource::Default) | None => "default baselines",
        };
        out.push((
            gate.name.clone(),
            format!(
                "gate {:?}: canary {:?} of {} node(s) {detects}{unit} with {:.0}% power over the {bake} bake \
                 ({baseline}); the policy must catch {must} (must_detect): enlarge the canary or lengthen the \
                 bake, or set must_detect",
                gate.name,
                canary.name,
                canary.canary_nodes,
                TARGET_POWER * 100.0
            ),
        ));
    }
    out
}

/// Time for the fleet-scale method (issue 22) to decide one rate gate in one wave, in hours into the
/// wave's bake: a healthy release ruling out `must_detect`, and releases at several ratios failing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetGateTiming {
    /// Wave name.
    pub wave: String,
    /// Gate name.
    pub gate: String,
    /// The wave's planned bake and `max_bake`, hours.
    pub bake_hours: f64,
    /// See `bake_hours`.
    pub max_bake_hours: f64,
    /// Healthy release: median and p95 hours until the evidence rules out `must_detect` (the wave
    /// passes at the later of this and the bake).
    pub pass_hours: (f64, f64),
    /// Whether the p95 time to pass exceeds `max_bake`: more than 5% of healthy rollouts would hold here.
    pub likely_hold: bool,
    /// `(ratio, median hours, p95 hours)` to fail, for `must_detect` and 1.5x, 2x, 3x, 6x above the null.
    pub catch_hours: Vec<(f64, f64, f64)>,
    /// `(ratio, probability)` that a release at `ratio` has been caught by the end of this wave (the
    /// same ratios as `catch_hours`, on all nodes; `orchestrator_detect::fleet::forecast_catch`, a
    /// seeded Monte Carlo of the method's own processes with every rate gate of the wave: a release
    /// the wave cannot pass holds at `max_bake`, so later waves add nothing). `bench --only detection`
    /// checks these against simulation.
    pub catch_by_end: Vec<(f64, f64)>,
    /// The same, for a release at the same fleet-average ratio concentrated on
    /// [`CONCENTRATED_SHARE`] of the nodes (each of those at `1 + (ratio - 1) / share`), which the
    /// pooled ratio dilutes and the method's node-level look is for.
    pub catch_by_end_concentrated: Vec<(f64, f64)>,
    /// The share of nodes `catch_by_end_concentrated` puts the effect on.
    pub concentrated_share: f64,
    /// Why nothing judges this wave, when nothing does: it leaves no node off the release to be its
    /// control and there is no soak to judge it against a holdback, so its hours add no evidence and
    /// `catch_by_end` and `catch_by_end_concentrated` are empty (a catch can only come from the earlier
    /// waves). `None` for a judged wave.
    pub unjudged: Option<String>,
}

/// The share of nodes a concentrated effect is quoted on (issue 22's benchmark cells: a quarter).
pub const CONCENTRATED_SHARE: f64 = 0.25;

/// [`FleetGateTiming`] for every judged rate gate of every wave, from the fleet's base rates (given or
/// default). Evidence pools across waves: a wave starts with the baseline events its predecessors
/// gathered, each assumed to have baked for the later of its bake and its healthy median (capped at
/// `max_bake`). Counts are assumed Poisson (dispersion 1); bursty metrics take longer, by about their
/// dispersion. `catch_by_end` is not this closed form but a seeded Monte Carlo of the method itself
/// (`forecast_catch`), which the detection bench checks against its simulated fleet. Kept apart from
/// [`power_table`]: it is the fleet-scale method's timing, not the per-wave test's power.
pub fn fleet_timing(policy: &Policy, waves: &[WaveShape], options: &PowerOptions) -> Vec<FleetGateTiming> {
    use orchestrator_detect::fleet::{
        FORECAST_SEEDS, Forecast, ForecastGate, ForecastWave, RateTimingInput, TimedWave, forecast_catch,
        hours_to_catch, hours_to_pass,
    };
    let mut out: Vec<FleetGateTiming> = Vec::new();
    /// One gate in one wave as the forecast needs it.
    struct Row {
        /// Index of its row in `out`.
        out: usize,
        wave: TimedWave,
        alpha: f64,
        beta: f64,
        /// Index of the wave in `waves`.
        wave_index: usize,
        events_per_node_hour: f64,
    }
    // Per gate: its waves as the timing model sees them.
    let mut timed: BTreeMap<String, Vec<Row>> = BTreeMap::new();
    // Per gate: baseline events gathered by earlier waves, and nodes on the release so far.
    let mut prior: BTreeMap<String, f64> = BTreeMap::new();
    let mut updated_nodes = 0usize;
    for (wave_index, wave) in waves.iter().enumerate() {
        updated_nodes += wave.canary_nodes;
        let bake_hours = wave.bake_seconds.max(0) as f64 / 3600.0;
        // The soak is the last policy wave's bake, so it may extend to the soak's `max` (as the
        // engine's `max_bake_seconds` lets it).
        let soak_max = match (&policy.detection.soak, policy.waves.last()) {
            (Some(soak), Some(last)) if last.name == wave.name => soak.max.num_seconds().max(0) as f64 / 3600.0,
            _ => 0.0,
        };
        let max_bake_hours = policy
            .waves
            .iter()
            .find(|w| w.name == wave.name)
            .map_or(bake_hours, |w| w.max_bake.num_seconds().max(0) as f64 / 3600.0)
            .max(soak_max);
        let gates = wave.gates.len().max(1) as f64;
        let alpha = policy.detection.false_rollback / gates;
        let beta = policy.detection.false_pass / gates;
        for gate in wave.gates.iter().filter_map(|name| policy.health.gate(name)) {
            let GateSource::Redfish { metric } = gate.source else {
                continue;
            };
            if gate.kind != GateKind::Rate || fixed_at_judge(gate).is_some() {
                continue;
            }
            let Some((rate, _)) = base_rate(&options.baselines.rates, &options.history_rates, gate, metric) else {
                continue;
            };
            let (unit, _, per_hour) = rate_exposure_unit(metric);
            let per_node = if unit == "gpu" {
                f64::from(options.gpus_per_node.max(1))
            } else {
                1.0
            };
            let events_per_hour = updated_nodes as f64 * per_node * per_hour * rate;
            let must_detect = policy.must_detect(&wave.name, gate);
            let before = prior.get(&gate.name).copied().unwrap_or(0.0);
            let input = RateTimingInput {
                prior_events: before,
                events_per_hour,
                null: gate.min_effect,
                must_detect,
                alpha,
                beta,
                dispersion: 1.0,
            };
            let Ok(pass) = hours_to_pass(&input) else { continue };
            let mut ratios = vec![must_detect];
            ratios.extend(
                [1.5, 2.0, 3.0, 6.0]
                    .into_iter()
                    .filter(|r| *r > gate.min_effect && *r != must_detect),
            );
            let catch_hours = ratios
                .into_iter()
                .filter_map(|r| hours_to_catch(&input, r).ok().map(|h| (r, h.median, h.p95)))
                .collect();
            let baked = pass.median.max(bake_hours).min(max_bake_hours.max(bake_hours));
            prior.insert(gate.name.clone(), before + events_per_hour * baked);
            timed.entry(gate.name.clone()).or_default().push(Row {
                out: out.len(),
                wave: TimedWave {
                    events_per_hour,
                    bake_hours,
                    max_bake_hours: max_bake_hours.max(bake_hours),
                    must_detect,
                },
                alpha,
                beta,
                wave_index,
                events_per_node_hour: per_node * per_hour * rate,
            });
            out.push(FleetGateTiming {
                wave: wave.name.clone(),
                gate: gate.name.clone(),
                bake_hours,
                max_bake_hours,
                pass_hours: (pass.median, pass.p95),
                likely_hold: pass.p95 > max_bake_hours,
                catch_hours,
                catch_by_end: Vec::new(),
                catch_by_end_concentrated: Vec::new(),
                concentrated_share: CONCENTRATED_SHARE,
                unjudged: None,
            });
        }
    }
    // The chance of a catch by each wave's end: the method's own processes simulated on these waves
    // (`forecast_catch`), with every rate gate judged in the same waves, since a wave ends when its
    // slowest gate is ready. The control is every node not yet on the release.
    let fleet_nodes = fleet_size(waves);
    for (name, rows) in &timed {
        let wave_rows: Vec<usize> = rows.iter().map(|r| r.wave_index).collect();
        let together: Vec<&String> = timed
            .iter()
            .filter(|(_, other)| other.iter().map(|r| r.wave_index).eq(wave_rows.iter().copied()))
            .map(|(n, _)| n)
            .collect();
        let mut gates = Vec::new();
        let mut effect_gate = 0;
        for other in together {
            let Some(gate) = policy.health.gate(other) else {
                continue;
            };
            let other_rows = &timed[other];
            let Some(row) = other_rows.first() else { continue };
            if other == name {
                effect_gate = gates.len();
            }
            gates.push(ForecastGate {
                events_per_node_hour: row.events_per_node_hour,
                null: gate.min_effect,
                must_detect: other_rows.iter().map(|r| r.wave.must_detect).collect(),
                alpha: row.alpha,
                beta: row.beta,
                // The engine's judge tempers every rate gate by the control's dispersion.
                dispersion_estimated: true,
            });
        }
        let forecast = Forecast {
            fleet_nodes,
            waves: wave_rows
                .iter()
                .zip(rows)
                .map(|(&w, r)| ForecastWave {
                    nodes: waves[w].canary_nodes,
                    bake_hours: r.wave.bake_hours,
                    max_bake_hours: r.wave.max_bake_hours,
                })
                .collect(),
            gates,
            seeds: FORECAST_SEEDS,
        };
        let Some(first) = rows.first().map(|r| r.out) else {
            continue;
        };
        let ratios: Vec<f64> = out[first].catch_hours.iter().map(|c| c.0).collect();
        for ratio in ratios {
            if let Ok(by_end) = forecast_catch(&forecast, effect_gate, ratio, 1.0) {
                for (row, p) in rows.iter().zip(by_end) {
                    match p {
                        Some(p) => out[row.out].catch_by_end.push((ratio, p)),
                        None => out[row.out].unjudged = Some(unjudged_reason(policy)),
                    }
                }
            }
            if let Ok(by_end) = forecast_catch(&forecast, effect_gate, ratio, CONCENTRATED_SHARE) {
                for (row, p) in rows.iter().zip(by_end) {
                    if let Some(p) = p {
                        out[row.out].catch_by_end_concentrated.push((ratio, p));
                    }
                }
            }
        }
    }
    out
}

/// Why a wave that leaves no control is not judged (`FleetGateTiming::unjudged`).
fn unjudged_reason(policy: &Policy) -> String {
    let why = if policy.detection.soak.is_some() {
        "no node is left off the release to be its control (the soak's holdback is empty)"
    } else {
        "no node is left off the release to be its control and the policy has no soak (detection.soak) to judge \
         it against a holdback"
    };
    format!(
        "nothing judges this wave: {why}; it is decided on the evidence the earlier waves pooled, so an effect \
         confined to its nodes is never seen"
    )
}

/// Nodes the fleet-scale method sees: every wave's nodes, or more when a wave's control is larger than
/// the waves after it (a shape given without its later waves).
fn fleet_size(waves: &[WaveShape]) -> usize {
    let mut updated = 0;
    let mut fleet = waves.iter().map(|w| w.canary_nodes).sum::<usize>();
    for w in waves {
        updated += w.canary_nodes;
        fleet = fleet.max(updated + w.control_nodes);
    }
    fleet
}

/// The lint's power warnings for a policy: `(gate, message)` for each gate whose
/// canary cannot catch its `must_detect` effect. With a fleet the canary and
/// control are what the planner makes of it; a policy the fleet gives no waves
/// is not checked (nothing to say about it), nor is a canary sized by percent
/// without a fleet.
pub fn lint_findings(policy: &Policy, fleet: Option<&[FleetNode]>) -> Vec<(String, String)> {
    let canary = match fleet {
        Some(nodes) => fleet_shapes(policy, nodes, None, 0, &BTreeMap::new())
            .ok()
            .and_then(|(waves, _)| waves.into_iter().next()),
        None => canary_without_fleet(policy),
    };
    canary.map_or_else(Vec::new, |canary| {
        canary_findings(policy, &canary, &PowerOptions::default())
    })
}
