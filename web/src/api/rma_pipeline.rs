//! The vendor side of the pipeline: submitting a case within the vendor's
//! quota (what exceeds it waits in a queue by severity and age), the quota
//! of every vendor with criteria in force, and the defect-cluster scans with
//! their export for the vendor conversation.

use axum::Extension;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use orchestrator_db::DbError;
use orchestrator_db::rma::ClusterScan;
use orchestrator_db::rma_views::VendorQuota;
use orchestrator_rma::CaseState;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::rma::{RmaCaseDetail, actor_of, severity_name, state_words};
use super::{ApiJson, ApiPath, ApiQuery, in_range};
use crate::AppState;
use crate::auth::Principal;
use crate::error::{ApiError, ErrorBody};

/// Longest vendor reference (case or ticket number) accepted.
pub(crate) const MAX_REFERENCE_CHARS: usize = 128;

/// Submission of a case to its vendor.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// The vendor's case or ticket number (1-128 characters).
    vendor_reference: String,
}

fn invalid(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::Invalid(vec![orchestrator_db::model::FieldError {
        field: field.to_owned(),
        message: message.into(),
    }])
}

/// Submits case `id` with `reference` as `principal`: within the vendor's
/// quota in queue order, or refused (409) with the case's queue position.
/// Shared by the API and the case page.
pub(crate) async fn submit(
    state: &AppState,
    id: &str,
    reference: &str,
    principal: &Principal,
) -> Result<orchestrator_db::rma::RmaCase, ApiError> {
    let reference = reference.trim();
    if reference.is_empty() {
        return Err(invalid("vendor_reference", "must not be empty"));
    }
    if reference.chars().count() > MAX_REFERENCE_CHARS {
        return Err(invalid(
            "vendor_reference",
            format!("must be at most {MAX_REFERENCE_CHARS} characters"),
        ));
    }
    let current = state.db.rma_case(id).await?;
    if current.case.state != CaseState::EvidenceCollected {
        return Err(ApiError::Conflict(format!(
            "RMA case {id} is {}: only a case with its evidence collected can be submitted",
            state_words(current.case.state)
        )));
    }
    let quota = match state.db.rma_quota(&current.case.vendor).await {
        Ok(quota) => quota,
        Err(DbError::NotFound { .. }) => {
            return Err(ApiError::Conflict(format!(
                "no criteria for vendor {} are in force, so it has no quota to submit within: sync rma/*.yaml \
                 from the policy repository",
                current.case.vendor
            )));
        }
        Err(other) => return Err(other.into()),
    };
    let actor = actor_of(principal);
    state.db.submit_rma_case(id, &quota, reference, &actor).await?;
    Ok(state.db.rma_case(id).await?)
}

/// Submits a case (evidence collected) to its vendor with the vendor's reference, within the
/// vendor's quota this period: the waiting cases go in order of severity, then age. A case beyond
/// the quota is refused with its queue position and keeps waiting. Needs release_manager; audited as
/// `rma.transition`.
#[utoipa::path(post, path = "/api/v1/rma/cases/{id}/submit", tag = "rma", request_body = SubmitRequest,
    params(("id" = String, Path, description = "Case id")),
    responses((status = 200, body = RmaCaseDetail, description = "The case, submitted"),
              (status = 400, body = ErrorBody, description = "Malformed JSON"),
              (status = 403, body = ErrorBody, description = "The caller's role is too low"),
              (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "Over the vendor's quota (the message gives the \
               case's position in the queue), not in evidence_collected, or no criteria for the vendor in force"),
              (status = 422, body = ErrorBody, description = "vendor_reference missing, empty or too long")))]
pub(crate) async fn submit_case(
    State(state): State<AppState>,
    principal: Option<Extension<Principal>>,
    ApiPath(id): ApiPath<String>,
    ApiJson(request): ApiJson<SubmitRequest>,
) -> Result<ApiJson<RmaCaseDetail>, ApiError> {
    let Extension(principal) = principal.ok_or(ApiError::Unauthorized)?;
    let after = submit(&state, &id, &request.vendor_reference, &principal).await?;
    Ok(ApiJson(RmaCaseDetail::of(&after, state.db.clock().now())))
}

/// A case waiting for a slot.
#[derive(Debug, Serialize, ToSchema)]
pub struct QueuedCaseView {
    case_id: String,
    /// 1-based place in the vendor's queue.
    position: usize,
    /// `low`, `medium`, `high` or `critical`.
    severity: String,
    opened_at: DateTime<Utc>,
}

/// A vendor's quota this period.
#[derive(Debug, Serialize, ToSchema)]
pub struct QuotaView {
    vendor: String,
    /// Submissions allowed in any rolling period.
    quota: u64,
    /// Length of the period in days.
    period_days: f64,
    /// Submissions in the period ending now.
    used: u64,
    /// Submissions still possible now.
    left: u64,
    /// When the next slot frees, if none is free now.
    next_slot_at: Option<DateTime<Utc>>,
    /// Cases with their evidence collected, in submission order (severity, then age).
    queue: Vec<QueuedCaseView>,
}

impl QuotaView {
    pub(crate) fn of(q: &VendorQuota) -> Self {
        QuotaView {
            vendor: q.vendor.clone(),
            quota: q.status.limit,
            period_days: q.period_days,
            used: q.status.used,
            left: q.status.left,
            next_slot_at: q.status.next_slot_at,
            queue: q
                .queue
                .iter()
                .map(|c| QueuedCaseView {
                    case_id: c.case_id.clone(),
                    position: c.position,
                    severity: severity_name(c.severity).to_owned(),
                    opened_at: c.opened_at,
                })
                .collect(),
        }
    }
}

/// Every vendor with criteria in force: its quota, used and left this period, and the queue.
#[utoipa::path(get, path = "/api/v1/rma/quota", tag = "rma",
    responses((status = 200, body = [QuotaView], description = "By vendor")))]
pub(crate) async fn quota(State(state): State<AppState>) -> Result<ApiJson<Vec<QuotaView>>, ApiError> {
    let quotas = state.db.rma_quotas().await?;
    Ok(ApiJson(quotas.iter().map(QuotaView::of).collect()))
}

/// One cluster of a scan: a group of parts failing more often than the rest of the fleet.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ClusterView {
    /// `lot`, `serial_prefix`, `part_number` or `platform` (the most specific group reported).
    attribute: String,
    /// The group's value (for a lot: `part_number/lot`).
    value: String,
    /// Parts in the group.
    parts: u64,
    /// Failed parts counted.
    failures: u64,
    /// Failures expected at the rest of the fleet's rates.
    expected: f64,
    /// Rate ratio, group over the rest of the fleet.
    rate_ratio: Option<f64>,
    /// Exact 95% interval of the ratio, lower end.
    ci95_lower: Option<f64>,
    /// Upper end; absent when unbounded.
    ci95_upper: Option<f64>,
    /// Holm-adjusted p-value.
    adjusted_p: Option<f64>,
    /// Coarser groups flagged because of this one (not separate clusters).
    parents: Vec<String>,
    /// Serials of the failed parts.
    failed_serials: Vec<String>,
}

/// A stored scan of one period.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ClusterScanView {
    period_start: DateTime<Utc>,
    period_end: DateTime<Utc>,
    scanned_at: DateTime<Utc>,
    /// Groups tested (the family the error rate is controlled over).
    groups_tested: u64,
    /// Family-wise error rate of the scan.
    alpha: Option<f64>,
    /// Failures counted (firmware-suspected and system-level ones left out).
    counted_failures: u64,
    firmware_suspected_excluded: u64,
    clusters: Vec<ClusterView>,
}

fn group_text(group: &Value) -> (String, String) {
    let attribute = match &group["attribute"] {
        Value::String(s) => snake(s),
        other => other.to_string(),
    };
    (attribute, group["value"].as_str().unwrap_or_default().to_owned())
}

/// `SerialPrefix` -> `serial_prefix`: the stored report spells attributes as Rust names.
fn snake(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

impl ClusterScanView {
    /// The stored report read leniently: a field a later version renamed
    /// shows as absent rather than failing the page.
    pub(crate) fn of(scan: &ClusterScan) -> Self {
        let r = &scan.report;
        let clusters = r["clusters"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|c| {
                let t = &c["test"];
                let (attribute, value) = group_text(&t["group"]);
                ClusterView {
                    attribute,
                    value,
                    parts: t["parts"].as_u64().unwrap_or(0),
                    failures: t["failures"].as_u64().unwrap_or(0),
                    expected: t["expected"].as_f64().unwrap_or(0.0),
                    rate_ratio: t["rate_ratio"].as_f64(),
                    ci95_lower: t["ci95_lower"].as_f64(),
                    ci95_upper: t["ci95_upper"].as_f64(),
                    adjusted_p: t["adjusted_p"].as_f64(),
                    parents: c["parents"]
                        .as_array()
                        .map(Vec::as_slice)
                        .unwrap_or_default()
                        .iter()
                        .map(|g| {
                            let (a, v) = group_text(g);
                            format!("{a} {v}")
                        })
                        .collect(),
                    failed_serials: c["failed_serials"]
                        .as_array()
                        .map(Vec::as_slice)
                        .unwrap_or_default()
                        .iter()
                        .filter_map(|s| s.as_str().map(str::to_owned))
                        .collect(),
                }
            })
            .collect();
        ClusterScanView {
            period_start: scan.period_start,
            period_end: scan.period_end,
            scanned_at: scan.scanned_at,
            groups_tested: r["groups_tested"].as_u64().unwrap_or(0),
            alpha: r["config"]["alpha"].as_f64(),
            counted_failures: r["counted_failures"].as_u64().unwrap_or(0),
            firmware_suspected_excluded: r["firmware_suspected_excluded"].as_u64().unwrap_or(0),
            clusters,
        }
    }

    pub(crate) fn clusters(&self) -> &[ClusterView] {
        &self.clusters
    }
}

impl ClusterView {
    pub(crate) fn label(&self) -> String {
        format!("{} {}", self.attribute.replace('_', " "), self.value)
    }
    pub(crate) fn parts(&self) -> u64 {
        self.parts
    }
    pub(crate) fn failures(&self) -> u64 {
        self.failures
    }
    pub(crate) fn ratio_text(&self) -> String {
        let f = |x: Option<f64>| x.map_or("∞".to_owned(), |v| format!("{v:.2}"));
        format!(
            "{} (95% interval {}–{})",
            f(self.rate_ratio),
            f(self.ci95_lower),
            f(self.ci95_upper)
        )
    }
}

impl ClusterScanView {
    pub(crate) fn period_text(&self) -> String {
        format!(
            "{} – {}",
            self.period_start.format("%Y-%m-%d"),
            self.period_end.format("%Y-%m-%d")
        )
    }
    pub(crate) fn groups_tested(&self) -> u64 {
        self.groups_tested
    }
    pub(crate) fn period_start(&self) -> DateTime<Utc> {
        self.period_start
    }
}

/// How many scans to list.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ScansQuery {
    /// Scans to return, newest period first (1-100, default 10).
    limit: Option<u64>,
}

/// The latest defect-cluster scans, newest period first: groups tested, failures counted and the
/// clusters with their rate ratio and interval.
#[utoipa::path(get, path = "/api/v1/rma/clusters", tag = "rma", params(ScansQuery),
    responses((status = 200, body = [ClusterScanView]), (status = 400, body = ErrorBody)))]
pub(crate) async fn clusters(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ScansQuery>,
) -> Result<ApiJson<Vec<ClusterScanView>>, ApiError> {
    let limit = in_range("limit", query.limit, 1, 100)?.unwrap_or(10);
    let scans = state.db.cluster_scans(limit).await?;
    Ok(ApiJson(scans.iter().map(ClusterScanView::of).collect()))
}

/// Which report to export, and how.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReportQuery {
    /// `json` (default: the whole stored report, every group tested) or `csv` (one row per cluster).
    format: Option<String>,
    /// The scan whose period starts then (RFC 3339); the latest when absent.
    period_start: Option<DateTime<Utc>>,
}

/// How many scans back an export may reach by `period_start`: two years of weekly scans.
const REPORT_SCANS_SEARCHED: u64 = 120;

fn csv_text(view: &ClusterScanView) -> Result<String, ApiError> {
    let mut out = csv::Writer::from_writer(Vec::new());
    let internal = |e: csv::Error| ApiError::Internal(Box::new(e));
    out.write_record([
        "period_start",
        "period_end",
        "groups_tested",
        "attribute",
        "value",
        "parts",
        "failures",
        "expected",
        "rate_ratio",
        "ci95_lower",
        "ci95_upper",
        "adjusted_p",
        "parents",
        "failed_serials",
    ])
    .map_err(internal)?;
    let num = |x: Option<f64>| x.map(|v| format!("{v}")).unwrap_or_default();
    for c in &view.clusters {
        out.write_record([
            view.period_start.to_rfc3339(),
            view.period_end.to_rfc3339(),
            view.groups_tested.to_string(),
            c.attribute.clone(),
            c.value.clone(),
            c.parts.to_string(),
            c.failures.to_string(),
            format!("{}", c.expected),
            num(c.rate_ratio),
            num(c.ci95_lower),
            num(c.ci95_upper),
            num(c.adjusted_p),
            c.parents.join(" "),
            c.failed_serials.join(" "),
        ])
        .map_err(internal)?;
    }
    let bytes = out
        .into_inner()
        .map_err(|e| ApiError::Internal(Box::new(e.into_error())))?;
    String::from_utf8(bytes).map_err(|e| ApiError::Internal(Box::new(e)))
}

/// A cluster report as evidence for the vendor: the latest scan (or the one of `period_start`) as
/// JSON (the stored report: every group tested, the configuration, the clusters with rate ratio,
/// interval and failed serials) or CSV (one row per cluster), as a download.
#[utoipa::path(get, path = "/api/v1/rma/clusters/report", tag = "rma", params(ReportQuery),
    responses((status = 200, description = "The report (`Content-Disposition: attachment`)",
               content((Object = "application/json"), (String = "text/csv"))),
              (status = 400, body = ErrorBody, description = "Unknown format or a malformed period_start"),
              (status = 404, body = ErrorBody, description = "No scan stored (for that period)")))]
pub(crate) async fn report(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ReportQuery>,
) -> Result<Response, ApiError> {
    let csv = match query.format.as_deref().map(str::trim) {
        None | Some("" | "json") => false,
        Some("csv") => true,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "format must be json or csv, not {other:?}"
            )));
        }
    };
    let scans = state
        .db
        .cluster_scans(if query.period_start.is_some() {
            REPORT_SCANS_SEARCHED
        } else {
            1
        })
        .await?;
    let scan = scans
        .into_iter()
        .find(|s| query.period_start.is_none_or(|p| s.period_start == p))
        .ok_or_else(|| match query.period_start {
            Some(p) => ApiError::NotFound(format!("no cluster scan of the period starting {}", p.to_rfc3339())),
            None => ApiError::NotFound("no cluster scan stored yet".into()),
        })?;
    let stem = format!("cluster-report-{}", scan.period_start.format("%Y-%m-%d"));
    let (content_type, name, body) = if csv {
        (
            "text/csv; charset=utf-8",
            format!("{stem}.csv"),
            csv_text(&ClusterScanView::of(&scan))?,
        )
    } else {
        let doc = serde_json::json!({
            "period_start": scan.period_start, "period_end": scan.period_end, "scanned_at": scan.scanned_at,
            "report": scan.report,
        });
        (
            "application/json",
            format!("{stem}.json"),
            serde_json::to_string_pretty(&doc).map_err(|e| ApiError::Internal(Box::new(e)))?,
        )
    };
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type.to_owned()),
            (header::CONTENT_DISPOSITION, format!("attachment; filename=\"{name}\"")),
        ],
        body,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attribute_names_read_as_the_api_spells_them() {
        assert_eq!(snake("SerialPrefix"), "serial_prefix");
        assert_eq!(snake("Lot"), "lot");
        assert_eq!(snake("part_number"), "part_number");
    }
}
