//! Security headers on every response, set in one layer so a page or route
//! added later is covered without opting in.

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;

/// The UI's scripts and styles come from `/static`; `style-src` allows
/// inline `style` attributes (progress bars set their width that way) but
/// no inline script runs. `frame-ancestors 'none'` stops clickjacking of the
/// approve and rollback buttons. `worker-src 'self'` names the live pages'
/// shared worker (`/static/live-worker.js`) rather than leaving it to the
/// fallback through `script-src`.
const CSP: &str = "default-src 'self'; script-src 'self'; worker-src 'self'; style-src 'self' 'unsafe-inline'; \
img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Adds the headers. `Cache-Control: no-store` goes on everything but the
/// static assets, because authenticated pages and API answers (fleet
/// inventory, audit entries) must not stay in a shared or browser cache; a
/// handler that set its own `Cache-Control` keeps it.
pub(crate) async fn security_headers(request: Request, next: Next) -> Response {
    let is_static = request.uri().path().starts_with("/static/");
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    let fixed: [(HeaderName, &'static str); 5] = [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (HeaderName::from_static("cross-origin-opener-policy"), "same-origin"),
    ];
    for (name, value) in fixed {
        headers.insert(name, HeaderValue::from_static(value));
    }
    if !is_static && !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}
