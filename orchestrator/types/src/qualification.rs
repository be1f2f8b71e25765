//! The release qualification state machine.
//!
//! registered → qualifying → qualified → default → deprecated; a qualified
//! release may also be deprecated directly when it is superseded before it
//! ever became the default. Any state may go to blocked with a reason; only
//! an explicit unblock, again with a reason, returns a blocked release to
//! qualifying or qualified. Everything else is an [`TransitionError`].

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
        let has_reason = reason.is_some_and(|r| !r.trim().is_empty());
        let needs_reason = matches!((self, to), (_, Blocked) | (Blocked, _));
        let allowed = matches!(
            (self, to),
            (Registered, Qualifying)
                | (Qualifying, Qualified)
                | (Qualified, Default)
                | (Qualified, Deprecated)
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

    /// True when a rollout may take this release past its canary wave.
    pub fn may_roll_out_to_fleet(self) -> bool {
        matches!(self, QualificationState::Qualified | QualificationState::Default)
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
        assert_eq!(allowed, [&Qualified, &Default]);
    }
}
