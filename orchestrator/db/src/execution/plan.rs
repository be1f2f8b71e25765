//! Storing a plan with its rollout: waves and per-node steps, all or nothing.

use chrono::{DateTime, Utc};
use orchestrator_types::{NodeId, WaveRole};
use sea_orm::{ActiveModelTrait, EntityTrait, Set, TransactionTrait};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::rollout::{ExecRollout, to_exec_rollout};
use super::{RolloutState, StepPurpose, StepState, WaveKind, WaveState, to_json};
use crate::audit;
use crate::entity::{releases, rollouts, update_steps, waves};
use crate::model::NewRollout;
use crate::{Db, DbError};

/// A per-node step of a plan, to store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewStep {
    pub node_id: NodeId,
    /// The inventory id (or id pattern, e.g. `HGX_FW_GPU_*`) the step updates.
    pub inventory_id: String,
    /// The version every matching component must read before the flash.
    pub expected_from_version: String,
}

/// A wave of a plan, to store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewWave {
    pub name: String,
    pub bake_seconds: i64,
    /// Distinct approvals (never by the author) needed to promote this wave.
    pub approvals_required: u32,
    /// Flashes in flight at once within the wave.
    pub max_in_flight: u32,
    /// Health gate names evaluated during the bake.
    pub gates: Vec<String>,
    /// Comparable nodes that stay on the old version while the wave bakes.
    pub control_nodes: Vec<NodeId>,
    pub steps: Vec<NewStep>,
    /// The wave's part in the rollout's soak, if any (the planner's `WavePlan::role`).
    #[serde(default)]
    pub role: Option<WaveRole>,
}

/// A plan to store with a new rollout; never edited afterwards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewPlan {
    pub waves: Vec<NewWave>,
    /// The planner's judgement of whether the rollout can be undone.
    pub rollback_assessment: serde_json::Value,
}

impl Db {
    /// Creates a rollout in state `running` with its plan, all or nothing.
    /// The steps take the release's image; the plan is never edited later.
    pub async fn start_rollout(
        &self,
        new: &NewRollout,
        policy_source: &str,
        plan: &NewPlan,
        actor: &str,
    ) -> Result<ExecRollout, DbError> {
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        let release = releases::Entity::find_by_id(new.release_id.0)
            .one(&txn)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "release",
                key: new.release_id.to_string(),
            })?;
        let rollout = rollouts::ActiveModel {
            release_id: Set(new.release_id.0),
            policy_name: Set(new.policy_name.clone()),
            policy_commit: Set(new.policy_commit.clone()),
            policy_blob: Set(new.policy_blob.clone()),
            state: Set(RolloutState::Running.as_str().to_owned()),
            state_reason: Set(None),
            seed: Set(new.seed),
            created_by: Set(actor.to_owned()),
            created_at: Set(now),
            updated_at: Set(now),
            policy_source: Set(Some(policy_source.to_owned())),
            rollback_assessment: Set(Some(plan.rollback_assessment.clone())),
            blockers: Set(None),
            ..Default::default()
        }
        .insert(&txn)
        .await?;
        let mut total_steps = 0usize;
        for (position, wave) in plan.waves.iter().enumerate() {
            let wave_row = waves::ActiveModel {
                rollout_id: Set(rollout.id),
                position: Set(i32::try_from(position).unwrap_or(i32::MAX)),
                name: Set(wave.name.clone()),
                state: Set(WaveState::Planned.as_str().to_owned()),
                node_count: Set(i32::try_from(wave.steps.len()).unwrap_or(i32::MAX)),
                bake_seconds: Set(wave.bake_seconds),
                approvals_required: Set(i32::try_from(wave.approvals_required).unwrap_or(i32::MAX)),
                started_at: Set(None),
                bake_started_at: Set(None),
                ended_at: Set(None),
                decision: Set(None),
                kind: Set(WaveKind::Update.as_str().to_owned()),
                state_reason: Set(None),
                blockers: Set(None),
                gates: Set(Some(to_json(&wave.gates))),
                control_nodes: Set(Some(to_json(&wave.control_nodes))),
                verdict: Set(None),
                scope: Set(None),
                max_in_flight: Set(i32::try_from(wave.max_in_flight).unwrap_or(i32::MAX)),
                role: Set(wave.role.map(|r| r.as_str().to_owned())),
                ..Default::default()
            }
            .insert(&txn)
            .await?;
            let rows: Vec<update_steps::ActiveModel> = wave
                .steps
                .iter()
                .map(|step| new_step_row(rollout.id, wave_row.id, step, &release, now))
                .collect();
            total_steps += rows.len();
            // Well under both backends' bind-parameter limits per statement.
            for chunk in rows.chunks(200) {
                update_steps::Entity::insert_many(chunk.to_vec()).exec(&txn).await?;
            }
        }
        audit::append(
            &txn,
            now,
            actor,
            "rollout.start",
            "rollout",
            &rollout.id.to_string(),
            json!({ "release_id": new.release_id, "policy": new.policy_name,
                    "policy_commit": new.policy_commit, "policy_blob": new.policy_blob, "seed": new.seed,
                    "waves": plan.waves.iter().map(|w| json!({"name": w.name, "nodes": w.steps.len()})).collect::<Vec<_>>(),
                    "steps": total_steps, "rollback": plan.rollback_assessment }),
        )
        .await?;
        txn.commit().await?;
        self.steps_changed();
        to_exec_rollout(rollout)
    }
}

fn new_step_row(
    rollout: i64,
    wave: i64,
    step: &NewStep,
    release: &releases::Model,
    now: DateTime<Utc>,
) -> update_steps::ActiveModel {
    update_steps::ActiveModel {
        rollout_id: Set(rollout),
        wave_id: Set(wave),
        node_id: Set(step.node_id.0),
        inventory_id: Set(step.inventory_id.clone()),
        purpose: Set(StepPurpose::Update.as_str().to_owned()),
        expected_from_version: Set(step.expected_from_version.clone()),
        target_version: Set(release.version.clone()),
        image_uri: Set(release.image_uri.clone()),
        image_sha256: Set(release.sha256.clone()),
        state: Set(StepState::Pending.as_str().to_owned()),
        task_uri: Set(None),
        attempts: Set(0),
        next_attempt_at: Set(None),
        error: Set(None),
        created_at: Set(now),
        updated_at: Set(now),
        targets: Set(None),
        known_tasks: Set(None),
        previous_version: Set(None),
        push_started_at: Set(None),
        reset_issued_at: Set(None),
        unreachable_since: Set(None),
        started_at: Set(None),
        finished_at: Set(None),
        rollback_of: Set(None),
        ..Default::default()
    }
}
