//! `/login` and `/logout`.

use axum::Form;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::{
    LOGIN_CSRF_COOKIE, Principal, SESSION_COOKIE, client_ip, constant_time_eq, cookie, csrf_token_for, new_secret,
    secure_request, set_cookie, token_hash, verify_dummy, verify_password,
};
use crate::AppState;
use crate::html;
use crate::url::urldecode;
use orchestrator_db::throttle::{LoginGate, Refusal};

/// Where to go after logging in.
#[derive(Debug, Deserialize)]
pub(crate) struct NextQuery {
    next: Option<String>,
}

/// The login form. `Debug` leaves the password out.
#[derive(Deserialize)]
pub(crate) struct LoginForm {
    username: String,
    password: String,
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    next: Option<String>,
}

impl std::fmt::Debug for LoginForm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginForm")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// Only a same-origin path, so a crafted link cannot send a user elsewhere
/// after login. Browsers strip tabs and newlines from URLs and treat a backslash as
/// `/`, so `/\t/evil.example` is `//evil.example` to them: any control
/// character, backslash or scheme-relative start falls back to `/`. Anything
/// kept is a valid header value, so the redirect cannot fail with a 500.
pub(crate) fn safe_next(next: Option<&str>) -> String {
    let Some(next) = next else { return "/".to_owned() };
    let unsafe_start = |text: &str| !text.starts_with('/') || text.starts_with("//") || text.starts_with("/\\");
    let unsafe_char = |c: char| c.is_control() || c == '\\';
    let decoded = urldecode(next);
    if unsafe_start(next)
        || unsafe_start(&decoded)
        || next.chars().any(|c| unsafe_char(c) || c.is_whitespace())
        || decoded.chars().any(unsafe_char)
        || axum::http::HeaderValue::from_str(next).is_err()
    {
        return "/".to_owned();
    }
    next.to_owned()
}

pub(crate) async fn login_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<NextQuery>,
) -> Response {
    render_login(&state, &headers, StatusCode::OK, q.next.as_deref(), None)
}

fn render_login(
    state: &AppState,
    headers: &HeaderMap,
    status: StatusCode,
    next: Option<&str>,
    error: Option<&str>,
) -> Response {
    // Reuse the browser's token: a second load of the form (another tab, or
    // the browser following a redirect for its favicon) must not invalidate
    // the form already on screen.
    let csrf = cookie(headers, LOGIN_CSRF_COOKIE)
        .filter(|c| c.len() == 64 && c.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_else(new_secret);
    let secure = secure_request(&state.auth.config, headers);
    let page = html::render(
        "login.html",
        minijinja::context! { csrf => csrf.clone(), next => safe_next(next), error => error, me => (), title => "Sign in" },
    );
    let mut response = (status, page).into_response();
    if let Ok(value) = set_cookie(LOGIN_CSRF_COOKIE, &csrf, 3600, secure).parse() {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    response
}

pub(crate) async fn login(State(state): State<AppState>, request: Request) -> Response {
    let ip = client_ip(request.extensions());
    let headers = request.headers().clone();
    let form = match <Form<LoginForm> as axum::extract::FromRequest<()>>::from_request(request, &()).await {
        Ok(form) => form,
        Err(_) => {
            return render_login(
                &state,
                &headers,
                StatusCode::BAD_REQUEST,
                None,
                Some("Fill in the form."),
            );
        }
    };
    let Form(form) = form;
    let next = form.next.clone();
    let fail =
        |status: StatusCode, message: &str| render_login(&state, &headers, status, next.as_deref(), Some(message));

    // Double-submit: the form's token must match the cookie set with the form.
    let csrf_ok = cookie(&headers, LOGIN_CSRF_COOKIE)
        .is_some_and(|expected| !form.csrf.is_empty() && constant_time_eq(form.csrf.as_bytes(), expected.as_bytes()));
    if !csrf_ok {
        return fail(StatusCode::FORBIDDEN, "The form expired. Please try again.");
    }

    // Throttling is decided by the database, so every replica agrees.
    let policy = state.auth.config.throttle_policy();
    match state.db.login_gate(&form.username, &ip, &policy).await {
        Ok(LoginGate::Allowed { slow_down }) => {
            if slow_down > chrono::Duration::zero() {
                // The address is guessing across accounts: slow it, never lock it.
                // The slowdown is a span of the throttle's (wall) clock.
                tokio::time::sleep(state.db.session_clock().real_time(slow_down)).await;
            }
        }
        Ok(LoginGate::Refused { retry_after, reason }) => {
            // User input goes to the log as a Debug-escaped field, never raw.
            tracing::warn!(username = ?form.username, %ip, ?reason, "login refused: too many failed attempts");
            let message = match reason {
                Refusal::PairLocked => {
                    "Too many failed attempts for this account from this address. Wait and try again."
                }
                Refusal::AccountBackoff => {
                    "Too many recent failed attempts for this account. Wait a few seconds and try again."
                }
            };
            let mut response = fail(StatusCode::TOO_MANY_REQUESTS, message);
            let seconds = retry_after.num_seconds().max(1);
            if let Ok(value) = seconds.to_string().parse() {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            return response;
        }
        Err(err) => {
            tracing::error!(error = %err, "login: throttle lookup failed");
            return fail(
                StatusCode::SERVICE_UNAVAILABLE,
                "The database is unreachable; try again shortly.",
            );
        }
    }

    let found = state.db.user_with_password_hash(form.username.trim()).await;
    let password = form.password.clone();
    let verified = match found {
        Ok((user, Some(hash))) if !user.disabled => {
            let ok = tokio::task::spawn_blocking(move || verify_password(&password, &hash))
                .await
                .unwrap_or(false);
            ok.then_some(user)
        }
        Ok(_) | Err(orchestrator_db::DbError::NotFound { .. }) => {
            // Same cost as a real check, so timing does not reveal which users exist.
            let _ = tokio::task::spawn_blocking(move || verify_dummy(&password)).await;
            None
        }
        Err(err) => {
            tracing::error!(error = %err, "login: user lookup failed");
            return fail(
                StatusCode::SERVICE_UNAVAILABLE,
                "The database is unreachable; try again shortly.",
            );
        }
    };
    let Some(user) = verified else {
        if let Err(err) = state.db.record_login_failure(&form.username, &ip, &policy).await {
            tracing::error!(error = %err, "login: could not count a failed attempt");
        }
        tracing::info!(username = ?form.username, %ip, "login failed");
        return fail(StatusCode::UNAUTHORIZED, "Wrong username or password.");
    };
    if let Err(err) = state.db.record_login_success(&form.username, &ip).await {
        tracing::warn!(error = %err, "login: could not clear the throttle");
    }

    let token = new_secret();
    let session = match state
        .db
        .create_session(
            user.id,
            &token_hash(&token),
            &token_hash(&csrf_token_for(&token)),
            state.auth.config.session_ttl,
        )
        .await
    {
        Ok(session) => session,
        Err(err) => {
            tracing::error!(error = %err, "login: could not store the session");
            return fail(
                StatusCode::SERVICE_UNAVAILABLE,
                "The database is unreachable; try again shortly.",
            );
        }
    };
    tracing::info!(username = ?user.username, session = session.id, "logged in");
    let secure = secure_request(&state.auth.config, &headers);
    let max_age = state.auth.config.session_ttl.num_seconds();
    let mut response = Redirect::to(&safe_next(form.next.as_deref())).into_response();
    for value in [
        set_cookie(SESSION_COOKIE, &token, max_age, secure),
        set_cookie(LOGIN_CSRF_COOKIE, "", 0, secure),
    ] {
        if let Ok(value) = value.parse() {
            response.headers_mut().append(header::SET_COOKIE, value);
        }
    }
    response
}

pub(crate) async fn logout(
    State(state): State<AppState>,
    headers: HeaderMap,
    principal: Option<axum::Extension<Principal>>,
) -> Response {
    if let Some(token) = cookie(&headers, SESSION_COOKIE)
        && let Err(err) = state.db.delete_session(&token_hash(&token)).await
    {
        tracing::error!(error = %err, "logout: could not delete the session");
    }
    if let Some(axum::Extension(principal)) = principal {
        tracing::info!(username = ?principal.user.username, "logged out");
    }
    let secure = secure_request(&state.auth.config, &headers);
    let mut response = Redirect::to("/login").into_response();
    if let Ok(value) = set_cookie(SESSION_COOKIE, "", 0, secure).parse() {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    response
}
