//! `/api/v1/users/login-throttles`: who is being throttled at login, for an
//! admin answering "why can't I log in" (the `/users` prefix makes it
//! admin-only in [`crate::auth::required_access`]).

use axum::extract::State;
use orchestrator_db::throttle::LoginThrottle;

use super::ApiJson;
use crate::AppState;
use crate::error::{ApiError, ErrorBody};

#[utoipa::path(get, path = "/api/v1/users/login-throttles", tag = "users",
    responses((status = 200, body = [LoginThrottle], description = "Throttles with a failure in the current window, newest first"),
        (status = 403, body = ErrorBody)))]
pub(crate) async fn list(State(state): State<AppState>) -> Result<ApiJson<Vec<LoginThrottle>>, ApiError> {
    let window = state.auth.config.failure_window;
    Ok(ApiJson(state.db.login_throttles(window).await?))
}
