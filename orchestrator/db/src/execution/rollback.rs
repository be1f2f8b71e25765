//! Rolling back: the rollback wave, its steps, and abandoning a rollback.

use std::collections::BTreeMap;

use orchestrator_types::{NodeId, RolloutId, WaveId};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, Set, TransactionTrait};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::lease::{Fence, check_fence};
use super::rollout::{ExecRollout, RolloutMove, rollback_impossible, set_rollout_state, to_exec_rollout};
use super::step::{ExecStep, StepFilter, to_exec_step};
use super::wave::{ExecWave, to_exec_wave};
use super::{ENGINE_ACTOR, RolloutState, StepPurpose, StepState, WaveKind, WaveState, parse, to_json};
use crate::audit;
use crate::entity::{nodes, rollouts, update_steps, waves};
use crate::{Db, DbError};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

impl Db {
    /// Creates the rollback wave of a rollout (state running, kind rollback)
    /// and moves the rollout to `rolling_back`, in one transaction. `scope`
    /// says what is rolled back: `{"scope": "rollout"}` or `{"scope":
    /// "wave", "waves": [ids]}`. Steps are added by the engine as updated
    /// nodes are found. Used by the engine (fenced) and by users (unfenced:
    /// a user command, like pause).
    pub async fn begin_rollback(
        &self,
        fence: Option<&Fence>,
        rollout: RolloutId,
        scope: serde_json::Value,
        reason: &str,
        actor: &str,
    ) -> Result<ExecWave, DbError> {
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        if let Some(fence) = fence {
            check_fence(&txn, fence).await?;
        }
        let row = rollouts::Entity::find_by_id(rollout.0)
            .one(&txn)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "rollout",
                key: rollout.to_string(),
            })?;
        let state: RolloutState = parse("rollout state", &row.state)?;
        if matches!(state, RolloutState::RollingBack | RolloutState::RolledBack) {
            return Err(DbError::Stale {
                what: "rollout",
                key: rollout.to_string(),
                expected: "not rolling back already".into(),
            });
        }
        if let Some(reasons) = row.rollback_assessment.as_ref().and_then(rollback_impossible) {
            return Err(DbError::Invalid {
                field: "rollback".into(),
                reason: format!("the plan says rollback is impossible: {}", reasons.join("; ")),
            });
        }
        let last_position = waves::Entity::find()
            .filter(waves::Column::RolloutId.eq(rollout.0))
            .order_by_desc(waves::Column::Position)
            .one(&txn)
            .await?
            .map_or(0, |w| w.position);
        let wave = waves::ActiveModel {
            rollout_id: Set(rollout.0),
            position: Set(Ord::max(last_position, 999) + 1),
            name: Set("rollback".to_owned()),
            state: Set(WaveState::Running.as_str().to_owned()),
            node_count: Set(0),
            bake_seconds: Set(0),
            approvals_required: Set(0),
            started_at: Set(Some(now)),
            bake_started_at: Set(None),
            ended_at: Set(None),
            decision: Set(None),
            kind: Set(WaveKind::Rollback.as_str().to_owned()),
            state_reason: Set(Some(reason.to_owned())),
            blockers: Set(None),
            gates: Set(None),
            control_nodes: Set(None),
            verdict: Set(None),
            scope: Set(Some(scope.clone())),
            max_in_flight: Set(0),
            ..Default::default()
        }
        .insert(&txn)
        .await?;
        set_rollout_state(
            &txn,
            RolloutMove {
                at: now,
                rollout,
                from: &[state],
                to: RolloutState::RollingBack,
                reason: Some(reason),
                actor,
                details: json!({ "scope": scope, "rollback_wave": wave.id }),
            },
        )
        .await?;
        txn.commit().await?;
        self.steps_changed();
        to_exec_wave(wave)
    }

    /// Adds a rollback step to a rollback wave for an update step that
    /// succeeded: same node and component, from the release back to the
    /// version recorded before the flash, with that version's image.
    pub async fn add_rollback_step(
        &self,
        fence: &Fence,
        rollback_wave: WaveId,
        of: &ExecStep,
        image_uri: &str,
        image_sha256: &str,
    ) -> Result<ExecStep, DbError> {
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        check_fence(&txn, fence).await?;
        let previous = of
            .previous_version
            .clone()
            .unwrap_or_else(|| of.expected_from_version.clone());
        let row = update_steps::ActiveModel {
            rollout_id: Set(of.rollout_id.0),
            wave_id: Set(rollback_wave.0),
            node_id: Set(of.node_id.0),
            inventory_id: Set(of.inventory_id.clone()),
            purpose: Set(StepPurpose::Rollback.as_str().to_owned()),
            expected_from_version: Set(of.target_version.clone()),
            target_version: Set(previous.clone()),
            image_uri: Set(image_uri.to_owned()),
            image_sha256: Set(image_sha256.to_owned()),
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
            rollback_of: Set(Some(of.id.0)),
            ..Default::default()
        }
        .insert(&txn)
        .await?;
        waves::Entity::update_many()
            .col_expr(waves::Column::NodeCount, Expr::col(waves::Column::NodeCount).add(1))
            .filter(waves::Column::Id.eq(rollback_wave.0))
            .exec(&txn)
            .await?;
        audit::append(
            &txn,
            now,
            ENGINE_ACTOR,
            "step.rollback_planned",
            "step",
            &row.id.to_string(),
            json!({ "rollback_of": of.id, "node_id": of.node_id, "from": of.target_version, "to": previous }),
        )
        .await?;
        txn.commit().await?;
        self.steps_changed();
        to_exec_step(row)
    }

    /// An admin stops a rollback that cannot finish (a BMC task that never
    /// ends, a node that will not answer): the rollout moves from rolling
    /// back to aborted, and the audit entry records each node's last known
    /// version, so whoever picks the fleet up knows what runs where. Steps
    /// in flight still finish or meet their deadline; nothing new starts.
    pub async fn abort_rollback(
        &self,
        rollout: RolloutId,
        reason: &str,
        actor: &str,
    ) -> Result<(ExecRollout, Vec<NodeVersion>), DbError> {
        let steps = self
            .steps(&StepFilter {
                rollout_id: Some(rollout),
                ..Default::default()
            })
            .await?;
        let node_ids: Vec<i64> = steps.iter().map(|s| s.node_id.0).collect();
        let names: BTreeMap<i64, String> = nodes::Entity::find()
            .filter(nodes::Column::Id.is_in(node_ids))
            .all(&self.reader)
            .await?
            .into_iter()
            .map(|n| (n.id, n.name))
            .collect();
        let versions = last_known_versions(&steps, &names);
        let txn = self.writer.begin().await?;
        let row = set_rollout_state(
            &txn,
            RolloutMove {
                at: self.clock.now(),
                rollout,
                from: &[RolloutState::RollingBack],
                to: RolloutState::Aborted,
                reason: Some(reason),
                actor,
                details: json!({ "rollback_aborted": true, "nodes": to_json(&versions) }),
            },
        )
        .await?;
        txn.commit().await?;
        self.steps_changed();
        Ok((to_exec_rollout(row)?, versions))
    }
}

/// What is known of one node's version when a rollback is abandoned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct NodeVersion {
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub node_id: NodeId,
    pub node: String,
    /// The state of the node's latest step in the rollout.
    pub step_state: StepState,
    /// The version last read or confirmed on the node; `None` when a flash
    /// may or may not have landed (see `unconfirmed`).
    pub last_known_version: Option<String>,
    /// The versions it may run when a flash was under way: `[from, to]`.
    pub unconfirmed: Option<[String; 2]>,
}

/// Each node's last known version from its latest step (rollback steps are
/// created after update steps, so the highest id is the latest).
fn last_known_versions(steps: &[ExecStep], names: &BTreeMap<i64, String>) -> Vec<NodeVersion> {
    let mut latest: BTreeMap<i64, &ExecStep> = BTreeMap::new();
    for step in steps {
        let entry = latest.entry(step.node_id.0).or_insert(step);
        if step.id.0 > entry.id.0 {
            *entry = step;
        }
    }
    latest
        .into_values()
        .map(|step| {
            let before = step
                .previous_version
                .clone()
                .unwrap_or_else(|| step.expected_from_version.clone());
            // A step that never pushed left the node where it was; one that
            // pushed and did not confirm may have landed either way.
            let (known, unconfirmed) = match step.state {
                StepState::Succeeded | StepState::Skipped => (Some(step.target_version.clone()), None),
                StepState::Pending | StepState::Prechecked | StepState::Deferred => (Some(before), None),
                StepState::Failed if step.push_started_at.is_none() && step.task_uri.is_none() => (Some(before), None),
                _ => (None, Some([before, step.target_version.clone()])),
            };
            NodeVersion {
                node_id: step.node_id,
                node: names.get(&step.node_id.0).cloned().unwrap_or_default(),
                step_state: step.state,
                last_known_version: known,
                unconfirmed,
            }
        })
        .collect()
}
