//! Approvals of a wave: the two-person rule, given only for the verdict read
//! and only while the rollout is active.

use chrono::{DateTime, Utc};
use orchestrator_types::{Outcome, WaveId, WaveVerdict};
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, Set, TransactionTrait};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::wave::to_exec_wave;
use super::{RolloutState, WaveState, parse};
use crate::audit;
use crate::entity::{rollouts, wave_approvals, waves};
use crate::error::is_unique_violation;
use crate::{Db, DbError};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// One recorded approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Approval {
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub wave_id: WaveId,
    pub approver: String,
    pub comment: Option<String>,
    pub approved_at: DateTime<Utc>,
    /// The wave state the approval was given in; `None` for approvals stored
    /// before this was kept (they count for nothing).
    pub wave_state: Option<WaveState>,
    /// The outcome of the verdict the approver saw; `None` when given
    /// before this was kept (or with no verdict on the wave).
    pub verdict_outcome: Option<Outcome>,
}

/// The approvals that count: given while the wave awaited one, under the
/// verdict it has now. The one rule the engine promotes by and every reader
/// (CLI, API, UI) counts by, so "N of M" always means what the engine sees.
pub fn counted_approvals<'a>(approvals: &'a [Approval], verdict: Option<&WaveVerdict>) -> Vec<&'a Approval> {
    let outcome = verdict.map(|v| v.outcome);
    approvals
        .iter()
        .filter(|a| a.wave_state == Some(WaveState::AwaitingApproval) && a.verdict_outcome == outcome)
        .collect()
}

/// How many approvals a wave awaiting them needs: the policy's count, and at
/// least one, since a verdict that is not a pass waits for one person's
/// "promote anyway" even where the policy asks for none.
pub fn approvals_needed(approvals_required: i32) -> u32 {
    u32::try_from(approvals_required.max(1)).unwrap_or(1)
}

impl Db {
    /// Records an approval of a wave. The approver must not be the
    /// rollout's author (two-person rule) and approves a wave once.
    pub async fn approve_wave(
        &self,
        wave: WaveId,
        approver: &str,
        comment: Option<&str>,
    ) -> Result<Vec<Approval>, DbError> {
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        let wave_row = waves::Entity::find_by_id(wave.0)
            .one(&txn)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "wave",
                key: wave.to_string(),
            })?;
        let rollout = rollouts::Entity::find_by_id(wave_row.rollout_id)
            .one(&txn)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "rollout",
                key: wave_row.rollout_id.to_string(),
            })?;
        // A rollout started from the CLI is recorded as `local-admin:<user>`;
        // that user is its author too.
        if rollout.created_by == approver || rollout.created_by.strip_prefix("local-admin:") == Some(approver) {
            return Err(DbError::Invalid {
                field: "approver".into(),
                reason: format!("{approver} started this rollout and cannot approve its waves (two-person rule)"),
            });
        }
        let rollout_state: RolloutState = parse("rollout state", &rollout.state)?;
        if !rollout_state.is_active() {
            return Err(DbError::Conflict {
                what: "wave",
                key: wave_row.name.clone(),
                reason: format!(
                    "rollout {} is {rollout_state}: a finished, stopped or rolled-back rollout takes no approvals",
                    rollout.id
                ),
            });
        }
        let state: WaveState = parse("wave state", &wave_row.state)?;
        // An approval is for the verdict the approver read: given earlier
        // (while the wave still flashes or bakes) it would be counted for a
        // verdict nobody saw, so it is refused, never kept for later.
        if state != WaveState::AwaitingApproval {
            return Err(DbError::Conflict {
                what: "wave",
                key: wave_row.name.clone(),
                reason: format!(
                    "the wave is {state}: approvals are taken only while it awaits one after its health verdict"
                ),
            });
        }
        let verdict = to_exec_wave(wave_row.clone())?.verdict;
        // Once the wave has the approvals it needs, the engine promotes it on
        // its next pass; another would be counted for nothing ("2 of 1").
        let given = wave_approvals::Entity::find()
            .filter(wave_approvals::Column::WaveId.eq(wave.0))
            .all(&txn)
            .await?
            .into_iter()
            .map(to_approval)
            .collect::<Vec<_>>();
        let counted = counted_approvals(&given, verdict.as_ref());
        let need = approvals_needed(wave_row.approvals_required);
        if u32::try_from(counted.len()).unwrap_or(u32::MAX) >= need {
            let names: Vec<&str> = counted.iter().map(|a| a.approver.as_str()).collect();
            return Err(DbError::Conflict {
                what: "wave",
                key: wave_row.name.clone(),
                reason: format!(
                    "the wave already has the {need} approval(s) it needs ({}); it is promoted on the next engine pass",
                    names.join(", ")
                ),
            });
        }
        let inserted = wave_approvals::ActiveModel {
            wave_id: Set(wave.0),
            approver: Set(approver.to_owned()),
            comment: Set(comment.map(str::to_owned)),
            approved_at: Set(now),
            wave_state: Set(Some(state.as_str().to_owned())),
            verdict_outcome: Set(verdict.as_ref().map(|v| v.outcome.as_str().to_owned())),
            ..Default::default()
        }
        .insert(&txn)
        .await;
        match inserted {
            Ok(_) => {}
            Err(err) if is_unique_violation(&err) => {
                return Err(DbError::AlreadyExists {
                    what: "approval",
                    key: format!("wave {wave} by {approver}"),
                });
            }
            Err(err) => return Err(err.into()),
        }
        audit::append(
            &txn,
            now,
            approver,
            "wave.approve",
            "wave",
            &wave.to_string(),
            json!({
                "rollout_id": wave_row.rollout_id,
                "wave": wave_row.name,
                "comment": comment,
                "verdict": verdict.as_ref().map(|v| v.outcome),
            }),
        )
        .await?;
        txn.commit().await?;
        self.wave_approvals(wave).await
    }

    /// Approvals of a wave, oldest first.
    pub async fn wave_approvals(&self, wave: WaveId) -> Result<Vec<Approval>, DbError> {
        Ok(wave_approvals::Entity::find()
            .filter(wave_approvals::Column::WaveId.eq(wave.0))
            .order_by_asc(wave_approvals::Column::Id)
            .all(&self.reader)
            .await?
            .into_iter()
            .map(to_approval)
            .collect())
    }
}

fn to_approval(row: wave_approvals::Model) -> Approval {
    Approval {
        wave_id: WaveId(row.wave_id),
        approver: row.approver,
        comment: row.comment,
        approved_at: row.approved_at,
        // An unreadable stored state makes the approval count for nothing
        // rather than fail every read of the wave.
        wave_state: row.wave_state.as_deref().and_then(|s| s.parse().ok()),
        verdict_outcome: row.verdict_outcome.as_deref().and_then(|s| s.parse().ok()),
    }
}
