//! Snapshot tests of whole plans for the 60-node test fleet under the two
//! example policies. The compact view lists, per wave, its nodes and control
//! cohort by name; one small plan is snapshotted in full to pin the format
//! the engine stores.

mod common;

use common::*;
use orchestrator_planner::{ControlPlan, FleetSnapshot, Outcome, Plan, PlanInput, plan};
use orchestrator_policy::Policy;
use orchestrator_types::QualificationState;
use serde_json::{Value, json};

fn compact(plan: &Plan) -> Value {
    let waves: Vec<Value> = plan
        .waves
        .iter()
        .map(|w| {
            let control = match &w.control {
                ControlPlan::Cohort {
                    wanted,
                    members,
                    shortfalls,
                } => json!({
                    "wanted": wanted,
                    "members": members.iter().map(|m| format!("{} ({})", m.name, match &m.source {
                        orchestrator_planner::ControlSource::LaterWave { wave } => wave.clone(),
                        orchestrator_planner::ControlSource::OutsideRollout { excluded } => format!("outside: {excluded}"),
                    })).collect::<Vec<_>>(),
                    "shortfalls": shortfalls,
                }),
                ControlPlan::Unavailable { reason } => json!({ "unavailable": reason }),
            };
            json!({
                "name": w.name,
                "size_rule": w.size_rule,
                "blocked": w.blocked,
                "bake": w.bake,
                "approval": w.approval,
                "max_in_flight": w.max_in_flight,
                "stratified_by": w.stratified_by,
                "caps": w.caps,
                "cap_relaxations": w.cap_relaxations,
                "nodes": w.nodes.iter().map(|n| format!("{} {} {}/{}/{} steps={}", n.name, n.platform, n.cluster, n.rack, n.nvlink_domain, n.steps.len())).collect::<Vec<_>>(),
                "control": control,
            })
        })
        .collect();
    let excluded: Vec<String> = plan
        .eligibility
        .iter()
        .filter_map(|e| match &e.outcome {
            Outcome::Excluded { reason } => Some(format!("{}: [{}] {reason}", e.name, reason.code())),
            Outcome::Planned { .. } => None,
        })
        .collect();
    json!({
        "fingerprint": plan.fingerprint,
        "policy": plan.policy,
        "rollback": plan.rollback,
        "summary": plan.summary,
        "waves": waves,
        "excluded": excluded,
        "notes": plan.notes,
    })
}

fn make(snapshot: &FleetSnapshot, policy: &Policy, release: &orchestrator_planner::ReleaseSpec, seed: u64) -> Plan {
    plan(&PlanInput {
        snapshot,
        policy,
        release,
        seed,
        planned_at: instant(),
        base_rates: &std::collections::BTreeMap::new(),
    })
    .expect("plan")
}

#[test]
fn hgx_gpu_plan_for_the_60_node_fleet() {
    let plan = make(
        &fleet60(),
        &hgx_policy(),
        &gpu_release(QualificationState::Qualified),
        42,
    );
    insta::assert_yaml_snapshot!(compact(&plan));
}

#[test]
fn hgx_gpu_plan_for_an_unqualified_release_blocks_waves_after_the_canary() {
    let mut release = gpu_release(QualificationState::Qualifying);
    release.passed_gates.remove("thermal_soak");
    let plan = make(&fleet60(), &hgx_policy(), &release, 42);
    insta::assert_yaml_snapshot!(compact(&plan));
}

#[test]
fn bmc_plan_for_the_60_node_fleet() {
    let plan = make(&fleet60(), &policy_file("bmc-firmware.yaml"), &bmc_release(), 7);
    insta::assert_yaml_snapshot!(compact(&plan));
}

#[test]
fn full_plan_format_for_a_small_fleet() {
    // Eight BMCs: six to update over two waves, one unhealthy, one done.
    let mut nodes = Vec::new();
    for i in 0..8i64 {
        let (cluster, rack) = [("sjc1", "r1"), ("sjc1", "r2"), ("ams1", "r3"), ("ams1", "r4")][(i % 4) as usize];
        let mut n = node(i + 1, &format!("bmc-{rack}-n{}", i / 4 + 1), cluster, rack, "");
        n.components.retain(|c| c.inventory_id == "BMC_Firmware");
        nodes.push(n);
    }
    nodes[6].health.healthy = false;
    nodes[6].health.summary = Some("BMC event log: PSU 1 failed".into());
    nodes[7].components[0].version = BMC_TARGET.into();
    let plan = make(
        &FleetSnapshot { nodes },
        &policy_file("bmc-firmware.yaml"),
        &bmc_release(),
        1,
    );
    let stored = serde_json::to_string(&plan).expect("serialise");
    let loaded: Plan = serde_json::from_str(&stored).expect("a stored plan reads back");
    assert_eq!(loaded, plan, "the stored form is lossless");
    insta::assert_json_snapshot!(plan);
}
