//! What every resource answers with: Redfish errors, `@odata.type` versions and document helpers.

use axum::Json;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};

use crate::conn::BmcConn;
use crate::state::{FleetState, Node};

/// `@odata.type` values, pinned to schema versions present in DMTF's published bundle.
pub(crate) mod types {
    pub const SERVICE_ROOT: &str = "#ServiceRoot.v1_21_0.ServiceRoot";
    pub const SESSION_SERVICE: &str = "#SessionService.v1_2_0.SessionService";
    pub const SESSION: &str = "#Session.v1_8_0.Session";
    pub const SYSTEM: &str = "#ComputerSystem.v1_28_0.ComputerSystem";
    pub const PROCESSOR: &str = "#Processor.v1_23_0.Processor";
    pub const PROCESSOR_METRICS: &str = "#ProcessorMetrics.v1_7_0.ProcessorMetrics";
    pub const CHASSIS: &str = "#Chassis.v1_28_0.Chassis";
    pub const THERMAL_SUBSYSTEM: &str = "#ThermalSubsystem.v1_5_0.ThermalSubsystem";
    pub const THERMAL_METRICS: &str = "#ThermalMetrics.v1_3_3.ThermalMetrics";
    pub const SENSOR: &str = "#Sensor.v1_13_0.Sensor";
    pub const MANAGER: &str = "#Manager.v1_25_0.Manager";
    pub const UPDATE_SERVICE: &str = "#UpdateService.v1_17_1.UpdateService";
    pub const SOFTWARE_INVENTORY: &str = "#SoftwareInventory.v1_14_0.SoftwareInventory";
    pub const TASK_SERVICE: &str = "#TaskService.v1_3_0.TaskService";
    pub const TASK: &str = "#Task.v1_7_4.Task";
    pub const LOG_SERVICE: &str = "#LogService.v1_9_0.LogService";
    pub const LOG_ENTRY: &str = "#LogEntry.v1_21_0.LogEntry";
    pub const ASSEMBLY: &str = "#Assembly.v1_5_1.Assembly";
}

/// A Redfish error response (`{"error": {...}}`); never carries credentials.
#[derive(Debug)]
pub(crate) struct RfError {
    status: StatusCode,
    message_id: &'static str,
    pub(super) message: String,
}

impl RfError {
    pub(crate) fn new(status: StatusCode, message_id: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message_id,
            message: message.into(),
        }
    }
    pub(crate) fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "Base.1.18.ResourceNotFound",
            format!("The requested resource of type {what} was not found."),
        )
    }
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "Base.1.18.GeneralError", message)
    }
}

impl IntoResponse for RfError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": {
                "code": self.message_id,
                "message": self.message,
                "@Message.ExtendedInfo": [{
                    "@odata.type": "#Message.v1_3_0.Message",
                    "MessageId": self.message_id,
                    "Message": self.message,
                    "MessageSeverity": "Critical",
                    "Resolution": "See the message.",
                }]
            }
        });
        let mut resp = (self.status, Json(body)).into_response();
        resp.headers_mut()
            .insert("OData-Version", HeaderValue::from_static("4.0"));
        resp
    }
}

pub(crate) type RfResult = Result<Response, RfError>;

pub(crate) fn ok(v: Value) -> RfResult {
    let mut resp = Json(v).into_response();
    resp.headers_mut()
        .insert("OData-Version", HeaderValue::from_static("4.0"));
    Ok(resp)
}

pub(super) fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

pub(crate) fn link(uri: impl Into<String>) -> Value {
    json!({ "@odata.id": uri.into() })
}

pub(crate) fn collection(id: &str, odata_type: &str, name: &str, members: Vec<String>) -> Value {
    json!({
        "@odata.id": id,
        "@odata.type": odata_type,
        "Name": name,
        "Members@odata.count": members.len(),
        "Members": members.into_iter().map(link).collect::<Vec<_>>(),
    })
}

pub(crate) fn status_ok() -> Value {
    json!({ "State": "Enabled", "Health": "OK" })
}

pub(super) fn node_of<'a>(s: &'a FleetState, conn: &BmcConn) -> Result<&'a Node, RfError> {
    s.node(conn.node).ok_or_else(|| RfError::not_found("Node"))
}

/// A collection whose members are inlined when `expand` is given (the member documents).
pub(super) fn collection_of(
    id: &str,
    odata_type: &str,
    name: &str,
    members: Vec<String>,
    expand: Option<Vec<Value>>,
) -> Value {
    let mut v = collection(id, odata_type, name, members);
    if let Some(docs) = expand {
        v["Members"] = Value::Array(docs);
    }
    v
}
