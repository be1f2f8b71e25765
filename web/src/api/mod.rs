//! `/api/v1`: nodes, releases with their qualification, rollouts, RMA cases
//! and the audit log.

pub mod alerts;
mod audit;
mod evidence;
mod nodes;
pub(crate) mod parts;
mod releases;
pub(crate) mod rma;
pub(crate) mod rma_evidence;
pub(crate) mod rma_pipeline;
pub(crate) mod rollouts;
mod throttles;

use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts};
use axum::handler::Handler;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use utoipa::OpenApi;

use crate::AppState;
use crate::error::{ApiError, ErrorBody, ErrorDetail};

/// JSON body extractor whose rejections are [`ApiError`]s (a 400 with the
/// line and column of a syntax error, or the field of a type error).
#[derive(Debug, FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

impl<T: serde::Serialize> IntoResponse for ApiJson<T> {
    fn into_response(self) -> Response {
        Json(self.0).into_response()
    }
}

/// Query-string extractor with [`ApiError`] rejections.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

/// Path-parameter extractor with [`ApiError`] rejections.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);

/// Largest `offset` a list accepts: far past any fleet, and small enough
/// that every backend takes it as a signed 64-bit bind parameter.
pub(crate) const MAX_OFFSET: u64 = 1_000_000_000;

/// A query parameter checked against its real range, so an out-of-range
/// value is a 400 that names the range rather than a clamp or a panic deeper
/// down (`offset=9223372036854775808` once panicked in the SQLite driver).
pub(crate) fn in_range<T>(name: &str, value: Option<T>, min: T, max: T) -> Result<Option<T>, ApiError>
where
    T: PartialOrd + std::fmt::Display + Copy,
{
    match value {
        Some(v) if v < min || v > max => Err(ApiError::BadRequest(format!(
            "{name} must be between {min} and {max}, got {v}"
        ))),
        other => Ok(other),
    }
}

/// Who is making a request, as recorded in the audit log: the username of
/// the authenticated [`Principal`](crate::auth::Principal) that the
/// authorization layer put in the request.
#[derive(Debug, Clone)]
pub struct Actor(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Actor {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<crate::auth::Principal>()
            .map(|principal| Actor(principal.user.username.clone()))
            .ok_or(ApiError::Unauthorized)
    }
}

/// The OpenAPI document, generated from the handlers and records.
#[derive(Debug, OpenApi)]
#[openapi(
    info(title = "Waveguard API", description = "Firmware staged-rollout orchestrator for accelerator fleets."),
    paths(
        nodes::list_nodes,
        nodes::import_nodes,
        nodes::get_node,
        nodes::node_drains,
        releases::list_releases,
        releases::add_release,
        releases::get_release,
        releases::transition_release,
        releases::list_gate_results,
        releases::record_gate_result,
        audit::list_audit,
        alerts::receive,
        alerts::list_alerts,
        rollouts::start,
        rollouts::list,
        rollouts::get,
        rollouts::steps,
        rollouts::drains,
        rollouts::approve,
        rollouts::pause,
        rollouts::resume,
        rollouts::abort,
        rollouts::rollback,
        evidence::evidence,
        throttles::list,
        rma::list_cases,
        rma::get_case,
        rma::record_event,
        rma_evidence::download,
        rma_evidence::manifest,
        rma_evidence::record_collected,
        rma_evidence::upload,
        rma_evidence::list,
        rma_evidence::download_attachment,
        rma_pipeline::submit_case,
        rma_pipeline::quota,
        rma_pipeline::clusters,
        rma_pipeline::report,
        parts::list,
        parts::get,
    ),
    components(schemas(ErrorBody, ErrorDetail)),
    tags(
        (name = "nodes", description = "The fleet: servers and their BMCs"),
        (name = "releases", description = "Firmware releases and their qualification"),
        (name = "audit", description = "The append-only audit log"),
        (name = "alerts", description = "Alertmanager webhook: alerts that pause or roll back rollouts"),
        (name = "rollouts", description = "Staged rollouts: plans, waves, approvals and commands"),
        (name = "users", description = "Users and login throttling (admin only)"),
        (name = "rma", description = "RMA cases: GPUs that met a vendor's failure rule, and the human steps of their \
         return to the vendor: evidence packages, attachments, submission within the vendor's quota, defect \
         clusters"),
        (name = "parts", description = "GPUs and other parts by serial number: discovery, lot, health and cases"),
    )
)]
pub struct ApiDoc;

pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/openapi.json", get(openapi))
        .route(
            "/nodes",
            get(nodes::list_nodes).post(nodes::import_nodes.layer(DefaultBodyLimit::max(crate::MAX_BODY_BYTES))),
        )
        .route("/nodes/{name}", get(nodes::get_node))
        .route("/nodes/{name}/drains", get(nodes::node_drains))
        .route("/releases", get(releases::list_releases).post(releases::add_release))
        .route("/releases/{id}", get(releases::get_release))
        .route("/releases/{id}/transition", post(releases::transition_release))
        .route(
            "/releases/{id}/qualification",
            get(releases::list_gate_results).post(releases::record_gate_result),
        )
        .route("/audit", get(audit::list_audit))
        .route("/alerts", get(alerts::list_alerts))
        .route(
            "/alerts/alertmanager",
            post(alerts::receive.layer(DefaultBodyLimit::max(alerts::MAX_NOTIFICATION_BYTES))),
        )
        .route("/rollouts", get(rollouts::list).post(rollouts::start))
        .route("/rollouts/{id}", get(rollouts::get))
        .route("/rollouts/{id}/steps", get(rollouts::steps))
        .route("/rollouts/{id}/drains", get(rollouts::drains))
        .route("/rollouts/{id}/waves/{wave}/approve", post(rollouts::approve))
        .route("/rollouts/{id}/pause", post(rollouts::pause))
        .route("/rollouts/{id}/resume", post(rollouts::resume))
        .route("/rollouts/{id}/abort", post(rollouts::abort))
        .route("/rollouts/{id}/rollback", post(rollouts::rollback))
        .route("/rollouts/{id}/evidence", get(evidence::evidence))
        .route("/users/login-throttles", get(throttles::list))
        .route("/rma/cases", get(rma::list_cases))
        .route("/rma/cases/{id}", get(rma::get_case))
        .route("/rma/cases/{id}/events", post(rma::record_event))
        .route(
            "/rma/cases/{id}/evidence",
            get(rma_evidence::download).post(rma_evidence::record_collected),
        )
        .route("/rma/cases/{id}/evidence/manifest", get(rma_evidence::manifest))
        .route(
            "/rma/cases/{id}/attachments",
            get(rma_evidence::list)
                .post(rma_evidence::upload.layer(DefaultBodyLimit::max(crate::multipart::UPLOAD_BODY_BYTES))),
        )
        .route(
            "/rma/cases/{id}/attachments/{name}",
            get(rma_evidence::download_attachment),
        )
        .route("/rma/cases/{id}/submit", post(rma_pipeline::submit_case))
        .route("/rma/quota", get(rma_pipeline::quota))
        .route("/rma/clusters", get(rma_pipeline::clusters))
        .route("/rma/clusters/report", get(rma_pipeline::report))
        .route("/parts", get(parts::list))
        .route("/parts/{serial}", get(parts::get))
}

async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
