//! A case's evidence: the deterministic package the vendor gets (archive
//! and manifest of hashes, built from stored records by
//! `Db::rma_evidence_package`), recording it as collected, and the files
//! attached to the case (a vendor's field diagnostic uploaded by a person).
//!
//! Until evidence is recorded the package is built on every read (a function
//! of the records, so two downloads of an unchanged case are the same bytes);
//! recording keeps a snapshot, and from then on downloads serve the bytes the
//! case's manifest hash names, however the records grow.

use axum::Extension;
use axum::extract::{Multipart, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use orchestrator_db::rma::{Attachment, AttachmentKind};
use orchestrator_rma::{CaseState, EvidencePackage};
use serde::Serialize;
use utoipa::ToSchema;

use super::rma::{RmaCaseDetail, Step, actor_of, check_step};
use super::{ApiJson, ApiPath};
use crate::AppState;
use crate::auth::Principal;
use crate::error::{ApiError, ErrorBody};

/// One file of the package.
#[derive(Debug, Serialize, ToSchema)]
pub struct EvidenceEntry {
    /// Path inside the archive (`event_log.json`, `diagnostics/field/dcgm-diag.log`).
    path: String,
    size: u64,
    /// sha256 of the file, 64 hexadecimal digits.
    sha256: String,
}

/// The package's manifest: what the archive holds, with hashes a vendor can check.
#[derive(Debug, Serialize, ToSchema)]
pub struct EvidenceManifest {
    /// `waveguard-rma-evidence/1`.
    format: String,
    case_id: String,
    serial: String,
    /// The vendor document and edition the rule comes from.
    criteria_edition: String,
    /// The archive's timestamp: the case's opening, so rebuilding changes nothing.
    created_at: DateTime<Utc>,
    files: Vec<EvidenceEntry>,
    /// sha256 of `manifest.json` as stored in the archive: what a case records as collected.
    manifest_sha256: String,
    /// Size of the archive in bytes.
    archive_bytes: u64,
    /// The manifest hash recorded on the case, if any; equal to `manifest_sha256` once recorded
    /// (downloads then serve the recorded snapshot).
    recorded_sha256: Option<String>,
}

impl EvidenceManifest {
    pub(crate) fn of(package: &EvidencePackage, recorded: Option<&str>) -> Self {
        let m = &package.manifest;
        EvidenceManifest {
            format: m.format.clone(),
            case_id: m.case_id.clone(),
            serial: m.serial.clone(),
            criteria_edition: m.criteria_edition.clone(),
            created_at: m.created_at,
            files: m
                .files
                .iter()
                .map(|f| EvidenceEntry {
                    path: f.path.clone(),
                    size: f.size,
                    sha256: f.sha256.clone(),
                })
                .collect(),
            manifest_sha256: package.manifest_sha256.clone(),
            archive_bytes: package.archive.len() as u64,
            recorded_sha256: recorded.map(str::to_owned),
        }
    }
}

/// The archive's file name: the case id is already safe in a file name.
pub(crate) fn archive_name(case_id: &str) -> String {
    format!("{case_id}-evidence.tar")
}

/// A case's evidence package as a tar archive: `manifest.json` (sha256 of every file), `case.json`,
/// `candidate.json`, `inventory.json`, `event_log.json`, `telemetry_window.json`,
/// `system_causes.json`, `rollout_history.json` and `diagnostics/` (attachments). Deterministic:
/// two downloads of an unchanged case are byte-for-byte equal, and once evidence is recorded the
/// recorded package is served. Never contains a secret: a file with one refuses the package (422).
#[utoipa::path(get, path = "/api/v1/rma/cases/{id}/evidence", tag = "rma",
    params(("id" = String, Path, description = "Case id")),
    responses((status = 200, description = "The tar archive", content_type = "application/x-tar"),
              (status = 404, body = ErrorBody),
              (status = 422, body = ErrorBody, description = "A file of the package holds a secret (named, never \
               shown), so no package is given")))]
pub(crate) async fn download(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let package = state.db.rma_evidence_download(&id).await?;
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/x-tar".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{}\"", archive_name(&id)),
            ),
        ],
        package.archive,
    )
        .into_response())
}

/// The manifest of a case's evidence package (the files, their sizes and sha256), without the archive.
#[utoipa::path(get, path = "/api/v1/rma/cases/{id}/evidence/manifest", tag = "rma",
    params(("id" = String, Path, description = "Case id")),
    responses((status = 200, body = EvidenceManifest),
              (status = 404, body = ErrorBody),
              (status = 422, body = ErrorBody, description = "A file of the package holds a secret")))]
pub(crate) async fn manifest(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<EvidenceManifest>, ApiError> {
    let case = state.db.rma_case(&id).await?;
    let package = state.db.rma_evidence_download(&id).await?;
    Ok(ApiJson(EvidenceManifest::of(
        &package,
        case.case.manifest_sha256.as_deref(),
    )))
}

/// The case and the package recorded with it.
#[derive(Debug, Serialize, ToSchema)]
pub struct EvidenceCollected {
    case: RmaCaseDetail,
    manifest: EvidenceManifest,
}

/// The step recording evidence takes from the case's state: new evidence after a rejection, else
/// the first collection.
pub(crate) fn evidence_step(case: &orchestrator_rma::Case) -> Step {
    if case.state == CaseState::Rejected {
        Step::Resubmit
    } else {
        Step::CollectEvidence
    }
}

/// Builds the package and records it on the case: `collect_evidence` from `candidate`, or
/// `resubmit` (new evidence) from `rejected`, with the manifest's hash. Shared by the API and
/// the case page.
pub(crate) async fn collect(
    state: &AppState,
    id: &str,
    principal: &Principal,
) -> Result<(orchestrator_db::rma::RmaCase, EvidencePackage), ApiError> {
    let current = state.db.rma_case(id).await?;
    let step = evidence_step(&current.case);
    // Refused before building: a viewer or a case past this step gets its
    // answer without the work.
    let actor = actor_of(principal);
    check_step(&current.case, step, &actor, state.db.clock().now())?;
    let (_, package) = state.db.record_rma_evidence(id, &actor).await?;
    Ok((state.db.rma_case(id).await?, package))
}

/// Builds the case's evidence package and records it as collected (from `candidate`; from
/// `rejected` as new evidence to submit again), with the manifest's hash; audited as
/// `rma.transition`. Needs release_manager.
#[utoipa::path(post, path = "/api/v1/rma/cases/{id}/evidence", tag = "rma",
    params(("id" = String, Path, description = "Case id")),
    responses((status = 200, body = EvidenceCollected, description = "The case after the step and the package recorded"),
              (status = 403, body = ErrorBody, description = "The caller's role is too low"),
              (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "The case's state does not take evidence now (the \
               message says what it allows), or the case moved meanwhile"),
              (status = 422, body = ErrorBody, description = "A file of the package holds a secret")))]
pub(crate) async fn record_collected(
    State(state): State<AppState>,
    principal: Option<Extension<Principal>>,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<EvidenceCollected>, ApiError> {
    let Extension(principal) = principal.ok_or(ApiError::Unauthorized)?;
    let (after, package) = collect(&state, &id, &principal).await?;
    Ok(ApiJson(EvidenceCollected {
        manifest: EvidenceManifest::of(&package, after.case.manifest_sha256.as_deref()),
        case: RmaCaseDetail::of(&after, state.db.clock().now()),
    }))
}

/// A file attached to a case.
#[derive(Debug, Serialize, ToSchema)]
pub struct RmaAttachment {
    /// Its name in the case (and under `diagnostics/` in the evidence package).
    name: String,
    /// `field_diagnostic` (uploaded by a person), `redfish_diagnostic` (collected from the BMC) or
    /// `evidence_package` (the package as recorded: archive and manifest).
    kind: String,
    sha256: String,
    size_bytes: u64,
    added_by: String,
    added_at: DateTime<Utc>,
    /// Where to download it.
    href: String,
}

pub(crate) fn kind_name(kind: AttachmentKind) -> &'static str {
    match kind {
        AttachmentKind::FieldDiagnostic => "field_diagnostic",
        AttachmentKind::RedfishDiagnostic => "redfish_diagnostic",
        AttachmentKind::EvidencePackage => "evidence_package",
    }
}

impl RmaAttachment {
    pub(crate) fn of(case_id: &str, a: &Attachment) -> Self {
        RmaAttachment {
            name: a.name.clone(),
            kind: kind_name(a.kind).to_owned(),
            sha256: a.sha256.clone(),
            size_bytes: a.size_bytes,
            added_by: a.added_by.clone(),
            added_at: a.added_at,
            href: format!(
                "/api/v1/rma/cases/{}/attachments/{}",
                crate::url::urlencode(case_id),
                crate::url::urlencode(&a.name)
            ),
        }
    }
}

/// The upload form of an attachment.
#[derive(Debug, ToSchema)]
#[allow(dead_code)] // only describes the multipart form in the OpenAPI document
pub struct AttachmentUpload {
    /// The file (at most 32 MiB).
    #[schema(value_type = String, format = Binary)]
    file: Vec<u8>,
    /// `field_diagnostic` (default) or `redfish_diagnostic`.
    kind: Option<String>,
    /// Name to store it under (letters, digits, `.`, `_`, `-`; 1-100 bytes); the file's own
    /// name when absent.
    name: Option<String>,
    /// The field diagnostic's verdict on the part: `failed` confirms the claim (the criteria's
    /// `confirmed_by`), `passed` says the vendor would refuse it. Only with `field_diagnostic`.
    result: Option<String>,
}

/// Attaches a vendor diagnostic log (the field diagnostic's result, an `nvidia-bug-report`) to a
/// case, as multipart/form-data. An attachment is evidence: never overwritten, swept for secrets,
/// audited as `rma.attachment` with its hash. Needs release_manager.
#[utoipa::path(post, path = "/api/v1/rma/cases/{id}/attachments", tag = "rma",
    params(("id" = String, Path, description = "Case id")),
    request_body(content = AttachmentUpload, content_type = "multipart/form-data"),
    responses((status = 201, body = RmaAttachment),
              (status = 400, body = ErrorBody, description = "Not a multipart form"),
              (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "The case already has an attachment of that name"),
              (status = 413, body = ErrorBody, description = "The file is over 32 MiB"),
              (status = 415, body = ErrorBody, description = "Not multipart/form-data"),
              (status = 422, body = ErrorBody, description = "A field missing or malformed, or the file holds a \
               secret")))]
pub(crate) async fn upload(
    State(state): State<AppState>,
    principal: Option<Extension<Principal>>,
    ApiPath(id): ApiPath<String>,
    form: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<(StatusCode, ApiJson<RmaAttachment>), ApiError> {
    let Extension(principal) = principal.ok_or(ApiError::Unauthorized)?;
    let form = form.map_err(|r| ApiError::UnsupportedMediaType(r.body_text()))?;
    let added = attach(&state, &id, form, &principal).await?;
    Ok((StatusCode::CREATED, ApiJson(RmaAttachment::of(&id, &added))))
}

/// Reads an upload and stores it on case `id`. Shared with the case page.
pub(crate) async fn attach(
    state: &AppState,
    id: &str,
    form: Multipart,
    principal: &Principal,
) -> Result<Attachment, ApiError> {
    // A missing case answers 404 before the body is read.
    state.db.rma_case(id).await?;
    let upload = crate::multipart::read_upload(form).await?;
    let added = state
        .db
        .add_rma_attachment(id, &upload.name, upload.kind, &upload.content, &principal.user.username)
        .await?;
    if let Some(passed) = upload.diagnostic_passed {
        state
            .db
            .record_field_diagnostic(id, passed, &added.name, &principal.user.username)
            .await?;
    }
    Ok(added)
}

/// A case's attachments, by name.
#[utoipa::path(get, path = "/api/v1/rma/cases/{id}/attachments", tag = "rma",
    params(("id" = String, Path, description = "Case id")),
    responses((status = 200, body = [RmaAttachment]), (status = 404, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<Vec<RmaAttachment>>, ApiError> {
    state.db.rma_case(&id).await?;
    let found = state.db.rma_attachments(&id).await?;
    Ok(ApiJson(found.iter().map(|a| RmaAttachment::of(&id, a)).collect()))
}

/// One attachment's content, as uploaded.
#[utoipa::path(get, path = "/api/v1/rma/cases/{id}/attachments/{name}", tag = "rma",
    params(("id" = String, Path, description = "Case id"), ("name" = String, Path, description = "Attachment name")),
    responses((status = 200, description = "The file", content_type = "application/octet-stream"),
              (status = 404, body = ErrorBody)))]
pub(crate) async fn download_attachment(
    State(state): State<AppState>,
    ApiPath((id, name)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    let (found, content) = state.db.rma_attachment_content(&id, &name).await?;
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                // Stored names are letters, digits, '.', '_' and '-' only.
                format!("attachment; filename=\"{}\"", found.name),
            ),
        ],
        content,
    )
        .into_response())
}
