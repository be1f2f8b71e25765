//! `/api/v1/rollouts`: start a rollout from a policy, watch its waves, and
//! command it (approve a wave, pause, resume, abort, roll back).
//!
//! Handlers only record intent in the datastore and nudge the engine; the
//! engine's next pass acts on it. Wave paths accept a wave's name or its
//! position (as listed in the rollout detail). `/drains` lists the nodes the
//! rollout drained through their workload scheduler.

use std::collections::BTreeMap;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Duration, Utc};
use orchestrator_db::DbError;
use orchestrator_db::drains::DrainRow;
use orchestrator_db::execution::{
    Approval, ExecRollout, ExecStep, ExecWave, RolloutState, StepFilter, StepPageQuery, StepState, WaveKind,
    total_counts,
};
use orchestrator_db::model::{FieldError, Release};
use orchestrator_engine::{EngineError, StartChecks, StartRollout, start_rollout_checked};
use orchestrator_planner::Plan;
use orchestrator_types::{NodeId, ReleaseId, Role, RolloutId};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::{IntoParams, ToSchema};

use super::{Actor, ApiJson, ApiPath, ApiQuery};
use crate::AppState;
use crate::auth::Principal;
use crate::error::{ApiError, ErrorBody};

/// Most steps one page returns.
const MAX_STEP_PAGE: usize = 1000;
/// Steps per page when the caller does not say.
const DEFAULT_STEP_PAGE: usize = 100;

/// What to roll out, under which policy.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartBody {
    /// The release to roll out.
    pub(crate) release_id: i64,
    /// Name of a policy in force (synced from git); the rollout pins the
    /// commit and blob it was read at. Give this or `policy_yaml`.
    #[serde(default)]
    pub(crate) policy: Option<String>,
    /// A policy given inline (validated; errors name line:col); recorded as
    /// `inline:<sha256>`. Give this or `policy`.
    #[serde(default)]
    pub(crate) policy_yaml: Option<String>,
    /// Seed of the planner's stratified choices; default: from the clock
    /// (recorded with the rollout either way, so the plan is reproducible).
    #[serde(default)]
    pub(crate) seed: Option<i64>,
    /// Start even if a Prometheus gate has no series for some first-wave
    /// node (otherwise 409 naming the gates and nodes).
    #[serde(default)]
    pub(crate) allow_missing_series: bool,
}

/// The stored plan, as a human reads it before approving anything.
#[derive(Debug, Serialize, ToSchema)]
pub struct PlanSummary {
    /// The rollout just created.
    rollout: ExecRollout,
    /// sha256 of the planner's inputs.
    fingerprint: String,
    /// Nodes in the fleet snapshot.
    fleet_nodes: usize,
    /// Nodes planned into a wave.
    planned_nodes: usize,
    /// Components to flash.
    planned_components: usize,
    /// Nodes left out, by reason code.
    excluded: BTreeMap<String, usize>,
    waves: Vec<WaveSummary>,
    /// Exactly which inventory ids the steps push to, nodes with the same
    /// set grouped, largest group first.
    targets: Vec<TargetSummary>,
    rollback: RollbackSummary,
    /// Remarks for humans (empty waves, qualification, short control cohorts).
    notes: Vec<String>,
}

/// Nodes whose steps push to the same inventory ids.
#[derive(Debug, Serialize, ToSchema)]
pub struct TargetSummary {
    /// FirmwareInventory ids, sorted.
    inventory_ids: Vec<String>,
    /// How many nodes.
    nodes: usize,
    /// The first few node names.
    examples: Vec<String>,
}

/// One planned wave.
#[derive(Debug, Serialize, ToSchema)]
pub struct WaveSummary {
    name: String,
    /// Nodes the wave updates.
    nodes: usize,
    /// Comparable nodes that stay on the old version while it bakes.
    control_cohort: usize,
    bake_seconds: i64,
    /// Distinct approvals (never the author's) needed to start this wave.
    approvals_required: u32,
    max_in_flight: u32,
    gates: Vec<String>,
    /// Set when the wave waits for the release to be qualified.
    awaiting_qualification: bool,
}

/// Whether the rollout can be undone.
#[derive(Debug, Serialize, ToSchema)]
pub struct RollbackSummary {
    possible: bool,
    /// Why not, when impossible.
    reasons: Vec<String>,
    /// The policy rolls back without a human on a failed verdict.
    automatic: bool,
    /// `wave` or `rollout`.
    scope: String,
}

/// A rollout with its release and every wave's progress.
#[derive(Debug, Serialize, ToSchema)]
pub struct RolloutDetail {
    #[serde(flatten)]
    rollout: ExecRollout,
    release: Release,
    /// Step counts by state over the whole rollout.
    progress: BTreeMap<String, u64>,
    waves: Vec<WaveDetail>,
}

/// A wave with its progress and what holds it.
#[derive(Debug, Serialize, ToSchema)]
pub struct WaveDetail {
    #[serde(flatten)]
    wave: ExecWave,
    /// Step counts by state.
    progress: BTreeMap<String, u64>,
    approvals: ApprovalStatus,
    /// When the bake ends (or ended), once it started.
    bake_ends_at: Option<DateTime<Utc>>,
}

/// Approvals a wave has and needs.
#[derive(Debug, Serialize, ToSchema)]
pub struct ApprovalStatus {
    have: u32,
    need: u32,
    given: Vec<Approval>,
}

/// Filters and paging of a rollout's steps.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StepQuery {
    /// Wave name or position.
    wave: Option<String>,
    /// Step state (`pending`, `flashing`, `failed`, ...).
    state: Option<String>,
    /// Node name or id.
    node: Option<String>,
    /// 1 to 1,000; default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
    /// 0 to 1,000,000,000; default 0.
    #[param(minimum = 0, maximum = 1000000000)]
    offset: Option<usize>,
}

/// One page of steps.
#[derive(Debug, Serialize, ToSchema)]
pub struct StepPage {
    /// Steps matching the filters, over all pages.
    total: usize,
    offset: usize,
    limit: usize,
    steps: Vec<ExecStep>,
}

/// Optional words with a command.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandBody {
    /// Why (recorded in the rollout and the audit log).
    #[serde(default)]
    reason: Option<String>,
}

/// An approval's optional comment.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApproveBody {
    #[serde(default)]
    comment: Option<String>,
}

/// Why a rollback is asked for.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RollbackBody {
    /// Required: recorded in the rollout and the audit log.
    reason: String,
}

fn invalid(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::Invalid(vec![FieldError {
        field: field.to_owned(),
        message: message.into(),
    }])
}

/// A command that found the rollout in another state is a conflict, not
/// an internal error.
fn command_error(err: DbError) -> ApiError {
    match err {
        DbError::Stale { .. } => ApiError::Conflict(err.to_string()),
        other => other.into(),
    }
}

/// Parses an optional JSON body: empty means the defaults.
fn optional_body<T: DeserializeOwned + Default>(bytes: &Bytes) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => ApiError::InvalidBody(format!("invalid request body: {e}")),
        _ => ApiError::BadRequest(format!("malformed JSON body: {e}")),
    })
}

fn counts_by_name(counts: &orchestrator_db::execution::StepCounts) -> BTreeMap<String, u64> {
    counts.iter().map(|(s, n)| (s.as_str().to_owned(), *n)).collect()
}

fn summarize(rollout: ExecRollout, plan: &Plan) -> PlanSummary {
    let waves = plan
        .waves
        .iter()
        .map(|wave| WaveSummary {
            name: wave.name.clone(),
            nodes: wave.nodes.len(),
            control_cohort: wave.control.members().len(),
            bake_seconds: wave.bake_seconds,
            approvals_required: match wave.approval {
                orchestrator_planner::ApprovalRule::Manual { approvers } => approvers,
                orchestrator_planner::ApprovalRule::Auto => 0,
            },
            max_in_flight: wave.max_in_flight,
            gates: wave.gates.clone(),
            awaiting_qualification: wave.blocked.is_some(),
        })
        .collect();
    PlanSummary {
        rollout: without_source(rollout),
        fingerprint: plan.fingerprint.clone(),
        fleet_nodes: plan.summary.nodes,
        planned_nodes: plan.summary.planned,
        planned_components: plan.summary.steps,
        excluded: plan.summary.excluded.clone(),
        waves,
        targets: plan
            .targets()
            .into_iter()
            .map(|g| TargetSummary {
                inventory_ids: g.inventory_ids,
                nodes: g.nodes,
                examples: g.examples,
            })
            .collect(),
        rollback: RollbackSummary {
            possible: plan.rollback.possible,
            reasons: plan.rollback.blockers.iter().map(ToString::to_string).collect(),
            automatic: plan.rollback.automatic,
            scope: plan.rollback.scope.clone(),
        },
        notes: plan.notes.clone(),
    }
}

/// Lists and summaries leave the policy text out; the detail keeps it.
fn without_source(mut rollout: ExecRollout) -> ExecRollout {
    rollout.policy_source = None;
    rollout
}

fn engine_error(err: EngineError) -> ApiError {
    match err {
        EngineError::Db(db) => db.into(),
        EngineError::Policy(err) => invalid("policy", err.to_string()),
        EngineError::Plan(plan) => ApiError::Conflict(format!(
            "the rollout cannot be planned: {}",
            crate::error::error_chain(&plan)
        )),
        other @ (EngineError::EmptyPlan { .. }
        | EngineError::MissingSeries { .. }
        | EngineError::NoUpdatePath { .. }) => ApiError::Conflict(other.to_string()),
        // Prometheus could not answer: the rollout is not started, and the
        // caller may retry or skip the check; the cause is the server's.
        other @ EngineError::SeriesCheck(_) => ApiError::Conflict(format!(
            "{}; retry, or start with allow_missing_series",
            crate::error::error_chain(&other)
        )),
        other @ EngineError::LostLease => ApiError::Internal(Box::new(other)),
    }
}

#[utoipa::path(post, path = "/api/v1/rollouts", tag = "rollouts", request_body = StartBody,
    responses((status = 201, body = PlanSummary, description = "Planned and stored; the engine starts the first wave"),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody, description = "No such release"),
              (status = 409, body = ErrorBody, description = "The release cannot be planned under the policy (blocked, \
               not qualified, wrong component), or a Prometheus gate has no series for a first-wave node \
               (unless allow_missing_series)"),
              (status = 422, body = ErrorBody, description = "Invalid policy (line:col) or request")))]
pub(crate) async fn start(
    State(state): State<AppState>,
    actor: Actor,
    ApiJson(body): ApiJson<StartBody>,
) -> Result<(StatusCode, ApiJson<PlanSummary>), ApiError> {
    let (rollout, plan) = start_rollout_as(&state, body, &actor.0).await?;
    Ok((StatusCode::CREATED, ApiJson(summarize(rollout, &plan))))
}

/// Starts a rollout for the API and the UI's start form alike: resolves
/// the policy (in force by name, or inline), validates it with every
/// diagnostic, plans, stores and wakes the engine.
pub(crate) async fn start_rollout_as(
    state: &AppState,
    body: StartBody,
    actor: &str,
) -> Result<(ExecRollout, Plan), ApiError> {
    let (policy_source, policy_commit, policy_blob) = match (body.policy, body.policy_yaml) {
        (Some(name), None) => {
            let in_force = state.db.policy_in_force(&name).await.map_err(|e| match e {
                DbError::NotFound { .. } => invalid("policy", format!("no policy named {name:?} is in force")),
                other => other.into(),
            })?;
            (
                in_force.version.content,
                Some(in_force.version.commit_id),
                Some(in_force.version.blob_id),
            )
        }
        (None, Some(yaml)) => {
            state.duties.check_inline_policy()?;
            (yaml, None, None)
        }
        _ => {
            return Err(invalid(
                "policy",
                "give exactly one of `policy` (a name) and `policy_yaml`",
            ));
        }
    };
    // Validated here for every diagnostic with its line:col; the engine
    // would only report the first.
    if let Err(err) = orchestrator_policy::parse_policy(&policy_source) {
        let field = if policy_commit.is_some() {
            "policy"
        } else {
            "policy_yaml"
        };
        let fields = err
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
            .map(|d| FieldError {
                field: field.to_owned(),
                message: d.to_string(),
            })
            .collect();
        return Err(ApiError::Invalid(fields));
    }
    let seed = body
        .seed
        .unwrap_or_else(|| state.db.clock().now().timestamp_nanos_opt().unwrap_or_default());
    let request = StartRollout {
        release_id: ReleaseId(body.release_id),
        policy_source,
        policy_commit,
        policy_blob,
        seed,
    };
    let checks = StartChecks {
        prometheus: state.prometheus.clone(),
        allow_missing_series: body.allow_missing_series,
        bmcs: state.bmcs.clone(),
    };
    let (rollout, plan) = start_rollout_checked(&state.db, &request, actor, &checks)
        .await
        .map_err(engine_error)?;
    state.nudge_engine();
    Ok((rollout, plan))
}

#[utoipa::path(get, path = "/api/v1/rollouts", tag = "rollouts",
    responses((status = 200, body = [ExecRollout], description = "Newest first, without the policy text")))]
pub(crate) async fn list(State(state): State<AppState>) -> Result<ApiJson<Vec<ExecRollout>>, ApiError> {
    let rollouts = state.db.exec_rollouts().await?;
    Ok(ApiJson(rollouts.into_iter().map(without_source).collect()))
}

async fn detail(state: &AppState, id: RolloutId) -> Result<RolloutDetail, ApiError> {
    let rollout = state.db.exec_rollout(id).await?;
    let release = state.db.release(rollout.release_id).await?;
    let by_wave = state.db.step_counts_by_wave(id).await?;
    let progress = counts_by_name(&total_counts(&by_wave));
    let mut waves = Vec::new();
    for wave in state.db.rollout_waves(id).await? {
        let counts = counts_by_name(&by_wave.get(&wave.id).cloned().unwrap_or_default());
        let given = state.db.wave_approvals(wave.id).await?;
        let approvals = ApprovalStatus {
            have: u32::try_from(given.len()).unwrap_or(u32::MAX),
            need: u32::try_from(wave.approvals_required.max(0)).unwrap_or(0),
            given,
        };
        let bake_ends_at = wave.bake_started_at.map(|at| at + Duration::seconds(wave.bake_seconds));
        waves.push(WaveDetail {
            wave,
            progress: counts,
            approvals,
            bake_ends_at,
        });
    }
    Ok(RolloutDetail {
        rollout,
        release,
        progress,
        waves,
    })
}

#[utoipa::path(get, path = "/api/v1/rollouts/{id}", tag = "rollouts",
    params(("id" = i64, Path, description = "Rollout id")),
    responses((status = 200, body = RolloutDetail), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn get(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> Result<ApiJson<RolloutDetail>, ApiError> {
    Ok(ApiJson(detail(&state, RolloutId(id)).await?))
}

/// Finds a wave of the rollout by name, or by position when `key` is a number.
async fn find_wave(state: &AppState, rollout: RolloutId, key: &str) -> Result<ExecWave, ApiError> {
    let waves = state.db.rollout_waves(rollout).await?;
    let by_name = waves.iter().find(|w| w.name == key);
    let by_position = || {
        key.parse::<i32>()
            .ok()
            .and_then(|n| waves.iter().find(|w| w.position == n))
    };
    by_name
        .or_else(by_position)
        .cloned()
        .ok_or_else(|| ApiError::NotFound(format!("rollout {rollout} has no wave {key:?}")))
}

#[utoipa::path(get, path = "/api/v1/rollouts/{id}/steps", tag = "rollouts",
    params(("id" = i64, Path, description = "Rollout id"), StepQuery),
    responses((status = 200, body = StepPage), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn steps(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<i64>,
    ApiQuery(query): ApiQuery<StepQuery>,
) -> Result<ApiJson<StepPage>, ApiError> {
    let rollout = state.db.exec_rollout(RolloutId(id)).await?;
    let step_state = query
        .state
        .as_deref()
        .map(str::parse::<StepState>)
        .transpose()
        .map_err(ApiError::BadRequest)?;
    let wave_id = match &query.wave {
        Some(key) => Some(find_wave(&state, rollout.id, key).await?.id),
        None => None,
    };
    let node_id = match &query.node {
        Some(key) => match key.parse::<i64>() {
            Ok(id) => Some(NodeId(id)),
            Err(_) => Some(state.db.node_by_name(key).await?.id),
        },
        None => None,
    };
    let limit = super::in_range("limit", query.limit, 1, MAX_STEP_PAGE)?.unwrap_or(DEFAULT_STEP_PAGE);
    let max_offset = usize::try_from(super::MAX_OFFSET).unwrap_or(usize::MAX);
    let offset = super::in_range("offset", query.offset, 0, max_offset)?.unwrap_or(0);
    let filter = StepFilter {
        rollout_id: Some(rollout.id),
        wave_id,
        node_id,
        state: step_state,
        purpose: None,
    };
    // The page and the count are the database's work: a rollout may have
    // 100,000 steps.
    let total = usize::try_from(state.db.count_steps(&filter).await?).unwrap_or(usize::MAX);
    let steps = state
        .db
        .step_page(&StepPageQuery {
            filter,
            node_name_contains: None,
            offset: offset as u64,
            limit: limit as u64,
        })
        .await?
        .into_iter()
        .map(|named| named.step)
        .collect();
    Ok(ApiJson(StepPage {
        total,
        offset,
        limit,
        steps,
    }))
}

/// Every drain the rollout made through a workload scheduler, oldest first:
/// Waveguard's own record (phase, the tag it wrote, the scheduler's state
/// before the drain and when last read, and why it was closed).
#[utoipa::path(get, path = "/api/v1/rollouts/{id}/drains", tag = "rollouts",
    params(("id" = i64, Path, description = "Rollout id")),
    responses((status = 200, body = [DrainRow], description = "Oldest first; empty when the rollout drained nothing"),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn drains(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> Result<ApiJson<Vec<DrainRow>>, ApiError> {
    let rollout = state.db.exec_rollout(RolloutId(id)).await?;
    Ok(ApiJson(state.db.rollout_drains(rollout.id).await?))
}

#[utoipa::path(post, path = "/api/v1/rollouts/{id}/waves/{wave}/approve", tag = "rollouts",
    params(("id" = i64, Path, description = "Rollout id"), ("wave" = String, Path, description = "Wave name or position")),
    request_body(content = Option<ApproveBody>, description = "Optional comment"),
    responses((status = 200, body = ApprovalStatus), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "Already approved by this user, the wave does not await approval after its verdict, or the rollout is not running or paused"),
              (status = 403, body = ErrorBody, description = "The rollout's author cannot approve (two-person rule)"),
              (status = 422, body = ErrorBody)))]
pub(crate) async fn approve(
    State(state): State<AppState>,
    actor: Actor,
    ApiPath((id, wave)): ApiPath<(i64, String)>,
    body: Bytes,
) -> Result<ApiJson<ApprovalStatus>, ApiError> {
    let body: ApproveBody = optional_body(&body)?;
    let rollout = state.db.exec_rollout(RolloutId(id)).await?;
    let wave = find_wave(&state, rollout.id, &wave).await?;
    if wave.kind != WaveKind::Update {
        return Err(ApiError::Conflict(format!(
            "wave {:?} is a rollback wave: it needs no approval",
            wave.name
        )));
    }
    let given = state
        .db
        .approve_wave(wave.id, &actor.0, body.comment.as_deref())
        .await
        .map_err(|e| match e {
            // The two-person rule: who asks is the problem, not what.
            DbError::Invalid { field, reason } if field == "approver" => ApiError::Forbidden(reason),
            other => command_error(other),
        })?;
    state.nudge_engine();
    Ok(ApiJson(ApprovalStatus {
        have: u32::try_from(given.len()).unwrap_or(u32::MAX),
        need: u32::try_from(wave.approvals_required.max(0)).unwrap_or(0),
        given,
    }))
}

/// A user command moving the rollout between states.
async fn command(
    state: &AppState,
    actor: &Actor,
    id: i64,
    from: &[RolloutState],
    to: RolloutState,
    body: &Bytes,
) -> Result<ApiJson<RolloutDetail>, ApiError> {
    let body: CommandBody = optional_body(body)?;
    let id = RolloutId(id);
    state
        .db
        .user_set_rollout_state(id, from, to, body.reason.as_deref(), &actor.0)
        .await
        .map_err(command_error)?;
    state.nudge_engine();
    Ok(ApiJson(detail(state, id).await?))
}

#[utoipa::path(post, path = "/api/v1/rollouts/{id}/pause", tag = "rollouts",
    params(("id" = i64, Path, description = "Rollout id")),
    request_body(content = Option<CommandBody>, description = "Optional reason"),
    responses((status = 200, body = RolloutDetail, description = "Paused: no new flash starts; in-flight ones finish"),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody, description = "Not running")))]
pub(crate) async fn pause(
    State(state): State<AppState>,
    actor: Actor,
    ApiPath(id): ApiPath<i64>,
    body: Bytes,
) -> Result<ApiJson<RolloutDetail>, ApiError> {
    command(
        &state,
        &actor,
        id,
        &[RolloutState::Running],
        RolloutState::Paused,
        &body,
    )
    .await
}

#[utoipa::path(post, path = "/api/v1/rollouts/{id}/resume", tag = "rollouts",
    params(("id" = i64, Path, description = "Rollout id")),
    request_body(content = Option<CommandBody>, description = "Optional reason"),
    responses((status = 200, body = RolloutDetail), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "Not paused")))]
pub(crate) async fn resume(
    State(state): State<AppState>,
    actor: Actor,
    ApiPath(id): ApiPath<i64>,
    body: Bytes,
) -> Result<ApiJson<RolloutDetail>, ApiError> {
    command(
        &state,
        &actor,
        id,
        &[RolloutState::Paused],
        RolloutState::Running,
        &body,
    )
    .await
}

#[utoipa::path(post, path = "/api/v1/rollouts/{id}/abort", tag = "rollouts",
    params(("id" = i64, Path, description = "Rollout id")),
    request_body(content = Option<CommandBody>, description = "Optional reason; required to abort a rollback"),
    responses((status = 200, body = RolloutDetail,
               description = "Aborted: no new flash; in-flight ones finish (or meet their deadline); rollback is left \
                              to the user. A rollback in progress is aborted only by an admin, with a reason; the \
                              audit entry records each node's last known version"),
              (status = 403, body = ErrorBody, description = "A rollback in progress and the caller is not an admin"),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody, description = "Already finished"),
              (status = 422, body = ErrorBody, description = "A rollback aborted without a reason")))]
pub(crate) async fn abort(
    State(state): State<AppState>,
    actor: Actor,
    Extension(principal): Extension<Principal>,
    ApiPath(id): ApiPath<i64>,
    body: Bytes,
) -> Result<ApiJson<RolloutDetail>, ApiError> {
    let current = state.db.exec_rollout(RolloutId(id)).await?;
    if current.state == RolloutState::RollingBack {
        // A rollback that cannot finish (a task that never ends) must not
        // hold the fleet for good, but stopping one leaves nodes between
        // versions: an admin's call, with a reason on record.
        if principal.user.role < Role::Admin {
            return Err(ApiError::Forbidden(
                "the rollout is rolling back: only an admin may abort a rollback".into(),
            ));
        }
        let body: CommandBody = optional_body(&body)?;
        let reason = body
            .reason
            .as_deref()
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .ok_or_else(|| invalid("reason", "aborting a rollback needs a reason"))?;
        state
            .db
            .abort_rollback(current.id, reason, &actor.0)
            .await
            .map_err(command_error)?;
        state.nudge_engine();
        return Ok(ApiJson(detail(&state, current.id).await?));
    }
    command(
        &state,
        &actor,
        id,
        &[RolloutState::Running, RolloutState::Paused, RolloutState::Halted],
        RolloutState::Aborted,
        &body,
    )
    .await
}

#[utoipa::path(post, path = "/api/v1/rollouts/{id}/rollback", tag = "rollouts",
    params(("id" = i64, Path, description = "Rollout id")), request_body = RollbackBody,
    responses((status = 200, body = RolloutDetail, description = "Rolling back every updated node"),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "Already rolling back, or the plan says rollback is impossible"),
              (status = 422, body = ErrorBody)))]
pub(crate) async fn rollback(
    State(state): State<AppState>,
    actor: Actor,
    ApiPath(id): ApiPath<i64>,
    ApiJson(body): ApiJson<RollbackBody>,
) -> Result<ApiJson<RolloutDetail>, ApiError> {
    let reason = body.reason.trim();
    if reason.is_empty() {
        return Err(invalid("reason", "a rollback needs a reason"));
    }
    let id = RolloutId(id);
    state
        .db
        .begin_rollback(None, id, json!({ "scope": "rollout" }), reason, &actor.0)
        .await
        .map_err(|e| match e {
            DbError::Invalid { reason, .. } => ApiError::Conflict(reason),
            other => command_error(other),
        })?;
    state.nudge_engine();
    Ok(ApiJson(detail(&state, id).await?))
}
