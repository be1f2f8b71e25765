//! The JSON report of `waveguard simulate`, built from the database and
//! bmc-sim's own record once the rollout has ended.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use orchestrator_db::execution::{ExecRollout, ExecWave, RolloutState, StepFilter, StepPurpose, StepState, WaveState};
use orchestrator_db::model::Release;
use orchestrator_engine::ControllerStatus;
use orchestrator_policy::Policy;
use orchestrator_types::NodeState;
use serde::Serialize;

use crate::error::SimError;
use crate::watch::{Watched, verdict_failed};
use crate::world::SimWorld;

/// The JSON report. Keys are a contract (issue 8); extra keys may be added.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// completed | rolled_back | halted | aborted.
    pub outcome: String,
    /// The release's qualification state at the end.
    pub release_state: String,
    /// Waves in plan order (the rollback wave last, when there is one).
    pub waves: Vec<WaveReport>,
    /// The first failing health verdict.
    pub detection: Detection,
    /// How many nodes ran the release.
    pub exposure: Exposure,
    /// Nodes by the target component's active version at the end.
    pub final_versions: BTreeMap<String, u64>,
    /// Update and rollback step outcomes.
    pub updates: Updates,
    /// Simulated seconds from the start of the rollout to the end.
    pub sim_seconds: i64,
    /// Real seconds the rollout took.
    pub wall_seconds: f64,
    /// Added: why the simulation ended where it did (rollout state reason,
    /// a wave waiting for a human, a timeout).
    pub reason: Option<String>,
    /// Added: whether a health detector judged the waves; false means every
    /// `verdicts` list is empty because no detector is wired in.
    pub verdicts_available: bool,
    /// Added: the release rolled out.
    pub release: String,
    /// Added: nodes in the fleet.
    pub fleet_nodes: usize,
    /// Added: the speedup in force (simulated seconds per real second,
    /// before idle stretches are skipped).
    pub speedup: f64,
    /// Added: approvals given by `--approve auto`.
    pub approvals_given: u32,
    /// Added: nodes in quarantine at the end (a node the engine judged bricked, or one whose
    /// rollback failed); a simulated fleet starts with none.
    pub nodes_quarantined: u64,
    /// Added: the controller's own faults during the run (out of file descriptors, its database or
    /// image server failing). The engine never charges them to a node: it pauses flashing while
    /// they last, so a run can show faults here with no node failed.
    pub controller: ControllerReport,
    /// Added (issue 22): the soak against the holdback, when the policy has one (else null).
    pub soak: Option<SoakReport>,
}

/// The controller's own faults, from the engine's `ControllerStatus` at the end of the run.
#[derive(Debug, Clone, Serialize)]
pub struct ControllerReport {
    /// Faults seen.
    pub faults: u64,
    /// Times the controller reported itself degraded and paused flashing.
    pub degraded_episodes: u64,
    /// What the last fault was (an error kind), if any.
    pub last_fault: Option<String>,
}

/// The soak: the last wave's bake with the whole fleet on the release against the holdback, then
/// the holdback's own update.
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    /// The wave whose bake is the soak.
    pub wave: String,
    /// How the soak ended: promote (passed), promote_anyway (a person, over a hold), rollback, halt,
    /// or null while it runs.
    pub decision: Option<String>,
    /// Simulated seconds the soak ran (its bake, from its start to its decision); null if it never
    /// started.
    pub soak_seconds: Option<i64>,
    /// Whether the release ended fleet-proven by this rollout.
    pub fleet_proven: bool,
    /// Nodes held back on the old version during the soak.
    pub holdback_nodes: i64,
    /// Holdback nodes updated after the soak (succeeded update steps of the holdback wave).
    pub holdback_updated: u64,
}

/// One wave.
#[derive(Debug, Clone, Serialize)]
pub struct WaveReport {
    /// Wave name from the policy (`rollback` for the rollback wave).
    pub name: String,
    /// Nodes planned into the wave.
    pub nodes: i64,
    /// Simulated seconds from the rollout start; null if it never started.
    pub started_at_s: Option<i64>,
    /// Null if it never ended.
    pub ended_at_s: Option<i64>,
    /// promote | rollback | hold | halt, or null while undecided.
    pub decision: Option<String>,
    /// Per-gate verdicts of the wave's last judgement.
    pub verdicts: Vec<GateVerdict>,
    /// Added (issue 22): `soak` or `holdback` for the soak's waves, else null.
    pub role: Option<String>,
}

/// One gate's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct GateVerdict {
    /// The gate's metric (or query, for Prometheus gates).
    pub metric: String,
    /// pass | fail | inconclusive | error.
    pub verdict: String,
    pub p_value: Option<f64>,
    /// The effect estimate (rate ratio or level shift).
    pub effect: Option<f64>,
}

/// When a regression was detected.
#[derive(Debug, Clone, Serialize)]
pub struct Detection {
    pub detected: bool,
    pub at_s: Option<i64>,
    pub metric: Option<String>,
}

/// Blast radius.
#[derive(Debug, Clone, Serialize)]
pub struct Exposure {
    pub max_nodes_on_release: u64,
    pub nodes_on_release_at_detection: Option<u64>,
}

/// Step outcomes.
#[derive(Debug, Clone, Serialize)]
pub struct Updates {
    /// Update steps that started (neither pending nor skipped).
    pub attempted: u64,
    pub succeeded: u64,
    pub failed: u64,
    /// BMCs that stopped answering for good (bmc-sim's own record).
    pub bricked: u64,
    /// Rollback steps that succeeded.
    pub rolled_back: u64,
    /// Most flashes bmc-sim saw on one node for one version (1 = never twice).
    pub max_flashes_per_node_step: u32,
}

fn seconds_since(start: DateTime<Utc>, at: Option<DateTime<Utc>>) -> Option<i64> {
    at.map(|t| (t - start).num_seconds().max(0))
}

fn decision_name(wave: &ExecWave) -> Option<String> {
    match wave.decision.as_deref() {
        // The report's contract predates "promote anyway" (a hold promoted
        // by people): both are promotions to its readers.
        Some("promote" | "promote_anyway") => Some("promote".into()),
        Some(d) if d.starts_with("rollback") => Some("rollback".into()),
        Some("halt") => Some("halt".into()),
        Some(other) => Some(other.to_owned()),
        None => match wave.state {
            WaveState::AwaitingApproval => Some("hold".into()),
            WaveState::Halted => Some("halt".into()),
            _ => None,
        },
    }
}

/// The metric a gate watches, from the policy (the gate name when unknown).
fn gate_metric(policy: &Policy, gate: &str) -> String {
    policy.health.gates.iter().find(|g| g.name == gate).map_or_else(
        || gate.to_owned(),
        |g| match &g.source {
            orchestrator_policy::GateSource::Redfish { metric } => metric.as_str().to_owned(),
            orchestrator_policy::GateSource::Prometheus { query } => query.clone(),
        },
    )
}

/// Per-gate verdicts from a stored wave verdict, read through the
/// detector's evidence type (the per-wave judge's, or fleet-scale detection's
/// `FleetEvidence`, which has bounds rather than a p-value); a judge without
/// gates gives none.
fn gate_verdicts(policy: &Policy, verdict: Option<&orchestrator_types::WaveVerdict>) -> Vec<GateVerdict> {
    if let Some(fleet) =
        verdict.and_then(|v| serde_json::from_value::<orchestrator_types::FleetEvidence>(v.evidence.clone()).ok())
    {
        return fleet
            .gates
            .iter()
            .map(|look| GateVerdict {
                metric: gate_metric(policy, &look.gate),
                verdict: look.outcome.as_str().to_owned(),
                p_value: None,
                effect: look.estimate,
            })
            .collect();
    }
    let Some(evidence) = verdict
        .and_then(|v| serde_json::from_value::<orchestrator_engine::watch::DetectorEvidence>(v.evidence.clone()).ok())
    else {
        return Vec::new();
    };
    evidence
        .gates
        .iter()
        .map(|look| {
            // The look's statistics, when it was evaluated.
            let detected = serde_json::from_value::<orchestrator_detect::Verdict>(look.verdict.clone()).ok();
            let stats = detected.as_ref().and_then(orchestrator_detect::Verdict::evidence);
            GateVerdict {
                metric: gate_metric(policy, &look.gate),
                verdict: look.outcome.as_str().to_owned(),
                p_value: stats.map(|e| e.p_value),
                effect: stats.and_then(|e| e.effect.estimate),
            }
        })
        .collect()
}

/// The report of `rollout`, which ended as `watched` says; `detector`:
/// whether a health detector judged its waves; `controller`: the engine's
/// status as it stopped.
pub async fn build_report(
    world: &SimWorld,
    policy: &Policy,
    rollout: &ExecRollout,
    release: &Release,
    watched: Watched,
    detector: bool,
    controller: &ControllerStatus,
) -> Result<Report, SimError> {
    let db = &world.db;
    let start = rollout.created_at;
    let waves = db.rollout_waves(rollout.id).await?;
    let wave_reports: Vec<WaveReport> = waves
        .iter()
        .map(|w| WaveReport {
            name: w.name.clone(),
            nodes: i64::from(w.node_count),
            started_at_s: seconds_since(start, w.started_at),
            ended_at_s: seconds_since(start, w.ended_at),
            decision: decision_name(w),
            verdicts: gate_verdicts(policy, w.verdict.as_ref()),
            role: w.role.map(|r| r.as_str().to_owned()),
        })
        .collect();
    // The first wave whose verdict failed is the detection.
    let failed_wave = waves.iter().find(|w| verdict_failed(w));
    // The verdict's instant: the rollback it started, or when the watch saw
    // it, whichever is earlier (the wave's own end moves when the rollback
    // finishes).
    let rollback_started = waves
        .iter()
        .filter(|w| w.kind == orchestrator_db::execution::WaveKind::Rollback)
        .filter_map(|w| w.started_at)
        .min();
    let detection_at = failed_wave.map(|w| {
        [watched.first_fail_seen, rollback_started, w.ended_at]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(watched.ended_at)
    });
    let detection = Detection {
        detected: failed_wave.is_some(),
        at_s: seconds_since(start, detection_at),
        metric: failed_wave.and_then(|w| {
            let verdicts = gate_verdicts(policy, w.verdict.as_ref());
            verdicts
                .iter()
                .find(|v| v.verdict == "fail")
                .map(|v| v.metric.clone())
                .or_else(|| w.gates.first().map(|g| gate_metric(policy, g)))
        }),
    };
    let steps = db
        .steps(&StepFilter {
            rollout_id: Some(rollout.id),
            ..Default::default()
        })
        .await?;
    // Nodes on the release over time: +1 when an update succeeds (it is read
    // back active then), -1 when its rollback succeeds.
    let mut changes: Vec<(DateTime<Utc>, i64)> = Vec::new();
    let mut updates = Updates {
        attempted: 0,
        succeeded: 0,
        failed: 0,
        bricked: 0,
        rolled_back: 0,
        max_flashes_per_node_step: 0,
    };
    for step in &steps {
        match (step.purpose, step.state) {
            (StepPurpose::Update, StepState::Pending | StepState::Skipped | StepState::Deferred) => {}
            (StepPurpose::Update, state) => {
                updates.attempted += 1;
                match state {
                    StepState::Succeeded => {
                        updates.succeeded += 1;
                        changes.push((step.finished_at.unwrap_or(step.updated_at), 1));
                    }
                    StepState::Failed => updates.failed += 1,
                    _ => {}
                }
            }
            (StepPurpose::Rollback, StepState::Succeeded) => {
                updates.rolled_back += 1;
                changes.push((step.finished_at.unwrap_or(step.updated_at), -1));
            }
            (StepPurpose::Rollback, _) => {}
        }
    }
    changes.sort();
    let (mut on, mut max_on, mut at_detection) = (0i64, 0i64, None);
    for (at, delta) in &changes {
        if let Some(d) = detection_at
            && *at > d
            && at_detection.is_none()
        {
            at_detection = Some(on);
        }
        on += delta;
        max_on = max_on.max(on);
    }
    if detection_at.is_some() && at_detection.is_none() {
        at_detection = Some(on);
    }
    let kind = release.component_kind;
    let mut final_versions: BTreeMap<String, u64> = BTreeMap::new();
    let mut fleet_versions = world.fleet.versions().await.map_err(SimError::Fleet)?;
    let flash_counts = world.fleet.flash_counts().await.map_err(SimError::Fleet)?;
    for endpoint in world.fleet.endpoints() {
        let versions: BTreeSet<String> = fleet_versions
            .remove(&endpoint.name)
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.kind == kind && policy.target.inventory_id.as_ref().is_none_or(|p| p.matches(&c.id)))
            .map(|c| c.active)
            .collect();
        if versions.is_empty() {
            continue;
        }
        let key = versions.into_iter().collect::<Vec<_>>().join("+");
        *final_versions.entry(key).or_default() += 1;
        let most = flash_counts
            .get(&endpoint.name)
            .and_then(|f| f.values().copied().max())
            .unwrap_or(0);
        updates.max_flashes_per_node_step = updates.max_flashes_per_node_step.max(most);
    }
    updates.bricked = bricked_count(world).await;
    let release_now = db.release(release.id).await?;
    let soak = soak_report(&waves, &steps, &release_now, rollout);
    let outcome = match watched.rollout.state {
        RolloutState::Completed => "completed",
        RolloutState::RolledBack => "rolled_back",
        RolloutState::Aborted => "aborted",
        _ => "halted",
    };
    let reason = watched.stopped_because.clone().or(watched.rollout.state_reason.clone());
    let nodes_quarantined = db
        .node_counts()
        .await?
        .by_state
        .get(NodeState::Quarantined.as_str())
        .copied()
        .unwrap_or(0);
    Ok(Report {
        outcome: outcome.into(),
        release_state: release_now.qualification_state.as_str().to_owned(),
        waves: wave_reports,
        detection,
        exposure: Exposure {
            max_nodes_on_release: u64::try_from(max_on).unwrap_or(0),
            nodes_on_release_at_detection: at_detection.map(|n| u64::try_from(n).unwrap_or(0)),
        },
        final_versions,
        updates,
        sim_seconds: (watched.ended_at - start).num_seconds().max(0),
        wall_seconds: (watched.wall.as_secs_f64() * 10.0).round() / 10.0,
        reason,
        verdicts_available: detector,
        release: format!("{}@{}", kind.as_str(), release.version.as_str()),
        fleet_nodes: world.fleet.endpoints().len(),
        speedup: world.clock.speedup(),
        approvals_given: watched.approvals,
        nodes_quarantined,
        controller: ControllerReport {
            faults: controller.faults_total,
            degraded_episodes: controller.episodes_total,
            last_fault: controller.reason.clone(),
        },
        soak,
    })
}

/// The soak's part of the report, from the waves the planner marked; `None` without a soak.
fn soak_report(
    waves: &[ExecWave],
    steps: &[orchestrator_db::execution::ExecStep],
    release: &Release,
    rollout: &ExecRollout,
) -> Option<SoakReport> {
    use orchestrator_types::WaveRole;
    let soak = waves.iter().find(|w| w.role == Some(WaveRole::Soak))?;
    let holdback = waves.iter().find(|w| w.role == Some(WaveRole::Holdback));
    let holdback_updated = holdback.map_or(0, |h| {
        steps
            .iter()
            .filter(|s| s.wave_id == h.id && s.purpose == StepPurpose::Update && s.state == StepState::Succeeded)
            .count() as u64
    });
    Some(SoakReport {
        wave: soak.name.clone(),
        decision: soak.decision.clone(),
        soak_seconds: soak
            .bake_started_at
            .map(|from| (soak.ended_at.unwrap_or(from) - from).num_seconds().max(0)),
        fleet_proven: release.fleet_proven_by == Some(rollout.id),
        holdback_nodes: holdback.map_or(0, |h| i64::from(h.node_count)),
        holdback_updated,
    })
}

/// BMCs bmc-sim has bricked, from its control API.
async fn bricked_count(world: &SimWorld) -> u64 {
    match world.fleet.nodes_json().await {
        Ok(nodes) => nodes
            .iter()
            .filter(|n| n.get("bricked").and_then(serde_json::Value::as_bool) == Some(true))
            .count() as u64,
        Err(err) => {
            tracing::warn!(error = %err, "cannot read bmc-sim's node list; bricked count is 0");
            0
        }
    }
}
