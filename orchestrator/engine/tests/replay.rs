//! Deterministic replay of every crash point in the step machine's replay
//! table (see the engine's crate docs): a "crashed" controller drives one
//! node's step by hand to a chosen line — intent written, side effect done
//! or not, outcome not recorded — and dies holding the lease. A fresh
//! engine takes the lease over and must finish the rollout with exactly one
//! flash per node and step (bmc-sim's flash counts), no step skipped, and the
//! step's transitions in the audit log forming one unbroken chain.

use std::sync::Arc;
use std::time::Duration;

use integration_tests::fixtures::{PolicyYaml, WaveSize, WaveYaml};
use integration_tests::{GPU_TO, Harness};
use orchestrator_bmc::{ApplyTime, Bmc, ResetKind, ResetTarget, TaskHandle, UpdateMethod, UpdateRequest};
use orchestrator_db::execution::{
    ExecStep, Fence, PlacedStep, RolloutState, StepChange, StepFilter, StepState, StepTarget, WaveChange, WaveState,
};
use orchestrator_db::{AuditFilter, DbError};
use orchestrator_engine::EXECUTOR_LEASE;
use orchestrator_types::RolloutId;
use serde_json::json;

const NODES: usize = 3;
const LIMIT: Duration = Duration::from_secs(40);

/// One wave over the whole (small) fleet.
fn one_wave_policy() -> String {
    PolicyYaml::two_waves("replay")
        .waves(vec![WaveYaml::new("all", WaveSize::Rest).bake("1m")])
        .max_failed(0)
        .automatic_rollback(false)
        .render()
}

/// The controller that "crashes": it holds the lease and writes rows and
/// performs BMC calls exactly as the engine's step machine does, one line at
/// a time, so a test can stop between any two lines.
struct Crashed {
    h: Harness,
    rollout: RolloutId,
    fence: Fence,
    placed: PlacedStep,
    bmc: Arc<dyn Bmc>,
}

impl Crashed {
    async fn start() -> Crashed {
        let h = Harness::start(NODES, "", false).await.expect("sqlite harness");
        let release = h.add_release(GPU_TO, true).await;
        let rollout = h.start_rollout(release.id, one_wave_policy(), 5).await.id;
        // Short lease (one simulated minute is a quarter of a real second):
        // the engine started later takes it over once it expires.
        let fence =
            h.db.acquire_lease(EXECUTOR_LEASE, "crashed-controller", chrono::Duration::minutes(1))
                .await
                .expect("lease")
                .expect("free lease");
        let wave = h.db.rollout_waves(rollout).await.expect("waves")[0].clone();
        h.db.transition_wave(
            &fence,
            wave.id,
            WaveState::Planned,
            &WaveChange {
                state: Some(WaveState::Running),
                started_at: Some(h.now()),
                ..Default::default()
            },
            json!({}),
        )
        .await
        .expect("wave runs");
        let placed =
            h.db.open_steps()
                .await
                .expect("steps")
                .into_iter()
                .min_by_key(|p| p.step.id.0)
                .expect("a step");
        let bmc = h.connector().connect(&placed).expect("bmc driver");
        Crashed {
            h,
            rollout,
            fence,
            placed,
            bmc,
        }
    }

    fn step(&self) -> &ExecStep {
        &self.placed.step
    }

    async fn write(&mut self, change: StepChange) {
        let from = self.placed.step.state;
        self.placed.step = self
            .h
            .db
            .transition_step(
                &self.fence,
                self.placed.step.id,
                from,
                &change,
                json!({ "by": "crashed" }),
            )
            .await
            .expect("crashed controller writes");
    }

    /// pending → prechecked, as the engine's precheck writes it.
    async fn precheck(&mut self) {
        let inventory = self.bmc.firmware_inventory().await.expect("inventory");
        let targets = inventory
            .iter()
            .filter(|c| c.id.starts_with("HGX_FW_GPU_"))
            .map(|c| StepTarget {
                inventory_id: c.id.clone(),
                uri: c.uri.clone(),
            })
            .collect();
        let now = self.h.now();
        let previous = self.step().expected_from_version.clone();
        self.write(StepChange {
            state: Some(StepState::Prechecked),
            targets: Some(targets),
            previous_version: Some(previous),
            started_at: Some(now),
            attempts: Some(0),
            next_attempt_at: Some(None),
            error: Some(None),
            ..Default::default()
        })
        .await;
    }

    /// The push intent: the BMC's task list, then `pushing`.
    async fn push_intent(&mut self) {
        let known = self.bmc.list_tasks().await.expect("task list");
        let now = self.h.now();
        self.write(StepChange {
            state: Some(StepState::Pushing),
            known_tasks: Some(Some(known)),
            push_started_at: Some(Some(now)),
            ..Default::default()
        })
        .await;
    }

    /// The push itself (the side effect); returns the task URI.
    async fn push(&self) -> String {
        let step = self.step();
        let request = UpdateRequest {
            method: UpdateMethod::SimpleUpdate {
                image_uri: step.image_uri.clone(),
                transfer_protocol: None,
            },
            targets: step.targets.iter().map(|t| t.uri.clone()).collect(),
            apply_time: Some(ApplyTime::OnReset),
            force_update: None,
        };
        let handle = self.bmc.start_update(&request).await.expect("push accepted");
        handle.poll_uri().to_owned()
    }

    async fn adopt(&mut self, task_uri: &str) {
        self.write(StepChange {
            state: Some(StepState::Flashing),
            task_uri: Some(Some(task_uri.to_owned())),
            attempts: Some(0),
            next_attempt_at: Some(None),
            error: Some(None),
            ..Default::default()
        })
        .await;
    }

    /// Waits (real time) until the BMC reports the flash task completed.
    async fn wait_task_completed(&self, task_uri: &str) {
        let handle = TaskHandle {
            monitor_uri: task_uri.to_owned(),
            task_uri: Some(task_uri.to_owned()),
        };
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            let status = self.bmc.poll_task(&handle).await.expect("task readable");
            if status.is_completed() {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "flash task never completed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn flash_recorded(&mut self) {
        self.write(StepChange {
            state: Some(StepState::Activating),
            reset_issued_at: Some(None),
            unreachable_since: Some(None),
            ..Default::default()
        })
        .await;
    }

    async fn reset_intent(&mut self) {
        let now = self.h.now();
        let attempts = self.step().attempts + 1;
        self.write(StepChange {
            reset_issued_at: Some(Some(now)),
            attempts: Some(attempts),
            ..Default::default()
        })
        .await;
    }

    async fn reset(&self) {
        self.bmc
            .reset(&ResetTarget::System(None), ResetKind::GracefulRestart)
            .await
            .expect("reset accepted");
    }

    /// Waits (real time) until every GPU runs the target.
    async fn wait_active(&self) {
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            let versions = self.h.fleet.versions(&self.placed.node_name).expect("sim node");
            if versions
                .iter()
                .filter(|c| c.id.starts_with("HGX_FW_GPU_"))
                .all(|c| c.active == GPU_TO)
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the new version never activated"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn verifying_recorded(&mut self) {
        self.write(StepChange {
            state: Some(StepState::Verifying),
            ..Default::default()
        })
        .await;
    }

    /// The crash: the controller is gone; a fresh engine takes over once the
    /// lease expires and runs the rollout to the end. Then the invariants.
    async fn recover_and_check(mut self, expected_chain: &[(&str, &str)], expected_resets: i32) -> ExecStep {
        let crashed_step = self.placed.step.id;
        self.h.start_engine();
        let done = self
            .h
            .wait_for(self.rollout, &[RolloutState::Completed, RolloutState::Halted], LIMIT)
            .await;
        assert_eq!(done.state, RolloutState::Completed, "{:?}", done.state_reason);
        self.h.stop_engine().await;

        // The engine took the lease over with a new token; the crashed
        // controller's fence can no longer write.
        let (holder, token, _) = self.h.db.lease_holder(EXECUTOR_LEASE).await.unwrap().unwrap();
        assert_eq!((holder.as_str(), token), ("test-engine", 2));
        let fenced = self
            .h
            .db
            .transition_step(
                &self.fence,
                crashed_step,
                StepState::Succeeded,
                &StepChange::default(),
                json!({}),
            )
            .await;
        assert!(matches!(fenced, Err(DbError::Fenced { .. })), "{fenced:?}");

        let steps = self
            .h
            .db
            .steps(&StepFilter {
                rollout_id: Some(self.rollout),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(steps.len(), NODES);
        for step in &steps {
            assert_eq!(
                step.state,
                StepState::Succeeded,
                "step {} of node {}",
                step.id,
                step.node_id
            );
        }
        for endpoint in self.h.fleet.endpoints() {
            let counts = self.h.fleet.flash_counts(&endpoint.name).unwrap();
            assert_eq!(counts.get(GPU_TO), Some(&1), "{}: {counts:?}", endpoint.name);
            assert_eq!(counts.values().sum::<u32>(), 1, "{}: {counts:?}", endpoint.name);
            for c in self.h.fleet.versions(&endpoint.name).unwrap() {
                if c.id.starts_with("HGX_FW_GPU_") {
                    assert_eq!(c.active, GPU_TO, "{} {}", endpoint.name, c.id);
                }
            }
        }
        let crashed = steps.iter().find(|s| s.id == crashed_step).unwrap().clone();
        // The activation's attempt counter counts resets issued.
        assert_eq!(crashed.attempts, expected_resets, "resets of the crashed step");
        let chain = transitions(&self.h, crashed_step).await;
        let expected: Vec<(String, String)> = expected_chain
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect();
        assert_eq!(chain, expected, "transitions of the crashed step");
        for step in steps.iter().filter(|s| s.id != crashed_step) {
            assert_eq!(transitions(&self.h, step.id).await, happy_chain(), "step {}", step.id);
        }
        self.h.shutdown().await;
        crashed
    }
}

/// A step's state transitions from the audit log, oldest first.
async fn transitions(h: &Harness, step: orchestrator_types::StepId) -> Vec<(String, String)> {
    let mut entries =
        h.db.audit_entries(&AuditFilter {
            action: Some("step.transition".into()),
            subject_type: Some("step".into()),
            subject_id: Some(step.to_string()),
            limit: Some(1000),
            ..Default::default()
        })
        .await
        .unwrap();
    entries.reverse();
    let chain: Vec<(String, String)> = entries
        .iter()
        .map(|e| {
            let field = |k: &str| e.details.get(k).and_then(|v| v.as_str()).unwrap_or("?").to_owned();
            (field("from"), field("to"))
        })
        .collect();
    // Unbroken: each transition starts where the previous one ended.
    for pair in chain.windows(2) {
        assert_eq!(pair[0].1, pair[1].0, "broken chain for step {step}: {chain:?}");
    }
    chain
}

const HAPPY: [(&str, &str); 6] = [
    ("pending", "prechecked"),
    ("prechecked", "pushing"),
    ("pushing", "flashing"),
    ("flashing", "activating"),
    ("activating", "verifying"),
    ("verifying", "succeeded"),
];

fn happy_chain() -> Vec<(String, String)> {
    HAPPY.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_precheck_pushes_once() {
    let mut c = Crashed::start().await;
    c.precheck().await;
    c.recover_and_check(&HAPPY, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_intent_written_but_push_never_sent_pushes_once() {
    let mut c = Crashed::start().await;
    c.precheck().await;
    c.push_intent().await;
    c.recover_and_check(
        &[
            ("pending", "prechecked"),
            ("prechecked", "pushing"),
            ("pushing", "prechecked"),
            ("prechecked", "pushing"),
            ("pushing", "flashing"),
            ("flashing", "activating"),
            ("activating", "verifying"),
            ("verifying", "succeeded"),
        ],
        1,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_accepted_but_outcome_not_recorded_adopts_the_task() {
    let mut c = Crashed::start().await;
    c.precheck().await;
    c.push_intent().await;
    c.push().await;
    c.recover_and_check(&HAPPY, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_accepted_and_flash_finished_before_recovery_adopts_the_task() {
    let mut c = Crashed::start().await;
    c.precheck().await;
    c.push_intent().await;
    let task = c.push().await;
    c.wait_task_completed(&task).await;
    c.recover_and_check(&HAPPY, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_completed_but_not_recorded_activates_once() {
    let mut c = Crashed::start().await;
    c.precheck().await;
    c.push_intent().await;
    let task = c.push().await;
    c.adopt(&task).await;
    c.wait_task_completed(&task).await;
    c.recover_and_check(&HAPPY, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_intent_written_and_reset_sent_waits_instead_of_resetting_again() {
    let mut c = Crashed::start().await;
    c.precheck().await;
    c.push_intent().await;
    let task = c.push().await;
    c.adopt(&task).await;
    c.wait_task_completed(&task).await;
    c.flash_recorded().await;
    c.reset_intent().await;
    c.reset().await;
    c.recover_and_check(&HAPPY, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_intent_written_but_reset_never_sent_resets_after_the_activation_timeout() {
    let mut c = Crashed::start().await;
    c.precheck().await;
    c.push_intent().await;
    let task = c.push().await;
    c.adopt(&task).await;
    c.wait_task_completed(&task).await;
    c.flash_recorded().await;
    c.reset_intent().await;
    // The stamp the engine measures from, not a clock read after it: the
    // simulated clock runs fast enough that the two differ by seconds.
    let written = c.step().reset_issued_at.expect("reset intent recorded");
    let timeout = c.h.config().activation_timeout;
    let step = c.recover_and_check(&HAPPY, 2).await;
    // The lost reset is reissued only after the activation timeout: the
    // engine cannot tell a lost reset from a slow one.
    let reissued = step.reset_issued_at.expect("reset recorded");
    assert!(
        reissued >= written + timeout,
        "reset reissued at {reissued}, intent written at {written}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activated_but_not_recorded_verifies_without_another_reset() {
    let mut c = Crashed::start().await;
    c.precheck().await;
    c.push_intent().await;
    let task = c.push().await;
    c.adopt(&task).await;
    c.wait_task_completed(&task).await;
    c.flash_recorded().await;
    c.reset_intent().await;
    c.reset().await;
    c.wait_active().await;
    c.recover_and_check(&HAPPY, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verifying_written_succeeds_without_side_effects() {
    let mut c = Crashed::start().await;
    c.precheck().await;
    c.push_intent().await;
    let task = c.push().await;
    c.adopt(&task).await;
    c.wait_task_completed(&task).await;
    c.flash_recorded().await;
    c.reset_intent().await;
    c.reset().await;
    c.wait_active().await;
    c.verifying_recorded().await;
    c.recover_and_check(&HAPPY, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_completed_and_node_activated_before_the_flash_was_recorded() {
    // The flash finished and the host rebooted onto the new image (someone
    // else reset it) while the step still says `flashing`: polling the task
    // says completed, activation finds the target running and resets nothing.
    let mut c = Crashed::start().await;
    c.precheck().await;
    c.push_intent().await;
    let task = c.push().await;
    c.adopt(&task).await;
    c.wait_task_completed(&task).await;
    c.reset().await;
    c.wait_active().await;
    c.recover_and_check(&HAPPY, 0).await;
}
