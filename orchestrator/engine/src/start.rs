//! Starting a rollout: snapshot the fleet from the database, ask the planner,
//! store the plan. The plan is never edited afterwards.

use std::collections::BTreeMap;

use orchestrator_db::Db;
use orchestrator_db::execution::{ExecRollout, NewPlan, NewStep, NewWave};
use orchestrator_db::model::{Component, NewRollout, NodeFilter};
use orchestrator_planner::{
    ApprovalRule, ComponentSnapshot, FleetSnapshot, NodeHealth, NodeSnapshot, Plan, PlanInput, ReleaseSpec,
};
use orchestrator_policy::Policy;
use orchestrator_types::{FirmwareVersion, NodeId, RolloutId};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::error::{EngineError, MissingSeries};
use crate::metric_source::{PrometheusSource, WatchedNode};
use crate::prometheus::PrometheusClient;
use orchestrator_db::health::Cohort;
use orchestrator_policy::GateSource;

/// What a rollout starts from.
#[derive(Debug, Clone)]
pub struct StartRollout {
    pub release_id: orchestrator_types::ReleaseId,
    /// The policy YAML.
    pub policy_source: String,
    /// Where it came from: a git commit and blob, or `None` for an inline
    /// policy (recorded as `inline:<sha256>`).
    pub policy_commit: Option<String>,
    pub policy_blob: Option<String>,
    pub seed: i64,
}

/// Parses and validates a policy, with the diagnostics as one message.
pub fn parse_policy(source: &str) -> Result<Policy, EngineError> {
    orchestrator_policy::parse_policy(source).map_err(EngineError::Policy)
}

/// Reads the fleet as the planner wants it.
pub async fn fleet_snapshot(db: &Db) -> Result<FleetSnapshot, EngineError> {
    // A node whose part awaits its vendor or a replacement is neither
    // flashed nor a control: the plan says which case holds it.
    let rma_holds = db.rma_holds().await?;
    let mut nodes = Vec::new();
    let mut offset = 0;
    loop {
        let page = db
            .list_nodes(&NodeFilter {
                offset: Some(offset),
                limit: Some(10_000),
                ..Default::default()
            })
            .await?;
        let len = page.len() as u64;
        let ids: Vec<NodeId> = page.iter().map(|n| n.id).collect();
        let mut components_of = db.nodes_components(&ids).await?;
        for node in page {
            let read = components_of.remove(&node.id).unwrap_or_default();
            // Collected into a new vector: `collect` from the read's own would keep its allocation,
            // sized for the stored components (parsed versions and all), about five times these.
            let mut components = Vec::with_capacity(read.len());
            components.extend(read.into_iter().map(|c| ComponentSnapshot {
                downgrade_forbidden: refuses_current(&node.name, &c),
                inventory_id: c.reading.inventory_id,
                kind: c.reading.kind,
                version: c.reading.version.as_str().to_owned(),
                updateable: c.reading.updateable,
            }));
            let rma_hold = rma_holds.get(&node.name).cloned();
            nodes.push(NodeSnapshot {
                id: node.id,
                name: node.name,
                platform: node.platform_sku,
                region: node.labels.region,
                cluster: node.labels.cluster,
                rack: node.labels.rack,
                nvlink_domain: node.labels.nvlink_domain,
                labels: BTreeMap::new(),
                state: node.state,
                health: NodeHealth {
                    healthy: node.last_discovery_error.is_none(),
                    summary: node.last_discovery_error,
                    rma_hold,
                },
                components,
            });
        }
        if len < 10_000 {
            break;
        }
        offset += len;
    }
    Ok(FleetSnapshot { nodes })
}

/// Whether a component's BMC would refuse to go back to the version it runs
/// now, the version a rollback restores: its `LowestSupportedVersion` is
/// above it. A floor that does not parse is logged and ignored: wrongly
/// calling a rollback impossible refuses every rollback of the rollout,
/// while a wrongly attempted one fails on that node with the BMC's error.
fn refuses_current(node: &str, component: &Component) -> bool {
    let Some(raw) = component.lowest_supported_version.as_deref() else {
        return false;
    };
    match FirmwareVersion::parse(raw) {
        Ok(lowest) => lowest > component.reading.version,
        Err(error) => {
            tracing::warn!(node, component = %component.reading.inventory_id, lowest_supported_version = raw,
                %error, "unparsable LowestSupportedVersion ignored");
            false
        }
    }
}

/// Turns the planner's plan into stored waves: one step per node and
/// expected version (a node's eight GPUs are one push, so one flash), and
/// each wave's approvals = the next policy wave's manual approvers.
pub fn plan_to_rows(plan: &Plan) -> NewPlan {
    let waves = plan
        .waves
        .iter()
        .enumerate()
        .map(|(i, wave)| {
            let approvals_required = match plan.waves.get(i + 1).map(|next| next.approval) {
                Some(ApprovalRule::Manual { approvers }) => approvers,
                _ => 0,
            };
            let mut steps = Vec::new();
            for node in &wave.nodes {
                let mut by_version: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
                for step in &node.steps {
                    by_version
                        .entry(step.expected_current.as_str())
                        .or_default()
                        .push(step.inventory_id.as_str());
                }
                for (expected, ids) in by_version {
                    steps.push(NewStep {
                        node_id: node.node,
                        inventory_id: ids.join(","),
                        expected_from_version: expected.to_owned(),
                    });
                }
            }
            NewWave {
                name: wave.name.clone(),
                bake_seconds: wave.bake_seconds,
                approvals_required,
                max_in_flight: wave.max_in_flight,
                gates: wave.gates.clone(),
                control_nodes: wave.control.members().iter().map(|m| m.node).collect(),
                steps,
                role: wave.role,
            }
        })
        .collect();
    NewPlan {
        waves,
        rollback_assessment: json!({
            "possible": plan.rollback.possible,
            "reason": plan.rollback.blockers.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "),
            // One entry per blocker, without the "rollback impossible:" each
            // one's text opens with, for surfaces that say it once.
            "reasons": plan.rollback.blockers.iter().map(|b| {
                let text = b.to_string();
                text.strip_prefix("rollback impossible: ").map(str::to_owned).unwrap_or(text)
            }).collect::<Vec<_>>(),
            "assessment": plan.rollback,
            "fingerprint": plan.fingerprint,
            "notes": plan.notes,
        }),
    }
}

/// Plans and stores a rollout; it starts executing on the next pass.
pub async fn start_rollout(db: &Db, request: &StartRollout, actor: &str) -> Result<ExecRollout, EngineError> {
    Ok(start_rollout_planned(db, request, actor).await?.0)
}

/// [`start_rollout`], also returning the plan it stored, for callers that
/// show a summary (exclusions by reason, control cohorts) the stored rows
/// do not keep.
pub async fn start_rollout_planned(
    db: &Db,
    request: &StartRollout,
    actor: &str,
) -> Result<(ExecRollout, Plan), EngineError> {
    start_rollout_checked(db, request, actor, &StartChecks::default()).await
}

/// What is checked against the world outside the database before a plan is stored.
#[derive(Debug, Clone, Default)]
pub struct StartChecks {
    /// The Prometheus the policy's `source: prometheus` gates read: every such gate must have series for
    /// every node of the first wave, or the start is refused ([`EngineError::MissingSeries`]). `None`
    /// checks nothing (no Prometheus is configured; such gates then hold their waves for a human).
    pub prometheus: Option<PrometheusClient>,
    /// Start even when series are missing (a new exporter field about to be enabled, say); recorded in
    /// the log as a warning.
    pub allow_missing_series: bool,
    /// The controller's BMC drivers: every first-wave BMC is asked what its UpdateService offers, and a
    /// start whose update (the policy's `update:` requirements, targeted at the planned components) no
    /// path of some BMC can carry out is refused ([`EngineError::NoUpdatePath`]) before any flash.
    /// `None` asks nothing; the step then fails at its push with the same reason.
    pub bmcs: Option<std::sync::Arc<crate::RedfishConnector>>,
}

/// [`start_rollout_planned`] after the [`StartChecks`].
pub async fn start_rollout_checked(
    db: &Db,
    request: &StartRollout,
    actor: &str,
    checks: &StartChecks,
) -> Result<(ExecRollout, Plan), EngineError> {
    // Validation refuses what the engine cannot run (e.g. manual approval
    // on the first wave) with the policy's own line:col.
    let policy = parse_policy(&request.policy_source)?;
    let release = db.release(request.release_id).await?;
    let gates = db.gate_results(release.id).await?;
    let spec = ReleaseSpec {
        id: release.id,
        kind: release.component_kind,
        version: release.version.clone(),
        platforms: release.platforms.clone(),
        image_uri: release.image_uri.clone(),
        sha256: release.sha256.clone(),
        qualification: release.qualification_state,
        passed_gates: gates.iter().filter(|g| g.passed).map(|g| g.gate.clone()).collect(),
        downgrade_forbidden: release.downgrade_forbidden.clone(),
        rollback_floor: release.rollback_floor.clone(),
    };
    let snapshot = fleet_snapshot(db).await?;
    let planned_at = db.clock().now();
    // The soak's holdback is sized from the fleet's base rates: measured over its recent history where
    // the control cohorts saw enough events, else the defaults (the plan says which). Only a soak
    // needs them, so only a soak pays for the read.
    let base_rates = if policy.detection.enabled && policy.detection.soak.is_some() {
        let since = planned_at - chrono::Duration::days(orchestrator_planner::power::HISTORY_DAYS);
        orchestrator_planner::power::history_rates(&db.control_rate_totals(since).await?)
    } else {
        std::collections::BTreeMap::new()
    };
    let plan = orchestrator_planner::plan(&PlanInput {
        snapshot: &snapshot,
        policy: &policy,
        release: &spec,
        seed: u64::from_ne_bytes(request.seed.to_ne_bytes()),
        planned_at,
        base_rates: &base_rates,
    })
    .map_err(EngineError::Plan)?;
    // The plan holds what it needs of the fleet; the snapshot (every node with its whole inventory)
    // would otherwise live on beside the plan and its rows while they are stored.
    drop(snapshot);
    if plan.summary.steps == 0 {
        // A rollout that flashes nothing would end `completed` and read as a
        // success; the exclusions say why no node qualified.
        return Err(EngineError::EmptyPlan {
            nodes: plan.summary.nodes,
            excluded: plan
                .summary
                .excluded
                .iter()
                .map(|(reason, n)| format!("{n} {reason}"))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    if let Some(client) = &checks.prometheus {
        check_gate_series(client, &policy, &plan, db.clock().now(), checks.allow_missing_series).await?;
    }
    if let Some(bmcs) = &checks.bmcs {
        check_update_paths(db, bmcs, &policy, &plan, &release.image_uri).await?;
    }
    let rows = plan_to_rows(&plan);
    let inline = || {
        format!(
            "inline:{}",
            hex::encode(Sha256::digest(request.policy_source.as_bytes()))
        )
    };
    let new = NewRollout {
        release_id: release.id,
        policy_name: policy.name.clone(),
        policy_commit: request.policy_commit.clone().unwrap_or_else(inline),
        policy_blob: request.policy_blob.clone().unwrap_or_else(inline),
        seed: request.seed,
    };
    let stored = db.start_rollout(&new, &request.policy_source, &rows, actor).await?;
    Ok((stored, plan))
}

/// Every Prometheus gate of `policy` must have series for every node of the plan's first wave (the
/// canary: its gates cannot pass without them, and a control node without data is merely left out).
async fn check_gate_series(
    client: &PrometheusClient,
    policy: &Policy,
    plan: &Plan,
    now: chrono::DateTime<chrono::Utc>,
    allow_missing: bool,
) -> Result<(), EngineError> {
    let first_wave: Vec<WatchedNode> = plan
        .steps()
        .filter(|(wave, _, _)| *wave == 0)
        .map(|(_, node, _)| WatchedNode {
            node: node.node,
            name: node.name.clone(),
            cohort: Cohort::Canary,
            from: now,
        })
        .collect();
    let mut unique = std::collections::BTreeSet::new();
    let first_wave: Vec<WatchedNode> = first_wave.into_iter().filter(|n| unique.insert(n.node)).collect();
    let source = PrometheusSource::new(client.clone());
    let mut missing = Vec::new();
    for gate in policy
        .health
        .gates
        .iter()
        .filter(|g| matches!(g.source, GateSource::Prometheus { .. }))
    {
        let nodes = source
            .missing_series(gate, &first_wave, now)
            .await
            .map_err(EngineError::SeriesCheck)?;
        if !nodes.is_empty() {
            missing.push(MissingSeries {
                gate: gate.name.clone(),
                of: first_wave.len(),
                nodes,
            });
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let err = EngineError::MissingSeries { missing };
    if allow_missing {
        tracing::warn!(error = %err, "starting anyway: missing series allowed by the caller");
        return Ok(());
    }
    Err(err)
}

/// BMCs asked at once by [`check_update_paths`]: the first wave is small, and each answer is two GETs.
const UPDATE_CHECK_CONCURRENCY: usize = 16;

/// Every first-wave BMC must offer an update path for the policy's `update:` requirements that can
/// restrict the push to the step's components. A BMC that cannot be read now is left to its step
/// (it may be rebooting); a BMC that answers and cannot do it refuses the start, naming why.
async fn check_update_paths(
    db: &Db,
    bmcs: &crate::RedfishConnector,
    policy: &Policy,
    plan: &Plan,
    image_uri: &str,
) -> Result<(), EngineError> {
    use futures::StreamExt;
    let rules = crate::step::StepRules {
        kind: plan.release.kind,
        update: policy.update,
    };
    // Every planned step names its components, so the push is targeted.
    let request = rules.update_request(image_uri.to_owned(), vec![String::new()]);
    let Some(intent) = request.intent() else {
        return Ok(());
    };
    let mut first_wave: Vec<orchestrator_types::NodeId> = plan
        .steps()
        .filter(|(wave, _, _)| *wave == 0)
        .map(|(_, node, _)| node.node)
        .collect();
    first_wave.dedup();
    let answers: Vec<Result<Option<(String, String)>, EngineError>> = futures::stream::iter(first_wave)
        .map(|id| {
            let intent = &intent;
            async move {
                let node = db.node(id).await?;
                let bmc = match bmcs.driver(&node.bmc_url, &node.credential_ref) {
                    Ok(bmc) => bmc,
                    Err(err) => return Ok(Some((node.name, err.to_string()))),
                };
                match bmc.update_capabilities().await {
                    Ok(caps) => Ok(orchestrator_bmc::choose_update_path(&caps, intent)
                        .err()
                        .map(|refusal| (node.name, refusal.to_string()))),
                    Err(err) => {
                        tracing::warn!(node = %node.name, error = %err, "update capabilities unreadable at start; left to the step");
                        Ok(None)
                    }
                }
            }
        })
        .buffer_unordered(UPDATE_CHECK_CONCURRENCY)
        .collect()
        .await;
    let mut refused = Vec::new();
    for answer in answers {
        if let Some(found) = answer? {
            refused.push(found);
        }
    }
    if refused.is_empty() {
        return Ok(());
    }
    refused.sort();
    Err(EngineError::NoUpdatePath { refused })
}

/// Convenience for callers holding only an id.
pub async fn rollout(db: &Db, id: RolloutId) -> Result<ExecRollout, EngineError> {
    Ok(db.exec_rollout(id).await?)
}
