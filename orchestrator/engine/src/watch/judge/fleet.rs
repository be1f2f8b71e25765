//! Fleet-scale detection in the live engine (issue 22): the judge's path for a policy with a
//! `detection:` block. The statistics are `orchestrator_detect::fleet`'s; this module decides who is
//! watched, turns stored samples into concurrent stratified cells, records each look once and maps
//! the decision onto the wave's verdict.
//!
//! - **Who is watched.** Updated: every node of this rollout whose update succeeded in this wave or
//!   an earlier one (evidence carries across waves), from its flash plus the policy's
//!   `reset_exclusion` (earlier waves' nodes from this wave's bake start: their earlier hours are in
//!   their own wave's samples already). Control: every node of a later wave of this rollout not
//!   touched yet that is still eligible now — active (not in maintenance, not quarantined), no open
//!   RMA case, not touched by another unfinished rollout, not drained — from the bake start.
//! - **Cells.** One per closed hour and stratum (platform, cluster); each compares only the updated
//!   and control nodes of that hour and stratum, so a fleet-wide event cancels and an early-updated
//!   node is never compared with a later-updated one. Only closed hours count, so a bin is observed
//!   whole; the process is rebuilt from the stored samples at each look.
//! - **A look is spent once.** Look `k` falls `k` gate intervals after the bake start; each gate's
//!   look is recorded (`health_looks`, with its [`FleetGateLook`]) before the wave acts on it, and a
//!   recorded look is read back, never recomputed, so a restart or a failover replays the same
//!   decision.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Duration, Utc};
use orchestrator_db::execution::{ExecRollout, ExecWave, StepFilter, StepPurpose, StepState};
use orchestrator_db::health::{Cohort, HealthLook, HealthSample, LevelAgg, NewHealthLook, SampleScope, window_start};
use orchestrator_db::{Db, DbError};
use orchestrator_detect::fleet::{
    ErrorBudget, FleetError, GateLook as DetectGateLook, LevelBatch, LevelEConfig, LevelEProcess, MIN_HETEROGENEITY,
    NodeCount, NodeLevel, NodeMixtureProcess, NodeObservation, RateCell, RateEConfig, RateEProcess, WaveDecision,
    WaveTiming, decide_wave, level_batches_with_pre_period, node_heterogeneity, quasi_poisson_dispersion,
};
use orchestrator_policy::{Direction, GateKind, GateSource, HealthGate, Policy, RedfishMetric};
use orchestrator_types::{
    FleetCohort, FleetEvidence, FleetGateLook, FleetNodeLook, NodeId, NodeInError, NodeState, Outcome, StepId,
    WaveRole, WaveVerdict,
};
use serde_json::json;

use super::{DETECTOR_ACTOR, DetectorJudge, Gate};
use crate::metric_source::{MetricSource, PrometheusSource, SourceLook, WatchedNode, bin_start};
use crate::watch::collector::{Member, canary_exposure_start};

/// Width of a time bin: the stored sample windows are hourly.
const BIN: Duration = Duration::hours(1);

/// The longest a wave of `policy` may bake, in seconds: the policy wave's `max_bake` (never less
/// than the stored bake; the bake itself when the policy names no such wave). The soak wave may
/// also run to the soak's `max`: its bake is the soak.
pub fn max_bake_seconds(policy: &Policy, wave: &ExecWave) -> i64 {
    let soak_max = match (&policy.detection.soak, wave.role) {
        (Some(soak), Some(WaveRole::Soak)) => soak.max.num_seconds(),
        _ => 0,
    };
    policy
        .waves
        .iter()
        .find(|w| w.name == wave.name)
        .map_or(wave.bake_seconds, |w| w.max_bake.num_seconds())
        .max(soak_max)
        .max(wave.bake_seconds)
        .max(0)
}

/// The nodes fleet-scale detection watches for one wave.
#[derive(Debug, Default)]
pub(crate) struct FleetWatch {
    pub(crate) members: Vec<Member>,
    /// Every node of the fleet to its stratum (platform, cluster).
    pub(crate) strata: HashMap<NodeId, u32>,
    /// Strata with a watched node.
    pub(crate) strata_watched: usize,
    /// Updated nodes and the wave of their update.
    pub(crate) updated: BTreeMap<NodeId, orchestrator_types::WaveId>,
    pub(crate) control: BTreeSet<NodeId>,
    /// Each wave's bake start, for the waves that have baked or bake now.
    pub(crate) bake_starts: HashMap<orchestrator_types::WaveId, DateTime<Utc>>,
}

/// Why a node planned for a later wave is not a control now, or `None` when it is one.
pub(crate) fn control_exclusion(
    state: NodeState,
    rma_case: Option<&str>,
    other_rollout: bool,
    drained: bool,
) -> Option<&'static str> {
    if state == NodeState::Maintenance {
        Some("in maintenance")
    } else if state == NodeState::Quarantined {
        Some("quarantined")
    } else if rma_case.is_some() {
        Some("open RMA case")
    } else if other_rollout {
        Some("under another rollout")
    } else if drained {
        Some("drained")
    } else {
        None
    }
}

/// Who is watched for `wave`; see the module documentation.
pub(crate) async fn fleet_watch(
    db: &Db,
    rollout: &ExecRollout,
    wave: &ExecWave,
    bake_start: DateTime<Utc>,
    reset_exclusion: Duration,
    before_flash: bool,
) -> Result<FleetWatch, DbError> {
    let waves = db.rollout_waves(rollout.id).await?;
    let positions: HashMap<orchestrator_types::WaveId, i32> = waves.iter().map(|w| (w.id, w.position)).collect();
    let mut bake_starts: HashMap<orchestrator_types::WaveId, DateTime<Utc>> =
        waves.iter().filter_map(|w| Some((w.id, w.bake_started_at?))).collect();
    bake_starts.insert(wave.id, bake_start);
    // Outlines, not whole rows: a look at a 100,000-node rollout reads a few columns of each step
    // and node, not their targets, errors and labels.
    let steps = db
        .step_outlines(&StepFilter {
            rollout_id: Some(rollout.id),
            purpose: Some(StepPurpose::Update),
            ..Default::default()
        })
        .await?;
    let drains: HashMap<StepId, orchestrator_db::drains::DrainRow> = db
        .rollout_drains(rollout.id)
        .await?
        .into_iter()
        .map(|d| (d.step_id, d))
        .collect();
    let open_drain: BTreeSet<NodeId> = drains
        .values()
        .filter(|d| d.closed_at.is_none())
        .map(|d| d.node_id)
        .collect();
    // Nodes another unfinished rollout has touched (in flight, flashed or failed) are not comparable.
    let mut elsewhere: BTreeSet<NodeId> = BTreeSet::new();
    for other in db.unfinished_rollouts().await? {
        if other.id == rollout.id {
            continue;
        }
        elsewhere.extend(db.touched_nodes(other.id).await?);
    }
    let rma = db.rma_holds().await?;
    // By id, so strata are numbered in the same order at every look.
    let outlines = db.node_outlines().await?;
    let mut strata_keys: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    let mut strata = HashMap::new();
    for node in &outlines {
        let next = u32::try_from(strata_keys.len()).unwrap_or(u32::MAX);
        let key = (node.platform_sku.as_str(), node.cluster.as_str());
        strata.insert(node.address.id, *strata_keys.entry(key).or_insert(next));
    }
    let nodes: HashMap<NodeId, &orchestrator_db::model::NodeOutline> =
        outlines.iter().map(|n| (n.address.id, n)).collect();

    let mut watch = FleetWatch {
        strata,
        bake_starts,
        ..Default::default()
    };
    let mut later: BTreeSet<NodeId> = BTreeSet::new();
    let mut touched: BTreeSet<NodeId> = BTreeSet::new();
    for step in &steps {
        let position = positions.get(&step.wave_id).copied().unwrap_or(i32::MAX);
        if step.state != StepState::Pending {
            touched.insert(step.node_id);
        }
        // Before the wave's first flash its own nodes are watched like the controls: not touched
        // yet, and their hours now are their pre-period.
        if position > wave.position || (before_flash && position == wave.position) {
            later.insert(step.node_id);
            continue;
        }
        if step.state != StepState::Succeeded || watch.updated.contains_key(&step.node_id) {
            continue;
        }
        let Some(node) = nodes.get(&step.node_id) else { continue };
        let start = if step.wave_id == wave.id {
            match canary_exposure_start(step.finished_at, drains.get(&step.id), bake_start) {
                Some(start) => start,
                // Kept quarantined by Waveguard: out of service, no exposure.
                None => continue,
            }
        } else {
            bake_start
        };
        // The reset rule: the hours right after a node's flash count on neither side.
        let start = step.finished_at.map_or(start, |f| start.max(f + reset_exclusion));
        watch.updated.insert(step.node_id, step.wave_id);
        watch
            .members
            .push(Member::of(node.address.clone(), Cohort::Canary, start));
    }
    for node_id in later {
        if touched.contains(&node_id) || watch.updated.contains_key(&node_id) {
            continue;
        }
        let Some(node) = nodes.get(&node_id) else { continue };
        let excluded = control_exclusion(
            node.state,
            rma.get(&node.address.name).map(String::as_str),
            elsewhere.contains(&node_id),
            open_drain.contains(&node_id),
        );
        if let Some(reason) = excluded {
            tracing::debug!(node = %node.address.name, wave = %wave.name, reason, "not a control");
            continue;
        }
        watch.control.insert(node_id);
        watch
            .members
            .push(Member::of(node.address.clone(), Cohort::Control, bake_start));
    }
    watch.strata_watched = watch
        .members
        .iter()
        .filter_map(|m| watch.strata.get(&m.node.id))
        .collect::<BTreeSet<_>>()
        .len();
    Ok(watch)
}

/// A gate's stratified hourly cells (closed bin start -> stratum -> cell) and each control node's
/// own count (for the dispersion).
#[derive(Debug, Default)]
pub(crate) struct Cells {
    bins: BTreeMap<DateTime<Utc>, BTreeMap<u32, RateCell>>,
    controls: BTreeMap<NodeId, NodeCount>,
}

/// One node-hour of a rate gate.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeHour {
    pub(crate) node: NodeId,
    pub(crate) stratum: u32,
    pub(crate) cohort: Cohort,
    pub(crate) bin: DateTime<Utc>,
    pub(crate) events: u64,
    pub(crate) exposure: f64,
}

impl Cells {
    /// Adds one node-hour to its cell and, for a control node, to its own count.
    pub(crate) fn add(&mut self, h: NodeHour) {
        let cell = self.bins.entry(h.bin).or_default().entry(h.stratum).or_default();
        match h.cohort {
            Cohort::Canary => {
                cell.updated_events = cell.updated_events.saturating_add(h.events);
                cell.updated_exposure += h.exposure;
            }
            Cohort::Control => {
                cell.control_events = cell.control_events.saturating_add(h.events);
                cell.control_exposure += h.exposure;
                let count = self.controls.entry(h.node).or_insert(NodeCount {
                    stratum: h.stratum,
                    events: 0,
                    exposure: 0.0,
                });
                count.events = count.events.saturating_add(h.events);
                count.exposure += h.exposure;
            }
        }
    }
}

/// What a rate gate's evidence says at one look.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RateFacts {
    pub(crate) fail: bool,
    pub(crate) pass_ready: bool,
    pub(crate) failed_from_bin: Option<u32>,
    pub(crate) lower: f64,
    pub(crate) upper: f64,
    pub(crate) estimate: Option<f64>,
    pub(crate) dispersion: f64,
    pub(crate) totals: (u64, f64, u64, f64),
    pub(crate) control_nodes: usize,
}

/// Runs a rate gate's e-process over the cells, hour by hour (an hour without data is still a bin,
/// so the delayed-onset restarts keep their cadence in hours), with the dispersion of the control's
/// node counts.
pub(crate) fn rate_facts(
    cells: &Cells,
    null: f64,
    must_detect: f64,
    alpha: f64,
    beta: f64,
) -> Result<RateFacts, FleetError> {
    let (bins, controls) = (&cells.bins, &cells.controls);
    // The node-level look ([`node_look`]) takes its share of the budget from the fresh processes, as
    // in the bench (`fleet::sim`) and the forecast `policy power` quotes.
    let mut process = RateEProcess::new(RateEConfig::with_node_look());
    if let (Some(first), Some(last)) = (bins.keys().next(), bins.keys().next_back()) {
        let mut at = *first;
        while at <= *last {
            let cells: Vec<RateCell> = bins.get(&at).map(|c| c.values().copied().collect()).unwrap_or_default();
            process.observe_bin(&cells)?;
            at += BIN;
        }
    }
    let counts: Vec<NodeCount> = controls.values().copied().collect();
    let dispersion = quasi_poisson_dispersion(&counts).unwrap_or(1.0);
    let look = process.look(null, must_detect, alpha, beta, dispersion)?;
    let (lower, upper) = process.bounds(alpha, beta, dispersion);
    Ok(RateFacts {
        fail: look.fail,
        pass_ready: look.pass_ready,
        failed_from_bin: look.failed_from_bin,
        lower,
        upper,
        estimate: process.estimate(),
        dispersion,
        totals: process.totals(),
        control_nodes: controls.len(),
    })
}

/// A rate gate's node-level look ([`NodeMixtureProcess`]) over the same cells: each updated node's
/// events against its expected count under the null, given its cells' totals, with the spread of node
/// rates estimated from the controls' own counts. `each_updated` visits every updated node-hour of the
/// cells (a second pass over the data the cells were built from), so the look keeps one pair of
/// numbers per updated node, never a list per hour.
///
/// It is evaluated at the engine's looks (one per gate interval), the bench at every hour with an
/// updated node's event: with hourly gates the same looks, since the evidence can first cross its
/// boundary only at such an hour. Any look time keeps the level (Ville's inequality).
pub(crate) fn node_look(
    cells: &Cells,
    each_updated: impl FnOnce(&mut dyn FnMut(NodeHour)),
    null: f64,
    alpha: f64,
) -> Result<FleetNodeLook, FleetError> {
    let mut process = NodeMixtureProcess::new(null)?;
    // Dense indices for the process; node ids are database keys.
    let mut index: HashMap<NodeId, u32> = HashMap::new();
    let mut failure = None;
    each_updated(&mut |h| {
        if h.cohort != Cohort::Canary || failure.is_some() {
            return;
        }
        let Some(cell) = cells.bins.get(&h.bin).and_then(|b| b.get(&h.stratum)) else {
            return;
        };
        let next = u32::try_from(index.len()).unwrap_or(u32::MAX);
        let node = *index.entry(h.node).or_insert(next);
        let observation = NodeObservation {
            node,
            events: h.events,
            exposure: h.exposure,
        };
        if let Err(err) = process.observe_node(cell, observation) {
            failure = Some(err);
        }
    });
    if let Some(err) = failure {
        return Err(err);
    }
    let counts: Vec<NodeCount> = cells.controls.values().copied().collect();
    // Without control events there is no spread to estimate; the look's floor applies.
    let heterogeneity = node_heterogeneity(&counts).unwrap_or(0.0).max(MIN_HETEROGENEITY);
    let level = RateEConfig::with_node_look().node_look_level(alpha);
    let fail = process.fails(level, heterogeneity)?;
    Ok(FleetNodeLook {
        nodes: process.nodes(),
        ln_evidence: finite(process.ln_evidence(heterogeneity)),
        ln_threshold: (1.0 / level).ln(),
        level,
        heterogeneity,
        fail,
    })
}

/// Where a rate gate's node-hours come from at one look.
enum RateHours<'a> {
    /// Prometheus' own history of every watched node (one query), with each node's cohort.
    Prometheus {
        look: SourceLook,
        cohorts: HashMap<NodeId, Cohort>,
    },
    /// The collector's stored samples of the gate's metric.
    Stored { samples: &'a [GateSample] },
}

impl RateHours<'_> {
    /// Visits every closed node-hour (a bin is observed whole), in the data's own order, so a look
    /// rebuilt from the same data visits the same hours.
    fn each(&self, now: DateTime<Utc>, strata: &HashMap<NodeId, u32>, f: &mut dyn FnMut(NodeHour)) {
        let closed = |window: DateTime<Utc>| window + BIN <= now;
        let stratum = |node: &NodeId| strata.get(node).copied().unwrap_or(u32::MAX);
        match self {
            RateHours::Prometheus { look, cohorts } => {
                for (node, node_bins) in &look.bins {
                    let Some(cohort) = cohorts.get(node).copied() else {
                        continue;
                    };
                    for (start, bin) in node_bins.iter().filter(|(s, _)| closed(bin_start(**s))) {
                        f(NodeHour {
                            node: *node,
                            stratum: stratum(node),
                            cohort,
                            bin: bin_start(*start),
                            events: bin.events,
                            exposure: bin.exposure_hours,
                        });
                    }
                }
            }
            RateHours::Stored { samples } => {
                for s in samples.iter().filter(|s| closed(s.window_start)) {
                    f(NodeHour {
                        node: s.node_id,
                        stratum: stratum(&s.node_id),
                        cohort: s.cohort,
                        bin: s.window_start,
                        events: s.events,
                        exposure: s.exposure,
                    });
                }
            }
        }
    }
}

/// What a look reads of one stored sample of its gate's metric. A stored sample carries every unit's
/// readings (eight GPUs' aggregates, each under its own name); a look needs the node's one level, so
/// the judge keeps this instead and a look over 100,000 nodes holds ~50 bytes a node-hour, not ~1 KB.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct GateSample {
    pub wave_id: orchestrator_types::WaveId,
    pub node_id: NodeId,
    pub cohort: Cohort,
    pub window_start: DateTime<Utc>,
    pub events: u64,
    pub exposure: f64,
    /// The node's level in this window ([`node_level`]), for level gates.
    pub level: Option<f64>,
}

impl GateSample {
    fn of(sample: &HealthSample) -> Self {
        Self {
            wave_id: sample.wave_id,
            node_id: sample.node_id,
            cohort: sample.cohort,
            window_start: sample.window_start,
            events: sample.events,
            exposure: sample.exposure,
            level: node_level(&sample.units),
        }
    }
}

/// One node's value of a level metric: the mean of its units' means.
fn node_level(aggs: &BTreeMap<String, LevelAgg>) -> Option<f64> {
    let means: Vec<f64> = aggs.values().filter_map(LevelAgg::mean).collect();
    (!means.is_empty()).then(|| means.iter().sum::<f64>() / means.len() as f64)
}

fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// The exposure unit of a gate, as shown with its counts.
fn exposure_unit(gate: &HealthGate) -> &'static str {
    match &gate.source {
        GateSource::Redfish {
            metric: RedfishMetric::XidErrorsPerGpuHour,
        } => "gpu_hours",
        GateSource::Redfish {
            metric: RedfishMetric::LinkDegradedPerNodeDay,
        } => "node_days",
        GateSource::Redfish { .. } if gate.kind == GateKind::Rate => "node_hours",
        GateSource::Prometheus { .. } if gate.kind == GateKind::Rate => "unit_hours",
        _ => "node_means",
    }
}

/// What a gate's bounds rule out, in words.
fn ruled_out(kind: GateKind, lower: Option<f64>, upper: Option<f64>, null: f64, must_detect: f64) -> String {
    let fmt = |v: f64| match kind {
        GateKind::Rate => format!("{v:.2}x"),
        GateKind::Level => format!("{v:+.2}"),
    };
    let above = upper.map_or_else(
        || "rules out no effect yet".to_owned(),
        |u| format!("rules out an effect above {}", fmt(u)),
    );
    let below = match lower {
        Some(l) if l > null => format!("shows an effect above {} (min_effect {})", fmt(l), fmt(null)),
        _ => format!("shows no effect beyond min_effect {}", fmt(null)),
    };
    let verdict = if upper.is_some_and(|u| u < must_detect) {
        format!("{} (must_detect) is ruled out", fmt(must_detect))
    } else {
        format!("cannot rule out {} (must_detect)", fmt(must_detect))
    };
    format!("{above}; {verdict}; {below}")
}

impl DetectorJudge {
    /// One round of fleet-scale detection for a baking wave (`last`: the planned bake is over).
    /// `None` while nothing is decided before the bake's end (only a Fail ends a bake early).
    pub(super) async fn fleet_round(
        &self,
        rollout: &ExecRollout,
        wave: &ExecWave,
        policy: &Policy,
        last: bool,
    ) -> Option<WaveVerdict> {
        let error = |summary: String| {
            last.then(|| WaveVerdict {
                outcome: Outcome::Error,
                evidence: json!({ "method": "fleet", "error": summary }),
                summary,
            })
        };
        let Some(bake_start) = wave.bake_started_at else {
            return error(format!("wave {} has no bake start", wave.name));
        };
        let detection = &policy.detection;
        let budget = match ErrorBudget::new(detection.false_rollback, detection.false_pass) {
            Ok(b) => b,
            Err(err) => return error(format!("detection budgets: {err}")),
        };
        let now = self.clock.now();
        let gates = self.wave_gates(wave, policy);
        let (alpha, beta) = budget.per_gate(gates.len());
        let interval = gates
            .iter()
            .filter_map(Gate::health_gate)
            .map(|g| g.interval)
            .min()
            .unwrap_or(Duration::hours(1))
            .max(Duration::seconds(1));
        let max_bake = Duration::seconds(max_bake_seconds(policy, wave));
        let elapsed = (now - bake_start).max(Duration::zero());
        let step = interval.num_seconds().max(1);
        let max_looks = u32::try_from((max_bake.num_seconds() + step - 1) / step).unwrap_or(u32::MAX);
        let max_looks = max_looks.max(1);
        let mut look_number = u32::try_from(elapsed.num_seconds() / interval.num_seconds())
            .unwrap_or(u32::MAX)
            .min(max_looks);
        if last {
            look_number = look_number.max(1);
        }
        let stored = match self.db.health_looks(SampleScope::Wave(wave.id)).await {
            Ok(looks) => looks,
            Err(err) => {
                return error(format!(
                    "cannot read recorded looks: {}",
                    orchestrator_types::error_chain(&err)
                ));
            }
        };
        let latest = |gate: &str| -> Option<&HealthLook> {
            stored
                .iter()
                .filter(|l| l.look.gate == gate)
                .max_by_key(|l| l.look.look_number)
        };
        let failed = |gate: &str| {
            stored
                .iter()
                .find(|l| l.look.gate == gate && l.look.outcome == Outcome::Fail)
        };
        let look_due = look_number >= 1
            && gates
                .iter()
                .filter_map(Gate::health_gate)
                .any(|g| failed(&g.name).is_none() && latest(&g.name).is_none_or(|l| l.look.look_number < look_number));
        // Between polls and looks, inside the planned bake, there is nothing to read: listing the
        // fleet's nodes and rollouts is left for when a poll or a look needs it. A recorded failed
        // look is still answered (a crash may have come between recording it and acting on it).
        let poll_due = self.poll_due(wave.id, interval, now);
        let any_failed = stored.iter().any(|l| l.look.outcome == Outcome::Fail);
        if !last && !look_due && !poll_due && !any_failed {
            return None;
        }
        let watch = match fleet_watch(&self.db, rollout, wave, bake_start, detection.reset_exclusion, false).await {
            Ok(w) => w,
            Err(err) => {
                return error(format!(
                    "cannot list the watched nodes: {}",
                    orchestrator_types::error_chain(&err)
                ));
            }
        };
        if let Err(err) = self
            .poll_fleet_if_due(rollout, wave, &gates, &watch, now, last || look_due)
            .await
        {
            tracing::warn!(error = %orchestrator_types::error_chain(&err), wave = %wave.name, "health collection failed");
            return error(format!(
                "health collection failed: {}",
                orchestrator_types::error_chain(&err)
            ));
        }
        let mut looks: Vec<FleetGateLook> = Vec::new();
        for gate in &gates {
            let Some(health_gate) = gate.health_gate() else {
                let (name, reason) = match gate {
                    Gate::Unsupported { name, reason } => (name.clone(), reason.clone()),
                    _ => (gate.name().to_owned(), "no data source".to_owned()),
                };
                looks.push(error_look(&name, look_number, max_looks, alpha, beta, reason));
                continue;
            };
            // A failed look stands; a recorded look is read back, never recomputed.
            if let Some(recorded) = failed(&health_gate.name)
                .or_else(|| latest(&health_gate.name).filter(|l| l.look.look_number >= look_number))
            {
                match serde_json::from_value::<FleetGateLook>(recorded.look.verdict.clone()) {
                    Ok(look) => looks.push(look),
                    Err(err) => looks.push(error_look(
                        &health_gate.name,
                        recorded.look.look_number,
                        max_looks,
                        alpha,
                        beta,
                        format!("recorded look does not decode: {err}"),
                    )),
                }
                continue;
            }
            if look_number == 0 {
                continue;
            }
            // Each gate reads its own metric's samples and keeps a few numbers of each: holding the
            // rollout's samples of every metric for a look grew the controller with the fleet.
            let reads_stored = health_gate.kind == GateKind::Level || gate.watched().is_some();
            let mut samples = Vec::new();
            if reads_stored {
                let key = gate.sample_key();
                let read = self
                    .db
                    .each_health_sample(SampleScope::Rollout(rollout.id), Some(&key), |s| {
                        samples.push(GateSample::of(&s))
                    })
                    .await;
                if let Err(err) = read {
                    return error(format!(
                        "cannot read samples: {}",
                        orchestrator_types::error_chain(&err)
                    ));
                }
            }
            let ctx = LookContext {
                look_number,
                max_looks,
                alpha,
                beta,
                must_detect: policy.must_detect(&wave.name, health_gate),
                information_fraction: (elapsed.num_seconds() as f64 / max_bake.num_seconds().max(1) as f64).min(1.0),
                now,
            };
            let look = self.fleet_gate_look(gate, health_gate, &watch, &samples, &ctx).await;
            // A look that could not be evaluated (no Prometheus answer) is not recorded: a later pass
            // asks again.
            if look.outcome == Outcome::Error {
                looks.push(look);
                continue;
            }
            match self.record_fleet_look(rollout, wave, &look).await {
                Ok(recorded) => looks.push(recorded),
                Err(err) => {
                    return error(format!(
                        "cannot record a look: {}",
                        orchestrator_types::error_chain(&err)
                    ));
                }
            }
        }
        let poll_errors = match self.poll_errors(wave).await {
            Ok(errors) => errors,
            Err(err) => {
                return error(format!(
                    "cannot read poll errors: {}",
                    orchestrator_types::error_chain(&err)
                ));
            }
        };
        let timing = WaveTiming {
            elapsed_hours: elapsed.num_seconds() as f64 / 3600.0,
            bake_hours: wave.bake_seconds as f64 / 3600.0,
            max_bake_hours: max_bake.num_seconds() as f64 / 3600.0,
        };
        let decision_input: Vec<DetectGateLook> = looks
            .iter()
            .filter(|l| l.outcome != Outcome::Error)
            .map(|l| DetectGateLook {
                gate: l.gate.clone(),
                fail: l.outcome == Outcome::Fail,
                pass_ready: l.outcome == Outcome::Pass,
                lower: l.lower.unwrap_or(f64::NEG_INFINITY),
                upper: l.upper.unwrap_or(f64::INFINITY),
                null: l.null,
                must_detect: l.must_detect,
            })
            .collect();
        // Gates not yet looked at (the first look is not due) keep the wave in its bake.
        let unlooked = gates
            .iter()
            .filter_map(Gate::health_gate)
            .any(|g| !looks.iter().any(|l| l.gate == g.name));
        let errors: Vec<&FleetGateLook> = looks.iter().filter(|l| l.outcome == Outcome::Error).collect();
        let decision = decide_wave(timing, &decision_input);
        let (outcome, summary) = match decision {
            WaveDecision::Fail { gates: failing } => (
                Outcome::Fail,
                looks
                    .iter()
                    .filter(|l| failing.contains(&l.gate))
                    .map(|l| format!("{}: {}", l.gate, l.ruled_out))
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            _ if !last => return None,
            _ if !errors.is_empty() => (
                Outcome::Error,
                errors
                    .iter()
                    .map(|l| format!("{}: {}", l.gate, l.error.clone().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            _ if unlooked => (Outcome::Extend, "the first look is not due yet".to_owned()),
            WaveDecision::Pass => (
                Outcome::Pass,
                format!(
                    "every gate rules out its must_detect: {} updated nodes against {} concurrent controls",
                    watch.updated.len(),
                    watch.control.len()
                ),
            ),
            WaveDecision::Extend { waiting_on, .. } => (
                Outcome::Extend,
                looks
                    .iter()
                    .filter(|l| waiting_on.contains(&l.gate))
                    .map(|l| format!("{}: {}", l.gate, l.ruled_out))
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            WaveDecision::Hold { statement } => (Outcome::Hold, statement),
        };
        // An updated node of this wave whose health could not be read has not been judged: never a
        // Pass (a proven regression still fails).
        let unread: Vec<&super::PollError> = poll_errors
            .iter()
            .filter(|e| e.cohort == Cohort::Canary && watch.updated.get(&e.node) == Some(&wave.id))
            .collect();
        let (outcome, summary) = if outcome == Outcome::Pass && !unread.is_empty() {
            (
                Outcome::Error,
                unread.iter().map(|e| e.describe()).collect::<Vec<_>>().join("; "),
            )
        } else {
            (outcome, summary)
        };
        let statement = if outcome == Outcome::Hold || outcome == Outcome::Extend {
            summary.clone()
        } else {
            looks
                .iter()
                .map(|l| format!("{}: {}", l.gate, l.ruled_out))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let soak = wave.role == Some(WaveRole::Soak);
        let summary = if soak {
            format!("soak against the holdback: {summary}")
        } else {
            summary
        };
        let evidence = FleetEvidence {
            method: "fleet".into(),
            soak,
            false_rollback: budget.false_rollback,
            false_pass: budget.false_pass,
            reset_exclusion_seconds: detection.reset_exclusion.num_seconds(),
            bake_seconds: wave.bake_seconds,
            max_bake_seconds: max_bake.num_seconds(),
            bake_started_at: bake_start,
            elapsed_seconds: elapsed.num_seconds(),
            decision: outcome,
            statement,
            updated_nodes: watch.updated.len(),
            control_nodes: watch.control.len(),
            strata: watch.strata_watched,
            gates: looks,
            nodes_in_error: poll_errors
                .iter()
                .map(|e| NodeInError {
                    node: e.node,
                    name: e.name.clone(),
                    cohort: e.cohort.as_str().to_owned(),
                    error: e.error.clone(),
                })
                .collect(),
        };
        Some(WaveVerdict {
            outcome,
            summary,
            evidence: serde_json::to_value(&evidence).unwrap_or_default(),
        })
    }

    /// One round of the first wave's pre-flash watch (`detection.pre_period`): every node of the
    /// rollout not touched yet that is eligible as a control, the wave's own included, polled as a
    /// control from the wave's start whenever the gates' interval has passed. Their samples are the
    /// pre-period [`level_batches`] subtracts. A failed round is logged and retried next pass: the
    /// watch only sharpens the level gates, and their judgement never blames a node for it.
    pub(super) async fn pre_flash_round(&self, rollout: &ExecRollout, wave: &ExecWave, policy: &Policy) {
        let Some(started) = wave.started_at else { return };
        let gates = self.wave_gates(wave, policy);
        let now = self.clock.now();
        // Listing the fleet's nodes and rollouts waits for a poll that is due, as in a bake.
        let Some(interval) = gates.iter().filter_map(Gate::health_gate).map(|g| g.interval).min() else {
            return;
        };
        if !self.poll_due(wave.id, interval, now) {
            return;
        }
        let watched = async {
            let watch = fleet_watch(&self.db, rollout, wave, started, policy.detection.reset_exclusion, true).await?;
            self.poll_fleet_if_due(rollout, wave, &gates, &watch, now, false).await
        };
        if let Err(err) = watched.await {
            tracing::warn!(error = %orchestrator_types::error_chain(&err), wave = %wave.name, "pre-flash watch failed");
        }
    }

    /// Whether `interval` has passed since the wave's last poll by this judge (or it has none).
    fn poll_due(&self, wave: orchestrator_types::WaveId, interval: Duration, now: DateTime<Utc>) -> bool {
        self.last_poll
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&wave)
            .is_none_or(|at| now - *at >= interval)
    }

    /// Polls the fleet watch when the gates' interval has passed (always when `force`): Redfish
    /// through the collector's bound, Prometheus level gates with one query for every watched node.
    async fn poll_fleet_if_due(
        &self,
        rollout: &ExecRollout,
        wave: &ExecWave,
        gates: &[Gate],
        watch: &FleetWatch,
        now: DateTime<Utc>,
        force: bool,
    ) -> Result<(), DbError> {
        let Some(interval) = gates.iter().filter_map(Gate::health_gate).map(|g| g.interval).min() else {
            return Ok(());
        };
        if !force && !self.poll_due(wave.id, interval, now) {
            return Ok(());
        }
        let mut metrics: Vec<RedfishMetric> = Vec::new();
        for (_, metric) in gates.iter().filter_map(Gate::watched) {
            if !metrics.contains(&metric) {
                metrics.push(metric);
            }
        }
        if !metrics.is_empty() {
            let report = self
                .collector
                .collect_members(rollout, wave, watch.members.clone(), &metrics, now)
                .await?;
            tracing::debug!(wave = %wave.name, ?report, "fleet health poll");
        }
        let queries = super::prometheus_level_queries(gates);
        if let (Some(client), false) = (&self.prometheus, queries.is_empty()) {
            self.collector
                .collect_prometheus_members(client, rollout, wave, &watch.members, &queries, now)
                .await?;
        }
        self.last_poll
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(wave.id, now);
        Ok(())
    }

    /// Evaluates one gate at this look (not recorded yet).
    async fn fleet_gate_look(
        &self,
        gate: &Gate,
        health_gate: &HealthGate,
        watch: &FleetWatch,
        samples: &[GateSample],
        ctx: &LookContext,
    ) -> FleetGateLook {
        let fail = |reason: String| {
            error_look(
                &health_gate.name,
                ctx.look_number,
                ctx.max_looks,
                ctx.alpha,
                ctx.beta,
                reason,
            )
        };
        match (health_gate.kind, gate) {
            (GateKind::Rate, _) => {
                let hours = if let (Gate::PromLevel { .. }, Some(client)) = (gate, &self.prometheus) {
                    // One query covers every watched node; bins come from Prometheus' own history.
                    let nodes: Vec<WatchedNode> = watch
                        .members
                        .iter()
                        .map(|m| WatchedNode {
                            node: m.node.id,
                            name: m.node.name.clone(),
                            cohort: m.cohort,
                            from: m.exposure_start,
                        })
                        .collect();
                    let cohorts: HashMap<NodeId, Cohort> = nodes.iter().map(|n| (n.node, n.cohort)).collect();
                    match PrometheusSource::new(client.clone())
                        .look(health_gate, &nodes, ctx.now)
                        .await
                        .and_then(|l| l.require_watched())
                    {
                        Ok(look) => RateHours::Prometheus { look, cohorts },
                        Err(err) => return fail(orchestrator_types::error_chain(&err)),
                    }
                } else if gate.watched().is_some() {
                    RateHours::Stored { samples }
                } else {
                    return fail("no Prometheus server is configured for this judge".into());
                };
                let mut cells = Cells::default();
                let mut updated_nodes = BTreeSet::new();
                hours.each(ctx.now, &watch.strata, &mut |h| {
                    if h.cohort == Cohort::Canary {
                        updated_nodes.insert(h.node);
                    }
                    cells.add(h);
                });
                let facts = match rate_facts(&cells, health_gate.min_effect, ctx.must_detect, ctx.alpha, ctx.beta) {
                    Ok(f) => f,
                    Err(err) => return fail(err.to_string()),
                };
                let nodes = match node_look(
                    &cells,
                    |f| hours.each(ctx.now, &watch.strata, f),
                    health_gate.min_effect,
                    ctx.alpha,
                ) {
                    Ok(n) => n,
                    Err(err) => return fail(err.to_string()),
                };
                let (x1, e1, x0, e0) = facts.totals;
                let lower = finite(facts.lower).filter(|l| *l > 0.0);
                let upper = finite(facts.upper);
                let mut said = ruled_out(GateKind::Rate, lower, upper, health_gate.min_effect, ctx.must_detect);
                if nodes.fail {
                    said.push_str(&format!(
                        "; some of the {} updated nodes are worse than {:.2}x (node-level look)",
                        nodes.nodes, health_gate.min_effect
                    ));
                }
                FleetGateLook {
                    gate: health_gate.name.clone(),
                    kind: "rate".into(),
                    look: ctx.look_number,
                    max_looks: ctx.max_looks,
                    outcome: gate_outcome(facts.fail || nodes.fail, facts.pass_ready),
                    estimate: facts.estimate.and_then(finite),
                    lower,
                    upper,
                    null: health_gate.min_effect,
                    must_detect: ctx.must_detect,
                    alpha: ctx.alpha,
                    beta: ctx.beta,
                    ruled_out: said,
                    information_fraction: ctx.information_fraction,
                    expected_baseline_events: (e0 > 0.0).then(|| e1 * x0 as f64 / e0),
                    updated: FleetCohort {
                        nodes: updated_nodes.len(),
                        events: Some(x1),
                        exposure: Some(e1),
                    },
                    control: FleetCohort {
                        nodes: facts.control_nodes,
                        events: Some(x0),
                        exposure: Some(e0),
                    },
                    exposure_unit: exposure_unit(health_gate).into(),
                    dispersion: Some(facts.dispersion),
                    failed_from_hour: facts.failed_from_bin,
                    error: None,
                    node_look: Some(nodes),
                }
            }
            (GateKind::Level, _) => {
                let sign = match health_gate.direction {
                    Direction::IncreaseIsBad => 1.0,
                    Direction::DecreaseIsBad => -1.0,
                };
                let batches = level_batches(samples, &watch.updated, &watch.bake_starts, sign);
                let mut process = LevelEProcess::new(LevelEConfig::default());
                let (mut updated, mut control) = (0usize, 0usize);
                let mut sum = 0.0;
                for batch in &batches {
                    if let Err(err) = process.observe(batch) {
                        return fail(err.to_string());
                    }
                    updated += batch.differences.len();
                    sum += batch.differences.iter().sum::<f64>();
                    control = control.max(batch.controls);
                }
                let look = match process.look(health_gate.min_effect, ctx.must_detect, ctx.alpha, ctx.beta) {
                    Ok(l) => l,
                    Err(err) => return fail(err.to_string()),
                };
                let lower = finite(look.lower);
                let upper = finite(look.upper);
                FleetGateLook {
                    gate: health_gate.name.clone(),
                    kind: "level".into(),
                    look: ctx.look_number,
                    max_looks: ctx.max_looks,
                    outcome: gate_outcome(look.fail, look.pass_ready),
                    estimate: (updated > 0).then(|| sum / updated as f64),
                    lower,
                    upper,
                    null: health_gate.min_effect,
                    must_detect: ctx.must_detect,
                    alpha: ctx.alpha,
                    beta: ctx.beta,
                    ruled_out: ruled_out(GateKind::Level, lower, upper, health_gate.min_effect, ctx.must_detect),
                    information_fraction: ctx.information_fraction,
                    expected_baseline_events: None,
                    updated: FleetCohort {
                        nodes: updated,
                        ..Default::default()
                    },
                    control: FleetCohort {
                        nodes: control,
                        ..Default::default()
                    },
                    exposure_unit: exposure_unit(health_gate).into(),
                    dispersion: None,
                    failed_from_hour: None,
                    error: None,
                    node_look: None,
                }
            }
        }
    }

    /// Records a gate's look before the wave acts on it; a look another controller recorded first is
    /// read back instead.
    async fn record_fleet_look(
        &self,
        rollout: &ExecRollout,
        wave: &ExecWave,
        look: &FleetGateLook,
    ) -> Result<FleetGateLook, DbError> {
        let new = NewHealthLook {
            rollout_id: rollout.id,
            wave_id: wave.id,
            gate: look.gate.clone(),
            look_number: look.look,
            planned_looks: look.max_looks,
            outcome: look.outcome,
            verdict: serde_json::to_value(look).unwrap_or_default(),
        };
        let recorded = match self.db.record_health_look(&new, DETECTOR_ACTOR).await {
            Ok(recorded) => recorded,
            Err(DbError::AlreadyExists { .. }) => self
                .db
                .health_looks(SampleScope::Wave(wave.id))
                .await?
                .into_iter()
                .find(|l| l.look.gate == new.gate && l.look.look_number == new.look_number)
                .ok_or(DbError::NotFound {
                    what: "health look",
                    key: format!("wave {} gate {} look {}", wave.id, new.gate, new.look_number),
                })?,
            Err(err) => return Err(err),
        };
        Ok(serde_json::from_value(recorded.look.verdict).unwrap_or_else(|_| look.clone()))
    }
}

/// What every gate's look shares.
struct LookContext {
    look_number: u32,
    max_looks: u32,
    alpha: f64,
    beta: f64,
    /// What this gate must rule out in this wave (the wave's own `must_detect`, else the gate's).
    must_detect: f64,
    information_fraction: f64,
    now: DateTime<Utc>,
}

fn gate_outcome(fail: bool, pass_ready: bool) -> Outcome {
    if fail {
        Outcome::Fail
    } else if pass_ready {
        Outcome::Pass
    } else {
        Outcome::Extend
    }
}

fn error_look(gate: &str, look: u32, max_looks: u32, alpha: f64, beta: f64, reason: String) -> FleetGateLook {
    FleetGateLook {
        gate: gate.to_owned(),
        kind: String::new(),
        look,
        max_looks,
        outcome: Outcome::Error,
        estimate: None,
        lower: None,
        upper: None,
        null: 0.0,
        must_detect: 0.0,
        alpha,
        beta,
        ruled_out: "nothing: the gate could not be evaluated".into(),
        information_fraction: 0.0,
        expected_baseline_events: None,
        updated: FleetCohort::default(),
        control: FleetCohort::default(),
        exposure_unit: String::new(),
        dispersion: None,
        failed_from_hour: None,
        error: Some(reason),
        node_look: None,
    }
}

/// A level gate's batches: for each wave of the rollout up to this one, the nodes updated in that
/// wave (each counts once, in its own wave), each one's mean over its hours of the wave's watch of
/// its level minus the mean of that wave's controls in the same hour (harmful direction positive via
/// `sign`), adjusted by its pre-period where it has one, with the controls' spread of the same
/// statistic as the sd ([`level_batches_with_pre_period`]). `bake_starts` holds each wave's bake
/// start; a wave without one is not judged.
///
/// A node's pre-period for a wave is every hour it was watched as a control before that wave's bake
/// started: a node of a later wave was a control during the earlier waves' bakes, and the first
/// wave's nodes and controls were watched before its first flash when the policy asks for it
/// (`detection.pre_period`). A control is a node not touched yet, so these hours are all before the
/// node's flash, each relative to the controls of its own hour (a fleet-wide change between the
/// pre-period and the wave cancels like any other). The same rule gives updated nodes and controls
/// their pre-periods, so the two stay comparable.
///
/// The current wave joins from its first closed hour, so a level gate can fail at any look, inside
/// the planned bake too (issue 22: Fail at any look; only Pass waits for the bake). Its batch is
/// re-measured at each look over the longer window (a plug-in: the node means of one wave at two looks
/// are correlated, not new nodes). Why that keeps the false-rollback share: the normal-mixture boundary
/// at the canary's size sits near z = 4.7 at a gate's alpha of 0.005 (`LevelEProcess::look`), whose
/// one-look tail is about 1e-6; a running mean re-read over a bake of up to a few hundred hours has a
/// few tens of nearly independent looks at most, far inside 0.005 (orchestrator-detect's
/// `tests/fleet_looks.rs` checks the rate by simulation).
pub(crate) fn level_batches(
    samples: &[GateSample],
    updated: &BTreeMap<NodeId, orchestrator_types::WaveId>,
    bake_starts: &HashMap<orchestrator_types::WaveId, DateTime<Utc>>,
    sign: f64,
) -> Vec<LevelBatch> {
    use orchestrator_types::WaveId;
    // The controls' mean level per wave and hour: each node is compared with the controls of the
    // same hours only (concurrent), so a fleet-wide hot hour that an updated node's watch (which
    // starts after its reset) covers differently from the controls' cannot pass for an effect.
    //
    // A first-wave node watched before its flash may have one stored control row that its first
    // polls after the flash were folded into (a row keeps the cohort it was created with); from
    // its wave's bake on, a node of the wave is never a control, so such a row is left out.
    let bake_hours: HashMap<WaveId, DateTime<Utc>> =
        bake_starts.iter().map(|(w, at)| (*w, window_start(*at))).collect();
    let after_own_flash = |s: &GateSample| {
        updated.get(&s.node_id) == Some(&s.wave_id)
            && bake_hours.get(&s.wave_id).is_some_and(|bake| s.window_start >= *bake)
    };
    let mut control_sums: HashMap<(WaveId, DateTime<Utc>), (f64, usize)> = HashMap::new();
    for s in samples
        .iter()
        .filter(|s| s.cohort == Cohort::Control && !after_own_flash(s))
    {
        if let Some(level) = s.level {
            let entry = control_sums.entry((s.wave_id, s.window_start)).or_insert((0.0, 0));
            entry.0 += level;
            entry.1 += 1;
        }
    }
    // Each node's hours as (wave, cohort, hour, level relative to that hour's controls).
    type RelativeHour = (WaveId, Cohort, DateTime<Utc>, f64);
    let mut hours: BTreeMap<NodeId, Vec<RelativeHour>> = BTreeMap::new();
    for s in samples
        .iter()
        .filter(|s| s.cohort == Cohort::Canary || !after_own_flash(s))
    {
        let Some(level) = s.level else { continue };
        let Some((sum, n)) = control_sums.get(&(s.wave_id, s.window_start)) else {
            continue;
        };
        hours.entry(s.node_id).or_default().push((
            s.wave_id,
            s.cohort,
            s.window_start,
            sign * (level - sum / *n as f64),
        ));
    }
    let mean = |values: &mut dyn Iterator<Item = f64>| {
        let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
        (n > 0).then(|| sum / n as f64)
    };
    let mut waves: Vec<(WaveId, DateTime<Utc>)> = bake_hours.into_iter().collect();
    waves.sort();
    let mut batches = Vec::new();
    for (wave_id, bake_hour) in waves {
        // One node's statistic for this wave: its hours of the wave's watch (a control's from the
        // bake's first hour) and its hours as a control before them.
        let node_level = |node: &NodeId, cohort: Cohort| -> Option<NodeLevel> {
            let node_hours = hours.get(node)?;
            let post = mean(
                &mut node_hours
                    .iter()
                    .filter(|(w, c, at, _)| {
                        *w == wave_id && *c == cohort && (cohort == Cohort::Canary || *at >= bake_hour)
                    })
                    .map(|h| h.3),
            )?;
            let pre = mean(
                &mut node_hours
                    .iter()
                    .filter(|(_, c, at, _)| *c == Cohort::Control && *at < bake_hour)
                    .map(|h| h.3),
            );
            Some(NodeLevel { post, pre })
        };
        let mut controls = Vec::new();
        let mut wave_nodes = Vec::new();
        for (node, node_hours) in &hours {
            if updated.get(node) == Some(&wave_id) {
                wave_nodes.extend(node_level(node, Cohort::Canary));
            } else if node_hours
                .iter()
                .any(|(w, c, at, _)| *w == wave_id && *c == Cohort::Control && *at >= bake_hour)
            {
                controls.extend(node_level(node, Cohort::Control));
            }
        }
        batches.extend(level_batches_with_pre_period(&wave_nodes, &controls));
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_control_is_an_eligible_node_and_nothing_else() {
        assert_eq!(control_exclusion(NodeState::Active, None, false, false), None);
        assert_eq!(
            control_exclusion(NodeState::Maintenance, None, false, false),
            Some("in maintenance")
        );
        assert_eq!(
            control_exclusion(NodeState::Quarantined, None, false, false),
            Some("quarantined")
        );
        assert_eq!(
            control_exclusion(NodeState::Active, Some("case 7"), false, false),
            Some("open RMA case")
        );
        assert_eq!(
            control_exclusion(NodeState::Active, None, true, false),
            Some("under another rollout")
        );
        assert_eq!(control_exclusion(NodeState::Active, None, false, true), Some("drained"));
    }

    fn hour(h: i64) -> DateTime<Utc> {
        // 1,800,000,000 s is a whole hour.
        DateTime::from_timestamp(1_800_000_000 + h * 3600, 0).unwrap()
    }

    /// Hours of cells in two strata whose control rates differ fourfold, updated nodes at `ratio` times
    /// their stratum's rate. Expected counts, so the result is deterministic.
    fn strata_cells(hours: i64, ratio: f64) -> Cells {
        let mut cells = Cells::default();
        for h in 0..hours {
            // (stratum, control rate, updated exposure, control exposure): whole expected counts.
            for (stratum, rate, ue, ce) in [(0u32, 0.5_f64, 96.0_f64, 24.0_f64), (1u32, 0.125, 24.0, 96.0)] {
                for node in 0..4 {
                    cells.add(NodeHour {
                        node: NodeId(i64::from(stratum) * 10 + node),
                        stratum,
                        cohort: Cohort::Control,
                        bin: hour(h),
                        events: (rate * ce / 4.0).round() as u64,
                        exposure: ce / 4.0,
                    });
                }
                cells.add(NodeHour {
                    node: NodeId(100 + i64::from(stratum)),
                    stratum,
                    cohort: Cohort::Canary,
                    bin: hour(h),
                    events: (ratio * rate * ue).round() as u64,
                    exposure: ue,
                });
            }
        }
        cells
    }

    #[test]
    fn stratified_cells_do_not_blame_the_firmware_for_the_composition() {
        // Most updated exposure sits in the high-rate stratum: pooled without strata, the updated
        // side looks about 2x worse. Within strata the ratio is 1 and the gate passes.
        let facts = rate_facts(&strata_cells(24, 1.0), 1.25, 2.0, 0.01, 0.025).unwrap();
        assert!(!facts.fail, "{facts:?}");
        assert!(facts.pass_ready, "{facts:?}");
        let est = facts.estimate.unwrap();
        assert!((0.9..1.1).contains(&est), "{est}");
        let (x1, e1, x0, e0) = facts.totals;
        let pooled = (x1 as f64 / e1) / (x0 as f64 / e0);
        assert!(pooled > 2.0, "the unstratified ratio is confounded: {pooled}");
        // A real 3x effect fails.
        let facts = rate_facts(&strata_cells(24, 3.0), 1.25, 2.0, 0.01, 0.025).unwrap();
        assert!(facts.fail, "{facts:?}");
        assert!(facts.lower > 1.25, "{facts:?}");
    }

    /// 32 updated nodes and 96 controls in one stratum for `hours`, each node at the control rate of 5
    /// per hour, `hot` updated nodes at `multiple` times it. Expected counts, so the result is
    /// deterministic; the visitor replays the same node-hours, as the judge's second pass does.
    fn node_hours(hours: i64, hot: i64, multiple: f64) -> Vec<NodeHour> {
        let mut out = Vec::new();
        for h in 0..hours {
            for node in 0..128 {
                let (cohort, rate) = match node {
                    0..32 if node < hot => (Cohort::Canary, 5.0 * multiple),
                    0..32 => (Cohort::Canary, 5.0),
                    _ => (Cohort::Control, 5.0),
                };
                out.push(NodeHour {
                    node: NodeId(node),
                    stratum: 0,
                    cohort,
                    bin: hour(h),
                    events: rate as u64,
                    exposure: 8.0,
                });
            }
        }
        out
    }

    fn cells_of(hours: &[NodeHour]) -> Cells {
        let mut cells = Cells::default();
        for h in hours {
            cells.add(*h);
        }
        cells
    }

    #[test]
    fn the_node_level_look_fails_an_effect_on_a_few_nodes_the_pooled_ratio_does_not() {
        // 3 of 32 nodes at 6x for 2 h: the canary's average is 1.47x, under min_effect 1.5.
        let hours = node_hours(2, 3, 6.0);
        let cells = cells_of(&hours);
        let facts = rate_facts(&cells, 1.5, 3.0, 0.02, 0.05).unwrap();
        assert!(!facts.fail, "{facts:?}");
        let look = node_look(&cells, |f| hours.iter().for_each(|h| f(*h)), 1.5, 0.02).unwrap();
        assert!(look.fail, "{look:?}");
        assert_eq!(look.nodes, 32);
        assert!(
            (look.level - 0.005).abs() < 1e-12,
            "a quarter of the gate's share: {look:?}"
        );
        // Rebuilt from the same data, the same look (a replay counts nothing twice).
        let again = node_look(&cells, |f| hours.iter().for_each(|h| f(*h)), 1.5, 0.02).unwrap();
        assert_eq!(again, look);
        // Every node alike: no failure.
        let alike = node_hours(2, 0, 1.0);
        let cells = cells_of(&alike);
        let look = node_look(&cells, |f| alike.iter().for_each(|h| f(*h)), 1.5, 0.02).unwrap();
        assert!(!look.fail, "{look:?}");
        // Invalid input is an error, not a panic.
        let mut bad = node_hours(1, 0, 1.0);
        bad[0].exposure = f64::NAN;
        assert!(node_look(&cells_of(&alike), |f| bad.iter().for_each(|h| f(*h)), 1.5, 0.02).is_err());
    }

    #[test]
    fn bursty_control_counts_raise_the_dispersion() {
        let mut cells = Cells::default();
        let hour0 = |node: i64, cohort: Cohort, events: u64| NodeHour {
            node: NodeId(node),
            stratum: 0,
            cohort,
            bin: hour(0),
            events,
            exposure: 8.0,
        };
        for node in 0..40 {
            // Every fifth node has a burst of 12, the rest none: far from Poisson.
            cells.add(hour0(node, Cohort::Control, if node % 5 == 0 { 12 } else { 0 }));
        }
        cells.add(hour0(99, Cohort::Canary, 4));
        let facts = rate_facts(&cells, 1.25, 2.0, 0.01, 0.025).unwrap();
        assert!(facts.dispersion > 5.0, "{facts:?}");
    }

    /// A level gate's sample of one node in one hour.
    fn level_sample(wave: i64, node: i64, cohort: Cohort, h: i64, value: f64) -> GateSample {
        GateSample {
            wave_id: orchestrator_types::WaveId(wave),
            node_id: NodeId(node),
            cohort,
            window_start: hour(h),
            events: 0,
            exposure: 0.0,
            level: Some(value),
        }
    }

    fn bake_starts(waves: &[(i64, i64)]) -> HashMap<orchestrator_types::WaveId, DateTime<Utc>> {
        waves
            .iter()
            .map(|(wave, h)| (orchestrator_types::WaveId(*wave), hour(*h)))
            .collect()
    }

    /// A node's persistent offset from the fleet (its rack position, its fans), larger than the
    /// effect, and a small hour-to-hour wobble.
    fn offset(node: i64) -> f64 {
        2.5 * ((node * 7919) % 11 - 5) as f64 / 5.0
    }

    fn wobble(node: i64, h: i64) -> f64 {
        0.2 * (((node * 31 + h * 17) % 5) - 2) as f64 / 2.0
    }

    /// A node's level in hour `h` of wave `wave`'s watch: 1 °C hotter when it is `updated` there.
    fn watched_level(wave: i64, node: i64, h: i64, updated: bool) -> GateSample {
        let (cohort, shift) = if updated {
            (Cohort::Canary, 1.0)
        } else {
            (Cohort::Control, 0.0)
        };
        level_sample(wave, node, cohort, h, 60.0 + offset(node) + shift + wobble(node, h))
    }

    /// 32 canary nodes (0..32) running 1 °C hotter after their flash, 96 controls (100..196); every
    /// node watched for hours 0-1 before the bake, which starts at hour 2, and hours 2-5 after.
    fn watched_with_pre_period(pre_watch: bool) -> Vec<GateSample> {
        let mut samples = Vec::new();
        for node in (0..32).chain(100..196) {
            let canary = node < 32;
            if pre_watch {
                for h in 0..2 {
                    samples.push(level_sample(
                        1,
                        node,
                        Cohort::Control,
                        h,
                        60.0 + offset(node) + wobble(node, h),
                    ));
                }
            }
            for h in 2..6 {
                samples.push(watched_level(1, node, h, canary));
            }
        }
        samples
    }

    #[test]
    fn a_pre_period_before_the_bake_takes_the_nodes_offsets_out() {
        use orchestrator_types::WaveId;
        let updated: BTreeMap<NodeId, WaveId> = (0..32).map(|i| (NodeId(i), WaveId(1))).collect();
        let bakes = bake_starts(&[(1, 2)]);
        let look = |samples: &[GateSample]| {
            let batches = level_batches(samples, &updated, &bakes, 1.0);
            let mut process = LevelEProcess::new(LevelEConfig::default());
            for b in &batches {
                process.observe(b).unwrap();
            }
            (batches, process.look(0.5, 2.0, 0.005, 0.0125).unwrap())
        };
        // Watched before the flash: each node's offset cancels, +1 °C is proven above the +0.5 null.
        let (batches, proven) = look(&watched_with_pre_period(true));
        assert_eq!(batches.len(), 1);
        assert_eq!((batches[0].differences.len(), batches[0].controls), (32, 96));
        assert!(batches[0].sd < 0.3, "{:?}", batches[0]);
        assert!(proven.fail, "{proven:?}");
        assert!((proven.estimate.unwrap() - 1.0).abs() < 0.1, "{proven:?}");
        // A canary node's control row of the bake's first hour (its first polls after the flash
        // folded into the row its watch created) is neither a control nor its pre-period.
        let mut folded = watched_with_pre_period(true);
        folded.push(level_sample(1, 0, Cohort::Control, 2, 500.0));
        assert_eq!(look(&folded).0, batches);
        // Not watched before: the offsets' spread stays in every node's value and nothing is proven.
        let (batches, unproven) = look(&watched_with_pre_period(false));
        assert!(batches[0].sd > 1.0, "{:?}", batches[0]);
        assert!(!unproven.fail, "{unproven:?}");
    }

    #[test]
    fn a_later_wave_takes_its_pre_period_from_its_hours_as_a_control() {
        use orchestrator_types::WaveId;
        // Wave 1 (bake from hour 0): nodes 0..32 updated, 32..64 and the controls 100..196 watched as
        // controls. Wave 2 (bake from hour 4): 32..64 updated, +1 °C; 100..196 still controls.
        let mut samples = Vec::new();
        for node in (0..64).chain(100..196) {
            for h in 0..4 {
                let cohort = if node < 32 { Cohort::Canary } else { Cohort::Control };
                samples.push(level_sample(1, node, cohort, h, 60.0 + offset(node) + wobble(node, h)));
            }
            if node >= 32 {
                for h in 4..8 {
                    samples.push(watched_level(2, node, h, node < 64));
                }
            }
        }
        let updated: BTreeMap<NodeId, WaveId> = (0..64)
            .map(|i| (NodeId(i), WaveId(if i < 32 { 1 } else { 2 })))
            .collect();
        let batches = level_batches(&samples, &updated, &bake_starts(&[(1, 0), (2, 4)]), 1.0);
        // The canary has no pre-period (no pre-watch): unadjusted. Wave 2 is adjusted.
        assert_eq!(batches.len(), 2, "{batches:?}");
        assert!(batches[0].sd > 1.0, "{:?}", batches[0]);
        assert_eq!((batches[1].differences.len(), batches[1].controls), (32, 96));
        assert!(batches[1].sd < 0.3, "{:?}", batches[1]);
        let mean = batches[1].differences.iter().sum::<f64>() / 32.0;
        assert!((mean - 1.0).abs() < 0.1, "{mean}");
    }

    #[test]
    fn level_batches_count_each_node_once_in_its_own_wave() {
        use orchestrator_types::WaveId;
        let sample = |wave: i64, node: i64, cohort: Cohort, value: f64| level_sample(wave, node, cohort, 0, value);
        let samples = vec![
            // Wave 1: node 1 updated, +3 over controls at 60 and 62.
            sample(1, 1, Cohort::Canary, 64.0),
            sample(1, 10, Cohort::Control, 60.0),
            sample(1, 11, Cohort::Control, 62.0),
            // Wave 2: node 1 watched again (not counted twice), node 2 updated here.
            sample(2, 1, Cohort::Canary, 70.0),
            sample(2, 2, Cohort::Canary, 61.0),
            sample(2, 10, Cohort::Control, 60.0),
            sample(2, 11, Cohort::Control, 60.0),
        ];
        let updated: BTreeMap<NodeId, WaveId> = [(NodeId(1), WaveId(1)), (NodeId(2), WaveId(2))].into();
        // Wave 2 is still in its planned bake and its own node is in the evidence already (a level
        // gate fails at any look); node 1 counts once, in wave 1.
        let bakes = bake_starts(&[(1, 0), (2, 0)]);
        let b = level_batches(&samples, &updated, &bakes, 1.0);
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].differences, vec![3.0]);
        assert_eq!(b[1].differences, vec![1.0]);
        // Lower-is-worse metrics are negated.
        let b = level_batches(&samples, &updated, &bakes, -1.0);
        assert_eq!(b[0].differences, vec![-3.0]);
    }

    #[test]
    fn a_level_gate_fails_inside_the_canarys_planned_bake() {
        use orchestrator_types::WaveId;
        // The canary's first closed hour: 32 updated nodes 3 °C above 64 controls (spread 1 °C). Only
        // the canary's own data exist, and nothing here knows about the bake: the look can fail.
        let sample = |node: i64, cohort: Cohort, value: f64| level_sample(1, node, cohort, 0, value);
        let wobble = |i: i64| if i % 2 == 0 { 1.0 } else { -1.0 };
        let mut samples: Vec<GateSample> = (0..32).map(|i| sample(i, Cohort::Canary, 63.0 + wobble(i))).collect();
        samples.extend((100..164).map(|i| sample(i, Cohort::Control, 60.0 + wobble(i))));
        let updated: BTreeMap<NodeId, WaveId> = (0..32).map(|i| (NodeId(i), WaveId(1))).collect();
        let batches = level_batches(&samples, &updated, &bake_starts(&[(1, 0)]), 1.0);
        assert_eq!(batches.len(), 1);
        let mut process = LevelEProcess::new(LevelEConfig::default());
        for b in &batches {
            process.observe(b).unwrap();
        }
        let look = process.look(1.0, 2.0, 0.005, 0.0125).unwrap();
        assert!(look.fail, "{look:?}");
        assert_eq!(gate_outcome(look.fail, look.pass_ready), Outcome::Fail);
    }

    #[test]
    fn a_level_is_compared_with_the_controls_of_the_same_hours() {
        use orchestrator_types::WaveId;
        let sample = |node: i64, cohort: Cohort, h: i64, value: f64| level_sample(1, node, cohort, h, value);
        // A fleet-wide hot hour 0 (+8 °C) that the updated node's watch, starting after its reset,
        // does not cover: against the controls' whole-watch mean it would look 4 °C cooler.
        let samples = vec![
            sample(1, Cohort::Canary, 1, 60.0),
            sample(10, Cohort::Control, 0, 68.0),
            sample(10, Cohort::Control, 1, 60.0),
            sample(11, Cohort::Control, 0, 69.0),
            sample(11, Cohort::Control, 1, 61.0),
        ];
        let updated: BTreeMap<NodeId, WaveId> = [(NodeId(1), WaveId(1))].into();
        let b = level_batches(&samples, &updated, &bake_starts(&[(1, 0)]), 1.0);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].differences, vec![-0.5]);
        assert!((b[0].sd - 2.0f64.sqrt() / 2.0).abs() < 1e-9, "{:?}", b[0]);
    }

    #[test]
    fn ruled_out_says_what_is_and_is_not_excluded() {
        let s = ruled_out(GateKind::Rate, None, Some(3.1), 1.25, 2.0);
        assert!(s.contains("rules out an effect above 3.10x"), "{s}");
        assert!(s.contains("cannot rule out 2.00x (must_detect)"), "{s}");
        let s = ruled_out(GateKind::Rate, Some(1.6), None, 1.25, 2.0);
        assert!(s.contains("rules out no effect yet"), "{s}");
        assert!(s.contains("shows an effect above 1.60x"), "{s}");
        let s = ruled_out(GateKind::Level, Some(-0.5), Some(0.8), 1.0, 2.0);
        assert!(s.contains("+2.00 (must_detect) is ruled out"), "{s}");
    }
}
