use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use orchestrator_db::DbError;
use orchestrator_db::model::FieldError;
use serde::Serialize;
use utoipa::ToSchema;

/// The one error type of the API. Each variant maps to a status; the body
/// is always `{"error": {"code", "message", "fields"?}}`. Internal failures
/// are logged with their whole chain and answered with a generic message.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("invalid input")]
    Invalid(Vec<FieldError>),
    /// Well-formed JSON of the wrong shape (missing field, wrong type).
    #[error("{0}")]
    InvalidBody(String),
    /// The body was not declared as JSON.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// No valid session or API token.
    #[error("log in or send an API token (Authorization: Bearer)")]
    Unauthorized,
    /// Authenticated, but the role does not allow it (or a CSRF check failed).
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// The body is over the route's limit.
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("internal error")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// The body of every error response.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// What went wrong, for a human and for a program.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable, machine-readable: `bad_request`, `invalid`,
    /// `unsupported_media_type`, `unauthorized`, `forbidden`, `not_found`,
    /// `conflict`, `payload_too_large`, `internal`.
    pub code: &'static str,
    pub message: String,
    /// Per-field problems, for `invalid`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<FieldError>,
}

impl ApiError {
    /// The HTTP status and the stable error code: one mapping, used by the
    /// API and by the UI's answers to scripts.
    pub(crate) fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::Invalid(_) | ApiError::InvalidBody(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid"),
            ApiError::UnsupportedMediaType(_) => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        if let ApiError::Internal(source) = &self {
            tracing::error!(error = %error_chain(source.as_ref()), "request failed");
        }
        let (message, fields) = match self {
            ApiError::Invalid(fields) => {
                let message = fields.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
                (message, fields)
            }
            other => (other.to_string(), Vec::new()),
        };
        (
            status,
            Json(ErrorBody {
                error: ErrorDetail { code, message, fields },
            }),
        )
            .into_response()
    }
}

pub(crate) use orchestrator_types::error_chain;

impl From<DbError> for ApiError {
    fn from(err: DbError) -> Self {
        match err {
            DbError::NotFound { .. } => ApiError::NotFound(err.to_string()),
            DbError::AlreadyExists { .. } | DbError::Conflict { .. } | DbError::Stale { .. } => {
                ApiError::Conflict(err.to_string())
            }
            DbError::Transition(_) => ApiError::Conflict(err.to_string()),
            DbError::Invalid { field, reason } => ApiError::Invalid(vec![FieldError { field, message: reason }]),
            DbError::NotPermitted { .. } => ApiError::Forbidden(err.to_string()),
            other => ApiError::Internal(Box::new(other)),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        // axum's text names the line and column of a syntax error and the
        // field of a type error; it contains nothing internal.
        match rejection.status() {
            StatusCode::UNPROCESSABLE_ENTITY => ApiError::InvalidBody(rejection.body_text()),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::UnsupportedMediaType(rejection.body_text()),
            StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge(rejection.body_text()),
            _ => ApiError::BadRequest(rejection.body_text()),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::BadRequest(rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::BadRequest(rejection.body_text())
    }
}
