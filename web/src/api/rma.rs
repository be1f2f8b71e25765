//! `/api/v1/rma/cases`: RMA cases (a GPU that met a vendor's failure rule),
//! one case with the candidate that opened it, and the human steps of its
//! pipeline, recorded as the authenticated user with their role.
//!
//! The pure case machine (`orchestrator_rma::Case::apply`) decides every
//! step; this module asks it first so that a refusal answers with the right
//! status (a role or four-eyes refusal 403, a step the state does not allow
//! 409, a missing field 422) and words the UI shares. Submission to the
//! vendor is its own route (`rma_pipeline`): it needs an admission from the
//! vendor's quota, not only the machine's consent.

use axum::Extension;
use axum::extract::State;
use chrono::{DateTime, Utc};
use orchestrator_db::model::FieldError;
use orchestrator_db::rma::{RmaCase, RmaFilter};
use orchestrator_rma::{
    Actor, CandidateStatus, Case, CaseError, CaseEvent, CaseState, FirmwareSuspicion, Observation, Severity,
};
use orchestrator_types::Role;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{ApiJson, ApiPath, ApiQuery};
use crate::AppState;
use crate::auth::Principal;
use crate::error::{ApiError, ErrorBody};

/// Longest reason (the vendor's, or a closing one) accepted: a vendor's
/// answer is a paragraph, and the case keeps it in every read of its row.
pub(crate) const MAX_REASON_CHARS: usize = 4000;
/// Longest serial number accepted for a replacement part.
pub(crate) const MAX_SERIAL_CHARS: usize = 128;

/// The stored (snake_case) name of a state, as the API and the filters spell it.
pub(crate) fn state_name(state: CaseState) -> &'static str {
    match state {
        CaseState::Candidate => "candidate",
        CaseState::EvidenceCollected => "evidence_collected",
        CaseState::Submitted => "submitted",
        CaseState::Accepted => "accepted",
        CaseState::Rejected => "rejected",
        CaseState::Replaced => "replaced",
        CaseState::Verified => "verified",
        CaseState::Closed => "closed",
    }
}

/// A state as people read it (the CLI's wording: the name with spaces).
pub(crate) fn state_words(state: CaseState) -> String {
    state_name(state).replace('_', " ")
}

/// A state from its stored name.
pub(crate) fn parse_state(text: &str) -> Option<CaseState> {
    CaseState::ALL.into_iter().find(|s| state_name(*s) == text)
}

pub(crate) fn severity_name(severity: Severity) -> &'static str {
    match severity {
        Severity::Low => "low",
        Severity::Medium => "medium",
        Severity::High => "high",
        Severity::Critical => "critical",
    }
}

pub(crate) fn status_name(status: CandidateStatus) -> &'static str {
    match status {
        CandidateStatus::Met => "met",
        CandidateStatus::AwaitingConfirmation => "awaiting_confirmation",
        CandidateStatus::DiagnosticPassed => "diagnostic_passed",
    }
}

/// When the case entered its current state: its last transition, or its opening.
pub(crate) fn state_since(case: &Case) -> DateTime<Utc> {
    case.history.last().map_or(case.opened_at, |t| t.at)
}

/// Days since the case entered its current state (never negative: a clock
/// stepped back shows 0, not a negative age).
pub(crate) fn days_in_state(case: &Case, now: DateTime<Utc>) -> f64 {
    ((now - state_since(case)).num_seconds() as f64 / 86_400.0).max(0.0)
}

/// The human steps of a case, as the API's `event` tags and the UI's
/// action paths name them. Submission is not one of them: it has its own
/// route, because it needs the vendor's quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    CollectEvidence,
    VendorAccepted,
    VendorRejected,
    Resubmit,
    Replaced,
    Verified,
    Close,
}

impl Step {
    /// In pipeline order, as the case page offers them.
    pub(crate) const ALL: [Step; 7] = [
        Step::CollectEvidence,
        Step::Resubmit,
        Step::VendorAccepted,
        Step::VendorRejected,
        Step::Replaced,
        Step::Verified,
        Step::Close,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Step::CollectEvidence => "collect_evidence",
            Step::VendorAccepted => "vendor_accepted",
            Step::VendorRejected => "vendor_rejected",
            Step::Resubmit => "resubmit",
            Step::Replaced => "replaced",
            Step::Verified => "verified",
            Step::Close => "close",
        }
    }

    pub(crate) fn parse(name: &str) -> Option<Step> {
        Step::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The button's words.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Step::CollectEvidence => "Record evidence collected",
            Step::VendorAccepted => "Record vendor acceptance",
            Step::VendorRejected => "Record vendor rejection",
            Step::Resubmit => "Record new evidence",
            Step::Replaced => "Record replacement",
            Step::Verified => "Verify back in service",
            Step::Close => "Close without replacement",
        }
    }

    /// The one field the step needs, if any.
    pub(crate) fn field(self) -> Option<&'static str> {
        match self {
            Step::CollectEvidence | Step::Resubmit => Some("manifest_sha256"),
            Step::VendorRejected | Step::Close => Some("reason"),
            Step::Replaced => Some("new_serial"),
            Step::VendorAccepted | Step::Verified => None,
        }
    }

    /// The step with placeholder fields: the machine checks role and state
    /// before any field, so asking it with these tells what it would allow.
    fn probe(self) -> CaseEvent {
        let filled = || "-".to_owned();
        match self {
            Step::CollectEvidence => CaseEvent::CollectEvidence {
                manifest_sha256: filled(),
            },
            Step::VendorAccepted => CaseEvent::VendorAccepted,
            Step::VendorRejected => CaseEvent::VendorRejected { reason: filled() },
            Step::Resubmit => CaseEvent::Resubmit {
                manifest_sha256: filled(),
            },
            Step::Replaced => CaseEvent::Replaced { new_serial: filled() },
            Step::Verified => CaseEvent::Verified,
            Step::Close => CaseEvent::Close { reason: filled() },
        }
    }
}

/// Whether a user may take a step the case's state allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Offer {
    /// They may.
    Allowed,
    /// Their role is too low; this one is needed.
    NeedsRole(Role),
    /// Four eyes: they recorded the replacement, someone else verifies.
    NotTheSamePerson,
}

/// The steps the case's state allows now, each with whether `actor` may
/// take it. Submission is left out (its own route, see [`Step`]).
pub(crate) fn next_steps(case: &Case, actor: &Actor, now: DateTime<Utc>) -> Vec<(Step, Offer)> {
    // The machine checks the role first, so the state's answer is asked as
    // an admin whose name no user can have (a name that is never "the same
    // person" as the one who recorded the replacement).
    let anyone = Actor {
        name: "\0state-probe".into(),
        role: Role::Admin,
    };
    Step::ALL
        .into_iter()
        .filter(|step| case.apply(step.probe(), &anyone, now).is_ok())
        .map(|step| {
            let offer = match case.apply(step.probe(), actor, now) {
                Ok(_) => Offer::Allowed,
                Err(CaseError::Forbidden { needed, .. }) => Offer::NeedsRole(needed),
                Err(CaseError::SameActor { .. }) => Offer::NotTheSamePerson,
                // Only the role and the actor differ from the probe above.
                Err(_) => Offer::NeedsRole(step.probe().required_role()),
            };
            (step, offer)
        })
        .collect()
}

fn invalid(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::Invalid(vec![FieldError {
        field: field.to_owned(),
        message: message.into(),
    }])
}

/// A human step of a case's pipeline, tagged by `event`. Submission to the
/// vendor is `POST /api/v1/rma/cases/{id}/submit`: it needs the vendor's quota.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case", tag = "event", deny_unknown_fields)]
pub enum CaseEventRequest {
    /// The evidence package is built (from `candidate`).
    CollectEvidence {
        /// sha256 of the package manifest, 64 hexadecimal digits.
        manifest_sha256: String,
    },
    /// The vendor accepted the claim (from `submitted`).
    VendorAccepted {},
    /// The vendor refused the claim (from `submitted`); the case keeps the reason and the node stays held.
    VendorRejected {
        /// The vendor's reason, verbatim (at most 4,000 characters).
        reason: String,
    },
    /// New evidence after a rejection (from `rejected`), to submit again.
    Resubmit {
        /// sha256 of the new package manifest, 64 hexadecimal digits.
        manifest_sha256: String,
    },
    /// The part was swapped (from `accepted`).
    Replaced {
        /// Serial number of the part put in (at most 128 characters).
        new_serial: String,
    },
    /// The node runs well with the new part (from `replaced`; not by whoever recorded the
    /// replacement). Ends the case and its hold on the node.
    Verified {},
    /// End the case without a replacement and return the node to rollouts (admin only; from
    /// `candidate`, `evidence_collected`, `accepted` or `rejected`).
    Close {
        /// Why (at most 4,000 characters).
        reason: String,
    },
}

impl CaseEventRequest {
    pub(crate) fn step(&self) -> Step {
        match self {
            CaseEventRequest::CollectEvidence { .. } => Step::CollectEvidence,
            CaseEventRequest::VendorAccepted {} => Step::VendorAccepted,
            CaseEventRequest::VendorRejected { .. } => Step::VendorRejected,
            CaseEventRequest::Resubmit { .. } => Step::Resubmit,
            CaseEventRequest::Replaced { .. } => Step::Replaced,
            CaseEventRequest::Verified {} => Step::Verified,
            CaseEventRequest::Close { .. } => Step::Close,
        }
    }

    /// The request for `step` with its field read by `field` (a form's;
    /// a missing one is empty and refused as such).
    pub(crate) fn for_step(step: Step, field: impl Fn(&str) -> String) -> Self {
        match step {
            Step::CollectEvidence => CaseEventRequest::CollectEvidence {
                manifest_sha256: field("manifest_sha256"),
            },
            Step::Resubmit => CaseEventRequest::Resubmit {
                manifest_sha256: field("manifest_sha256"),
            },
            Step::VendorAccepted => CaseEventRequest::VendorAccepted {},
            Step::VendorRejected => CaseEventRequest::VendorRejected {
                reason: field("reason"),
            },
            Step::Replaced => CaseEventRequest::Replaced {
                new_serial: field("new_serial"),
            },
            Step::Verified => CaseEventRequest::Verified {},
            Step::Close => CaseEventRequest::Close {
                reason: field("reason"),
            },
        }
    }

    /// The machine's event, with the fields checked for what the machine
    /// does not check (it only refuses empty ones).
    fn into_event(self) -> Result<CaseEvent, ApiError> {
        fn sha256(value: String) -> Result<String, ApiError> {
            let value = value.trim().to_ascii_lowercase();
            if value.len() != 64 || !value.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(invalid(
                    "manifest_sha256",
                    "must be the manifest's sha256: 64 hexadecimal digits",
                ));
            }
            Ok(value)
        }
        fn bounded(field: &str, value: String, max: usize) -> Result<String, ApiError> {
            let value = value.trim().to_owned();
            if value.is_empty() {
                return Err(invalid(field, "must not be empty"));
            }
            if value.chars().count() > max {
                return Err(invalid(field, format!("must be at most {max} characters")));
            }
            Ok(value)
        }
        Ok(match self {
            CaseEventRequest::CollectEvidence { manifest_sha256 } => CaseEvent::CollectEvidence {
                manifest_sha256: sha256(manifest_sha256)?,
            },
            CaseEventRequest::Resubmit { manifest_sha256 } => CaseEvent::Resubmit {
                manifest_sha256: sha256(manifest_sha256)?,
            },
            CaseEventRequest::VendorAccepted {} => CaseEvent::VendorAccepted,
            CaseEventRequest::VendorRejected { reason } => CaseEvent::VendorRejected {
                reason: bounded("reason", reason, MAX_REASON_CHARS)?,
            },
            CaseEventRequest::Replaced { new_serial } => CaseEvent::Replaced {
                new_serial: bounded("new_serial", new_serial, MAX_SERIAL_CHARS)?,
            },
            CaseEventRequest::Verified {} => CaseEvent::Verified,
            CaseEventRequest::Close { reason } => CaseEvent::Close {
                reason: bounded("reason", reason, MAX_REASON_CHARS)?,
            },
        })
    }
}

/// Refuses `step` on `case` unless its state allows it now and `actor` may
/// take it, with words saying what would be allowed. Asked before the
/// datastore (which asks the machine again, under its write) so that each
/// refusal gets its own status, and by the case page before it asks to
/// confirm.
pub(crate) fn check_step(case: &Case, step: Step, actor: &Actor, now: DateTime<Utc>) -> Result<(), ApiError> {
    let offers = next_steps(case, actor, now);
    match offers.iter().find(|(s, _)| *s == step).map(|(_, offer)| offer) {
        Some(Offer::Allowed) => Ok(()),
        Some(Offer::NeedsRole(needed)) => Err(ApiError::Forbidden(format!(
            "{} is a {}; recording {} on an RMA case needs {needed}",
            actor.name,
            actor.role,
            step.name().replace('_', " ")
        ))),
        Some(Offer::NotTheSamePerson) => Err(ApiError::Forbidden(format!(
            "{} recorded the replacement on RMA case {}; another person must verify it (four eyes)",
            actor.name, case.id
        ))),
        None => {
            let allowed: Vec<&str> = offers.iter().map(|(s, _)| s.name()).collect();
            let now_allowed = if !allowed.is_empty() {
                allowed.join(", ")
            } else if case.state == CaseState::EvidenceCollected {
                "only submission to the vendor (POST .../submit with the vendor's reference)".to_owned()
            } else if !case.state.is_open() {
                "nothing: the case is over".to_owned()
            } else {
                "nothing".to_owned()
            };
            Err(ApiError::Conflict(format!(
                "RMA case {} is {}: {} does not apply (allowed now: {now_allowed})",
                case.id,
                state_words(case.state),
                step.name()
            )))
        }
    }
}

/// The actor the case machine sees for a request.
pub(crate) fn actor_of(principal: &Principal) -> Actor {
    Actor {
        name: principal.user.username.clone(),
        role: principal.user.role,
    }
}

/// Records `request` on case `id` as `principal`, returning the case after
/// it. Shared by the API and the case page's forms.
pub(crate) async fn record(
    state: &AppState,
    id: &str,
    request: CaseEventRequest,
    principal: &Principal,
) -> Result<RmaCase, ApiError> {
    let actor = actor_of(principal);
    let current = state.db.rma_case(id).await?;
    check_step(&current.case, request.step(), &actor, state.db.clock().now())?;
    let event = request.into_event()?;
    state.db.apply_rma_event(id, event, &actor).await?;
    Ok(state.db.rma_case(id).await?)
}

/// One case as listed.
#[derive(Debug, Serialize, ToSchema)]
pub struct RmaCaseSummary {
    /// Case id (`RMA-<serial>-<rule>-<n>`).
    id: String,
    /// `candidate`, `evidence_collected`, `submitted`, `accepted`, `rejected`, `replaced`,
    /// `verified` or `closed`.
    state: String,
    /// Not verified or closed: an open case holds its node out of rollouts.
    open: bool,
    /// When the case entered its current state.
    state_since: DateTime<Utc>,
    /// Days in the current state at the time of the answer.
    days_in_state: f64,
    /// Node the part is in.
    node: String,
    vendor: String,
    /// Serial number of the failed part.
    serial: String,
    part_number: String,
    /// Slot on the node (GPU index or Redfish id).
    slot: String,
    /// The vendor criterion's rule the part met.
    rule: String,
    failure_mode: String,
    /// `low`, `medium`, `high` or `critical`.
    severity: String,
    /// When the case was opened.
    opened_at: DateTime<Utc>,
    /// The failure began right after a firmware change (the case names it).
    firmware_suspected: bool,
    /// The vendor's reason, kept after a rejection.
    rejection_reason: Option<String>,
    /// The vendor's case or ticket number once submitted.
    vendor_reference: Option<String>,
    /// Serial of the replacement part.
    replacement_serial: Option<String>,
    updated_at: DateTime<Utc>,
}

impl RmaCaseSummary {
    pub(crate) fn of(found: &RmaCase, now: DateTime<Utc>) -> Self {
        let case = &found.case;
        RmaCaseSummary {
            id: case.id.clone(),
            state: state_name(case.state).to_owned(),
            open: case.state.is_open(),
            state_since: state_since(case),
            days_in_state: days_in_state(case, now),
            node: case.node.clone(),
            vendor: case.vendor.clone(),
            serial: case.serial.clone(),
            part_number: found.candidate.part.part_number.clone(),
            slot: found.candidate.part.slot.clone(),
            rule: case.rule.clone(),
            failure_mode: case.failure_mode.clone(),
            severity: severity_name(case.severity).to_owned(),
            opened_at: case.opened_at,
            firmware_suspected: found.candidate.firmware_suspected.is_some(),
            rejection_reason: case.rejection_reason.clone(),
            vendor_reference: case.vendor_reference.clone(),
            replacement_serial: case.replacement_serial.clone(),
            updated_at: found.updated_at,
        }
    }
}

/// One case with its history and the candidate that opened it.
#[derive(Debug, Serialize, ToSchema)]
pub struct RmaCaseDetail {
    #[serde(flatten)]
    summary: RmaCaseSummary,
    /// sha256 of the current evidence package's manifest.
    manifest_sha256: Option<String>,
    /// Every transition, oldest first (each also in the audit log as `rma.transition`).
    history: Vec<RmaTransition>,
    candidate: RmaCandidate,
}

/// One recorded step.
#[derive(Debug, Serialize, ToSchema)]
pub struct RmaTransition {
    /// State before.
    from: String,
    /// State after.
    to: String,
    /// The step (`collect_evidence`, `submit`, `vendor_rejected`, ...).
    event: String,
    /// Who recorded it.
    actor: String,
    at: DateTime<Utc>,
    /// The reason, reference, hash or serial given with it.
    detail: Option<String>,
}

/// The part, the rule it met and the samples that prove it.
#[derive(Debug, Serialize, ToSchema)]
pub struct RmaCandidate {
    part: RmaPart,
    rule: String,
    failure_mode: String,
    /// `low`, `medium`, `high` or `critical`.
    severity: String,
    /// `met`, `awaiting_confirmation` (the vendor requires a failed field diagnostic not yet
    /// there) or `diagnostic_passed` (the vendor will not accept the claim).
    status: String,
    /// First qualifying sample.
    began_at: DateTime<Utc>,
    /// The vendor document and edition the rule comes from.
    document_edition: String,
    /// The samples that prove it: signal samples, then the diagnostic if any.
    samples: Vec<RmaSample>,
    /// Set when the failure began right after a firmware change.
    firmware_suspected: Option<RmaFirmwareSuspicion>,
}

/// The failed part as inventoried.
#[derive(Debug, Serialize, ToSchema)]
pub struct RmaPart {
    serial: String,
    vendor: String,
    part_kind: String,
    part_number: String,
    node: String,
    slot: String,
}

/// One sample, named so that evidence can cite it.
#[derive(Debug, Serialize, ToSchema)]
pub struct RmaSample {
    at: DateTime<Utc>,
    /// Stable id at its source (log entry URI, series and timestamp).
    source_id: String,
    /// What it saw, tagged by `kind`: `flag` (`flag`, `set`), `xid` (`code`), `xid_window_count`
    /// (`code`, `count`, `window_seconds`), `field_diagnostic` (`passed`), `series_scrape`
    /// (`present`) or `bmc_probe` (`answered`).
    #[schema(value_type = Object)]
    kind: serde_json::Value,
}

impl RmaSample {
    pub(crate) fn of(sample: &Observation) -> Self {
        RmaSample {
            at: sample.at,
            source_id: sample.source_id.clone(),
            kind: serde_json::to_value(&sample.kind).unwrap_or_default(),
        }
    }
}

/// Why the failure is suspected to be the firmware's rather than the silicon's.
#[derive(Debug, Serialize, ToSchema)]
pub struct RmaFirmwareSuspicion {
    /// When the new version was read back.
    changed_at: DateTime<Utc>,
    /// Firmware component (`gpu`, `bmc`).
    component: String,
    from_version: String,
    to_version: String,
    /// Release that was flashed.
    release: String,
    /// Rollout that flashed it, if any.
    rollout: Option<String>,
    /// Seconds from the change to the first qualifying sample.
    after_seconds: i64,
}

impl RmaFirmwareSuspicion {
    fn of(s: &FirmwareSuspicion) -> Self {
        RmaFirmwareSuspicion {
            changed_at: s.change.at,
            component: s.change.component.clone(),
            from_version: s.change.from_version.clone(),
            to_version: s.change.to_version.clone(),
            release: s.change.release.clone(),
            rollout: s.change.rollout.clone(),
            after_seconds: s.after_seconds,
        }
    }
}

impl RmaCaseDetail {
    pub(crate) fn of(found: &RmaCase, now: DateTime<Utc>) -> Self {
        let c = &found.candidate;
        RmaCaseDetail {
            summary: RmaCaseSummary::of(found, now),
            manifest_sha256: found.case.manifest_sha256.clone(),
            history: found
                .case
                .history
                .iter()
                .map(|t| RmaTransition {
                    from: state_name(t.from).to_owned(),
                    to: state_name(t.to).to_owned(),
                    event: t.event.clone(),
                    actor: t.actor.clone(),
                    at: t.at,
                    detail: t.detail.clone(),
                })
                .collect(),
            candidate: RmaCandidate {
                part: RmaPart {
                    serial: c.part.serial.clone(),
                    vendor: c.part.vendor.clone(),
                    part_kind: c.part.part_kind.clone(),
                    part_number: c.part.part_number.clone(),
                    node: c.part.node.clone(),
                    slot: c.part.slot.clone(),
                },
                rule: c.rule.clone(),
                failure_mode: c.failure_mode.clone(),
                severity: severity_name(c.severity).to_owned(),
                status: status_name(c.status).to_owned(),
                began_at: c.began_at,
                document_edition: c.document_edition.clone(),
                samples: c.samples.iter().map(RmaSample::of).collect(),
                firmware_suspected: c.firmware_suspected.as_ref().map(RmaFirmwareSuspicion::of),
            },
        }
    }
}

/// Filters of the case list; an empty parameter filters nothing.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CaseQuery {
    /// Only cases not verified or closed (they hold their nodes out of rollouts). Default false.
    open: Option<bool>,
    /// Only this node's cases.
    node: Option<String>,
    /// Only this vendor's cases.
    vendor: Option<String>,
    /// Only this part's cases.
    serial: Option<String>,
    /// Only cases in this state (`candidate`, `evidence_collected`, `submitted`, `accepted`,
    /// `rejected`, `replaced`, `verified`, `closed`).
    state: Option<String>,
}

fn non_empty(value: Option<String>) -> Option<String> {
    value.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
}

/// A state filter's value, refused with the states when it names none.
pub(crate) fn state_filter(text: Option<&str>) -> Result<Option<CaseState>, ApiError> {
    match text.map(str::trim).filter(|t| !t.is_empty()) {
        None => Ok(None),
        Some(t) => parse_state(t).map(Some).ok_or_else(|| {
            let states: Vec<&str> = CaseState::ALL.into_iter().map(state_name).collect();
            ApiError::BadRequest(format!("unknown state {t:?}; one of {}", states.join(", ")))
        }),
    }
}

/// Cases matching the filters, oldest first.
#[utoipa::path(get, path = "/api/v1/rma/cases", tag = "rma", params(CaseQuery),
    responses((status = 200, body = [RmaCaseSummary], description = "Oldest first"), (status = 400, body = ErrorBody)))]
pub(crate) async fn list_cases(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<CaseQuery>,
) -> Result<ApiJson<Vec<RmaCaseSummary>>, ApiError> {
    let wanted = state_filter(query.state.as_deref())?;
    let filter = RmaFilter {
        open_only: query.open.unwrap_or(false),
        vendor: non_empty(query.vendor),
        node: non_empty(query.node),
        serial: non_empty(query.serial),
    };
    let now = state.db.clock().now();
    let cases = state.db.rma_cases(&filter).await?;
    Ok(ApiJson(
        cases
            .iter()
            .filter(|c| wanted.is_none_or(|s| c.case.state == s))
            .map(|c| RmaCaseSummary::of(c, now))
            .collect(),
    ))
}

/// One case: its part, the rule it met with the samples, any firmware suspicion, the vendor's
/// answers and every step so far.
#[utoipa::path(get, path = "/api/v1/rma/cases/{id}", tag = "rma",
    params(("id" = String, Path, description = "Case id")),
    responses((status = 200, body = RmaCaseDetail), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_case(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<RmaCaseDetail>, ApiError> {
    let found = state.db.rma_case(&id).await?;
    Ok(ApiJson(RmaCaseDetail::of(&found, state.db.clock().now())))
}

/// Records a human step of the case's pipeline as the caller (audited as `rma.transition`).
/// Every step needs release_manager; closing needs admin; whoever recorded the replacement may
/// not verify it. Submission to the vendor is `POST .../submit` (it needs the vendor's quota).
#[utoipa::path(post, path = "/api/v1/rma/cases/{id}/events", tag = "rma", request_body = CaseEventRequest,
    params(("id" = String, Path, description = "Case id")),
    responses((status = 200, body = RmaCaseDetail, description = "The case after the step"),
              (status = 400, body = ErrorBody, description = "Malformed JSON"),
              (status = 403, body = ErrorBody, description = "The caller's role is too low, or they recorded the \
               replacement they try to verify"),
              (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "The step does not apply in the case's state (the \
               message says which do), or the case moved meanwhile"),
              (status = 422, body = ErrorBody, description = "Unknown step, or a field missing or malformed")))]
pub(crate) async fn record_event(
    State(state): State<AppState>,
    principal: Option<Extension<Principal>>,
    ApiPath(id): ApiPath<String>,
    ApiJson(request): ApiJson<CaseEventRequest>,
) -> Result<ApiJson<RmaCaseDetail>, ApiError> {
    let Extension(principal) = principal.ok_or(ApiError::Unauthorized)?;
    let found = record(&state, &id, request, &principal).await?;
    Ok(ApiJson(RmaCaseDetail::of(&found, state.db.clock().now())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_and_read_as_words() {
        for state in CaseState::ALL {
            assert_eq!(parse_state(state_name(state)), Some(state));
            // The stored spelling is serde's; the filters must take what the database keeps.
            assert_eq!(serde_json::to_value(state).unwrap(), state_name(state));
        }
        assert_eq!(state_words(CaseState::EvidenceCollected), "evidence collected");
        assert!(state_filter(Some("lost")).is_err());
        assert_eq!(state_filter(Some(" ")).unwrap(), None);
    }

    #[test]
    fn event_bodies_parse_strictly() {
        let ok: CaseEventRequest = serde_json::from_str(r#"{"event":"vendor_accepted"}"#).unwrap();
        assert_eq!(ok.step(), Step::VendorAccepted);
        for bad in [
            r#"{"event":"vendor_accepted","extra":1}"#,
            r#"{"event":"submit","vendor_reference":"x"}"#,
            r#"{"event":"close"}"#,
            r#"{"reason":"x"}"#,
        ] {
            assert!(serde_json::from_str::<CaseEventRequest>(bad).is_err(), "{bad}");
        }
        for step in Step::ALL {
            assert_eq!(Step::parse(step.name()), Some(step));
            assert_eq!(CaseEventRequest::for_step(step, |_| String::new()).step(), step);
        }
    }

    #[test]
    fn fields_are_checked_before_the_machine_sees_them() {
        let short = CaseEventRequest::CollectEvidence {
            manifest_sha256: "abc".into(),
        };
        assert!(short.into_event().is_err());
        let upper = CaseEventRequest::CollectEvidence {
            manifest_sha256: "AB".repeat(32),
        };
        assert_eq!(
            upper.into_event().unwrap(),
            CaseEvent::CollectEvidence {
                manifest_sha256: "ab".repeat(32)
            }
        );
        let long = CaseEventRequest::Close {
            reason: "x".repeat(MAX_REASON_CHARS + 1),
        };
        assert!(long.into_event().is_err());
        let blank = CaseEventRequest::Replaced {
            new_serial: "  ".into(),
        };
        assert!(blank.into_event().is_err());
    }
}
