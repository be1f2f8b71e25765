//! The per-node step machine: one move per call, intent written before each
//! side effect and the outcome after it. See the crate docs for the replay
//! table.

use std::sync::Arc;

use orchestrator_bmc::{
    ApplyTime, Bmc, BmcError, FirmwareComponent, ResetKind, ResetTarget, TaskHandle, UpdateMethod, UpdateRequest,
};
use orchestrator_db::execution::{ExecStep, Fence, PlacedStep, RolloutState, StepChange, StepState};
use orchestrator_db::{Db, DbError};
use orchestrator_types::{Clock, ComponentKind, FirmwareVersion, NodeState};
use serde_json::json;

use crate::config::EngineConfig;

/// What one move needs.
#[derive(Debug, Clone)]
pub(crate) struct StepCtx {
    pub db: Db,
    pub clock: Arc<dyn Clock>,
    pub config: EngineConfig,
    pub fence: Fence,
}

/// The ids a step flashes: the planner's inventory ids, joined by commas
/// when one push updates several components of a node (all eight GPUs).
pub(crate) fn step_inventory_ids(step: &ExecStep) -> Vec<&str> {
    step.inventory_id
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

fn same_version(found: &str, want: &str) -> bool {
    if found == want {
        return true;
    }
    match (FirmwareVersion::parse(found), FirmwareVersion::parse(want)) {
        (Ok(a), Ok(b)) => a.is_equivalent(&b),
        _ => false,
    }
}

/// What inventory says about the step's components.
enum Reading {
    /// Every component at the target.
    AtTarget,
    /// Every component at the expected version (or at the target), with the
    /// ones still to flash.
    Expected(Vec<FirmwareComponent>),
    /// Something else; the message names both versions.
    Unexpected(String),
}

fn read_components(step: &ExecStep, inventory: &[FirmwareComponent]) -> Reading {
    let mut to_flash = Vec::new();
    for id in step_inventory_ids(step) {
        let Some(component) = inventory.iter().find(|c| c.id == id) else {
            return Reading::Unexpected(format!("component {id} is not in the BMC's FirmwareInventory"));
        };
        let found = component.version.as_deref().unwrap_or("");
        if same_version(found, &step.target_version) {
            continue;
        }
        if !same_version(found, &step.expected_from_version) {
            return Reading::Unexpected(format!(
                "component {id} runs {found:?}, expected {:?} (or the target {:?})",
                step.expected_from_version, step.target_version
            ));
        }
        if !component.updateable {
            return Reading::Unexpected(format!("component {id} is not updateable"));
        }
        to_flash.push(component.clone());
    }
    if to_flash.is_empty() {
        Reading::AtTarget
    } else {
        Reading::Expected(to_flash)
    }
}

fn versions_of(step: &ExecStep, inventory: &[FirmwareComponent]) -> String {
    step_inventory_ids(step)
        .iter()
        .map(|id| {
            let v = inventory
                .iter()
                .find(|c| c.id == *id)
                .and_then(|c| c.version.clone())
                .unwrap_or_else(|| "absent".into());
            format!("{id}={v}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

impl StepCtx {
    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.clock.now()
    }

    async fn transition(
        &self,
        step: &ExecStep,
        change: StepChange,
        details: serde_json::Value,
    ) -> Result<ExecStep, DbError> {
        self.db
            .transition_step(&self.fence, step.id, step.state, &change, details)
            .await
    }

    async fn fail(&self, step: &ExecStep, reason: String) -> Result<(), DbError> {
        tracing::warn!(step = %step.id, node = %step.node_id, %reason, "step failed");
        self.transition(
            step,
            StepChange {
                state: Some(StepState::Failed),
                error: Some(Some(reason.clone())),
                finished_at: Some(self.now()),
                next_attempt_at: Some(None),
                ..Default::default()
            },
            json!({ "error": reason }),
        )
        .await
        .map(drop)
    }

    /// Fails a step whose node cannot even be addressed (or has nothing to
    /// flash with).
    pub async fn fail_unaddressable(&self, step: &ExecStep, reason: String) -> Result<(), DbError> {
        self.fail(step, reason).await
    }

    /// A transient failure: retry after a backoff, or fail after too many.
    async fn retry_later(&self, step: &ExecStep, back_to: StepState, err: &BmcError) -> Result<(), DbError> {
        let attempts = step.attempts + 1;
        if attempts >= self.config.max_attempts {
            return self
                .fail(step, format!("gave up after {attempts} attempts: {}", error_chain(err)))
                .await;
        }
        let at = self.now() + self.config.backoff(attempts);
        self.transition(
            step,
            StepChange {
                state: Some(back_to),
                attempts: Some(attempts),
                next_attempt_at: Some(Some(at)),
                error: Some(Some(error_chain(err))),
                ..Default::default()
            },
            json!({ "retry_at": at, "error": error_chain(err) }),
        )
        .await
        .map(drop)
    }

    /// The BMC did not answer while the node is mid-update. After
    /// `brick_timeout` of silence the node is bricked: quarantine it, fail
    /// the step and halt the rollout.
    async fn unreachable(&self, placed: &PlacedStep, err: &BmcError) -> Result<(), DbError> {
        let step = &placed.step;
        let now = self.now();
        let Some(since) = step.unreachable_since else {
            self.transition(
                step,
                StepChange {
                    unreachable_since: Some(Some(now)),
                    ..Default::default()
                },
                json!({}),
            )
            .await?;
            return Ok(());
        };
        if now - since < self.config.brick_timeout {
            return Ok(());
        }
        let reason = format!(
            "bricked: BMC of {} silent since {since} during {} ({})",
            placed.node_name,
            step.state,
            error_chain(err)
        );
        // The fenced write first: a controller that lost its lease must not
        // quarantine anything.
        self.fail(step, reason.clone()).await?;
        self.db
            .set_node_state(step.node_id, NodeState::Quarantined, Some(&reason), "engine")
            .await?;
        match self
            .db
            .engine_set_rollout_state(
                &self.fence,
                step.rollout_id,
                &[RolloutState::Running, RolloutState::Paused, RolloutState::RollingBack],
                RolloutState::Halted,
                Some(&format!("node {} bricked and was quarantined", placed.node_name)),
                json!({ "node": placed.node_name, "step": step.id }),
            )
            .await
        {
            Ok(_) | Err(DbError::Stale { .. }) => Ok(()),
            Err(err) => Err(err),
        }
    }

    async fn contact_restored(&self, step: &ExecStep) -> Result<ExecStep, DbError> {
        if step.unreachable_since.is_none() {
            return Ok(step.clone());
        }
        self.transition(
            step,
            StepChange {
                unreachable_since: Some(None),
                ..Default::default()
            },
            json!({}),
        )
        .await
    }

    /// Admission's move: read inventory and decide pending → prechecked,
    /// skipped (already at target, no flash) or failed (unexpected version).
    pub async fn precheck(&self, placed: &PlacedStep, bmc: &dyn Bmc) -> Result<(), DbError> {
        let step = &placed.step;
        let inventory = match bmc.firmware_inventory().await {
            Ok(inventory) => inventory,
            Err(err) if err.is_transient() => return self.retry_later(step, StepState::Pending, &err).await,
            Err(err) => return self.fail(step, format!("precheck: {}", error_chain(&err))).await,
        };
        match read_components(step, &inventory) {
            Reading::AtTarget => {
                self.transition(
                    step,
                    StepChange {
                        state: Some(StepState::Skipped),
                        finished_at: Some(self.now()),
                        next_attempt_at: Some(None),
                        ..Default::default()
                    },
                    json!({ "reason": "already at target", "versions": versions_of(step, &inventory) }),
                )
                .await?;
            }
            Reading::Unexpected(message) => self.fail(step, format!("precheck: {message}")).await?,
            Reading::Expected(components) => {
                let targets = components
                    .iter()
                    .map(|c| orchestrator_db::execution::StepTarget {
                        inventory_id: c.id.clone(),
                        uri: c.uri.clone(),
                    })
                    .collect();
                self.transition(
                    step,
                    StepChange {
                        state: Some(StepState::Prechecked),
                        targets: Some(targets),
                        previous_version: Some(step.expected_from_version.clone()),
                        started_at: Some(self.now()),
                        attempts: Some(0),
                        next_attempt_at: Some(None),
                        error: Some(None),
                        ..Default::default()
                    },
                    json!({ "versions": versions_of(step, &inventory) }),
                )
                .await?;
            }
        }
        Ok(())
    }

    /// One move of an admitted step.
    pub async fn advance(&self, placed: &PlacedStep, bmc: &dyn Bmc, kind: ComponentKind) -> Result<(), DbError> {
        let step = &placed.step;
        if step.next_attempt_at.is_some_and(|at| at > self.now()) {
            return Ok(());
        }
        match step.state {
            StepState::Prechecked => self.push(placed, bmc).await,
            StepState::Pushing => self.resolve_push(placed, bmc).await,
            StepState::Flashing => self.poll_flash(placed, bmc).await,
            StepState::Activating => self.activate(placed, bmc, kind).await,
            StepState::Verifying => self.verify(placed, bmc).await,
            StepState::Pending | StepState::Succeeded | StepState::Failed | StepState::Skipped => Ok(()),
        }
    }

    /// prechecked → pushing (intent, with the BMC's task list) → flashing.
    async fn push(&self, placed: &PlacedStep, bmc: &dyn Bmc) -> Result<(), DbError> {
        let step = &placed.step;
        let known = match bmc.list_tasks().await {
            Ok(tasks) => Some(tasks),
            Err(BmcError::Unsupported { .. }) => None,
            Err(err) if err.is_transient() => return self.retry_later(step, StepState::Prechecked, &err).await,
            Err(err) => return self.fail(step, format!("listing tasks: {}", error_chain(&err))).await,
        };
        let step = self
            .transition(
                step,
                StepChange {
                    state: Some(StepState::Pushing),
                    known_tasks: Some(known),
                    push_started_at: Some(Some(self.now())),
                    ..Default::default()
                },
                json!({ "image_uri": step.image_uri, "target": step.target_version }),
            )
            .await?;
        let request = UpdateRequest {
            method: UpdateMethod::SimpleUpdate {
                image_uri: step.image_uri.clone(),
                transfer_protocol: None,
            },
            targets: step.targets.iter().map(|t| t.uri.clone()).collect(),
            apply_time: Some(ApplyTime::OnReset),
            force_update: None,
        };
        match bmc.start_update(&request).await {
            Ok(handle) => self.adopt_task(&step, handle.poll_uri().to_owned()).await,
            // The BMC may or may not have accepted it: stay in `pushing`; the
            // next move finds out from the task list.
            Err(BmcError::OutcomeUnknown { .. }) => Ok(()),
            // Never sent, or answered 503: nothing was accepted.
            Err(err) if err.is_transient() => self.retry_later(&step, StepState::Prechecked, &err).await,
            Err(err) => self.fail(&step, format!("push refused: {}", error_chain(&err))).await,
        }
    }

    async fn adopt_task(&self, step: &ExecStep, task_uri: String) -> Result<(), DbError> {
        self.transition(
            step,
            StepChange {
                state: Some(StepState::Flashing),
                task_uri: Some(Some(task_uri.clone())),
                attempts: Some(0),
                next_attempt_at: Some(None),
                error: Some(None),
                ..Default::default()
            },
            json!({ "task_uri": task_uri }),
        )
        .await
        .map(drop)
    }

    /// `pushing` found again (after a crash or an ambiguous answer): did the
    /// BMC accept the push? A task that was not in the list taken before the
    /// push is ours: adopt it. No new task and the target not running: the
    /// push never landed, so it may be sent again.
    async fn resolve_push(&self, placed: &PlacedStep, bmc: &dyn Bmc) -> Result<(), DbError> {
        let step = &placed.step;
        let Some(known) = &step.known_tasks else {
            // This BMC cannot list tasks: without proof the push was lost,
            // pushing again could flash twice, so a human decides.
            return match bmc.firmware_inventory().await {
                Ok(inventory) if matches!(read_components(step, &inventory), Reading::AtTarget) => {
                    self.to_verifying(step).await
                }
                Ok(_) => {
                    self.fail(
                        step,
                        "push outcome unknown and the BMC cannot list tasks: not pushing again".into(),
                    )
                    .await
                }
                Err(err) if err.is_transient() => self.unreachable(placed, &err).await,
                Err(err) => self.fail(step, format!("resolving push: {}", error_chain(&err))).await,
            };
        };
        let tasks = match bmc.list_tasks().await {
            Ok(tasks) => tasks,
            Err(err) if err.is_transient() => return self.unreachable(placed, &err).await,
            Err(err) => return self.fail(step, format!("resolving push: {}", error_chain(&err))).await,
        };
        let step = self.contact_restored(step).await?;
        if let Some(ours) = tasks.iter().rev().find(|t| !known.contains(t)) {
            tracing::info!(step = %step.id, task = %ours, "push outcome resolved: the BMC had accepted it");
            return self.adopt_task(&step, ours.clone()).await;
        }
        let inventory = match bmc.firmware_inventory().await {
            Ok(inventory) => inventory,
            Err(err) if err.is_transient() => return Ok(()),
            Err(err) => return self.fail(&step, format!("resolving push: {}", error_chain(&err))).await,
        };
        if matches!(read_components(&step, &inventory), Reading::AtTarget) {
            return self.to_verifying(&step).await;
        }
        tracing::info!(step = %step.id, "push outcome resolved: the BMC never accepted it; will push again");
        self.transition(
            &step,
            StepChange {
                state: Some(StepState::Prechecked),
                known_tasks: Some(None),
                push_started_at: Some(None),
                ..Default::default()
            },
            json!({ "reason": "no new task on the BMC: the push never landed" }),
        )
        .await
        .map(drop)
    }

    async fn to_verifying(&self, step: &ExecStep) -> Result<(), DbError> {
        self.transition(
            step,
            StepChange {
                state: Some(StepState::Verifying),
                ..Default::default()
            },
            json!({}),
        )
        .await
        .map(drop)
    }

    /// flashing: poll the stored task until it completes (→ activating) or
    /// fails (→ failed).
    async fn poll_flash(&self, placed: &PlacedStep, bmc: &dyn Bmc) -> Result<(), DbError> {
        let step = &placed.step;
        let Some(task_uri) = step.task_uri.clone() else {
            return self.fail(step, "flashing without a task URI".into()).await;
        };
        let handle = TaskHandle {
            monitor_uri: task_uri.clone(),
            task_uri: Some(task_uri),
        };
        match bmc.poll_task(&handle).await {
            Ok(status) if status.is_completed() => {
                self.transition(
                    step,
                    StepChange {
                        state: Some(StepState::Activating),
                        reset_issued_at: Some(None),
                        unreachable_since: Some(None),
                        ..Default::default()
                    },
                    json!({ "task_state": status.state.to_string() }),
                )
                .await?;
                Ok(())
            }
            Ok(_) => self.contact_restored(step).await.map(drop),
            Err(err @ BmcError::TaskFailed { .. }) => self.fail(step, format!("flash failed: {err}")).await,
            Err(BmcError::Rejected { status: 404, .. }) => {
                // The task is gone (BMC restarted, task list overwritten):
                // only inventory can tell.
                match bmc.firmware_inventory().await {
                    Ok(inventory) if matches!(read_components(step, &inventory), Reading::AtTarget) => {
                        self.to_verifying(step).await
                    }
                    Ok(inventory) => {
                        self.fail(
                            step,
                            format!(
                                "the flash task vanished; inventory reads {}",
                                versions_of(step, &inventory)
                            ),
                        )
                        .await
                    }
                    Err(err) if err.is_transient() => self.unreachable(placed, &err).await,
                    Err(err) => self.fail(step, error_chain(&err)).await,
                }
            }
            Err(err) if err.is_transient() => self.unreachable(placed, &err).await,
            Err(err) => {
                self.fail(step, format!("polling the flash task: {}", error_chain(&err)))
                    .await
            }
        }
    }

    /// activating: a reset makes the staged image run. Reset only when the
    /// new version is not active yet; the intent (`reset_issued_at`) is
    /// written first, so a crash after it waits for that reset instead of
    /// resetting again at once.
    async fn activate(&self, placed: &PlacedStep, bmc: &dyn Bmc, kind: ComponentKind) -> Result<(), DbError> {
        let step = &placed.step;
        let inventory = match bmc.firmware_inventory().await {
            Ok(inventory) => inventory,
            // A manager reset makes the BMC silent for a while: expected.
            Err(err) if err.is_transient() => return self.unreachable(placed, &err).await,
            Err(err) => return self.fail(step, format!("activation: {}", error_chain(&err))).await,
        };
        let step = self.contact_restored(step).await?;
        if matches!(read_components(&step, &inventory), Reading::AtTarget) {
            return self.to_verifying(&step).await;
        }
        let now = self.now();
        if let Some(issued) = step.reset_issued_at {
            if now - issued < self.config.activation_timeout {
                return Ok(());
            }
            if u32::try_from(step.attempts).unwrap_or(u32::MAX) >= self.config.max_resets {
                return self
                    .fail(
                        &step,
                        format!(
                            "the new version did not activate after {} resets; inventory reads {}",
                            step.attempts,
                            versions_of(&step, &inventory)
                        ),
                    )
                    .await;
            }
        }
        let step = self
            .transition(
                &step,
                StepChange {
                    reset_issued_at: Some(Some(now)),
                    attempts: Some(step.attempts + 1),
                    ..Default::default()
                },
                json!({}),
            )
            .await?;
        let target = if kind == ComponentKind::Bmc {
            ResetTarget::Manager(None)
        } else {
            ResetTarget::System(None)
        };
        match bmc.reset(&target, ResetKind::GracefulRestart).await {
            Ok(_) | Err(BmcError::OutcomeUnknown { .. }) => Ok(()),
            // Not sent: the timeout above retries it.
            Err(err) if err.is_transient() => {
                tracing::debug!(step = %step.id, error = %err, "reset not sent; will retry");
                Ok(())
            }
            Err(err) => self.fail(&step, format!("reset refused: {}", error_chain(&err))).await,
        }
    }

    /// verifying: success only when inventory reads back the target.
    async fn verify(&self, placed: &PlacedStep, bmc: &dyn Bmc) -> Result<(), DbError> {
        let step = &placed.step;
        let inventory = match bmc.firmware_inventory().await {
            Ok(inventory) => inventory,
            Err(err) if err.is_transient() => return self.unreachable(placed, &err).await,
            Err(err) => return self.fail(step, format!("verification: {}", error_chain(&err))).await,
        };
        match read_components(step, &inventory) {
            Reading::AtTarget => self
                .transition(
                    step,
                    StepChange {
                        state: Some(StepState::Succeeded),
                        finished_at: Some(self.now()),
                        unreachable_since: Some(None),
                        error: Some(None),
                        ..Default::default()
                    },
                    json!({ "versions": versions_of(step, &inventory) }),
                )
                .await
                .map(drop),
            _ => {
                self.fail(
                    step,
                    format!(
                        "after activation inventory reads {}, expected {}",
                        versions_of(step, &inventory),
                        step.target_version
                    ),
                )
                .await
            }
        }
    }
}
