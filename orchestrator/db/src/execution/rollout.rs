//! Stored rollouts: reads, status, and the one writer of rollout states.

use chrono::{DateTime, Utc};
use orchestrator_types::{ReleaseId, RolloutId};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, TransactionTrait};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::lease::{Fence, check_fence};
use super::{Blocker, ENGINE_ACTOR, RolloutState, from_json, parse, to_json};
use crate::audit;
use crate::entity::rollouts;
use crate::{Db, DbError};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// A stored rollout with what the engine needs to run it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ExecRollout {
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub id: RolloutId,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub release_id: ReleaseId,
    pub policy_name: String,
    pub policy_commit: String,
    pub policy_blob: String,
    pub state: RolloutState,
    pub state_reason: Option<String>,
    pub seed: i64,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The policy YAML the rollout runs under (pinned at start).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_source: Option<String>,
    pub rollback_assessment: Option<serde_json::Value>,
    pub blockers: Vec<Blocker>,
}

impl ExecRollout {
    /// Why the stored plan says this rollout cannot be rolled back (the
    /// assessment's `reasons`, or its one-line `reason` for plans stored
    /// before the list was kept); `None` when it can, or when no assessment
    /// was recorded.
    pub fn rollback_impossible(&self) -> Option<Vec<String>> {
        rollback_impossible(self.rollback_assessment.as_ref()?)
    }
}

pub(super) fn rollback_impossible(assessment: &serde_json::Value) -> Option<Vec<String>> {
    if assessment.get("possible").and_then(serde_json::Value::as_bool) != Some(false) {
        return None;
    }
    let listed: Vec<String> = assessment
        .get("reasons")
        .and_then(serde_json::Value::as_array)
        .map(|reasons| reasons.iter().filter_map(|r| r.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    if !listed.is_empty() {
        return Some(listed);
    }
    let reason = assessment
        .get("reason")
        .and_then(serde_json::Value::as_str)
        .filter(|r| !r.is_empty())
        .unwrap_or("no reason recorded");
    Some(vec![reason.to_owned()])
}

pub(super) fn to_exec_rollout(row: rollouts::Model) -> Result<ExecRollout, DbError> {
    Ok(ExecRollout {
        id: RolloutId(row.id),
        release_id: ReleaseId(row.release_id),
        state: parse("rollout state", &row.state)?,
        blockers: from_json("rollout blockers", row.blockers)?,
        policy_name: row.policy_name,
        policy_commit: row.policy_commit,
        policy_blob: row.policy_blob,
        state_reason: row.state_reason,
        seed: row.seed,
        created_by: row.created_by,
        created_at: row.created_at,
        updated_at: row.updated_at,
        policy_source: row.policy_source,
        rollback_assessment: row.rollback_assessment,
    })
}

impl Db {
    /// One rollout with its execution fields.
    pub async fn exec_rollout(&self, id: RolloutId) -> Result<ExecRollout, DbError> {
        let row = rollouts::Entity::find_by_id(id.0)
            .one(&self.reader)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "rollout",
                key: id.to_string(),
            })?;
        to_exec_rollout(row)
    }

    /// Every rollout, newest first.
    pub async fn exec_rollouts(&self) -> Result<Vec<ExecRollout>, DbError> {
        rollouts::Entity::find()
            .order_by_desc(rollouts::Column::Id)
            .all(&self.reader)
            .await?
            .into_iter()
            .map(to_exec_rollout)
            .collect()
    }

    /// Rollouts the engine still has work for: not completed or rolled back.
    /// Halted, paused and aborted ones are included so their in-flight
    /// flashes finish.
    pub async fn unfinished_rollouts(&self) -> Result<Vec<ExecRollout>, DbError> {
        let done = [
            RolloutState::Completed.as_str(),
            RolloutState::RolledBack.as_str(),
            "created",
        ];
        rollouts::Entity::find()
            .filter(rollouts::Column::State.is_not_in(done))
            .order_by_asc(rollouts::Column::Id)
            .all(&self.reader)
            .await?
            .into_iter()
            .map(to_exec_rollout)
            .collect()
    }

    /// Records what a rollout is waiting on (status only).
    pub async fn set_rollout_blockers(
        &self,
        fence: &Fence,
        rollout: RolloutId,
        blockers: &[Blocker],
    ) -> Result<(), DbError> {
        let txn = self.writer.begin().await?;
        check_fence(&txn, fence).await?;
        rollouts::Entity::update_many()
            .col_expr(rollouts::Column::Blockers, Expr::value(to_json(&blockers)))
            .filter(rollouts::Column::Id.eq(rollout.0))
            .exec(&txn)
            .await?;
        txn.commit().await?;
        Ok(())
    }

    /// The engine moves a rollout still in one of `from` to `to`.
    pub async fn engine_set_rollout_state(
        &self,
        fence: &Fence,
        rollout: RolloutId,
        from: &[RolloutState],
        to: RolloutState,
        reason: Option<&str>,
        details: serde_json::Value,
    ) -> Result<ExecRollout, DbError> {
        let txn = self.writer.begin().await?;
        check_fence(&txn, fence).await?;
        let row = set_rollout_state(
            &txn,
            RolloutMove {
                at: self.clock.now(),
                rollout,
                from,
                to,
                reason,
                actor: ENGINE_ACTOR,
                details,
            },
        )
        .await?;
        txn.commit().await?;
        to_exec_rollout(row)
    }

    /// A user moves a rollout from one of `from` to `to` (pause, resume,
    /// abort). Conditional on the current state, so it never overwrites a
    /// decision the engine made meanwhile.
    pub async fn user_set_rollout_state(
        &self,
        rollout: RolloutId,
        from: &[RolloutState],
        to: RolloutState,
        reason: Option<&str>,
        actor: &str,
    ) -> Result<ExecRollout, DbError> {
        let txn = self.writer.begin().await?;
        let row = set_rollout_state(
            &txn,
            RolloutMove {
                at: self.clock.now(),
                rollout,
                from,
                to,
                reason,
                actor,
                details: json!({}),
            },
        )
        .await?;
        txn.commit().await?;
        to_exec_rollout(row)
    }
}

/// One conditional move of a rollout's state, by the engine or a user.
#[derive(Debug)]
pub(super) struct RolloutMove<'a> {
    pub(super) at: DateTime<Utc>,
    pub(super) rollout: RolloutId,
    /// The states it may be moved from; anything else is `Stale`.
    pub(super) from: &'a [RolloutState],
    pub(super) to: RolloutState,
    pub(super) reason: Option<&'a str>,
    pub(super) actor: &'a str,
    /// Audit details; `from`, `to` and `reason` are added.
    pub(super) details: serde_json::Value,
}

/// The one writer of rollout states, shared by the fenced and user paths.
pub(super) async fn set_rollout_state<C: ConnectionTrait>(
    conn: &C,
    RolloutMove {
        at: now,
        rollout,
        from,
        to,
        reason,
        actor,
        details,
    }: RolloutMove<'_>,
) -> Result<rollouts::Model, DbError> {
    let current = rollouts::Entity::find_by_id(rollout.0)
        .one(conn)
        .await?
        .ok_or_else(|| DbError::NotFound {
            what: "rollout",
            key: rollout.to_string(),
        })?;
    let from_names: Vec<&str> = from.iter().map(|s| s.as_str()).collect();
    let result = rollouts::Entity::update_many()
        .col_expr(rollouts::Column::State, Expr::value(to.as_str()))
        .col_expr(rollouts::Column::StateReason, Expr::value(reason.map(str::to_owned)))
        .col_expr(rollouts::Column::UpdatedAt, Expr::value(now))
        .filter(rollouts::Column::Id.eq(rollout.0))
        .filter(rollouts::Column::State.is_in(from_names.clone()))
        .exec(conn)
        .await?;
    if result.rows_affected != 1 {
        return Err(DbError::Stale {
            what: "rollout",
            key: rollout.to_string(),
            expected: format!("{} (it is {})", from_names.join(" or "), current.state),
        });
    }
    let mut details = details;
    if let Some(obj) = details.as_object_mut() {
        obj.insert("from".into(), current.state.clone().into());
        obj.insert("to".into(), to.as_str().into());
        obj.insert("reason".into(), reason.into());
    }
    audit::append(
        conn,
        now,
        actor,
        &format!("rollout.{}", to.as_str()),
        "rollout",
        &rollout.to_string(),
        details,
    )
    .await?;
    rollouts::Entity::find_by_id(rollout.0)
        .one(conn)
        .await?
        .ok_or_else(|| DbError::NotFound {
            what: "rollout",
            key: rollout.to_string(),
        })
}
