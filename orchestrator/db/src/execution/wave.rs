//! Stored waves: reads, fenced transitions and status.

use chrono::{DateTime, Utc};
use orchestrator_types::{NodeId, RolloutId, WaveId, WaveRole, WaveVerdict};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, Set, TransactionTrait,
};
use serde::{Deserialize, Serialize};

use super::lease::{Fence, check_fence};
use super::{Blocker, ENGINE_ACTOR, WaveKind, WaveState, from_json, parse, set_opt, to_json};
use crate::audit;
use crate::entity::waves;
use crate::{Db, DbError};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// A stored wave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ExecWave {
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub id: WaveId,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub rollout_id: RolloutId,
    pub position: i32,
    pub name: String,
    pub kind: WaveKind,
    pub state: WaveState,
    pub state_reason: Option<String>,
    pub node_count: i32,
    pub bake_seconds: i64,
    pub approvals_required: i32,
    pub max_in_flight: i32,
    pub gates: Vec<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<i64>))]
    pub control_nodes: Vec<NodeId>,
    pub started_at: Option<DateTime<Utc>>,
    pub bake_started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    pub decision: Option<String>,
    /// The health verdict, decoded from the stored column (rows of every
    /// earlier version have this shape).
    pub verdict: Option<WaveVerdict>,
    /// For rollback waves: what is rolled back.
    pub scope: Option<serde_json::Value>,
    pub blockers: Vec<Blocker>,
    /// The wave's part in its rollout's soak (issue 22): the soak wave or the holdback; `None` for
    /// every other wave and for waves stored before soaks existed.
    #[serde(default)]
    pub role: Option<WaveRole>,
}

/// A change to a wave; `None` fields are left alone.
#[derive(Debug, Clone, Default)]
pub struct WaveChange {
    pub state: Option<WaveState>,
    pub state_reason: Option<Option<String>>,
    pub started_at: Option<DateTime<Utc>>,
    pub bake_started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    pub decision: Option<String>,
    pub verdict: Option<WaveVerdict>,
    pub approvals_required: Option<i32>,
}

pub(super) fn to_exec_wave(row: waves::Model) -> Result<ExecWave, DbError> {
    Ok(ExecWave {
        id: WaveId(row.id),
        rollout_id: RolloutId(row.rollout_id),
        kind: parse("wave kind", &row.kind)?,
        state: parse("wave state", &row.state)?,
        gates: from_json("wave gates", row.gates)?,
        control_nodes: from_json("wave control nodes", row.control_nodes)?,
        blockers: from_json("wave blockers", row.blockers)?,
        position: row.position,
        name: row.name,
        state_reason: row.state_reason,
        node_count: row.node_count,
        bake_seconds: row.bake_seconds,
        approvals_required: row.approvals_required,
        max_in_flight: row.max_in_flight,
        started_at: row.started_at,
        bake_started_at: row.bake_started_at,
        ended_at: row.ended_at,
        decision: row.decision,
        verdict: match row.verdict {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => Some(serde_json::from_value(v).map_err(|e| DbError::corrupt("wave verdict", e))?),
        },
        scope: row.scope,
        role: row.role.as_deref().map(|r| parse("wave role", r)).transpose()?,
    })
}

impl Db {
    /// A rollout's waves in order (rollback waves last).
    pub async fn rollout_waves(&self, id: RolloutId) -> Result<Vec<ExecWave>, DbError> {
        waves::Entity::find()
            .filter(waves::Column::RolloutId.eq(id.0))
            .order_by_asc(waves::Column::Position)
            .all(&self.reader)
            .await?
            .into_iter()
            .map(to_exec_wave)
            .collect()
    }

    /// One wave.
    pub async fn wave(&self, id: WaveId) -> Result<ExecWave, DbError> {
        let row = waves::Entity::find_by_id(id.0)
            .one(&self.reader)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "wave",
                key: id.to_string(),
            })?;
        to_exec_wave(row)
    }

    /// Moves a wave that is still in `from`, with its audit entry, under the fence.
    pub async fn transition_wave(
        &self,
        fence: &Fence,
        wave: WaveId,
        from: WaveState,
        change: &WaveChange,
        details: serde_json::Value,
    ) -> Result<ExecWave, DbError> {
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        check_fence(&txn, fence).await?;
        let row = update_wave_row(&txn, wave, from, change).await?;
        if let Some(to) = change.state.filter(|to| *to != from) {
            let mut details = details;
            if let Some(obj) = details.as_object_mut() {
                obj.insert("from".into(), from.as_str().into());
                obj.insert("to".into(), to.as_str().into());
                obj.insert("rollout_id".into(), row.rollout_id.into());
                obj.insert("wave".into(), row.name.clone().into());
            }
            audit::append(
                &txn,
                now,
                ENGINE_ACTOR,
                "wave.transition",
                "wave",
                &wave.to_string(),
                details,
            )
            .await?;
        }
        txn.commit().await?;
        to_exec_wave(row)
    }

    /// Records what a wave is waiting on (status only: no audit entry, and
    /// only written when it changed).
    pub async fn set_wave_blockers(&self, fence: &Fence, wave: WaveId, blockers: &[Blocker]) -> Result<(), DbError> {
        let txn = self.writer.begin().await?;
        check_fence(&txn, fence).await?;
        waves::Entity::update_many()
            .col_expr(waves::Column::Blockers, Expr::value(to_json(&blockers)))
            .filter(waves::Column::Id.eq(wave.0))
            .exec(&txn)
            .await?;
        txn.commit().await?;
        Ok(())
    }
}

async fn update_wave_row<C: ConnectionTrait>(
    conn: &C,
    wave: WaveId,
    from: WaveState,
    change: &WaveChange,
) -> Result<waves::Model, DbError> {
    let mut active = <waves::ActiveModel as Default>::default();
    if let Some(state) = change.state {
        active.state = Set(state.as_str().to_owned());
    }
    set_opt(&mut active.state_reason, &change.state_reason);
    if let Some(at) = change.started_at {
        active.started_at = Set(Some(at));
    }
    if let Some(at) = change.bake_started_at {
        active.bake_started_at = Set(Some(at));
    }
    if let Some(at) = change.ended_at {
        active.ended_at = Set(Some(at));
    }
    if let Some(decision) = &change.decision {
        active.decision = Set(Some(decision.clone()));
    }
    if let Some(verdict) = &change.verdict {
        active.verdict = Set(Some(to_json(verdict)));
    }
    if let Some(n) = change.approvals_required {
        active.approvals_required = Set(n);
    }
    let mut update = waves::Entity::update_many()
        .filter(waves::Column::Id.eq(wave.0))
        .filter(waves::Column::State.eq(from.as_str()));
    if active.is_changed() {
        update = update.set(active);
    } else {
        // Nothing to change but the condition still has to hold.
        update = update.col_expr(waves::Column::State, Expr::col(waves::Column::State));
    }
    let result = update.exec(conn).await?;
    if result.rows_affected != 1 {
        return Err(DbError::Stale {
            what: "wave",
            key: wave.to_string(),
            expected: from.to_string(),
        });
    }
    waves::Entity::find_by_id(wave.0)
        .one(conn)
        .await?
        .ok_or_else(|| DbError::NotFound {
            what: "wave",
            key: wave.to_string(),
        })
}
