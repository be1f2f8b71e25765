//! Focused behaviour: release checks, determinism, stratification, control
//! cohorts and the rollback assessment.

mod common;

use std::collections::BTreeSet;

use common::*;
use orchestrator_planner::{
    ControlPlan, ControlSource, FleetSnapshot, Plan, PlanError, PlanInput, ReleaseSpec, RollbackBlocker, WaveBlocker,
    plan,
};
use orchestrator_policy::Policy;
use orchestrator_types::{FirmwareVersion, NodeId, QualificationState};

fn run(snapshot: &FleetSnapshot, policy: &Policy, release: &ReleaseSpec, seed: u64) -> Result<Plan, PlanError> {
    plan(&PlanInput {
        snapshot,
        policy,
        release,
        seed,
        planned_at: instant(),
        base_rates: &std::collections::BTreeMap::new(),
    })
}

fn hgx() -> Policy {
    hgx_policy()
}

fn bmc() -> Policy {
    policy_file("bmc-firmware.yaml")
}

#[test]
fn blocked_and_deprecated_releases_are_refused() {
    let fleet = fleet60();
    let err = run(&fleet, &hgx(), &gpu_release(QualificationState::Blocked), 1).unwrap_err();
    assert!(matches!(err, PlanError::ReleaseBlocked { .. }), "{err}");
    let err = run(&fleet, &hgx(), &gpu_release(QualificationState::Deprecated), 1).unwrap_err();
    assert!(matches!(err, PlanError::ReleaseDeprecated { .. }), "{err}");
}

#[test]
fn unqualified_release_without_canary_permission_is_an_error() {
    let mut release = bmc_release();
    release.qualification = QualificationState::Qualifying;
    let err = run(&fleet60(), &bmc(), &release, 1).unwrap_err();
    match err {
        PlanError::NotQualified { missing_gates, .. } => assert!(missing_gates.is_empty()),
        other => panic!("{other}"),
    }
    // Qualified in state but missing a gate this policy requires.
    let mut release = bmc_release();
    release.passed_gates.remove("bmc_soak");
    let err = run(&fleet60(), &bmc(), &release, 1).unwrap_err();
    assert_eq!(
        err.to_string(),
        "release 8 is qualified and policy bmc-firmware requires a qualified release (missing gates: bmc_soak)"
    );
}

#[test]
fn unqualified_release_runs_the_canary_only() {
    let plan = run(&fleet60(), &hgx(), &gpu_release(QualificationState::Registered), 1).expect("plan");
    assert!(plan.waves[0].blocked.is_none(), "the canary may run");
    for wave in &plan.waves[1..] {
        assert!(
            matches!(
                &wave.blocked,
                Some(WaveBlocker::AwaitingQualification {
                    state: QualificationState::Registered,
                    ..
                })
            ),
            "{} must wait for qualification",
            wave.name
        );
    }
    let qualified = run(&fleet60(), &hgx(), &gpu_release(QualificationState::Default), 1).expect("plan");
    assert!(qualified.waves.iter().all(|w| w.blocked.is_none()));
}

#[test]
fn release_inputs_are_checked() {
    let mut release = gpu_release(QualificationState::Qualified);
    release.sha256 = "abc".into();
    assert!(matches!(
        run(&fleet60(), &hgx(), &release, 1),
        Err(PlanError::BadImageDigest { .. })
    ));
    assert!(matches!(
        run(&fleet60(), &bmc(), &gpu_release(QualificationState::Qualified), 1),
        Err(PlanError::KindMismatch { .. })
    ));
}

#[test]
fn duplicate_nodes_are_refused() {
    let mut fleet = fleet60();
    let mut twin = fleet.nodes[3].clone();
    twin.name = "another-name".into();
    fleet.nodes.push(twin);
    assert_eq!(
        run(&fleet, &hgx(), &gpu_release(QualificationState::Qualified), 1),
        Err(PlanError::DuplicateNodeId { node: NodeId(4) })
    );
    let mut fleet = fleet60();
    let mut twin = fleet.nodes[3].clone();
    twin.id = NodeId(999);
    fleet.nodes.push(twin);
    assert!(matches!(
        run(&fleet, &hgx(), &gpu_release(QualificationState::Qualified), 1),
        Err(PlanError::DuplicateNodeName { .. })
    ));
}

#[test]
fn plan_does_not_depend_on_snapshot_order_and_follows_the_seed() {
    let release = gpu_release(QualificationState::Qualified);
    let fleet = fleet60();
    let a = run(&fleet, &hgx(), &release, 42).expect("plan");
    let mut reversed = fleet.clone();
    reversed.nodes.reverse();
    for node in &mut reversed.nodes {
        node.components.reverse();
    }
    let b = run(&reversed, &hgx(), &release, 42).expect("plan");
    assert_eq!(a, b, "same inputs in another order, same plan");
    let c = run(&fleet, &hgx(), &release, 43).expect("plan");
    assert_ne!(a.fingerprint, c.fingerprint);
    assert_ne!(
        waves_by_node(&a),
        waves_by_node(&c),
        "another seed picks other nodes (for this fleet and these two seeds)"
    );
    let mut later = fleet.clone();
    later.nodes[10].health.healthy = false;
    let d = run(&later, &hgx(), &release, 42).expect("plan");
    assert_ne!(a.fingerprint, d.fingerprint, "the fingerprint covers the snapshot");
}

#[test]
fn canary_is_spread_across_clusters_racks_and_platforms() {
    for seed in 0..20 {
        let plan = run(&fleet60(), &hgx(), &gpu_release(QualificationState::Qualified), seed).expect("plan");
        let canary = &plan.waves[0];
        assert_eq!(canary.nodes.len(), 8);
        let clusters: BTreeSet<_> = canary.nodes.iter().map(|n| &n.cluster).collect();
        let racks: BTreeSet<_> = canary.nodes.iter().map(|n| (&n.cluster, &n.rack)).collect();
        assert_eq!(clusters.len(), 3, "seed {seed}: every cluster");
        assert_eq!(racks.len(), 8, "seed {seed}: eight racks for eight nodes");

        let plan = run(&fleet60(), &bmc(), &bmc_release(), seed).expect("plan");
        let canary = &plan.waves[0];
        let platforms: BTreeSet<_> = canary.nodes.iter().map(|n| n.platform.as_str()).collect();
        assert_eq!(
            platforms,
            BTreeSet::from(["hgx-b200-8gpu", "hgx-h100-8gpu"]),
            "seed {seed}: the BMC canary covers both SKUs"
        );
    }
}

#[test]
fn control_cohorts_are_comparable_and_on_the_old_version() {
    let fleet = fleet60();
    let plan = run(&fleet, &hgx(), &gpu_release(QualificationState::Qualified), 5).expect("plan");
    let node = |id: NodeId| fleet.nodes.iter().find(|n| n.id == id).expect("node");
    let versions = |id: NodeId| -> BTreeSet<String> {
        node(id)
            .components
            .iter()
            .filter(|c| c.inventory_id.starts_with("HGX_FW_GPU_"))
            .map(|c| c.version.clone())
            .collect()
    };
    for (w, wave) in plan.waves.iter().enumerate() {
        let classes: BTreeSet<(String, BTreeSet<String>)> = wave
            .nodes
            .iter()
            .map(|n| (n.platform.clone(), versions(n.node)))
            .collect();
        for member in wave.control.members() {
            let class = (node(member.node).platform.clone(), versions(member.node));
            assert!(
                classes.contains(&class),
                "{}: control {} is comparable",
                wave.name,
                member.name
            );
            if let Some(other) = plan.wave_of(member.node) {
                assert!(other > w, "{}: control {} updates later", wave.name, member.name);
                assert!(matches!(member.source, ControlSource::LaterWave { .. }));
            } else {
                assert!(matches!(member.source, ControlSource::OutsideRollout { .. }));
            }
        }
    }
    // The canary's controls come from later waves, as many as wanted.
    match &plan.waves[0].control {
        ControlPlan::Cohort {
            wanted,
            members,
            shortfalls,
        } => {
            assert_eq!(*wanted, 16);
            assert_eq!(members.len(), 16);
            assert!(shortfalls.is_empty());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn last_wave_without_outsiders_has_no_control_and_says_why() {
    let mut nodes = Vec::new();
    for i in 0..30 {
        nodes.push(node(
            i + 1,
            &format!("gpu-{i:02}"),
            ["a", "b"][(i % 2) as usize],
            &format!("r{}", i % 6),
            "",
        ));
    }
    let plan = run(
        &FleetSnapshot { nodes },
        &hgx(),
        &gpu_release(QualificationState::Qualified),
        3,
    )
    .expect("plan");
    let last = plan.waves.last().expect("waves");
    match &last.control {
        ControlPlan::Unavailable { reason } => assert!(reason.starts_with("last wave"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(plan.waves[0].control, ControlPlan::Cohort { .. }));
}

#[test]
fn rollback_assessment() {
    let fleet = fleet60();
    let plan = run(&fleet, &hgx(), &gpu_release(QualificationState::Qualified), 1).expect("plan");
    assert!(plan.rollback.possible);
    assert!(plan.rollback.automatic);

    let mut release = gpu_release(QualificationState::Qualified);
    release.downgrade_forbidden = Some("image burns anti-rollback fuse SVN 4".into());
    let plan = run(&fleet, &hgx(), &release, 1).expect("plan");
    assert!(!plan.rollback.possible);
    assert_eq!(
        plan.rollback.blockers[0].to_string(),
        "rollback impossible: the release forbids downgrades (image burns anti-rollback fuse SVN 4)"
    );

    // Racks r5 and r6 run 96.00.58, below a floor of 96.00.5A.
    let mut release = gpu_release(QualificationState::Qualified);
    release.rollback_floor = Some(FirmwareVersion::parse("96.00.5A.00.00").expect("version"));
    let plan = run(&fleet, &hgx(), &release, 1).expect("plan");
    assert!(!plan.rollback.possible);
    match &plan.rollback.blockers[..] {
        [RollbackBlocker::BelowRollbackFloor { steps, .. }] => {
            assert_eq!(steps.len(), 10 * 8, "ten r5/r6 nodes, eight GPUs each");
            assert!(
                steps
                    .iter()
                    .all(|s| s.starts_with("gpu-r5-") || s.starts_with("gpu-r6-"))
            );
        }
        other => panic!("{other:?}"),
    }

    let mut fleet = fleet60();
    let n = fleet.nodes.iter_mut().find(|n| n.name == "gpu-r2-n01").expect("node");
    n.components[0].downgrade_forbidden = true;
    let plan = run(&fleet, &hgx(), &gpu_release(QualificationState::Qualified), 1).expect("plan");
    assert_eq!(
        plan.rollback.blockers,
        vec![RollbackBlocker::ComponentForbidsDowngrade {
            steps: vec!["gpu-r2-n01/HGX_FW_GPU_0".into()]
        }]
    );
    let json = serde_json::to_value(&plan).expect("serialise");
    let keys: Vec<&str> = json.as_object().expect("object").keys().map(String::as_str).collect();
    assert!(keys.contains(&"rollback"));
}

#[test]
fn steps_expect_what_the_snapshot_read() {
    let fleet = fleet60();
    let release = gpu_release(QualificationState::Qualified);
    let plan = run(&fleet, &hgx(), &release, 9).expect("plan");
    let mut count = 0;
    for (_, node, step) in plan.steps() {
        let snap = fleet.nodes.iter().find(|n| n.id == node.node).expect("node");
        let component = snap
            .components
            .iter()
            .find(|c| c.inventory_id == step.inventory_id)
            .expect("component");
        assert_eq!(step.expected_current, component.version);
        assert_eq!(&*step.target, GPU_TARGET);
        assert_eq!(&*step.image_sha256, release.sha256);
        assert_eq!(&*step.image_uri, release.image_uri);
        count += 1;
    }
    assert_eq!(count, plan.summary.steps);
    assert_eq!(plan.summary.planned + plan.summary.excluded.values().sum::<usize>(), 60);
}

#[test]
fn waves_the_fleet_does_not_reach_are_named_in_notes() {
    let nodes = (0..5)
        .map(|i| node(i + 1, &format!("gpu-{i}"), "a", "r1", ""))
        .collect();
    let plan = run(
        &FleetSnapshot { nodes },
        &hgx(),
        &gpu_release(QualificationState::Qualified),
        3,
    )
    .expect("plan");
    assert_eq!(plan.waves.len(), 1, "a 5-node fleet fits in the 8-node canary");
    assert_eq!(plan.waves[0].name, "canary");
    assert!(
        plan.notes.iter().any(|n| n.contains("\"early\" is empty")),
        "{:?}",
        plan.notes
    );
    assert!(plan.waves[0].caps.is_none(), "a wave that takes everything has no caps");
}

#[test]
fn crossing_racks_and_domains_still_keep_the_caps() {
    // Six nodes in one cluster whose racks and NVLink domains cross like a
    // six-cycle (A-X, A-Y, B-X, B-Z, C-Y, C-Z). A 3-node canary with one
    // node per rack and per domain exists, but a greedy pass that starts
    // with A-X and C-Z gets stuck at two; the flow completion must find the
    // three for every seed.
    let policy = parse(
        "name: crossing\ntarget:\n  component: gpu\n  platforms: [hgx-h100-8gpu]\nwaves:\n  - name: canary\n    \
         count: 3\n    bake: 1h\n  - name: rest\n    rest: true\n    bake: 1h\nconcurrency:\n  max_in_flight: 10\n  \
         per_rack: 1\n  per_nvlink_domain: 1\nfailure_budget:\n  max_failed: 0\nrollback:\n  automatic: true\n  \
         scope: wave\n",
    );
    let edges = [("A", "X"), ("A", "Y"), ("B", "X"), ("B", "Z"), ("C", "Y"), ("C", "Z")];
    let nodes = edges
        .iter()
        .enumerate()
        .map(|(i, (rack, domain))| node(i as i64 + 1, &format!("n{i}"), "c1", rack, domain))
        .collect();
    let fleet = FleetSnapshot { nodes };
    let mut canaries = BTreeSet::new();
    for seed in 0..64 {
        let plan = run(&fleet, &policy, &gpu_release(QualificationState::Qualified), seed).expect("plan");
        let canary = &plan.waves[0];
        assert_eq!(canary.nodes.len(), 3);
        let racks: BTreeSet<_> = canary.nodes.iter().map(|n| &n.rack).collect();
        let domains: BTreeSet<_> = canary.nodes.iter().map(|n| &n.nvlink_domain).collect();
        assert_eq!((racks.len(), domains.len()), (3, 3), "seed {seed}");
        assert!(canary.cap_relaxations.is_empty(), "seed {seed}");
        canaries.insert(canary.nodes.iter().map(|n| n.name.clone()).collect::<BTreeSet<_>>());
    }
    assert_eq!(
        canaries.len(),
        2,
        "both perfect choices of the six-cycle occur across seeds"
    );
}

/// The hgx policy with a soak holding back `percent` of the eligible nodes (or sized from the power
/// target when `None`).
fn hgx_with_soak(percent: Option<f64>) -> Policy {
    let mut policy = hgx();
    policy.detection.soak = Some(orchestrator_policy::Soak {
        min: chrono::TimeDelta::hours(24),
        max: chrono::TimeDelta::days(14),
        holdback_percent: percent,
        detect: 1.5,
        power: 0.75,
        onset: None,
    });
    policy
}

#[test]
fn a_soak_holds_back_a_stratified_last_wave_that_every_earlier_wave_is_compared_with() {
    use orchestrator_types::{HOLDBACK_WAVE, WaveRole};
    let fleet = fleet60();
    let release = gpu_release(QualificationState::Qualified);
    let without = run(&fleet, &hgx(), &release, 5).expect("plan");
    assert!(without.soak.is_none());
    assert!(without.waves.iter().all(|w| w.role.is_none()));
    let plan = run(&fleet, &hgx_with_soak(Some(20.0)), &release, 5).expect("plan");
    let eligible = without.summary.planned;
    assert_eq!(plan.summary.planned, eligible, "the holdback is planned, not excluded");
    let soak = plan.soak.clone().expect("a soak plan");
    let holdback = plan.waves.last().unwrap();
    assert_eq!(holdback.name, HOLDBACK_WAVE);
    assert_eq!(holdback.role, Some(WaveRole::Holdback));
    assert_eq!(holdback.nodes.len(), eligible.div_ceil(5), "20%, rounded up");
    assert_eq!(soak.holdback, holdback.nodes.iter().map(|n| n.node).collect::<Vec<_>>());
    assert!(holdback.gates.is_empty() && holdback.bake_seconds == 0);
    // The soak is the last policy wave: it bakes at least the soak's minimum.
    let soak_wave = &plan.waves[plan.waves.len() - 2];
    assert_eq!(soak_wave.role, Some(WaveRole::Soak));
    assert_eq!(soak.soak_wave, soak_wave.name);
    assert_eq!(soak_wave.bake_seconds, 24 * 3600);
    // Stratified: the holdback spans every cluster, like the fleet.
    let clusters: BTreeSet<&str> = holdback.nodes.iter().map(|n| n.cluster.as_str()).collect();
    assert_eq!(clusters.len(), 3, "{clusters:?}");
    // No node in two waves; the canary's controls include holdback nodes (a later wave).
    let mut seen = BTreeSet::new();
    for wave in &plan.waves {
        for n in &wave.nodes {
            assert!(seen.insert(n.node), "{} planned twice", n.name);
        }
    }
    let held: BTreeSet<NodeId> = soak.holdback.iter().copied().collect();
    assert!(plan.waves[0].control.members().iter().any(|m| held.contains(&m.node)));
    // The plan says how the holdback was sized, and the soak changes the fingerprint.
    assert!(
        plan.notes.iter().any(|n| n.starts_with("soak: holdback")),
        "{:?}",
        plan.notes
    );
    assert_ne!(plan.fingerprint, without.fingerprint);
    // Sized from the power target instead: at least one node, never all.
    let sized = run(&fleet, &hgx_with_soak(None), &release, 5).expect("plan");
    let held = sized.waves.last().unwrap().nodes.len();
    assert!((1..eligible).contains(&held), "{held}");
    assert!(!sized.soak.unwrap().sizing.stated);
}

/// The holdback is sized at the base rates measured over the fleet's history when the plan is given
/// them (the engine measures them at rollout start), at the defaults otherwise, and the plan says which.
#[test]
fn the_holdback_is_sized_at_the_measured_base_rate_and_the_plan_says_so() {
    use orchestrator_planner::power::{BaselineSource, history_rates};
    let fleet = fleet60();
    let release = gpu_release(QualificationState::Qualified);
    let policy = hgx_with_soak(None);
    let with = |base_rates: &std::collections::BTreeMap<String, f64>| {
        plan(&PlanInput {
            snapshot: &fleet,
            policy: &policy,
            release: &release,
            seed: 5,
            planned_at: instant(),
            base_rates,
        })
        .expect("plan")
    };
    let default = with(&std::collections::BTreeMap::new());
    // A fleet quieter than the default (0.002 XID episodes per GPU-hour, not 0.01) needs a larger
    // holdback to gather the same events within the soak's max.
    let measured = with(&history_rates(&[(
        "xid_errors_per_gpu_hour".to_owned(),
        200.0,
        100_000.0,
    )]));
    let sizing = |p: &Plan| p.soak.clone().expect("a soak plan").sizing;
    assert_eq!(sizing(&default).rate_source, Some(BaselineSource::Default));
    assert_eq!(sizing(&measured).rate_source, Some(BaselineSource::History));
    assert!(
        sizing(&measured).holdback_nodes > sizing(&default).holdback_nodes,
        "{:?} {:?}",
        sizing(&measured),
        sizing(&default)
    );
    assert!(
        measured
            .notes
            .iter()
            .any(|n| n.starts_with("soak: holdback") && n.contains("measured over the fleet's history")),
        "{:?}",
        measured.notes
    );
    assert_ne!(measured.fingerprint, default.fingerprint);
}
