//! The wave decision: where an update wave goes next, as a pure function of
//! its facts. The executor gathers the facts (database reads, the judge's
//! verdict, the clock) and applies the returned action; nothing here reads
//! or writes anything, so every rule is a row of the table test
//! (`tests/wave_decisions.rs`), which enumerates every wave state × event.
//!
//! Rules worth knowing before changing one:
//! - a blocked release halts any open wave, whatever it is doing;
//! - waves after the canary start only once the release is qualified
//!   ([`orchestrator_types::qualification_hold`], the same rule the planner
//!   applies);
//! - a first wave with a pre-flash watch admits nothing before the watch ends;
//! - the bake is a minimum: before it ends only a Fail is acted on;
//! - after it, an Extend verdict (fleet-scale detection: the evidence does
//!   not yet rule out what must be caught) keeps the wave baking, up to
//!   `max_bake`, where the judge answers Hold and a human decides;
//! - an approval counts only for the state and verdict it was given under
//!   (the database refuses any other), so an approval never carries over to
//!   a verdict its approver did not read; promoting a wave whose verdict is
//!   not a pass is its own recorded decision, "promote anyway".

use chrono::{DateTime, Utc};
use orchestrator_db::execution::{Approval, approvals_needed, counted_approvals};
use orchestrator_policy::FailureBudget;
use orchestrator_types::{Blocker, Outcome, QualificationState, WaveState, WaveVerdict};

/// What the release's state says about the wave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseStanding {
    /// Nothing holds the wave back.
    Usable,
    /// The release is blocked (a regression or a human): the rollout halts.
    Blocked { reason: String },
    /// Not qualified (or required gates missing): only the canary may run.
    AwaitingQualification {
        state: QualificationState,
        missing_gates: Vec<String>,
    },
}

/// Everything the decision reads about one update wave, gathered by the
/// executor in one pass.
#[derive(Debug, Clone, PartialEq)]
pub struct WaveFacts {
    pub state: WaveState,
    /// 0 for the canary.
    pub position: i32,
    pub node_count: usize,
    pub now: DateTime<Utc>,
    pub release: ReleaseStanding,
    /// Steps that failed and steps not finished (running waves).
    pub failed_steps: u64,
    pub unfinished_steps: u64,
    pub failure_budget: FailureBudget,
    /// When the bake ends (baking waves).
    pub bake_ends_at: DateTime<Utc>,
    /// When an extended bake ends at the latest (the wave's `max_bake`; the bake's end when the
    /// policy sets none). Only fleet-scale detection extends a bake.
    pub max_bake_ends_at: DateTime<Utc>,
    /// Baking: the judge's verdict of this pass (`None` while it has nothing
    /// to say before the bake's end). Awaiting approval: the stored verdict.
    pub verdict: Option<WaveVerdict>,
    pub approvals_required: i32,
    pub approvals: Vec<Approval>,
    /// Deadlines of the wave's steps in flight, shown while it runs.
    pub step_deadlines: Vec<Blocker>,
    /// The first wave with a pre-flash watch (`detection.pre_period`): nothing is flashed before
    /// this instant, while the judge watches the wave's nodes and the controls.
    pub pre_flash_watch_until: Option<DateTime<Utc>>,
    /// The policy rolls back on a failed verdict (else it halts).
    pub rollback_automatic: bool,
}

/// How a wave left its bake, as recorded on the wave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Passed (and approved, where the policy asks for approvals).
    Promote,
    /// Promoted by people over a verdict that was not a pass.
    PromoteAnyway,
    /// Failed; the policy rolls back.
    Rollback,
    /// Failed or stopped; the rollout halts.
    Halt,
}

impl Decision {
    /// The recorded spelling (the wave's `decision` column).
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Promote => "promote",
            Decision::PromoteAnyway => "promote_anyway",
            Decision::Rollback => "rollback",
            Decision::Halt => "halt",
        }
    }
}

/// What the executor does to the wave this pass.
#[derive(Debug, Clone, PartialEq)]
pub enum WaveAction {
    /// Planned → running.
    Start,
    /// Admit pending steps under the caps; show what holds the rest back
    /// together with `blockers`.
    Admit { blockers: Vec<Blocker> },
    /// Running → baking: every step is done.
    StartBake,
    /// Nothing moves; show why.
    Wait { blockers: Vec<Blocker> },
    /// Halt the wave and the rollout.
    Halt { reason: String },
    /// Promote the wave; store `verdict` when it is new.
    Promote {
        decision: Decision,
        verdict: Option<WaveVerdict>,
        approvers: Vec<String>,
    },
    /// Baking → awaiting approval with the verdict people must read.
    AwaitApproval { verdict: WaveVerdict, need: i32 },
    /// Baking → halted on a failed verdict; then decide for the rollout.
    Failed {
        verdict: WaveVerdict,
        decision: Decision,
        reason: String,
    },
    /// The wave halted (maybe before a crash): decide for the rollout.
    FinishHalted,
    /// Closed: nothing to do.
    Nothing,
}

/// The next move of an update wave.
pub fn decide(facts: &WaveFacts) -> WaveAction {
    match facts.state {
        WaveState::Promoted | WaveState::RolledBack => return WaveAction::Nothing,
        // Halted while the rollout still runs: a crash may have come between
        // halting the wave and deciding for the rollout; decide again.
        WaveState::Halted => return WaveAction::FinishHalted,
        WaveState::Planned | WaveState::Running | WaveState::Baking | WaveState::AwaitingApproval => {}
    }
    if let ReleaseStanding::Blocked { reason } = &facts.release {
        return WaveAction::Halt { reason: reason.clone() };
    }
    match facts.state {
        WaveState::Planned => match &facts.release {
            ReleaseStanding::AwaitingQualification { state, missing_gates } if facts.position > 0 => WaveAction::Wait {
                blockers: vec![Blocker::AwaitingQualification {
                    state: state.to_string(),
                    missing_gates: missing_gates.clone(),
                }],
            },
            _ => WaveAction::Start,
        },
        WaveState::Running => {
            let failed = usize::try_from(facts.failed_steps).unwrap_or(usize::MAX);
            if facts.failure_budget.exceeded(failed, facts.node_count) {
                return WaveAction::Halt {
                    reason: format!(
                        "failure budget exceeded: {failed} of {} updates failed",
                        facts.node_count
                    ),
                };
            }
            if facts.unfinished_steps == 0 {
                return WaveAction::StartBake;
            }
            if let Some(until) = facts.pre_flash_watch_until.filter(|until| facts.now < *until) {
                return WaveAction::Wait {
                    blockers: vec![Blocker::PreFlashWatch { until }],
                };
            }
            WaveAction::Admit {
                blockers: facts.step_deadlines.clone(),
            }
        }
        WaveState::Baking => decide_baked(facts),
        WaveState::AwaitingApproval => decide_approval(facts),
        WaveState::Promoted | WaveState::Halted | WaveState::RolledBack => WaveAction::Nothing,
    }
}

fn decide_baked(facts: &WaveFacts) -> WaveAction {
    let bake_over = facts.now >= facts.bake_ends_at;
    let verdict = match &facts.verdict {
        // A regression is acted on at once, not at the bake's end.
        Some(v) if v.outcome == Outcome::Fail => {
            let decision = if facts.rollback_automatic {
                Decision::Rollback
            } else {
                Decision::Halt
            };
            return WaveAction::Failed {
                verdict: v.clone(),
                decision,
                reason: format!("health verdict failed: {}", v.summary),
            };
        }
        // The bake is a minimum: nothing but a Fail ends it early.
        _ if !bake_over => {
            return WaveAction::Wait {
                blockers: vec![Blocker::BakeEndsAt { at: facts.bake_ends_at }],
            };
        }
        // Fleet-scale detection keeps baking until the evidence is there; the judge turns an
        // extension past `max_bake` into a Hold, so this wait always ends.
        Some(v) if v.outcome == Outcome::Extend => {
            return WaveAction::Wait {
                blockers: vec![Blocker::BakeExtended {
                    until: facts.max_bake_ends_at,
                    waiting_on: v.summary.clone(),
                }],
            };
        }
        Some(v) => v.clone(),
        // The judge always answers at the bake's end; should it not, a
        // human decides rather than the wave passing on no evidence.
        None => WaveVerdict {
            outcome: Outcome::Error,
            summary: "the judge gave no verdict at the end of the bake".into(),
            evidence: serde_json::Value::Null,
        },
    };
    if verdict.outcome == Outcome::Pass && facts.approvals_required <= 0 {
        return WaveAction::Promote {
            decision: Decision::Promote,
            verdict: Some(verdict),
            approvers: Vec::new(),
        };
    }
    WaveAction::AwaitApproval {
        verdict,
        need: facts.approvals_required.max(1),
    }
}

fn decide_approval(facts: &WaveFacts) -> WaveAction {
    let counted = counted_approvals(&facts.approvals, facts.verdict.as_ref());
    let need = approvals_needed(facts.approvals_required);
    let have = u32::try_from(counted.len()).unwrap_or(u32::MAX);
    let pass = facts.verdict.as_ref().is_some_and(|v| v.outcome == Outcome::Pass);
    if have >= need {
        return WaveAction::Promote {
            decision: if pass {
                Decision::Promote
            } else {
                Decision::PromoteAnyway
            },
            verdict: None,
            approvers: counted.iter().map(|a| a.approver.clone()).collect(),
        };
    }
    let mut blockers = vec![Blocker::Approvals { have, need }];
    if let Some(v) = facts.verdict.as_ref().filter(|_| !pass) {
        blockers.push(Blocker::Verdict {
            verdict: v.outcome,
            summary: v.summary.clone(),
        });
    }
    WaveAction::Wait { blockers }
}
