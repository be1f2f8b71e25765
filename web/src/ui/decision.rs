//! The decision box at the top of a rollout's page: where the rollout
//! stands and why, in words; what is asked of a person (approve, promote
//! anyway on a hold, roll back, or nothing); what each choice does (the next
//! wave's nodes and share of the fleet, its gates with their thresholds and
//! the smallest regression they detect, its failure budget, whether rollback
//! is possible); and who may decide.
//!
//! Everything comes from records the page already loaded (the rollout, its
//! waves, their step counts and approvals) and from the rollout's pinned
//! policy; the datastore still decides when an approval is posted. Approval
//! is offered only where the datastore would take it: an active rollout
//! whose wave awaits approval after its verdict.

use std::collections::HashMap;

use minijinja::{Value, context};
use orchestrator_db::execution::{ExecRollout, ExecWave, RolloutState, WaveKind, WaveState};
use orchestrator_planner::power::{GateStatus, PowerOptions, WaveShape, gate_power};
use orchestrator_policy::{FailureBudget, Policy, RollbackScope, format_duration};
use orchestrator_types::{Outcome, Role, WaveId};

use super::{policy_summary, reasons};
use crate::auth::Principal;

/// One wave with what the page counted for it.
#[derive(Debug, Clone)]
pub(crate) struct WaveTally<'a> {
    pub wave: &'a ExecWave,
    pub succeeded: u64,
    pub failed: u64,
    pub done: u64,
    /// Who gave the approvals that count for the wave's present verdict.
    pub approvers: Vec<String>,
}

/// What the box is computed from.
pub(crate) struct Inputs<'a> {
    pub rollout: &'a ExecRollout,
    pub waves: &'a [WaveTally<'a>],
    /// The pinned policy; `None` when its text no longer parses.
    pub policy: Option<&'a Policy>,
    /// Nodes in the fleet (for a wave's share of it).
    pub fleet_nodes: u64,
    /// Whether the rollout can be rolled back, and why not.
    pub rollback_impossible: Option<&'a [String]>,
    /// What the rollout and its current wave wait on, in words.
    pub waiting: Vec<String>,
    /// What approving a wave takes out of service at once, by wave (the
    /// scheduler's capacity line), where the policy caps it.
    pub capacity: &'a HashMap<WaveId, String>,
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The update wave after `wave`, by position.
fn next_wave<'a>(waves: &'a [WaveTally<'a>], wave: &ExecWave) -> Option<&'a WaveTally<'a>> {
    waves
        .iter()
        .filter(|w| w.wave.kind == WaveKind::Update && w.wave.position > wave.position)
        .min_by_key(|w| w.wave.position)
}

/// The wave a person looks at: the rollback wave while rolling back, else
/// the first update wave not promoted.
fn current<'a>(waves: &'a [WaveTally<'a>]) -> Option<&'a WaveTally<'a>> {
    waves
        .iter()
        .rev()
        .find(|w| w.wave.kind == WaveKind::Rollback)
        .or_else(|| {
            waves
                .iter()
                .find(|w| w.wave.kind == WaveKind::Update && w.wave.state != WaveState::Promoted)
        })
}

/// Approvals the wave needs (a hold needs one even where the policy asks none).
fn approvals_needed(wave: &ExecWave) -> u64 {
    u64::try_from(wave.approvals_required.max(1)).unwrap_or(1)
}

fn budget_line(budget: FailureBudget, nodes: u64) -> String {
    match budget {
        FailureBudget::Count(_) => format!("Failure budget: {}.", policy_summary::budget(budget)),
        FailureBudget::Percent(p) => {
            let allowed = (nodes as f64 * p / 100.0).floor() as u64;
            format!(
                "Failure budget: {} ({} of its {nodes} nodes).",
                policy_summary::budget(budget),
                plural(allowed, "failure", "failures")
            )
        }
    }
}

/// What approving `wave` starts, line by line: the next wave's size and
/// share of the fleet, its gates, thresholds and detectable effects, its
/// failure budget, and whether it can be undone. Shared by the box and the
/// confirmation page, so both say the same.
pub(crate) fn approval_effects(inputs: &Inputs<'_>, wave: &ExecWave) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(verdict) = wave.verdict.as_ref().filter(|v| v.outcome != Outcome::Pass) {
        out.push(format!(
            "Records “promote anyway”: wave {} is promoted over its {} verdict ({}), as a decision of its own.",
            wave.name,
            verdict.outcome,
            reasons::plain(&verdict.summary)
        ));
    }
    let Some(next) = next_wave(inputs.waves, wave) else {
        out.push(format!(
            "Completes the rollout: {} is its last wave; no further node is flashed.",
            wave.name
        ));
        return out;
    };
    let next = next.wave;
    let nodes = u64::try_from(next.node_count).unwrap_or(0);
    let share = if inputs.fleet_nodes > 0 {
        format!(
            "{}% of the fleet's {} nodes",
            format_share(nodes, inputs.fleet_nodes),
            inputs.fleet_nodes
        )
    } else {
        "share of the fleet unknown".into()
    };
    out.push(format!(
        "Starts wave {}: {} ({share}), at most {} at a time, bake {}.",
        next.name,
        plural(nodes, "node", "nodes"),
        next.max_in_flight,
        chrono::TimeDelta::try_seconds(next.bake_seconds).map_or_else(|| "?".to_owned(), format_duration),
    ));
    match inputs.policy {
        None => out.push(format!(
            "Gates: {} (the pinned policy no longer parses, so no thresholds are shown).",
            if next.gates.is_empty() {
                "none".to_owned()
            } else {
                next.gates.join(", ")
            }
        )),
        Some(_) if next.gates.is_empty() => {
            out.push("No health gate watches it (no control cohort is left): only the failure budget stops it.".into())
        }
        Some(policy) => {
            let shape = WaveShape {
                name: next.name.clone(),
                canary_nodes: usize::try_from(next.node_count).unwrap_or(0),
                control_nodes: next.control_nodes.len(),
                no_control_reason: None,
                bake_seconds: next.bake_seconds,
                gates: next.gates.clone(),
            };
            for name in &next.gates {
                let Some(gate) = policy.health.gate(name) else {
                    out.push(format!("Gate {name}: not in the pinned policy."));
                    continue;
                };
                let power = gate_power(policy, &shape, gate, &PowerOptions::default());
                let detects = match (power.status, power.mde.as_ref().and_then(|m| m.ratio.or(m.shift))) {
                    (GateStatus::Ok, Some(v)) => format!(
                        "the smallest regression it detects with 80% power is {} ({}, {} control nodes)",
                        policy_summary::effect(gate, round2(v)),
                        if gate.baseline.is_some() {
                            "the baseline the policy states"
                        } else {
                            "default baselines"
                        },
                        next.control_nodes.len()
                    ),
                    (GateStatus::Ok, None) => "no regression is detectable with 80% power".into(),
                    _ => power
                        .note
                        .clone()
                        .unwrap_or_else(|| "its power cannot be computed".into()),
                };
                out.push(format!(
                    "Gate {name}: fails when proven worse than {}; must catch {}; {detects}.",
                    policy_summary::effect(gate, gate.min_effect),
                    policy_summary::effect(gate, gate.must_detect),
                ));
            }
        }
    }
    if let Some(policy) = inputs.policy {
        out.push(budget_line(policy.failure_budget, nodes));
    }
    out.push(match inputs.rollback_impossible {
        Some(reasons) => format!(
            "Rollback impossible: {}. A failure halts the rollout instead.",
            reasons.join("; ")
        ),
        None => match inputs.policy.map(|p| p.rollback) {
            Some(rollback) if rollback.automatic => format!(
                "Rollback possible, automatic on a failed gate ({}).",
                scope(rollback.scope)
            ),
            Some(rollback) => format!(
                "Rollback possible; on a failed gate the rollout halts and a person decides ({}).",
                scope(rollback.scope)
            ),
            None => "Rollback possible.".into(),
        },
    });
    out
}

fn scope(scope: RollbackScope) -> &'static str {
    match scope {
        RollbackScope::Wave => "the failing wave's nodes",
        RollbackScope::Rollout => "every node the rollout updated",
    }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// `part` of `whole` as a percentage with one decimal under 10%.
fn format_share(part: u64, whole: u64) -> String {
    let pct = part as f64 * 100.0 / whole.max(1) as f64;
    if pct < 10.0 {
        format!("{pct:.1}")
    } else {
        format!("{pct:.0}")
    }
}

fn is_author(rollout: &ExecRollout, who: &str) -> bool {
    rollout.created_by == who || rollout.created_by.strip_prefix("local-admin:") == Some(who)
}

/// The box as a template value.
pub(crate) fn decision_box(inputs: &Inputs<'_>, me: &Principal) -> Value {
    let rollout = inputs.rollout;
    let who = me.user.username.as_str();
    let can_act = me.user.role >= Role::ReleaseManager;
    let updated: u64 = inputs
        .waves
        .iter()
        .filter(|w| w.wave.kind == WaveKind::Update)
        .map(|w| w.succeeded)
        .sum();
    let reason = rollout.state_reason.as_deref().map(reasons::plain);
    let rollback_choice = || {
        let does = match inputs.rollback_impossible {
            Some(reasons) => vec![format!("Impossible: {}.", reasons.join("; "))],
            None => vec![format!(
                "Moves every node this rollout updated ({}) back to its previous version; needs a reason.",
                plural(updated, "node so far", "nodes so far")
            )],
        };
        context! { kind => "rollback", label => "Roll back", does, possible => inputs.rollback_impossible.is_none() }
    };
    let abort_choice = || {
        context! {
            kind => "abort", label => "Abort",
            does => vec!["No new flash starts; flashes in progress finish; updated nodes keep the new firmware and can still be rolled back."],
            possible => true,
        }
    };
    let mut asks = "none";
    let mut headline: String;
    let mut choices: Vec<Value> = Vec::new();
    let mut approve: Option<Value> = None;
    let mut who_decides: Vec<String> = Vec::new();
    match rollout.state {
        RolloutState::Completed => headline = "Completed: every wave was promoted. Nothing is left to decide.".into(),
        RolloutState::RolledBack => {
            headline = format!(
                "Rolled back{}. Nothing is left to decide on this rollout; its waves take no approvals.",
                reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default()
            );
        }
        RolloutState::RollingBack => {
            let back = current(inputs.waves).filter(|w| w.wave.kind == WaveKind::Rollback);
            headline = format!(
                "Rolling back{}{}. Its waves take no approvals.",
                reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default(),
                back.map(|w| format!(": {} of {} nodes restored", w.succeeded, w.wave.node_count))
                    .unwrap_or_default()
            );
        }
        RolloutState::Halted | RolloutState::Aborted => {
            let how = if rollout.state == RolloutState::Halted {
                "Halted"
            } else {
                "Aborted"
            };
            headline = format!(
                "{how}{}. No wave starts again and none takes approvals; {} keep the new firmware.",
                reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default(),
                plural(updated, "updated node", "updated nodes")
            );
            if updated > 0 && inputs.rollback_impossible.is_none() {
                asks = "rollback";
                headline.push_str(" A person decides whether to roll them back.");
                choices.push(rollback_choice());
                who_decides.push("Any release manager may roll back, with a reason.".into());
            }
        }
        RolloutState::Running | RolloutState::Paused => {
            let paused = if rollout.state == RolloutState::Paused {
                format!(
                    "Paused{}: no new flash starts until someone resumes it. ",
                    reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default()
                )
            } else {
                String::new()
            };
            headline = paused;
            match current(inputs.waves) {
                None => headline.push_str("Every wave is promoted."),
                Some(tally) => {
                    let wave = tally.wave;
                    match wave.state {
                        WaveState::AwaitingApproval => {
                            let need = approvals_needed(wave);
                            let counted: Vec<&String> = tally.approvers.iter().collect();
                            let have = counted.len() as u64;
                            let more = need.saturating_sub(have).max(1);
                            let then = next_wave(inputs.waves, wave)
                                .map(|n| format!("wave {} starts", n.wave.name))
                                .unwrap_or_else(|| "the rollout completes".into());
                            let pass = wave.verdict.as_ref().is_some_and(|v| v.outcome == Outcome::Pass);
                            if pass {
                                asks = "approve";
                                headline.push_str(&format!(
                                    "Wave {} passed its health verdict{}; it waits for {} before {then}.",
                                    wave.name,
                                    wave.verdict
                                        .as_ref()
                                        .map(|v| format!(" ({})", reasons::plain(&v.summary)))
                                        .unwrap_or_default(),
                                    plural(more, "more approval", "more approvals"),
                                ));
                            } else {
                                asks = "hold";
                                let verdict = wave.verdict.as_ref();
                                headline.push_str(&format!(
                                    "Wave {} is on hold: its verdict is {}{}. A person decides: promote anyway \
                                     (recorded as its own decision), roll back or abort.",
                                    wave.name,
                                    verdict.map_or("missing".to_owned(), |v| v.outcome.to_string()),
                                    verdict
                                        .map(|v| format!(" — {}", reasons::plain(&v.summary)))
                                        .unwrap_or_default(),
                                ));
                            }
                            let label = if pass {
                                format!("Approve {}", wave.name)
                            } else {
                                format!("Promote {} anyway", wave.name)
                            };
                            let does = approval_effects(inputs, wave);
                            let summary = does
                                .iter()
                                .find(|l| l.starts_with("Starts") || l.starts_with("Completes"))
                                .cloned();
                            choices.push(context! {
                                kind => if pass { "approve" } else { "promote_anyway" }, label, does, possible => true,
                            });
                            choices.push(rollback_choice());
                            choices.push(abort_choice());
                            who_decides.push(format!(
                                "Approvals: {have} of {need}{}. Any release manager except {}, who started this \
                                 rollout (two-person rule); each person approves once.",
                                if counted.is_empty() {
                                    String::new()
                                } else {
                                    format!(
                                        " (by {})",
                                        counted.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                                    )
                                },
                                rollout.created_by
                            ));
                            who_decides.push("Any release manager may roll back (with a reason) or abort.".into());
                            let note = if !can_act {
                                Some("You are a viewer: a release manager decides.".to_owned())
                            } else if is_author(rollout, who) {
                                Some(
                                    "You started this rollout: another release manager must approve (two-person rule)."
                                        .to_owned(),
                                )
                            } else if tally.approvers.iter().any(|a| a == who) {
                                Some("You approved this wave.".to_owned())
                            } else {
                                None
                            };
                            approve = Some(context! {
                                wave_id => wave.id.0, wave_name => wave.name.clone(), pass,
                                offer => note.is_none(), note, two_person => can_act && is_author(rollout, who),
                                label => if pass { format!("Approve {}", wave.name) } else { format!("Promote {} anyway", wave.name) },
                                summary,
                                capacity => inputs.capacity.get(&wave.id).cloned(),
                            });
                        }
                        WaveState::Baking => {
                            let ends = wave
                                .bake_started_at
                                .map(|t| t + chrono::TimeDelta::seconds(wave.bake_seconds))
                                .map(|t| format!(" when the bake ends {}", t.format("%Y-%m-%d %H:%M UTC")))
                                .unwrap_or_default();
                            headline.push_str(&format!(
                                "Wave {} is baking: {} updated, its health watched against {} control nodes. Its \
                                 verdict is due{ends}; nothing is asked until then (only a proven regression ends the \
                                 bake early).",
                                wave.name,
                                plural(tally.succeeded, "node", "nodes"),
                                wave.control_nodes.len()
                            ));
                        }
                        WaveState::Running => headline.push_str(&format!(
                            "Wave {} is updating: {} of {} nodes done, {} failed{}.",
                            wave.name,
                            tally.done,
                            wave.node_count,
                            tally.failed,
                            inputs
                                .policy
                                .map(|p| format!(" ({})", policy_summary::budget(p.failure_budget)))
                                .unwrap_or_default()
                        )),
                        WaveState::Planned => headline.push_str(&format!(
                            "Wave {} has not started{}.",
                            wave.name,
                            if inputs.waiting.is_empty() {
                                String::new()
                            } else {
                                format!(": waiting on {}", inputs.waiting.join("; "))
                            }
                        )),
                        WaveState::Promoted | WaveState::Halted | WaveState::RolledBack => {
                            headline.push_str(&format!("Wave {} is {}.", wave.name, wave.state));
                        }
                    }
                }
            }
        }
    }
    if !can_act && asks != "none" {
        who_decides.push("You are a viewer: a release manager decides.".into());
    }
    context! {
        asks, headline, choices, approve, who => who_decides,
        evidence => format!("/api/v1/rollouts/{}/evidence", rollout.id.0),
    }
}
