//! The RMA case pipeline as pure transitions: candidate -> evidence collected -> submitted ->
//! accepted or rejected (with the vendor's reason) -> replaced -> verified, each by a user with the
//! right role, each recorded. The database stores what [`Case::apply`] returns and audits the
//! [`TransitionRecord`]; it never edits a state directly.

use chrono::{DateTime, Utc};
use orchestrator_types::Role;
use serde::{Deserialize, Serialize};

use crate::criteria::Severity;
use crate::queue::Admission;

/// Where a case is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaseState {
    /// Found by a rule; nothing collected yet.
    Candidate,
    /// The evidence package is built.
    EvidenceCollected,
    /// Sent to the vendor (counted against the quota).
    Submitted,
    /// The vendor accepted the claim.
    Accepted,
    /// The vendor refused the claim; its reason is kept.
    Rejected,
    /// The part was swapped.
    Replaced,
    /// The node is back in service with the new part (closed).
    Verified,
    /// Closed without a replacement by a human decision (closed).
    Closed,
}

impl CaseState {
    /// Every state, in pipeline order.
    pub const ALL: [CaseState; 8] = [
        Self::Candidate,
        Self::EvidenceCollected,
        Self::Submitted,
        Self::Accepted,
        Self::Rejected,
        Self::Replaced,
        Self::Verified,
        Self::Closed,
    ];

    /// An open case quarantines its node from rollouts: flashing a node whose GPU awaits replacement
    /// would muddle the claim's evidence and the rollout's health comparison alike.
    pub fn is_open(self) -> bool {
        !matches!(self, Self::Verified | Self::Closed)
    }
}

/// What a user (or the vendor, recorded by a user) does to a case. Not deserializable: a submit
/// carries an [`Admission`] that only the quota check may create.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "event")]
pub enum CaseEvent {
    /// The evidence package was built; its manifest hash pins what will be sent.
    CollectEvidence {
        /// sha256 of the package manifest.
        manifest_sha256: String,
    },
    /// Send to the vendor; needs a quota admission.
    Submit {
        /// Proof that the quota allows it now.
        admission: Admission,
        /// The vendor's case or ticket number.
        vendor_reference: String,
    },
    /// Record the vendor's acceptance.
    VendorAccepted,
    /// Record the vendor's rejection and why.
    VendorRejected {
        /// The vendor's reason, verbatim.
        reason: String,
    },
    /// After a rejection, collect more evidence (a new package) to submit again.
    Resubmit {
        /// sha256 of the new package manifest.
        manifest_sha256: String,
    },
    /// The part was swapped.
    Replaced {
        /// Serial of the part put in.
        new_serial: String,
    },
    /// The node runs well with the new part; ends the quarantine.
    Verified,
    /// A human ends the case without a replacement (false candidate, rejected for good) and
    /// returns the node to service.
    Close {
        /// Why.
        reason: String,
    },
}

impl CaseEvent {
    fn name(&self) -> &'static str {
        match self {
            Self::CollectEvidence { .. } => "collect_evidence",
            Self::Submit { .. } => "submit",
            Self::VendorAccepted => "vendor_accepted",
            Self::VendorRejected { .. } => "vendor_rejected",
            Self::Resubmit { .. } => "resubmit",
            Self::Replaced { .. } => "replaced",
            Self::Verified => "verified",
            Self::Close { .. } => "close",
        }
    }

    /// Least role allowed to make this transition. Closing without replacement lifts a quarantine
    /// on a part that met a failure rule, so it takes an admin.
    pub fn required_role(&self) -> Role {
        match self {
            Self::Close { .. } => Role::Admin,
            _ => Role::ReleaseManager,
        }
    }
}

/// Who acts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    /// User name.
    pub name: String,
    /// Their role.
    pub role: Role,
}

/// One recorded transition (the audit entry).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransitionRecord {
    /// State before.
    pub from: CaseState,
    /// State after.
    pub to: CaseState,
    /// Event name.
    pub event: String,
    /// Who.
    pub actor: String,
    /// When.
    pub at: DateTime<Utc>,
    /// Reason, reference or hash given with the event.
    pub detail: Option<String>,
}

/// A transition that was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaseError {
    /// The event does not apply in this state.
    #[error("case {case}: {event} is not allowed in state {state:?}")]
    NotAllowed {
        /// Case id.
        case: String,
        /// Event name.
        event: &'static str,
        /// Current state.
        state: CaseState,
    },
    /// The actor's role is too low.
    #[error("case {case}: {event} needs role {needed} or higher; {actor} is {has}")]
    Forbidden {
        /// Case id.
        case: String,
        /// Event name.
        event: &'static str,
        /// Role needed.
        needed: Role,
        /// Who tried.
        actor: String,
        /// Their role.
        has: Role,
    },
    /// Four eyes: the one who recorded the replacement may not verify it.
    #[error("case {case}: {actor} recorded the replacement and may not also verify it")]
    SameActor {
        /// Case id.
        case: String,
        /// Who tried.
        actor: String,
    },
    /// A reason, reference, hash or serial was empty.
    #[error("case {case}: {event} needs a non-empty {field}")]
    Missing {
        /// Case id.
        case: String,
        /// Event name.
        event: &'static str,
        /// Which field.
        field: &'static str,
    },
    /// The admission was issued for another case or vendor.
    #[error("case {case}: the quota admission was issued for case {admitted}")]
    WrongAdmission {
        /// Case id.
        case: String,
        /// The case the admission names.
        admitted: String,
    },
}

/// One RMA case for one part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Case {
    /// Case id.
    pub id: String,
    /// Serial of the failed part.
    pub serial: String,
    /// Node the part is in (quarantined while the case is open).
    pub node: String,
    /// Vendor key.
    pub vendor: String,
    /// Rule that opened it.
    pub rule: String,
    /// Failure mode of the rule.
    pub failure_mode: String,
    /// Orders the quota queue.
    pub severity: Severity,
    /// When the candidate was found (orders the queue within a severity).
    pub opened_at: DateTime<Utc>,
    /// Current state.
    pub state: CaseState,
    /// The vendor's reason, kept after a rejection (also after a resubmission, for the record).
    pub rejection_reason: Option<String>,
    /// Manifest hash of the current evidence package.
    pub manifest_sha256: Option<String>,
    /// The vendor's reference once submitted.
    pub vendor_reference: Option<String>,
    /// Serial of the replacement part.
    pub replacement_serial: Option<String>,
    /// Every transition, oldest first.
    pub history: Vec<TransitionRecord>,
}

fn nonempty(case: &str, event: &'static str, field: &'static str, v: &str) -> Result<String, CaseError> {
    let v = v.trim();
    if v.is_empty() {
        return Err(CaseError::Missing {
            case: case.to_owned(),
            event,
            field,
        });
    }
    Ok(v.to_owned())
}

impl Case {
    /// A new case in state [`CaseState::Candidate`].
    pub fn open(id: impl Into<String>, candidate: &crate::candidate::Candidate, opened_at: DateTime<Utc>) -> Case {
        Case {
            id: id.into(),
            serial: candidate.part.serial.clone(),
            node: candidate.part.node.clone(),
            vendor: candidate.part.vendor.clone(),
            rule: candidate.rule.clone(),
            failure_mode: candidate.failure_mode.clone(),
            severity: candidate.severity,
            opened_at,
            state: CaseState::Candidate,
            rejection_reason: None,
            manifest_sha256: None,
            vendor_reference: None,
            replacement_serial: None,
            history: Vec::new(),
        }
    }

    /// Applies one event, returning the new case (the input is untouched) or why not.
    pub fn apply(&self, event: CaseEvent, actor: &Actor, at: DateTime<Utc>) -> Result<Case, CaseError> {
        use CaseState as S;
        let name = event.name();
        let needed = event.required_role();
        if actor.role < needed {
            return Err(CaseError::Forbidden {
                case: self.id.clone(),
                event: name,
                needed,
                actor: actor.name.clone(),
                has: actor.role,
            });
        }
        let not_allowed = || CaseError::NotAllowed {
            case: self.id.clone(),
            event: name,
            state: self.state,
        };
        let mut next = self.clone();
        let detail;
        let to = match (&event, self.state) {
            (CaseEvent::CollectEvidence { manifest_sha256 }, S::Candidate)
            | (CaseEvent::Resubmit { manifest_sha256 }, S::Rejected) => {
                let h = nonempty(&self.id, name, "manifest_sha256", manifest_sha256)?;
                next.manifest_sha256 = Some(h.clone());
                detail = Some(h);
                S::EvidenceCollected
            }
            (
                CaseEvent::Submit {
                    admission,
                    vendor_reference,
                },
                S::EvidenceCollected,
            ) => {
                if admission.case_id() != self.id {
                    return Err(CaseError::WrongAdmission {
                        case: self.id.clone(),
                        admitted: admission.case_id().to_owned(),
                    });
                }
                let r = nonempty(&self.id, name, "vendor_reference", vendor_reference)?;
                next.vendor_reference = Some(r.clone());
                detail = Some(r);
                S::Submitted
            }
            (CaseEvent::VendorAccepted, S::Submitted) => {
                detail = None;
                S::Accepted
            }
            (CaseEvent::VendorRejected { reason }, S::Submitted) => {
                let r = nonempty(&self.id, name, "reason", reason)?;
                next.rejection_reason = Some(r.clone());
                detail = Some(r);
                S::Rejected
            }
            (CaseEvent::Replaced { new_serial }, S::Accepted) => {
                let s = nonempty(&self.id, name, "new_serial", new_serial)?;
                next.replacement_serial = Some(s.clone());
                detail = Some(s);
                S::Replaced
            }
            (CaseEvent::Verified, S::Replaced) => {
                let replaced_by = self
                    .history
                    .iter()
                    .rev()
                    .find(|t| t.to == S::Replaced)
                    .map(|t| &t.actor);
                if replaced_by == Some(&actor.name) {
                    return Err(CaseError::SameActor {
                        case: self.id.clone(),
                        actor: actor.name.clone(),
                    });
                }
                detail = None;
                S::Verified
            }
            // A submitted claim is the vendor's to answer; closing it here would lose the answer.
            (CaseEvent::Close { reason }, S::Candidate | S::EvidenceCollected | S::Rejected | S::Accepted) => {
                detail = Some(nonempty(&self.id, name, "reason", reason)?);
                S::Closed
            }
            _ => return Err(not_allowed()),
        };
        next.state = to;
        next.history.push(TransitionRecord {
            from: self.state,
            to,
            event: name.to_owned(),
            actor: actor.name.clone(),
            at,
            detail,
        });
        Ok(next)
    }

    /// Whether the node stays out of rollouts, and why (for the planner's blocker text).
    pub fn quarantine_reason(&self) -> Option<String> {
        self.state.is_open().then(|| {
            format!(
                "RMA case {} for GPU {} ({}) is {:?}; a human must verify or close it",
                self.id, self.serial, self.rule, self.state
            )
        })
    }
}

/// Nodes to keep out of rollouts: every node with an open case, with the reasons the plan shows
/// (several open cases on one node are listed together, by case id).
pub fn quarantined_nodes(cases: &[Case]) -> std::collections::BTreeMap<String, String> {
    let mut open: Vec<&Case> = cases.iter().filter(|c| c.state.is_open()).collect();
    open.sort_by(|a, b| a.id.cmp(&b.id));
    let mut out: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    for case in open {
        if let Some(reason) = case.quarantine_reason() {
            out.entry(case.node.clone())
                .and_modify(|r| {
                    r.push_str("; ");
                    r.push_str(&reason);
                })
                .or_insert(reason);
        }
    }
    out
}
