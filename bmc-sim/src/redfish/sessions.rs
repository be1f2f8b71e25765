//! `SessionService`: login, session reads and logout (DSP0266 "Session management").

use std::sync::Arc;

use axum::Json;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Unauthorized;
use super::response::{RfError, RfResult, collection, link, node_of, ok, status_ok, ts, types};
use crate::conn::BmcConn;
use crate::state::{FleetState, SessionRec};

pub(super) async fn session_service() -> RfResult {
    ok(json!({
        "@odata.id": "/redfish/v1/SessionService",
        "@odata.type": types::SESSION_SERVICE,
        "Id": "SessionService",
        "Name": "Session Service",
        "ServiceEnabled": true,
        "SessionTimeout": crate::state::SESSION_TIMEOUT_SECS,
        "Status": status_ok(),
        "Sessions": link("/redfish/v1/SessionService/Sessions"),
    }))
}

pub(super) async fn sessions(State(s): State<Arc<FleetState>>, ConnectInfo(c): ConnectInfo<BmcConn>) -> RfResult {
    let node = node_of(&s, &c)?;
    let mut m = node.lock();
    m.expire_sessions(s.session_now());
    let mut ids: Vec<u64> = m.sessions.values().map(|r| r.id).collect();
    drop(m);
    ids.sort_unstable();
    ok(collection(
        "/redfish/v1/SessionService/Sessions",
        "#SessionCollection.SessionCollection",
        "Session Collection",
        ids.into_iter()
            .map(|i| format!("/redfish/v1/SessionService/Sessions/{i}"))
            .collect(),
    ))
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Login {
    user_name: String,
    password: String,
}

// Manual Debug so a password never reaches a log line.
impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("user_name", &self.user_name)
            .finish_non_exhaustive()
    }
}

fn session_json(r: &SessionRec, user: &str) -> Value {
    json!({
        "@odata.id": format!("/redfish/v1/SessionService/Sessions/{}", r.id),
        "@odata.type": types::SESSION,
        "Id": r.id.to_string(),
        "Name": "User Session",
        "UserName": user,
        "Password": null,
        "CreatedTime": ts(r.created),
    })
}

pub(super) async fn create_session(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    body: axum::body::Bytes,
) -> Result<Response, Response> {
    let node = node_of(&s, &c).map_err(IntoResponse::into_response)?;
    let login: Login = serde_json::from_slice(&body)
        .map_err(|_| RfError::bad_request("body must be {\"UserName\": ..., \"Password\": ...}").into_response())?;
    if login.user_name != s.username || login.password != s.password {
        return Err(Unauthorized(RfError::new(
            StatusCode::UNAUTHORIZED,
            "Base.1.18.InsufficientPrivilege",
            "invalid credentials",
        ))
        .into_response());
    }
    let token = {
        use rand::Rng;
        let bytes: [u8; 16] = rand::rng().random();
        hex::encode(bytes)
    };
    let now = s.now();
    let mut m = node.lock();
    m.next_session += 1;
    let rec = SessionRec {
        id: m.next_session,
        token: token.clone(),
        created: now,
        last_used: s.session_now(),
    };
    let body = session_json(&rec, &s.username);
    m.sessions.insert(token.clone(), rec);
    drop(m);
    let location = body["@odata.id"].as_str().unwrap_or_default().to_owned();
    let mut resp = (StatusCode::CREATED, Json(body)).into_response();
    let h = resp.headers_mut();
    if let (Ok(t), Ok(l)) = (HeaderValue::from_str(&token), HeaderValue::from_str(&location)) {
        h.insert("X-Auth-Token", t);
        h.insert(header::LOCATION, l);
    }
    h.insert("OData-Version", HeaderValue::from_static("4.0"));
    Ok(resp)
}

pub(super) async fn session(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path(id): Path<String>,
) -> RfResult {
    let node = node_of(&s, &c)?;
    let mut m = node.lock();
    m.expire_sessions(s.session_now());
    let rec = m
        .sessions
        .values()
        .find(|r| r.id.to_string() == id)
        .ok_or_else(|| RfError::not_found("Session"))?;
    ok(session_json(rec, &s.username))
}

pub(super) async fn delete_session(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path(id): Path<String>,
) -> RfResult {
    let node = node_of(&s, &c)?;
    let mut m = node.lock();
    let token = m
        .sessions
        .values()
        .find(|r| r.id.to_string() == id)
        .map(|r| r.token.clone())
        .ok_or_else(|| RfError::not_found("Session"))?;
    m.sessions.remove(&token);
    Ok(StatusCode::NO_CONTENT.into_response())
}
