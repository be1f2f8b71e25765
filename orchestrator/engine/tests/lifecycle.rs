//! Lifecycle and fault scenarios on small simulated fleets: skipped and
//! unexpected versions, failed flashes and the failure budget, a bricked
//! BMC, 503s with retries, two-person approvals, pause/resume/abort,
//! rollback.

use std::time::Duration;

use integration_tests::{GPU_FROM, GPU_TO, Harness, policy};
use orchestrator_db::execution::{RolloutState, StepFilter, StepState, WaveState};
use orchestrator_db::model::ComponentReading;
use orchestrator_engine::{StartRollout, start_rollout};
use orchestrator_types::{FirmwareVersion, NodeState, RolloutId};

const LIMIT: Duration = Duration::from_secs(50);

async fn start(h: &Harness, version: &str, policy_source: String) -> RolloutId {
    let release = match h
        .db
        .list_releases()
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.version.as_str() == version)
    {
        Some(r) => r,
        None => h.add_release(version, true).await,
    };
    start_rollout(
        &h.db,
        &StartRollout {
            release_id: release.id,
            policy_source,
            policy_commit: Some("abc123".into()),
            policy_blob: Some("def456".into()),
            seed: 3,
        },
        "alice",
    )
    .await
    .expect("rollout starts")
    .id
}

/// Pretends the controller last read `version` on the GPUs of `node`.
async fn record_gpu_version(h: &Harness, node: &str, version: &str) {
    let node = h.db.node_by_name(node).await.unwrap();
    let readings: Vec<ComponentReading> = (0..8)
        .map(|i| ComponentReading {
            inventory_id: format!("HGX_FW_GPU_{i}"),
            kind: orchestrator_types::ComponentKind::Gpu,
            version: FirmwareVersion::parse(version).unwrap(),
            updateable: true,
            software_id: None,
            health: None,
        })
        .collect();
    h.db.record_inventory(node.id, &readings).await.unwrap();
}

fn flashes(h: &Harness, node: &str) -> u32 {
    h.fleet.flash_counts(node).unwrap().values().sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn already_at_target_is_skipped_without_a_flash() {
    let mut h = Harness::start(6, "", false).await.unwrap();
    for e in h.fleet.endpoints().to_vec() {
        record_gpu_version(&h, &e.name, "96.00.5D.00.01").await;
    }
    // The BMCs really run GPU_FROM, which is the release: nothing to flash.
    let id = start(&h, GPU_FROM, policy("1m", "approval: auto")).await;
    h.start_engine();
    let done = h
        .wait_for(id, &[RolloutState::Completed, RolloutState::Halted], LIMIT)
        .await;
    assert_eq!(done.state, RolloutState::Completed);
    let steps =
        h.db.steps(&StepFilter {
            rollout_id: Some(id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(steps.len(), 6);
    assert!(steps.iter().all(|s| s.state == StepState::Skipped), "{steps:?}");
    for e in h.fleet.endpoints() {
        assert_eq!(flashes(&h, &e.name), 0, "{}", e.name);
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unexpected_version_fails_naming_both_versions() {
    let mut h = Harness::start(6, "", false).await.unwrap();
    let odd = h.fleet.endpoints()[0].name.clone();
    record_gpu_version(&h, &odd, "96.00.5F.00.01").await;
    let id = start(&h, GPU_TO, policy("1m", "approval: auto")).await;
    h.start_engine();
    let done = h
        .wait_for(id, &[RolloutState::Completed, RolloutState::Halted], LIMIT)
        .await;
    assert_eq!(
        done.state,
        RolloutState::Completed,
        "one failure is within the budget of 2"
    );
    let node = h.db.node_by_name(&odd).await.unwrap();
    let steps =
        h.db.steps(&StepFilter {
            node_id: Some(node.id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].state, StepState::Failed);
    let error = steps[0].error.clone().unwrap();
    assert!(error.contains("96.00.5F.00.01") && error.contains(GPU_FROM), "{error}");
    assert_eq!(flashes(&h, &odd), 0);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_flashes_exhaust_the_budget_and_halt() {
    let extra = "  - kind: gpu\n    version: \"96.00.66.00.01\"\n    flash_time: {min: 1m, max: 2m}\n    flash_fail_rate: 1.0\n";
    let mut h = Harness::start(20, extra, false).await.unwrap();
    let id = start(&h, "96.00.66.00.01", policy("1m", "approval: auto")).await;
    h.start_engine();
    let done = h
        .wait_for(id, &[RolloutState::Halted, RolloutState::Completed], LIMIT)
        .await;
    assert_eq!(done.state, RolloutState::Halted);
    assert!(done.state_reason.unwrap_or_default().contains("failure budget"));
    let waves = h.db.rollout_waves(id).await.unwrap();
    assert_eq!(waves[0].state, WaveState::Halted);
    assert_eq!(waves[1].state, WaveState::Planned, "no later wave started");
    // Let in-flight steps finish; a failed flash is never retried.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for e in h.fleet.endpoints() {
        assert!(flashes(&h, &e.name) <= 1, "{} flashed more than once", e.name);
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bricked_bmc_is_quarantined_and_halts_the_rollout() {
    let extra =
        "  - kind: gpu\n    version: \"96.00.99.00.01\"\n    flash_time: {min: 1m, max: 2m}\n    brick_rate: 1.0\n";
    let mut h = Harness::start(10, extra, false).await.unwrap();
    let id = start(&h, "96.00.99.00.01", policy("1m", "approval: auto")).await;
    h.start_engine();
    let done = h
        .wait_for(id, &[RolloutState::Halted, RolloutState::Completed], LIMIT)
        .await;
    assert_eq!(done.state, RolloutState::Halted);
    assert!(
        done.state_reason.clone().unwrap_or_default().contains("bricked"),
        "{:?}",
        done.state_reason
    );
    let quarantined =
        h.db.list_nodes(&orchestrator_db::model::NodeFilter {
            state: Some(NodeState::Quarantined),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!quarantined.is_empty());
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_bmcs_are_retried_with_backoff() {
    let mut h = Harness::start(6, "", false).await.unwrap();
    let flaky = h.fleet.endpoints()[0].name.clone();
    let control = format!("{}/sim/nodes/{flaky}/faults", h.fleet.control_url());
    let http = reqwest::Client::new();
    http.put(&control)
        .json(&serde_json::json!({"unavailable": true}))
        .send()
        .await
        .unwrap();
    let id = start(&h, GPU_TO, policy("1m", "approval: auto")).await;
    let mut config = h.config();
    config.base_backoff = chrono::Duration::seconds(60);
    h.start_engine_with(config, std::sync::Arc::new(orchestrator_engine::GatelessJudge));
    tokio::time::sleep(Duration::from_secs(3)).await;
    http.delete(&control).send().await.unwrap();
    let done = h
        .wait_for(id, &[RolloutState::Completed, RolloutState::Halted], LIMIT)
        .await;
    assert_eq!(done.state, RolloutState::Completed);
    let retries =
        h.db.audit_entries(&orchestrator_db::AuditFilter {
            action: Some("step.retry".into()),
            limit: Some(1000),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.details.get("retry_at").is_some())
        .count();
    assert!(retries >= 1, "the 503s were retried");
    assert_eq!(flashes(&h, &flaky), 1);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_waves_need_two_approvers_other_than_the_author() {
    let mut h = Harness::start(20, "", false).await.unwrap();
    let id = start(&h, GPU_TO, policy("1m", "approval: manual\n    approvers: 2")).await;
    h.start_engine();
    let waves = h.db.rollout_waves(id).await.unwrap();
    let canary = waves[0].id;
    assert_eq!(waves[0].approvals_required, 2);
    // Wait for the canary to await approval.
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let w = h.db.wave(canary).await.unwrap();
        if w.state == WaveState::AwaitingApproval
            && w.blockers
                .iter()
                .any(|b| matches!(b, orchestrator_engine::Blocker::Approvals { have: 0, need: 2 }))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "canary never awaited approval: {w:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let err = h.db.approve_wave(canary, "alice", None).await.unwrap_err();
    assert!(err.to_string().contains("two-person"), "{err}");
    h.db.approve_wave(canary, "bob", Some("looks fine")).await.unwrap();
    assert!(
        h.db.approve_wave(canary, "bob", None).await.is_err(),
        "one approval per person"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        h.db.wave(canary).await.unwrap().state,
        WaveState::AwaitingApproval,
        "one approval is not enough"
    );
    h.db.approve_wave(canary, "carol", None).await.unwrap();
    let done = h
        .wait_for(id, &[RolloutState::Completed, RolloutState::Halted], LIMIT)
        .await;
    assert_eq!(done.state, RolloutState::Completed);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_and_abort() {
    let mut h = Harness::start(20, "", false).await.unwrap();
    let id = start(&h, GPU_TO, policy("1m", "approval: auto")).await;
    h.db.user_set_rollout_state(
        id,
        &[RolloutState::Running],
        RolloutState::Paused,
        Some("change freeze"),
        "bob",
    )
    .await
    .unwrap();
    h.start_engine();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let counts = h.db.step_counts(id, None).await.unwrap();
    assert_eq!(
        counts.get(&StepState::Pending),
        Some(&20),
        "paused: nothing admitted: {counts:?}"
    );
    h.db.user_set_rollout_state(id, &[RolloutState::Paused], RolloutState::Running, None, "bob")
        .await
        .unwrap();
    // Let the canary start, then abort.
    let deadline = tokio::time::Instant::now() + LIMIT;
    while h
        .db
        .step_counts(id, None)
        .await
        .unwrap()
        .get(&StepState::Pending)
        .copied()
        .unwrap_or(0)
        == 20
    {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.db.user_set_rollout_state(
        id,
        &[RolloutState::Running, RolloutState::Paused],
        RolloutState::Aborted,
        Some("wrong image"),
        "bob",
    )
    .await
    .unwrap();
    // In-flight steps finish; nothing new starts.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let steps =
        h.db.steps(&StepFilter {
            rollout_id: Some(id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        steps
            .iter()
            .all(|s| s.state == StepState::Pending || s.state.is_terminal()),
        "in-flight steps finished"
    );
    let started = steps.iter().filter(|s| s.state != StepState::Pending).count();
    assert!(started > 0 && started <= 10, "only canary steps ran: {started}");
    assert_eq!(h.db.exec_rollout(id).await.unwrap().state, RolloutState::Aborted);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_reflashes_the_previous_version() {
    let mut h = Harness::start(12, "", false).await.unwrap();
    h.add_release(GPU_FROM, true).await;
    let id = start(&h, GPU_TO, policy("1m", "approval: auto")).await;
    h.start_engine();
    let done = h
        .wait_for(id, &[RolloutState::Completed, RolloutState::Halted], LIMIT)
        .await;
    assert_eq!(done.state, RolloutState::Completed);
    // A completed rollout can still be rolled back by a user.
    h.db.user_set_rollout_state(
        id,
        &[RolloutState::Completed],
        RolloutState::Halted,
        Some("regression found"),
        "bob",
    )
    .await
    .unwrap();
    h.db.begin_rollback(
        None,
        id,
        serde_json::json!({"scope": "rollout"}),
        "regression found",
        "bob",
    )
    .await
    .unwrap();
    let done = h.wait_for(id, &[RolloutState::RolledBack], LIMIT).await;
    assert_eq!(done.state_reason, None, "every node rolled back");
    for e in h.fleet.endpoints() {
        let versions = h.fleet.versions(&e.name).unwrap();
        assert!(
            versions
                .iter()
                .filter(|c| c.id.starts_with("HGX_FW_GPU_"))
                .all(|c| c.active == GPU_FROM),
            "{}",
            e.name
        );
        let counts = h.fleet.flash_counts(&e.name).unwrap();
        assert_eq!(
            (counts.get(GPU_TO), counts.get(GPU_FROM)),
            (Some(&1), Some(&1)),
            "{}: {counts:?}",
            e.name
        );
    }
    let waves = h.db.rollout_waves(id).await.unwrap();
    assert!(
        waves
            .iter()
            .filter(|w| w.name != "rollback")
            .all(|w| w.state == WaveState::RolledBack)
    );
    h.shutdown().await;
}
