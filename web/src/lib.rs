//! The HTTP face of the controller: the JSON API under `/api/v1`, its
//! OpenAPI document, the release managers' web UI (server-rendered pages,
//! live updates over server-sent events), `/healthz` and `/metrics`. Every
//! route but a few public ones sits behind [`auth::authorize`].
//!
//! Invariant: this is the only crate that knows HTTP wire types; handlers
//! are thin — they parse, call the datastore or engine, and map errors with
//! [`ApiError`], which never exposes internals.

mod api;
pub mod auth;
mod duties;
mod error;
mod headers;
mod html;
mod metrics;
mod multipart;
mod ui;
mod url;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use orchestrator_db::Db;
use tokio::net::TcpListener;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;

pub use api::ApiDoc;
pub use api::alerts::{AlertReceiverConfig, AlertReceiverConfigError};
pub use duties::Duties;
pub use error::ApiError;
pub use metrics::Metrics;

/// Largest request body accepted by any route; a node import of 100,000
/// rows fits. Per-route limits below it are set in `api::router`.
pub const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// Body limit of every route that sets none of its own: releases, rollout
/// commands and inline policies are a few KiB, so 2 MiB is ample and keeps
/// an unauthenticated flood of large bodies cheap to refuse. axum's own
/// `DefaultBodyLimit` is set explicitly, because it, not the outer
/// `RequestBodyLimitLayer`, is what the `Json` and `Bytes` extractors obey.
pub const DEFAULT_BODY_BYTES: usize = 2 * 1024 * 1024;

/// A request still running after this is answered 408 rather than holding
/// a connection forever.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// What every handler can reach.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The datastore.
    pub db: Db,
    /// The controller's own metrics.
    pub metrics: Arc<Metrics>,
    /// Wakes the rollout engine after a rollout command, so an approval or
    /// a pause takes effect now rather than at the next periodic pass.
    /// `None` when this process runs no engine (tests, API-only replicas).
    pub engine_nudge: Option<orchestrator_engine::Nudge>,
    /// The Alertmanager webhook's token and matching; `None` answers 503
    /// there (no token configured, so no alert is accepted).
    pub alert_receiver: Option<Arc<AlertReceiverConfig>>,
    /// Sessions, login rate limits and cookie settings.
    pub auth: Arc<auth::AuthState>,
    /// The credential profiles the controller is configured with; a node
    /// import naming another is refused. `None` when this process has no
    /// configuration to check against (tests).
    pub credential_profiles: Option<Arc<std::collections::BTreeSet<String>>>,
    /// Separation of duties (qualification, inline policies).
    pub duties: Arc<Duties>,
    /// The Prometheus the policies' gates read: a rollout start checks
    /// their series exist for the first wave. `None`: nothing to check.
    pub prometheus: Option<orchestrator_engine::prometheus::PrometheusClient>,
    /// The engine's BMC drivers: a rollout start asks the first wave's
    /// BMCs whether they can carry out the update. `None`: nothing asked.
    pub bmcs: Option<Arc<orchestrator_engine::RedfishConnector>>,
    /// The open live streams (one per browser), so a tab can change what
    /// its browser's stream watches.
    pub(crate) live: Arc<ui::live::LiveStreams>,
}

impl AppState {
    /// State around a datastore, with fresh metrics.
    pub fn new(db: Db) -> Self {
        Self {
            db,
            metrics: Arc::new(Metrics::new()),
            engine_nudge: None,
            alert_receiver: None,
            auth: Arc::new(auth::AuthState::new(auth::AuthConfig::default())),
            credential_profiles: None,
            duties: Arc::new(Duties::default()),
            prometheus: None,
            bmcs: None,
            live: Arc::default(),
        }
    }

    /// The same state, asking the first wave's BMCs through `bmcs` before
    /// a rollout starts whether they can carry out its update.
    pub fn with_bmcs(mut self, bmcs: Arc<orchestrator_engine::RedfishConnector>) -> Self {
        self.bmcs = Some(bmcs);
        self
    }

    /// The same state with these separation-of-duties rules.
    pub fn with_duties(mut self, duties: Duties) -> Self {
        self.duties = Arc::new(duties);
        self
    }

    /// The same state, refusing node imports that name a credential profile
    /// not in `profiles`.
    pub fn with_credential_profiles(mut self, profiles: std::collections::BTreeSet<String>) -> Self {
        self.credential_profiles = Some(Arc::new(profiles));
        self
    }

    /// The same state with other authentication settings (secure cookies,
    /// session lifetime, login limits).
    pub fn with_auth_config(mut self, config: auth::AuthConfig) -> Self {
        self.auth = Arc::new(auth::AuthState::new(config));
        self
    }

    /// The same state, accepting Alertmanager webhooks as `config` says.
    pub fn with_alert_receiver(mut self, config: AlertReceiverConfig) -> Self {
        self.alert_receiver = Some(Arc::new(config));
        self
    }

    /// The same state, checking the Prometheus gates' series against
    /// `client` before a rollout starts.
    pub fn with_prometheus(mut self, client: orchestrator_engine::prometheus::PrometheusClient) -> Self {
        self.prometheus = Some(client);
        self
    }

    /// The same state, nudging `nudge` after every rollout command.
    pub fn with_engine_nudge(mut self, nudge: orchestrator_engine::Nudge) -> Self {
        self.engine_nudge = Some(nudge);
        self
    }

    /// Wakes the engine if this process runs one.
    pub(crate) fn nudge_engine(&self) {
        if let Some(nudge) = &self.engine_nudge {
            nudge.nudge();
        }
    }
}

/// The whole HTTP application.
pub fn app(state: AppState) -> Router {
    Router::new()
        .nest("/api/v1", api::router())
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics::render))
        .merge(ui::router())
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::max(DEFAULT_BODY_BYTES))
        // Inside the metrics layer, so refused requests are counted too.
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth::authorize))
        .layer(axum::middleware::from_fn_with_state(state.clone(), metrics::track))
        .layer(RequestBodyLimitLayer::new(MAX_BODY_BYTES))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            REQUEST_TIMEOUT,
        ))
        // Outermost, so refusals by the layers above carry the headers too.
        .layer(axum::middleware::from_fn(headers::security_headers))
        .with_state(state)
}

/// Serves `app` on an already-bound listener until `shutdown` resolves, then
/// finishes in-flight requests. Taking a bound listener lets tests bind
/// port 0 and lets the caller report the real address.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // The peer address feeds the per-address login rate limit.
    axum::serve(listener, app(state).into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(shutdown)
        .await
}

/// Liveness and readiness in one: 200 when the database answers.
async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    match state.db.ping().await {
        // Still 200: a degraded controller must not be restarted by a load
        // balancer mid-storm; the body says why flashing is paused.
        Ok(()) => match state.engine_nudge.as_ref().map(|n| n.controller_status()) {
            Some(status) if status.degraded => (
                StatusCode::OK,
                format!(
                    "degraded: {}; new flashes paused, no node is charged\n",
                    status.reason.as_deref().unwrap_or("controller fault")
                ),
            ),
            _ => (StatusCode::OK, "ok\n".to_owned()),
        },
        Err(err) => {
            tracing::warn!(error = %err, "health check: database unreachable");
            (StatusCode::SERVICE_UNAVAILABLE, "database unreachable\n".to_owned())
        }
    }
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".into())
}
