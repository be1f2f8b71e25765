//! The logged-in user's API tokens: list, create (the token is shown once,
//! in the response to the post, never in a URL or a redirect), revoke.
//! Only the user's own tokens: the username comes from the session, never
//! from the request.

use axum::Extension;
use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use minijinja::context;
use serde::Deserialize;

use super::pages::Flash;
use super::{UiError, base, done, render, v, wants_json};
use crate::AppState;
use crate::auth::{self, Principal};

async fn page(
    state: &AppState,
    me: &Principal,
    flash: Option<String>,
    new_token: Option<(String, String)>,
) -> Result<Response, UiError> {
    let tokens = state.db.api_tokens(&me.user.username).await?;
    let live = tokens.iter().filter(|t| !t.revoked).count();
    let mut response = render(
        "tokens.html",
        context! {
            tokens => v(&tokens), live,
            new_token => new_token.map(|(name, token)| context! { name, token }),
            flash,
            ..base(me, "tokens", "API tokens")
        },
    );
    // The page may carry a token shown once: keep it out of every cache.
    response.headers_mut().insert(
        axum::http::header::CACHE_CONTROL,
        axum::http::HeaderValue::from_static("no-store"),
    );
    Ok(response)
}

pub(crate) async fn list(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
    Query(flash): Query<Flash>,
) -> Result<Response, UiError> {
    page(&state, &me, flash.msg, None).await
}

/// Creating a token.
#[derive(Debug, Deserialize)]
pub(crate) struct CreateForm {
    name: String,
}

pub(crate) async fn create(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
    headers: HeaderMap,
    Form(form): Form<CreateForm>,
) -> Result<Response, UiError> {
    let json = wants_json(&headers);
    let token = auth::new_api_token();
    let username = me.user.username.as_str();
    let created = state
        .db
        .add_api_token(username, &form.name, &auth::token_hash(&token), username)
        .await
        .map_err(|e| UiError::from(e).json(json))?;
    if json {
        let body = serde_json::json!({
            "message": format!("Token {:?} created; copy it now, it is not shown again.", created.name),
            "id": created.id,
            "token": token,
        });
        let mut response = axum::Json(body).into_response();
        response.headers_mut().insert(
            axum::http::header::CACHE_CONTROL,
            axum::http::HeaderValue::from_static("no-store"),
        );
        return Ok(response);
    }
    let message = format!("Token “{}” created. Copy it now: it is not shown again.", created.name);
    let mut response = page(&state, &me, Some(message), Some((created.name, token))).await?;
    *response.status_mut() = StatusCode::CREATED;
    Ok(response)
}

pub(crate) async fn revoke(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
    headers: HeaderMap,
    Path(id): Path<i64>,
) -> Result<Response, UiError> {
    let json = wants_json(&headers);
    let username = me.user.username.as_str();
    state
        .db
        .revoke_api_token(username, id, username)
        .await
        .map_err(|e| UiError::from(e).json(json))?;
    Ok(done(json, "/tokens", &format!("Token #{id} revoked.")))
}
