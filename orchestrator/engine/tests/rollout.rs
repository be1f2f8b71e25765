//! End-to-end rollouts against bmc-sim over loopback HTTP on an accelerated
//! clock: the happy path at 300 nodes, on SQLite and (when configured)
//! PostgreSQL.

use std::time::Duration;

use integration_tests::{GPU_FROM, GPU_TO, Harness, policy};
use orchestrator_db::execution::{RolloutState, StepFilter, StepState, WaveState};

async fn three_waves_complete(postgres: bool) {
    let Some(mut h) = Harness::start(300, "", postgres).await else {
        return;
    };
    let release = h.add_release(GPU_TO, true).await;
    h.add_release(GPU_FROM, true).await;
    let rollout = h.start_rollout(release.id, policy("10m", "approval: auto"), 11).await;
    assert!(
        rollout.policy_commit.starts_with("inline:"),
        "{}",
        rollout.policy_commit
    );
    let waves = h.db.rollout_waves(rollout.id).await.unwrap();
    assert_eq!(
        waves
            .iter()
            .map(|w| (w.name.as_str(), w.node_count))
            .collect::<Vec<_>>(),
        [("canary", 10), ("early", 90), ("rest", 200)]
    );
    h.start_engine();
    let done = h
        .wait_for(
            rollout.id,
            &[RolloutState::Completed, RolloutState::Halted],
            Duration::from_secs(300),
        )
        .await;
    assert_eq!(done.state, RolloutState::Completed, "{:?}", done.state_reason);
    h.stop_engine().await;

    let steps =
        h.db.steps(&StepFilter {
            rollout_id: Some(rollout.id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(steps.len(), 300);
    assert!(
        steps.iter().all(|s| s.state == StepState::Succeeded),
        "every step succeeded"
    );
    for w in h.db.rollout_waves(rollout.id).await.unwrap() {
        assert_eq!(w.state, WaveState::Promoted, "wave {}", w.name);
    }
    for endpoint in h.fleet.endpoints() {
        let versions = h.fleet.versions(&endpoint.name).unwrap();
        for c in versions.iter().filter(|c| c.id.starts_with("HGX_FW_GPU_")) {
            assert_eq!(c.active, GPU_TO, "{} {}", endpoint.name, c.id);
        }
        let counts = h.fleet.flash_counts(&endpoint.name).unwrap();
        assert_eq!(counts.get(GPU_TO), Some(&1), "{}: {counts:?}", endpoint.name);
        assert_eq!(counts.values().sum::<u32>(), 1, "{}: {counts:?}", endpoint.name);
    }
    // The recorded inventory (what the UI shows and the next rollout plans
    // from) reads the new version without a discovery pass.
    for step in &steps {
        let components = h.db.node_components(step.node_id).await.unwrap();
        let gpus: Vec<_> = components
            .iter()
            .filter(|c| c.reading.inventory_id.starts_with("HGX_FW_GPU_"))
            .collect();
        assert!(!gpus.is_empty());
        for c in gpus {
            assert_eq!(
                c.reading.version.as_str(),
                GPU_TO,
                "node {} {}",
                step.node_id,
                c.reading.inventory_id
            );
        }
    }
    // Every step's transitions are in the audit log.
    let audit =
        h.db.audit_entries(&orchestrator_db::AuditFilter {
            action: Some("rollout.completed".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(audit.len(), 1);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_nodes_three_waves_sqlite() {
    three_waves_complete(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_nodes_three_waves_postgres() {
    three_waves_complete(true).await;
}
