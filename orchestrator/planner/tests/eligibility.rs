//! Data-driven eligibility table: one node, one change, the expected fate.

mod common;

use common::*;
use orchestrator_planner::{ExclusionReason, FleetSnapshot, NodeHealth, NodeSnapshot, Outcome, PlanInput, plan};
use orchestrator_types::{ComponentKind, NodeState, QualificationState};

const POLICY: &str = r#"
name: table
target:
  component: gpu
  inventory_id: "HGX_FW_GPU_*"
  platforms: [hgx-h100-8gpu, hgx-gb200]
  selector:
    environment: [production]
  exclude:
    - reservation: [frontier-run-7]
  exclude_nodes: [gpu-excluded]
versions:
  from: ">= 96.00.50.00.00"
  allow_downgrade: ALLOW
waves:
  - name: canary
    count: 1
    bake: 1h
  - name: rest
    rest: true
    bake: 1h
concurrency:
  max_in_flight: 10
failure_budget:
  max_failed: 0
rollback:
  automatic: true
  scope: wave
"#;

/// What a case expects: planned with this many steps, or excluded.
enum Want {
    Planned { steps: usize, at_target: usize },
    Excluded(&'static str),
}
use Want::*;

fn gpus(node: &mut NodeSnapshot, f: impl Fn(usize, &mut orchestrator_planner::ComponentSnapshot)) {
    for (i, c) in node
        .components
        .iter_mut()
        .filter(|c| c.kind == ComponentKind::Gpu)
        .enumerate()
    {
        f(i, c);
    }
}

fn check(case: &str, allow_downgrade: bool, edit: impl Fn(&mut NodeSnapshot), want: Want) {
    let policy = parse(&POLICY.replace("ALLOW", if allow_downgrade { "true" } else { "false" }));
    let mut release = gpu_release(QualificationState::Qualified);
    release.platforms = vec!["hgx-h100-8gpu".into()];
    let mut node = node(1, "gpu-a", "sjc1", "r1", "r1-a");
    edit(&mut node);
    let snapshot = FleetSnapshot {
        nodes: vec![node.clone()],
    };
    let plan = plan(&PlanInput {
        snapshot: &snapshot,
        policy: &policy,
        release: &release,
        seed: 0,
        planned_at: instant(),
        base_rates: &std::collections::BTreeMap::new(),
    })
    .unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_eq!(plan.eligibility.len(), 1, "{case}");
    let outcome = &plan.eligibility[0].outcome;
    match (want, outcome) {
        (Planned { steps, at_target }, Outcome::Planned { .. }) => {
            let planned = &plan.waves[0].nodes[0];
            assert_eq!(planned.steps.len(), steps, "{case}: steps");
            assert_eq!(planned.already_at_target.len(), at_target, "{case}: already at target");
        }
        (Excluded(code), Outcome::Excluded { reason }) => {
            assert_eq!(reason.code(), code, "{case}: got {reason}");
            assert!(plan.waves.is_empty(), "{case}: an excluded node is in no wave");
            // The policy crate's own targeting query must agree with the
            // planner's targeting reasons.
            let targeting = matches!(
                reason,
                ExclusionReason::PlatformNotTargeted { .. }
                    | ExclusionReason::SelectorMismatch { .. }
                    | ExclusionReason::ExcludedBySelector { .. }
                    | ExclusionReason::ExcludedByName
            );
            assert_eq!(
                policy
                    .target
                    .includes_node(&node.name, &node.platform, &node.effective_labels()),
                !targeting,
                "{case}: includes_node disagrees"
            );
        }
        (Planned { .. }, Outcome::Excluded { reason }) => panic!("{case}: expected planned, excluded: {reason}"),
        (Excluded(code), Outcome::Planned { .. }) => panic!("{case}: expected excluded ({code}), planned"),
    }
}

#[test]
fn eligibility_table() {
    check("plain node", false, |_| {}, Planned { steps: 8, at_target: 0 });
    check(
        "platform not in policy",
        false,
        |n| n.platform = "hgx-b200-8gpu".into(),
        Excluded("platform_not_targeted"),
    );
    check(
        "release not built for platform",
        false,
        |n| n.platform = "hgx-gb200".into(),
        Excluded("release_not_for_platform"),
    );
    check(
        "selector value differs",
        false,
        |n| {
            n.labels.insert("environment".into(), "staging".into());
        },
        Excluded("selector_mismatch"),
    );
    check(
        "selector label missing",
        false,
        |n| {
            n.labels.remove("environment");
        },
        Excluded("selector_mismatch"),
    );
    check(
        "exclusion selector",
        false,
        |n| {
            n.labels.insert("reservation".into(), "frontier-run-7".into());
        },
        Excluded("excluded_by_selector"),
    );
    check(
        "other reservation is fine",
        false,
        |n| {
            n.labels.insert("reservation".into(), "other-run".into());
        },
        Planned { steps: 8, at_target: 0 },
    );
    check(
        "excluded by name",
        false,
        |n| n.name = "gpu-excluded".into(),
        Excluded("excluded_by_name"),
    );
    check(
        "no GPU in the inventory",
        false,
        |n| n.components.retain(|c| c.kind != ComponentKind::Gpu),
        Excluded("no_component_of_kind"),
    );
    check(
        "GPU ids do not match the pattern",
        false,
        |n| gpus(n, |i, c| c.inventory_id = format!("GPU_SXM_{i}")),
        Excluded("inventory_id_mismatch"),
    );
    check(
        "the NVSwitch entry is not a GPU",
        false,
        |n| {
            n.components.retain(|c| c.kind != ComponentKind::Gpu);
            n.components.push(orchestrator_planner::ComponentSnapshot {
                inventory_id: "HGX_FW_GPU_NVSwitch".into(),
                kind: ComponentKind::Other,
                version: GPU_OLD.into(),
                updateable: true,
                downgrade_forbidden: false,
            });
        },
        Excluded("no_component_of_kind"),
    );
    check(
        "unparseable version",
        false,
        |n| {
            gpus(n, |i, c| {
                if i == 2 {
                    c.version = "n/a (read error)".into()
                }
            })
        },
        Excluded("current_version_unparseable"),
    );
    check(
        "already at target",
        false,
        |n| gpus(n, |_, c| c.version = GPU_TARGET.into()),
        Excluded("already_at_target"),
    );
    check(
        "at target, differing only in build metadata",
        false,
        |n| gpus(n, |_, c| c.version = "96.00.61.00.01+build.7".into()),
        Excluded("already_at_target"),
    );
    check(
        "already at target wins over maintenance",
        false,
        |n| {
            gpus(n, |_, c| c.version = GPU_TARGET.into());
            n.state = NodeState::Maintenance;
        },
        Excluded("already_at_target"),
    );
    check(
        "half the GPUs at target",
        false,
        |n| {
            gpus(n, |i, c| {
                if i % 2 == 0 {
                    c.version = GPU_TARGET.into()
                }
            })
        },
        Planned { steps: 4, at_target: 4 },
    );
    check(
        "maintenance",
        false,
        |n| n.state = NodeState::Maintenance,
        Excluded("not_active"),
    );
    check(
        "quarantined",
        false,
        |n| n.state = NodeState::Quarantined,
        Excluded("not_active"),
    );
    check(
        "unhealthy",
        false,
        |n| {
            n.health = NodeHealth {
                healthy: false,
                summary: Some("PCIe link x8".into()),
                rma_hold: None,
            }
        },
        Excluded("unhealthy"),
    );
    check(
        "an open RMA case holds the node",
        false,
        |n| n.health.rma_hold = Some("RMA case RMA-S1-row_remap-1 for GPU S1 (row_remap) is Submitted".into()),
        Excluded("open_rma_case"),
    );
    check(
        "targeting wins over health",
        false,
        |n| {
            n.health.healthy = false;
            n.name = "gpu-excluded".into();
        },
        Excluded("excluded_by_name"),
    );
    check(
        "a GPU needing the update is not updateable",
        false,
        |n| gpus(n, |i, c| c.updateable = i != 3),
        Excluded("component_not_updateable"),
    );
    check(
        "a non-updateable GPU already at target is fine",
        false,
        |n| {
            gpus(n, |i, c| {
                if i == 3 {
                    c.updateable = false;
                    c.version = GPU_TARGET.into();
                }
            })
        },
        Planned { steps: 7, at_target: 1 },
    );
    check(
        "below the policy's from",
        false,
        |n| {
            gpus(n, |i, c| {
                if i == 0 {
                    c.version = "96.00.48.00.00".into()
                }
            })
        },
        Excluded("version_constraint_not_met"),
    );
    check(
        "newer than the release, downgrade forbidden",
        false,
        |n| gpus(n, |_, c| c.version = "96.00.70.00.00".into()),
        Excluded("downgrade_forbidden"),
    );
    check(
        "newer than the release, downgrade allowed",
        true,
        |n| gpus(n, |_, c| c.version = "96.00.70.00.00".into()),
        Planned { steps: 8, at_target: 0 },
    );
    check(
        "hex segment ordering: 5E is below 61",
        false,
        |n| gpus(n, |_, c| c.version = "96.00.5F.00.00".into()),
        Planned { steps: 8, at_target: 0 },
    );
}

#[test]
fn every_reason_has_a_distinct_code_and_a_message() {
    let reasons = [
        ExclusionReason::ExcludedByName,
        ExclusionReason::NotActive {
            state: NodeState::Quarantined,
        },
        ExclusionReason::Unhealthy { summary: None },
        ExclusionReason::AlreadyAtTarget { version: "1.0".into() },
    ];
    let codes: std::collections::BTreeSet<_> = reasons.iter().map(|r| r.code()).collect();
    assert_eq!(codes.len(), reasons.len());
    for reason in &reasons {
        assert!(!reason.to_string().is_empty());
        let json = serde_json::to_value(reason).expect("serialise");
        assert_eq!(json["code"], reason.code(), "serde tag equals code()");
    }
}
