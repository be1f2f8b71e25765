//! Property tests of the plan's invariants over generated fleets and
//! policies.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use orchestrator_planner::{
    CapDimension, FleetSnapshot, NodeSnapshot, Outcome, Plan, PlanInput, ReleaseSpec, cap_strata, plan,
};
use orchestrator_policy::{Policy, WaveSize};
use orchestrator_types::{NodeId, NodeState, QualificationState};
use proptest::prelude::*;

/// One generated node: cluster, rack in cluster, domain in rack (or, for
/// non-nested fleets, across racks), platform, version, state, health.
#[derive(Debug, Clone)]
struct GenNode {
    cluster: u8,
    rack: u8,
    domain: u8,
    b200: bool,
    version: u8,
    state: u8,
    healthy: bool,
    staging: bool,
}

fn gen_node() -> impl Strategy<Value = GenNode> {
    (
        0u8..4,
        0u8..5,
        0u8..3,
        prop::bool::weighted(0.15),
        0u8..10,
        0u8..20,
        prop::bool::weighted(0.93),
        prop::bool::weighted(0.05),
    )
        .prop_map(
            |(cluster, rack, domain, b200, version, state, healthy, staging)| GenNode {
                cluster,
                rack,
                domain,
                b200,
                version,
                state,
                healthy,
                staging,
            },
        )
}

/// Builds the snapshot. `nested`: domains are named within their rack, so
/// strata nest (domain ⊂ rack ⊂ cluster); otherwise a domain spans racks.
fn build_fleet(fleet_gen: &[GenNode], nested: bool) -> FleetSnapshot {
    let nodes = fleet_gen
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let id = i as i64 + 1;
            let rack = format!("r{}", g.rack);
            let domain = if nested {
                format!("{rack}-d{}", g.domain)
            } else {
                format!("d{}", g.domain)
            };
            let mut n = node(id, &format!("n{id:03}"), &format!("c{}", g.cluster), &rack, &domain);
            if g.b200 {
                n.platform = "hgx-b200-8gpu".into();
            }
            let version = match g.version {
                0..=5 => GPU_OLD,
                6..=7 => GPU_OLDER,
                8 => GPU_TARGET,
                _ => "96.00.48.00.00",
            };
            n.components = gpu_components(version);
            n.components.push(bmc_component(if g.version % 2 == 0 {
                "24.04.1"
            } else {
                "24.04.2-rc2"
            }));
            n.state = match g.state {
                0 => NodeState::Maintenance,
                1 => NodeState::Quarantined,
                _ => NodeState::Active,
            };
            n.health.healthy = g.healthy;
            if g.staging {
                n.labels.insert("environment".into(), "staging".into());
            }
            n
        })
        .collect();
    FleetSnapshot { nodes }
}

#[derive(Debug, Clone)]
struct GenPolicy {
    canary: u32,
    second_count: Option<u32>,
    percents: Vec<u32>,
    per_rack: Option<u32>,
    per_domain: Option<u32>,
    per_cluster_percent: Option<u32>,
    stratify_rack: bool,
    bmc: bool,
}

fn gen_policy() -> impl Strategy<Value = GenPolicy> {
    (
        1u32..12,
        prop::option::of(0u32..10),
        prop::collection::vec(1u32..45, 0..3),
        prop::option::of(1u32..4),
        prop::option::of(1u32..3),
        prop::option::of(1u32..60),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(canary, second, mut percents, per_rack, per_domain, per_cluster_percent, stratify_rack, bmc)| {
                percents.sort();
                // Percentage waves must add up to less than 100.
                while percents.iter().sum::<u32>() >= 100 {
                    percents.pop();
                }
                GenPolicy {
                    canary,
                    second_count: second.map(|extra| canary + extra),
                    percents,
                    per_rack,
                    per_domain,
                    per_cluster_percent,
                    stratify_rack,
                    bmc,
                }
            },
        )
}

fn build_policy(g: &GenPolicy) -> Policy {
    let mut waves = format!(
        "  - name: canary\n    count: {}\n    bake: 1h\n{}",
        g.canary,
        if g.stratify_rack {
            "    stratify_by: [rack, nvlink_domain]\n"
        } else {
            ""
        }
    );
    if let Some(count) = g.second_count {
        waves.push_str(&format!("  - name: second\n    count: {count}\n    bake: 1h\n"));
    }
    for (i, p) in g.percents.iter().enumerate() {
        waves.push_str(&format!("  - name: pct{i}\n    percent: {p}\n    bake: 1h\n"));
    }
    waves.push_str("  - name: rest\n    rest: true\n    bake: 1h\n");
    let mut concurrency = "  max_in_flight: 50\n".to_owned();
    if let Some(n) = g.per_rack {
        concurrency.push_str(&format!("  per_rack: {n}\n"));
    }
    if let Some(n) = g.per_domain {
        concurrency.push_str(&format!("  per_nvlink_domain: {n}\n"));
    }
    if let Some(n) = g.per_cluster_percent {
        concurrency.push_str(&format!("  per_cluster_percent: {n}\n"));
    }
    let target = if g.bmc {
        "  component: bmc\n  inventory_id: BMC_Firmware\n  platforms: [hgx-h100-8gpu, hgx-b200-8gpu]\n"
    } else {
        "  component: gpu\n  inventory_id: \"HGX_FW_GPU_*\"\n  platforms: [hgx-h100-8gpu]\n  selector:\n    environment: [production]\n"
    };
    let from = if g.bmc {
        "[\"24.04.1\", \"24.04.2-rc2\"]"
    } else {
        "\">= 96.00.50.00.00\""
    };
    parse(&format!(
        "name: prop\ntarget:\n{target}versions:\n  from: {from}\nwaves:\n{waves}concurrency:\n{concurrency}\
         failure_budget:\n  max_failed: 0\nrollback:\n  automatic: true\n  scope: wave\n"
    ))
}

fn release_for(g: &GenPolicy) -> ReleaseSpec {
    if g.bmc {
        bmc_release()
    } else {
        gpu_release(QualificationState::Qualified)
    }
}

fn make(snapshot: &FleetSnapshot, policy: &Policy, release: &ReleaseSpec, seed: u64) -> Plan {
    plan(&PlanInput {
        snapshot,
        policy,
        release,
        seed,
        planned_at: instant(),
        base_rates: &std::collections::BTreeMap::new(),
    })
    .expect("generated inputs always plan")
}

/// Every invariant a plan must keep.
fn check_invariants(snapshot: &FleetSnapshot, policy: &Policy, plan: &Plan) -> Result<(), TestCaseError> {
    let by_id: BTreeMap<NodeId, &NodeSnapshot> = snapshot.nodes.iter().map(|n| (n.id, n)).collect();

    // Eligibility covers every node once; planned ones are exactly the wave members.
    let listed: BTreeSet<NodeId> = plan.eligibility.iter().map(|e| e.node).collect();
    prop_assert_eq!(listed.len(), snapshot.nodes.len());
    prop_assert_eq!(plan.eligibility.len(), snapshot.nodes.len());
    let eligible: BTreeSet<NodeId> = plan
        .eligibility
        .iter()
        .filter(|e| matches!(e.outcome, Outcome::Planned { .. }))
        .map(|e| e.node)
        .collect();
    let mut seen = BTreeSet::new();
    for wave in &plan.waves {
        prop_assert!(!wave.nodes.is_empty(), "no empty wave is listed");
        for n in &wave.nodes {
            prop_assert!(seen.insert(n.node), "node {} in two waves", n.node);
            prop_assert!(!n.steps.is_empty());
        }
    }
    prop_assert_eq!(&seen, &eligible, "every eligible node planned exactly once");
    for e in &plan.eligibility {
        if let Outcome::Planned { wave } = &e.outcome {
            let w = plan.wave_of(e.node).expect("planned node has a wave");
            prop_assert_eq!(&plan.waves[w].name, wave);
        }
    }

    // Wave sizes follow the policy; only the canary runs unblocked when so marked.
    let total = eligible.len();
    let mut remaining = total;
    let policy_waves: Vec<_> = policy.waves.iter().collect();
    for wave in &plan.waves {
        let spec = policy_waves[wave.index];
        let want = if wave.index + 1 == policy_waves.len() {
            remaining
        } else {
            spec.size.nodes(total, remaining)
        };
        prop_assert_eq!(wave.nodes.len(), want, "wave {} size", &wave.name);
        if let WaveSize::Percent(_) = spec.size {
            prop_assert!(
                !wave.nodes.is_empty(),
                "a percent wave with nodes left takes at least one"
            );
        }
        remaining -= wave.nodes.len();
        prop_assert!(wave.max_in_flight <= policy.concurrency.max_in_flight);
    }
    prop_assert_eq!(remaining, 0);

    // Caps: recount every stratum from the plan itself.
    let mut cluster_sizes: BTreeMap<&str, usize> = BTreeMap::new();
    for n in &snapshot.nodes {
        *cluster_sizes.entry(n.cluster.as_str()).or_default() += 1;
    }
    let mut earlier: BTreeSet<NodeId> = BTreeSet::new();
    for wave in &plan.waves {
        prop_assert!(
            wave.cap_relaxations.is_empty(),
            "no cap relaxed: {:?}",
            &wave.cap_relaxations
        );
        if let Some(caps) = &wave.caps {
            let mut pool: BTreeMap<(CapDimension, String), usize> = BTreeMap::new();
            for id in eligible.difference(&earlier) {
                for s in cap_strata(by_id[id]) {
                    *pool.entry(s).or_default() += 1;
                }
            }
            prop_assert_eq!(caps.pool, eligible.len() - earlier.len());
            let mut taken: BTreeMap<(CapDimension, String), (usize, &str)> = BTreeMap::new();
            for n in &wave.nodes {
                for s in cap_strata(by_id[&n.node]) {
                    taken.entry(s).or_insert((0, by_id[&n.node].cluster.as_str())).0 += 1;
                }
            }
            for (stratum, (count, cluster)) in &taken {
                let Some(limit) = caps.limit(stratum.0, pool[stratum], cluster_sizes[cluster]) else {
                    continue;
                };
                prop_assert!(
                    *count <= limit,
                    "wave {} exceeds its cap: {:?} {} > {}",
                    &wave.name,
                    stratum,
                    count,
                    limit
                );
            }
        } else {
            prop_assert_eq!(
                wave.nodes.len(),
                eligible.len() - earlier.len(),
                "only a wave taking every remaining node is uncapped"
            );
        }
        earlier.extend(wave.nodes.iter().map(|n| n.node));
    }

    // Control cohorts: disjoint from the wave and earlier waves, comparable,
    // healthy and active.
    let class = |id: NodeId| -> (String, BTreeSet<String>) {
        let n = by_id[&id];
        let versions = n
            .components
            .iter()
            .filter(|c| {
                c.kind == policy.target.component
                    && policy
                        .target
                        .inventory_id
                        .as_ref()
                        .is_none_or(|p| p.matches(&c.inventory_id))
            })
            .map(|c| c.version.clone())
            .collect();
        (n.platform.clone(), versions)
    };
    let mut upto: BTreeSet<NodeId> = BTreeSet::new();
    for (w, wave) in plan.waves.iter().enumerate() {
        upto.extend(wave.nodes.iter().map(|n| n.node));
        let classes: BTreeSet<_> = wave.nodes.iter().map(|n| class(n.node)).collect();
        let mut members = BTreeSet::new();
        for m in wave.control.members() {
            prop_assert!(members.insert(m.node), "control listed twice");
            prop_assert!(
                !upto.contains(&m.node),
                "control {} of wave {} is updated by then",
                m.name,
                w
            );
            prop_assert!(classes.contains(&class(m.node)), "control {} is comparable", m.name);
            let n = by_id[&m.node];
            prop_assert!(n.state == NodeState::Active && n.health.healthy);
        }
    }

    // Steps: what the snapshot read, never a component already at target.
    for (_, node, step) in plan.steps() {
        let snap = by_id[&node.node];
        let c = snap
            .components
            .iter()
            .find(|c| c.inventory_id == step.inventory_id)
            .expect("component exists");
        prop_assert_eq!(&step.expected_current, &c.version);
        prop_assert_ne!(step.expected_current.as_str(), &*step.target);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_for_nested_fleets(
        fleet_gen in prop::collection::vec(gen_node(), 1..140),
        g in gen_policy(),
        seed in any::<u64>(),
        other_seed in any::<u64>(),
    ) {
        let snapshot = build_fleet(&fleet_gen, true);
        let policy = build_policy(&g);
        let release = release_for(&g);
        let a = make(&snapshot, &policy, &release, seed);
        check_invariants(&snapshot, &policy, &a)?;

        // Same inputs and seed: the same plan, whatever the snapshot order.
        let again = make(&snapshot, &policy, &release, seed);
        prop_assert_eq!(&a, &again);
        let mut shuffled = snapshot.clone();
        shuffled.nodes.reverse();
        prop_assert_eq!(&a, &make(&shuffled, &policy, &release, seed));

        // Another seed may choose differently; the invariants still hold.
        let b = make(&snapshot, &policy, &release, other_seed);
        check_invariants(&snapshot, &policy, &b)?;
        let fate = |p: &Plan| -> Vec<Option<orchestrator_planner::ExclusionReason>> {
            p.eligibility
                .iter()
                .map(|e| match &e.outcome {
                    Outcome::Excluded { reason } => Some(reason.clone()),
                    Outcome::Planned { .. } => None,
                })
                .collect()
        };
        prop_assert_eq!(fate(&a), fate(&b), "eligibility does not depend on the seed");
    }

    #[test]
    fn crossing_racks_and_domains_keep_caps_too(
        fleet_gen in prop::collection::vec(gen_node(), 1..140),
        g in gen_policy(),
        seed in any::<u64>(),
    ) {
        let snapshot = build_fleet(&fleet_gen, false);
        let policy = build_policy(&g);
        let a = make(&snapshot, &policy, &release_for(&g), seed);
        check_invariants(&snapshot, &policy, &a)?;
    }
}
