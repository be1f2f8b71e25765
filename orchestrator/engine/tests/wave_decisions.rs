//! The wave decision table: every wave state × every event, and what the
//! pure decision does with it. A pair missing from the table fails the test,
//! so a new state or event must come with its rows.

use chrono::{DateTime, Duration, TimeZone, Utc};
use orchestrator_db::execution::Approval;
use orchestrator_engine::wave::{Decision, ReleaseStanding, WaveAction, WaveFacts, decide};
use orchestrator_policy::FailureBudget;
use orchestrator_types::{Blocker, Outcome, QualificationState, StepState, WaveId, WaveState, WaveVerdict};

/// What happened since the last pass, as a change to a quiet wave's facts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// Nothing: steps in flight, bake not over, nobody approved.
    Quiet,
    /// The release was blocked.
    ReleaseBlocked,
    /// The release is not qualified for waves past the canary.
    Unqualified,
    /// The same, for the canary itself.
    UnqualifiedCanary,
    /// A step in flight has a deadline coming.
    StepDeadline,
    /// Every step finished.
    StepsDone,
    /// More steps failed than the budget allows.
    BudgetExceeded,
    /// The judge found a regression before the bake's end.
    EarlyFail,
    /// The judge has no decision yet, before the bake's end.
    EarlyInconclusive,
    /// Bake over, verdict pass, no approval required.
    BakedPass,
    /// Bake over, verdict pass, an approval required.
    BakedPassNeedsApproval,
    BakedInconclusive,
    BakedError,
    BakedFail,
    /// Bake over and the judge said nothing.
    BakedNoVerdict,
    /// Approved after reading the verdict the wave has (inconclusive).
    ApprovedHold,
    /// Approved after reading a pass.
    ApprovedPass,
    /// An approval given while the wave still ran (stored by an older version).
    ApprovedEarly,
    /// An approval given under another verdict than the wave's.
    ApprovedOtherVerdict,
    /// Fleet-scale detection before the bake's end: not enough evidence yet.
    EarlyExtend,
    /// Bake over, the evidence does not yet rule out `must_detect`: extend.
    BakedExtend,
    /// `max_bake` reached without enough evidence: hold for a human.
    BakedHold,
    /// Approved after reading a hold's statement.
    ApprovedOverHold,
    /// The first wave's pre-flash watch (`detection.pre_period`) has not ended.
    PreFlashWatch,
    /// The first wave's pre-flash watch is over.
    PreFlashWatchOver,
}

impl Event {
    const ALL: [Event; 25] = [
        Event::Quiet,
        Event::ReleaseBlocked,
        Event::Unqualified,
        Event::UnqualifiedCanary,
        Event::StepDeadline,
        Event::StepsDone,
        Event::BudgetExceeded,
        Event::EarlyFail,
        Event::EarlyInconclusive,
        Event::BakedPass,
        Event::BakedPassNeedsApproval,
        Event::BakedInconclusive,
        Event::BakedError,
        Event::BakedFail,
        Event::BakedNoVerdict,
        Event::ApprovedHold,
        Event::ApprovedPass,
        Event::ApprovedEarly,
        Event::ApprovedOtherVerdict,
        Event::EarlyExtend,
        Event::BakedExtend,
        Event::BakedHold,
        Event::ApprovedOverHold,
        Event::PreFlashWatch,
        Event::PreFlashWatchOver,
    ];
}

/// The action's kind, which is what the table states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Start,
    Admit,
    AdmitShowingDeadline,
    StartBake,
    WaitQualification,
    WaitBake,
    WaitExtended,
    WaitApprovals,
    WaitApprovalsAndVerdict,
    WaitPreFlashWatch,
    Halt,
    Promote,
    PromoteAnyway,
    AwaitApproval,
    Rollback,
    FinishHalted,
    Nothing,
}

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 4, 12, 0, 0).unwrap()
}

fn verdict(outcome: Outcome) -> WaveVerdict {
    WaveVerdict {
        outcome,
        summary: format!("gates: {outcome}"),
        evidence: serde_json::json!({ "gates": [] }),
    }
}

fn approval(state: WaveState, outcome: Outcome) -> Approval {
    Approval {
        wave_id: WaveId(1),
        approver: "bob".into(),
        comment: None,
        approved_at: now(),
        wave_state: Some(state),
        verdict_outcome: Some(outcome),
    }
}

fn facts(state: WaveState, event: Event) -> WaveFacts {
    let mut f = WaveFacts {
        state,
        position: 1,
        node_count: 10,
        now: now(),
        release: ReleaseStanding::Usable,
        failed_steps: 0,
        unfinished_steps: 4,
        failure_budget: FailureBudget::Count(1),
        bake_ends_at: now() + Duration::hours(1),
        max_bake_ends_at: now() + Duration::hours(3),
        verdict: None,
        approvals_required: 1,
        approvals: Vec::new(),
        step_deadlines: Vec::new(),
        pre_flash_watch_until: None,
        rollback_automatic: true,
    };
    // Awaiting approval, the stored verdict is an inconclusive one unless
    // the event says otherwise.
    if state == WaveState::AwaitingApproval {
        f.verdict = Some(verdict(Outcome::Inconclusive));
    }
    let baked = |f: &mut WaveFacts, outcome: Option<Outcome>| {
        f.bake_ends_at = now() - Duration::minutes(1);
        if state != WaveState::AwaitingApproval {
            f.verdict = outcome.map(verdict);
        }
    };
    match event {
        Event::Quiet => {}
        Event::ReleaseBlocked => {
            f.release = ReleaseStanding::Blocked {
                reason: "release 3 is blocked: xid regression".into(),
            }
        }
        Event::Unqualified | Event::UnqualifiedCanary => {
            f.release = ReleaseStanding::AwaitingQualification {
                state: QualificationState::Qualifying,
                missing_gates: vec!["burn-in".into()],
            };
            if event == Event::UnqualifiedCanary {
                f.position = 0;
            }
        }
        Event::StepDeadline => {
            f.step_deadlines = vec![Blocker::StepDeadline {
                state: StepState::Flashing,
                nodes: 2,
                at: now() + Duration::minutes(30),
            }]
        }
        Event::StepsDone => f.unfinished_steps = 0,
        Event::BudgetExceeded => f.failed_steps = 2,
        Event::EarlyFail => f.verdict = Some(verdict(Outcome::Fail)),
        Event::EarlyInconclusive => {
            if state != WaveState::AwaitingApproval {
                f.verdict = Some(verdict(Outcome::Inconclusive))
            }
        }
        Event::BakedPass => {
            f.approvals_required = 0;
            baked(&mut f, Some(Outcome::Pass));
        }
        Event::BakedPassNeedsApproval => baked(&mut f, Some(Outcome::Pass)),
        Event::BakedInconclusive => baked(&mut f, Some(Outcome::Inconclusive)),
        Event::BakedError => baked(&mut f, Some(Outcome::Error)),
        Event::BakedFail => {
            baked(&mut f, None);
            f.verdict = Some(verdict(Outcome::Fail));
        }
        Event::BakedNoVerdict => baked(&mut f, None),
        Event::ApprovedHold => f.approvals = vec![approval(WaveState::AwaitingApproval, Outcome::Inconclusive)],
        Event::ApprovedPass => {
            f.verdict = Some(verdict(Outcome::Pass));
            f.approvals = vec![approval(WaveState::AwaitingApproval, Outcome::Pass)];
        }
        Event::ApprovedEarly => f.approvals = vec![approval(WaveState::Running, Outcome::Inconclusive)],
        Event::ApprovedOtherVerdict => f.approvals = vec![approval(WaveState::AwaitingApproval, Outcome::Pass)],
        Event::EarlyExtend => {
            if state != WaveState::AwaitingApproval {
                f.verdict = Some(verdict(Outcome::Extend))
            }
        }
        Event::BakedExtend => baked(&mut f, Some(Outcome::Extend)),
        Event::BakedHold => baked(&mut f, Some(Outcome::Hold)),
        Event::ApprovedOverHold => {
            f.verdict = Some(verdict(Outcome::Hold));
            f.approvals = vec![approval(WaveState::AwaitingApproval, Outcome::Hold)];
        }
        Event::PreFlashWatch | Event::PreFlashWatchOver => {
            f.position = 0;
            let minutes = if event == Event::PreFlashWatch { 30 } else { -1 };
            f.pre_flash_watch_until = Some(now() + Duration::minutes(minutes));
        }
    }
    f
}

fn kind(action: &WaveAction) -> Want {
    match action {
        WaveAction::Start => Want::Start,
        WaveAction::Admit { blockers } if blockers.is_empty() => Want::Admit,
        WaveAction::Admit { .. } => Want::AdmitShowingDeadline,
        WaveAction::StartBake => Want::StartBake,
        WaveAction::Wait { blockers } => match blockers.as_slice() {
            [Blocker::AwaitingQualification { .. }] => Want::WaitQualification,
            [Blocker::BakeEndsAt { .. }] => Want::WaitBake,
            [Blocker::BakeExtended { .. }] => Want::WaitExtended,
            [Blocker::Approvals { .. }] => Want::WaitApprovals,
            [Blocker::Approvals { .. }, Blocker::Verdict { .. }] => Want::WaitApprovalsAndVerdict,
            [Blocker::PreFlashWatch { .. }] => Want::WaitPreFlashWatch,
            other => panic!("unexpected blockers {other:?}"),
        },
        WaveAction::Halt { .. } => Want::Halt,
        WaveAction::Promote {
            decision: Decision::Promote,
            ..
        } => Want::Promote,
        WaveAction::Promote {
            decision: Decision::PromoteAnyway,
            ..
        } => Want::PromoteAnyway,
        WaveAction::Promote { decision, .. } => panic!("promoted with decision {decision:?}"),
        WaveAction::AwaitApproval { .. } => Want::AwaitApproval,
        WaveAction::Failed {
            decision: Decision::Rollback,
            ..
        } => Want::Rollback,
        WaveAction::Failed { decision, .. } => panic!("failed with decision {decision:?}"),
        WaveAction::FinishHalted => Want::FinishHalted,
        WaveAction::Nothing => Want::Nothing,
    }
}

use Event as E;
use Want as W;
use WaveState as S;

/// Every wave state × event. Closed states ignore everything; a blocked
/// release halts any open wave; the rest is per state.
#[rustfmt::skip]
const TABLE: &[(S, E, W)] = &[
    (S::Planned, E::Quiet, W::Start),
    (S::Planned, E::ReleaseBlocked, W::Halt),
    (S::Planned, E::Unqualified, W::WaitQualification),
    (S::Planned, E::UnqualifiedCanary, W::Start),
    (S::Planned, E::StepDeadline, W::Start),
    (S::Planned, E::StepsDone, W::Start),
    (S::Planned, E::BudgetExceeded, W::Start),
    (S::Planned, E::EarlyFail, W::Start),
    (S::Planned, E::EarlyInconclusive, W::Start),
    (S::Planned, E::BakedPass, W::Start),
    (S::Planned, E::BakedPassNeedsApproval, W::Start),
    (S::Planned, E::BakedInconclusive, W::Start),
    (S::Planned, E::BakedError, W::Start),
    (S::Planned, E::BakedFail, W::Start),
    (S::Planned, E::BakedNoVerdict, W::Start),
    (S::Planned, E::ApprovedHold, W::Start),
    (S::Planned, E::ApprovedPass, W::Start),
    (S::Planned, E::ApprovedEarly, W::Start),
    (S::Planned, E::ApprovedOtherVerdict, W::Start),
    (S::Planned, E::EarlyExtend, W::Start),
    (S::Planned, E::BakedExtend, W::Start),
    (S::Planned, E::BakedHold, W::Start),
    (S::Planned, E::ApprovedOverHold, W::Start),
    (S::Planned, E::PreFlashWatch, W::Start),
    (S::Planned, E::PreFlashWatchOver, W::Start),

    (S::Running, E::Quiet, W::Admit),
    (S::Running, E::ReleaseBlocked, W::Halt),
    // Qualification is asked before a wave starts, not while it runs.
    (S::Running, E::Unqualified, W::Admit),
    (S::Running, E::UnqualifiedCanary, W::Admit),
    (S::Running, E::StepDeadline, W::AdmitShowingDeadline),
    (S::Running, E::StepsDone, W::StartBake),
    (S::Running, E::BudgetExceeded, W::Halt),
    (S::Running, E::EarlyFail, W::Admit),
    (S::Running, E::EarlyInconclusive, W::Admit),
    (S::Running, E::BakedPass, W::Admit),
    (S::Running, E::BakedPassNeedsApproval, W::Admit),
    (S::Running, E::BakedInconclusive, W::Admit),
    (S::Running, E::BakedError, W::Admit),
    (S::Running, E::BakedFail, W::Admit),
    (S::Running, E::BakedNoVerdict, W::Admit),
    (S::Running, E::ApprovedHold, W::Admit),
    (S::Running, E::ApprovedPass, W::Admit),
    (S::Running, E::ApprovedEarly, W::Admit),
    (S::Running, E::ApprovedOtherVerdict, W::Admit),
    (S::Running, E::EarlyExtend, W::Admit),
    (S::Running, E::BakedExtend, W::Admit),
    (S::Running, E::BakedHold, W::Admit),
    (S::Running, E::ApprovedOverHold, W::Admit),
    // The first wave flashes nothing until its pre-flash watch is over.
    (S::Running, E::PreFlashWatch, W::WaitPreFlashWatch),
    (S::Running, E::PreFlashWatchOver, W::Admit),

    (S::Baking, E::Quiet, W::WaitBake),
    (S::Baking, E::ReleaseBlocked, W::Halt),
    (S::Baking, E::Unqualified, W::WaitBake),
    (S::Baking, E::UnqualifiedCanary, W::WaitBake),
    (S::Baking, E::StepDeadline, W::WaitBake),
    (S::Baking, E::StepsDone, W::WaitBake),
    (S::Baking, E::BudgetExceeded, W::WaitBake),
    // The bake is a minimum: only a regression ends it early.
    (S::Baking, E::EarlyFail, W::Rollback),
    (S::Baking, E::EarlyInconclusive, W::WaitBake),
    (S::Baking, E::BakedPass, W::Promote),
    (S::Baking, E::BakedPassNeedsApproval, W::AwaitApproval),
    (S::Baking, E::BakedInconclusive, W::AwaitApproval),
    (S::Baking, E::BakedError, W::AwaitApproval),
    (S::Baking, E::BakedFail, W::Rollback),
    (S::Baking, E::BakedNoVerdict, W::AwaitApproval),
    // Approvals given before the verdict never promote a baking wave.
    (S::Baking, E::ApprovedHold, W::WaitBake),
    (S::Baking, E::ApprovedPass, W::WaitBake),
    (S::Baking, E::ApprovedEarly, W::WaitBake),
    (S::Baking, E::ApprovedOtherVerdict, W::WaitBake),
    // Fleet-scale detection: the bake extends on the data, up to max_bake; a hold is a human's.
    (S::Baking, E::EarlyExtend, W::WaitBake),
    (S::Baking, E::BakedExtend, W::WaitExtended),
    (S::Baking, E::BakedHold, W::AwaitApproval),
    (S::Baking, E::ApprovedOverHold, W::WaitBake),
    (S::Baking, E::PreFlashWatch, W::WaitBake),
    (S::Baking, E::PreFlashWatchOver, W::WaitBake),

    (S::AwaitingApproval, E::Quiet, W::WaitApprovalsAndVerdict),
    (S::AwaitingApproval, E::ReleaseBlocked, W::Halt),
    (S::AwaitingApproval, E::Unqualified, W::WaitApprovalsAndVerdict),
    (S::AwaitingApproval, E::UnqualifiedCanary, W::WaitApprovalsAndVerdict),
    (S::AwaitingApproval, E::StepDeadline, W::WaitApprovalsAndVerdict),
    (S::AwaitingApproval, E::StepsDone, W::WaitApprovalsAndVerdict),
    (S::AwaitingApproval, E::BudgetExceeded, W::WaitApprovalsAndVerdict),
    (S::AwaitingApproval, E::EarlyFail, W::WaitApprovalsAndVerdict),
    (S::AwaitingApproval, E::EarlyInconclusive, W::WaitApprovalsAndVerdict),
    (S::AwaitingApproval, E::BakedPass, W::WaitApprovalsAndVerdict),
    (S::AwaitingApproval, E::BakedPassNeedsApproval, W::WaitApprovalsAndVerdict),
    (S::AwaitingApproval, E::BakedInconclusive, W::WaitApprovalsAndVerdict),
    (S::AwaitingApproval, E::BakedError, W::WaitApprovalsAndVerdict),
    (S::AwaitingApproval, E::BakedFail, W::WaitApprovalsAndVerdict),
    (S::AwaitingApproval, E::BakedNoVerdict, W::WaitApprovalsAndVerdict),
    // Holding on an inconclusive verdict, approved by someone who read it:
    // its own decision.
    (S::AwaitingApproval, E::ApprovedHold, W::PromoteAnyway),
    (S::AwaitingApproval, E::ApprovedPass, W::Promote),
    // Never counted: given before the verdict, or under another one.
    (S::AwaitingApproval, E::ApprovedEarly, W::WaitApprovalsAndVerdict),
    (S::AwaitingApproval, E::ApprovedOtherVerdict, W::WaitApprovalsAndVerdict),
    // A hold approved by someone who read its statement: promote anyway, recorded.
    (S::AwaitingApproval, E::EarlyExtend, W::WaitApprovalsAndVerdict),
    (S::AwaitingApproval, E::BakedExtend, W::WaitApprovalsAndVerdict),
    (S::AwaitingApproval, E::BakedHold, W::WaitApprovalsAndVerdict),
    (S::AwaitingApproval, E::ApprovedOverHold, W::PromoteAnyway),
    (S::AwaitingApproval, E::PreFlashWatch, W::WaitApprovalsAndVerdict),
    (S::AwaitingApproval, E::PreFlashWatchOver, W::WaitApprovalsAndVerdict),

    (S::Promoted, E::Quiet, W::Nothing),
    (S::Promoted, E::ReleaseBlocked, W::Nothing),
    (S::Promoted, E::Unqualified, W::Nothing),
    (S::Promoted, E::UnqualifiedCanary, W::Nothing),
    (S::Promoted, E::StepDeadline, W::Nothing),
    (S::Promoted, E::StepsDone, W::Nothing),
    (S::Promoted, E::BudgetExceeded, W::Nothing),
    (S::Promoted, E::EarlyFail, W::Nothing),
    (S::Promoted, E::EarlyInconclusive, W::Nothing),
    (S::Promoted, E::BakedPass, W::Nothing),
    (S::Promoted, E::BakedPassNeedsApproval, W::Nothing),
    (S::Promoted, E::BakedInconclusive, W::Nothing),
    (S::Promoted, E::BakedError, W::Nothing),
    (S::Promoted, E::BakedFail, W::Nothing),
    (S::Promoted, E::BakedNoVerdict, W::Nothing),
    (S::Promoted, E::ApprovedHold, W::Nothing),
    (S::Promoted, E::ApprovedPass, W::Nothing),
    (S::Promoted, E::ApprovedEarly, W::Nothing),
    (S::Promoted, E::ApprovedOtherVerdict, W::Nothing),
    (S::Promoted, E::EarlyExtend, W::Nothing),
    (S::Promoted, E::BakedExtend, W::Nothing),
    (S::Promoted, E::BakedHold, W::Nothing),
    (S::Promoted, E::ApprovedOverHold, W::Nothing),
    (S::Promoted, E::PreFlashWatch, W::Nothing),
    (S::Promoted, E::PreFlashWatchOver, W::Nothing),

    // A halted wave decides for its rollout (roll back or halt), whatever else happened.
    (S::Halted, E::Quiet, W::FinishHalted),
    (S::Halted, E::ReleaseBlocked, W::FinishHalted),
    (S::Halted, E::Unqualified, W::FinishHalted),
    (S::Halted, E::UnqualifiedCanary, W::FinishHalted),
    (S::Halted, E::StepDeadline, W::FinishHalted),
    (S::Halted, E::StepsDone, W::FinishHalted),
    (S::Halted, E::BudgetExceeded, W::FinishHalted),
    (S::Halted, E::EarlyFail, W::FinishHalted),
    (S::Halted, E::EarlyInconclusive, W::FinishHalted),
    (S::Halted, E::BakedPass, W::FinishHalted),
    (S::Halted, E::BakedPassNeedsApproval, W::FinishHalted),
    (S::Halted, E::BakedInconclusive, W::FinishHalted),
    (S::Halted, E::BakedError, W::FinishHalted),
    (S::Halted, E::BakedFail, W::FinishHalted),
    (S::Halted, E::BakedNoVerdict, W::FinishHalted),
    (S::Halted, E::ApprovedHold, W::FinishHalted),
    (S::Halted, E::ApprovedPass, W::FinishHalted),
    (S::Halted, E::ApprovedEarly, W::FinishHalted),
    (S::Halted, E::ApprovedOtherVerdict, W::FinishHalted),
    (S::Halted, E::EarlyExtend, W::FinishHalted),
    (S::Halted, E::BakedExtend, W::FinishHalted),
    (S::Halted, E::BakedHold, W::FinishHalted),
    (S::Halted, E::ApprovedOverHold, W::FinishHalted),
    (S::Halted, E::PreFlashWatch, W::FinishHalted),
    (S::Halted, E::PreFlashWatchOver, W::FinishHalted),

    (S::RolledBack, E::Quiet, W::Nothing),
    (S::RolledBack, E::ReleaseBlocked, W::Nothing),
    (S::RolledBack, E::Unqualified, W::Nothing),
    (S::RolledBack, E::UnqualifiedCanary, W::Nothing),
    (S::RolledBack, E::StepDeadline, W::Nothing),
    (S::RolledBack, E::StepsDone, W::Nothing),
    (S::RolledBack, E::BudgetExceeded, W::Nothing),
    (S::RolledBack, E::EarlyFail, W::Nothing),
    (S::RolledBack, E::EarlyInconclusive, W::Nothing),
    (S::RolledBack, E::BakedPass, W::Nothing),
    (S::RolledBack, E::BakedPassNeedsApproval, W::Nothing),
    (S::RolledBack, E::BakedInconclusive, W::Nothing),
    (S::RolledBack, E::BakedError, W::Nothing),
    (S::RolledBack, E::BakedFail, W::Nothing),
    (S::RolledBack, E::BakedNoVerdict, W::Nothing),
    (S::RolledBack, E::ApprovedHold, W::Nothing),
    (S::RolledBack, E::ApprovedPass, W::Nothing),
    (S::RolledBack, E::ApprovedEarly, W::Nothing),
    (S::RolledBack, E::ApprovedOtherVerdict, W::Nothing),
    (S::RolledBack, E::EarlyExtend, W::Nothing),
    (S::RolledBack, E::BakedExtend, W::Nothing),
    (S::RolledBack, E::BakedHold, W::Nothing),
    (S::RolledBack, E::ApprovedOverHold, W::Nothing),
    (S::RolledBack, E::PreFlashWatch, W::Nothing),
    (S::RolledBack, E::PreFlashWatchOver, W::Nothing),
];

#[test]
fn every_wave_state_and_event_is_decided_as_the_table_says() {
    let mut failures = Vec::new();
    for state in WaveState::ALL {
        for event in Event::ALL {
            let Some((_, _, want)) = TABLE.iter().find(|(s, e, _)| *s == state && *e == event) else {
                failures.push(format!("({state}, {event:?}) is not in the table"));
                continue;
            };
            let action = decide(&facts(state, event));
            let got = kind(&action);
            if got != *want {
                failures.push(format!("({state}, {event:?}): want {want:?}, got {got:?} ({action:?})"));
            }
        }
    }
    let mut pairs: Vec<(S, E)> = TABLE.iter().map(|(s, e, _)| (*s, *e)).collect();
    pairs.sort_by_key(|(s, e)| (s.as_str(), *e));
    let before = pairs.len();
    pairs.dedup();
    assert_eq!(before, pairs.len(), "a pair is listed twice");
    assert_eq!(
        TABLE.len(),
        WaveState::ALL.len() * Event::ALL.len(),
        "the table covers exactly every pair"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Issue 24's defect: an approval given while the wave still flashed was
/// counted later and promoted a wave whose verdict needed a human. Now only
/// approvals given while it awaits one, under the verdict it has, count.
#[test]
fn an_early_approval_never_promotes_a_held_wave() {
    let mut f = facts(WaveState::AwaitingApproval, Event::ApprovedEarly);
    f.verdict = Some(verdict(Outcome::Error));
    f.approvals = vec![
        approval(WaveState::Running, Outcome::Error),
        approval(WaveState::Baking, Outcome::Error),
        approval(WaveState::AwaitingApproval, Outcome::Inconclusive),
    ];
    match decide(&f) {
        WaveAction::Wait { blockers } => {
            assert_eq!(blockers[0], Blocker::Approvals { have: 0, need: 1 });
            assert!(matches!(
                blockers[1],
                Blocker::Verdict {
                    verdict: Outcome::Error,
                    ..
                }
            ));
        }
        other => panic!("promoted on approvals nobody gave for this verdict: {other:?}"),
    }
    f.approvals.push(approval(WaveState::AwaitingApproval, Outcome::Error));
    match decide(&f) {
        WaveAction::Promote {
            decision, approvers, ..
        } => {
            assert_eq!(decision, Decision::PromoteAnyway);
            assert_eq!(approvers, ["bob"]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_failed_verdict_halts_when_the_policy_does_not_roll_back() {
    let mut f = facts(WaveState::Baking, Event::BakedFail);
    f.rollback_automatic = false;
    match decide(&f) {
        WaveAction::Failed { decision, reason, .. } => {
            assert_eq!(decision, Decision::Halt);
            assert!(reason.starts_with("health verdict failed: gates: fail"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}
