//! `AccountService`: the one account the simulated BMC knows (the fleet's user) and the three roles
//! DSP0266 predefines (Administrator, Operator, ReadOnly), read-only.
//!
//! Why read-only: nothing in Waveguard manages BMC accounts, and a client that tries learns it from a
//! 405 with `Allow: GET,HEAD` (see [`super::protocol`]) rather than from a half-implemented write.
//! The account answers with an `ETag`, as DSP0266 requires of ManagerAccount.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, header};
use axum::routing::get;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::response::{RfError, RfResult, collection, link, ok, status_ok};
use crate::state::FleetState;

pub(crate) const ACCOUNT_SERVICE: &str = "#AccountService.v1_18_1.AccountService";
pub(crate) const MANAGER_ACCOUNT: &str = "#ManagerAccount.v1_14_1.ManagerAccount";
pub(crate) const ROLE: &str = "#Role.v1_3_3.Role";

/// The predefined roles and their privileges (Redfish Base privilege registry).
const ROLES: &[(&str, &[&str])] = &[
    (
        "Administrator",
        &[
            "Login",
            "ConfigureManager",
            "ConfigureUsers",
            "ConfigureSelf",
            "ConfigureComponents",
        ],
    ),
    ("Operator", &["Login", "ConfigureSelf", "ConfigureComponents"]),
    ("ReadOnly", &["Login", "ConfigureSelf"]),
];

/// The account's id: there is one account.
const ACCOUNT_ID: &str = "1";

pub(crate) fn routes() -> Router<Arc<FleetState>> {
    Router::new()
        .route("/redfish/v1/AccountService", get(account_service))
        .route("/redfish/v1/AccountService/Accounts", get(accounts))
        .route("/redfish/v1/AccountService/Accounts/{id}", get(account))
        .route("/redfish/v1/AccountService/Roles", get(roles))
        .route("/redfish/v1/AccountService/Roles/{id}", get(role))
}

async fn account_service() -> RfResult {
    ok(json!({
        "@odata.id": "/redfish/v1/AccountService",
        "@odata.type": ACCOUNT_SERVICE,
        "Id": "AccountService",
        "Name": "Account Service",
        "ServiceEnabled": true,
        "Status": status_ok(),
        "LocalAccountAuth": "Enabled",
        "MinPasswordLength": 8,
        "MaxPasswordLength": 64,
        "AccountLockoutThreshold": 0,
        "AuthFailureLoggingThreshold": 3,
        "Accounts": link("/redfish/v1/AccountService/Accounts"),
        "Roles": link("/redfish/v1/AccountService/Roles"),
    }))
}

async fn accounts() -> RfResult {
    ok(collection(
        "/redfish/v1/AccountService/Accounts",
        "#ManagerAccountCollection.ManagerAccountCollection",
        "Accounts Collection",
        vec![format!("/redfish/v1/AccountService/Accounts/{ACCOUNT_ID}")],
    ))
}

async fn account(State(s): State<Arc<FleetState>>, Path(id): Path<String>) -> RfResult {
    if id != ACCOUNT_ID {
        return Err(RfError::not_found("ManagerAccount"));
    }
    let body = json!({
        "@odata.id": format!("/redfish/v1/AccountService/Accounts/{ACCOUNT_ID}"),
        "@odata.type": MANAGER_ACCOUNT,
        "Id": ACCOUNT_ID,
        "Name": "User Account",
        "Description": "The fleet's Redfish user",
        "UserName": s.username,
        // Redfish: Password shall be null in responses.
        "Password": null,
        "RoleId": "Administrator",
        "Enabled": true,
        "Locked": false,
        "PasswordChangeRequired": false,
        "AccountTypes": ["Redfish"],
        "Links": { "Role": link("/redfish/v1/AccountService/Roles/Administrator") },
    });
    let etag = etag_of(&body);
    let mut resp = ok(body)?;
    if let Ok(v) = HeaderValue::from_str(&etag) {
        resp.headers_mut().insert(header::ETAG, v);
    }
    Ok(resp)
}

/// A strong validator of the representation: it changes exactly when the body does.
fn etag_of(body: &Value) -> String {
    let digest = Sha256::digest(body.to_string().as_bytes());
    format!("\"{}\"", hex::encode(&digest[..8]))
}

async fn roles() -> RfResult {
    ok(collection(
        "/redfish/v1/AccountService/Roles",
        "#RoleCollection.RoleCollection",
        "Roles Collection",
        ROLES
            .iter()
            .map(|(id, _)| format!("/redfish/v1/AccountService/Roles/{id}"))
            .collect(),
    ))
}

async fn role(Path(id): Path<String>) -> RfResult {
    let (id, privileges) = ROLES
        .iter()
        .find(|(r, _)| *r == id)
        .ok_or_else(|| RfError::not_found("Role"))?;
    ok(json!({
        "@odata.id": format!("/redfish/v1/AccountService/Roles/{id}"),
        "@odata.type": ROLE,
        "Id": id,
        "Name": format!("{id} Role"),
        "RoleId": id,
        "IsPredefined": true,
        "AssignedPrivileges": privileges,
    }))
}
