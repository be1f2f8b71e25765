//! The vendor side of the RMA pages: the case page's evidence box (the
//! package's manifest, download, build), its attachments and upload form,
//! its submit box with the vendor's quota and the case's queue position;
//! `/rma`'s quota per vendor and latest cluster report; and the dashboard's
//! velocity figures (days per state, weekly trend).
//!
//! Every action goes through the same function as the API route
//! (`api::rma_evidence`, `api::rma_pipeline`), so a page can do nothing
//! the API would refuse, and refuses in the same words.

use std::collections::BTreeMap;

use axum::Extension;
use axum::Form;
use axum::extract::{Multipart, Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Datelike, Duration, Utc};
use minijinja::{Value, context};
use orchestrator_db::Db;
use orchestrator_db::rma::RmaCase;
use orchestrator_db::rma_views::VendorQuota;
use orchestrator_rma::{CaseState, Velocity};

use super::{UiError, confirm_page, done, wants_json};
use crate::AppState;
use crate::api::rma::{Offer, Step, actor_of, next_steps, state_words};
use crate::api::rma_evidence::{EvidenceManifest, archive_name, kind_name};
use crate::api::rma_pipeline::ClusterScanView;
use crate::auth::Principal;
use crate::url::urlencode;

/// Weeks the dashboard's trend covers.
const TREND_WEEKS: i64 = 8;

fn size_words(bytes: u64) -> String {
    match bytes {
        b if b < 1024 => format!("{b} B"),
        b if b < 1024 * 1024 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0)),
    }
}

/// The quota line of one vendor, as `/rma` and the case page say it.
fn quota_value(q: &VendorQuota) -> Value {
    let period = if (q.period_days - 7.0).abs() < 1e-9 {
        "week".to_owned()
    } else {
        format!("{} days", q.period_days)
    };
    context! {
        vendor => q.vendor.clone(), limit => q.status.limit, used => q.status.used, left => q.status.left,
        period, next_slot => q.status.next_slot_at.map(|t| t.to_rfc3339()), waiting => q.queue.len(),
        queue => q.queue.iter().map(|c| context! {
            id => c.case_id.clone(), link => format!("/rma/{}", urlencode(&c.case_id)), position => c.position,
            severity => crate::api::rma::severity_name(c.severity),
        }).collect::<Vec<_>>(),
    }
}

/// What the case page shows of the evidence, the attachments and submission.
pub(crate) async fn case_boxes(db: &Db, found: &RmaCase, me: &Principal) -> Result<Value, UiError> {
    let case = &found.case;
    let id = &case.id;
    let now = db.clock().now();
    let base_url = format!("/api/v1/rma/cases/{}", urlencode(id));
    // A package that cannot be built (a secret in an uploaded file) is
    // shown as the reason, not as a broken page.
    let package = match db.rma_evidence_download(id).await {
        Ok(p) => {
            let m = EvidenceManifest::of(&p, case.manifest_sha256.as_deref());
            let json = serde_json::to_value(&m).unwrap_or_default();
            let files: Vec<Value> = json["files"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|f| {
                    context! {
                        path => f["path"].as_str().unwrap_or_default().to_owned(),
                        size => size_words(f["size"].as_u64().unwrap_or(0)),
                        sha256 => f["sha256"].as_str().unwrap_or_default().to_owned(),
                    }
                })
                .collect();
            context! {
                ok => true, files, sha256 => p.manifest_sha256.clone(), size => size_words(p.archive.len() as u64),
                matches_recorded => case.manifest_sha256.as_deref() == Some(p.manifest_sha256.as_str()),
            }
        }
        Err(err) => context! { ok => false, error => UiError::from(err).message },
    };
    let actor = actor_of(me);
    let steps = next_steps(case, &actor, now);
    let build = steps
        .iter()
        .find(|(s, _)| matches!(s, Step::CollectEvidence | Step::Resubmit))
        .map(|(s, offer)| {
            context! {
                label => if *s == Step::Resubmit { "Build new evidence and record it" } else { "Build evidence package and record it" },
                allowed => *offer == Offer::Allowed,
                why_not => match offer { Offer::NeedsRole(r) => Some(format!("needs the {r} role")), _ => None },
            }
        });
    let attachments: Vec<Value> = db
        .rma_attachments(id)
        .await?
        .iter()
        .map(|a| {
            context! {
                name => a.name.clone(), kind => kind_name(a.kind).replace('_', " "), size => size_words(a.size_bytes),
                sha256 => a.sha256.clone(), by => a.added_by.clone(), at => a.added_at.to_rfc3339(),
                link => format!("{base_url}/attachments/{}", urlencode(&a.name)),
            }
        })
        .collect();
    let quota = db.rma_quotas().await?.into_iter().find(|q| q.vendor == case.vendor);
    let position = quota
        .as_ref()
        .and_then(|q| q.queue.iter().find(|c| &c.case_id == id).map(|c| c.position));
    let submit = (case.state == CaseState::EvidenceCollected).then(|| {
        context! {
            quota => quota.as_ref().map(quota_value), position,
            // Within the free slots in queue order: what the datastore will admit.
            admitted_now => match (&quota, position) {
                (Some(q), Some(p)) => (p as u64) <= q.status.left,
                _ => false,
            },
        }
    });
    Ok(context! {
        package, build, attachments, submit,
        download => format!("{base_url}/evidence"), manifest_link => format!("{base_url}/evidence/manifest"),
        archive_name => archive_name(id),
        can_upload => me.user.role >= orchestrator_types::Role::ReleaseManager && case.state.is_open(),
        can_submit => me.user.role >= orchestrator_types::Role::ReleaseManager,
    })
}

/// The case page's build button: builds the package and records it.
pub(crate) async fn build_evidence(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(mut form): Form<BTreeMap<String, String>>,
) -> Result<Response, UiError> {
    let json = wants_json(&headers);
    let back = format!("/rma/{}", urlencode(&id));
    form.remove("csrf");
    if form.get("confirmed").map(String::as_str) != Some("yes") {
        // Refused before asking to confirm, as the step forms are.
        let found = state.db.rma_case(&id).await.map_err(|e| UiError::from(e).json(json))?;
        let step = crate::api::rma_evidence::evidence_step(&found.case);
        crate::api::rma::check_step(&found.case, step, &actor_of(&me), state.db.clock().now())
            .map_err(|e| UiError::from(e).json(json))?;
        return Ok(confirm_page(
            &me,
            "rma",
            "Build evidence package",
            format!("Build the evidence package of {id} from the records now and record it as collected?"),
            format!("{back}/evidence"),
            back,
            BTreeMap::new(),
        ));
    }
    let (after, package) = crate::api::rma_evidence::collect(&state, &id, &me)
        .await
        .map_err(|e| UiError::from(e).json(json))?;
    let message = format!(
        "RMA case {} is now {}; evidence manifest sha256 {}.",
        after.case.id,
        state_words(after.case.state),
        package.manifest_sha256
    );
    Ok(done(json, &back, &message).into_response())
}

/// The case page's upload form (multipart; its CSRF field was checked by the authorization layer).
pub(crate) async fn upload(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
    headers: HeaderMap,
    Path(id): Path<String>,
    form: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<Response, UiError> {
    let json = wants_json(&headers);
    let form =
        form.map_err(|r| UiError::from(crate::error::ApiError::UnsupportedMediaType(r.body_text())).json(json))?;
    let added = crate::api::rma_evidence::attach(&state, &id, form, &me)
        .await
        .map_err(|e| UiError::from(e).json(json))?;
    let message = format!(
        "Attached {} ({}, sha256 {}) to RMA case {id}.",
        added.name,
        size_words(added.size_bytes),
        added.sha256
    );
    Ok(done(json, &format!("/rma/{}", urlencode(&id)), &message).into_response())
}

/// The case page's submit box.
pub(crate) async fn submit(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(mut form): Form<BTreeMap<String, String>>,
) -> Result<Response, UiError> {
    let json = wants_json(&headers);
    let back = format!("/rma/{}", urlencode(&id));
    form.remove("csrf");
    let reference = form.get("vendor_reference").cloned().unwrap_or_default();
    if form.get("confirmed").map(String::as_str) != Some("yes") {
        state.db.rma_case(&id).await.map_err(|e| UiError::from(e).json(json))?;
        form.remove("confirmed");
        return Ok(confirm_page(
            &me,
            "rma",
            "Submit to the vendor",
            format!(
                "Record that {id} was submitted to the vendor under reference {:?}? It counts against the vendor's quota.",
                reference.trim()
            ),
            format!("{back}/submit"),
            back,
            form,
        ));
    }
    let after = crate::api::rma_pipeline::submit(&state, &id, &reference, &me)
        .await
        .map_err(|e| UiError::from(e).json(json))?;
    let message = format!(
        "RMA case {} is now {} (vendor reference {}).",
        after.case.id,
        state_words(after.case.state),
        after.case.vendor_reference.as_deref().unwrap_or_default()
    );
    Ok(done(json, &back, &message).into_response())
}

/// `/rma`'s quota per vendor and the latest cluster report.
pub(crate) async fn list_boxes(db: &Db) -> Result<Value, UiError> {
    let quotas: Vec<Value> = db.rma_quotas().await?.iter().map(quota_value).collect();
    let scan = db.cluster_scans(1).await?.first().map(ClusterScanView::of);
    let clusters = scan.as_ref().map(|s| {
        let start = s.period_start().to_rfc3339();
        let export = |format: &str| {
            format!(
                "/api/v1/rma/clusters/report?format={format}&period_start={}",
                urlencode(&start)
            )
        };
        context! {
            period => s.period_text(), groups_tested => s.groups_tested(),
            clusters => s.clusters().iter().map(|c| context! {
                label => c.label(), parts => c.parts(), failures => c.failures(), ratio => c.ratio_text(),
            }).collect::<Vec<_>>(),
            csv => export("csv"), json => export("json"),
        }
    });
    Ok(context! { quotas, clusters })
}

/// The Monday (00:00 UTC) of the week holding `at`.
fn week_start(at: DateTime<Utc>) -> DateTime<Utc> {
    let date = at.date_naive() - Duration::days(i64::from(at.weekday().num_days_from_monday()));
    date.and_hms_opt(0, 0, 0).map_or(at, |d| d.and_utc())
}

/// The dashboard's velocity: days per state (p50/p90), quota per vendor, and
/// cases opened, answered and finished per week over the last weeks.
pub(crate) async fn velocity_boxes(
    db: &Db,
    cases: &[orchestrator_rma::Case],
    figures: &Velocity,
) -> Result<Value, UiError> {
    let now = db.clock().now();
    let days = |x: Option<f64>| x.map(|d| format!("{d:.1}"));
    let per_state: Vec<Value> = figures
        .days_in_state
        .iter()
        .map(|s| {
            context! {
                words => state_words(s.state), stays => s.stays, p50 => days(s.p50_days), p90 => days(s.p90_days),
            }
        })
        .collect();
    let quotas: Vec<Value> = db.rma_quotas().await?.iter().map(quota_value).collect();
    let first = week_start(now) - Duration::weeks(TREND_WEEKS - 1);
    let mut weeks: Vec<(DateTime<Utc>, u64, u64, u64)> = (0..TREND_WEEKS)
        .map(|i| (first + Duration::weeks(i), 0, 0, 0))
        .collect();
    let slot = |at: DateTime<Utc>| {
        let i = (at - first).num_days().div_euclid(7);
        usize::try_from(i).ok().filter(|i| *i < TREND_WEEKS as usize)
    };
    for case in cases {
        if let Some(i) = slot(case.opened_at) {
            weeks[i].1 += 1;
        }
        for t in &case.history {
            if let Some(i) = slot(t.at) {
                match t.to {
                    CaseState::Accepted | CaseState::Rejected => weeks[i].2 += 1,
                    CaseState::Verified | CaseState::Closed => weeks[i].3 += 1,
                    _ => {}
                }
            }
        }
    }
    let most = weeks.iter().map(|w| w.1.max(w.2).max(w.3)).max().unwrap_or(0).max(1);
    let trend: Vec<Value> = weeks
        .iter()
        .map(|(start, opened, answered, finished)| {
            context! {
                week => start.format("%m-%d").to_string(), opened, answered, finished,
                opened_pct => opened * 100 / most, finished_pct => finished * 100 / most,
            }
        })
        .collect();
    Ok(context! { per_state, quotas, trend })
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    #[test]
    fn weeks_start_on_monday_at_midnight() {
        let thursday = Utc.with_ymd_and_hms(2026, 12, 3, 15, 30, 0).unwrap();
        assert_eq!(
            week_start(thursday),
            Utc.with_ymd_and_hms(2026, 11, 30, 0, 0, 0).unwrap()
        );
        let monday = Utc.with_ymd_and_hms(2026, 11, 30, 0, 0, 0).unwrap();
        assert_eq!(week_start(monday), monday);
    }

    #[test]
    fn sizes_read_as_words() {
        assert_eq!(size_words(512), "512 B");
        assert_eq!(size_words(2048), "2.0 KiB");
        assert_eq!(size_words(3 * 1024 * 1024), "3.0 MiB");
    }
}
