//! Pure ownership and decision rules: should Waveguard drain this node, may
//! it flash it now, may it resume it, what happens when a node never
//! empties, how much capacity may be out at once, and which drains were
//! left behind.
//!
//! Ownership is proven by Waveguard's own durable [`DrainRecord`] *and* the
//! node still carrying that rollout's reason tag. The tag alone proves
//! nothing (everyone may be root, and `State=RESUME` erases it), and the
//! record alone is not enough either (an operator may have re-drained the
//! node with their own reason since; a second drain silently replaces the
//! reason and user, so the tag is how we notice). A node whose drain is not
//! provably ours is never resumed by Waveguard.

use std::collections::{BTreeMap, BTreeSet};

use chrono::TimeDelta;
use orchestrator_policy::OnDrainTimeout;
use orchestrator_types::RolloutId;
use serde::Serialize;

use crate::state::{BaseState, NodeState, Reason, ReasonTag, Service, TagKind};

pub use orchestrator_types::DrainPhase;

/// Waveguard's durable record of one drain (one row per rollout and node).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DrainRecord {
    /// The rollout whose step drained the node.
    pub rollout: RolloutId,
    /// The scheduler's node name.
    pub node: String,
    /// How far it got.
    pub phase: DrainPhase,
}

impl DrainRecord {
    /// Does the node's current reason prove this record's drain is still in
    /// force? Our tag for this rollout, or (once held) the reason Slurm
    /// writes when the host our flash rebooted came back unexpectedly.
    fn still_ours(&self, state: &NodeState) -> bool {
        if self.phase >= DrainPhase::Held && state.rebooted_unexpectedly() {
            return true;
        }
        state.tag().is_some_and(|tag| tag.rollout == self.rollout)
    }
}

/// Why a node is left alone. None of these is a firmware failure: they
/// never count against the failure budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "why")]
pub enum LeaveAlone {
    /// Drained by someone else (an operator, or another rollout); their
    /// reason is shown and their drain is never resumed by us.
    DrainedByOther {
        /// Their reason, as reported.
        reason: Option<Reason>,
    },
    /// DOWN; not ours to bring up.
    Down {
        /// The scheduler's or operator's reason.
        reason: Option<Reason>,
    },
    /// The daemon does not answer, so whether jobs run is unknown.
    NotResponding,
    /// We drained it, and someone resumed it before the flash: they want it
    /// in service, so it is skipped for this wave rather than re-drained.
    ResumedByOther,
    /// No drain record of ours: nothing to resume (the flash path never
    /// starts without one).
    NoDrainRecord,
}

/// Before a node's update: what to do about its scheduler.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "decision")]
pub enum DrainDecision {
    /// Record [`DrainPhase::DrainIntended`] (if not yet), then drain with
    /// the rollout's tag.
    Drain,
    /// Already drained by this rollout (a replay after a crash): record
    /// [`DrainPhase::Held`] and wait for it to empty.
    AlreadyOurs,
    /// Skip the node for this wave, showing why.
    Skip(LeaveAlone),
}

/// Decides the drain of `state` for `rollout`, given the record of this
/// rollout's drain of the node, if any.
pub fn decide_drain(state: &NodeState, record: Option<&DrainRecord>, rollout: RolloutId) -> DrainDecision {
    let record = record.filter(|r| r.rollout == rollout);
    if let Some(r) = record {
        if state.drain {
            return if r.still_ours(state) {
                DrainDecision::AlreadyOurs
            } else {
                DrainDecision::Skip(LeaveAlone::DrainedByOther {
                    reason: state.reason.clone(),
                })
            };
        }
        if r.phase >= DrainPhase::Held {
            return DrainDecision::Skip(LeaveAlone::ResumedByOther);
        }
        // DrainIntended and not drained: the crash came before the effect.
    } else if state.drain {
        // Draining again would silently replace their reason and user.
        return DrainDecision::Skip(LeaveAlone::DrainedByOther {
            reason: state.reason.clone(),
        });
    }
    match state.service() {
        Service::NotResponding => DrainDecision::Skip(LeaveAlone::NotResponding),
        Service::Down => DrainDecision::Skip(LeaveAlone::Down {
            reason: state.reason.clone(),
        }),
        Service::InService { .. } | Service::Draining { .. } | Service::Drained => DrainDecision::Drain,
    }
}

/// Why a flash must wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "waiting_on")]
pub enum Waiting {
    /// Jobs are still running (DRAINING).
    Jobs {
        /// CPUs still allocated.
        alloc_cpus: u32,
    },
    /// `drained*`: the daemon is not answering, so emptiness is unknown
    /// (or, after a reboot, slurmd has not registered yet).
    NotResponding,
    /// DOWN while ours; waiting for it to come back.
    Down,
}

/// May the node be flashed now?
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "readiness")]
pub enum Readiness {
    /// `IDLE+DRAIN` with a responding daemon and our tag.
    Ready,
    /// Not yet; ask again (until the wave's `drain_timeout`).
    Wait(Waiting),
    /// Never, for this wave: the drain is no longer ours.
    Abandon(LeaveAlone),
}

/// Is it safe to flash the node that `record` says we drained?
pub fn flash_readiness(state: &NodeState, record: Option<&DrainRecord>) -> Readiness {
    let Some(record) = record.filter(|r| r.phase == DrainPhase::Held) else {
        return Readiness::Abandon(LeaveAlone::NoDrainRecord);
    };
    if !state.drain {
        return Readiness::Abandon(LeaveAlone::ResumedByOther);
    }
    if !record.still_ours(state) {
        return Readiness::Abandon(LeaveAlone::DrainedByOther {
            reason: state.reason.clone(),
        });
    }
    match state.service() {
        Service::Drained => Readiness::Ready,
        Service::Draining { alloc_cpus } => Readiness::Wait(Waiting::Jobs { alloc_cpus }),
        Service::NotResponding => Readiness::Wait(Waiting::NotResponding),
        Service::Down => Readiness::Wait(Waiting::Down),
        // Unreachable with the drain flag set; treated as resumed.
        Service::InService { .. } => Readiness::Abandon(LeaveAlone::ResumedByOther),
    }
}

/// After an update attempt (flash verified, flash failed, or skipped after
/// the drain): return the node or quarantine it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "then")]
pub enum AfterUpdate {
    /// Resume it: a failed flash that left a healthy node on its old
    /// firmware still goes back into service, so no capacity is stranded.
    Resume,
    /// Keep it drained but re-tag it so the reason says why and whose;
    /// record [`DrainPhase::Quarantined`] first.
    Quarantine(ReasonTag),
}

/// Resume unless the node is unhealthy (`unhealthy`: why, in a few words).
pub fn after_update(rollout: RolloutId, unhealthy: Option<&str>) -> AfterUpdate {
    match unhealthy {
        None => AfterUpdate::Resume,
        Some(why) => AfterUpdate::Quarantine(ReasonTag::quarantine(rollout, why)),
    }
}

/// May a node we drained be resumed now?
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "decision")]
pub enum ResumeDecision {
    /// Record [`DrainPhase::ResumeIntended`] (if not yet), then resume.
    Resume,
    /// Already in service (our resume happened before a crash, or someone
    /// resumed it): close the record.
    Done,
    /// Not yet: after a reboot the node shows `*` until slurmd registers.
    Wait(Waiting),
    /// Not ours any more, or quarantined: close the record (for a
    /// quarantine, keep it for the human) and never resume.
    LeaveAlone(LeaveAlone),
}

/// Decides whether to resume the node `record` says we drained.
pub fn decide_resume(state: &NodeState, record: Option<&DrainRecord>) -> ResumeDecision {
    let Some(record) = record else {
        return ResumeDecision::LeaveAlone(LeaveAlone::NoDrainRecord);
    };
    if record.phase == DrainPhase::Quarantined {
        return ResumeDecision::LeaveAlone(LeaveAlone::DrainedByOther {
            reason: state.reason.clone(),
        });
    }
    // Not drained and not DOWN is resumed, responding or not: Slurm marks a
    // node it just resumed not-responding (`idle*`) until its next ping.
    if !state.drain && state.base != BaseState::Down {
        return ResumeDecision::Done;
    }
    if !state.responding {
        return ResumeDecision::Wait(Waiting::NotResponding);
    }
    if record.still_ours(state) {
        if state
            .tag()
            .is_some_and(|t| matches!(t.kind, TagKind::Quarantine { .. }))
        {
            // A quarantine tag whose record phase was not written (crash
            // between the two): the tag is ours and says "keep it out".
            return ResumeDecision::LeaveAlone(LeaveAlone::DrainedByOther {
                reason: state.reason.clone(),
            });
        }
        return ResumeDecision::Resume;
    }
    if state.drain {
        ResumeDecision::LeaveAlone(LeaveAlone::DrainedByOther {
            reason: state.reason.clone(),
        })
    } else {
        ResumeDecision::LeaveAlone(LeaveAlone::Down {
            reason: state.reason.clone(),
        })
    }
}

/// While a node drains: keep waiting, or give up per the wave's policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DrainWait {
    /// Within `drain_timeout`.
    KeepWaiting,
    /// `on_drain_timeout: skip`: give the node back (resume it: we drained
    /// it) and skip it for this wave. Not a failure.
    SkipAndResume,
    /// `on_drain_timeout: hold`: keep it drained and hold the wave for a
    /// human. Not a failure either.
    Hold,
}

/// What to do after waiting `waited` for a node to empty.
pub fn drain_wait(waited: TimeDelta, timeout: TimeDelta, on_timeout: OnDrainTimeout) -> DrainWait {
    if waited < timeout {
        return DrainWait::KeepWaiting;
    }
    match on_timeout {
        OnDrainTimeout::Skip => DrainWait::SkipAndResume,
        OnDrainTimeout::Hold => DrainWait::Hold,
    }
}

/// May `adding` more GPUs go out of service when `out` already are, out of
/// `total`, under a cap of `cap_percent` percent?
///
/// One node may always go when nothing else is out: a cap smaller than one
/// node would otherwise stall a small cluster for good (policy lint warns).
pub fn capacity_allows(cap_percent: f64, out: u64, adding: u64, total: u64) -> bool {
    if out == 0 {
        return true;
    }
    // Integer comparison of (out + adding) * 100 <= cap * total, with the
    // cap in hundredths of a percent (rounded down: never above the cap),
    // so 10% of 10 GPUs is exactly 1.
    let cap_centi = (cap_percent.clamp(0.0, 100.0) * 100.0).floor() as u128;
    let want = u128::from(out.saturating_add(adding)) * 10_000;
    want <= cap_centi * u128::from(total)
}

/// A drain found by the periodic check with no live step behind it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Orphan {
    /// The scheduler's node name.
    pub node: String,
    /// The rollout named by the record (or by the tag, for a tag without a
    /// record).
    pub rollout: RolloutId,
    /// What to do: resume, wait, or report and leave alone.
    pub decision: ResumeDecision,
    /// True when the node carries our tag but we have no record: reported
    /// for a human, never resumed (the tag proves nothing).
    pub tag_without_record: bool,
}

/// The periodic check: every drain record with no live step (`live` holds
/// `(rollout, node)` pairs whose step is still running) and every node that
/// carries a Waveguard tag without any record. `states` is the scheduler's
/// view of every node. Nodes missing from `states` are reported as not
/// responding.
pub fn orphaned_drains(
    records: &[DrainRecord],
    live: &BTreeSet<(RolloutId, String)>,
    states: &BTreeMap<String, NodeState>,
) -> Vec<Orphan> {
    let mut out = Vec::new();
    for record in records {
        if live.contains(&(record.rollout, record.node.clone())) {
            continue;
        }
        let decision = match states.get(&record.node) {
            Some(state) => decide_resume(state, Some(record)),
            None => ResumeDecision::Wait(Waiting::NotResponding),
        };
        out.push(Orphan {
            node: record.node.clone(),
            rollout: record.rollout,
            decision,
            tag_without_record: false,
        });
    }
    let recorded: BTreeSet<&str> = records.iter().map(|r| r.node.as_str()).collect();
    for (name, state) in states {
        if let Some(tag) = state.tag()
            && state.drain
            && !recorded.contains(name.as_str())
        {
            out.push(Orphan {
                node: name.clone(),
                rollout: tag.rollout,
                decision: ResumeDecision::LeaveAlone(LeaveAlone::NoDrainRecord),
                tag_without_record: true,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::UNEXPECTED_REBOOT_REASON;

    const R: RolloutId = RolloutId(7);

    /// A node in a compact notation: `idle`, `alloc`, `mixed`, `down`, with
    /// `+drain`, `*` (not responding), `+completing`; `reason` as written.
    fn node(spec: &str, reason: Option<&str>) -> NodeState {
        let responding = !spec.ends_with('*');
        let spec = spec.trim_end_matches('*');
        let mut parts = spec.split('+');
        let base = match parts.next() {
            Some("idle") => BaseState::Idle,
            Some("alloc") => BaseState::Allocated,
            Some("mixed") => BaseState::Mixed,
            Some("down") => BaseState::Down,
            other => panic!("bad spec {other:?}"),
        };
        let mut state = NodeState {
            name: "n1".into(),
            base,
            drain: false,
            responding,
            completing: false,
            reboot_pending: false,
            alloc_cpus: if matches!(base, BaseState::Allocated | BaseState::Mixed) {
                4
            } else {
                0
            },
            reason: reason.map(|text| Reason {
                text: text.into(),
                set_by: Some("root".into()),
                set_at: Some(1),
            }),
            boot_time: None,
        };
        for flag in parts {
            match flag {
                "drain" => state.drain = true,
                "completing" => state.completing = true,
                other => panic!("bad flag {other:?}"),
            }
        }
        state
    }

    fn ours() -> Option<&'static str> {
        Some("waveguard rollout=7 firmware maintenance")
    }
    fn other_rollout() -> Option<&'static str> {
        Some("waveguard rollout=8 firmware maintenance")
    }
    fn operator() -> Option<&'static str> {
        Some("bad DIMM, ticket 123")
    }
    fn rebooted() -> Option<&'static str> {
        Some("Node unexpectedly rebooted boot_time=1796392592 last response=1796392500")
    }
    fn rec(phase: DrainPhase) -> Option<DrainRecord> {
        Some(DrainRecord {
            rollout: R,
            node: "n1".into(),
            phase,
        })
    }
    fn other_drain(reason: Option<&str>) -> LeaveAlone {
        LeaveAlone::DrainedByOther {
            reason: node("idle", reason).reason,
        }
    }

    #[test]
    fn drain_decisions() {
        use DrainDecision::*;
        use DrainPhase::*;
        let check = |spec: &str, reason: Option<&str>, record: Option<DrainRecord>, expected: DrainDecision| {
            let got = decide_drain(&node(spec, reason), record.as_ref(), R);
            assert_eq!(got, expected, "{spec} reason={reason:?} record={record:?}");
        };
        // In service, no record: drain, busy or not.
        check("idle", None, None, Drain);
        check("alloc", None, None, Drain);
        check("mixed", None, None, Drain);
        // Someone else's drain, no record: never replace it.
        check("idle+drain", operator(), None, Skip(other_drain(operator())));
        check("alloc+drain", operator(), None, Skip(other_drain(operator())));
        check("idle+drain", other_rollout(), None, Skip(other_drain(other_rollout())));
        // Our tag but no record: the tag proves nothing.
        check("idle+drain", ours(), None, Skip(other_drain(ours())));
        // Unavailable nodes are skipped, not drained.
        check("idle*", None, None, Skip(LeaveAlone::NotResponding));
        check(
            "down",
            Some("Not responding"),
            None,
            Skip(LeaveAlone::Down {
                reason: node("down", Some("Not responding")).reason,
            }),
        );
        // Replays after a crash.
        check("idle", None, rec(DrainIntended), Drain);
        check("alloc+drain", ours(), rec(DrainIntended), AlreadyOurs);
        check("idle+drain", ours(), rec(Held), AlreadyOurs);
        check(
            "alloc+drain",
            operator(),
            rec(DrainIntended),
            Skip(other_drain(operator())),
        );
        check("idle+drain", operator(), rec(Held), Skip(other_drain(operator())));
        check("idle", None, rec(Held), Skip(LeaveAlone::ResumedByOther));
        // A record of another rollout does not count for this one.
        let foreign = Some(DrainRecord {
            rollout: RolloutId(8),
            node: "n1".into(),
            phase: Held,
        });
        check(
            "idle+drain",
            other_rollout(),
            foreign,
            Skip(other_drain(other_rollout())),
        );
    }

    #[test]
    fn flash_readiness_table() {
        use DrainPhase::*;
        use Readiness::*;
        let check = |spec: &str, reason: Option<&str>, record: Option<DrainRecord>, expected: Readiness| {
            let got = flash_readiness(&node(spec, reason), record.as_ref());
            assert_eq!(got, expected, "{spec} reason={reason:?} record={record:?}");
        };
        check("idle+drain", ours(), rec(Held), Ready);
        check("alloc+drain", ours(), rec(Held), Wait(Waiting::Jobs { alloc_cpus: 4 }));
        check(
            "idle+drain+completing",
            ours(),
            rec(Held),
            Wait(Waiting::Jobs { alloc_cpus: 0 }),
        );
        // `drained*` is not proof of emptiness.
        check("idle+drain*", ours(), rec(Held), Wait(Waiting::NotResponding));
        check("down+drain*", ours(), rec(Held), Wait(Waiting::NotResponding));
        check("down+drain", ours(), rec(Held), Wait(Waiting::Down));
        check("idle", None, rec(Held), Abandon(LeaveAlone::ResumedByOther));
        check("idle+drain", operator(), rec(Held), Abandon(other_drain(operator())));
        // Without a held record nothing is flashed, whatever the tag says.
        check("idle+drain", ours(), None, Abandon(LeaveAlone::NoDrainRecord));
        check(
            "idle+drain",
            ours(),
            rec(DrainIntended),
            Abandon(LeaveAlone::NoDrainRecord),
        );
    }

    #[test]
    fn resume_decisions() {
        use DrainPhase::*;
        use LeaveAlone as L;
        use ResumeDecision as D;
        let check = |spec: &str, reason: Option<&str>, record: Option<DrainRecord>, expected: ResumeDecision| {
            let got = decide_resume(&node(spec, reason), record.as_ref());
            assert_eq!(got, expected, "{spec} reason={reason:?} record={record:?}");
        };
        check("idle+drain", ours(), rec(Held), D::Resume);
        check("idle+drain", ours(), rec(ResumeIntended), D::Resume);
        // Skipped after a drain timeout: it still has jobs, and is resumed.
        check("alloc+drain", ours(), rec(Held), D::Resume);
        // Our resume landed before a crash.
        check("idle", None, rec(ResumeIntended), D::Done);
        // Slurm shows a node it just resumed as `idle*` until its next ping.
        check("idle*", None, rec(ResumeIntended), D::Done);
        // After a reboot: `*` until slurmd registers, then DOWN "unexpectedly
        // rebooted" (ReturnToService<2) is ours to resume.
        check("idle+drain*", ours(), rec(Held), D::Wait(Waiting::NotResponding));
        check("down+drain*", ours(), rec(Held), D::Wait(Waiting::NotResponding));
        check("down+drain", rebooted(), rec(Held), D::Resume);
        check("down", rebooted(), rec(Held), D::Resume);
        // ...but not before we held it.
        check(
            "down",
            rebooted(),
            rec(DrainIntended),
            D::LeaveAlone(L::Down {
                reason: node("down", rebooted()).reason,
            }),
        );
        // An operator took the node over: never resumed by us.
        check(
            "idle+drain",
            operator(),
            rec(Held),
            D::LeaveAlone(other_drain(operator())),
        );
        check("idle+drain", operator(), None, D::LeaveAlone(L::NoDrainRecord));
        check("idle+drain", ours(), None, D::LeaveAlone(L::NoDrainRecord));
        check(
            "down",
            Some("PSU failure"),
            rec(Held),
            D::LeaveAlone(L::Down {
                reason: node("down", Some("PSU failure")).reason,
            }),
        );
        // Quarantine is for a human.
        let q = "waveguard rollout=7 quarantine: GPU 3 missing";
        check(
            "idle+drain",
            Some(q),
            rec(Quarantined),
            D::LeaveAlone(other_drain(Some(q))),
        );
        check("idle+drain", Some(q), rec(Held), D::LeaveAlone(other_drain(Some(q))));
    }

    #[test]
    fn unexpected_reboot_reason_is_slurms() {
        assert!(rebooted().unwrap().starts_with(UNEXPECTED_REBOOT_REASON));
        assert!(node("down", rebooted()).rebooted_unexpectedly());
        assert!(!node("idle+drain", rebooted()).rebooted_unexpectedly());
    }

    #[test]
    fn a_failed_flash_still_returns_a_healthy_node() {
        assert_eq!(after_update(R, None), AfterUpdate::Resume);
        assert_eq!(
            after_update(R, Some("GPU 3 missing")),
            AfterUpdate::Quarantine(ReasonTag::quarantine(R, "GPU 3 missing"))
        );
    }

    #[test]
    fn drain_timeouts_skip_or_hold() {
        let t = TimeDelta::minutes(30);
        assert_eq!(
            drain_wait(TimeDelta::minutes(29), t, OnDrainTimeout::Skip),
            DrainWait::KeepWaiting
        );
        assert_eq!(drain_wait(t, t, OnDrainTimeout::Skip), DrainWait::SkipAndResume);
        assert_eq!(
            drain_wait(TimeDelta::hours(5), t, OnDrainTimeout::Hold),
            DrainWait::Hold
        );
    }

    #[test]
    fn capacity_cap_table() {
        let check = |cap: f64, out: u64, adding: u64, total: u64, expected: bool| {
            assert_eq!(
                capacity_allows(cap, out, adding, total),
                expected,
                "cap {cap}% out {out} +{adding} of {total}"
            );
        };
        check(10.0, 0, 8, 80, true);
        check(10.0, 8, 8, 80, false);
        check(10.0, 0, 8, 16, true); // one node always, even above the cap
        check(10.0, 1, 1, 10, false);
        check(20.0, 1, 1, 10, true);
        check(12.5, 8, 8, 128, true);
        check(12.5, 16, 1, 128, false);
        check(100.0, 127, 1, 128, true);
    }

    #[test]
    fn orphans_are_resumed_or_reported() {
        let records = vec![
            DrainRecord {
                rollout: R,
                node: "n1".into(),
                phase: DrainPhase::Held,
            },
            DrainRecord {
                rollout: R,
                node: "n2".into(),
                phase: DrainPhase::Held,
            },
            DrainRecord {
                rollout: R,
                node: "gone".into(),
                phase: DrainPhase::ResumeIntended,
            },
        ];
        let mut states = BTreeMap::new();
        states.insert("n1".to_owned(), node("idle+drain", ours()));
        states.insert("n2".to_owned(), node("idle+drain", ours()));
        states.insert("n3".to_owned(), node("idle+drain", other_rollout()));
        states.insert("n4".to_owned(), node("idle+drain", operator()));
        let live = BTreeSet::from([(R, "n2".to_owned())]);
        let found = orphaned_drains(&records, &live, &states);
        let summary: Vec<(&str, &ResumeDecision, bool)> = found
            .iter()
            .map(|o| (o.node.as_str(), &o.decision, o.tag_without_record))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("n1", &ResumeDecision::Resume, false),
                ("gone", &ResumeDecision::Wait(Waiting::NotResponding), false),
                ("n3", &ResumeDecision::LeaveAlone(LeaveAlone::NoDrainRecord), true),
            ]
        );
    }

    mod props {
        use proptest::prelude::*;

        use super::*;

        fn arb_state() -> impl Strategy<Value = NodeState> {
            let base = prop_oneof![
                Just(BaseState::Idle),
                Just(BaseState::Allocated),
                Just(BaseState::Mixed),
                Just(BaseState::Down),
                Just(BaseState::Future),
                Just(BaseState::Unknown),
            ];
            let reason = proptest::option::of(prop_oneof![
                Just("waveguard rollout=7 firmware maintenance".to_owned()),
                Just("waveguard rollout=8 firmware maintenance".to_owned()),
                Just("waveguard rollout=7 quarantine: GPU lost".to_owned()),
                Just("Node unexpectedly rebooted boot_time=1".to_owned()),
                Just("bad DIMM".to_owned()),
                Just("Not responding".to_owned()),
            ]);
            (base, any::<(bool, bool, bool, bool)>(), 0u32..4, reason).prop_map(
                |(base, (drain, responding, completing, reboot_pending), alloc_cpus, reason)| NodeState {
                    name: "n1".into(),
                    base,
                    drain,
                    responding,
                    completing,
                    reboot_pending,
                    alloc_cpus,
                    reason: reason.map(|text| Reason {
                        text,
                        set_by: Some("root".into()),
                        set_at: None,
                    }),
                    boot_time: None,
                },
            )
        }

        fn arb_record() -> impl Strategy<Value = Option<DrainRecord>> {
            let phase = prop_oneof![
                Just(DrainPhase::DrainIntended),
                Just(DrainPhase::Held),
                Just(DrainPhase::ResumeIntended),
                Just(DrainPhase::Quarantined),
            ];
            proptest::option::of((phase, 7i64..=8)).prop_map(|r| {
                r.map(|(phase, id)| DrainRecord {
                    rollout: RolloutId(id),
                    node: "n1".into(),
                    phase,
                })
            })
        }

        proptest! {
            /// Never drain over an existing drain.
            #[test]
            fn a_drain_is_never_issued_over_a_drain(state in arb_state(), record in arb_record()) {
                if decide_drain(&state, record.as_ref(), R) == DrainDecision::Drain {
                    prop_assert!(!state.drain);
                    prop_assert!(state.responding && state.base != BaseState::Down);
                }
            }

            /// Flash only an empty, responding node drained by this record's
            /// rollout, and only once the drain is held.
            #[test]
            fn ready_means_idle_drain_responding_and_ours(state in arb_state(), record in arb_record()) {
                if flash_readiness(&state, record.as_ref()) == Readiness::Ready {
                    let record = record.unwrap();
                    prop_assert_eq!(record.phase, DrainPhase::Held);
                    prop_assert!(state.base == BaseState::Idle && state.drain && state.responding);
                    prop_assert!(!state.completing && state.alloc_cpus == 0);
                    prop_assert_eq!(state.tag().map(|t| t.rollout), Some(record.rollout));
                }
            }

            /// Resume only with a record, never a quarantine, and only when
            /// the node proves the drain is still the record's.
            #[test]
            fn resume_needs_a_record_and_proof(state in arb_state(), record in arb_record()) {
                if decide_resume(&state, record.as_ref()) == ResumeDecision::Resume {
                    let record = record.unwrap();
                    prop_assert!(record.phase != DrainPhase::Quarantined && state.responding);
                    let tagged = state.tag().is_some_and(|t| t.rollout == record.rollout && t.kind == TagKind::Maintenance);
                    let rebooted = state.rebooted_unexpectedly() && record.phase >= DrainPhase::Held;
                    prop_assert!(tagged || rebooted, "{state:?} {record:?}");
                }
            }

            /// Never more than the cap out at once, beyond the single node
            /// always allowed when nothing else is out.
            #[test]
            fn admitting_nodes_one_by_one_never_exceeds_the_cap(
                cap in 1.0f64..=100.0,
                sizes in proptest::collection::vec(1u64..=16, 1..60),
            ) {
                let total: u64 = sizes.iter().sum();
                let mut out = 0u64;
                let mut first = None;
                for size in &sizes {
                    if capacity_allows(cap, out, *size, total) {
                        if out == 0 { first = Some(*size); }
                        out += size;
                    }
                }
                let limit = (cap / 100.0 * total as f64).max(first.unwrap_or(0) as f64);
                prop_assert!(out as f64 <= limit + 1e-9, "out {out} limit {limit}");
            }
        }
    }
}
