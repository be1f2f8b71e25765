//! RMA pages: `/rma` (the cases, filtered), `/rma/{id}` (one case: the part,
//! the rule and the samples that prove it, firmware suspicion, the vendor's
//! answers, the history and forms for the next human steps), and what the
//! node page and the fleet dashboard show of the pipeline.
//!
//! Every step goes through the same check and datastore call as the API
//! (`crate::api::rma::record`); the forms offered are the ones the case
//! machine would allow the viewer now, so a page never offers a step that
//! can only be refused.

use std::collections::BTreeMap;

use axum::Extension;
use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use minijinja::{Value, context};
use orchestrator_db::Db;
use orchestrator_db::rma::{RmaCase, RmaFilter};
use orchestrator_rma::{CaseState, FirmwareSuspicion, HealthFlag, ObservationKind, velocity};
use serde::Deserialize;

use super::{UiError, base, done, render, wants_json};
use crate::AppState;
use crate::api::rma::{
    CaseEventRequest, Offer, Step, actor_of, check_step, days_in_state, next_steps, severity_name, state_filter,
    state_name, state_since, state_words,
};
use crate::auth::Principal;
use crate::url::urlencode;

/// Case rows shown at once on `/rma`; the filters narrow the rest.
const CASE_ROWS_SHOWN: usize = 500;
/// Samples shown on a case page; the API returns them all.
const SAMPLE_ROWS_SHOWN: usize = 200;

/// `3 days 4 h`, `2 h 5 min`, `45 s`: how long, to the two largest units.
fn duration_words(seconds: i64) -> String {
    let s = seconds.max(0);
    let (days, hours, minutes) = (s / 86_400, s % 86_400 / 3600, s % 3600 / 60);
    match (days, hours, minutes) {
        (0, 0, 0) => format!("{s} s"),
        (0, 0, m) => format!("{m} min"),
        (0, h, 0) => format!("{h} h"),
        (0, h, m) => format!("{h} h {m} min"),
        (1, 0, _) => "1 day".to_owned(),
        (1, h, _) => format!("1 day {h} h"),
        (d, 0, _) => format!("{d} days"),
        (d, h, _) => format!("{d} days {h} h"),
    }
}

fn days_text(days: f64) -> String {
    format!("{days:.1}")
}

/// A stored snake_case name (failure mode, status) as words.
fn words(name: &str) -> String {
    name.replace('_', " ")
}

/// What one sample saw, as a sentence.
fn sample_words(kind: &ObservationKind) -> String {
    match kind {
        ObservationKind::Flag { flag, set } => {
            let flag = match flag {
                HealthFlag::RowRemapFailure => "row-remapping failure flag",
                HealthFlag::SramThresholdExceeded => "SRAM threshold exceeded flag",
            };
            format!("{flag} {}", if *set { "set" } else { "clear" })
        }
        ObservationKind::Xid { code } => format!("XID {code} logged"),
        ObservationKind::XidWindowCount {
            code,
            count,
            window_seconds,
        } => format!(
            "XID {code} seen {count} time(s) in the exporter's last {}",
            duration_words(*window_seconds)
        ),
        ObservationKind::FieldDiagnostic { passed: true } => "field diagnostic passed".to_owned(),
        ObservationKind::FieldDiagnostic { passed: false } => "field diagnostic failed".to_owned(),
        ObservationKind::SeriesScrape { present: true } => "the GPU's series present in the scrape".to_owned(),
        ObservationKind::SeriesScrape { present: false } => {
            "the GPU's series missing while the node reported".to_owned()
        }
        ObservationKind::BmcProbe { answered: true } => "the BMC answered".to_owned(),
        ObservationKind::BmcProbe { answered: false } => "the BMC did not answer".to_owned(),
    }
}

/// The firmware suspicion as the case page says it; `None` when no change
/// preceded the failure.
fn suspicion_value(suspicion: Option<&FirmwareSuspicion>) -> Value {
    let Some(s) = suspicion else {
        return Value::from(());
    };
    let change = &s.change;
    // Rollouts are linked by number; a rollout named otherwise is shown as text.
    let rollout_number = change
        .rollout
        .as_deref()
        .and_then(|r| r.trim_start_matches('#').parse::<i64>().ok());
    let rollout_link = rollout_number.map(|n| format!("/rollouts/{n}"));
    let rollout = rollout_number
        .map(|n| format!("#{n}"))
        .or_else(|| change.rollout.clone());
    context! {
        after => duration_words(s.after_seconds), component => change.component.clone(),
        from => change.from_version.clone(), to => change.to_version.clone(),
        release => change.release.clone(), rollout, rollout_link,
        changed_at => change.at.to_rfc3339(),
    }
}

/// One case as a row of a table (the list, the node page).
fn case_row(found: &RmaCase, now: DateTime<Utc>) -> Value {
    let case = &found.case;
    let part = &found.candidate.part;
    context! {
        id => case.id.clone(), link => format!("/rma/{}", urlencode(&case.id)),
        state => state_name(case.state), state_words => state_words(case.state), open => case.state.is_open(),
        node => case.node.clone(), serial => case.serial.clone(), slot => part.slot.clone(),
        vendor => case.vendor.clone(), rule => case.rule.clone(), failure_mode => words(&case.failure_mode),
        severity => severity_name(case.severity), opened => case.opened_at.to_rfc3339(),
        days => days_text(days_in_state(case, now)),
        firmware => found.candidate.firmware_suspected.as_ref().map(|s| format!(
            "began {} after {} firmware {} → {} (release {})",
            duration_words(s.after_seconds), s.change.component, s.change.from_version, s.change.to_version,
            s.change.release
        )),
    }
}

/// The states for a filter's select, in pipeline order.
fn state_options() -> Vec<Value> {
    CaseState::ALL
        .into_iter()
        .map(|s| context! { name => state_name(s), words => state_words(s) })
        .collect()
}

/// `/rma`'s filters. The page shows open cases unless asked for all.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ListQuery {
    open: Option<String>,
    node: Option<String>,
    vendor: Option<String>,
    state: Option<String>,
    msg: Option<String>,
}

fn non_empty(value: Option<&str>) -> Option<String> {
    value.map(str::trim).filter(|v| !v.is_empty()).map(str::to_owned)
}

pub(crate) async fn list(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
    Query(query): Query<ListQuery>,
) -> Result<Response, UiError> {
    let wanted = state_filter(query.state.as_deref())?;
    let open_only = match query.open.as_deref().map(str::trim) {
        None | Some("" | "true") => true,
        Some("false") => false,
        Some(other) => {
            return Err(UiError::new(
                StatusCode::BAD_REQUEST,
                format!("open must be true or false, not {other:?}"),
            ));
        }
    };
    let filter = RmaFilter {
        // A chosen state says which cases; "open only" would hide a closed state's.
        open_only: open_only && wanted.is_none(),
        node: non_empty(query.node.as_deref()),
        vendor: non_empty(query.vendor.as_deref()),
        serial: None,
    };
    let now = state.db.clock().now();
    let matching: Vec<RmaCase> = state
        .db
        .rma_cases(&filter)
        .await?
        .into_iter()
        .filter(|c| wanted.is_none_or(|s| c.case.state == s))
        .collect();
    let total = matching.len();
    let cases: Vec<Value> = matching
        .iter()
        .take(CASE_ROWS_SHOWN)
        .map(|c| case_row(c, now))
        .collect();
    let vendors = super::rma_pipeline::list_boxes(&state.db).await?;
    Ok(render(
        "rma.html",
        context! {
            vendors, cases, total, truncated => total > CASE_ROWS_SHOWN, shown => CASE_ROWS_SHOWN.min(total),
            states => state_options(),
            filter => context! {
                open => open_only, node => filter.node, vendor => filter.vendor, state => wanted.map(state_name),
            },
            flash => query.msg,
            ..base(&me, "rma", "RMA cases")
        },
    ))
}

/// A message left by the step that redirected here.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct CaseQuery {
    msg: Option<String>,
}

/// What the confirmation asks before a step.
fn question(step: Step, case: &orchestrator_rma::Case) -> String {
    match step {
        Step::CollectEvidence | Step::Resubmit => format!(
            "Record that the evidence package of {} is built, with this manifest hash?",
            case.id
        ),
        Step::VendorAccepted => format!("Record that the vendor accepted {}?", case.id),
        Step::VendorRejected => format!(
            "Record that the vendor rejected {}? The node stays held out of rollouts.",
            case.id
        ),
        Step::Replaced => format!("Record that GPU {} on {} was replaced?", case.serial, case.node),
        Step::Verified => format!(
            "Verify {} back in service with the new part? This ends the case and returns it to rollouts.",
            case.node
        ),
        Step::Close => format!(
            "Close {} without a replacement? {} returns to rollouts.",
            case.id, case.node
        ),
    }
}

/// The forms (or the reason there is none) for the steps the case's state
/// allows now.
fn step_values(found: &RmaCase, me: &Principal, now: DateTime<Utc>) -> Vec<Value> {
    let case = &found.case;
    next_steps(case, &actor_of(me), now)
        .into_iter()
        .map(|(step, offer)| {
            let question = question(step, case);
            let why_not = match offer {
                Offer::Allowed => None,
                Offer::NeedsRole(role) => Some(format!("needs the {role} role")),
                Offer::NotTheSamePerson => {
                    Some("you recorded the replacement: another person must verify it (four eyes)".to_owned())
                }
            };
            context! {
                name => step.name(), label => step.label(), field => step.field(), question,
                allowed => offer == Offer::Allowed, why_not, danger => step == Step::Close,
                reason_label => if step == Step::VendorRejected { "The vendor's reason, verbatim" } else { "Why" },
            }
        })
        .collect()
}

pub(crate) async fn case(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
    Path(id): Path<String>,
    Query(query): Query<CaseQuery>,
) -> Result<Response, UiError> {
    let found = state.db.rma_case(&id).await?;
    let now = state.db.clock().now();
    let case = &found.case;
    let candidate = &found.candidate;
    let samples: Vec<Value> = candidate
        .samples
        .iter()
        .take(SAMPLE_ROWS_SHOWN)
        .map(|s| context! { at => s.at.to_rfc3339(), source => s.source_id.clone(), what => sample_words(&s.kind) })
        .collect();
    let history: Vec<Value> = case
        .history
        .iter()
        .map(|t| {
            context! {
                at => t.at.to_rfc3339(), from => state_words(t.from), to => state_words(t.to), to_name => state_name(t.to),
                step => words(&t.event), actor => t.actor.clone(), detail => t.detail.clone(),
            }
        })
        .collect();
    // The vendor's latest answer; a rejection reason is kept after a
    // resubmission, so it is the answer only while nothing came after it.
    let answer = case
        .history
        .iter()
        .rev()
        .find(|t| matches!(t.to, CaseState::Accepted | CaseState::Rejected))
        .map(|t| {
            context! {
                accepted => t.to == CaseState::Accepted, at => t.at.to_rfc3339(), by => t.actor.clone(),
                reason => t.detail.clone(),
            }
        });
    let title = format!("RMA case {}", case.id);
    let boxes = super::rma_pipeline::case_boxes(&state.db, &found, &me).await?;
    Ok(render(
        "rma_case.html",
        context! {
            case => context! {
                id => case.id.clone(), state => state_name(case.state), state_words => state_words(case.state),
                open => case.state.is_open(), node => case.node.clone(), vendor => case.vendor.clone(),
                serial => case.serial.clone(), rule => case.rule.clone(), failure_mode => words(&case.failure_mode),
                severity => severity_name(case.severity), opened => case.opened_at.to_rfc3339(),
                since => state_since(case).to_rfc3339(), days => days_text(days_in_state(case, now)),
                rejection_reason => case.rejection_reason.clone(), manifest => case.manifest_sha256.clone(),
                vendor_reference => case.vendor_reference.clone(), replacement => case.replacement_serial.clone(),
                evidence_collected => case.state == CaseState::EvidenceCollected,
                rejected => case.state == CaseState::Rejected,
            },
            answer,
            part => context! {
                kind => candidate.part.part_kind.clone(), number => candidate.part.part_number.clone(),
                slot => candidate.part.slot.clone(),
            },
            criterion => context! {
                status => words(crate::api::rma::status_name(candidate.status)),
                began => candidate.began_at.to_rfc3339(),
                document => candidate.document_edition.clone(),
            },
            suspicion => suspicion_value(candidate.firmware_suspected.as_ref()),
            samples, samples_total => candidate.samples.len(),
            samples_hidden => candidate.samples.len().saturating_sub(SAMPLE_ROWS_SHOWN),
            history, steps => step_values(&found, &me, now), boxes,
            flash => query.msg,
            ..base(&me, "rma", &title)
        },
    ))
}

/// A step from the case page: a confirmation page first (without
/// JavaScript), then the step through the same check as the API.
pub(crate) async fn action(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
    headers: HeaderMap,
    Path((id, name)): Path<(String, String)>,
    Form(mut form): Form<BTreeMap<String, String>>,
) -> Result<Response, UiError> {
    let json = wants_json(&headers);
    let step = Step::parse(&name)
        .ok_or_else(|| UiError::new(StatusCode::NOT_FOUND, format!("no RMA step {name:?}")).json(json))?;
    let found = state.db.rma_case(&id).await.map_err(|e| UiError::from(e).json(json))?;
    let back = format!("/rma/{}", urlencode(&id));
    form.remove("csrf");

    // Refused before asking to confirm: the machine would refuse it anyway.
    check_step(&found.case, step, &actor_of(&me), state.db.clock().now()).map_err(|e| UiError::from(e).json(json))?;

    // Without JavaScript the first post shows a confirmation page; the
    // script confirms in a dialog and sends `confirmed=yes` at once.
    if form.get("confirmed").map(String::as_str) != Some("yes") {
        form.remove("confirmed");
        let ctx = context! {
            action_label => step.label(), question => question(step, &found.case),
            action_url => format!("/rma/{}/{}", urlencode(&id), step.name()),
            fields => form, needs_reason => step.field() == Some("reason"),
            danger => step == Step::Close, back_url => back,
            ..base(&me, "rma", "Confirm")
        };
        return Ok(render("confirm.html", ctx));
    }

    let request = CaseEventRequest::for_step(step, |key| form.get(key).cloned().unwrap_or_default());
    let after = crate::api::rma::record(&state, &id, request, &me)
        .await
        .map_err(|e| UiError::from(e).json(json))?;
    let mut message = format!("RMA case {} is now {}.", after.case.id, state_words(after.case.state));
    if !after.case.state.is_open() {
        message.push_str(&format!(
            " {} is no longer held out of rollouts by it.",
            after.case.node
        ));
    }
    Ok(done(json, &back, &message).into_response())
}

/// A node's cases (every one, oldest first) and the open ones that hold it
/// out of rollouts.
pub(crate) async fn node_cases(db: &Db, node: &str) -> Result<(Vec<Value>, Vec<Value>), UiError> {
    let now = db.clock().now();
    let cases = db
        .rma_cases(&RmaFilter {
            node: Some(node.to_owned()),
            ..Default::default()
        })
        .await?;
    let holds = cases
        .iter()
        .filter(|c| c.case.state.is_open())
        .map(|c| {
            context! {
                id => c.case.id.clone(), link => format!("/rma/{}", urlencode(&c.case.id)),
                serial => c.case.serial.clone(), slot => c.candidate.part.slot.clone(),
                state => state_words(c.case.state),
            }
        })
        .collect();
    Ok((cases.iter().map(|c| case_row(c, now)).collect(), holds))
}

/// A node's parts as its page lists them (replaced ones too, marked), with
/// the number of cases each part has.
pub(crate) async fn node_parts(db: &Db, node: &str) -> Result<Vec<Value>, UiError> {
    let parts = db
        .parts(&orchestrator_db::parts::PartFilter {
            node: Some(node.to_owned()),
            include_removed: true,
            ..Default::default()
        })
        .await?;
    let cases = db
        .rma_cases(&RmaFilter {
            node: Some(node.to_owned()),
            ..Default::default()
        })
        .await?;
    Ok(parts
        .iter()
        .map(|p| {
            let mine: Vec<Value> = cases
                .iter()
                .filter(|c| c.case.serial == p.serial)
                .map(|c| {
                    context! {
                        id => c.case.id.clone(), link => format!("/rma/{}", urlencode(&c.case.id)),
                        state => state_name(c.case.state), state_words => state_words(c.case.state),
                    }
                })
                .collect();
            context! {
                serial => p.serial.clone(), part_number => p.part_number.clone(), kind => p.part_kind.clone(),
                slot => p.slot.clone(), lot => p.lot.clone(), date_code => p.date_code.clone(),
                firmware => p.firmware_version.clone(), health => p.health.clone(),
                health_ok => p.health.as_deref().is_none_or(|h| h == "OK"),
                removed => p.removed_at.map(|t| t.to_rfc3339()), cases => mine,
            }
        })
        .collect())
}

/// The dashboard's replacement pipeline: open cases per state, the oldest
/// open case, the vendors' acceptance rate, quota used and left, days per
/// state and the weekly trend.
pub(crate) async fn pipeline(db: &Db) -> Result<Value, UiError> {
    let now = db.clock().now();
    let cases: Vec<orchestrator_rma::Case> = db
        .rma_cases(&RmaFilter::default())
        .await?
        .into_iter()
        .map(|c| c.case)
        .collect();
    let criteria = db.rma_criteria().await?;
    let figures = velocity(&cases, &criteria, now);
    let velocity = super::rma_pipeline::velocity_boxes(db, &cases, &figures).await?;
    let states: Vec<Value> = CaseState::ALL
        .into_iter()
        .filter(|s| s.is_open())
        .map(|s| {
            context! {
                name => state_name(s), words => state_words(s),
                count => figures.open_by_state.get(&s).copied().unwrap_or(0),
            }
        })
        .collect();
    let open_total: usize = figures.open_by_state.values().sum();
    let oldest = figures.oldest_open.as_ref().map(|(id, at)| {
        context! {
            id => id.clone(), link => format!("/rma/{}", urlencode(id)), opened => at.to_rfc3339(),
            days => days_text(((now - *at).num_seconds() as f64 / 86_400.0).max(0.0)),
        }
    });
    let (accepted, rejected) = figures
        .acceptance
        .iter()
        .fold((0, 0), |(a, r), x| (a + x.accepted, r + x.rejected));
    let percent = |a: u64, r: u64| format!("{:.0}", a as f64 * 100.0 / (a + r).max(1) as f64);
    let acceptance: Vec<Value> = figures
        .acceptance
        .iter()
        .map(|x| {
            context! {
                vendor => x.vendor.clone(), failure_mode => words(&x.failure_mode),
                accepted => x.accepted, rejected => x.rejected, percent => percent(x.accepted, x.rejected),
            }
        })
        .collect();
    Ok(context! {
        states, open_total, oldest, acceptance, velocity,
        answers => accepted + rejected, accepted, rejected, percent => percent(accepted, rejected),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_words() {
        assert_eq!(duration_words(45), "45 s");
        assert_eq!(duration_words(7500), "2 h 5 min");
        assert_eq!(duration_words(3600), "1 h");
        assert_eq!(duration_words(86_400 + 3 * 3600), "1 day 3 h");
        assert_eq!(duration_words(3 * 86_400), "3 days");
        assert_eq!(duration_words(-5), "0 s");
    }

    #[test]
    fn samples_read_as_words() {
        let cases = [
            (
                ObservationKind::Flag {
                    flag: HealthFlag::RowRemapFailure,
                    set: true,
                },
                "row-remapping failure flag set",
            ),
            (ObservationKind::Xid { code: 79 }, "XID 79 logged"),
            (
                ObservationKind::XidWindowCount {
                    code: 79,
                    count: 3,
                    window_seconds: 86_400,
                },
                "XID 79 seen 3 time(s) in the exporter's last 1 day",
            ),
            (
                ObservationKind::FieldDiagnostic { passed: false },
                "field diagnostic failed",
            ),
            (ObservationKind::BmcProbe { answered: false }, "the BMC did not answer"),
        ];
        for (kind, want) in cases {
            assert_eq!(sample_words(&kind), want);
        }
    }
}
