//! The release's qualification steers the engine: an unqualified release
//! runs its canary only and is held until qualified; a failed health
//! verdict rolls the rollout back (when the policy says so) and blocks the
//! release with the evidence; a blocked release halts every rollout of it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use integration_tests::{GPU_FROM, GPU_TO, Harness, policy};
use orchestrator_db::AuditFilter;
use orchestrator_db::execution::{ExecRollout, ExecWave, RolloutState, StepFilter, StepState, WaveState};
use orchestrator_db::model::NewGateResult;
use orchestrator_engine::{Blocker, HealthJudge, Outcome, StartRollout, WaveVerdict, start_rollout};
use orchestrator_policy::Policy;
use orchestrator_types::{QualificationState, ReleaseId, RolloutId, TransitionRequest};

const LIMIT: Duration = Duration::from_secs(60);

async fn start(h: &Harness, release: ReleaseId, policy_source: String) -> RolloutId {
    start_rollout(
        &h.db,
        &StartRollout {
            release_id: release,
            policy_source,
            policy_commit: Some("abc123".into()),
            policy_blob: Some("def456".into()),
            seed: 5,
        },
        "alice",
    )
    .await
    .expect("rollout starts")
    .id
}

fn flashed_nodes(h: &Harness) -> HashSet<String> {
    h.fleet
        .endpoints()
        .iter()
        .filter(|e| h.fleet.flash_counts(&e.name).unwrap().values().sum::<u32>() > 0)
        .map(|e| e.name.clone())
        .collect()
}

/// Waits (real time) until `check` holds for the rollout's waves.
async fn wait_for_waves(h: &Harness, id: RolloutId, what: &str, check: impl Fn(&[ExecWave]) -> bool) -> Vec<ExecWave> {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let waves = h.db.rollout_waves(id).await.unwrap();
        if check(&waves) {
            return waves;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: waves {:?}",
            waves
                .iter()
                .map(|w| format!("{}={} {:?}", w.name, w.state, w.blockers))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unqualified_release_runs_its_canary_then_waits_for_qualification() {
    let mut h = Harness::start(20, "", false).await.unwrap();
    let release = h.add_release(GPU_TO, false).await;
    assert_eq!(release.qualification_state, QualificationState::Registered);
    let source = policy("1m", "approval: auto").replace(
        "qualification:\n  required_gates: []",
        "qualification:\n  required_gates: [burn-in]\n  allow_unqualified_canary: true",
    );
    assert!(
        source.contains("allow_unqualified_canary"),
        "the policy template changed"
    );
    let id = start(&h, release.id, source).await;
    h.start_engine();

    let waves = wait_for_waves(&h, id, "the early wave waits for qualification", |waves| {
        waves.iter().any(|w| {
            w.name == "early"
                && w.blockers
                    == [Blocker::AwaitingQualification {
                        state: "registered".into(),
                        missing_gates: vec!["burn-in".into()],
                    }]
        })
    })
    .await;
    assert_eq!(waves[0].state, WaveState::Promoted, "the canary ran and baked");
    assert_eq!(waves[1].state, WaveState::Planned, "held before it starts");
    // Held for a while (several simulated minutes): nothing beyond the canary flashes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let canary: HashSet<String> = {
        let steps =
            h.db.steps(&StepFilter {
                rollout_id: Some(id),
                wave_id: Some(waves[0].id),
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(steps.iter().all(|s| s.state == StepState::Succeeded), "{steps:?}");
        let mut names = HashSet::new();
        for step in steps {
            names.insert(h.db.node(step.node_id).await.unwrap().name);
        }
        names
    };
    assert_eq!(canary.len(), 10);
    assert_eq!(flashed_nodes(&h), canary, "only canary nodes were flashed while held");
    assert_eq!(h.db.rollout_waves(id).await.unwrap()[1].state, WaveState::Planned);

    // Qualified but the policy's gate is still missing: still held.
    for to in [QualificationState::Qualifying, QualificationState::Qualified] {
        h.db.transition_release(release.id, &TransitionRequest { to, reason: None }, "alice")
            .await
            .unwrap();
    }
    wait_for_waves(&h, id, "held for the missing gate", |waves| {
        waves[1].blockers
            == [Blocker::AwaitingQualification {
                state: "qualified".into(),
                missing_gates: vec!["burn-in".into()],
            }]
    })
    .await;
    h.db.record_gate_result(
        release.id,
        &NewGateResult {
            gate: "burn-in".into(),
            passed: true,
            evidence: "https://ci.example/burn-in/1".into(),
        },
        "alice",
    )
    .await
    .unwrap();
    let done = h
        .wait_for(id, &[RolloutState::Completed, RolloutState::Halted], LIMIT)
        .await;
    assert_eq!(done.state, RolloutState::Completed, "{:?}", done.state_reason);
    for e in h.fleet.endpoints() {
        assert_eq!(
            h.fleet.flash_counts(&e.name).unwrap().values().sum::<u32>(),
            1,
            "{}",
            e.name
        );
    }
    h.shutdown().await;
}

/// Fails every wave named `wave` with fixed evidence.
#[derive(Debug)]
struct FailingJudge {
    wave: &'static str,
}

#[async_trait]
impl HealthJudge for FailingJudge {
    async fn judge(&self, _rollout: &ExecRollout, wave: &ExecWave, _policy: &Policy) -> WaveVerdict {
        if wave.name == self.wave {
            WaveVerdict {
                outcome: Outcome::Fail,
                summary: "xid_errors: canary 4.1/h vs control 0.2/h (p=0.0003)".into(),
                evidence: serde_json::json!({ "metric": "xid_errors", "p_value": 0.0003, "canary_nodes": 10 }),
            }
        } else {
            WaveVerdict {
                outcome: Outcome::Pass,
                summary: "healthy".into(),
                evidence: serde_json::json!({}),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_verdict_rolls_back_and_blocks_the_release_with_its_evidence() {
    let mut h = Harness::start(20, "", false).await.unwrap();
    h.add_release(GPU_FROM, true).await;
    let release = h.add_release(GPU_TO, true).await;
    let id = start(&h, release.id, policy("1m", "approval: auto")).await;
    h.start_engine_with(h.config(), Arc::new(FailingJudge { wave: "canary" }));

    let done = h
        .wait_for(
            id,
            &[RolloutState::RolledBack, RolloutState::Halted, RolloutState::Completed],
            LIMIT,
        )
        .await;
    assert_eq!(done.state, RolloutState::RolledBack, "{:?}", done.state_reason);
    let waves = h.db.rollout_waves(id).await.unwrap();
    assert_eq!(waves[0].decision.as_deref(), Some("rollback"));
    assert_eq!(waves[0].verdict.as_ref().unwrap().outcome, Outcome::Fail);
    assert_eq!(
        waves[1].state,
        WaveState::Planned,
        "no wave after the failed canary started"
    );

    let blocked = h.db.release(release.id).await.unwrap();
    assert_eq!(blocked.qualification_state, QualificationState::Blocked);
    let reason = blocked.state_reason.unwrap();
    assert!(
        reason.contains("wave canary") && reason.contains("xid_errors") && reason.contains("0.0003"),
        "{reason}"
    );
    let audit =
        h.db.audit_entries(&AuditFilter {
            subject_type: Some("release".into()),
            subject_id: Some(release.id.to_string()),
            action: Some("release.block".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(audit[0].actor, orchestrator_engine::ENGINE_ACTOR);

    // Every canary node is back on its previous version; nothing else was touched.
    for e in h.fleet.endpoints() {
        let counts = h.fleet.flash_counts(&e.name).unwrap();
        let versions = h.fleet.versions(&e.name).unwrap();
        assert!(
            versions
                .iter()
                .filter(|c| c.id.starts_with("HGX_FW_GPU_"))
                .all(|c| c.active == GPU_FROM),
            "{}: {versions:?}",
            e.name
        );
        match counts.get(GPU_TO) {
            Some(1) => assert_eq!(counts.get(GPU_FROM), Some(&1), "{}: {counts:?}", e.name),
            None => assert!(counts.is_empty(), "{}: {counts:?}", e.name),
            other => panic!("{}: flashed {other:?} times", e.name),
        }
    }
    assert_eq!(flashed_nodes(&h).len(), 10, "the canary only");

    // The blocked release is refused by a new rollout...
    let refused = start_rollout(
        &h.db,
        &StartRollout {
            release_id: release.id,
            policy_source: policy("1m", "approval: auto"),
            policy_commit: None,
            policy_blob: None,
            seed: 9,
        },
        "alice",
    )
    .await;
    assert!(refused.is_err(), "a blocked release cannot be planned");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_a_release_halts_its_running_rollouts() {
    let mut h = Harness::start(20, "", false).await.unwrap();
    let release = h.add_release(GPU_TO, true).await;
    // A long bake keeps the canary baking while the release is blocked.
    let id = start(&h, release.id, policy("1h", "approval: auto")).await;
    h.start_engine();
    wait_for_waves(&h, id, "the canary bakes", |waves| waves[0].state == WaveState::Baking).await;
    h.db.transition_release(
        release.id,
        &TransitionRequest {
            to: QualificationState::Blocked,
            reason: Some("vendor recall".into()),
        },
        "bob",
    )
    .await
    .unwrap();
    let done = h
        .wait_for(id, &[RolloutState::Halted, RolloutState::Completed], LIMIT)
        .await;
    assert_eq!(done.state, RolloutState::Halted);
    let reason = done.state_reason.unwrap();
    assert!(reason.contains("is blocked: vendor recall"), "{reason}");
    assert_eq!(flashed_nodes(&h).len(), 10, "nothing after the canary");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_automatic_rollback_a_failed_verdict_halts_and_still_blocks_the_release() {
    let mut h = Harness::start(20, "", false).await.unwrap();
    let release = h.add_release(GPU_TO, true).await;
    let source = policy("1m", "approval: auto").replace("automatic: true", "automatic: false");
    assert!(source.contains("automatic: false"), "the policy template changed");
    let id = start(&h, release.id, source).await;
    h.start_engine_with(h.config(), Arc::new(FailingJudge { wave: "canary" }));
    let done = h
        .wait_for(
            id,
            &[RolloutState::RolledBack, RolloutState::Halted, RolloutState::Completed],
            LIMIT,
        )
        .await;
    assert_eq!(done.state, RolloutState::Halted, "{:?}", done.state_reason);
    assert!(done.state_reason.unwrap().contains("xid_errors"));
    let waves = h.db.rollout_waves(id).await.unwrap();
    assert_eq!(waves[0].decision.as_deref(), Some("halt"));
    assert!(waves.iter().all(|w| w.name != "rollback"), "no rollback wave");
    assert_eq!(
        h.db.release(release.id).await.unwrap().qualification_state,
        QualificationState::Blocked
    );
    // The canary stays on the new version for a human to decide.
    let flashed = flashed_nodes(&h);
    assert_eq!(flashed.len(), 10);
    for name in &flashed {
        let counts = h.fleet.flash_counts(name).unwrap();
        assert_eq!(
            (counts.get(GPU_TO), counts.get(GPU_FROM)),
            (Some(&1), None),
            "{name}: {counts:?}"
        );
    }
    h.shutdown().await;
}
