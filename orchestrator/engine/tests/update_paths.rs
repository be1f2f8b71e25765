//! Issue 21: a rollout end to end against each bmc-sim platform profile over every update path
//! (SimpleUpdate, multipart push, HttpPushUri, DMTF task monitor, the task itself, no task +
//! inventory verification), and the targeting guarantee: a GPU release on an HGX layout never
//! touches an ERoT, an InfoROM, the HGX management controller or the host BMC, and is refused where
//! the only path cannot restrict targets.

use std::collections::BTreeMap;
use std::time::Duration;

use bmc_sim::Scenario;
use integration_tests::fixtures::{PolicyYaml, WaveSize, WaveYaml};
use integration_tests::{GPU_FROM, GPU_TO, Harness, SKU, ScenarioYaml};
use orchestrator_db::execution::{RolloutState, StepFilter, StepState};
use orchestrator_engine::{StartRollout, start_rollout};
use orchestrator_types::RolloutId;

const LIMIT: Duration = Duration::from_secs(90);
const NODES: usize = 3;

fn scenario(platform: &str, update_service: &str, from: &str, to: &str) -> Scenario {
    ScenarioYaml::profile(platform, SKU, NODES)
        .seed(11)
        .gpu_firmware(to, "{min: 2m, max: 4m}")
        .gpu_firmware(from, "{min: 2m, max: 4m}")
        .section(update_service)
        .build()
}

fn policy(inventory_id: Option<&str>) -> String {
    policy_updating(inventory_id, "")
}

/// [`policy`] with an `update:` section (`update` is its YAML, empty for none).
fn policy_updating(inventory_id: Option<&str>, update: &str) -> String {
    let mut policy = PolicyYaml::two_waves("update-paths")
        .inventory_id(inventory_id.unwrap_or(""))
        .waves(vec![
            WaveYaml::new("all", WaveSize::Rest)
                .bake("1m")
                .max_in_flight(NODES as u32),
        ])
        .concurrency(NODES as u32, &["per_rack: 3", "per_nvlink_domain: 3"])
        .max_failed(NODES as u32)
        .automatic_rollback(false)
        .render();
    policy.push_str(update);
    policy
}

async fn start(h: &Harness, version: &str, policy_source: String) -> RolloutId {
    let release = h.add_release(version, true).await;
    start_rollout(
        &h.db,
        &StartRollout {
            release_id: release.id,
            policy_source,
            policy_commit: Some("abc".into()),
            policy_blob: Some("def".into()),
            seed: 5,
        },
        "alice",
    )
    .await
    .expect("rollout starts")
    .id
}

/// Every node's component versions, by inventory id.
fn versions(h: &Harness) -> BTreeMap<String, BTreeMap<String, String>> {
    h.fleet
        .endpoints()
        .iter()
        .map(|e| {
            let v = h
                .fleet
                .versions(&e.name)
                .unwrap()
                .into_iter()
                .map(|c| (c.id, c.active))
                .collect();
            (e.name.clone(), v)
        })
        .collect()
}

/// Runs a rollout to `to` and checks that exactly the components matching `is_target` moved.
async fn rollout_moves_only(
    scenario: Scenario,
    inventory_id: Option<&str>,
    to: &str,
    is_target: impl Fn(&str) -> bool,
) {
    let mut h = Harness::start_with(scenario, false).await.unwrap();
    let before = versions(&h);
    let id = start(&h, to, policy(inventory_id)).await;
    h.start_engine();
    let done = h
        .wait_for(id, &[RolloutState::Completed, RolloutState::Halted], LIMIT)
        .await;
    let steps =
        h.db.steps(&StepFilter {
            rollout_id: Some(id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        done.state,
        RolloutState::Completed,
        "{:?} {steps:#?}",
        done.state_reason
    );
    assert_eq!(steps.len(), NODES);
    assert!(steps.iter().all(|s| s.state == StepState::Succeeded), "{steps:#?}");
    // One session per BMC for the whole rollout, deleted when the engine shuts down.
    for e in h.fleet.endpoints() {
        assert_eq!(h.fleet.open_sessions(&e.name), Some(1), "{}", e.name);
    }
    h.stop_engine().await;
    for e in h.fleet.endpoints() {
        assert_eq!(h.fleet.open_sessions(&e.name), Some(0), "{}", e.name);
    }
    let after = versions(&h);
    for (node, comps) in &after {
        for (comp, version) in comps {
            let was = &before[node][comp];
            if is_target(comp) {
                assert_eq!(version, to, "{node} {comp} was not updated");
            } else {
                assert_eq!(version, was, "{node} {comp} must not be touched");
            }
        }
    }
    h.shutdown().await;
}

fn hgx_gpu(id: &str) -> bool {
    id.starts_with("HGX_FW_GPU_SXM_")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generic_dmtf_simple_update_through_a_task_monitor() {
    rollout_moves_only(scenario("generic-dmtf", "", GPU_FROM, GPU_TO), None, GPU_TO, |id| {
        id.starts_with("GPU_Firmware_")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hgx_h100_gpu_release_goes_multipart_and_never_touches_erot_inforom_or_bmcs() {
    // No inventory_id in the policy: the component kind alone must keep ERoT/InfoROM/HMC/host BMC out.
    rollout_moves_only(scenario("hgx-h100", "", GPU_FROM, GPU_TO), None, GPU_TO, hgx_gpu).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hgx_h100_http_push_sets_targets_then_pushes() {
    let http_push_only = "update_service:\n  http_push: {targets_settable: true}\n  accepted: task\n";
    rollout_moves_only(
        scenario("hgx-h100", http_push_only, GPU_FROM, GPU_TO),
        Some("HGX_FW_GPU_SXM_*"),
        GPU_TO,
        hgx_gpu,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gb200_push_only_immediate_only() {
    rollout_moves_only(
        scenario("gb200", "", "97.00.52.00.01", "97.00.61.00.01"),
        Some("HGX_FW_GPU_*"),
        "97.00.61.00.01",
        |id| id.starts_with("HGX_FW_GPU_"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dell_inline_annotations_and_the_task_as_location() {
    rollout_moves_only(scenario("dell", "", GPU_FROM, GPU_TO), None, GPU_TO, |id| {
        id.contains("Video_Slot")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_without_a_task_is_verified_from_the_inventory() {
    // Multipart, Immediate, 204 and nothing to poll: the driver watches the inventory.
    let no_task = "update_service:\n  multipart: {apply_times: [Immediate]}\n  accepted: no_task\n";
    rollout_moves_only(scenario("hgx-h100", no_task, GPU_FROM, GPU_TO), None, GPU_TO, hgx_gpu).await;
    // SimpleUpdate, OnReset, 204: staged, so the engine resets and verifies.
    let no_task_on_reset = "update_service:\n  simple_update: {accepts_targets: true}\n  accepted: no_task\n";
    rollout_moves_only(
        scenario("generic-dmtf", no_task_on_reset, GPU_FROM, GPU_TO),
        None,
        GPU_TO,
        |id| id.starts_with("GPU_Firmware_"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hgx_h100_with_only_an_untargetable_simple_update_is_refused_and_nothing_flashes() {
    let simple_only = "update_service:\n  simple_update: {accepts_targets: false, protocol_required: true, \
                       described_by: action_info, transfer_protocols: [HTTP]}\n";
    let mut h = Harness::start_with(scenario("hgx-h100", simple_only, GPU_FROM, GPU_TO), false)
        .await
        .unwrap();
    let before = versions(&h);
    let id = start(&h, GPU_TO, policy(None)).await;
    h.start_engine();
    let done = h
        .wait_for(id, &[RolloutState::Completed, RolloutState::Halted], LIMIT)
        .await;
    let steps =
        h.db.steps(&StepFilter {
            rollout_id: Some(id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(steps.len(), NODES);
    assert!(
        steps.iter().all(|s| s.state == StepState::Failed),
        "{:?}: {steps:#?}",
        done.state
    );
    for s in steps.iter().filter(|s| s.state == StepState::Failed) {
        let reason = s.error.as_deref().unwrap_or_default();
        assert!(reason.contains("no update path"), "{reason}");
        assert!(reason.contains("no Targets parameter"), "{reason}");
    }
    assert_eq!(versions(&h), before, "nothing may be flashed");
    for e in h.fleet.endpoints() {
        assert_eq!(h.fleet.flash_counts(&e.name).unwrap().values().sum::<u32>(), 0);
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_that_flashes_no_node_is_refused_at_start() {
    let h = Harness::start_with(scenario("hgx-h100", "", GPU_FROM, GPU_TO), false)
        .await
        .unwrap();
    let release = h.add_release(GPU_TO, true).await;
    // No inventory entry matches: every node is excluded.
    let err = start_rollout(
        &h.db,
        &StartRollout {
            release_id: release.id,
            policy_source: policy(Some("NO_SUCH_COMPONENT_*")),
            policy_commit: Some("abc".into()),
            policy_blob: Some("def".into()),
            seed: 5,
        },
        "alice",
    )
    .await
    .expect_err("a 0-node plan must not start");
    assert!(
        matches!(err, orchestrator_engine::EngineError::EmptyPlan { nodes: NODES, .. }),
        "{err:?}"
    );
    assert!(err.is_caller_error());
    assert!(err.to_string().contains("flashes no node"), "{err}");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plan_names_exactly_the_inventory_ids_each_node_will_be_pushed_to() {
    let h = Harness::start_with(scenario("hgx-h100", "", GPU_FROM, GPU_TO), false)
        .await
        .unwrap();
    let release = h.add_release(GPU_TO, true).await;
    // No inventory_id in the policy: the component kind and the platform decide, and the plan says
    // what they decided before anything is flashed.
    let (_, plan) = orchestrator_engine::start_rollout_planned(
        &h.db,
        &StartRollout {
            release_id: release.id,
            policy_source: policy(None),
            policy_commit: Some("abc".into()),
            policy_blob: Some("def".into()),
            seed: 5,
        },
        "alice",
    )
    .await
    .expect("rollout starts");
    let targets = plan.targets();
    assert_eq!(targets.len(), 1, "one layout, one group: {targets:#?}");
    let expected: Vec<String> = (1..=8).map(|i| format!("HGX_FW_GPU_SXM_{i}")).collect();
    assert_eq!(targets[0].inventory_ids, expected, "{targets:#?}");
    assert_eq!(targets[0].nodes, NODES);
    assert_eq!(
        targets[0].examples.len(),
        NODES.min(orchestrator_planner::TARGET_EXAMPLES)
    );
    h.shutdown().await;
}

/// Starts a rollout of `version` under `policy_source` with the BMC check `serve` makes.
async fn start_checked(
    h: &Harness,
    release: &orchestrator_db::model::Release,
    policy_source: String,
) -> Result<RolloutId, orchestrator_engine::EngineError> {
    let checks = orchestrator_engine::StartChecks {
        bmcs: Some(h.redfish()),
        ..Default::default()
    };
    let request = StartRollout {
        release_id: release.id,
        policy_source,
        policy_commit: Some("abc".into()),
        policy_blob: Some("def".into()),
        seed: 5,
    };
    orchestrator_engine::start_rollout_checked(&h.db, &request, "alice", &checks)
        .await
        .map(|(rollout, _)| rollout.id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_apply_time_a_bmc_cannot_do_is_refused_at_start_and_one_it_can_do_runs() {
    let (from, to) = ("97.00.52.00.01", "97.00.61.00.01");
    // GB200's multipart push applies Immediately only; here it is the only path the BMC offers.
    let multipart_only = "update_service:\n  multipart: {apply_times: [Immediate]}\n  accepted: task_monitor\n";
    let mut h = Harness::start_with(scenario("gb200", multipart_only, from, to), false)
        .await
        .unwrap();
    let release = h.add_release(to, true).await;
    // OnReset, required, is refused before any flash, naming every node and the reason.
    let on_reset = "update:\n  apply_time: on_reset\n";
    let err = start_checked(&h, &release, policy_updating(Some("HGX_FW_GPU_*"), on_reset))
        .await
        .expect_err("GB200 cannot apply on reset");
    let message = err.to_string();
    assert!(
        matches!(&err, orchestrator_engine::EngineError::NoUpdatePath { refused } if refused.len() == NODES),
        "{message}"
    );
    assert!(message.contains("Immediate") || message.contains("apply"), "{message}");
    assert!(err.is_caller_error());
    assert!(
        h.db.exec_rollouts().await.unwrap().is_empty(),
        "a refused start stores nothing"
    );

    // Immediate, required, is what it does: the rollout runs to the end.
    let immediate = "update:\n  apply_time: immediate\n";
    let id = start_checked(&h, &release, policy_updating(Some("HGX_FW_GPU_*"), immediate))
        .await
        .expect("GB200 applies immediately");
    h.start_engine();
    let done = h
        .wait_for(id, &[RolloutState::Completed, RolloutState::Halted], LIMIT)
        .await;
    assert_eq!(done.state, RolloutState::Completed, "{:?}", done.state_reason);
    for node in versions(&h).values() {
        for (id, version) in node.iter().filter(|(id, _)| id.starts_with("HGX_FW_GPU_")) {
            assert_eq!(version, to, "{id}");
        }
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_path_that_cannot_restrict_targets_is_refused_at_start() {
    // The DGX H100 layout's SimpleUpdate takes no Targets: required by the policy, it would flash
    // every applicable component, so the start is refused; `auto` takes the multipart path instead.
    let h = Harness::start_with(scenario("hgx-h100", "", GPU_FROM, GPU_TO), false)
        .await
        .unwrap();
    let release = h.add_release(GPU_TO, true).await;
    let simple = "update:\n  path: simple_update\n";
    let err = start_checked(&h, &release, policy_updating(None, simple))
        .await
        .expect_err("an untargetable SimpleUpdate must be refused");
    let message = err.to_string();
    assert!(message.contains("Targets"), "{message}");
    assert!(h.db.exec_rollouts().await.unwrap().is_empty());
    start_checked(&h, &release, policy_updating(None, "update:\n  path: auto\n"))
        .await
        .expect("auto finds the multipart path");
    h.shutdown().await;
}

/// A driver nobody holds or asked for lately is logged out and forgotten, so the connector follows
/// the BMCs in use rather than every BMC it ever reached; one in use keeps its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_drivers_are_logged_out_and_forgotten() {
    use orchestrator_engine::BmcConnector;
    let h = Harness::start(3, "", false).await.expect("harness");
    let connector = h.redfish();
    let endpoints = h.fleet.endpoints().to_vec();
    let open = |h: &Harness| -> Vec<usize> {
        endpoints
            .iter()
            .map(|e| h.fleet.open_sessions(&e.name).unwrap())
            .collect()
    };
    let mut drivers = Vec::new();
    for e in &endpoints {
        let bmc = connector.driver(&e.bmc_url, "default").unwrap();
        bmc.firmware_inventory().await.unwrap();
        drivers.push(bmc);
    }
    assert_eq!(open(&h), vec![1, 1, 1]);

    // Recently used: nothing is idle yet, held or not.
    let in_use = drivers.remove(0);
    drop(drivers);
    orchestrator_engine::logout_idle(connector.as_ref(), Duration::from_secs(60)).await;
    assert_eq!(connector.drivers().len(), 3);
    assert_eq!(open(&h), vec![1, 1, 1]);

    // Everything is idle at a zero limit, but the driver a caller holds keeps its session.
    orchestrator_engine::logout_idle(connector.as_ref(), Duration::ZERO).await;
    assert_eq!(open(&h), vec![1, 0, 0]);
    let kept = connector.drivers();
    assert_eq!(kept.len(), 1);
    assert!(std::sync::Arc::ptr_eq(&kept[0], &in_use));

    // A forgotten BMC asked for again gets a fresh driver and session.
    let again = connector.driver(&endpoints[1].bmc_url, "default").unwrap();
    again.firmware_inventory().await.unwrap();
    assert_eq!(open(&h), vec![1, 1, 0]);
    drop((kept, again, in_use));
    orchestrator_engine::logout_all(connector.as_ref()).await;
    assert_eq!(open(&h), vec![0, 0, 0]);
    h.shutdown().await;
}
