//! Rollouts: the detail page (waves as a timeline with what each waits on,
//! verdicts with canary-versus-control charts, the node table paged in the
//! database), the parts its live updates re-render (`ui::live` streams
//! them), and the user commands.

use std::collections::{BTreeMap, HashMap};

use axum::Extension;
use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Utc};
use minijinja::{Value, context};
use orchestrator_db::execution::{
    Blocker, ExecRollout, ExecWave, NamedStep, RolloutState, StepCounts, StepFilter, StepPageQuery, StepState,
    WaveKind, WaveState,
};
use orchestrator_db::health::SampleScope;
use orchestrator_types::{NodeId, RolloutId, WaveId};
use serde::Deserialize;
use serde_json::json;

use super::{UiError, base, charts, decision, done, render, render_string, scheduler, v, verdicts, wants_json};
use crate::AppState;
use crate::auth::Principal;

/// Node rows per page of the rollout's node table.
const NODE_ROWS_PER_PAGE: u64 = 100;

fn done_count(counts: &StepCounts) -> u64 {
    counts.iter().filter(|(s, _)| s.is_terminal()).map(|(_, n)| n).sum()
}

fn total(counts: &StepCounts) -> u64 {
    counts.values().sum()
}

fn count(counts: &StepCounts, state: StepState) -> u64 {
    counts.get(&state).copied().unwrap_or(0)
}

/// One line a human reads: what the thing is waiting on (the CLI's
/// `rollout show` prints the same words).
pub fn describe_blocker(blocker: &Blocker) -> String {
    let at = |t: &DateTime<Utc>| t.format("%Y-%m-%d %H:%M UTC").to_string();
    match blocker {
        Blocker::WindowOpensAt { at: Some(t) } => format!("maintenance window opens {}", at(t)),
        Blocker::WindowOpensAt { at: None } => "a maintenance window (none scheduled)".into(),
        Blocker::BakeEndsAt { at: t } => format!("bake ends {}", at(t)),
        Blocker::BakeExtended { until, waiting_on } => {
            format!(
                "more evidence (bake extended, at most until {}): {waiting_on}",
                at(until)
            )
        }
        Blocker::PreFlashWatch { until } => format!(
            "the pre-flash watch: level gates read every node before its flash; flashing starts {}",
            at(until)
        ),
        Blocker::Approvals { have, need } => format!("approvals ({have} of {need})"),
        Blocker::Verdict { verdict, summary } => format!("a human decision: verdict {verdict} — {summary}"),
        Blocker::InFlightCap { scope, limit } => format!("{scope} in-flight cap ({limit})"),
        Blocker::Backoff { at: t } => format!("retry after a BMC error at {}", at(t)),
        Blocker::Paused => "the rollout is paused".into(),
        Blocker::PreviousWave { wave } => format!("wave {wave} to be promoted"),
        Blocker::StepDeadline { state, nodes, at: t } => {
            format!("{nodes} node(s) {state}; the first fails its deadline {}", at(t))
        }
        Blocker::AwaitingQualification { state, missing_gates } if missing_gates.is_empty() => {
            format!("the release to be qualified (it is {state})")
        }
        Blocker::AwaitingQualification { state, missing_gates } => format!(
            "the release to be qualified (it is {state}; gates not passed: {})",
            missing_gates.join(", ")
        ),
        Blocker::Drain {
            node,
            waiting_on,
            until,
        } => format!(
            "{node} to empty (drained in its scheduler, waiting on {}); drain timeout {}",
            waiting_on.replace('_', " "),
            at(until)
        ),
        Blocker::DrainTimedOut { node } => {
            format!("a human: {node} did not empty within the drain timeout and the policy says hold")
        }
        Blocker::CapacityCap {
            cluster,
            out_of_service,
            total,
        } => format!("capacity cap: cluster {cluster} has {out_of_service} of {total} GPUs out of service"),
        Blocker::SchedulerUnavailable { error } => {
            format!("the workload scheduler to answer ({})", scheduler::redact(error))
        }
    }
}

fn pct(part: u64, whole: u64) -> u64 {
    (part * 100).checked_div(whole).unwrap_or(0)
}

fn without_source(mut rollout: ExecRollout) -> ExecRollout {
    rollout.policy_source = None;
    rollout
}

/// Everything the live part of the detail page shows. `capacity` caches
/// what each approval's next wave takes out of service (read once per page
/// or stream: it needs the whole fleet's GPU counts).
pub(crate) async fn live_context(
    state: &AppState,
    me: &Principal,
    id: RolloutId,
    capacity: &mut Option<HashMap<WaveId, String>>,
) -> Result<(Value, Vec<ExecWave>), UiError> {
    let db = &state.db;
    let pinned = db.exec_rollout(id).await?;
    // The policy the rollout runs under, for thresholds, budget and power;
    // a text that no longer parses only loses those lines.
    let policy = pinned
        .policy_source
        .as_deref()
        .and_then(|text| orchestrator_policy::parse_policy(text).ok());
    let rollout = without_source(pinned);
    let release = db.release(rollout.release_id).await?;
    let waves = db.rollout_waves(id).await?;
    let capacity = match capacity {
        Some(known) => known,
        None => capacity.insert(scheduler::next_wave_capacity(db, id, &waves).await?),
    };
    let active = rollout.state.is_active();
    let judged = |w: &ExecWave| !w.gates.is_empty() && (w.verdict.is_some() || w.state == WaveState::Baking);
    let looks = if waves.iter().any(judged) {
        db.health_looks(SampleScope::Rollout(id)).await?
    } else {
        Vec::new()
    };
    let latest = verdicts::latest_looks(&looks);
    let by_wave = db.step_counts_by_wave(id).await?;
    let overall = orchestrator_db::execution::total_counts(&by_wave);
    let mut tallies = Vec::new();
    let mut wave_rows = Vec::new();
    for wave in &waves {
        let counts = by_wave.get(&wave.id).cloned().unwrap_or_default();
        let approvals = db.wave_approvals(wave.id).await?;
        let approvers: Vec<String> = approvals.iter().map(|a| a.approver.clone()).collect();
        let all = total(&counts).max(u64::try_from(wave.node_count).unwrap_or(0));
        let succeeded = count(&counts, StepState::Succeeded);
        let skipped = count(&counts, StepState::Skipped);
        let failed = count(&counts, StepState::Failed);
        let deferred = count(&counts, StepState::Deferred);
        let in_flight: u64 = counts.iter().filter(|(s, _)| s.is_in_flight()).map(|(_, n)| n).sum();
        let (charts, tables) = if wave.verdict.is_some() || wave.state == WaveState::Baking {
            // Days retention has reduced chart as one point each.
            let history = db.health_history(SampleScope::Wave(wave.id)).await?;
            let mut samples = history.hourly;
            samples.extend(history.daily);
            let marks = verdicts::chart_marks(wave.id.0, &wave.gates, &looks, policy.as_ref());
            let errors = match (&wave.verdict, wave.state) {
                (Some(verdict), _) => verdicts::verdict_poll_errors(verdict),
                (None, WaveState::Baking) => poll_errors(db, wave.id).await?,
                _ => Vec::new(),
            };
            (
                charts::cohort_charts(&samples, &marks),
                verdicts::wave_tables(wave.id.0, &wave.gates, &latest, policy.as_ref(), &errors),
            )
        } else {
            (Vec::new(), Vec::new())
        };
        // Stored blockers are current only while the rollout and the wave
        // still move; afterwards they are history, not a wait.
        let blockers: Vec<String> = if active && !wave.state.is_closed() {
            wave.blockers.iter().map(describe_blocker).collect()
        } else {
            Vec::new()
        };
        let counted = orchestrator_db::execution::counted_approvals(&approvals, wave.verdict.as_ref());
        tallies.push(decision::WaveTally {
            wave,
            succeeded,
            failed,
            done: succeeded + skipped + failed + deferred,
            approvers: counted.iter().map(|a| a.approver.clone()).collect(),
        });
        wave_rows.push(context! {
            blockers, charts, tables, approvals => v(&approvals), approvers, capacity => capacity.get(&wave.id).cloned(),
            done => succeeded + skipped + failed + deferred, succeeded, skipped, failed, deferred, in_flight,
            pct_ok => pct(succeeded + skipped, all), pct_failed => pct(failed, all), pct_inflight => pct(in_flight, all),
            ..v(wave)
        });
    }
    let blockers: Vec<String> = if active {
        rollout.blockers.iter().map(describe_blocker).collect()
    } else {
        Vec::new()
    };
    let rollback_impossible = rollout.rollback_impossible();
    // The share of the fleet is read only when an approval is asked for.
    let asks_approval = active && waves.iter().any(|w| w.state == WaveState::AwaitingApproval);
    let fleet_nodes = if asks_approval {
        db.node_counts().await?.total
    } else {
        0
    };
    let waiting: Vec<String> = blockers
        .iter()
        .cloned()
        .chain(
            tallies
                .iter()
                .find(|t| t.wave.kind == WaveKind::Update && t.wave.state != WaveState::Promoted)
                .filter(|_| active)
                .map(|t| t.wave.blockers.iter().map(describe_blocker).collect::<Vec<_>>())
                .unwrap_or_default(),
        )
        .collect();
    let decision = decision::decision_box(
        &decision::Inputs {
            rollout: &rollout,
            waves: &tallies,
            policy: policy.as_ref(),
            fleet_nodes,
            rollback_impossible: rollback_impossible.as_deref(),
            waiting,
            capacity,
        },
        me,
    );
    drop(tallies);
    let (drains, drains_truncated) = scheduler::rollout_rows(db, id, &waves).await?;
    let ctx = context! {
        rollout => context! { blockers, rollback_impossible, ..v(&rollout) },
        release => v(&release), waves => wave_rows, drains, drains_truncated, decision,
        overall => context! { done => done_count(&overall), total => total(&overall) },
        me => super::me(me), csrf => me.csrf_token(),
    };
    Ok((ctx, waves))
}

/// The watched nodes of a baking wave whose latest health poll failed, by
/// name (one filtered read and one read of their names).
async fn poll_errors(db: &orchestrator_db::Db, wave: WaveId) -> Result<Vec<verdicts::NodeInError>, UiError> {
    let cursors = db.health_poll_errors(wave).await?;
    if cursors.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<NodeId> = cursors.iter().map(|c| c.node_id).collect();
    let names = db.node_names(&ids).await?;
    Ok(cursors
        .into_iter()
        .map(|c| verdicts::NodeInError {
            name: names.get(&c.node_id).cloned().unwrap_or_else(|| c.node_id.to_string()),
            cohort: c.cohort,
            error: c.last_error.unwrap_or_default(),
        })
        .collect())
}

/// The node table's filters.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct NodeQuery {
    state: Option<String>,
    wave: Option<String>,
    node: Option<String>,
    /// 1-based page of the node table.
    page: Option<u64>,
    msg: Option<String>,
}

/// The node table's filters, parsed.
struct NodeFilter {
    state: Option<StepState>,
    wave: Option<WaveId>,
    node: Option<String>,
    page: u64,
}

impl NodeQuery {
    fn parse(&self) -> Result<NodeFilter, UiError> {
        let state = match self.state.as_deref().filter(|s| !s.is_empty()) {
            Some(s) => Some(
                s.parse::<StepState>()
                    .map_err(|e| UiError::new(StatusCode::BAD_REQUEST, e))?,
            ),
            None => None,
        };
        let wave = match self.wave.as_deref().filter(|s| !s.is_empty()) {
            Some(w) => {
                Some(WaveId(w.parse().map_err(|_| {
                    UiError::new(StatusCode::BAD_REQUEST, "wave must be a wave id")
                })?))
            }
            None => None,
        };
        let node = self
            .node
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        let page = self.page.unwrap_or(1);
        if !(1..=MAX_NODE_PAGE).contains(&page) {
            return Err(UiError::new(
                StatusCode::BAD_REQUEST,
                format!("page must be between 1 and {MAX_NODE_PAGE}"),
            ));
        }
        Ok(NodeFilter {
            state,
            wave,
            node,
            page,
        })
    }

    /// The filters (not the page) as a query string, for the node table's
    /// links and its live refresh.
    fn to_query_string(&self) -> String {
        [("state", &self.state), ("wave", &self.wave), ("node", &self.node)]
            .into_iter()
            .filter_map(|(key, value)| {
                value
                    .as_deref()
                    .filter(|v| !v.is_empty())
                    .map(|v| format!("{key}={}", crate::url::urlencode(v)))
            })
            .collect::<Vec<_>>()
            .join("&")
    }
}

/// Pages past this are refused: 100 rows a page covers a million steps.
const MAX_NODE_PAGE: u64 = 10_000;

/// One page of the node table under `filter`, read as one page from the
/// database, as the template's context (`steps`, `pager`).
async fn node_table(
    state: &AppState,
    id: RolloutId,
    query: &NodeQuery,
    filter: &NodeFilter,
    waves: &[ExecWave],
) -> Result<Value, UiError> {
    let offset = (filter.page - 1) * NODE_ROWS_PER_PAGE;
    let mut rows = state
        .db
        .step_page(&StepPageQuery {
            filter: StepFilter {
                rollout_id: Some(id),
                wave_id: filter.wave,
                state: filter.state,
                ..Default::default()
            },
            node_name_contains: filter.node.clone(),
            offset,
            // One more than shown says whether a next page exists, without
            // counting every match.
            limit: NODE_ROWS_PER_PAGE + 1,
        })
        .await?;
    let more = rows.len() as u64 > NODE_ROWS_PER_PAGE;
    rows.truncate(NODE_ROWS_PER_PAGE as usize);
    let wave_names: HashMap<WaveId, &str> = waves.iter().map(|w| (w.id, w.name.as_str())).collect();
    let steps: Vec<Value> = rows
        .into_iter()
        .map(|NamedStep { step, node_name }| {
            context! {
                node => node_name, wave => wave_names.get(&step.wave_id).copied().unwrap_or(""),
                purpose => step.purpose.as_str(), from => step.expected_from_version, to => step.target_version,
                state => step.state.as_str(), attempts => step.attempts, error => step.error,
            }
        })
        .collect();
    let filters = query.to_query_string();
    let link = |n: u64| {
        let sep = if filters.is_empty() { "" } else { "&" };
        format!("/rollouts/{id}?{filters}{sep}page={n}")
    };
    let pager = context! {
        page => filter.page, first => offset + 1, last => offset + steps.len() as u64,
        prev => (filter.page > 1).then(|| link(filter.page - 1)),
        next => more.then(|| link(filter.page + 1)),
    };
    Ok(context! { steps, pager })
}

pub(crate) async fn detail(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
    Path(id): Path<i64>,
    Query(query): Query<NodeQuery>,
) -> Result<Response, UiError> {
    let id = RolloutId(id);
    let (live, waves) = live_context(&state, &me, id, &mut None).await?;
    let node_filter = query.parse()?;
    let table = node_table(&state, id, &query, &node_filter, &waves).await?;
    let step_states: Vec<&str> = StepState::ALL.iter().map(|s| s.as_str()).collect();
    let title = format!("Rollout {id}");
    let nodes_url = nodes_url(id, &query, node_filter.page);
    let filter = context! { state => query.state, wave => query.wave, node => query.node };
    let alerts = scheduler::banners(&state);
    let page = context! { step_states, filter, nodes_url, flash => query.msg, alerts, ..live };
    Ok(render(
        "rollout.html",
        minijinja::value::merge_maps([page, table, base(&me, "rollouts", &title)]),
    ))
}

/// Where a live page fetches its node table again after a step changed.
fn nodes_url(id: RolloutId, query: &NodeQuery, page: u64) -> String {
    let filters = query.to_query_string();
    let sep = if filters.is_empty() { "" } else { "&" };
    format!("/rollouts/{id}/nodes?{filters}{sep}page={page}")
}

/// What approving `wave` starts, for the confirmation page: the same lines
/// as the decision box, from the rollout's pinned policy.
async fn approval_effects(
    state: &AppState,
    rollout: &ExecRollout,
    waves: &[ExecWave],
    wave: &ExecWave,
    capacity: &HashMap<WaveId, String>,
) -> Result<Vec<String>, UiError> {
    let policy = rollout
        .policy_source
        .as_deref()
        .and_then(|text| orchestrator_policy::parse_policy(text).ok());
    let tallies: Vec<decision::WaveTally<'_>> = waves
        .iter()
        .map(|w| decision::WaveTally {
            wave: w,
            succeeded: 0,
            failed: 0,
            done: 0,
            approvers: Vec::new(),
        })
        .collect();
    let rollback_impossible = rollout.rollback_impossible();
    let inputs = decision::Inputs {
        rollout,
        waves: &tallies,
        policy: policy.as_ref(),
        fleet_nodes: state.db.node_counts().await?.total,
        rollback_impossible: rollback_impossible.as_deref(),
        waiting: Vec::new(),
        capacity,
    };
    Ok(decision::approval_effects(&inputs, wave))
}

/// `GET /rollouts/{id}/nodes`: one page of the node table, as the HTML the
/// page's `#live-nodes` holds; a live page fetches it when the stream says a
/// step changed.
pub(crate) async fn nodes(
    State(state): State<AppState>,
    Path(id): Path<i64>,
    Query(query): Query<NodeQuery>,
) -> Result<Response, UiError> {
    let id = RolloutId(id);
    let filter = query.parse()?;
    let waves = state.db.rollout_waves(id).await?;
    if waves.is_empty() {
        // Unknown rollouts answer 404 like the page does.
        state.db.exec_rollout(id).await?;
    }
    let table = node_table(&state, id, &query, &filter, &waves).await?;
    match render_string("rollout_nodes.html", table) {
        Some(html) => Ok(Html(html).into_response()),
        None => Err(UiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "node table not rendered",
        )),
    }
}

/// What the rollout buttons are.
#[derive(Debug, Clone, Copy)]
enum Action {
    Approve,
    Pause,
    Resume,
    Abort,
    Rollback,
}

impl Action {
    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "approve" => Action::Approve,
            "pause" => Action::Pause,
            "resume" => Action::Resume,
            "abort" => Action::Abort,
            "rollback" => Action::Rollback,
            _ => return None,
        })
    }

    fn label(self) -> &'static str {
        match self {
            Action::Approve => "Approve",
            Action::Pause => "Pause",
            Action::Resume => "Resume",
            Action::Abort => "Abort",
            Action::Rollback => "Roll back",
        }
    }
}

pub(crate) async fn action(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
    headers: HeaderMap,
    Path((id, name)): Path<(i64, String)>,
    Form(mut form): Form<BTreeMap<String, String>>,
) -> Result<Response, UiError> {
    let json = wants_json(&headers);
    let fail = |status: StatusCode, message: String| UiError::new(status, message).json(json);
    let action = Action::parse(&name).ok_or_else(|| fail(StatusCode::NOT_FOUND, format!("no action {name:?}")))?;
    let rollout = state
        .db
        .exec_rollout(RolloutId(id))
        .await
        .map_err(|e| UiError::from(e).json(json))?;
    let back = format!("/rollouts/{id}");
    form.remove("csrf");
    let reason = form
        .get("reason")
        .map(|r| r.trim().to_owned())
        .filter(|r| !r.is_empty());
    let mut all_waves = Vec::new();
    let wave = match action {
        Action::Approve => {
            let wave_id: i64 = form
                .get("wave")
                .and_then(|w| w.parse().ok())
                .ok_or_else(|| fail(StatusCode::BAD_REQUEST, "which wave? (field `wave`)".into()))?;
            let waves = state
                .db
                .rollout_waves(rollout.id)
                .await
                .map_err(|e| UiError::from(e).json(json))?;
            let wave = waves
                .iter()
                .find(|w| w.id == WaveId(wave_id))
                .cloned()
                .ok_or_else(|| fail(StatusCode::NOT_FOUND, format!("rollout {id} has no wave {wave_id}")))?;
            all_waves = waves;
            if wave.kind != WaveKind::Update {
                return Err(fail(StatusCode::CONFLICT, "a rollback wave needs no approval".into()));
            }
            // Refused before asking to confirm, with the datastore's reason
            // in words: the page never offers these, a stale tab might.
            if !rollout.state.is_active() {
                return Err(fail(
                    StatusCode::CONFLICT,
                    format!(
                        "rollout {id} is {}: a finished, stopped or rolled-back rollout takes no approvals",
                        rollout.state
                    ),
                ));
            }
            if wave.state != WaveState::AwaitingApproval {
                return Err(fail(
                    StatusCode::CONFLICT,
                    format!(
                        "wave {} is {}: approvals are taken only while it awaits one after its health verdict",
                        wave.name, wave.state
                    ),
                ));
            }
            Some(wave)
        }
        _ => None,
    };

    // Refused before asking to confirm: the plan already said no, and the
    // datastore would refuse it anyway.
    if matches!(action, Action::Rollback)
        && let Some(reasons) = rollout.rollback_impossible()
    {
        return Err(fail(
            StatusCode::CONFLICT,
            format!("Rollback impossible: {}", reasons.join("; ")),
        ));
    }

    // Without JavaScript the first post shows a confirmation page; the
    // script confirms in a dialog and sends `confirmed=yes` at once.
    if form.get("confirmed").map(String::as_str) != Some("yes") {
        let capacity = match action {
            Action::Approve => scheduler::next_wave_capacity(&state.db, rollout.id, &all_waves)
                .await
                .map_err(|e| UiError::from(e).json(json))?,
            _ => HashMap::new(),
        };
        let effects = match &wave {
            Some(w) => approval_effects(&state, &rollout, &all_waves, w, &capacity)
                .await
                .map_err(|e| e.json(json))?,
            None => Vec::new(),
        };
        let question = match (&action, &wave) {
            (Action::Approve, Some(w)) => {
                let what = if w
                    .verdict
                    .as_ref()
                    .is_some_and(|v| v.outcome != orchestrator_types::Outcome::Pass)
                {
                    format!("Promote wave {} of rollout {id} anyway", w.name)
                } else {
                    format!("Approve wave {} of rollout {id}", w.name)
                };
                match capacity.get(&w.id) {
                    Some(takes) => format!("{what}? {takes}"),
                    None => format!("{what}?"),
                }
            }
            (Action::Pause, _) => format!("Pause rollout {id}? No new flash starts; in-flight ones finish."),
            (Action::Resume, _) => format!("Resume rollout {id}?"),
            (Action::Abort, _) => format!("Abort rollout {id}? No new flash starts; rollback is left to you."),
            (Action::Rollback, _) => format!("Roll back every node rollout {id} updated to its previous version?"),
            _ => format!("{} rollout {id}?", action.label()),
        };
        form.remove("confirmed");
        let ctx = context! {
            action_label => action.label(), question, action_url => format!("/rollouts/{id}/{name}"),
            fields => form, needs_reason => matches!(action, Action::Rollback), effects,
            danger => matches!(action, Action::Abort | Action::Rollback), back_url => back,
            ..base(&me, "rollouts", "Confirm")
        };
        return Ok(render("confirm.html", ctx));
    }

    let actor = me.user.username.as_str();
    let db = &state.db;
    let message = match action {
        Action::Approve => {
            let wave = wave.ok_or_else(|| fail(StatusCode::BAD_REQUEST, "which wave?".into()))?;
            let comment = form.get("comment").map(|c| c.trim()).filter(|c| !c.is_empty());
            let given = db.approve_wave(wave.id, actor, comment).await.map_err(|e| match e {
                // The two-person rule answers 403 here as in the API: who
                // asks is the problem, not what.
                orchestrator_db::DbError::Invalid { field, reason } if field == "approver" => {
                    UiError::from(crate::error::ApiError::Forbidden(reason)).json(json)
                }
                other => UiError::from(other).json(json),
            })?;
            format!(
                "Approved wave {} ({} of {} approvals).",
                wave.name,
                given.len(),
                wave.approvals_required
            )
        }
        Action::Pause | Action::Resume | Action::Abort => {
            let (from, to): (&[RolloutState], RolloutState) = match action {
                Action::Pause => (&[RolloutState::Running], RolloutState::Paused),
                Action::Resume => (&[RolloutState::Paused], RolloutState::Running),
                _ => (
                    &[RolloutState::Running, RolloutState::Paused, RolloutState::Halted],
                    RolloutState::Aborted,
                ),
            };
            let updated = db
                .user_set_rollout_state(rollout.id, from, to, reason.as_deref(), actor)
                .await
                .map_err(|e| UiError::from(e).json(json))?;
            format!("Rollout {id} is now {}.", updated.state)
        }
        Action::Rollback => {
            let reason =
                reason.ok_or_else(|| fail(StatusCode::UNPROCESSABLE_ENTITY, "a rollback needs a reason".into()))?;
            db.begin_rollback(None, rollout.id, json!({ "scope": "rollout" }), &reason, actor)
                .await
                .map_err(|e| UiError::from(e).json(json))?;
            format!("Rolling back rollout {id}.")
        }
    };
    state.nudge_engine();
    Ok(done(json, &back, &message).into_response())
}
