//! The release qualification state machine.
//!
//! registered → qualifying → qualified → fleet-proven → default → deprecated.
//! `fleet-proven` is reached only when a rollout's soak against its holdback
//! passes ([`QualificationState::prove_in_fleet`], the engine's one way in;
//! [`QualificationState::transition`], what people ask for, refuses it), and
//! `default` is still set by a person. A qualified release may also be made
//! the default by a person without a soak (a policy without one never proves
//! a release in the fleet) and be deprecated directly when it is superseded
//! before it ever became the default. Any state may go to blocked with a
//! reason; only an explicit unblock, again with a reason, returns a blocked
//! release to qualifying or qualified. Everything else is an
//! [`TransitionError`].

use serde::{Deserialize, Serialize};

use crate::kinds::text_enum;

text_enum!(
    /// Where a release stands. Only `qualified` and `default` may go past a
    /// canary wave; `blocked` is refused by every rollout.
    QualificationState, "qualification state" {
        /// Image and metadata recorded; nothing run yet.
        Registered = "registered",
        /// Qualification gates are running.
        Qualifying = "qualifying",
        /// Every gate required by policy passed.
        Qualified = "qualified",
        /// A rollout's soak passed: the whole fleet on this release was compared with a holdback on
        /// the old version and every effect that must be caught was ruled out (issue 22).
        #[serde(rename = "fleet-proven")]
        FleetProven = "fleet-proven",
        /// The fleet default for its platforms.
        Default = "default",
        /// Superseded; kept for history and rollback.
        Deprecated = "deprecated",
        /// Recalled after a regression or by a human.
        Blocked = "blocked",
    }
);

/// A requested change of qualification state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransitionRequest {
    /// The state to move to.
    pub to: QualificationState,
    /// Why; required to block and to unblock.
    #[serde(default)]
    pub reason: Option<String>,
}

/// A transition the state machine does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    #[error("a release cannot go from {from} to {to}")]
    Illegal {
        from: QualificationState,
        to: QualificationState,
    },
    #[error("going from {from} to {to} needs a reason")]
    ReasonRequired {
        from: QualificationState,
        to: QualificationState,
    },
    #[error("the release is already {0}")]
    AlreadyInState(QualificationState),
    /// Only a passing soak makes a release fleet-proven; no person can.
    #[error("a release becomes fleet-proven only when a rollout's soak against its holdback passes")]
    SoakOnly,
}

impl QualificationState {
    /// Checks a transition; returns the new state.
    pub fn transition(
        self,
        to: QualificationState,
        reason: Option<&str>,
    ) -> Result<QualificationState, TransitionError> {
        use QualificationState::*;
        if self == to {
            return Err(TransitionError::AlreadyInState(self));
        }
        if to == FleetProven {
            return Err(TransitionError::SoakOnly);
        }
        let has_reason = reason.is_some_and(|r| !r.trim().is_empty());
        let needs_reason = matches!((self, to), (_, Blocked) | (Blocked, _));
        let allowed = matches!(
            (self, to),
            (Registered, Qualifying)
                | (Qualifying, Qualified)
                | (Qualified, Default)
                | (Qualified, Deprecated)
                | (FleetProven, Default)
                | (FleetProven, Deprecated)
                | (Default, Deprecated)
                | (_, Blocked)
                | (Blocked, Qualifying)
                | (Blocked, Qualified)
        );
        if !allowed {
            return Err(TransitionError::Illegal { from: self, to });
        }
        if needs_reason && !has_reason {
            return Err(TransitionError::ReasonRequired { from: self, to });
        }
        Ok(to)
    }

    /// The engine's one transition: a rollout's soak passed. From `qualified` only; a release
    /// already fleet-proven or the default stays where it is (`Ok(None)`: a replayed pass after a
    /// crash is harmless), and a blocked, deprecated or unqualified release is not proven by a soak.
    pub fn prove_in_fleet(self) -> Result<Option<QualificationState>, TransitionError> {
        use QualificationState::*;
        match self {
            Qualified => Ok(Some(FleetProven)),
            FleetProven | Default => Ok(None),
            from => Err(TransitionError::Illegal { from, to: FleetProven }),
        }
    }

    /// True when a rollout may take this release past its canary wave.
    pub fn may_roll_out_to_fleet(self) -> bool {
        matches!(
            self,
            QualificationState::Qualified | QualificationState::FleetProven | QualificationState::Default
        )
    }
}

/// The policy gates a release has not passed yet, when its qualification keeps a rollout from going
/// past the canary wave; `None` when the release may roll out to the fleet.
///
/// The one place this rule lives: the planner asks it before storing a plan, the engine before each
/// wave after the canary starts, so the two can never disagree on what "qualified enough" means.
pub fn qualification_hold<'a>(
    state: QualificationState,
    required_gates: impl IntoIterator<Item = &'a String>,
    passed: impl Fn(&str) -> bool,
) -> Option<Vec<String>> {
    let missing: Vec<String> = required_gates
        .into_iter()
        .filter(|g| !passed(g.as_str()))
        .cloned()
        .collect();
    (!state.may_roll_out_to_fleet() || !missing.is_empty()).then_some(missing)
}

#[cfg(test)]
mod tests {
    use super::QualificationState::*;
    use super::*;

    /// Every (from, to) pair and what must happen without and with a reason.
    #[test]
    fn transition_table() {
        enum Want {
            Ok,
            NeedsReason,
            Illegal,
            Same,
            SoakOnly,
        }
        use Want::*;
        let table: &[(QualificationState, QualificationState, Want)] = &[
            (Registered, Qualifying, Ok),
            (Registered, Qualified, Illegal),
            (Registered, Default, Illegal),
            (Registered, Deprecated, Illegal),
            (Registered, Blocked, NeedsReason),
            (Registered, Registered, Same),
            (Qualifying, Registered, Illegal),
            (Qualifying, Qualified, Ok),
            (Qualifying, Default, Illegal),
            (Qualifying, Deprecated, Illegal),
            (Qualifying, Blocked, NeedsReason),
            (Qualified, Qualifying, Illegal),
            (Qualified, Default, Ok),
            (Qualified, FleetProven, SoakOnly),
            (Registered, FleetProven, SoakOnly),
            (Qualifying, FleetProven, SoakOnly),
            (Default, FleetProven, SoakOnly),
            (Deprecated, FleetProven, SoakOnly),
            (Blocked, FleetProven, SoakOnly),
            (FleetProven, FleetProven, Same),
            (FleetProven, Registered, Illegal),
            (FleetProven, Qualifying, Illegal),
            (FleetProven, Qualified, Illegal),
            (FleetProven, Default, Ok),
            (FleetProven, Deprecated, Ok),
            (FleetProven, Blocked, NeedsReason),
            (Qualified, Deprecated, Ok),
            (Qualified, Blocked, NeedsReason),
            (Default, Qualified, Illegal),
            (Default, Deprecated, Ok),
            (Default, Blocked, NeedsReason),
            (Deprecated, Default, Illegal),
            (Deprecated, Qualified, Illegal),
            (Deprecated, Blocked, NeedsReason),
            (Blocked, Registered, Illegal),
            (Blocked, Qualifying, NeedsReason),
            (Blocked, Qualified, NeedsReason),
            (Blocked, Default, Illegal),
            (Blocked, Deprecated, Illegal),
            (Blocked, Blocked, Same),
            (Qualifying, Qualifying, Same),
            (Qualified, Registered, Illegal),
            (Qualified, Qualified, Same),
            (Default, Registered, Illegal),
            (Default, Qualifying, Illegal),
            (Default, Default, Same),
            (Deprecated, Registered, Illegal),
            (Deprecated, Qualifying, Illegal),
            (Deprecated, Deprecated, Same),
        ];
        for (from, to, want) in table {
            let bare = from.transition(*to, None);
            let reasoned = from.transition(*to, Some("bad XID rate in canary"));
            let blank = from.transition(*to, Some("  "));
            match want {
                Ok => {
                    assert_eq!(bare, Result::Ok(*to), "{from} -> {to}");
                    assert_eq!(reasoned, Result::Ok(*to), "{from} -> {to}");
                }
                NeedsReason => {
                    assert_eq!(bare, Err(TransitionError::ReasonRequired { from: *from, to: *to }));
                    assert_eq!(blank, Err(TransitionError::ReasonRequired { from: *from, to: *to }));
                    assert_eq!(reasoned, Result::Ok(*to), "{from} -> {to}");
                }
                Illegal => {
                    assert_eq!(bare, Err(TransitionError::Illegal { from: *from, to: *to }));
                    assert_eq!(reasoned, Err(TransitionError::Illegal { from: *from, to: *to }));
                }
                Same => assert_eq!(reasoned, Err(TransitionError::AlreadyInState(*from))),
                SoakOnly => {
                    assert_eq!(bare, Err(TransitionError::SoakOnly), "{from} -> {to}");
                    assert_eq!(reasoned, Err(TransitionError::SoakOnly), "{from} -> {to}");
                }
            }
        }
        let pairs: std::collections::BTreeSet<_> = table.iter().map(|(from, to, _)| (*from, *to)).collect();
        assert_eq!(pairs.len(), table.len(), "no pair listed twice");
        assert_eq!(
            pairs.len(),
            QualificationState::ALL.len() * QualificationState::ALL.len(),
            "every pair listed"
        );
    }

    #[test]
    fn hold_names_missing_gates_or_an_unqualified_state() {
        let required = ["burn_in".to_owned(), "nccl".to_owned()];
        let passed = |g: &str| g == "burn_in";
        assert_eq!(
            qualification_hold(Qualified, &required, passed),
            Some(vec!["nccl".to_owned()])
        );
        assert_eq!(qualification_hold(Qualifying, &required[..1], passed), Some(vec![]));
        assert_eq!(qualification_hold(Default, &required[..1], passed), None);
        assert_eq!(qualification_hold(Qualified, &[], |_| false), None);
    }

    #[test]
    fn only_qualified_releases_go_past_the_canary() {
        let allowed: Vec<_> = QualificationState::ALL
            .iter()
            .filter(|s| s.may_roll_out_to_fleet())
            .collect();
        assert_eq!(allowed, [&Qualified, &FleetProven, &Default]);
    }

    #[test]
    fn only_a_qualified_release_is_proven_by_a_soak_and_a_replay_is_harmless() {
        assert_eq!(Qualified.prove_in_fleet(), Ok(Some(FleetProven)));
        assert_eq!(FleetProven.prove_in_fleet(), Ok(None));
        assert_eq!(Default.prove_in_fleet(), Ok(None));
        for from in [Registered, Qualifying, Deprecated, Blocked] {
            assert_eq!(
                from.prove_in_fleet(),
                Err(TransitionError::Illegal { from, to: FleetProven })
            );
        }
        // Text and wire forms agree, so the stored state and the API's JSON are the same word.
        assert_eq!(FleetProven.as_str(), "fleet-proven");
        assert_eq!(serde_json::to_string(&FleetProven).unwrap(), "\"fleet-proven\"");
        assert_eq!("fleet-proven".parse::<QualificationState>(), Ok(FleetProven));
    }
}
