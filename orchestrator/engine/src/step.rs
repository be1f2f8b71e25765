//! The per-node step machine: one move per call, intent written before each
//! side effect and the outcome after it. See the crate docs for the replay
//! table.

use std::sync::Arc;

use orchestrator_bmc::{
    ApplyTime, Bmc, BmcError, FirmwareComponent, ResetKind, ResetTarget, TaskHandle, UpdateMethod, UpdateRequest,
};
use orchestrator_db::execution::{ExecStep, Fence, PlacedStep, RolloutState, StepChange, StepState};
use orchestrator_db::{Db, DbError};
use orchestrator_policy::{ApplyTimeRule, UpdatePathRule, UpdateRules};
use orchestrator_types::{ComponentKind, FirmwareVersion, NodeState, RolloutClock, error_chain};
use serde_json::json;

use crate::config::EngineConfig;
use crate::controller::ControllerHealth;

/// What one move needs.
#[derive(Debug, Clone)]
pub(crate) struct StepCtx {
    pub db: Db,
    /// Deadlines, backoff and the lease are rollout time.
    pub clock: RolloutClock,
    pub config: EngineConfig,
    pub fence: Fence,
    pub health: Arc<ControllerHealth>,
    /// Every step row this context's transitions wrote, in commit order per
    /// step: the pass continues from these instead of reading every open
    /// step again after the moves.
    pub moved: Arc<std::sync::Mutex<Vec<ExecStep>>>,
}

/// What a step's moves need to know of its rollout.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepRules {
    /// The release's component kind (which reset activates it).
    pub kind: ComponentKind,
    /// The policy's `update:` requirements.
    pub update: UpdateRules,
}

impl StepRules {
    /// A kind with the driver's default update choice.
    pub fn of_kind(kind: ComponentKind) -> Self {
        Self {
            kind,
            update: UpdateRules::default(),
        }
    }

    /// The push the policy asks for: a required path is the only candidate; a required apply time is
    /// strict (refused, not replaced, by a BMC that cannot do it); by default OnReset is preferred.
    pub(crate) fn update_request(&self, image_uri: String, targets: Vec<String>) -> UpdateRequest {
        let forced = self.update.path.map(|p| match p {
            UpdatePathRule::SimpleUpdate => orchestrator_bmc::UpdatePath::SimpleUpdate,
            UpdatePathRule::MultipartPush => orchestrator_bmc::UpdatePath::MultipartPush,
            UpdatePathRule::HttpPush => orchestrator_bmc::UpdatePath::HttpPush,
        });
        let apply_time = match self.update.apply_time {
            Some(ApplyTimeRule::Immediate) => ApplyTime::Immediate,
            Some(ApplyTimeRule::OnReset) | None => ApplyTime::OnReset,
        };
        UpdateRequest {
            method: UpdateMethod::FromImageUri {
                image_uri,
                forced,
                strict_apply_time: self.update.apply_time.is_some(),
            },
            targets,
            apply_time: Some(apply_time),
            force_update: None,
        }
    }
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

impl StepCtx {
    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.clock.now()
    }

    /// Whether a push or reset may be sent now. The fenced intent write
    /// only proves nobody took the lease over *yet*; a successor may take
    /// it as soon as it expires and then look at the BMC. So a side effect
    /// is only sent while at least half the lease TTL is left, and the call
    /// with all its retries is cut off when a quarter is left
    /// ([`Self::within_lease`]): it has ended before any successor can
    /// exist. Otherwise the step waits for the next pass, which starts with
    /// a renewed lease.
    fn lease_covers_side_effect(&self) -> bool {
        let left = self.fence.expires_at - self.now();
        let covered = left >= self.config.lease_ttl / 2;
        if !covered {
            tracing::debug!(
                left_ms = left.num_milliseconds(),
                "lease too close to expiry for a side effect"
            );
        }
        covered
    }

    /// Runs a side effect's BMC call (with the driver's retries) for as long
    /// as the lease safely covers it: until a quarter of the lease TTL is
    /// left. The driver may retry a busy or unreachable BMC for longer than
    /// the lease lasts; past that point a successor could exist, so the
    /// call is dropped (no further attempt is sent) and reported as
    /// `None`: its outcome is unknown, which the step resolves from the
    /// BMC's task list or inventory on a later move.
    async fn within_lease<T>(&self, call: impl Future<Output = T>) -> Option<T> {
        let cutoff = self.fence.expires_at - self.config.lease_ttl / 4;
        let budget = self.clock.real_time(cutoff - self.now());
        match tokio::time::timeout(budget, call).await {
            Ok(outcome) => Some(outcome),
            Err(_) => {
                tracing::warn!(
                    budget_ms = budget.as_millis() as u64,
                    "BMC call cut short: the executor lease no longer covers it"
                );
                None
            }
        }
    }

    async fn transition(
        &self,
        step: &ExecStep,
        change: StepChange,
        details: serde_json::Value,
    ) -> Result<ExecStep, DbError> {
        self.transition_chain(step, vec![(change, details)]).await
    }

    /// [`Self::transition`] through several changes in one commit ([`Db::transition_step_chain`]):
    /// only for moves with no side effect between them.
    async fn transition_chain(
        &self,
        step: &ExecStep,
        changes: Vec<(StepChange, serde_json::Value)>,
    ) -> Result<ExecStep, DbError> {
        let moved = self
            .db
            .transition_step_chain(&self.fence, step.id, step.state, changes)
            .await?;
        Ok(self.note_moved(moved))
    }

    /// [`Self::transition_chain`] for moves decided by an inventory read that shows the target (a
    /// verified flash): the reading is recorded as the node's inventory in the same commit
    /// ([`Db::transition_step_chain_with_inventory`]), which is what the fleet overview shows and the
    /// next rollout plans from, brought up to date without waiting for a discovery pass.
    async fn transition_chain_recording(
        &self,
        step: &ExecStep,
        changes: Vec<(StepChange, serde_json::Value)>,
        inventory: Vec<FirmwareComponent>,
    ) -> Result<ExecStep, DbError> {
        let readings = crate::inventory::inventory_readings(inventory);
        let moved = self
            .db
            .transition_step_chain_with_inventory(&self.fence, step.id, step.state, changes, readings.recorded)
            .await?;
        Ok(self.note_moved(moved))
    }

    fn note_moved(&self, moved: ExecStep) -> ExecStep {
        self.moved
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(moved.clone());
        moved
    }

    /// The rows written since the last call.
    pub fn take_moved(&self) -> Vec<ExecStep> {
        std::mem::take(&mut *self.moved.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
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

    /// A fault of the controller's own (see [`BmcError::is_controller_fault`]):
    /// it says nothing about the node, so no attempt is spent, no backoff is
    /// set on the rollout clock and no brick timer starts. The step stays
    /// where it is; the controller is marked degraded, which holds every
    /// step and admission for a while of real time.
    fn controller_fault(&self, step: &ExecStep, err: &BmcError) -> Result<(), DbError> {
        tracing::debug!(step = %step.id, error = %error_chain(err), "controller fault; not charged to the node");
        self.health.report_fault(err.kind(), self.now());
        Ok(())
    }

    /// The later of `since` and the end of the controller's last degraded
    /// episode: time the controller could not look does not count as the
    /// node's silence or slowness.
    fn healthy_since(&self, since: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
        self.health.episode_end().map_or(since, |end| end.max(since))
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
        if err.is_controller_fault() || self.health.is_degraded() {
            // Only the BMC's silence while the controller itself is healthy
            // is evidence against the node.
            return self.controller_fault(step, err);
        }
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
        if now - self.healthy_since(since) < self.config.brick_timeout {
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
            Err(err) if err.is_controller_fault() => return self.controller_fault(step, &err),
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

    /// Why `step` has been in its state too long, if it has: every state
    /// that waits on a BMC has a deadline ([`EngineConfig::step_deadline`]).
    fn past_deadline(&self, step: &ExecStep) -> Option<String> {
        let deadline = self.config.step_deadline(step.state)?;
        let since = step.state_entered_at;
        if self.now() - self.healthy_since(since) < deadline {
            return None;
        }
        let what = match step.state {
            StepState::Prechecked | StepState::Pushing => "the BMC never accepted the push",
            StepState::Flashing => {
                "the BMC's update task never finished (it may still run: read the node's inventory before retrying)"
            }
            StepState::Activating => "the new version never became active",
            _ => "inventory never read back",
        };
        Some(format!(
            "deadline passed: {} since {since} (limit {} min): {what}",
            step.state,
            deadline.num_minutes()
        ))
    }

    /// One move of an admitted step.
    pub async fn advance(&self, placed: &PlacedStep, bmc: &dyn Bmc, rules: StepRules) -> Result<(), DbError> {
        let step = &placed.step;
        // Before the backoff: a step retrying forever is as stuck as one
        // whose task never ends.
        if let Some(reason) = self.past_deadline(step) {
            return self.fail(step, reason).await;
        }
        if step.next_attempt_at.is_some_and(|at| at > self.now()) {
            return Ok(());
        }
        match step.state {
            StepState::Prechecked => self.push(placed, bmc, rules).await,
            StepState::Pushing => self.resolve_push(placed, bmc).await,
            StepState::Flashing => self.poll_flash(placed, bmc).await,
            StepState::Activating => self.activate(placed, bmc, rules.kind).await,
            StepState::Verifying => self.verify(placed, bmc).await,
            StepState::Pending
            | StepState::Succeeded
            | StepState::Failed
            | StepState::Skipped
            | StepState::Deferred => Ok(()),
        }
    }

    /// prechecked → pushing (intent, with the BMC's task list) → flashing.
    async fn push(&self, placed: &PlacedStep, bmc: &dyn Bmc, rules: StepRules) -> Result<(), DbError> {
        let step = &placed.step;
        if !self.lease_covers_side_effect() {
            return Ok(());
        }
        let known = match bmc.list_tasks().await {
            Ok(tasks) => Some(tasks),
            Err(BmcError::Unsupported { .. }) => None,
            Err(err) if err.is_controller_fault() => return self.controller_fault(step, &err),
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
        // Listing tasks and writing the intent took time: check again. If
        // the lease ran low meanwhile the step stays `pushing` without a
        // push, which the next move resolves as a push that never landed.
        if !self.lease_covers_side_effect() {
            return Ok(());
        }
        // The driver picks the path this BMC offers (SimpleUpdate, multipart
        // or HttpPushUri) and refuses one that cannot restrict the targets;
        // OnReset is a preference (push-only BMCs apply Immediately) unless
        // the policy's `update:` requires a path or an apply time.
        let request = rules.update_request(
            step.image_uri.clone(),
            step.targets.iter().map(|t| t.uri.clone()).collect(),
        );
        match self.within_lease(bmc.start_update(&request)).await {
            Some(Ok(handle)) => self.adopt_task(&step, handle.poll_uri().to_owned()).await,
            // The BMC may or may not have accepted it: stay in `pushing`; the
            // next move finds out from the task list.
            None | Some(Err(BmcError::OutcomeUnknown { .. })) => Ok(()),
            // Never sent, or answered 503: nothing was accepted.
            // Nothing reached the BMC (a failed connect sends nothing; the
            // image never arrived): the step stays `pushing`, which the next
            // move resolves from the task list as a push that never landed.
            Some(Err(err)) if err.is_controller_fault() => self.controller_fault(&step, &err),
            Some(Err(err)) if err.is_transient() => self.retry_later(&step, StepState::Prechecked, &err).await,
            Some(Err(err)) => self.fail(&step, format!("push refused: {}", error_chain(&err))).await,
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
            Err(err) if err.is_controller_fault() => return self.controller_fault(&step, &err),
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
            // This reading, taken after the activation, is the read-back
            // that verification asks for: `verifying` and its outcome are
            // recorded from it, rather than read the whole inventory again on
            // the next pass. Nothing is sent to the BMC between the two
            // moves, so they share one commit (each keeps its audit entry)
            // with the reading: a crash leaves the step `activating`, which
            // reads again.
            let changes = vec![
                (
                    StepChange {
                        state: Some(StepState::Verifying),
                        ..Default::default()
                    },
                    json!({}),
                ),
                self.succeeded(&step, &inventory),
            ];
            self.transition_chain_recording(&step, changes, inventory).await?;
            return Ok(());
        }
        if !self.lease_covers_side_effect() {
            return Ok(());
        }
        let now = self.now();
        if let Some(issued) = step.reset_issued_at {
            // Measured from when the controller could last look: a storm of its own faults that
            // outlasts the timeout must not spend one of the node's resets.
            if now - self.healthy_since(issued) < self.config.activation_timeout {
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
        let issued_before = step.reset_issued_at;
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
        // The intent is written; a lease that ran low meanwhile means no
        // reset now (the activation timeout reissues it, one attempt spent).
        if !self.lease_covers_side_effect() {
            return Ok(());
        }
        let target = if kind == ComponentKind::Bmc {
            ResetTarget::Manager(None)
        } else {
            ResetTarget::System(None)
        };
        match self.within_lease(bmc.reset(&target, ResetKind::GracefulRestart)).await {
            // Sent or maybe sent: the activation timeout above reissues it if
            // the new version never appears.
            Some(Ok(_) | Err(BmcError::OutcomeUnknown { .. })) | None => Ok(()),
            // Not sent: the timeout above retries it.
            // Certainly not sent (a failed connect sends nothing): give the
            // reset attempt back so the controller's fault spends none of
            // the node's `max_resets`.
            Some(Err(err)) if err.is_controller_fault() => {
                self.transition(
                    &step,
                    StepChange {
                        reset_issued_at: Some(issued_before),
                        attempts: Some(step.attempts - 1),
                        ..Default::default()
                    },
                    json!({ "reason": "reset not sent: controller fault" }),
                )
                .await?;
                self.controller_fault(&step, &err)
            }
            Some(Err(err)) if err.is_transient() => {
                tracing::debug!(step = %step.id, error = %err, "reset not sent; will retry");
                Ok(())
            }
            Some(Err(err)) => self.fail(&step, format!("reset refused: {}", error_chain(&err))).await,
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
        self.verified(step, inventory).await
    }

    /// The move `verifying` → `succeeded` for an inventory that reads the target.
    fn succeeded(&self, step: &ExecStep, inventory: &[FirmwareComponent]) -> (StepChange, serde_json::Value) {
        (
            StepChange {
                state: Some(StepState::Succeeded),
                finished_at: Some(self.now()),
                unreachable_since: Some(None),
                error: Some(None),
                ..Default::default()
            },
            json!({ "versions": versions_of(step, inventory) }),
        )
    }

    /// verifying, with the inventory just read: succeeded (and the reading
    /// recorded as the node's inventory) when it shows the target, failed
    /// otherwise.
    async fn verified(&self, step: &ExecStep, inventory: Vec<FirmwareComponent>) -> Result<(), DbError> {
        match read_components(step, &inventory) {
            Reading::AtTarget => {
                let succeeded = self.succeeded(step, &inventory);
                self.transition_chain_recording(step, vec![succeeded], inventory)
                    .await
                    .map(drop)
            }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bmc_sim::{Fleet, FleetOptions, Scenario, SimClock};
    use chrono::{Duration, Utc};
    use orchestrator_bmc::{BmcEndpoint, Credentials, HttpClients, RedfishBmc};
    use orchestrator_db::execution::{NewPlan, NewStep, NewWave};
    use orchestrator_db::model::{NewNode, NewRelease, NewRollout, NodeLabels};
    use orchestrator_db::testing::TestDb;
    use orchestrator_types::ManualClock;

    use super::*;

    /// One simulated BMC and a one-step rollout for it, prechecked.
    struct OneStep {
        fleet: bmc_sim::RunningFleet,
        clock: Arc<ManualClock>,
        db: Db,
        bmc: RedfishBmc,
        _test_db: TestDb,
    }

    impl OneStep {
        async fn start() -> OneStep {
            let fleet_clock = Arc::new(SimClock::starting_now(1.0));
            let scenario = Scenario::from_yaml_str(
                r#"
seed: 1
fleet:
  nodes: 1
  racks: 1
  clusters: 1
  region: r
  sku: sku
  components:
    - {id: HGX_FW_GPU_0, kind: gpu, version: "1.0"}
"#,
            )
            .expect("scenario");
            let fleet = Fleet::start(scenario, FleetOptions::new(fleet_clock))
                .await
                .expect("fleet");
            let endpoint = fleet.endpoints()[0].clone();
            let clock = Arc::new(ManualClock::new(Utc::now()));
            let test_db = TestDb::sqlite(clock.clone()).await;
            let db = test_db.db.clone();
            db.import_nodes(
                &[NewNode {
                    name: endpoint.name.clone(),
                    bmc_url: endpoint.bmc_url.clone(),
                    credential_ref: "sim".into(),
                    platform_sku: "sku".into(),
                    labels: NodeLabels {
                        region: "r".into(),
                        cluster: "c".into(),
                        rack: "k".into(),
                        nvlink_domain: "n".into(),
                    },
                }],
                "test",
            )
            .await
            .expect("import");
            let node = db.node_by_name(&endpoint.name).await.expect("node");
            let release = db
                .add_release(
                    &NewRelease {
                        component_kind: ComponentKind::Gpu,
                        version: FirmwareVersion::parse("2.0").expect("version"),
                        image_uri: "http://127.0.0.1:9/gpu-2.0.fw".into(),
                        sha256: "a".repeat(64),
                        size_bytes: 1,
                        platforms: vec!["sku".into()],
                        release_notes: String::new(),
                    },
                    "alice",
                )
                .await
                .expect("release");
            db.start_rollout(
                &NewRollout {
                    release_id: release.id,
                    policy_name: "p".into(),
                    policy_commit: "c".into(),
                    policy_blob: "b".into(),
                    seed: 1,
                },
                "name: p",
                &NewPlan {
                    waves: vec![NewWave {
                        name: "w".into(),
                        bake_seconds: 0,
                        approvals_required: 0,
                        max_in_flight: 1,
                        gates: vec![],
                        control_nodes: vec![],
                        role: None,
                        steps: vec![NewStep {
                            node_id: node.id,
                            inventory_id: "HGX_FW_GPU_0".into(),
                            expected_from_version: "1.0".into(),
                        }],
                    }],
                    rollback_assessment: json!({"possible": true}),
                },
                "alice",
            )
            .await
            .expect("rollout");
            let bmc = RedfishBmc::new(
                &BmcEndpoint::new(
                    url::Url::parse(&endpoint.bmc_url).expect("url"),
                    Credentials::new("admin", "admin"),
                ),
                &HttpClients::new(),
            )
            .expect("driver");
            OneStep {
                fleet,
                clock,
                db,
                bmc,
                _test_db: test_db,
            }
        }

        async fn ctx(&self, lease_ttl: Duration) -> StepCtx {
            let config = EngineConfig {
                lease_ttl,
                ..EngineConfig::default()
            };
            let fence = self
                .db
                .acquire_lease("executor", "leader", config.lease_ttl)
                .await
                .expect("lease")
                .expect("ours");
            StepCtx {
                db: self.db.clone(),
                clock: self.clock.clone().into(),
                config,
                fence,
                health: Arc::new(ControllerHealth::default()),
                moved: Arc::default(),
            }
        }

        async fn prechecked(&self, ctx: &StepCtx) -> PlacedStep {
            let placed = self.db.open_steps().await.expect("steps").remove(0);
            ctx.precheck(&placed, &self.bmc).await.expect("precheck");
            let placed = self.db.open_steps().await.expect("steps").remove(0);
            assert_eq!(placed.step.state, StepState::Prechecked);
            placed
        }
    }

    /// A leader whose fence still matches (nobody took over yet) but whose
    /// lease is about to expire must not push: a successor could take over
    /// the moment it expires, find no task and push a second time. Once the
    /// lease is renewed, the same move pushes.
    #[tokio::test]
    async fn no_push_when_the_lease_is_about_to_expire() {
        let world = OneStep::start().await;
        let ctx = world.ctx(Duration::seconds(60)).await;
        let placed = world.prechecked(&ctx).await;
        let (clock, db, bmc) = (&world.clock, &world.db, &world.bmc);

        // A slow pass: 40 of the lease's 60 seconds are gone.
        clock.advance(Duration::seconds(40));
        ctx.advance(&placed, bmc, StepRules::of_kind(ComponentKind::Gpu))
            .await
            .expect("move");
        assert!(
            bmc.list_tasks().await.expect("tasks").is_empty(),
            "pushed on a dying lease"
        );
        let placed = db.open_steps().await.expect("steps").remove(0);
        assert_eq!(placed.step.state, StepState::Prechecked);

        // Renewed: the same move pushes.
        let ctx = world.ctx(Duration::seconds(60)).await;
        ctx.advance(&placed, bmc, StepRules::of_kind(ComponentKind::Gpu))
            .await
            .expect("move");
        assert_eq!(bmc.list_tasks().await.expect("tasks").len(), 1, "one push");
        let step = db.step(placed.step.id).await.expect("step");
        assert_eq!(step.state, StepState::Flashing);
        world.fleet.shutdown().await;
    }

    /// A simulated BMC stuck in one place: a push call that never ends, as
    /// when the driver keeps retrying a busy BMC (its retry deadline
    /// outlasts a lease), or an update task that runs forever.
    #[derive(Debug)]
    struct Stuck<'a> {
        bmc: &'a RedfishBmc,
        push: bool,
        task: bool,
    }

    #[async_trait::async_trait]
    impl Bmc for Stuck<'_> {
        fn endpoint(&self) -> &str {
            self.bmc.endpoint()
        }
        async fn probe(&self) -> Result<orchestrator_bmc::ServiceInfo, BmcError> {
            self.bmc.probe().await
        }
        async fn firmware_inventory(&self) -> Result<Vec<FirmwareComponent>, BmcError> {
            self.bmc.firmware_inventory().await
        }
        async fn start_update(&self, request: &UpdateRequest) -> Result<TaskHandle, BmcError> {
            if self.push {
                return std::future::pending().await;
            }
            self.bmc.start_update(request).await
        }
        async fn list_tasks(&self) -> Result<Vec<String>, BmcError> {
            self.bmc.list_tasks().await
        }
        async fn poll_task(&self, task: &TaskHandle) -> Result<orchestrator_bmc::TaskStatus, BmcError> {
            if self.task {
                return Ok(orchestrator_bmc::TaskStatus {
                    state: orchestrator_bmc::TaskState::Running,
                    percent_complete: Some(42),
                    messages: Vec::new(),
                });
            }
            self.bmc.poll_task(task).await
        }
        async fn reset(&self, target: &ResetTarget, kind: ResetKind) -> Result<Option<TaskHandle>, BmcError> {
            self.bmc.reset(target, kind).await
        }
        async fn read_sensors(&self) -> Result<Vec<orchestrator_bmc::SensorReading>, BmcError> {
            self.bmc.read_sensors().await
        }
        async fn read_events(
            &self,
            since: &orchestrator_bmc::EventCursor,
        ) -> Result<orchestrator_bmc::EventBatch, BmcError> {
            self.bmc.read_events(since).await
        }
        async fn logout(&self) -> Result<(), BmcError> {
            self.bmc.logout().await
        }
    }

    /// A push call still retrying when only a quarter of the lease is left
    /// is dropped, so no attempt can reach the BMC after a successor may
    /// have taken over; the step stays `pushing` (outcome unknown) and the
    /// next move, finding no task, pushes exactly once.
    #[tokio::test]
    async fn a_push_still_retrying_near_lease_expiry_is_cut_off() {
        let world = OneStep::start().await;
        // The manual clock stands still, so the call gets 3/4 of the TTL in real time.
        let ctx = world.ctx(Duration::seconds(2)).await;
        let placed = world.prechecked(&ctx).await;
        let started = std::time::Instant::now();
        let stuck = Stuck {
            bmc: &world.bmc,
            push: true,
            task: false,
        };
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            ctx.advance(&placed, &stuck, StepRules::of_kind(ComponentKind::Gpu)),
        )
        .await
        .expect("the push outlived the lease")
        .expect("move");
        let took = started.elapsed();
        assert!(
            took >= std::time::Duration::from_millis(1400) && took < std::time::Duration::from_secs(10),
            "cut off after {took:?}, expected about 1.5 s"
        );
        let placed = world.db.open_steps().await.expect("steps").remove(0);
        assert_eq!(placed.step.state, StepState::Pushing, "outcome unknown: stays pushing");
        assert!(world.bmc.list_tasks().await.expect("tasks").is_empty());

        let ctx = world.ctx(Duration::seconds(60)).await;
        for _ in 0..3 {
            let placed = world.db.open_steps().await.expect("steps").remove(0);
            if placed.step.state == StepState::Flashing {
                break;
            }
            ctx.advance(&placed, &world.bmc, StepRules::of_kind(ComponentKind::Gpu))
                .await
                .expect("move");
        }
        assert_eq!(
            world.bmc.list_tasks().await.expect("tasks").len(),
            1,
            "exactly one push"
        );
        let step = world.db.step(placed.step.id).await.expect("step");
        assert_eq!(step.state, StepState::Flashing);
        world.fleet.shutdown().await;
    }

    /// Issue 24's endless task: a BMC task that reports "running" forever
    /// held the rollout for good (1,400 polls over 21 hours). Now the step
    /// fails at the task deadline, with a reason that says what is stuck.
    #[tokio::test]
    async fn a_task_that_never_ends_fails_at_its_deadline() {
        let world = OneStep::start().await;
        let ctx = world.ctx(Duration::seconds(60)).await;
        let placed = world.prechecked(&ctx).await;
        let stuck = Stuck {
            bmc: &world.bmc,
            push: false,
            task: true,
        };
        ctx.advance(&placed, &stuck, StepRules::of_kind(ComponentKind::Gpu))
            .await
            .expect("push");
        let flashing = world.db.open_steps().await.expect("steps").remove(0);
        assert_eq!(flashing.step.state, StepState::Flashing);
        let deadline = ctx.config.deadlines.task;

        // Polled for just under the deadline: still flashing.
        world.clock.advance(deadline - Duration::minutes(1));
        let ctx = world.ctx(Duration::seconds(60)).await;
        ctx.advance(&flashing, &stuck, StepRules::of_kind(ComponentKind::Gpu))
            .await
            .expect("poll");
        let placed = world.db.open_steps().await.expect("steps").remove(0);
        assert_eq!(placed.step.state, StepState::Flashing);

        // Past it: failed, with the reason.
        world.clock.advance(Duration::minutes(2));
        let ctx = world.ctx(Duration::seconds(60)).await;
        ctx.advance(&placed, &stuck, StepRules::of_kind(ComponentKind::Gpu))
            .await
            .expect("poll");
        let step = world.db.step(placed.step.id).await.expect("step");
        assert_eq!(step.state, StepState::Failed);
        let error = step.error.unwrap_or_default();
        assert!(
            error.starts_with("deadline passed: flashing since") && error.contains("update task never finished"),
            "{error}"
        );
        world.fleet.shutdown().await;
    }
}
