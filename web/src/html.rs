//! Pages rendered on the server from the minijinja templates embedded in the binary, for the UI and
//! for the pages the authorization layer answers itself (login, 403).

use std::sync::OnceLock;

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use minijinja::{Environment, Value, context};

use crate::url::urlencode;

/// Every template, embedded so the one binary serves the UI.
const TEMPLATES: &[(&str, &str)] = &[
    ("base.html", include_str!("../templates/base.html")),
    ("login.html", include_str!("../templates/login.html")),
    ("error.html", include_str!("../templates/error.html")),
    ("confirm.html", include_str!("../templates/confirm.html")),
    ("overview.html", include_str!("../templates/overview.html")),
    ("releases.html", include_str!("../templates/releases.html")),
    ("release.html", include_str!("../templates/release.html")),
    ("rollouts.html", include_str!("../templates/rollouts.html")),
    ("rollout.html", include_str!("../templates/rollout.html")),
    ("rollout_nodes.html", include_str!("../templates/rollout_nodes.html")),
    ("rollout_live.html", include_str!("../templates/rollout_live.html")),
    ("audit.html", include_str!("../templates/audit.html")),
    ("policies.html", include_str!("../templates/policies.html")),
    ("users.html", include_str!("../templates/users.html")),
    ("nodes.html", include_str!("../templates/nodes.html")),
    ("node.html", include_str!("../templates/node.html")),
    ("tokens.html", include_str!("../templates/tokens.html")),
    ("reason.html", include_str!("../templates/reason.html")),
    ("rma.html", include_str!("../templates/rma.html")),
    ("rma_case.html", include_str!("../templates/rma_case.html")),
];

fn env() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        for (name, source) in TEMPLATES {
            // The templates are fixed at build time and covered by tests;
            // a broken one shows as a render error on its page, not a panic.
            if let Err(err) = env.add_template(name, source) {
                tracing::error!(template = name, error = %err, "template does not parse");
            }
        }
        env.add_filter("dt", format_time);
        // minijinja's own urlencode needs a feature; node names go into links.
        env.add_filter("urlencode", |value: String| urlencode(&value));
        env.add_filter("json", |value: Value| serde_json::to_string(&value).unwrap_or_default());
        env
    })
}

/// `2026-12-02T18:33:11.123Z` → `2026-12-02 18:33 UTC`.
fn format_time(value: String) -> String {
    match chrono::DateTime::parse_from_rfc3339(&value) {
        Ok(at) => at.with_timezone(&chrono::Utc).format("%Y-%m-%d %H:%M UTC").to_string(),
        Err(_) => value,
    }
}

/// Renders a template to HTML; a template error is logged and shown as a
/// bare 500 page without details.
pub(crate) fn render(name: &str, ctx: Value) -> Response {
    match env().get_template(name).and_then(|t| t.render(ctx)) {
        Ok(html) => Html(html).into_response(),
        Err(err) => {
            tracing::error!(template = name, error = %format!("{err:#}"), "template render failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "page could not be rendered\n").into_response()
        }
    }
}

/// Renders a template to a string (for server-sent fragments).
pub(crate) fn render_string(name: &str, ctx: Value) -> Option<String> {
    match env().get_template(name).and_then(|t| t.render(ctx)) {
        Ok(html) => Some(html),
        Err(err) => {
            tracing::error!(template = name, error = %format!("{err:#}"), "template render failed");
            None
        }
    }
}

/// An error page with `status`.
pub(crate) fn error_page(status: StatusCode, title: &str, message: &str) -> Response {
    let mut response = render("error.html", context! { title, message, me => (), csrf => "" });
    *response.status_mut() = status;
    response
}
