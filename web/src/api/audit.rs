use axum::extract::State;
use chrono::{DateTime, Utc};
use orchestrator_db::AuditFilter;
use orchestrator_db::model::AuditEntry;
use serde::Deserialize;
use utoipa::IntoParams;

use super::{ApiJson, ApiQuery};
use crate::AppState;
use crate::error::{ApiError, ErrorBody};

/// Filters for the audit log; newest first.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    actor: Option<String>,
    action: Option<String>,
    subject_type: Option<String>,
    subject_id: Option<String>,
    /// RFC 3339 instant.
    since: Option<DateTime<Utc>>,
    /// 1 to 1,000; default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u64>,
    /// Page backwards from this entry id (1 or more).
    #[param(minimum = 1)]
    before_id: Option<i64>,
}

#[utoipa::path(get, path = "/api/v1/audit", tag = "audit", params(AuditQuery),
    responses((status = 200, body = [AuditEntry]), (status = 400, body = ErrorBody)))]
pub(crate) async fn list_audit(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<AuditQuery>,
) -> Result<ApiJson<Vec<AuditEntry>>, ApiError> {
    let filter = AuditFilter {
        actor: query.actor,
        action: query.action,
        subject_type: query.subject_type,
        subject_id: query.subject_id,
        since: query.since,
        limit: super::in_range("limit", query.limit, 1, 1000)?,
        before_id: super::in_range("before_id", query.before_id, 1, i64::MAX)?,
    };
    Ok(ApiJson(state.db.audit_entries(&filter).await?))
}
