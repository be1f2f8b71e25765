//! The planning algorithm (described in the crate documentation).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use orchestrator_policy::{Approval, Policy, RollbackScope, WaveSize, format_duration};
use orchestrator_types::{HOLDBACK_WAVE, NodeState, QualificationState, WaveRole};
use sha2::{Digest, Sha256};

use crate::eligibility::{Eligible, ReleaseImage, assess, matching_components};
use crate::error::PlanError;
use crate::input::{FleetSnapshot, NodeSnapshot, ReleaseSpec};
use crate::plan::{
    ApprovalRule, CapRelaxation, ControlMember, ControlPlan, ControlShortfall, ControlSource, ExclusionReason,
    NodeEligibility, NodePlan, Outcome, PLAN_FORMAT_VERSION, Plan, PlanSummary, ReleaseSummary, RollbackAssessment,
    RollbackBlocker, SizeRule, SoakPlan, WaveBlocker, WaveCaps, WavePlan,
};
use crate::rng::SplitMix64;
use crate::select::select_with_caps;
use crate::strata::{choose_dims, stratified_order};

/// Smallest control cohort worth naming: below about this many nodes the
/// detector's rate tests have almost no power, so a small canary still gets
/// a control cohort of this size when enough comparable nodes exist.
pub const MIN_CONTROL_COHORT: usize = 16;

/// Largest control cohort: every control node is polled as often as a
/// baking node, so beyond this the cost of watching grows without buying
/// detection power (the wave's own size dominates the variance by then).
pub const MAX_CONTROL_COHORT: usize = 2048;

/// Everything a plan depends on, passed explicitly.
#[derive(Debug, Clone, Copy)]
pub struct PlanInput<'a> {
    /// The fleet.
    pub snapshot: &'a FleetSnapshot,
    /// The policy.
    pub policy: &'a Policy,
    /// The release.
    pub release: &'a ReleaseSpec,
    /// Seed of the stratified shuffles; stored with the rollout.
    pub seed: u64,
    /// The planning instant, recorded in the plan.
    pub planned_at: DateTime<Utc>,
    /// Rate gates' base rates measured over the fleet's recent history, by metric name
    /// ([`crate::power::history_rates`]); empty to use the defaults. They size the soak's holdback.
    pub base_rates: &'a BTreeMap<String, f64>,
}

/// A node the planner works with, by index into the sorted snapshot.
type Idx = usize;

/// Comparability class of a control node: platform and the current
/// versions of its target components.
type ClassKey = (String, Vec<String>);

/// `Assigned::policy_index` of the holdback wave, which no policy wave names.
const HOLDBACK_INDEX: usize = usize::MAX;

/// A wave as chosen, before its control cohort.
struct Assigned {
    /// Index of the wave in the policy ([`HOLDBACK_INDEX`] for the holdback).
    policy_index: usize,
    nodes: Vec<Idx>,
    caps: Option<WaveCaps>,
    relaxations: Vec<CapRelaxation>,
    /// Stratification labels used.
    dims: Vec<String>,
}

/// Makes the plan. Pure: the same input gives the same plan.
pub fn plan(input: &PlanInput<'_>) -> Result<Plan, PlanError> {
    let PlanInput {
        snapshot,
        policy,
        release,
        seed,
        planned_at,
        base_rates,
    } = *input;
    let later_blocker = check_release(policy, release)?;
    if policy.waves.is_empty() {
        return Err(PlanError::NoWaves {
            policy: policy.name.clone(),
        });
    }
    let nodes = sorted_nodes(snapshot)?;

    // Eligibility.
    let image = ReleaseImage::of(release);
    let verdicts: Vec<Result<Eligible, ExclusionReason>> =
        nodes.iter().map(|node| assess(node, policy, release, &image)).collect();
    let eligible: Vec<Idx> = (0..nodes.len()).filter(|&i| verdicts[i].is_ok()).collect();

    // Waves.
    let mut notes = Vec::new();
    let mut cluster_sizes: BTreeMap<&str, usize> = BTreeMap::new();
    for node in &nodes {
        *cluster_sizes.entry(node.cluster.as_str()).or_default() += 1;
    }
    let mut remaining: Vec<Idx> = eligible.clone();
    // The soak's holdback is chosen first, stratified like the canary (the same labels, its own
    // shuffle), so it mirrors the fleet's composition whatever the waves take; it becomes the last
    // wave, and until then every wave's fleet-scale control includes it.
    // Sized at the base rates measured over the fleet's history where there are enough, else the
    // defaults; the sizing says which.
    let sizing = crate::soak::soak_sizing(
        policy,
        eligible.len(),
        &BTreeMap::new(),
        base_rates,
        crate::baseline::DEFAULT_GPUS_PER_NODE,
    );
    let mut holdback: Option<Assigned> = None;
    if let Some(sizing) = &sizing {
        if sizing.holdback_nodes == 0 {
            notes.push(format!(
                "no holdback: {} eligible node(s) cannot spare one, so the soak has no control and the release is \
                 never fleet-proven by this rollout",
                eligible.len()
            ));
        } else {
            let stratify = policy.waves.first().map(|w| w.stratify_by.clone()).unwrap_or_default();
            let pool: Vec<&NodeSnapshot> = remaining.iter().map(|&i| nodes[i]).collect();
            let dims = choose_dims(&stratify, &pool);
            let mut rng = SplitMix64::derive(seed, "holdback", 0);
            let order = stratified_order(remaining.clone(), &nodes, &dims, &mut rng);
            let selected: Vec<Idx> = order.into_iter().take(sizing.holdback_nodes).collect();
            let chosen: BTreeSet<Idx> = selected.iter().copied().collect();
            remaining.retain(|i| !chosen.contains(i));
            holdback = Some(Assigned {
                policy_index: HOLDBACK_INDEX,
                nodes: selected,
                caps: None,
                relaxations: Vec::new(),
                dims: dims.iter().map(|d| d.name().to_owned()).collect(),
            });
        }
    }
    let mut assigned: Vec<Assigned> = Vec::new();
    for (k, wave) in policy.waves.iter().enumerate() {
        if remaining.is_empty() {
            notes.push(format!(
                "wave {:?} is empty: earlier waves took every eligible node",
                wave.name
            ));
            continue;
        }
        let size = match wave.size {
            // The last wave takes the rest even if a policy ended otherwise
            // (validation forbids it), so no eligible node is left unplanned.
            _ if k + 1 == policy.waves.len() => remaining.len(),
            WaveSize::Rest => remaining.len(),
            size => size.nodes(eligible.len(), remaining.len()),
        };
        if size == 0 {
            notes.push(format!("wave {:?} is empty: its size rounds to zero nodes", wave.name));
            continue;
        }
        let pool: Vec<&NodeSnapshot> = remaining.iter().map(|&i| nodes[i]).collect();
        let dims = choose_dims(&wave.stratify_by, &pool);
        let mut rng = SplitMix64::derive(seed, "wave", k as u64);
        let order = stratified_order(remaining.clone(), &nodes, &dims, &mut rng);
        let (selected, caps, relaxations) = if size >= remaining.len() {
            (order, None, Vec::new())
        } else {
            let caps = WaveCaps {
                wave_size: size,
                pool: remaining.len(),
                per_rack: policy.concurrency.per_rack,
                per_nvlink_domain: policy.concurrency.per_domain,
                per_cluster_percent: policy.concurrency.per_cluster_percent,
            };
            let (selected, relaxations) = select_with_caps(&order, size, &nodes, &caps, &cluster_sizes);
            (selected, Some(caps), relaxations)
        };
        for r in &relaxations {
            notes.push(format!(
                "wave {:?} takes {} nodes from {:?} {}, above its cap of {}: the strata overlap and no spread \
                 within the caps reached the wave's size",
                wave.name, r.planned, r.dimension, r.stratum, r.limit
            ));
        }
        let chosen: BTreeSet<Idx> = selected.iter().copied().collect();
        remaining.retain(|i| !chosen.contains(i));
        let dim_names = dims.iter().map(|d| d.name().to_owned()).collect();
        assigned.push(Assigned {
            policy_index: k,
            nodes: selected,
            caps,
            relaxations,
            dims: dim_names,
        });
    }

    // The soak is the bake of the last wave the plan reaches; the holdback follows it.
    let soak_wave = holdback.as_ref().and(assigned.len().checked_sub(1));
    if let (Some(h), Some(_)) = (holdback.take(), soak_wave) {
        assigned.push(h);
    }
    let mut wave_of: BTreeMap<Idx, usize> = BTreeMap::new();
    for (w, a) in assigned.iter().enumerate() {
        for &i in &a.nodes {
            wave_of.insert(i, w);
        }
    }

    // Comparability classes of every node that could be a control.
    let classes: Vec<Option<ClassKey>> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let usable = wave_of.contains_key(&i)
                || (node.state == NodeState::Active && node.health.healthy && node.health.rma_hold.is_none());
            usable.then(|| class_of(node, policy)).flatten()
        })
        .collect();

    let mut waves = Vec::with_capacity(assigned.len());
    let wave_count = assigned.len();
    let wave_names: Vec<&str> = assigned
        .iter()
        .map(|a| {
            policy
                .waves
                .get(a.policy_index)
                .map_or(HOLDBACK_WAVE, |w| w.name.as_str())
        })
        .collect();
    for (w, a) in assigned.iter().enumerate() {
        let k = a.policy_index;
        let selected = &a.nodes;
        let Some(spec) = policy.waves.get(k) else {
            waves.push(holdback_wave(a, &nodes, &verdicts, policy, later_blocker.clone()));
            continue;
        };
        let control = control_cohort(
            &CohortInputs {
                wave_count,
                nodes: &nodes,
                classes: &classes,
                wave_of: &wave_of,
                verdicts: &verdicts,
                wave_names: &wave_names,
                seed,
            },
            w,
            selected,
        );
        if let ControlPlan::Cohort { shortfalls, .. } = &control {
            for s in shortfalls {
                notes.push(format!(
                    "wave {:?}: only {} of {} wanted control nodes for platform {} at {}",
                    spec.name,
                    s.found,
                    s.wanted,
                    s.platform,
                    s.versions.join("+")
                ));
            }
        }
        let blocked = if k > 0 { later_blocker.clone() } else { None };
        let is_soak = soak_wave == Some(w);
        // The soak wave bakes at least the soak's minimum: its bake is the soak.
        let bake = match (&policy.detection.soak, is_soak) {
            (Some(soak), true) => spec.bake.max(soak.min),
            _ => spec.bake,
        };
        waves.push(WavePlan {
            index: k,
            name: spec.name.clone(),
            size_rule: match spec.size {
                WaveSize::Count(count) => SizeRule::Count { count },
                WaveSize::Percent(percent) => SizeRule::Percent { percent },
                WaveSize::Rest => SizeRule::Rest,
            },
            blocked,
            bake_seconds: bake.num_seconds(),
            bake: format_duration(bake),
            approval: match spec.approval {
                Approval::Auto => ApprovalRule::Auto,
                Approval::Manual { approvers } => ApprovalRule::Manual { approvers },
            },
            max_in_flight: spec.max_in_flight.min(policy.concurrency.max_in_flight),
            gates: spec.gates.clone(),
            stratified_by: a.dims.clone(),
            caps: a.caps.clone(),
            cap_relaxations: a.relaxations.clone(),
            nodes: selected
                .iter()
                .filter_map(|&i| node_plan(nodes[i], &verdicts[i]))
                .collect(),
            control,
            role: is_soak.then_some(WaveRole::Soak),
        });
    }
    let soak = match (&policy.detection.soak, sizing, soak_wave, waves.last()) {
        (Some(spec), Some(sizing), Some(w), Some(last)) if last.role == Some(WaveRole::Holdback) => {
            notes.push(sizing.statement());
            Some(SoakPlan {
                soak_wave: waves[w].name.clone(),
                min_seconds: spec.min.num_seconds(),
                max_seconds: spec.max.num_seconds(),
                holdback: last.nodes.iter().map(|n| n.node).collect(),
                sizing,
            })
        }
        _ => None,
    };
    if let Some(WaveBlocker::AwaitingQualification { state, missing_gates }) = &later_blocker
        && waves.len() > 1
    {
        notes.push(format!(
            "release is {state}: only the canary may run until it is qualified (missing gates: {})",
            if missing_gates.is_empty() {
                "none".to_owned()
            } else {
                missing_gates.join(", ")
            }
        ));
    }

    let rollback = assess_rollback(policy, release, &nodes, &verdicts, &wave_of);
    let eligibility: Vec<NodeEligibility> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| NodeEligibility {
            node: node.id,
            name: node.name.clone(),
            outcome: match (&verdicts[i], wave_of.get(&i)) {
                (Err(reason), _) => Outcome::Excluded { reason: reason.clone() },
                (Ok(_), Some(&w)) => Outcome::Planned {
                    wave: waves[w].name.clone(),
                },
                // Every eligible node is in a wave: the last wave takes the rest.
                (Ok(_), None) => Outcome::Planned { wave: String::new() },
            },
        })
        .collect();
    let mut excluded = BTreeMap::new();
    for verdict in &verdicts {
        if let Err(reason) = verdict {
            *excluded.entry(reason.code().to_owned()).or_default() += 1;
        }
    }
    let summary = PlanSummary {
        nodes: nodes.len(),
        planned: wave_of.len(),
        steps: waves.iter().flat_map(|w| &w.nodes).map(|n| n.steps.len()).sum(),
        excluded,
    };
    Ok(Plan {
        format_version: PLAN_FORMAT_VERSION,
        fingerprint: fingerprint(&nodes, policy, release, seed, planned_at, base_rates),
        policy: policy.name.clone(),
        release: ReleaseSummary {
            id: release.id,
            kind: release.kind,
            version: release.version.clone(),
            image_uri: release.image_uri.clone(),
            sha256: release.sha256.clone(),
            qualification: release.qualification,
        },
        seed,
        planned_at,
        rollback,
        summary,
        waves,
        eligibility,
        notes,
        soak,
    })
}

/// The holdback wave: its nodes stay on the old version through every wave and the soak (they are
/// the soak's control), then are updated with their own steps once the soak passed. It has no gates
/// and no bake of its own: the release is fleet-proven by then, and the nodes' update is watched
/// by the step machine like every other (intent before effect, the version expected before and
/// read back after).
fn holdback_wave(
    a: &Assigned,
    nodes: &[&NodeSnapshot],
    verdicts: &[Result<Eligible, ExclusionReason>],
    policy: &Policy,
    blocked: Option<WaveBlocker>,
) -> WavePlan {
    // The last policy wave's rate: the holdback is the end of the rollout, like the wave before it.
    let max_in_flight = policy
        .waves
        .last()
        .map_or(policy.concurrency.max_in_flight, |w| w.max_in_flight)
        .min(policy.concurrency.max_in_flight);
    WavePlan {
        index: policy.waves.len(),
        name: HOLDBACK_WAVE.to_owned(),
        size_rule: SizeRule::Count {
            count: u32::try_from(a.nodes.len()).unwrap_or(u32::MAX),
        },
        blocked,
        bake_seconds: 0,
        bake: format_duration(chrono::TimeDelta::zero()),
        approval: ApprovalRule::Auto,
        max_in_flight,
        gates: Vec::new(),
        stratified_by: a.dims.clone(),
        caps: None,
        cap_relaxations: Vec::new(),
        nodes: a
            .nodes
            .iter()
            .filter_map(|&i| node_plan(nodes[i], &verdicts[i]))
            .collect(),
        control: ControlPlan::Unavailable {
            reason: "the holdback is the soak's control; it is updated once the soak passed".to_owned(),
        },
        role: Some(WaveRole::Holdback),
    }
}

/// Refuses releases no rollout may use; returns the blocker for waves after
/// the canary when the release may run the canary only.
fn check_release(policy: &Policy, release: &ReleaseSpec) -> Result<Option<WaveBlocker>, PlanError> {
    if policy.target.component != release.kind {
        return Err(PlanError::KindMismatch {
            policy: policy.name.clone(),
            policy_kind: policy.target.component,
            release: release.id,
            release_kind: release.kind,
        });
    }
    if release.sha256.len() != 64 || !release.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(PlanError::BadImageDigest {
            release: release.id,
            sha256: release.sha256.clone(),
        });
    }
    match release.qualification {
        QualificationState::Blocked => {
            return Err(PlanError::ReleaseBlocked {
                release: release.id,
                version: release.version.as_str().to_owned(),
            });
        }
        QualificationState::Deprecated => {
            return Err(PlanError::ReleaseDeprecated {
                release: release.id,
                version: release.version.as_str().to_owned(),
            });
        }
        _ => {}
    }
    let Some(missing_gates) =
        orchestrator_types::qualification_hold(release.qualification, &policy.qualification.required_gates, |g| {
            release.passed_gates.contains(g)
        })
    else {
        return Ok(None);
    };
    if policy.qualification.allow_unqualified_canary {
        Ok(Some(WaveBlocker::AwaitingQualification {
            state: release.qualification,
            missing_gates,
        }))
    } else {
        Err(PlanError::NotQualified {
            release: release.id,
            state: release.qualification,
            policy: policy.name.clone(),
            missing_gates,
        })
    }
}

/// The snapshot in node-id order, so the plan does not depend on the order
/// the database returned rows in.
fn sorted_nodes(snapshot: &FleetSnapshot) -> Result<Vec<&NodeSnapshot>, PlanError> {
    let mut nodes: Vec<&NodeSnapshot> = snapshot.nodes.iter().collect();
    nodes.sort_by_key(|n| n.id);
    for pair in nodes.windows(2) {
        if pair[0].id == pair[1].id {
            return Err(PlanError::DuplicateNodeId { node: pair[0].id });
        }
    }
    let mut names = BTreeSet::new();
    for node in &nodes {
        if !names.insert(node.name.as_str()) {
            return Err(PlanError::DuplicateNodeName {
                name: node.name.clone(),
            });
        }
    }
    Ok(nodes)
}

/// A node's comparability class, if it has target components at all.
fn class_of(node: &NodeSnapshot, policy: &Policy) -> Option<ClassKey> {
    let versions: BTreeSet<String> = matching_components(node, policy)
        .into_iter()
        .map(|c| c.version.clone())
        .collect();
    (!versions.is_empty()).then(|| (node.platform.clone(), versions.into_iter().collect()))
}

/// What every wave's control cohort is drawn from: the whole plan's nodes
/// and where each went.
#[derive(Debug, Clone, Copy)]
struct CohortInputs<'a> {
    wave_count: usize,
    nodes: &'a [&'a NodeSnapshot],
    classes: &'a [Option<ClassKey>],
    wave_of: &'a BTreeMap<Idx, usize>,
    verdicts: &'a [Result<Eligible, ExclusionReason>],
    wave_names: &'a [&'a str],
    seed: u64,
}

/// Picks wave `w`'s control cohort (see the crate documentation).
fn control_cohort(inputs: &CohortInputs<'_>, w: usize, wave: &[Idx]) -> ControlPlan {
    let CohortInputs {
        wave_count,
        nodes,
        classes,
        wave_of,
        verdicts,
        wave_names,
        seed,
    } = *inputs;
    let total_wanted = wave.len().clamp(MIN_CONTROL_COHORT, MAX_CONTROL_COHORT);
    let wave_clusters: BTreeSet<&str> = wave.iter().map(|&i| nodes[i].cluster.as_str()).collect();
    let mut per_class: BTreeMap<&ClassKey, usize> = BTreeMap::new();
    for &i in wave {
        if let Some(class) = &classes[i] {
            *per_class.entry(class).or_default() += 1;
        }
    }
    let mut rng = SplitMix64::derive(seed, "control", w as u64);
    let mut members = Vec::new();
    let mut shortfalls = Vec::new();
    let mut wanted_sum = 0;
    for (class, in_wave) in per_class {
        // Proportional to the class's share of the wave, rounded up, so
        // every class of the wave has controls.
        let wanted = (total_wanted * in_wave).div_ceil(wave.len());
        wanted_sum += wanted;
        // Preference tiers: later waves in the wave's clusters, later waves
        // elsewhere, nodes outside the rollout in the wave's clusters, and
        // outside the rollout elsewhere.
        let mut tiers: [Vec<Idx>; 4] = Default::default();
        for (i, node_class) in classes.iter().enumerate() {
            if node_class.as_ref() != Some(class) {
                continue;
            }
            let local = wave_clusters.contains(nodes[i].cluster.as_str());
            let tier = match wave_of.get(&i) {
                Some(&other) if other > w => usize::from(!local),
                Some(_) => continue,
                None if verdicts[i].is_err() => 2 + usize::from(!local),
                // Eligible but unassigned cannot happen; never a control.
                None => continue,
            };
            tiers[tier].push(i);
        }
        let mut found = 0;
        for tier in tiers {
            if found == wanted {
                break;
            }
            let pool: Vec<&NodeSnapshot> = tier.iter().map(|&i| nodes[i]).collect();
            let dims = choose_dims(&[], &pool);
            for i in stratified_order(tier, nodes, &dims, &mut rng) {
                if found == wanted {
                    break;
                }
                let source = match (wave_of.get(&i), &verdicts[i]) {
                    (Some(&other), _) => ControlSource::LaterWave {
                        wave: wave_names[other].to_owned(),
                    },
                    (None, Err(reason)) => ControlSource::OutsideRollout {
                        excluded: reason.code().to_owned(),
                    },
                    (None, Ok(_)) => continue,
                };
                members.push(ControlMember {
                    node: nodes[i].id,
                    name: nodes[i].name.clone(),
                    cluster: nodes[i].cluster.clone(),
                    source,
                });
                found += 1;
            }
        }
        if found < wanted {
            shortfalls.push(ControlShortfall {
                platform: class.0.clone(),
                versions: class.1.clone(),
                wanted,
                found,
            });
        }
    }
    if members.is_empty() {
        let reason = if w + 1 == wave_count {
            "last wave: every comparable node (same platform and current version) is in this wave or an \
             earlier one, so none stays on the old version while it bakes"
        } else {
            "no comparable node (same platform and current version) stays on the old version while this wave bakes"
        };
        return ControlPlan::Unavailable {
            reason: reason.to_owned(),
        };
    }
    ControlPlan::Cohort {
        wanted: wanted_sum,
        members,
        shortfalls,
    }
}

fn node_plan(node: &NodeSnapshot, verdict: &Result<Eligible, ExclusionReason>) -> Option<NodePlan> {
    let eligible = verdict.as_ref().ok()?;
    Some(NodePlan {
        node: node.id,
        name: node.name.clone(),
        platform: node.platform.clone(),
        cluster: node.cluster.clone(),
        rack: node.rack.clone(),
        nvlink_domain: node.nvlink_domain.clone(),
        steps: eligible.steps.clone(),
        already_at_target: eligible.already_at_target.clone(),
    })
}

/// Whether the planned steps can be undone by re-flashing each component's
/// previous version. The policy's `versions.allow_downgrade: false` does not
/// block rollback: it refuses *releases* older than what runs, while a
/// rollback restores the exact version recorded before the flash, the one
/// downgrade the engine performs. What blocks it is the release or the
/// component refusing older images.
fn assess_rollback(
    policy: &Policy,
    release: &ReleaseSpec,
    nodes: &[&NodeSnapshot],
    verdicts: &[Result<Eligible, ExclusionReason>],
    wave_of: &BTreeMap<Idx, usize>,
) -> RollbackAssessment {
    let mut blockers = Vec::new();
    if let Some(reason) = &release.downgrade_forbidden {
        blockers.push(RollbackBlocker::ReleaseForbidsDowngrade { reason: reason.clone() });
    }
    let mut below_floor = Vec::new();
    let mut refusing = Vec::new();
    for &i in wave_of.keys() {
        let Ok(eligible) = &verdicts[i] else { continue };
        for component in &eligible.updated {
            let step = format!("{}/{}", nodes[i].name, component.inventory_id);
            if release
                .rollback_floor
                .as_ref()
                .is_some_and(|floor| component.current < *floor)
            {
                below_floor.push(step.clone());
            }
            if component.downgrade_forbidden {
                refusing.push(step);
            }
        }
    }
    if let Some(floor) = &release.rollback_floor
        && !below_floor.is_empty()
    {
        blockers.push(RollbackBlocker::BelowRollbackFloor {
            floor: floor.clone(),
            steps: below_floor,
        });
    }
    if !refusing.is_empty() {
        blockers.push(RollbackBlocker::ComponentForbidsDowngrade { steps: refusing });
    }
    RollbackAssessment {
        possible: blockers.is_empty(),
        blockers,
        automatic: policy.rollback.automatic,
        scope: match policy.rollback.scope {
            RollbackScope::Wave => "wave",
            RollbackScope::Rollout => "rollout",
        }
        .to_owned(),
    }
}

/// sha256 over a canonical rendering of every input (the measured base rates
/// with the soak they size). The policy enters as
/// the debug rendering of the parts that shape a plan (target, versions,
/// qualification, waves, concurrency, rollback); maintenance windows and
/// health gates do not change which node goes where.
fn fingerprint(
    nodes: &[&NodeSnapshot],
    policy: &Policy,
    release: &ReleaseSpec,
    seed: u64,
    planned_at: DateTime<Utc>,
    base_rates: &BTreeMap<String, f64>,
) -> String {
    #[derive(serde::Serialize)]
    struct Canonical<'a> {
        format_version: u32,
        nodes: CanonicalNodes<'a>,
        release: &'a ReleaseSpec,
        policy: String,
        seed: u64,
        planned_at: DateTime<Utc>,
    }
    /// Each node with its components in inventory order, rendered one at a time: a rendering of
    /// the whole fleet at once held a second copy of a 100,000-node snapshot.
    struct CanonicalNodes<'a>(&'a [&'a NodeSnapshot]);
    impl serde::Serialize for CanonicalNodes<'_> {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeSeq as _;
            let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
            for node in self.0 {
                let mut node = (*node).clone();
                node.components.sort_by(|a, b| a.inventory_id.cmp(&b.inventory_id));
                seq.serialize_element(&node)?;
            }
            seq.end()
        }
    }
    /// The digest fed as the JSON is written, so the rendering (tens of bytes a component) is
    /// never held whole.
    struct Hashing(Sha256);
    impl std::io::Write for Hashing {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.update(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let canonical = Canonical {
        format_version: PLAN_FORMAT_VERSION,
        nodes: CanonicalNodes(nodes),
        release,
        policy: format!(
            "{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}{}",
            policy.name,
            policy.target,
            policy.versions,
            policy.qualification,
            policy.waves,
            policy.concurrency,
            policy.rollback,
            // The soak shapes the plan (the holdback), and so do the measured base rates that size
            // it; without a soak the rendering, and every fingerprint of a policy without one, is
            // unchanged, and so is a soak's without measured rates.
            match (&policy.detection.soak, policy.detection.enabled) {
                (Some(soak), true) if base_rates.is_empty() => format!("\n{soak:?}"),
                (Some(soak), true) => format!("\n{soak:?}\nbase rates {base_rates:?}"),
                _ => String::new(),
            }
        ),
        seed,
        planned_at,
    };
    // Serialising plain data with string keys into a digest cannot fail; the bytes are those
    // `serde_json::to_vec` wrote before, so a plan's fingerprint is what it was.
    let mut digest = Hashing(Sha256::new());
    let _ = serde_json::to_writer(&mut digest, &canonical);
    hex::encode(digest.0.finalize())
}
