//! Releases with their qualification board, the audit log, the policy in
//! force and the user list.

use axum::Extension;
use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use minijinja::{Value, context};
use orchestrator_db::AuditFilter;
use orchestrator_types::{QualificationState, ReleaseId, TransitionRequest};
use serde::Deserialize;

use super::{UiError, base, confirm_page, confirmed, done, policy_summary, reasons, render, v, wants_json};
use crate::AppState;
use crate::auth::Principal;

/// A message left by the action that redirected here.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Flash {
    pub(crate) msg: Option<String>,
}

/// Releases per page of `/releases`.
const RELEASES_PER_PAGE: usize = 50;

/// `/releases`' filter and page.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ReleaseQuery {
    /// Only releases in this qualification state.
    state: Option<String>,
    /// 1-based.
    page: Option<usize>,
}

pub(crate) async fn releases(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
    Query(query): Query<ReleaseQuery>,
) -> Result<Response, UiError> {
    let wanted = match query.state.as_deref().filter(|s| !s.is_empty()) {
        Some(s) => Some(
            s.parse::<QualificationState>()
                .map_err(|e| UiError::new(StatusCode::BAD_REQUEST, e.to_string()))?,
        ),
        None => None,
    };
    let page = query.page.unwrap_or(1);
    if page == 0 {
        return Err(UiError::new(StatusCode::BAD_REQUEST, "page starts at 1"));
    }
    let matching: Vec<_> = state
        .db
        .list_releases()
        .await?
        .into_iter()
        .filter(|r| wanted.is_none_or(|w| r.qualification_state == w))
        .collect();
    let pages = matching.len().div_ceil(RELEASES_PER_PAGE).max(1);
    let shown = matching
        .into_iter()
        .skip((page - 1).saturating_mul(RELEASES_PER_PAGE))
        .take(RELEASES_PER_PAGE);
    // Gates are read for the page's releases only.
    let mut rows = Vec::new();
    for release in shown {
        let gates = state.db.gate_results(release.id).await?;
        let passed = gates.iter().filter(|g| g.passed).count();
        rows.push(context! {
            gates_passed => passed, gates_total => gates.len(),
            ..v(&release)
        });
    }
    let states: Vec<&str> = QualificationState::ALL.iter().map(|s| s.as_str()).collect();
    let filter = query.state.clone().unwrap_or_default();
    let link = |n: usize| {
        if filter.is_empty() {
            format!("/releases?page={n}")
        } else {
            format!("/releases?state={}&page={n}", crate::url::urlencode(&filter))
        }
    };
    Ok(render(
        "releases.html",
        context! {
            releases => rows, states, filter => filter.clone(), page, pages,
            prev => (page > 1).then(|| link(page - 1)), next => (page < pages).then(|| link(page + 1)),
            ..base(&me, "releases", "Releases")
        },
    ))
}

pub(crate) async fn release(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
    Path(id): Path<i64>,
    Query(flash): Query<Flash>,
) -> Result<Response, UiError> {
    let release = state.db.release(ReleaseId(id)).await?;
    let gates = state.db.gate_results(release.id).await?;
    let history = state
        .db
        .audit_entries(&AuditFilter {
            subject_type: Some("release".into()),
            subject_id: Some(id.to_string()),
            limit: Some(50),
            ..Default::default()
        })
        .await?;
    // What a person may ask for: fleet-proven is reached only when a rollout's soak passes.
    let states: Vec<&str> = QualificationState::ALL
        .iter()
        .filter(|s| **s != QualificationState::FleetProven)
        .map(|s| s.as_str())
        .collect();
    // The policies in force a rollout of this release could run under: the
    // ones targeting its component (the planner checks the rest).
    let policies: Vec<(String, String)> = state
        .db
        .policies_in_force()
        .await?
        .into_iter()
        .filter(|p| {
            orchestrator_policy::parse_policy(&p.version.content)
                .is_ok_and(|policy| policy.target.component == release.component_kind)
        })
        .map(|p| (p.version.name, p.version.commit_id))
        .collect();
    let title = format!("Release {}", release.version);
    let history = reasons::audit_rows(&state.db, &history).await?;
    let reason = reasons::reason_value(release.state_reason.as_deref());
    // A blocked release is refused by every rollout: offering to start one
    // would only lead to an error page.
    let blocked = release.qualification_state == QualificationState::Blocked;
    Ok(render(
        "release.html",
        context! {
            release => v(&release), reason, blocked, gates => v(&gates), history, states, policies,
            flash => flash.msg, ..base(&me, "releases", &title)
        },
    ))
}

/// Starting a rollout from the release page.
#[derive(Debug, Deserialize)]
pub(crate) struct StartForm {
    policy: String,
    #[serde(default)]
    seed: Option<String>,
    #[serde(default)]
    confirmed: Option<String>,
}

pub(crate) async fn start_rollout(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
    headers: HeaderMap,
    Path(id): Path<i64>,
    Form(form): Form<StartForm>,
) -> Result<Response, UiError> {
    let json = wants_json(&headers);
    let seed = match non_empty(form.seed) {
        None => None,
        Some(text) => Some(text.parse::<i64>().map_err(|_| {
            UiError::new(
                StatusCode::BAD_REQUEST,
                format!("the seed must be a whole number, not {text:?}"),
            )
            .json(json)
        })?),
    };
    // Without JavaScript the first post asks, as every action does; the
    // script confirms in a dialog and sends `confirmed=yes` at once.
    if !confirmed(form.confirmed.as_deref()) {
        let release = state
            .db
            .release(ReleaseId(id))
            .await
            .map_err(|e| UiError::from(e).json(json))?;
        let mut fields = std::collections::BTreeMap::from([("policy".to_owned(), form.policy.clone())]);
        if let Some(seed) = seed {
            fields.insert("seed".into(), seed.to_string());
        }
        return Ok(confirm_page(
            &me,
            "releases",
            "Start rollout",
            format!(
                "Plan and start a rollout of {} {} under policy {}? The first wave starts without further approval.",
                release.component_kind, release.version, form.policy
            ),
            format!("/releases/{id}/rollouts"),
            format!("/releases/{id}"),
            fields,
        ));
    }
    let body = crate::api::rollouts::StartBody {
        release_id: id,
        policy: Some(form.policy),
        policy_yaml: None,
        seed,
        allow_missing_series: false,
    };
    let (rollout, plan) = crate::api::rollouts::start_rollout_as(&state, body, &me.user.username)
        .await
        .map_err(|e| UiError::from(e).json(json))?;
    let location = format!("/rollouts/{}", rollout.id);
    // Nodes, not steps: a step is one component, eight per GPU node.
    let message = format!(
        "Rollout {} planned: {} wave(s), {} node(s), {} component update(s).",
        rollout.id,
        plan.waves.len(),
        plan.summary.planned,
        plan.summary.steps
    );
    if json {
        // The script stays on the release page: it shows the message with
        // a link to the new rollout rather than reloading without either.
        return Ok(axum::Json(serde_json::json!({ "message": message, "location": location })).into_response());
    }
    Ok(done(json, &location, &message))
}

/// A qualification transition from the release page.
#[derive(Debug, Deserialize)]
pub(crate) struct TransitionForm {
    to: String,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    confirmed: Option<String>,
}

pub(crate) async fn transition_release(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
    headers: HeaderMap,
    Path(id): Path<i64>,
    Form(form): Form<TransitionForm>,
) -> Result<Response, UiError> {
    let json = wants_json(&headers);
    let to: QualificationState = form.to.parse().map_err(|e: orchestrator_types::ParseEnumError| {
        UiError::new(StatusCode::BAD_REQUEST, e.to_string()).json(json)
    })?;
    if !confirmed(form.confirmed.as_deref()) {
        let release = state
            .db
            .release(ReleaseId(id))
            .await
            .map_err(|e| UiError::from(e).json(json))?;
        let mut fields = std::collections::BTreeMap::from([("to".to_owned(), to.as_str().to_owned())]);
        if let Some(reason) = &form.reason {
            fields.insert("reason".into(), reason.clone());
        }
        return Ok(confirm_page(
            &me,
            "releases",
            "Change qualification",
            format!(
                "Move {} {} from {} to {to}?",
                release.component_kind, release.version, release.qualification_state
            ),
            format!("/releases/{id}/transition"),
            format!("/releases/{id}"),
            fields,
        ));
    }
    let reason = form.reason.map(|r| r.trim().to_owned()).filter(|r| !r.is_empty());
    state
        .duties
        .check_transition(&state.db, ReleaseId(id), to, &me.user.username)
        .await
        .map_err(|e| UiError::from(e).json(json))?;
    let request = TransitionRequest { to, reason };
    let release = state
        .db
        .transition_release(ReleaseId(id), &request, &me.user.username)
        .await
        .map_err(|e| UiError::from(e).json(json))?;
    Ok(done(
        json,
        &format!("/releases/{id}"),
        &format!("Release {} is now {}.", release.version, release.qualification_state),
    ))
}

/// The audit log's filters, as query parameters.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct AuditQuery {
    actor: Option<String>,
    action: Option<String>,
    subject_type: Option<String>,
    subject_id: Option<String>,
    before: Option<i64>,
}

fn non_empty(value: Option<String>) -> Option<String> {
    value.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
}

/// Audit entries per page.
const AUDIT_PAGE: u64 = 100;

pub(crate) async fn audit(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
    Query(query): Query<AuditQuery>,
) -> Result<Response, UiError> {
    let filter = AuditFilter {
        actor: non_empty(query.actor),
        action: non_empty(query.action),
        subject_type: non_empty(query.subject_type),
        subject_id: non_empty(query.subject_id),
        before_id: query.before,
        limit: Some(AUDIT_PAGE),
        ..Default::default()
    };
    let entries = state.db.audit_entries(&filter).await?;
    let rows = reasons::audit_rows(&state.db, &entries).await?;
    // Decisions first: the page's approvals, promotions, halts and
    // qualification changes above the full log they also appear in.
    let decisions: Vec<Value> = rows
        .iter()
        .filter(|row| row.get_attr("decision").is_ok_and(|d| d.is_true()))
        .cloned()
        .collect();
    let next_before = (entries.len() as u64 == AUDIT_PAGE)
        .then(|| entries.last().map(|e| e.id))
        .flatten();
    let mut next_query = String::new();
    for (key, value) in [
        ("actor", &filter.actor),
        ("action", &filter.action),
        ("subject_type", &filter.subject_type),
        ("subject_id", &filter.subject_id),
    ] {
        if let Some(value) = value {
            next_query.push_str(&format!("{key}={}&", crate::url::urlencode(value)));
        }
    }
    if let Some(before) = next_before {
        next_query.push_str(&format!("before={before}"));
    }
    Ok(render(
        "audit.html",
        context! { entries => rows, decisions, filter => v(&filter), next_before, next_query, ..base(&me, "audit", "Audit log") },
    ))
}

pub(crate) async fn policies(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
) -> Result<Response, UiError> {
    let policies: Vec<Value> = state
        .db
        .policies_in_force()
        .await?
        .into_iter()
        .map(|p| {
            // A policy in force passed validation when it was synced; one
            // that no longer parses (a newer binary, stricter rules) still
            // shows its YAML, with the reason instead of a summary.
            let (summary, parse_error) = match orchestrator_policy::parse_policy(&p.version.content) {
                Ok(policy) => (policy_summary::summarise(&policy), None),
                Err(err) => (Value::from(()), Some(err.to_string())),
            };
            context! { summary, parse_error, ..v(&p) }
        })
        .collect();
    let sync = state
        .db
        .policy_sync_state()
        .await?
        .map(|s| context! { commit => s.commit_id, at => s.synced_at.format("%Y-%m-%d %H:%M UTC").to_string() });
    Ok(render(
        "policies.html",
        context! { policies, sync, ..base(&me, "policies", "Policy in force") },
    ))
}

pub(crate) async fn users(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
) -> Result<Response, UiError> {
    let users = state.db.list_users().await?;
    Ok(render(
        "users.html",
        context! { users => v(&users), ..base(&me, "users", "Users") },
    ))
}
