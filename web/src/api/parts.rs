//! `/api/v1/parts`: every GPU (and other tracked part) by serial number, as
//! discovery read it and the parts manifest completed it (lot, date code),
//! and one part with its samples, firmware history and RMA cases.

use axum::extract::State;
use chrono::{DateTime, Utc};
use orchestrator_db::parts::Part;
use orchestrator_db::rma_views::PartsQuery;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::rma::{RmaCaseSummary, RmaSample};
use super::{ApiJson, ApiPath, ApiQuery, MAX_OFFSET, in_range};
use crate::AppState;
use crate::error::{ApiError, ErrorBody};

/// Most parts one page returns.
pub(crate) const MAX_PARTS_PAGE: u64 = 1000;
/// Samples a part's answer carries, newest first; the evidence package has the window around a failure.
pub(crate) const PART_SAMPLES: u64 = 200;

/// A part as stored.
#[derive(Debug, Serialize, ToSchema)]
pub struct PartView {
    serial: String,
    /// Vendor key as criteria files name it (`nvidia`).
    vendor: String,
    /// `gpu`, `baseboard`.
    part_kind: String,
    part_number: String,
    model: Option<String>,
    node: String,
    /// The part's Redfish id on the node (`GPU_SXM_1`).
    slot: String,
    /// From the Redfish `Assembly`, or the parts manifest.
    production_date: Option<DateTime<Utc>>,
    /// Manufacturing lot, from the parts manifest (Redfish names none).
    lot: Option<String>,
    date_code: Option<String>,
    firmware_version: Option<String>,
    /// Redfish `Status.Health` as last read (`OK`, `Warning`, `Critical`).
    health: Option<String>,
    first_seen: DateTime<Utc>,
    last_seen: DateTime<Utc>,
    /// When discovery stopped finding it in its node (it was replaced).
    removed_at: Option<DateTime<Utc>>,
}

impl PartView {
    pub(crate) fn of(p: &Part) -> Self {
        PartView {
            serial: p.serial.clone(),
            vendor: p.vendor.clone(),
            part_kind: p.part_kind.clone(),
            part_number: p.part_number.clone(),
            model: p.model.clone(),
            node: p.node.clone(),
            slot: p.slot.clone(),
            production_date: p.production_date,
            lot: p.lot.clone(),
            date_code: p.date_code.clone(),
            firmware_version: p.firmware_version.clone(),
            health: p.health.clone(),
            first_seen: p.first_seen,
            last_seen: p.last_seen,
            removed_at: p.removed_at,
        }
    }
}

/// One page of parts.
#[derive(Debug, Serialize, ToSchema)]
pub struct PartsPageView {
    /// Parts matching the filters in all.
    total: u64,
    limit: u64,
    offset: u64,
    /// By node, slot and serial.
    parts: Vec<PartView>,
}

/// Filters and page; an empty parameter filters nothing.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PartsParams {
    /// Only parts in this node.
    node: Option<String>,
    /// Only this vendor's parts (`nvidia`).
    vendor: Option<String>,
    /// Only this part number.
    part_number: Option<String>,
    /// Only this manufacturing lot.
    lot: Option<String>,
    /// Also parts that were replaced (default false).
    include_removed: Option<bool>,
    /// Page size, 1-1000 (default 100).
    limit: Option<u64>,
    /// Parts to skip, 0-1000000000 (default 0).
    offset: Option<u64>,
}

fn non_empty(value: Option<String>) -> Option<String> {
    value.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
}

/// Parts, filtered and paged, by node, slot and serial.
#[utoipa::path(get, path = "/api/v1/parts", tag = "parts", params(PartsParams),
    responses((status = 200, body = PartsPageView), (status = 400, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<PartsParams>,
) -> Result<ApiJson<PartsPageView>, ApiError> {
    let limit = in_range("limit", params.limit, 1, MAX_PARTS_PAGE)?.unwrap_or(100);
    let offset = in_range("offset", params.offset, 0, MAX_OFFSET)?.unwrap_or(0);
    let page = state
        .db
        .parts_page(&PartsQuery {
            node: non_empty(params.node),
            vendor: non_empty(params.vendor),
            part_number: non_empty(params.part_number),
            lot: non_empty(params.lot),
            include_removed: params.include_removed.unwrap_or(false),
            limit,
            offset,
        })
        .await?;
    Ok(ApiJson(PartsPageView {
        total: page.total,
        limit,
        offset,
        parts: page.parts.iter().map(PartView::of).collect(),
    }))
}

/// A firmware change of the part's kind on its node.
#[derive(Debug, Serialize, ToSchema)]
pub struct FirmwareChangeView {
    /// When the new version was read back.
    at: DateTime<Utc>,
    component: String,
    from_version: String,
    to_version: String,
    release: String,
    rollout: Option<String>,
}

/// One part with what a person checks before claiming it.
#[derive(Debug, Serialize, ToSchema)]
pub struct PartDetailView {
    part: PartView,
    /// The newest samples (at most 200), newest first.
    observations: Vec<RmaSample>,
    /// Samples stored for the part in all.
    observations_total: u64,
    /// Firmware of the part's kind flashed on its node, oldest first.
    firmware_history: Vec<FirmwareChangeView>,
    /// The part's RMA cases, oldest first.
    cases: Vec<RmaCaseSummary>,
}

/// One part: its record, newest samples, firmware history and RMA cases.
#[utoipa::path(get, path = "/api/v1/parts/{serial}", tag = "parts",
    params(("serial" = String, Path, description = "Serial number")),
    responses((status = 200, body = PartDetailView), (status = 404, body = ErrorBody)))]
pub(crate) async fn get(
    State(state): State<AppState>,
    ApiPath(serial): ApiPath<String>,
) -> Result<ApiJson<PartDetailView>, ApiError> {
    let detail = state.db.part_detail(&serial, PART_SAMPLES).await?;
    let now = state.db.clock().now();
    Ok(ApiJson(PartDetailView {
        part: PartView::of(&detail.part),
        observations: detail.observations.iter().map(RmaSample::of).collect(),
        observations_total: detail.observations_total,
        firmware_history: detail
            .firmware_history
            .iter()
            .map(|c| FirmwareChangeView {
                at: c.at,
                component: c.component.clone(),
                from_version: c.from_version.clone(),
                to_version: c.to_version.clone(),
                release: c.release.clone(),
                rollout: c.rollout.clone(),
            })
            .collect(),
        cases: detail.cases.iter().map(|c| RmaCaseSummary::of(c, now)).collect(),
    }))
}
