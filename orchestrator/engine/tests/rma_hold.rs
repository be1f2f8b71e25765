//! A node with an open RMA case is never planned into a rollout nor used as
//! a control, and the plan says which case holds it; once a human closes the
//! case, the next rollout takes the node again.

use integration_tests::fixtures::{PolicyYaml, WaveSize, WaveYaml};
use integration_tests::{GPU_TO, Harness};
use orchestrator_db::testing::fixtures::rma_candidate;
use orchestrator_engine::{StartRollout, start_rollout_planned};
use orchestrator_planner::{ExclusionReason, Outcome};
use orchestrator_rma::{Actor, Candidate, CaseEvent, Severity};
use orchestrator_types::Role;

fn candidate(node: &str) -> Candidate {
    rma_candidate("1654922001234", node, "row_remap_failure", Severity::Critical)
}

fn request(release: orchestrator_types::ReleaseId, seed: i64) -> StartRollout {
    StartRollout {
        release_id: release,
        policy_source: PolicyYaml::two_waves("rma-hold")
            .waves(vec![
                WaveYaml::new("canary", WaveSize::Count(2)).bake("1h"),
                WaveYaml::new("rest", WaveSize::Rest).bake("1h"),
            ])
            .render(),
        policy_commit: None,
        policy_blob: None,
        seed,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_an_open_rma_case_is_neither_planned_nor_a_control() {
    let Some(h) = Harness::start(6, "", false).await else {
        return;
    };
    let release = h.add_release(GPU_TO, true).await;
    let case = h.db.open_rma_case(&candidate("node-00002"), "detector").await.unwrap();

    let (rollout, plan) = start_rollout_planned(&h.db, &request(release.id, 1), "alice")
        .await
        .unwrap();
    let held = plan
        .eligibility
        .iter()
        .find(|e| e.name == "node-00002")
        .expect("the node is in the plan's eligibility list");
    let Outcome::Excluded {
        reason: ExclusionReason::OpenRmaCase { reason },
    } = &held.outcome
    else {
        panic!("node-00002: {:?}", held.outcome);
    };
    assert!(
        reason.contains(&case.id) && reason.contains("row_remap_failure"),
        "{reason}"
    );
    let said = ExclusionReason::OpenRmaCase { reason: reason.clone() }.to_string();
    assert!(said.starts_with("held for RMA: RMA case"), "{said}");
    for wave in &plan.waves {
        assert!(wave.nodes.iter().all(|n| n.name != "node-00002"), "wave {}", wave.name);
        assert!(
            wave.control.members().iter().all(|n| n.name != "node-00002"),
            "control of wave {}",
            wave.name
        );
    }
    let steps = h.db.steps(&Default::default()).await.unwrap();
    let node = h.db.node_by_name("node-00002").await.unwrap();
    assert!(steps.iter().all(|s| s.node_id != node.id || s.rollout_id != rollout.id));

    // A human closes the case (the part stays, the claim is dropped): the
    // node is eligible again.
    h.db.apply_rma_event(
        &case.id,
        CaseEvent::Close {
            reason: "row remap cleared by a field diagnostic re-run".into(),
        },
        &Actor {
            name: "ada".into(),
            role: Role::Admin,
        },
    )
    .await
    .unwrap();
    let snapshot = orchestrator_engine::fleet_snapshot(&h.db).await.unwrap();
    let node = snapshot.nodes.iter().find(|n| n.name == "node-00002").unwrap();
    assert_eq!(node.health.rma_hold, None);
    h.shutdown().await;
}
