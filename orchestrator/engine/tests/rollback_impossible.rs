//! Rollback impossible, from real data: a release that forbids downgrades is
//! planned as impossible to roll back, so a failed wave halts the rollout
//! (audited, release blocked) instead of rolling back; and a BMC reporting a
//! `LowestSupportedVersion` above what a component runs makes the planner
//! name that component.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use integration_tests::{GPU_FROM, GPU_TO, Harness, policy, scenario_with};
use orchestrator_db::execution::{ExecRollout, ExecWave, RolloutState, WaveKind};
use orchestrator_db::model::ReleaseRollback;
use orchestrator_db::{AuditFilter, DbError};
use orchestrator_engine::{HealthJudge, Outcome, StartRollout, WaveVerdict, start_rollout};
use orchestrator_policy::Policy;
use orchestrator_types::{QualificationState, ReleaseId, RolloutId};

const LIMIT: Duration = Duration::from_secs(60);
const FUSE: &str = "burns anti-rollback fuse SVN 4";

async fn start(h: &Harness, release: ReleaseId) -> RolloutId {
    start_rollout(
        &h.db,
        &StartRollout {
            release_id: release,
            policy_source: policy("1m", "approval: auto"),
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

/// Fails the canary; passes everything else.
#[derive(Debug)]
struct FailingCanary;

#[async_trait]
impl HealthJudge for FailingCanary {
    async fn judge(&self, _rollout: &ExecRollout, wave: &ExecWave, _policy: &Policy) -> WaveVerdict {
        let outcome = if wave.name == "canary" {
            Outcome::Fail
        } else {
            Outcome::Pass
        };
        WaveVerdict {
            outcome,
            summary: "xid_errors: canary 4.1/h vs control 0.2/h".into(),
            evidence: serde_json::json!({ "metric": "xid_errors" }),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_forbids_downgrades_halts_on_a_failed_wave_instead_of_rolling_back() {
    let mut h = Harness::start(12, "", false).await.unwrap();
    // The previous version is registered, so only the metadata stands in
    // the way of a rollback.
    h.add_release(GPU_FROM, true).await;
    let release = h
        .add_release_with(
            GPU_TO,
            true,
            &ReleaseRollback {
                downgrade_forbidden: Some(FUSE.into()),
                rollback_floor: None,
            },
        )
        .await;
    let id = start(&h, release.id).await;

    let planned = h.db.exec_rollout(id).await.unwrap();
    let assessment = planned.rollback_assessment.clone().expect("stored assessment");
    assert_eq!(assessment["possible"], false, "{assessment}");
    assert_eq!(
        assessment["assessment"]["blockers"][0]["code"], "release_forbids_downgrade",
        "{assessment}"
    );
    let reasons = planned.rollback_impossible().expect("impossible");
    assert_eq!(reasons, [format!("the release forbids downgrades ({FUSE})")]);

    h.start_engine_with(h.config(), Arc::new(FailingCanary));
    let done = h
        .wait_for(
            id,
            &[RolloutState::Halted, RolloutState::RolledBack, RolloutState::Completed],
            LIMIT,
        )
        .await;
    assert_eq!(done.state, RolloutState::Halted, "{:?}", done.state_reason);
    let reason = done.state_reason.clone().unwrap();
    assert!(
        reason.contains("automatic rollback refused") && reason.contains(FUSE),
        "{reason}"
    );
    let waves = h.db.rollout_waves(id).await.unwrap();
    assert!(
        waves.iter().all(|w| w.kind == WaveKind::Update),
        "no rollback wave: {waves:?}"
    );
    assert_eq!(
        waves[0].decision.as_deref(),
        Some("rollback"),
        "the policy asked for one"
    );

    // Halted, audited by the engine with the reason.
    let audit =
        h.db.audit_entries(&AuditFilter {
            subject_type: Some("rollout".into()),
            subject_id: Some(id.to_string()),
            action: Some("rollout.halted".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(audit[0].actor, orchestrator_engine::ENGINE_ACTOR);
    assert!(audit[0].details["reason"].as_str().unwrap().contains(FUSE), "{audit:?}");
    // The failed verdict still blocks the release.
    assert_eq!(
        h.db.release(release.id).await.unwrap().qualification_state,
        QualificationState::Blocked
    );
    // Nothing was flashed back, and a human cannot roll back either.
    for e in h.fleet.endpoints() {
        let counts = h.fleet.flash_counts(&e.name).unwrap();
        assert_eq!(counts.get(GPU_FROM), None, "{}: {counts:?}", e.name);
    }
    match h
        .db
        .begin_rollback(None, id, serde_json::json!({ "scope": "rollout" }), "try anyway", "bob")
        .await
    {
        Err(DbError::Invalid { reason, .. }) => assert!(reason.contains(FUSE), "{reason}"),
        other => panic!("a rollback the plan calls impossible was accepted: {other:?}"),
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowest_supported_version_above_the_current_one_blocks_rollback() {
    // The GPUs run GPU_FROM but their BMC refuses anything below 96.00.61.00.00.
    let nodes = 6;
    let scenario = scenario_with(nodes, "", r#", lowest_supported_version: "96.00.61.00.00""#);
    let h = Harness::start_with(scenario, false).await.unwrap();
    h.discover().await.expect("discovery");
    let first = h.db.list_nodes(&Default::default()).await.unwrap()[0].id;
    let gpu0 =
        h.db.node_components(first)
            .await
            .unwrap()
            .into_iter()
            .find(|c| c.reading.inventory_id == "HGX_FW_GPU_0")
            .unwrap();
    assert_eq!(gpu0.lowest_supported_version.as_deref(), Some("96.00.61.00.00"));

    let release = h.add_release(GPU_TO, true).await;
    let rollout = h.db.exec_rollout(start(&h, release.id).await).await.unwrap();
    let assessment = rollout.rollback_assessment.clone().unwrap();
    assert_eq!(assessment["possible"], false, "{assessment}");
    let blockers = assessment["assessment"]["blockers"].as_array().unwrap();
    assert_eq!(blockers.len(), 1, "{assessment}");
    assert_eq!(blockers[0]["code"], "component_forbids_downgrade");
    assert_eq!(
        blockers[0]["steps"].as_array().unwrap().len(),
        nodes * 8,
        "every planned GPU refuses its previous version"
    );
    assert_eq!(
        rollout.rollback_impossible().unwrap(),
        [format!("{} component(s) refuse older images", nodes * 8)]
    );
    h.shutdown().await;

    // A floor at the version the GPUs run does not stop a rollback to it.
    let scenario = scenario_with(nodes, "", &format!(r#", lowest_supported_version: "{GPU_FROM}""#));
    let h = Harness::start_with(scenario, false).await.unwrap();
    h.discover().await.expect("discovery");
    let release = h.add_release(GPU_TO, true).await;
    let rollout = h.db.exec_rollout(start(&h, release.id).await).await.unwrap();
    assert_eq!(rollout.rollback_assessment.as_ref().unwrap()["possible"], true);
    assert_eq!(rollout.rollback_impossible(), None);
    h.shutdown().await;
}
