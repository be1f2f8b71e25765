//! Stored per-node steps: reads, placement for caps, fenced transitions.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use orchestrator_types::{NodeId, RolloutId, StepId, WaveId};
use sea_orm::{ColumnTrait, EntityTrait, JoinType, QueryFilter, QueryOrder, QuerySelect, Select, Set};
use serde::{Deserialize, Serialize};

use super::{StepPurpose, StepState, from_json, parse, set_opt, to_json};
use crate::entity::{node_components, nodes, update_steps, waves};
use crate::model::NodeAddress;
use crate::{Db, DbError};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// One component a step flashes, as found at precheck.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct StepTarget {
    /// FirmwareInventory id.
    pub inventory_id: String,
    /// Its `@odata.id`, which the push's `Targets` names.
    pub uri: String,
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

/// A step as the health collector watches it: when its node's exposure starts, and where to poll.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchedStep {
    pub step_id: StepId,
    pub finished_at: Option<DateTime<Utc>>,
    pub node: NodeAddress,
}

/// A step as the fleet-scale judge places it: its node, wave and state, and when it finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepOutline {
    pub id: StepId,
    pub node_id: NodeId,
    pub wave_id: WaveId,
    pub state: StepState,
    pub finished_at: Option<DateTime<Utc>>,
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

/// Which steps to list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepFilter {
    pub rollout_id: Option<RolloutId>,
    pub wave_id: Option<WaveId>,
    pub node_id: Option<NodeId>,
    pub state: Option<StepState>,
    pub purpose: Option<StepPurpose>,
}

/// Step counts by state.
pub type StepCounts = BTreeMap<StepState, u64>;

/// Most steps one page returns.
pub const MAX_STEP_PAGE_ROWS: u64 = 1000;

/// Which steps one page lists: the filters of [`StepFilter`], a substring
/// of the node's name, and the page. Every filter is applied by the query,
/// so a page of a 5,000-node rollout reads one page of rows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepPageQuery {
    pub filter: StepFilter,
    /// Substring of the node's name.
    pub node_name_contains: Option<String>,
    pub offset: u64,
    /// Rows wanted, 1 to [`MAX_STEP_PAGE_ROWS`].
    pub limit: u64,
}

/// A step with its node's name, for tables that show names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamedStep {
    #[serde(flatten)]
    pub step: ExecStep,
    pub node_name: String,
}

/// What changes whenever any step of a rollout changes: its counts by
/// state and its latest update. A live view compares two of these to know
/// whether its node table is stale without reading the steps.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StepRevision {
    pub counts: StepCounts,
    pub last_update: Option<DateTime<Utc>>,
}

pub(super) fn to_exec_step(row: update_steps::Model) -> Result<ExecStep, DbError> {
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

/// The steps a filter selects, for a list or a count.
pub(super) fn filtered(filter: &StepFilter) -> Select<update_steps::Entity> {
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
}

impl Db {
    /// Steps matching the filter, by id.
    pub async fn steps(&self, filter: &StepFilter) -> Result<Vec<ExecStep>, DbError> {
        filtered(filter)
            .order_by_asc(update_steps::Column::Id)
            .all(&self.reader)
            .await?
            .into_iter()
            .map(to_exec_step)
            .collect()
    }

    /// The steps matching the filter with their nodes' addresses, by id: what a health poll round
    /// reads. A round over a 100,000-node wave reads only these columns, not every step's and node's
    /// whole row (about a kilobyte each, parsed JSON included) once per poll.
    pub async fn watched_steps(&self, filter: &StepFilter) -> Result<Vec<WatchedStep>, DbError> {
        type Row = (i64, Option<DateTime<Utc>>, i64, String, String, String);
        let rows: Vec<Row> = filtered(filter)
            .select_only()
            .column(update_steps::Column::Id)
            .column(update_steps::Column::FinishedAt)
            .column(update_steps::Column::NodeId)
            .column(nodes::Column::Name)
            .column(nodes::Column::BmcUrl)
            .column(nodes::Column::CredentialRef)
            .join(JoinType::InnerJoin, step_node_relation())
            .order_by_asc(update_steps::Column::Id)
            .into_tuple()
            .all(&self.reader)
            .await?;
        Ok(rows
            .into_iter()
            .map(
                |(step_id, finished_at, node_id, name, bmc_url, credential_ref)| WatchedStep {
                    step_id: StepId(step_id),
                    finished_at,
                    node: NodeAddress {
                        id: NodeId(node_id),
                        name,
                        bmc_url,
                        credential_ref,
                    },
                },
            )
            .collect())
    }

    /// The steps matching the filter as [`StepOutline`]s, by id: what the fleet-scale judge reads at
    /// every look, five columns instead of each step's whole row (targets and errors as JSON).
    pub async fn step_outlines(&self, filter: &StepFilter) -> Result<Vec<StepOutline>, DbError> {
        type Row = (i64, i64, i64, String, Option<DateTime<Utc>>);
        let rows: Vec<Row> = filtered(filter)
            .select_only()
            .column(update_steps::Column::Id)
            .column(update_steps::Column::NodeId)
            .column(update_steps::Column::WaveId)
            .column(update_steps::Column::State)
            .column(update_steps::Column::FinishedAt)
            .order_by_asc(update_steps::Column::Id)
            .into_tuple()
            .all(&self.reader)
            .await?;
        rows.into_iter()
            .map(|(id, node_id, wave_id, state, finished_at)| {
                Ok(StepOutline {
                    id: StepId(id),
                    node_id: NodeId(node_id),
                    wave_id: WaveId(wave_id),
                    state: parse("step state", &state)?,
                    finished_at,
                })
            })
            .collect()
    }

    /// The nodes a rollout has touched: every node with a step past pending (in flight, flashed,
    /// failed), each once.
    pub async fn touched_nodes(&self, rollout: RolloutId) -> Result<Vec<NodeId>, DbError> {
        let ids: Vec<i64> = update_steps::Entity::find()
            .select_only()
            .column(update_steps::Column::NodeId)
            .distinct()
            .filter(update_steps::Column::RolloutId.eq(rollout.0))
            .filter(update_steps::Column::State.ne(StepState::Pending.as_str()))
            .into_tuple()
            .all(&self.reader)
            .await?;
        Ok(ids.into_iter().map(NodeId).collect())
    }

    /// One step.
    pub async fn step(&self, id: StepId) -> Result<ExecStep, DbError> {
        let row = update_steps::Entity::find_by_id(id.0)
            .one(&self.reader)
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
        let terminal: Vec<&str> = StepState::ALL
            .iter()
            .filter(|s| s.is_terminal())
            .map(|s| s.as_str())
            .collect();
        placed(
            update_steps::Entity::find()
                .filter(update_steps::Column::State.is_not_in(terminal))
                .join(JoinType::LeftJoin, step_node_relation())
                .select_also(nodes::Entity)
                .all(&self.reader)
                .await?,
        )
    }

    /// What one executor pass works from: every step in flight (all of
    /// them: the caps count them) and, of each running wave, its first
    /// `pending_per_wave` pending steps by id (the ones admission can
    /// reach this pass), by step id. Pending steps of waves that are not
    /// running cannot be admitted, and a wave admits at most its caps a
    /// pass, so reading all of a 100,000-step wave's pending rows every
    /// pass (as [`Db::open_steps`] does) costs without changing anything.
    pub async fn open_steps_for_pass(&self, pending_per_wave: u64) -> Result<Vec<PlacedStep>, DbError> {
        let not_in_flight: Vec<&str> = StepState::ALL
            .iter()
            .filter(|s| !s.is_in_flight())
            .map(|s| s.as_str())
            .collect();
        let mut open = placed(
            update_steps::Entity::find()
                .filter(update_steps::Column::State.is_not_in(not_in_flight))
                .join(JoinType::LeftJoin, step_node_relation())
                .select_also(nodes::Entity)
                .all(&self.reader)
                .await?,
        )?;
        let running: Vec<i64> = waves::Entity::find()
            .select_only()
            .column(waves::Column::Id)
            .filter(waves::Column::State.eq(orchestrator_types::WaveState::Running.as_str()))
            .into_tuple()
            .all(&self.reader)
            .await?;
        for wave in running {
            open.extend(placed(
                update_steps::Entity::find()
                    .filter(update_steps::Column::WaveId.eq(wave))
                    .filter(update_steps::Column::State.eq(StepState::Pending.as_str()))
                    .order_by_asc(update_steps::Column::Id)
                    .limit(pending_per_wave.max(1))
                    .join(JoinType::LeftJoin, step_node_relation())
                    .select_also(nodes::Entity)
                    .all(&self.reader)
                    .await?,
            )?);
        }
        open.sort_by_key(|p| p.step.id.0);
        Ok(open)
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
        let rows: Vec<(String, i64)> = query.into_tuple().all(&self.reader).await?;
        let mut counts = StepCounts::new();
        for (state, n) in rows {
            counts.insert(parse("step state", &state)?, u64::try_from(n).unwrap_or(0));
        }
        Ok(counts)
    }

    /// One page of steps by id, each with its node's name (one query).
    pub async fn step_page(&self, query: &StepPageQuery) -> Result<Vec<NamedStep>, DbError> {
        let filter = &query.filter;
        let mut select = update_steps::Entity::find();
        if let Some(id) = filter.rollout_id {
            select = select.filter(update_steps::Column::RolloutId.eq(id.0));
        }
        if let Some(id) = filter.wave_id {
            select = select.filter(update_steps::Column::WaveId.eq(id.0));
        }
        if let Some(id) = filter.node_id {
            select = select.filter(update_steps::Column::NodeId.eq(id.0));
        }
        if let Some(state) = filter.state {
            select = select.filter(update_steps::Column::State.eq(state.as_str()));
        }
        if let Some(purpose) = filter.purpose {
            select = select.filter(update_steps::Column::Purpose.eq(purpose.as_str()));
        }
        let mut select = select
            .join(JoinType::InnerJoin, step_node_relation())
            .select_also(nodes::Entity);
        if let Some(fragment) = &query.node_name_contains {
            select = select.filter(nodes::Column::Name.contains(fragment.as_str()));
        }
        select
            .order_by_asc(update_steps::Column::Id)
            .offset(query.offset)
            .limit(query.limit.clamp(1, MAX_STEP_PAGE_ROWS))
            .all(&self.reader)
            .await?
            .into_iter()
            .map(|(step, node)| {
                let node = node.ok_or_else(|| DbError::corrupt("step", format!("step {} has no node", step.id)))?;
                Ok(NamedStep {
                    step: to_exec_step(step)?,
                    node_name: node.name,
                })
            })
            .collect()
    }

    /// The rollout's [`StepRevision`]: two small queries, no step read.
    pub async fn step_revision(&self, rollout: RolloutId) -> Result<StepRevision, DbError> {
        let counts = self.step_counts(rollout, None).await?;
        let last_update: Option<DateTime<Utc>> = update_steps::Entity::find()
            .select_only()
            .column(update_steps::Column::UpdatedAt)
            .filter(update_steps::Column::RolloutId.eq(rollout.0))
            .order_by_desc(update_steps::Column::UpdatedAt)
            .limit(1)
            .into_tuple()
            .one(&self.reader)
            .await?;
        Ok(StepRevision { counts, last_update })
    }

    /// GPUs per node (from the last inventory read; a node with none known
    /// counts as one), for the cap on capacity out of service. Nodes
    /// without a GPU component are weighed as one so a cluster of unknown
    /// shape is still capped by node.
    pub async fn gpu_weights(&self) -> Result<std::collections::HashMap<i64, u64>, DbError> {
        let ids: Vec<i64> = nodes::Entity::find()
            .select_only()
            .column(nodes::Column::Id)
            .into_tuple()
            .all(&self.reader)
            .await?;
        let gpus: Vec<(i64, i64)> = node_components::Entity::find()
            .select_only()
            .column(node_components::Column::NodeId)
            .column_as(node_components::Column::Id.count(), "n")
            .filter(node_components::Column::Kind.eq(orchestrator_types::ComponentKind::Gpu.as_str()))
            .group_by(node_components::Column::NodeId)
            .into_tuple()
            .all(&self.reader)
            .await?;
        let mut weights: std::collections::HashMap<i64, u64> = ids.into_iter().map(|id| (id, 1)).collect();
        for (node, n) in gpus {
            weights.insert(node, u64::try_from(n).unwrap_or(1).max(1));
        }
        Ok(weights)
    }

    /// Every node's cluster, for summing capacity per cluster.
    pub async fn node_clusters(&self) -> Result<std::collections::HashMap<i64, String>, DbError> {
        let rows: Vec<(i64, String)> = nodes::Entity::find()
            .select_only()
            .column(nodes::Column::Id)
            .column(nodes::Column::Cluster)
            .into_tuple()
            .all(&self.reader)
            .await?;
        Ok(rows.into_iter().collect())
    }

    /// Number of nodes per cluster, for the per-cluster percentage cap.
    pub async fn cluster_sizes(&self) -> Result<BTreeMap<String, u64>, DbError> {
        let rows: Vec<(String, i64)> = nodes::Entity::find()
            .select_only()
            .column(nodes::Column::Cluster)
            .column_as(nodes::Column::Id.count(), "n")
            .group_by(nodes::Column::Cluster)
            .into_tuple()
            .all(&self.reader)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(cluster, n)| (cluster, u64::try_from(n).unwrap_or(0)))
            .collect())
    }
}

/// The columns a transition from `from` sets at `now`: the change's fields,
/// the state (and when it was entered) when it moves, and `updated_at`.
pub(super) fn step_update(from: StepState, change: &StepChange, now: DateTime<Utc>) -> update_steps::ActiveModel {
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
    active
}

/// Steps joined with their nodes, as [`PlacedStep`]s.
fn placed(rows: Vec<(update_steps::Model, Option<nodes::Model>)>) -> Result<Vec<PlacedStep>, DbError> {
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

fn step_node_relation() -> sea_orm::RelationDef {
    // The entities declare no relations; steps and nodes are joined here only.
    update_steps::Entity::belongs_to(nodes::Entity)
        .from(update_steps::Column::NodeId)
        .to(nodes::Column::Id)
        .into()
}
