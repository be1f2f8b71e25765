//! The release managers' web UI: server-rendered pages (minijinja
//! templates embedded in the binary), embedded static assets, actions as
//! plain forms that work without JavaScript (confirmation page, then a
//! redirect) and with it (a dialog, then a background post), and live
//! rollout pages over one server-sent-events stream per browser (`live`).
//!
//! Authorization is not decided here: [`crate::auth::authorize`] has run
//! before any handler, and a handler only reads the [`Principal`] it left.

mod charts;
mod decision;
mod fleet;
pub(crate) mod live;
mod pages;
mod policy_summary;
mod reasons;
mod rma;
mod rma_pipeline;
mod rollout;
mod rollouts_list;
mod scheduler;
mod tokens;
mod verdicts;

use axum::Router;
use axum::handler::Handler;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Json, Redirect, Response};
use axum::routing::{get, post};
use minijinja::{Value, context};
use orchestrator_db::DbError;
use orchestrator_types::Role;

use crate::AppState;
use crate::auth::{self, Principal};
use crate::html::{error_page, render, render_string};
use crate::url::urlencode;

const APP_JS: &str = include_str!("../../static/app.js");
const LIVE_WORKER_JS: &str = include_str!("../../static/live-worker.js");
const LIVE_STREAM_JS: &str = include_str!("../../static/live-stream.js");
const APP_CSS: &str = include_str!("../../static/app.css");

/// A serializable record as a template value.
pub(crate) fn v<T: serde::Serialize>(record: T) -> Value {
    Value::from(minijinja::value::Serde(record))
}

/// What every page knows about the viewer.
fn me(principal: &Principal) -> Value {
    let role = principal.user.role;
    context! {
        username => principal.user.username.clone(),
        role => role.as_str(),
        can_act => role >= Role::ReleaseManager,
        is_admin => role >= Role::Admin,
    }
}

/// The context every page starts from.
fn base(principal: &Principal, nav: &str, title: &str) -> Value {
    context! { me => me(principal), csrf => principal.csrf_token(), nav, title }
}

/// A failed page or action, answered as JSON to scripts and as an error
/// page to browsers.
#[derive(Debug)]
pub(crate) struct UiError {
    status: StatusCode,
    /// The API's error code for the same failure, answered to scripts.
    code: &'static str,
    message: String,
    json: bool,
}

impl UiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        let code = match status {
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::CONFLICT => "conflict",
            StatusCode::UNPROCESSABLE_ENTITY => "invalid",
            StatusCode::FORBIDDEN => "forbidden",
            s if s.is_client_error() => "bad_request",
            _ => "internal",
        };
        Self {
            status,
            code,
            message: message.into(),
            json: false,
        }
    }

    fn json(mut self, json: bool) -> Self {
        self.json = json;
        self
    }
}

impl From<DbError> for UiError {
    fn from(err: DbError) -> Self {
        crate::error::ApiError::from(err).into()
    }
}

impl From<crate::error::ApiError> for UiError {
    fn from(err: crate::error::ApiError) -> Self {
        use crate::error::ApiError;
        let (status, code) = err.status_and_code();
        let ui = match err {
            ApiError::Invalid(fields) => Self::new(
                status,
                fields
                    .iter()
                    .map(|f| format!("{}: {}", f.field, f.message))
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            ApiError::Internal(source) => {
                tracing::error!(error = %crate::error::error_chain(&*source), "UI request failed");
                Self::new(status, "internal error; the details are in the server log")
            }
            other => Self::new(status, other.to_string()),
        };
        Self { code, ..ui }
    }
}

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        if self.json {
            let code = self.code;
            (
                self.status,
                Json(serde_json::json!({ "error": { "code": code, "message": self.message } })),
            )
                .into_response()
        } else {
            let title = self.status.canonical_reason().unwrap_or("Error");
            error_page(self.status, title, &self.message)
        }
    }
}

/// True when a script asked (it wants JSON, not a redirect).
fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/json"))
}

/// The answer to a successful action: JSON for a script, a redirect with a
/// message for a plain form.
fn done(json: bool, back: &str, message: &str) -> Response {
    if json {
        Json(serde_json::json!({ "message": message })).into_response()
    } else {
        let sep = if back.contains('?') { '&' } else { '?' };
        Redirect::to(&format!("{back}{sep}msg={}", urlencode(message))).into_response()
    }
}

fn javascript(source: &'static str) -> Response {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], source).into_response()
}

async fn app_css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], APP_CSS).into_response()
}

/// The UI's routes (authorization is applied by the app-wide layer).
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/login", get(auth::routes::login_page).post(auth::routes::login))
        .route("/logout", post(auth::routes::logout))
        .route("/static/app.js", get(|| async { javascript(APP_JS) }))
        .route("/static/live-stream.js", get(|| async { javascript(LIVE_STREAM_JS) }))
        .route("/static/live-worker.js", get(|| async { javascript(LIVE_WORKER_JS) }))
        .route("/static/app.css", get(app_css))
        .route("/favicon.ico", get(|| async { StatusCode::NO_CONTENT }))
        .route("/", get(fleet::overview))
        .route("/nodes", get(fleet::nodes))
        .route("/nodes/{name}", get(fleet::node))
        .route("/tokens", get(tokens::list).post(tokens::create))
        .route("/tokens/{id}/revoke", post(tokens::revoke))
        .route("/releases", get(pages::releases))
        .route("/releases/{id}", get(pages::release))
        .route("/releases/{id}/transition", post(pages::transition_release))
        .route("/releases/{id}/rollouts", post(pages::start_rollout))
        .route("/rollouts", get(rollouts_list::list))
        .route("/rollouts/{id}", get(rollout::detail))
        .route("/rollouts/{id}/nodes", get(rollout::nodes))
        .route("/events", get(live::events))
        .route("/events/{stream}/watch", get(live::watch))
        .route("/rollouts/{id}/{action}", post(rollout::action))
        .route("/rma", get(rma::list))
        .route("/rma/{id}", get(rma::case))
        .route("/rma/{id}/evidence", post(rma_pipeline::build_evidence))
        .route(
            "/rma/{id}/attachments",
            post(rma_pipeline::upload.layer(axum::extract::DefaultBodyLimit::max(
                crate::multipart::UPLOAD_BODY_BYTES,
            ))),
        )
        .route("/rma/{id}/submit", post(rma_pipeline::submit))
        .route("/rma/{id}/{step}", post(rma::action))
        .route("/audit", get(pages::audit))
        .route("/policies", get(pages::policies))
        .route("/users", get(pages::users))
}
