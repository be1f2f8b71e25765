//! Multipart uploads (a vendor's diagnostic log attached to an RMA case),
//! shared by the API route and the case page's form, and the CSRF field the
//! authorization layer reads from a multipart form.
//!
//! The CSRF check stays in the authorization layer (`auth::authorize`), before any handler:
//! a cookie-authenticated multipart post is buffered there (bounded by
//! [`UPLOAD_BODY_BYTES`]) and its `csrf` field compared like a urlencoded
//! form's, so no handler can forget it.

use axum::body::{Body, Bytes};
use axum::extract::multipart::MultipartError;
use axum::extract::{FromRequest, Multipart};
use axum::http::{Request, StatusCode, header};
use orchestrator_db::rma::{AttachmentKind, MAX_ATTACHMENT_BYTES};

use crate::error::ApiError;

/// Largest multipart body accepted: one attachment at its cap plus the
/// form's other fields and part headers.
pub const UPLOAD_BODY_BYTES: usize = MAX_ATTACHMENT_BYTES + 64 * 1024;

/// Longest value of a text field of an upload form (`kind`, `name`, `result`, `csrf`).
const MAX_TEXT_FIELD_BYTES: usize = 1024;

/// Whether a `Content-Type` is a multipart form.
pub(crate) fn is_multipart(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("multipart/form-data"))
}

/// Field `name` (the CSRF token's, which the authorization layer names) of a buffered multipart
/// form, if it has one.
pub(crate) async fn text_field(content_type: &str, body: Bytes, name: &str) -> Option<String> {
    let request = Request::builder()
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body))
        .ok()?;
    let mut form = Multipart::from_request(request, &()).await.ok()?;
    while let Ok(Some(field)) = form.next_field().await {
        if field.name() == Some(name) {
            return field.text().await.ok();
        }
    }
    None
}

/// An attachment as uploaded.
#[derive(Debug)]
pub(crate) struct Upload {
    pub kind: AttachmentKind,
    /// A field diagnostic's verdict on the part (`result`: `failed` or `passed`), when given.
    pub diagnostic_passed: Option<bool>,
    /// The name to store it under: the `name` field, else the file's own name.
    pub name: String,
    pub content: Vec<u8>,
}

fn multipart_error(err: MultipartError) -> ApiError {
    if err.status() == StatusCode::PAYLOAD_TOO_LARGE {
        too_large()
    } else {
        ApiError::BadRequest(format!("malformed multipart form: {}", err.body_text()))
    }
}

fn too_large() -> ApiError {
    ApiError::PayloadTooLarge(format!(
        "an attachment may be at most {MAX_ATTACHMENT_BYTES} bytes ({} MiB)",
        MAX_ATTACHMENT_BYTES / (1024 * 1024)
    ))
}

fn invalid(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::Invalid(vec![orchestrator_db::model::FieldError {
        field: field.to_owned(),
        message: message.into(),
    }])
}

/// Reads an upload form: `file` (required), `kind` (`field_diagnostic`,
/// the default, or `redfish_diagnostic`), `name` (optional), `result`
/// (optional, a field diagnostic's `failed` or `passed`) and `csrf`
/// (already checked by the authorization layer). A file over
/// [`MAX_ATTACHMENT_BYTES`] is refused as it streams in, never buffered whole.
pub(crate) async fn read_upload(mut form: Multipart) -> Result<Upload, ApiError> {
    let mut kind = None;
    let mut name = None;
    let mut result = None;
    let mut file: Option<(Option<String>, Vec<u8>)> = None;
    while let Some(mut field) = form.next_field().await.map_err(multipart_error)? {
        let field_name = field.name().unwrap_or_default().to_owned();
        match field_name.as_str() {
            "file" => {
                if file.is_some() {
                    return Err(invalid("file", "send one file per upload"));
                }
                let file_name = field.file_name().map(str::to_owned);
                let mut content = Vec::new();
                while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
                    if content.len() + chunk.len() > MAX_ATTACHMENT_BYTES {
                        return Err(too_large());
                    }
                    content.extend_from_slice(&chunk);
                }
                file = Some((file_name, content));
            }
            "kind" | "name" | "result" | "csrf" => {
                let mut value = Vec::new();
                while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
                    value.extend_from_slice(&chunk);
                    if value.len() > MAX_TEXT_FIELD_BYTES {
                        return Err(invalid(
                            &field_name,
                            format!("is longer than {MAX_TEXT_FIELD_BYTES} bytes"),
                        ));
                    }
                }
                let text = String::from_utf8(value).map_err(|_| invalid(&field_name, "is not UTF-8 text"))?;
                match field_name.as_str() {
                    "kind" => kind = Some(text),
                    "name" => name = Some(text),
                    "result" => result = Some(text),
                    _ => {}
                }
            }
            other => {
                return Err(invalid(
                    other,
                    "unknown field; an upload has file, kind, name, result (and csrf from a page)",
                ));
            }
        }
    }
    let (file_name, content) = file.ok_or_else(|| invalid("file", "missing: attach the diagnostic log"))?;
    let kind = match kind.as_deref().map(str::trim) {
        None | Some("" | "field_diagnostic") => AttachmentKind::FieldDiagnostic,
        Some("redfish_diagnostic") => AttachmentKind::RedfishDiagnostic,
        Some(other) => {
            return Err(invalid(
                "kind",
                format!("unknown kind {other:?}; one of field_diagnostic, redfish_diagnostic"),
            ));
        }
    };
    let diagnostic_passed = match result.as_deref().map(str::trim) {
        None | Some("") => None,
        Some("failed") => Some(false),
        Some("passed") => Some(true),
        Some(other) => return Err(invalid("result", format!("unknown result {other:?}; failed or passed"))),
    };
    if diagnostic_passed.is_some() && kind != AttachmentKind::FieldDiagnostic {
        return Err(invalid(
            "result",
            "is the verdict of a field diagnostic; kind must be field_diagnostic",
        ));
    }
    let name = name
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        // A browser sends the file's own name; a path some send is cut to its last part.
        .or_else(|| file_name.map(|f| f.rsplit(['/', '\\']).next().unwrap_or_default().trim().to_owned()))
        .filter(|n| !n.is_empty())
        .ok_or_else(|| invalid("name", "missing: give a name or upload a named file"))?;
    if content.is_empty() {
        return Err(invalid("file", "is empty"));
    }
    Ok(Upload {
        kind,
        diagnostic_passed,
        name,
        content,
    })
}
