//! The rollout engine's durable state: stored plans (waves and per-node
//! steps), step and wave transitions, approvals, user commands (pause,
//! resume, abort, rollback) and the executor lease.
//!
//! Invariant: every write of execution state made by the engine passes a
//! [`Fence`]; the write and a check that the fence's token is still the
//! lease's happen in one transaction, and the check locks the lease row
//! (an `UPDATE` of it), so a controller that lost its lease can never write
//! again, even if it does not know yet. Step transitions are conditional on
//! the state the engine read (`WHERE state = from`), so two writers can
//! never both move one step.

use std::collections::BTreeMap;
use std::str::FromStr;

use chrono::{DateTime, Duration, Utc};
pub use orchestrator_types::{Blocker, RolloutState, StepPurpose, StepState, WaveKind, WaveState};
use orchestrator_types::{NodeId, Outcome, ReleaseId, RolloutId, StepId, WaveId, WaveVerdict};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ActiveModelTrait, ActiveValue, ColumnTrait, ConnectionTrait, EntityTrait, JoinType, QueryFilter, QueryOrder,
    QuerySelect, Set, TransactionTrait,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::audit;
use crate::entity::{engine_leases, nodes, releases, rollouts, update_steps, wave_approvals, waves};
use crate::error::is_unique_violation;
use crate::model::NewRollout;
use crate::{Db, DbError};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// The lease a controller must hold to execute, and the token that proves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// Lease name (one per engine role, e.g. `executor`).
    pub lease: String,
    /// Who holds it (process identity, for humans).
    pub holder: String,
    /// Increases by one on every takeover.
    pub token: i64,
    /// When the lease expires unless renewed, per the clock of the holder.
    pub expires_at: DateTime<Utc>,
}

/// One component a step flashes, as found at precheck.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct StepTarget {
    /// FirmwareInventory id.
    pub inventory_id: String,
    /// Its `@odata.id`, which the push's `Targets` names.
    pub uri: String,
}

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
}

/// A plan to store with a new rollout; never edited afterwards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewPlan {
    pub waves: Vec<NewWave>,
    /// The planner's judgement of whether the rollout can be undone.
    pub rollback_assessment: serde_json::Value,
}

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

fn rollback_impossible(assessment: &serde_json::Value) -> Option<Vec<String>> {
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
}

/// A stored step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ExecStep {
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub id: StepId,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub rollout_id: RolloutId,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub wave_id: WaveId,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub node_id: NodeId,
    pub inventory_id: String,
    pub purpose: StepPurpose,
    pub expected_from_version: String,
    pub target_version: String,
    pub image_uri: String,
    pub image_sha256: String,
    pub state: StepState,
    pub task_uri: Option<String>,
    pub attempts: i32,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
    pub targets: Vec<StepTarget>,
    /// Task URIs the BMC listed just before the push (to recognise ours after a crash).
    pub known_tasks: Option<Vec<String>>,
    /// The version the node ran before this step flashed it (what a rollback restores).
    pub previous_version: Option<String>,
    pub push_started_at: Option<DateTime<Utc>>,
    pub reset_issued_at: Option<DateTime<Utc>>,
    pub unreachable_since: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<i64>))]
    pub rollback_of: Option<StepId>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// When the step entered its current state: its deadline runs from here.
    /// Steps stored before this was kept fall back to their last update.
    pub state_entered_at: DateTime<Utc>,
}

/// A step with where its node sits, for concurrency caps.
#[derive(Debug, Clone, PartialEq)]
pub struct PlacedStep {
    pub step: ExecStep,
    pub node_name: String,
    pub bmc_url: String,
    pub credential_ref: String,
    pub rack: String,
    pub nvlink_domain: String,
    pub cluster: String,
}

/// A change to a step; `None` fields are left alone.
#[derive(Debug, Clone, Default)]
pub struct StepChange {
    pub state: Option<StepState>,
    pub task_uri: Option<Option<String>>,
    pub attempts: Option<i32>,
    pub next_attempt_at: Option<Option<DateTime<Utc>>>,
    pub error: Option<Option<String>>,
    pub targets: Option<Vec<StepTarget>>,
    pub known_tasks: Option<Option<Vec<String>>>,
    pub previous_version: Option<String>,
    pub push_started_at: Option<Option<DateTime<Utc>>>,
    pub reset_issued_at: Option<Option<DateTime<Utc>>>,
    pub unreachable_since: Option<Option<DateTime<Utc>>>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
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

/// Which steps to list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepFilter {
    pub rollout_id: Option<RolloutId>,
    pub wave_id: Option<WaveId>,
    pub node_id: Option<NodeId>,
    pub state: Option<StepState>,
    pub purpose: Option<StepPurpose>,
}

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

/// Step counts by state.
pub type StepCounts = BTreeMap<StepState, u64>;

fn parse<T: FromStr<Err = String>>(what: &'static str, raw: &str) -> Result<T, DbError> {
    raw.parse().map_err(|e: String| DbError::corrupt(what, e))
}

fn from_json<T: serde::de::DeserializeOwned + Default>(
    what: &'static str,
    value: Option<serde_json::Value>,
) -> Result<T, DbError> {
    match value {
        None | Some(serde_json::Value::Null) => Ok(T::default()),
        Some(v) => serde_json::from_value(v).map_err(|e| DbError::corrupt(what, e)),
    }
}

fn to_json<T: Serialize>(value: &T) -> serde_json::Value {
    // Our own plain records always serialize.
    serde_json::to_value(value).unwrap_or(serde_json::Value::Null)
}

fn to_exec_rollout(row: rollouts::Model) -> Result<ExecRollout, DbError> {
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

fn to_exec_wave(row: waves::Model) -> Result<ExecWave, DbError> {
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
    })
}

fn to_exec_step(row: update_steps::Model) -> Result<ExecStep, DbError> {
    Ok(ExecStep {
        id: StepId(row.id),
        rollout_id: RolloutId(row.rollout_id),
        wave_id: WaveId(row.wave_id),
        node_id: NodeId(row.node_id),
        purpose: parse("step purpose", &row.purpose)?,
        state: parse("step state", &row.state)?,
        targets: from_json("step targets", row.targets)?,
        known_tasks: match row.known_tasks {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => Some(serde_json::from_value(v).map_err(|e| DbError::corrupt("step known tasks", e))?),
        },
        inventory_id: row.inventory_id,
        expected_from_version: row.expected_from_version,
        target_version: row.target_version,
        image_uri: row.image_uri,
        image_sha256: row.image_sha256,
        task_uri: row.task_uri,
        attempts: row.attempts,
        next_attempt_at: row.next_attempt_at,
        error: row.error,
        previous_version: row.previous_version,
        push_started_at: row.push_started_at,
        reset_issued_at: row.reset_issued_at,
        unreachable_since: row.unreachable_since,
        started_at: row.started_at,
        finished_at: row.finished_at,
        rollback_of: row.rollback_of.map(StepId),
        state_entered_at: row.state_entered_at.unwrap_or(row.updated_at),
        created_at: row.created_at,
        updated_at: row.updated_at,
    })
}

/// Checks, inside the caller's transaction, that `fence` still holds its
/// lease, and locks the lease row until the transaction ends so a takeover
/// waits for this write (PostgreSQL row lock; SQLite's single writer).
async fn check_fence<C: ConnectionTrait>(conn: &C, fence: &Fence) -> Result<(), DbError> {
    let result = engine_leases::Entity::update_many()
        .col_expr(engine_leases::Column::Token, Expr::col(engine_leases::Column::Token))
        .filter(engine_leases::Column::Name.eq(fence.lease.as_str()))
        .filter(engine_leases::Column::Holder.eq(fence.holder.as_str()))
        .filter(engine_leases::Column::Token.eq(fence.token))
        .exec(conn)
        .await?;
    if result.rows_affected == 1 {
        Ok(())
    } else {
        Err(DbError::Fenced {
            lease: fence.lease.clone(),
            token: fence.token,
        })
    }
}

/// The actor recorded for engine decisions.
pub const ENGINE_ACTOR: &str = "engine";

impl Db {
    // ----------------------------------------------------------------- lease

    /// Takes the lease when it is free or expired (a new, higher token), or
    /// renews it when `holder` already has it (same token). `None` when
    /// someone else holds an unexpired lease.
    pub async fn acquire_lease(&self, lease: &str, holder: &str, ttl: Duration) -> Result<Option<Fence>, DbError> {
        let now = self.clock.now();
        let expires_at = now + ttl;
        let txn = self.conn.begin().await?;
        let current = engine_leases::Entity::find_by_id(lease.to_owned()).one(&txn).await?;
        let fence = match current {
            None => {
                let inserted = engine_leases::ActiveModel {
                    name: Set(lease.to_owned()),
                    holder: Set(holder.to_owned()),
                    token: Set(1),
                    expires_at: Set(expires_at),
                    acquired_at: Set(now),
                }
                .insert(&txn)
                .await;
                match inserted {
                    Ok(_) => Some(1),
                    // Another controller created it first; try again next time.
                    Err(err) if is_unique_violation(&err) => None,
                    Err(err) => return Err(err.into()),
                }
            }
            Some(row) if row.holder == holder && row.expires_at > now => {
                let result = engine_leases::Entity::update_many()
                    .col_expr(engine_leases::Column::ExpiresAt, Expr::value(expires_at))
                    .filter(engine_leases::Column::Name.eq(lease))
                    .filter(engine_leases::Column::Holder.eq(holder))
                    .filter(engine_leases::Column::Token.eq(row.token))
                    .exec(&txn)
                    .await?;
                (result.rows_affected == 1).then_some(row.token)
            }
            Some(row) if row.expires_at <= now => {
                // Conditional on the token read, so two takers cannot both win.
                let token = row.token + 1;
                let result = engine_leases::Entity::update_many()
                    .col_expr(engine_leases::Column::Holder, Expr::value(holder))
                    .col_expr(engine_leases::Column::Token, Expr::value(token))
                    .col_expr(engine_leases::Column::ExpiresAt, Expr::value(expires_at))
                    .col_expr(engine_leases::Column::AcquiredAt, Expr::value(now))
                    .filter(engine_leases::Column::Name.eq(lease))
                    .filter(engine_leases::Column::Token.eq(row.token))
                    .exec(&txn)
                    .await?;
                if result.rows_affected == 1 {
                    audit::append(
                        &txn,
                        now,
                        holder,
                        "lease.takeover",
                        "lease",
                        lease,
                        json!({ "token": token, "previous_holder": row.holder }),
                    )
                    .await?;
                    Some(token)
                } else {
                    None
                }
            }
            Some(_) => None,
        };
        txn.commit().await?;
        Ok(fence.map(|token| Fence {
            lease: lease.to_owned(),
            holder: holder.to_owned(),
            token,
            expires_at,
        }))
    }

    /// Gives the lease up (expires it now) so a standby takes over at once.
    pub async fn release_lease(&self, fence: &Fence) -> Result<(), DbError> {
        let now = self.clock.now();
        engine_leases::Entity::update_many()
            .col_expr(engine_leases::Column::ExpiresAt, Expr::value(now))
            .filter(engine_leases::Column::Name.eq(fence.lease.as_str()))
            .filter(engine_leases::Column::Holder.eq(fence.holder.as_str()))
            .filter(engine_leases::Column::Token.eq(fence.token))
            .exec(&self.conn)
            .await?;
        Ok(())
    }

    /// Who holds a lease now, if anyone ever did: (holder, token, expires_at).
    pub async fn lease_holder(&self, lease: &str) -> Result<Option<(String, i64, DateTime<Utc>)>, DbError> {
        Ok(engine_leases::Entity::find_by_id(lease.to_owned())
            .one(&self.conn)
            .await?
            .map(|row| (row.holder, row.token, row.expires_at)))
    }

    // ------------------------------------------------------------ the plan

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
        let txn = self.conn.begin().await?;
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
        to_exec_rollout(rollout)
    }

    /// One rollout with its execution fields.
    pub async fn exec_rollout(&self, id: RolloutId) -> Result<ExecRollout, DbError> {
        let row = rollouts::Entity::find_by_id(id.0)
            .one(&self.conn)
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
            .all(&self.conn)
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
            .all(&self.conn)
            .await?
            .into_iter()
            .map(to_exec_rollout)
            .collect()
    }

    /// A rollout's waves in order (rollback waves last).
    pub async fn rollout_waves(&self, id: RolloutId) -> Result<Vec<ExecWave>, DbError> {
        waves::Entity::find()
            .filter(waves::Column::RolloutId.eq(id.0))
            .order_by_asc(waves::Column::Position)
            .all(&self.conn)
            .await?
            .into_iter()
            .map(to_exec_wave)
            .collect()
    }

    /// One wave.
    pub async fn wave(&self, id: WaveId) -> Result<ExecWave, DbError> {
        let row = waves::Entity::find_by_id(id.0)
            .one(&self.conn)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "wave",
                key: id.to_string(),
            })?;
        to_exec_wave(row)
    }

    /// Steps matching the filter, by id.
    pub async fn steps(&self, filter: &StepFilter) -> Result<Vec<ExecStep>, DbError> {
        let mut query = update_steps::Entity::find();
        if let Some(id) = filter.rollout_id {
            query = query.filter(update_steps::Column::RolloutId.eq(id.0));
        }
        if let Some(id) = filter.wave_id {
            query = query.filter(update_steps::Column::WaveId.eq(id.0));
        }
        if let Some(id) = filter.node_id {
            query = query.filter(update_steps::Column::NodeId.eq(id.0));
        }
        if let Some(state) = filter.state {
            query = query.filter(update_steps::Column::State.eq(state.as_str()));
        }
        if let Some(purpose) = filter.purpose {
            query = query.filter(update_steps::Column::Purpose.eq(purpose.as_str()));
        }
        query
            .order_by_asc(update_steps::Column::Id)
            .all(&self.conn)
            .await?
            .into_iter()
            .map(to_exec_step)
            .collect()
    }

    /// One step.
    pub async fn step(&self, id: StepId) -> Result<ExecStep, DbError> {
        let row = update_steps::Entity::find_by_id(id.0)
            .one(&self.conn)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "step",
                key: id.to_string(),
            })?;
        to_exec_step(row)
    }

    /// Every step not yet terminal across all rollouts (pending included),
    /// with its node's placement: what caps are computed from.
    pub async fn open_steps(&self) -> Result<Vec<PlacedStep>, DbError> {
        let terminal = [
            StepState::Succeeded.as_str(),
            StepState::Failed.as_str(),
            StepState::Skipped.as_str(),
        ];
        let rows = update_steps::Entity::find()
            .filter(update_steps::Column::State.is_not_in(terminal))
            .join(JoinType::LeftJoin, step_node_relation())
            .select_also(nodes::Entity)
            .all(&self.conn)
            .await?;
        rows.into_iter()
            .map(|(step, node)| {
                let node = node.ok_or_else(|| DbError::corrupt("step", format!("step {} has no node", step.id)))?;
                Ok(PlacedStep {
                    step: to_exec_step(step)?,
                    node_name: node.name,
                    bmc_url: node.bmc_url,
                    credential_ref: node.credential_ref,
                    rack: node.rack,
                    nvlink_domain: node.nvlink_domain,
                    cluster: node.cluster,
                })
            })
            .collect()
    }

    /// Step counts by state for a rollout, or for one wave.
    pub async fn step_counts(&self, rollout: RolloutId, wave: Option<WaveId>) -> Result<StepCounts, DbError> {
        let mut query = update_steps::Entity::find()
            .select_only()
            .column(update_steps::Column::State)
            .column_as(update_steps::Column::Id.count(), "n")
            .filter(update_steps::Column::RolloutId.eq(rollout.0))
            .group_by(update_steps::Column::State);
        if let Some(wave) = wave {
            query = query.filter(update_steps::Column::WaveId.eq(wave.0));
        }
        let rows: Vec<(String, i64)> = query.into_tuple().all(&self.conn).await?;
        let mut counts = StepCounts::new();
        for (state, n) in rows {
            counts.insert(parse("step state", &state)?, u64::try_from(n).unwrap_or(0));
        }
        Ok(counts)
    }

    /// Number of nodes per cluster, for the per-cluster percentage cap.
    pub async fn cluster_sizes(&self) -> Result<BTreeMap<String, u64>, DbError> {
        let rows: Vec<(String, i64)> = nodes::Entity::find()
            .select_only()
            .column(nodes::Column::Cluster)
            .column_as(nodes::Column::Id.count(), "n")
            .group_by(nodes::Column::Cluster)
            .into_tuple()
            .all(&self.conn)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(cluster, n)| (cluster, u64::try_from(n).unwrap_or(0)))
            .collect())
    }

    // ---------------------------------------------------- fenced transitions

    /// Moves a step that is still in `from`, with its audit entry when the
    /// state changes, under the fence. `Stale` when the step moved already.
    pub async fn transition_step(
        &self,
        fence: &Fence,
        step: StepId,
        from: StepState,
        change: &StepChange,
        details: serde_json::Value,
    ) -> Result<ExecStep, DbError> {
        let now = self.clock.now();
        let txn = self.conn.begin().await?;
        check_fence(&txn, fence).await?;
        let mut active = update_steps::ActiveModel {
            updated_at: Set(now),
            ..Default::default()
        };
        if let Some(state) = change.state.filter(|to| *to != from) {
            active.state = Set(state.as_str().to_owned());
            active.state_entered_at = Set(Some(now));
        }
        set_opt(&mut active.task_uri, &change.task_uri);
        if let Some(attempts) = change.attempts {
            active.attempts = Set(attempts);
        }
        set_opt(&mut active.next_attempt_at, &change.next_attempt_at);
        set_opt(&mut active.error, &change.error);
        if let Some(targets) = &change.targets {
            active.targets = Set(Some(to_json(targets)));
        }
        if let Some(known) = &change.known_tasks {
            active.known_tasks = Set(known.as_ref().map(to_json));
        }
        if let Some(previous) = &change.previous_version {
            active.previous_version = Set(Some(previous.clone()));
        }
        set_opt(&mut active.push_started_at, &change.push_started_at);
        set_opt(&mut active.reset_issued_at, &change.reset_issued_at);
        set_opt(&mut active.unreachable_since, &change.unreachable_since);
        if let Some(at) = change.started_at {
            active.started_at = Set(Some(at));
        }
        if let Some(at) = change.finished_at {
            active.finished_at = Set(Some(at));
        }
        let result = update_steps::Entity::update_many()
            .set(active)
            .filter(update_steps::Column::Id.eq(step.0))
            .filter(update_steps::Column::State.eq(from.as_str()))
            .exec(&txn)
            .await?;
        if result.rows_affected != 1 {
            return Err(DbError::Stale {
                what: "step",
                key: step.to_string(),
                expected: from.to_string(),
            });
        }
        let row = update_steps::Entity::find_by_id(step.0)
            .one(&txn)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "step",
                key: step.to_string(),
            })?;
        let moved = change.state.filter(|to| *to != from);
        // A retry is a decision too (and the evidence of a flaky BMC).
        let retried = matches!(change.next_attempt_at, Some(Some(_)));
        if moved.is_some() || retried {
            let to = moved.unwrap_or(from);
            let mut details = details;
            if let Some(obj) = details.as_object_mut() {
                obj.insert("from".into(), from.as_str().into());
                obj.insert("to".into(), to.as_str().into());
                obj.insert("node_id".into(), row.node_id.into());
                obj.insert("rollout_id".into(), row.rollout_id.into());
                obj.insert("purpose".into(), row.purpose.clone().into());
            }
            audit::append(
                &txn,
                now,
                ENGINE_ACTOR,
                if moved.is_some() {
                    "step.transition"
                } else {
                    "step.retry"
                },
                "step",
                &step.to_string(),
                details,
            )
            .await?;
        }
        txn.commit().await?;
        to_exec_step(row)
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
        let txn = self.conn.begin().await?;
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
        let txn = self.conn.begin().await?;
        check_fence(&txn, fence).await?;
        waves::Entity::update_many()
            .col_expr(waves::Column::Blockers, Expr::value(to_json(&blockers)))
            .filter(waves::Column::Id.eq(wave.0))
            .exec(&txn)
            .await?;
        txn.commit().await?;
        Ok(())
    }

    /// Records what a rollout is waiting on (status only).
    pub async fn set_rollout_blockers(
        &self,
        fence: &Fence,
        rollout: RolloutId,
        blockers: &[Blocker],
    ) -> Result<(), DbError> {
        let txn = self.conn.begin().await?;
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
        let txn = self.conn.begin().await?;
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
        let txn = self.conn.begin().await?;
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
        let txn = self.conn.begin().await?;
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
        to_exec_step(row)
    }

    // ------------------------------------------------------- user commands

    /// Records an approval of a wave. The approver must not be the
    /// rollout's author (two-person rule) and approves a wave once.
    pub async fn approve_wave(
        &self,
        wave: WaveId,
        approver: &str,
        comment: Option<&str>,
    ) -> Result<Vec<Approval>, DbError> {
        let now = self.clock.now();
        let txn = self.conn.begin().await?;
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
            .all(&self.conn)
            .await?
            .into_iter()
            .map(|row| Approval {
                wave_id: WaveId(row.wave_id),
                approver: row.approver,
                comment: row.comment,
                approved_at: row.approved_at,
                // An unreadable stored state makes the approval count for
                // nothing rather than fail every read of the wave.
                wave_state: row.wave_state.as_deref().and_then(|s| s.parse().ok()),
                verdict_outcome: row.verdict_outcome.as_deref().and_then(|s| s.parse().ok()),
            })
            .collect())
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
        let txn = self.conn.begin().await?;
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
            .all(&self.conn)
            .await?
            .into_iter()
            .map(|n| (n.id, n.name))
            .collect();
        let versions = last_known_versions(&steps, &names);
        let txn = self.conn.begin().await?;
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
        Ok((to_exec_rollout(row)?, versions))
    }
}

fn set_opt<T: Clone + Into<sea_orm::Value>>(field: &mut ActiveValue<Option<T>>, value: &Option<Option<T>>)
where
    Option<T>: Into<sea_orm::Value>,
{
    if let Some(v) = value {
        *field = Set(v.clone());
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
                StepState::Pending | StepState::Prechecked => (Some(before), None),
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

/// One conditional move of a rollout's state, by the engine or a user.
#[derive(Debug)]
struct RolloutMove<'a> {
    at: DateTime<Utc>,
    rollout: RolloutId,
    /// The states it may be moved from; anything else is `Stale`.
    from: &'a [RolloutState],
    to: RolloutState,
    reason: Option<&'a str>,
    actor: &'a str,
    /// Audit details; `from`, `to` and `reason` are added.
    details: serde_json::Value,
}

/// The one writer of rollout states, shared by the fenced and user paths.
async fn set_rollout_state<C: ConnectionTrait>(
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

fn step_node_relation() -> sea_orm::RelationDef {
    // The entities declare no relations; steps and nodes are joined here only.
    update_steps::Entity::belongs_to(nodes::Entity)
        .from(update_steps::Column::NodeId)
        .to(nodes::Column::Id)
        .into()
}
