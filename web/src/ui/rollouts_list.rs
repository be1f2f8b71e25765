//! The rollouts list: per rollout its current wave, what it waits on, a
//! progress bar that tells the truth (a rolled-back rollout shows its
//! rollback, not a full bar), the reason it stopped, and whether it needs
//! the viewer's approval.

use std::collections::HashMap;

use axum::Extension;
use axum::extract::{Query, State};
use axum::response::Response;
use minijinja::{Value, context};
use orchestrator_db::execution::{ExecRollout, ExecWave, RolloutState, StepCounts, StepState, WaveKind, WaveState};
use orchestrator_types::Role;
use serde::Deserialize;

use super::fleet::{current_wave, waiting_on};
use super::{UiError, base, reasons, render, scheduler};
use crate::AppState;
use crate::auth::Principal;

/// Rollouts per page, newest first.
const ROLLOUTS_PER_PAGE: usize = 50;

/// The list's filters.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ListQuery {
    /// `mine`: only rollouts waiting on the viewer's approval.
    show: Option<String>,
    page: Option<usize>,
}

fn sum(counts: &StepCounts, pick: impl Fn(StepState) -> bool) -> u64 {
    counts.iter().filter(|(s, _)| pick(**s)).map(|(_, n)| n).sum()
}

/// Whether `who` may approve `wave` now: the wave waits for approvals in a
/// running rollout, `who` acts, is not the author (the two-person rule) and
/// has not approved it yet. Only what the datastore already says is used;
/// the datastore still decides when the approval is posted.
pub(crate) fn needs_approval_from(
    rollout: &ExecRollout,
    wave: &ExecWave,
    approvers: &[String],
    who: &str,
    role: Role,
) -> bool {
    rollout.state == RolloutState::Running
        && wave.kind == WaveKind::Update
        && wave.state == WaveState::AwaitingApproval
        && role >= Role::ReleaseManager
        && rollout.created_by != who
        && !approvers.iter().any(|a| a == who)
}

pub(crate) async fn list(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
    Query(query): Query<ListQuery>,
) -> Result<Response, UiError> {
    let db = &state.db;
    let only_mine = query.show.as_deref() == Some("mine");
    let mut rollouts = db.exec_rollouts().await?;
    rollouts.sort_by_key(|r| std::cmp::Reverse(r.id.0));
    let release_names: HashMap<_, _> = db
        .list_releases()
        .await?
        .into_iter()
        .map(|r| (r.id, format!("{} {}", r.component_kind, r.version)))
        .collect();
    let who = me.user.username.as_str();

    // "Needs my approval" has to look at every unfinished rollout; the rest
    // of the work is done for one page only.
    let mut rows = Vec::new();
    let mut mine_count = 0usize;
    let page = query.page.unwrap_or(1).max(1);
    let mut index = 0usize;
    for rollout in rollouts {
        let finished = matches!(
            rollout.state,
            RolloutState::Completed | RolloutState::RolledBack | RolloutState::Aborted
        );
        let waves = if finished && only_mine {
            Vec::new()
        } else {
            db.rollout_waves(rollout.id).await?
        };
        let wave = current_wave(&waves);
        let mine = match wave {
            Some(w) if !finished && w.state == WaveState::AwaitingApproval => {
                let approvers: Vec<String> = db.wave_approvals(w.id).await?.into_iter().map(|a| a.approver).collect();
                needs_approval_from(&rollout, w, &approvers, who, me.user.role)
            }
            _ => false,
        };
        mine_count += usize::from(mine);
        if only_mine && !mine {
            continue;
        }
        index += 1;
        if index <= (page - 1) * ROLLOUTS_PER_PAGE || index > page * ROLLOUTS_PER_PAGE {
            continue;
        }
        rows.push(row(&state, &rollout, &waves, wave, mine, &release_names).await?);
    }
    let pages = index.div_ceil(ROLLOUTS_PER_PAGE).max(1);
    Ok(render(
        "rollouts.html",
        context! {
            rollouts => rows, mine_count, only_mine, page, pages, alerts => scheduler::banners(&state),
            prev => (page > 1).then(|| page - 1), next => (page < pages).then(|| page + 1),
            ..base(&me, "rollouts", "Rollouts")
        },
    ))
}

/// Why a rollout stopped: its own reason, or (once a rollback finished and
/// the rollout's reason moved on) the reason its failed wave was halted.
fn stop_reason<'a>(rollout: &'a ExecRollout, waves: &'a [ExecWave]) -> Option<&'a str> {
    rollout.state_reason.as_deref().or_else(|| {
        waves
            .iter()
            .filter(|w| w.kind == WaveKind::Update && matches!(w.state, WaveState::Halted | WaveState::RolledBack))
            .find_map(|w| w.state_reason.as_deref())
    })
}

async fn row(
    state: &AppState,
    rollout: &ExecRollout,
    waves: &[ExecWave],
    wave: Option<&ExecWave>,
    mine: bool,
    release_names: &HashMap<orchestrator_types::ReleaseId, String>,
) -> Result<Value, UiError> {
    let db = &state.db;
    // Update and rollback steps apart: counting both as one bar is what made
    // a rolled-back rollout look complete.
    let mut updated = 0u64;
    let mut update_failed = 0u64;
    let mut update_total = 0u64;
    let mut rollback = None;
    for w in waves {
        let counts = db.step_counts(rollout.id, Some(w.id)).await?;
        let all: u64 = counts.values().sum();
        match w.kind {
            WaveKind::Update => {
                update_total += all;
                updated += sum(&counts, |s| matches!(s, StepState::Succeeded | StepState::Skipped));
                update_failed += sum(&counts, |s| s == StepState::Failed);
            }
            WaveKind::Rollback => {
                let restored = sum(&counts, |s| s == StepState::Succeeded);
                let failed = sum(&counts, |s| s == StepState::Failed);
                rollback = Some(context! {
                    restored, failed, total => all,
                    percent => (restored * 100).checked_div(all).unwrap_or(0),
                    failed_percent => (failed * 100).checked_div(all).unwrap_or(0),
                });
            }
        }
    }
    if waves.is_empty() {
        let counts = db.step_counts(rollout.id, None).await?;
        update_total = counts.values().sum();
        updated = sum(&counts, |s| matches!(s, StepState::Succeeded | StepState::Skipped));
        update_failed = sum(&counts, |s| s == StepState::Failed);
    }
    let promoted = waves
        .iter()
        .filter(|w| w.kind == WaveKind::Update && w.state == WaveState::Promoted)
        .count();
    let update_waves = waves.iter().filter(|w| w.kind == WaveKind::Update).count();
    let finished = matches!(
        rollout.state,
        RolloutState::Completed | RolloutState::RolledBack | RolloutState::Aborted
    );
    Ok(context! {
        id => rollout.id.0, state => rollout.state.as_str(),
        release => release_names.get(&rollout.release_id).cloned().unwrap_or_default(),
        policy_name => rollout.policy_name.clone(), policy_commit => rollout.policy_commit.clone(),
        created_at => rollout.created_at.to_rfc3339(), created_by => rollout.created_by.clone(),
        wave => wave.map(|w| context! { name => w.name.clone(), state => w.state.as_str(), kind => w.kind.as_str() }),
        promoted, update_waves,
        waiting_on => if finished { Vec::new() } else { waiting_on(rollout, wave) },
        reason => reasons::reason_value(stop_reason(rollout, waves)),
        updated, update_failed, update_total,
        percent => (updated * 100).checked_div(update_total).unwrap_or(0),
        failed_percent => (update_failed * 100).checked_div(update_total).unwrap_or(0),
        rollback, mine,
    })
}
