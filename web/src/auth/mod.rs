//! Who is asking, and may they: local users with argon2 password hashes,
//! browser sessions in HttpOnly cookies with a per-session CSRF token, API
//! tokens for automation (`Authorization: Bearer`), login throttling (in
//! the database, `orchestrator_db::throttle`), and
//! one authorization layer in front of every route.
//!
//! Invariant: authorization is decided in one place, [`authorize`], from the
//! method and path alone, before any handler runs — so a route added later
//! by anyone is covered without opting in: reads need `viewer`, every other
//! method needs `release_manager`, user management needs `admin`. Only the
//! routes in [`public_route`] skip it, each with its reason.
//!
//! Invariant: raw secrets (passwords, session tokens, API tokens, CSRF
//! tokens) are never logged, stored, rendered in errors or shown by `Debug`;
//! the database holds argon2 hashes of passwords and SHA-256 hashes of
//! tokens (which are 256-bit random, so a fast hash is enough).

pub(crate) mod routes;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use argon2::Argon2;
use argon2::password_hash::phc::PasswordHash;
use argon2::password_hash::{PasswordHasher, PasswordVerifier};
use axum::body::{Body, to_bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use orchestrator_db::model::User;
use orchestrator_types::Role;
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::AppState;
use crate::error::ApiError;
use crate::url::{urldecode, urlencode};

/// Name of the session cookie.
pub const SESSION_COOKIE: &str = "wg_session";
/// Name of the cookie that carries the login form's CSRF token (double
/// submit: there is no session yet to hold it).
pub const LOGIN_CSRF_COOKIE: &str = "wg_login_csrf";
/// Header a script sends the session's CSRF token in.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// Form field a plain HTML form sends the CSRF token in.
pub const CSRF_FIELD: &str = "csrf";
/// Prefix of API tokens, so that a leaked one is recognisable in a scan.
pub const API_TOKEN_PREFIX: &str = "wg_";

/// Largest form body the CSRF check buffers; UI forms are a few fields.
const MAX_FORM_BYTES: usize = 64 * 1024;

/// Authentication settings.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// Mark cookies `Secure`. Set it when served over TLS (or behind a TLS
    /// proxy); cookies are also marked when the request says
    /// `X-Forwarded-Proto: https`.
    pub secure_cookies: bool,
    /// How long a session lives after login.
    pub session_ttl: chrono::Duration,
    /// Failed logins of one account from one address within
    /// `failure_window` before that pair (only) is refused for the window.
    pub max_failures: u32,
    /// The window failed logins are counted in.
    pub failure_window: chrono::Duration,
    /// The per-account backoff and per-address slowdown; see
    /// [`orchestrator_db::throttle::ThrottlePolicy`].
    pub throttle: orchestrator_db::throttle::ThrottlePolicy,
}

impl AuthConfig {
    /// The throttle numbers, with the pair limit and window from this config.
    pub fn throttle_policy(&self) -> orchestrator_db::throttle::ThrottlePolicy {
        orchestrator_db::throttle::ThrottlePolicy {
            window: self.failure_window,
            pair_max_failures: self.max_failures,
            ..self.throttle
        }
    }
}

/// Environment variable that turns on `Secure` cookies (`1` or `true`) for
/// a controller served over TLS without a proxy that says so.
pub const SECURE_COOKIES_ENV: &str = "WAVEGUARD_SECURE_COOKIES";

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            secure_cookies: std::env::var(SECURE_COOKIES_ENV).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")),
            // A working day: release managers live in the UI during a rollout.
            session_ttl: chrono::Duration::hours(12),
            // Enough for typos, far too few for guessing.
            max_failures: 5,
            failure_window: chrono::Duration::minutes(15),
            throttle: orchestrator_db::throttle::ThrottlePolicy::default(),
        }
    }
}

/// Authentication state shared by all requests.
#[derive(Debug)]
pub struct AuthState {
    pub(crate) config: AuthConfig,
}

impl AuthState {
    /// State with `config`.
    pub fn new(config: AuthConfig) -> Self {
        Self { config }
    }
}

/// How a request proved who it is.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// A browser session; carries the session's CSRF token for forms.
    Session { csrf_token: String },
    /// An API token; no CSRF (a browser never sends it by itself).
    ApiToken,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Session { .. } => f.write_str("Session { csrf_token: <redacted> }"),
            Credential::ApiToken => f.write_str("ApiToken"),
        }
    }
}

/// The authenticated user of a request, put in the request's extensions by
/// [`authorize`].
#[derive(Debug, Clone)]
pub struct Principal {
    pub user: User,
    pub credential: Credential,
}

impl Principal {
    /// The CSRF token forms must carry (empty for API tokens, which have no forms).
    pub fn csrf_token(&self) -> &str {
        match &self.credential {
            Credential::Session { csrf_token } => csrf_token,
            Credential::ApiToken => "",
        }
    }
}

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, logged in or not.
    Public,
    /// Any logged-in user (logout).
    Authenticated,
    /// At least this role.
    Role(Role),
}

/// Routes reachable without a user, each for a reason.
fn public_route(method: &Method, path: &str) -> bool {
    matches!(path, "/healthz" | "/metrics" | "/login" | "/favicon.ico")
        // Assets carry nothing secret and the login page needs them.
        || (method == Method::GET && path.starts_with("/static/"))
        // Alertmanager authenticates with its own bearer token, checked by
        // the webhook handler; it has no user session.
        || (method == Method::POST && path == "/api/v1/alerts/alertmanager")
}

/// The access a request needs, from its method and path alone.
pub fn required_access(method: &Method, path: &str) -> Access {
    if public_route(method, path) {
        return Access::Public;
    }
    if path == "/logout" {
        return Access::Authenticated;
    }
    let is_users = |p: &str| p == "/users" || p.starts_with("/users/");
    if is_users(path) || path.strip_prefix("/api/v1").is_some_and(is_users) {
        return Access::Role(Role::Admin);
    }
    if method == Method::GET || method == Method::HEAD {
        Access::Role(Role::Viewer)
    } else {
        Access::Role(Role::ReleaseManager)
    }
}

fn is_api(path: &str) -> bool {
    path.starts_with("/api/")
}

/// The authorization layer: authenticates, checks the role the route needs
/// and the CSRF token of cookie-authenticated writes, then runs the handler
/// with a [`Principal`] in the request's extensions.
pub async fn authorize(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let access = required_access(&method, &path);
    if access == Access::Public {
        return next.run(request).await;
    }
    let principal = match authenticate(&state, request.headers()).await {
        Ok(Some(principal)) => principal,
        Ok(None) => return unauthenticated(&method, &path, request.uri().path_and_query().map(|p| p.as_str())),
        Err(err) => return err.into_response(),
    };
    if let Access::Role(needed) = access
        && principal.user.role < needed
    {
        // Debug formatting escapes control characters: a path cannot forge log lines.
        tracing::info!(user = ?principal.user.username, role = %principal.user.role, %method, path = ?path,
            "refused: role too low");
        let message = format!(
            "{} is a {}; this needs {}",
            principal.user.username, principal.user.role, needed
        );
        return forbidden(&path, message);
    }
    let mut request = request;
    if !(method == Method::GET || method == Method::HEAD || method == Method::OPTIONS)
        && let Credential::Session { csrf_token } = &principal.credential
    {
        match check_csrf(request, csrf_token).await {
            Ok(checked) => request = checked,
            Err(response) => return response,
        }
    }
    request.extensions_mut().insert(principal);
    next.run(request).await
}

/// Finds the user behind a request's bearer token or session cookie.
async fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<Option<Principal>, ApiError> {
    if headers.contains_key(header::AUTHORIZATION) {
        let Some(token) = bearer_token(headers).and_then(|t| std::str::from_utf8(t).ok()) else {
            return Ok(None);
        };
        let user = state.db.user_by_api_token(&token_hash(token.trim())).await?;
        return Ok(user.map(|user| Principal {
            user,
            credential: Credential::ApiToken,
        }));
    }
    let Some(token) = cookie(headers, SESSION_COOKIE) else {
        return Ok(None);
    };
    let found = state.db.session(&token_hash(&token)).await?;
    Ok(found.map(|(_session, user)| Principal {
        user,
        credential: Credential::Session {
            csrf_token: csrf_token_for(&token),
        },
    }))
}

fn unauthenticated(method: &Method, path: &str, path_and_query: Option<&str>) -> Response {
    if is_api(path) {
        let mut response = ApiError::Unauthorized.into_response();
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return response;
    }
    if method == Method::GET || method == Method::HEAD {
        let next = path_and_query.unwrap_or("/");
        return Redirect::to(&format!("/login?next={}", urlencode(next))).into_response();
    }
    (StatusCode::UNAUTHORIZED, "log in first\n").into_response()
}

fn forbidden(path: &str, message: String) -> Response {
    if is_api(path) {
        ApiError::Forbidden(message).into_response()
    } else {
        crate::html::error_page(StatusCode::FORBIDDEN, "Not allowed", &message)
    }
}

/// Checks the CSRF token of a cookie-authenticated write: the header a
/// script sends, or the `csrf` field of a form (the body is buffered and
/// handed on unchanged).
async fn check_csrf(request: Request, expected: &str) -> Result<Request, Response> {
    let refuse = |path: &str| {
        forbidden(
            path,
            "missing or wrong CSRF token: reload the page and try again".into(),
        )
    };
    let path = request.uri().path().to_owned();
    if let Some(sent) = request.headers().get(CSRF_HEADER) {
        return if constant_time_eq(sent.as_bytes(), expected.as_bytes()) {
            Ok(request)
        } else {
            Err(refuse(&path))
        };
    }
    let content_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if crate::multipart::is_multipart(content_type.as_deref()) {
        // An upload form carries the token as its `csrf` field; buffered
        // here (within the upload limit) so the check stays in this layer.
        let (parts, body) = request.into_parts();
        let Ok(bytes) = to_bytes(body, crate::multipart::UPLOAD_BODY_BYTES).await else {
            return Err(ApiError::PayloadTooLarge(format!(
                "an upload may be at most {} bytes",
                crate::multipart::UPLOAD_BODY_BYTES
            ))
            .into_response());
        };
        let sent =
            crate::multipart::text_field(content_type.as_deref().unwrap_or_default(), bytes.clone(), CSRF_FIELD).await;
        return if sent.is_some_and(|sent| constant_time_eq(sent.as_bytes(), expected.as_bytes())) {
            Ok(Request::from_parts(parts, Body::from(bytes)))
        } else {
            Err(refuse(&path))
        };
    }
    let is_form = content_type
        .as_deref()
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if !is_form {
        return Err(refuse(&path));
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = to_bytes(body, MAX_FORM_BYTES).await else {
        return Err((StatusCode::PAYLOAD_TOO_LARGE, "form too large\n").into_response());
    };
    let sent = form_field(&bytes, CSRF_FIELD);
    if sent.is_some_and(|sent| constant_time_eq(sent.as_bytes(), expected.as_bytes())) {
        Ok(Request::from_parts(parts, Body::from(bytes)))
    } else {
        Err(refuse(&path))
    }
}

/// One field of a urlencoded form.
pub(crate) fn form_field(body: &[u8], name: &str) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    text.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (urldecode(key) == name).then(|| urldecode(value))
    })
}

/// Compares secrets without an early exit, so timing does not reveal how
/// much of a guess was right (`subtle` keeps the optimiser from adding one).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

/// The token of an `Authorization: Bearer <token>` header. The scheme is
/// case-insensitive (RFC 9110 section 11.1), the same here as at the
/// Alertmanager webhook, so `bearer` works everywhere or nowhere.
pub(crate) fn bearer_token(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, token) = value.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case(b"Bearer ").then_some(token)
}

/// A cookie's value from the request headers.
pub(crate) fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (key, value) = pair.trim().split_once('=')?;
            (key == name).then(|| value.to_owned())
        })
}

/// A `Set-Cookie` value: HttpOnly, SameSite=Lax (Strict would drop the
/// session when a release manager follows a link from a page alert), Secure
/// when configured or the request came over TLS.
pub(crate) fn set_cookie(name: &str, value: &str, max_age_seconds: i64, secure: bool) -> String {
    let mut cookie = format!("{name}={value}; Path=/; HttpOnly; SameSite=Lax; Max-Age={max_age_seconds}");
    if secure {
        cookie.push_str("; Secure");
    }
    cookie
}

/// Whether cookies for this request must be `Secure`.
pub(crate) fn secure_request(config: &AuthConfig, headers: &HeaderMap) -> bool {
    config.secure_cookies
        || headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

/// The client address for rate limiting (the peer; proxies are not trusted).
pub(crate) fn client_ip(request_extensions: &axum::http::Extensions) -> String {
    request_extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| "unknown".to_owned(), |ConnectInfo(addr)| addr.ip().to_string())
}

/// Deletes expired sessions every `every` until the returned task is
/// aborted (or the runtime ends). Failures are logged and retried at the
/// next tick: a missed sweep costs only table space, never access.
pub fn spawn_session_sweeper(db: orchestrator_db::Db, every: std::time::Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match db.delete_expired_sessions().await {
                Ok(0) => {}
                Ok(deleted) => tracing::debug!(deleted, "expired sessions deleted"),
                Err(err) => tracing::warn!(error = %err, "could not delete expired sessions"),
            }
        }
    })
}

/// A fresh 256-bit random token, hex.
pub fn new_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// A fresh API token: shown once to the user, stored only as [`token_hash`].
pub fn new_api_token() -> String {
    format!("{API_TOKEN_PREFIX}{}", new_secret())
}

/// A session's CSRF token, derived from the session secret rather than
/// stored: the database keeps only its hash (like every other secret), and
/// knowing the CSRF token reveals nothing of the session cookie.
pub(crate) fn csrf_token_for(session_token: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"waveguard-csrf\0");
    hasher.update(session_token.as_bytes());
    hex::encode(hasher.finalize())
}

/// The stored form of a session or API token.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Why a password could not be hashed.
#[derive(Debug, thiserror::Error)]
pub enum PasswordError {
    #[error("the password is empty")]
    Empty,
    #[error("could not hash the password")]
    Hash(#[source] argon2::password_hash::Error),
}

/// Hashes a password to an argon2id PHC string with a random salt.
pub fn hash_password(password: &str) -> Result<String, PasswordError> {
    if password.is_empty() {
        return Err(PasswordError::Empty);
    }
    let hash: PasswordHash = Argon2::default()
        .hash_password(password.as_bytes())
        .map_err(PasswordError::Hash)?;
    Ok(hash.to_string())
}

/// Checks a password against a stored PHC string. An unparsable hash
/// verifies nothing.
pub fn verify_password(password: &str, stored: &str) -> bool {
    match PasswordHash::new(stored) {
        Ok(parsed) => Argon2::default().verify_password(password.as_bytes(), &parsed).is_ok(),
        Err(_) => false,
    }
}

/// Spends the time of one verification, so that a login for a user who
/// does not exist takes as long as a wrong password.
pub(crate) fn verify_dummy(password: &str) {
    static DUMMY: OnceLock<Option<String>> = OnceLock::new();
    if let Some(hash) = DUMMY.get_or_init(|| hash_password("not a real password").ok()) {
        let _ = verify_password(password, hash);
    }
}

/// Creates the user if missing (without a password: it can only use
/// tokens) and issues a new API token for it; returns the token, which is
/// not stored and cannot be shown again. For provisioning automation and
/// for tests.
pub async fn provision_api_token(
    db: &orchestrator_db::Db,
    username: &str,
    role: Role,
    token_name: &str,
    actor: &str,
) -> Result<String, orchestrator_db::DbError> {
    match db.user(username).await {
        Ok(_) => {}
        Err(orchestrator_db::DbError::NotFound { .. }) => {
            db.add_user(username, username, role, None, actor).await?;
        }
        Err(err) => return Err(err),
    }
    let token = new_api_token();
    db.add_api_token(username, token_name, &token_hash(&token), actor)
        .await?;
    Ok(token)
}

/// Shared handle on the authentication state.
pub type SharedAuth = Arc<AuthState>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_by_method_and_path() {
        let cases = [
            (Method::GET, "/healthz", Access::Public),
            (Method::POST, "/login", Access::Public),
            (Method::GET, "/static/app.css", Access::Public),
            (Method::POST, "/static/app.css", Access::Role(Role::ReleaseManager)),
            (Method::POST, "/logout", Access::Authenticated),
            (Method::GET, "/", Access::Role(Role::Viewer)),
            (Method::GET, "/api/v1/releases", Access::Role(Role::Viewer)),
            (Method::POST, "/api/v1/releases", Access::Role(Role::ReleaseManager)),
            (Method::GET, "/users", Access::Role(Role::Admin)),
            (Method::GET, "/api/v1/users/x", Access::Role(Role::Admin)),
            (Method::GET, "/usersx", Access::Role(Role::Viewer)),
            (Method::POST, "/api/v1/alerts/alertmanager", Access::Public),
            (Method::GET, "/api/v1/alerts", Access::Role(Role::Viewer)),
        ];
        for (method, path, want) in cases {
            assert_eq!(required_access(&method, path), want, "{method} {path}");
        }
    }

    #[test]
    fn form_fields_decode() {
        assert_eq!(form_field(b"a=1&csrf=ab%2Fc+d", "csrf").as_deref(), Some("ab/c d"));
        assert_eq!(form_field(b"a=1", "csrf"), None);
        assert_eq!(form_field(b"csrf=%zz%", "csrf").as_deref(), Some("%zz%"));
    }

    #[test]
    fn passwords_verify() {
        let hash = hash_password("correct horse").unwrap();
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_password("correct horse", &hash));
        assert!(!verify_password("wrong", &hash));
        assert!(!verify_password("correct horse", "garbage"));
    }

    #[test]
    fn cookies_parse() {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, HeaderValue::from_static("a=1; wg_session=abc; b=2"));
        assert_eq!(cookie(&headers, SESSION_COOKIE).as_deref(), Some("abc"));
        assert_eq!(cookie(&headers, "c"), None);
    }
}
