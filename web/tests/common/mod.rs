//! What the web crate's in-process tests share: the app behind an admin's API token and one JSON
//! request through it. Fleet, release and policy fixtures come from `orchestrator_db::testing`.

#![allow(dead_code)] // each test binary uses part of it

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;
use web::{AppState, app};

/// The app as the `api` admin user: every request carries its API token.
pub async fn authed_app(state: AppState) -> Router {
    let token = web::auth::provision_api_token(&state.db, "api", orchestrator_types::Role::Admin, "tests", "test")
        .await
        .unwrap();
    let bearer = axum::http::HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
    app(state).layer(axum::middleware::map_request(move |mut request: Request<Body>| {
        let bearer = bearer.clone();
        async move {
            request.headers_mut().entry(header::AUTHORIZATION).or_insert(bearer);
            request
        }
    }))
}

/// One request (a JSON body when given); the answer as JSON, or as a JSON string when it is not JSON.
pub async fn call(app: &Router, method: Method, uri: &str, body: Option<&str>) -> (StatusCode, Value) {
    send(app, None, method, uri, body).await
}

/// A page as `token` sees it: status and body.
pub async fn get_page(app: &Router, token: &str, uri: &str) -> (StatusCode, String) {
    let request = Request::get(uri)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// A form post as `token` (asking for JSON when `json`, as the page's script does): status, `Location`, body.
pub async fn post_form(
    app: &Router,
    token: &str,
    uri: &str,
    body: &str,
    json: bool,
) -> (StatusCode, Option<String>, String) {
    let mut request = Request::post(uri)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if json {
        request = request.header(header::ACCEPT, "application/json");
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let location = response
        .headers()
        .get(header::LOCATION)
        .map(|v| v.to_str().unwrap().to_owned());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, location, String::from_utf8_lossy(&bytes).into_owned())
}

/// [`call`] as `token` (`Authorization: Bearer`).
pub async fn call_as(app: &Router, token: &str, method: Method, uri: &str, body: Option<&str>) -> (StatusCode, Value) {
    send(app, Some(token), method, uri, body).await
}

async fn send(app: &Router, token: Option<&str>, method: Method, uri: &str, body: Option<&str>) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    if body.is_some() {
        request = request.header(header::CONTENT_TYPE, "application/json");
    }
    let request = request
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_owned())))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let value =
        serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, value)
}
