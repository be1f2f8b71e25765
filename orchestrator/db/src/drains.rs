//! Waveguard's durable record of the drains it made through nodes'
//! workload schedulers: the proof of ownership the engine resumes by, and
//! the intent written before each scheduler effect.
//!
//! Invariants: every write carries the executor's [`Fence`] (like a step's);
//! a phase moves only from the phase the engine read (`Stale` otherwise);
//! at most one record that is not closed exists per node (a partial unique
//! index), so two rollouts can never both own one node's drain; every
//! transition has its audit entry (`scheduler.drain`, subject the node).

use chrono::{DateTime, Utc};
use orchestrator_types::{DrainPhase, NodeId, RolloutId, StepId, WaveId};
use sea_orm::sea_query::SimpleExpr;
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, Order, QueryFilter, QueryOrder, Set, TransactionTrait};
use serde::Serialize;

use crate::entity::{nodes, scheduler_drains};
use crate::execution::{ENGINE_ACTOR, Fence, check_fence};
use crate::{Db, DbError, audit};

/// One drain, as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DrainRow {
    pub id: i64,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub rollout_id: RolloutId,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub wave_id: WaveId,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub step_id: StepId,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub node_id: NodeId,
    /// `slurm`, `command`.
    pub scheduler_kind: String,
    /// The name the scheduler knows the node by.
    pub scheduler_node: String,
    pub phase: DrainPhase,
    /// The reason tag written with the drain.
    pub reason_text: String,
    /// The scheduler's state read just before draining.
    pub observed_before: Option<serde_json::Value>,
    /// The last state read and what the node waits on (for pages).
    pub last_seen: Option<serde_json::Value>,
    pub drain_started_at: DateTime<Utc>,
    pub held_at: Option<DateTime<Utc>>,
    pub resume_intended_at: Option<DateTime<Utc>>,
    pub closed_at: Option<DateTime<Utc>>,
    /// Why it was closed (`resumed`, `taken_over: ...`) or quarantined.
    pub close_reason: Option<String>,
    pub updated_at: DateTime<Utc>,
}

/// The intent to drain one node for one step.
#[derive(Debug, Clone)]
pub struct NewDrain {
    pub rollout_id: RolloutId,
    pub wave_id: WaveId,
    pub step_id: StepId,
    pub node_id: NodeId,
    pub scheduler_kind: String,
    pub scheduler_node: String,
    pub reason_text: String,
    pub observed_before: serde_json::Value,
}

fn to_row(m: scheduler_drains::Model) -> Result<DrainRow, DbError> {
    Ok(DrainRow {
        id: m.id,
        rollout_id: RolloutId(m.rollout_id),
        wave_id: WaveId(m.wave_id),
        step_id: StepId(m.step_id),
        node_id: NodeId(m.node_id),
        scheduler_kind: m.scheduler_kind,
        scheduler_node: m.scheduler_node,
        phase: m
            .phase
            .parse()
            .map_err(|e: String| DbError::corrupt("scheduler drain phase", e))?,
        reason_text: m.reason_text,
        observed_before: m.observed_before,
        last_seen: m.last_seen,
        drain_started_at: m.drain_started_at,
        held_at: m.held_at,
        resume_intended_at: m.resume_intended_at,
        closed_at: m.closed_at,
        close_reason: m.close_reason,
        updated_at: m.updated_at,
    })
}

fn rows(models: Vec<scheduler_drains::Model>) -> Result<Vec<DrainRow>, DbError> {
    models.into_iter().map(to_row).collect()
}

/// The audit subject of a node is its name (what its page and links use).
async fn node_name<C: sea_orm::ConnectionTrait>(conn: &C, node: i64) -> Result<String, DbError> {
    Ok(nodes::Entity::find_by_id(node)
        .one(conn)
        .await?
        .map_or_else(|| node.to_string(), |n| n.name))
}

impl Db {
    /// Records the intent to drain `new.node_id` for `new.step_id`, before
    /// the drain is issued. Idempotent: when the step already has a record
    /// that is not closed, that record is returned unchanged. `Conflict`
    /// when the node has a record of another step that is not closed
    /// (another rollout owns its drain, or a quarantine waits for a human).
    pub async fn record_drain_intent(&self, fence: &Fence, new: &NewDrain) -> Result<DrainRow, DbError> {
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        check_fence(&txn, fence).await?;
        let existing = scheduler_drains::Entity::find()
            .filter(scheduler_drains::Column::NodeId.eq(new.node_id.0))
            .filter(scheduler_drains::Column::Phase.ne(DrainPhase::Closed.as_str()))
            .one(&txn)
            .await?;
        if let Some(existing) = existing {
            if existing.step_id == new.step_id.0 {
                return to_row(existing);
            }
            return Err(DbError::Conflict {
                what: "node",
                key: new.node_id.to_string(),
                reason: format!(
                    "its scheduler drain is owned by rollout {} (step {}, {})",
                    existing.rollout_id, existing.step_id, existing.phase
                ),
            });
        }
        let inserted = scheduler_drains::ActiveModel {
            rollout_id: Set(new.rollout_id.0),
            wave_id: Set(new.wave_id.0),
            step_id: Set(new.step_id.0),
            node_id: Set(new.node_id.0),
            scheduler_kind: Set(new.scheduler_kind.clone()),
            scheduler_node: Set(new.scheduler_node.clone()),
            phase: Set(DrainPhase::DrainIntended.as_str().to_owned()),
            reason_text: Set(new.reason_text.clone()),
            observed_before: Set(Some(new.observed_before.clone())),
            last_seen: Set(Some(new.observed_before.clone())),
            drain_started_at: Set(now),
            updated_at: Set(now),
            ..Default::default()
        }
        .insert(&txn)
        .await?;
        audit::append(
            &txn,
            now,
            ENGINE_ACTOR,
            "scheduler.drain",
            "node",
            &node_name(&txn, new.node_id.0).await?,
            serde_json::json!({
                "drain_id": inserted.id,
                "rollout_id": new.rollout_id,
                "step_id": new.step_id,
                "scheduler": new.scheduler_kind,
                "scheduler_node": new.scheduler_node,
                "to": DrainPhase::DrainIntended,
                "reason_tag": new.reason_text,
            }),
        )
        .await?;
        txn.commit().await?;
        to_row(inserted)
    }

    /// Moves drain `id` from `from` to `to` (conditional on `from`: `Stale`
    /// when it moved already), stamping the phase's time; `note` is the
    /// close or quarantine reason. Audited.
    pub async fn move_drain(
        &self,
        fence: &Fence,
        id: i64,
        from: DrainPhase,
        to: DrainPhase,
        note: Option<&str>,
    ) -> Result<DrainRow, DbError> {
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        check_fence(&txn, fence).await?;
        let mut active = scheduler_drains::ActiveModel {
            phase: Set(to.as_str().to_owned()),
            updated_at: Set(now),
            ..Default::default()
        };
        match to {
            DrainPhase::Held => active.held_at = Set(Some(now)),
            DrainPhase::ResumeIntended => active.resume_intended_at = Set(Some(now)),
            DrainPhase::Closed => active.closed_at = Set(Some(now)),
            DrainPhase::DrainIntended | DrainPhase::Quarantined => {}
        }
        if let Some(note) = note {
            active.close_reason = Set(Some(note.to_owned()));
        }
        let result = scheduler_drains::Entity::update_many()
            .set(active)
            .filter(scheduler_drains::Column::Id.eq(id))
            .filter(scheduler_drains::Column::Phase.eq(from.as_str()))
            .exec(&txn)
            .await?;
        if result.rows_affected != 1 {
            return Err(DbError::Stale {
                what: "scheduler drain",
                key: id.to_string(),
                expected: from.to_string(),
            });
        }
        let row = scheduler_drains::Entity::find_by_id(id)
            .one(&txn)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "scheduler drain",
                key: id.to_string(),
            })?;
        audit::append(
            &txn,
            now,
            ENGINE_ACTOR,
            "scheduler.drain",
            "node",
            &node_name(&txn, row.node_id).await?,
            serde_json::json!({
                "drain_id": id,
                "rollout_id": row.rollout_id,
                "step_id": row.step_id,
                "scheduler_node": row.scheduler_node,
                "from": from,
                "to": to,
                "reason": note,
            }),
        )
        .await?;
        txn.commit().await?;
        to_row(row)
    }

    /// Stores the last scheduler state read for drain `id` (for pages; no
    /// audit entry: it is an observation, not a decision).
    pub async fn set_drain_seen(&self, fence: &Fence, id: i64, seen: serde_json::Value) -> Result<(), DbError> {
        let txn = self.writer.begin().await?;
        check_fence(&txn, fence).await?;
        scheduler_drains::Entity::update_many()
            .set(scheduler_drains::ActiveModel {
                last_seen: Set(Some(seen)),
                ..Default::default()
            })
            .filter(scheduler_drains::Column::Id.eq(id))
            .exec(&txn)
            .await?;
        txn.commit().await?;
        Ok(())
    }

    /// Every drain that is not closed (quarantined included), oldest first.
    pub async fn open_drains(&self) -> Result<Vec<DrainRow>, DbError> {
        self.drains_where(
            scheduler_drains::Column::Phase.ne(DrainPhase::Closed.as_str()),
            Order::Asc,
        )
        .await
    }

    /// Every drain a rollout made, oldest first.
    pub async fn rollout_drains(&self, rollout: RolloutId) -> Result<Vec<DrainRow>, DbError> {
        self.drains_where(scheduler_drains::Column::RolloutId.eq(rollout.0), Order::Asc)
            .await
    }

    /// A node's drains, newest first.
    pub async fn node_drains(&self, node: NodeId) -> Result<Vec<DrainRow>, DbError> {
        self.drains_where(scheduler_drains::Column::NodeId.eq(node.0), Order::Desc)
            .await
    }

    async fn drains_where(&self, condition: SimpleExpr, order: Order) -> Result<Vec<DrainRow>, DbError> {
        rows(
            scheduler_drains::Entity::find()
                .filter(condition)
                .order_by(scheduler_drains::Column::Id, order)
                .all(&self.reader)
                .await?,
        )
    }
}
