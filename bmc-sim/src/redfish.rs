//! The Redfish service every simulated BMC exposes.
//!
//! One axum `Router` serves all BMCs; the accepted connection says which BMC it reached (see
//! [`crate::fleet::BmcConn`]). Resource shapes follow the DMTF CSDL (versions in [`types`]); the service is
//! checked with DMTF's redfish-service-validator in `tests/validator.rs`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Multipart, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::fleet::BmcConn;
use std::collections::HashMap;

use crate::platform::{AcceptedAs, DescribedBy, RedfishLayout, XidOrigin};
use crate::rng::{self, Purpose};
use crate::state::{EventKind, FleetState, LogEvent, Node, SessionRec, fault};
use crate::update::{self, MAX_IMAGE_BYTES};

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
}

/// Schemas referenced by `$metadata`: (file stem, namespaces to include).
const METADATA_REFS: &[(&str, &[&str])] = &[
    ("ServiceRoot", &["ServiceRoot", "ServiceRoot.v1_21_0"]),
    ("SessionService", &["SessionService", "SessionService.v1_2_0"]),
    ("Session", &["Session", "Session.v1_8_0"]),
    ("SessionCollection", &["SessionCollection"]),
    ("ComputerSystem", &["ComputerSystem", "ComputerSystem.v1_28_0"]),
    ("ComputerSystemCollection", &["ComputerSystemCollection"]),
    ("Processor", &["Processor", "Processor.v1_23_0"]),
    ("ProcessorCollection", &["ProcessorCollection"]),
    ("ProcessorMetrics", &["ProcessorMetrics", "ProcessorMetrics.v1_7_0"]),
    ("Chassis", &["Chassis", "Chassis.v1_28_0"]),
    ("ChassisCollection", &["ChassisCollection"]),
    ("ThermalSubsystem", &["ThermalSubsystem", "ThermalSubsystem.v1_5_0"]),
    ("ThermalMetrics", &["ThermalMetrics", "ThermalMetrics.v1_3_3"]),
    ("Sensor", &["Sensor", "Sensor.v1_13_0"]),
    ("SensorCollection", &["SensorCollection"]),
    ("Manager", &["Manager", "Manager.v1_25_0"]),
    ("ManagerCollection", &["ManagerCollection"]),
    ("UpdateService", &["UpdateService", "UpdateService.v1_17_1"]),
    ("SoftwareInventory", &["SoftwareInventory", "SoftwareInventory.v1_14_0"]),
    ("SoftwareInventoryCollection", &["SoftwareInventoryCollection"]),
    ("TaskService", &["TaskService", "TaskService.v1_3_0"]),
    ("Task", &["Task", "Task.v1_7_4"]),
    ("TaskCollection", &["TaskCollection"]),
    ("LogService", &["LogService", "LogService.v1_9_0"]),
    ("LogServiceCollection", &["LogServiceCollection"]),
    ("LogEntry", &["LogEntry", "LogEntry.v1_21_0"]),
    ("LogEntryCollection", &["LogEntryCollection"]),
    ("AccountService", &["AccountService", "AccountService.v1_18_1"]),
    ("ManagerAccount", &["ManagerAccount", "ManagerAccount.v1_14_1"]),
    ("ManagerAccountCollection", &["ManagerAccountCollection"]),
    ("Role", &["Role", "Role.v1_3_3"]),
    ("RoleCollection", &["RoleCollection"]),
    ("Message", &["Message", "Message.v1_3_0"]),
    ("Resource", &["Resource", "Resource.v1_24_0"]),
    ("RedfishExtensions", &["RedfishExtensions.v1_0_0"]),
];

/// Most log entries returned per page.
const LOG_PAGE: usize = 500;

/// A Redfish error response (`{"error": {...}}`); never carries credentials.
#[derive(Debug)]
pub(crate) struct RfError {
    status: StatusCode,
    message_id: &'static str,
    message: String,
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
    fn bad_request(message: impl Into<String>) -> Self {
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

fn ts(t: DateTime<Utc>) -> String {
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

fn node_of<'a>(s: &'a FleetState, conn: &BmcConn) -> Result<&'a Node, RfError> {
    s.node(conn.node).ok_or_else(|| RfError::not_found("Node"))
}

/// The shared Redfish router; `state` holds every BMC.
pub(crate) fn router(state: Arc<FleetState>) -> Router {
    let v1 = Router::new()
        .route("/redfish", get(redfish_versions))
        .route("/redfish/", get(redfish_versions))
        .route("/redfish/v1", get(service_root))
        .route("/redfish/v1/", get(service_root))
        .route("/redfish/v1/$metadata", get(metadata))
        .route("/redfish/v1/odata", get(odata))
        .route("/redfish/v1/SessionService", get(session_service))
        .route(
            "/redfish/v1/SessionService/Sessions",
            get(sessions).post(create_session),
        )
        // DSP0266: a collection that accepts POST accepts it on its `Members` URI too.
        .route("/redfish/v1/SessionService/Sessions/Members", post(create_session))
        .route(
            "/redfish/v1/SessionService/Sessions/{id}",
            get(session).delete(delete_session),
        )
        .route("/redfish/v1/Systems", get(systems))
        .route("/redfish/v1/Systems/{sys}", get(system))
        .route(
            "/redfish/v1/Systems/{sys}/Actions/ComputerSystem.Reset",
            post(system_reset),
        )
        .route("/redfish/v1/Systems/{sys}/Processors", get(processors))
        .route("/redfish/v1/Systems/{sys}/Processors/{id}", get(processor))
        .route(
            "/redfish/v1/Systems/{sys}/Processors/{id}/ProcessorMetrics",
            get(processor_metrics),
        )
        .route("/redfish/v1/Systems/{sys}/LogServices", get(log_services))
        .route("/redfish/v1/Systems/{sys}/LogServices/{svc}", get(log_service))
        .route("/redfish/v1/Systems/{sys}/LogServices/{svc}/Entries", get(log_entries))
        .route(
            "/redfish/v1/Systems/{sys}/LogServices/{svc}/Entries/{id}",
            get(log_entry),
        )
        .route("/redfish/v1/Chassis", get(chassis_collection))
        .route("/redfish/v1/Chassis/{ch}", get(chassis))
        .route("/redfish/v1/Chassis/{ch}/ThermalSubsystem", get(thermal_subsystem))
        .route(
            "/redfish/v1/Chassis/{ch}/ThermalSubsystem/ThermalMetrics",
            get(thermal_metrics),
        )
        .route("/redfish/v1/Chassis/{ch}/Sensors", get(sensors))
        .route("/redfish/v1/Chassis/{ch}/Sensors/{id}", get(sensor))
        .route("/redfish/v1/Managers", get(managers))
        .route("/redfish/v1/Managers/1", get(manager))
        .route("/redfish/v1/Managers/1/Actions/Manager.Reset", post(manager_reset))
        .route(
            "/redfish/v1/UpdateService",
            get(update_service).patch(patch_update_service),
        )
        .route(
            "/redfish/v1/UpdateService/SimpleUpdateActionInfo",
            get(simple_update_action_info),
        )
        .route(
            "/redfish/v1/UpdateService/update",
            post(http_push_update).layer(DefaultBodyLimit::max(MAX_IMAGE_BYTES)),
        )
        .route(
            "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
            post(simple_update),
        )
        .route(
            "/redfish/v1/UpdateService/update-multipart",
            post(multipart_update).layer(DefaultBodyLimit::max(MAX_IMAGE_BYTES + 1024 * 1024)),
        )
        .route("/redfish/v1/UpdateService/FirmwareInventory", get(firmware_inventory))
        .route("/redfish/v1/UpdateService/FirmwareInventory/{id}", get(firmware_entry))
        .route("/redfish/v1/TaskService", get(task_service))
        .route("/redfish/v1/TaskService/Tasks", get(tasks))
        .route("/redfish/v1/TaskService/Tasks/{id}", get(task))
        .route("/redfish/v1/TaskService/TaskMonitors/{id}", get(task_monitor))
        .fallback(|| async { RfError::not_found("Resource") });
    let routes = v1.merge(crate::accounts::routes()).with_state(state.clone());
    // Authentication and faults first (outermost), then the protocol rules, then the resource.
    routes
        .clone()
        .layer(middleware::from_fn_with_state(
            crate::protocol::Protocol::new(routes, layout(&state).expand_query),
            crate::protocol::layer,
        ))
        .layer(middleware::from_fn_with_state(state, gate))
}

/// Paths readable without credentials (the spec requires the service root to be open).
fn is_public(method: &axum::http::Method, path: &str) -> bool {
    let p = path.trim_end_matches('/');
    matches!(
        p,
        "/redfish" | "/redfish/v1" | "/redfish/v1/$metadata" | "/redfish/v1/odata"
    ) || (method == axum::http::Method::POST
        && matches!(
            p,
            "/redfish/v1/SessionService/Sessions" | "/redfish/v1/SessionService/Sessions/Members"
        ))
}

/// Faults, then authentication, then the handler.
async fn gate(State(s): State<Arc<FleetState>>, req: Request, next: Next) -> Response {
    let Some(conn) = req.extensions().get::<ConnectInfo<BmcConn>>().map(|c| c.0) else {
        return RfError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Base.1.18.InternalError",
            "no connection info",
        )
        .into_response();
    };
    let Some(node) = s.node(conn.node) else {
        return RfError::not_found("Node").into_response();
    };
    let injected = node.injected.load(Ordering::Relaxed);
    let seq = node.req_seq.fetch_add(1, Ordering::Relaxed);
    let faults = &s.scenario.bmc_faults;
    let u = rng::unit(s.scenario.seed, node.index as u64, Purpose::RequestFault, seq, 0);
    if injected & fault::TIMEOUT != 0
        || (u >= faults.unavailable_rate && u < faults.unavailable_rate + faults.timeout_rate)
    {
        hang(&s).await;
        return RfError::new(StatusCode::GATEWAY_TIMEOUT, "Base.1.18.OperationTimeout", "timed out").into_response();
    }
    if injected & fault::UNAVAILABLE != 0 || u < faults.unavailable_rate {
        let mut resp = RfError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "Base.1.18.ServiceTemporarilyUnavailable",
            "BMC is busy",
        )
        .into_response();
        let secs = faults.retry_after.as_secs().max(1);
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return resp;
    }
    if !is_public(req.method(), req.uri().path())
        && let Err(e) = authenticate(&s, node, req.headers())
    {
        return Unauthorized(e).into_response();
    }
    let resp = next.run(req).await;
    if injected & fault::MALFORMED != 0 {
        // Cut the body mid-document, the way a BMC with a broken web server does.
        let mut r = Response::new(Body::from("{\"@odata.id\": \"/redfish/v1/\", \"Name\": \"tru"));
        *r.status_mut() = resp.status();
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return r;
    }
    resp
}

/// Hangs longer than any sane client timeout, but ends on shutdown so tests finish.
async fn hang(s: &FleetState) {
    let mut shutdown = s.shutdown.clone();
    tokio::select! {
        _ = tokio::time::sleep(s.hang_for) => {}
        _ = shutdown.wait_for(|stop| *stop) => {}
    }
}

fn authenticate(s: &FleetState, node: &Node, headers: &HeaderMap) -> Result<(), RfError> {
    let unauthorized = || {
        let mut e = RfError::new(
            StatusCode::UNAUTHORIZED,
            "Base.1.18.NoValidSession",
            "authentication required",
        );
        e.message = "There is no valid session established with the implementation.".to_owned();
        e
    };
    if let Some(token) = headers.get("X-Auth-Token").and_then(|v| v.to_str().ok()) {
        // A session lives until DELETE or `SessionTimeout` seconds without a request (DSP0266
        // "Session lifetime"); each authenticated request restarts its clock.
        let now = s.now();
        let mut m = node.lock();
        m.expire_sessions(now);
        return match m.sessions.get_mut(token) {
            Some(rec) => {
                rec.last_used = now;
                Ok(())
            }
            None => Err(unauthorized()),
        };
    }
    if let Some(basic) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        && let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(basic.trim())
        && let Ok(text) = String::from_utf8(decoded)
        && let Some((user, pass)) = text.split_once(':')
        && user == s.username
        && pass == s.password
    {
        return Ok(());
    }
    Err(unauthorized())
}

impl IntoResponse for Unauthorized {
    fn into_response(self) -> Response {
        let mut r = self.0.into_response();
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"bmc-sim\""),
        );
        r
    }
}

/// A 401 with the `WWW-Authenticate` challenge.
struct Unauthorized(RfError);

// -------------------------------------------------------------------------------------------------------
// Service root, metadata, sessions.

async fn redfish_versions() -> RfResult {
    ok(json!({ "v1": "/redfish/v1/" }))
}

async fn service_root(State(s): State<Arc<FleetState>>, ConnectInfo(c): ConnectInfo<BmcConn>) -> RfResult {
    let node = node_of(&s, &c)?;
    let v = json!({
        "@odata.id": "/redfish/v1",
        "@odata.type": types::SERVICE_ROOT,
        "Id": "RootService",
        "Name": "Root Service",
        "RedfishVersion": "1.17.0",
        "UUID": uuid_for(s.scenario.seed, node.index, 0),
        "Vendor": "Waveguard bmc-sim",
        "Product": format!("Simulated BMC ({})", node.labels.sku),
        "Systems": link("/redfish/v1/Systems"),
        "Chassis": link("/redfish/v1/Chassis"),
        "Managers": link("/redfish/v1/Managers"),
        "SessionService": link("/redfish/v1/SessionService"),
        "UpdateService": link("/redfish/v1/UpdateService"),
        "Tasks": link("/redfish/v1/TaskService"),
        "AccountService": link("/redfish/v1/AccountService"),
        "ProtocolFeaturesSupported": crate::protocol::protocol_features(layout(&s).expand_query),
        "Links": { "Sessions": link("/redfish/v1/SessionService/Sessions") },
    });
    ok(v)
}

/// A stable RFC 4122-shaped UUID for (node, purpose).
fn uuid_for(seed: u64, node: usize, which: u64) -> String {
    let a = rng::key(seed, node as u64, Purpose::Reset, which, u64::MAX);
    let b = rng::key(seed, node as u64, Purpose::Reset, which, u64::MAX - 1);
    let hex = format!("{a:016x}{b:016x}");
    format!(
        "{}-{}-4{}-a{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

async fn metadata() -> Response {
    let mut xml = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<edmx:Edmx xmlns:edmx=\"http://docs.oasis-open.org/odata/ns/edmx\" Version=\"4.0\">\n",
    );
    for (file, namespaces) in METADATA_REFS {
        xml.push_str(&format!(
            "  <edmx:Reference Uri=\"http://redfish.dmtf.org/schemas/v1/{file}_v1.xml\">\n"
        ));
        for ns in *namespaces {
            xml.push_str(&format!("    <edmx:Include Namespace=\"{ns}\"/>\n"));
        }
        xml.push_str("  </edmx:Reference>\n");
    }
    xml.push_str(
        "  <edmx:DataServices>\n    <Schema xmlns=\"http://docs.oasis-open.org/odata/ns/edm\" Namespace=\"Service\">\n      <EntityContainer Name=\"Service\" Extends=\"ServiceRoot.v1_21_0.ServiceContainer\"/>\n    </Schema>\n  </edmx:DataServices>\n</edmx:Edmx>\n",
    );
    let mut resp = xml.into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/xml"));
    resp.headers_mut()
        .insert("OData-Version", HeaderValue::from_static("4.0"));
    resp
}

async fn odata() -> RfResult {
    let services = [
        ("Service", "/redfish/v1"),
        ("Systems", "/redfish/v1/Systems"),
        ("Chassis", "/redfish/v1/Chassis"),
        ("Managers", "/redfish/v1/Managers"),
        ("SessionService", "/redfish/v1/SessionService"),
        ("UpdateService", "/redfish/v1/UpdateService"),
        ("TaskService", "/redfish/v1/TaskService"),
        ("AccountService", "/redfish/v1/AccountService"),
    ];
    ok(json!({
        "@odata.context": "/redfish/v1/$metadata",
        "value": services.iter().map(|(n, u)| json!({"name": n, "kind": "Singleton", "url": u})).collect::<Vec<_>>(),
    }))
}

async fn session_service() -> RfResult {
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

async fn sessions(State(s): State<Arc<FleetState>>, ConnectInfo(c): ConnectInfo<BmcConn>) -> RfResult {
    let node = node_of(&s, &c)?;
    let now = s.now();
    let mut m = node.lock();
    m.expire_sessions(now);
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

async fn create_session(
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
        last_used: now,
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

async fn session(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path(id): Path<String>,
) -> RfResult {
    let node = node_of(&s, &c)?;
    let now = s.now();
    let mut m = node.lock();
    m.expire_sessions(now);
    let rec = m
        .sessions
        .values()
        .find(|r| r.id.to_string() == id)
        .ok_or_else(|| RfError::not_found("Session"))?;
    ok(session_json(rec, &s.username))
}

async fn delete_session(
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

// -------------------------------------------------------------------------------------------------------
// Systems, processors, event log. Ids and names come from the platform's `RedfishLayout`: bmc-sim's
// own single system `1`, or a DGX-style host system listed first with the GPUs under a baseboard system.

fn layout(s: &FleetState) -> &RedfishLayout {
    &s.scenario.redfish_layout
}

/// CPUs of a host system distinct from the GPU system (a DGX host has two).
const HOST_CPUS: usize = 2;

/// 404 unless `sys` is one of the layout's systems.
fn known_system(s: &FleetState, sys: &str) -> Result<(), RfError> {
    if layout(s).systems().contains(&sys) {
        Ok(())
    } else {
        Err(RfError::not_found("ComputerSystem"))
    }
}

fn system_uri(sys: &str) -> String {
    format!("/redfish/v1/Systems/{sys}")
}

fn gpu_uri(s: &FleetState, g: usize) -> String {
    let l = layout(s);
    format!(
        "/redfish/v1/Systems/{}/Processors/{}",
        l.gpu_system,
        l.name(&l.gpu_id, g)
    )
}

/// The chassis holding GPU `g`'s sensors.
fn sensor_chassis(s: &FleetState, g: usize) -> String {
    let l = layout(s);
    match &l.gpu_chassis {
        Some(t) => l.name(t, g),
        None => l.main_system().to_owned(),
    }
}

async fn systems(State(s): State<Arc<FleetState>>) -> RfResult {
    ok(collection(
        "/redfish/v1/Systems",
        "#ComputerSystemCollection.ComputerSystemCollection",
        "Computer System Collection",
        layout(&s).systems().into_iter().map(system_uri).collect(),
    ))
}

async fn system(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path(sys): Path<String>,
) -> RfResult {
    known_system(&s, &sys)?;
    let node = node_of(&s, &c)?;
    let l = layout(&s);
    let uri = system_uri(&sys);
    if sys != l.main_system() {
        // The GPU baseboard of a host: its GPUs and its event log, no reset of its own here.
        return ok(json!({
            "@odata.id": uri,
            "@odata.type": types::SYSTEM,
            "Id": sys,
            "Name": "HGX Baseboard",
            "SystemType": "Physical",
            "Manufacturer": "NVIDIA",
            "Model": node.labels.sku,
            "SerialNumber": format!("SIMBB{:08}", node.index),
            "UUID": uuid_for(s.scenario.seed, node.index, 3),
            "PowerState": "On",
            "Status": status_ok(),
            "Processors": link(format!("{uri}/Processors")),
            "LogServices": link(format!("{uri}/LogServices")),
            "Links": {
                "Chassis": [link(format!("/redfish/v1/Chassis/{sys}"))],
                "ManagedBy": [link("/redfish/v1/Managers/1")],
            },
        }));
    }
    let now = s.now();
    let mut m = node.lock();
    node.settle(&mut m, now);
    let rebooting = m.reboot_until.is_some();
    let bios = m
        .components
        .iter()
        .find(|c| c.kind == orchestrator_types::ComponentKind::Bios)
        .map(|c| c.active().to_owned());
    let mut v = json!({
        "@odata.id": uri,
        "@odata.type": types::SYSTEM,
        "Id": sys,
        "Name": node.name,
        "SystemType": "Physical",
        "Manufacturer": "Waveguard",
        "Model": node.labels.sku,
        "SerialNumber": format!("SIM{:08}", node.index),
        "UUID": uuid_for(s.scenario.seed, node.index, 1),
        "PowerState": if rebooting { "PoweringOn" } else { "On" },
        "Status": if rebooting { json!({"State": "Starting", "Health": "OK"}) } else { status_ok() },
        "Processors": link(format!("{uri}/Processors")),
        "LogServices": link(format!("{uri}/LogServices")),
        "Links": {
            "Chassis": [link(format!("/redfish/v1/Chassis/{sys}"))],
            "ManagedBy": [link("/redfish/v1/Managers/1")],
        },
        "Actions": {
            "#ComputerSystem.Reset": {
                "target": format!("{uri}/Actions/ComputerSystem.Reset"),
                "ResetType@Redfish.AllowableValues": ["On", "ForceRestart", "GracefulRestart", "PowerCycle"],
            }
        },
    });
    if let Some(b) = bios {
        v["BiosVersion"] = json!(b);
    }
    ok(v)
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct ResetBody {
    #[serde(default)]
    reset_type: Option<String>,
}

fn parse_reset(body: &[u8], allowed: &[&str]) -> Result<(), RfError> {
    let b: ResetBody = if body.is_empty() {
        ResetBody::default()
    } else {
        serde_json::from_slice(body).map_err(|_| RfError::bad_request("body must be {\"ResetType\": ...}"))?
    };
    match b.reset_type {
        None => Ok(()),
        Some(t) if allowed.contains(&t.as_str()) => Ok(()),
        Some(t) => Err(RfError::new(
            StatusCode::BAD_REQUEST,
            "Base.1.18.ActionParameterValueNotInList",
            format!("ResetType '{t}' is not one of {}", allowed.join(", ")),
        )),
    }
}

/// The URI of the host system's Reset action (what `Base.ResetRequired` names).
pub(crate) fn system_reset_uri(s: &FleetState) -> String {
    format!("{}/Actions/ComputerSystem.Reset", system_uri(layout(s).main_system()))
}

async fn system_reset(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path(sys): Path<String>,
    body: axum::body::Bytes,
) -> RfResult {
    if sys != layout(&s).main_system() {
        return Err(RfError::not_found("ComputerSystem"));
    }
    let node = node_of(&s, &c)?;
    parse_reset(&body, &["On", "ForceRestart", "GracefulRestart", "PowerCycle"])?;
    let now = s.now();
    let mut m = node.lock();
    update::system_reset(&s, node, &mut m, now);
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The GPU `id` names on the GPU system.
fn gpu_index(s: &FleetState, sys: &str, id: &str) -> Result<usize, RfError> {
    let l = layout(s);
    if sys != l.gpu_system {
        return Err(RfError::not_found("Processor"));
    }
    l.gpu_of(&l.gpu_id, id, s.gpus)
        .ok_or_else(|| RfError::not_found("Processor"))
}

/// Whether the request asks for members inline (`$expand=.` or `$expand=*`, one level) and the
/// layout advertises `ExpandQuery`.
fn wants_expand(s: &FleetState, query: &HashMap<String, String>) -> bool {
    layout(s).expand_query
        && query
            .get("$expand")
            .is_some_and(|e| e.starts_with('.') || e.starts_with('*'))
}

/// A collection whose members are inlined when `expand` is given (the member documents).
fn collection_of(id: &str, odata_type: &str, name: &str, members: Vec<String>, expand: Option<Vec<Value>>) -> Value {
    let mut v = collection(id, odata_type, name, members);
    if let Some(docs) = expand {
        v["Members"] = Value::Array(docs);
    }
    v
}

async fn processors(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path(sys): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> RfResult {
    known_system(&s, &sys)?;
    let l = layout(&s);
    let uri = format!("{}/Processors", system_uri(&sys));
    let ids: Vec<String> = if sys == l.gpu_system {
        (0..s.gpus).map(|g| l.name(&l.gpu_id, g)).collect()
    } else {
        (0..HOST_CPUS).map(|i| format!("CPU_{i}")).collect()
    };
    let expand = if wants_expand(&s, &query) {
        let node = node_of(&s, &c)?;
        Some(
            ids.iter()
                .map(|id| processor_doc(&s, node, &sys, id))
                .collect::<Result<Vec<_>, _>>()?,
        )
    } else {
        None
    };
    ok(collection_of(
        &uri,
        "#ProcessorCollection.ProcessorCollection",
        "Processor Collection",
        ids.iter().map(|id| format!("{uri}/{id}")).collect(),
        expand,
    ))
}

fn processor_doc(s: &FleetState, node: &Node, sys: &str, id: &str) -> Result<Value, RfError> {
    let l = layout(s);
    let uri = format!("{}/Processors/{id}", system_uri(sys));
    if sys != l.gpu_system {
        let cpu = id
            .strip_prefix("CPU_")
            .and_then(|i| i.parse::<usize>().ok())
            .filter(|&i| i < HOST_CPUS)
            .ok_or_else(|| RfError::not_found("Processor"))?;
        return Ok(json!({
            "@odata.id": uri,
            "@odata.type": types::PROCESSOR,
            "Id": id,
            "Name": format!("CPU {cpu}"),
            "ProcessorType": "CPU",
            "Manufacturer": "Intel(R) Corporation",
            "Model": "Simulated host CPU",
            "Status": status_ok(),
        }));
    }
    let g = gpu_index(s, sys, id)?;
    let now = s.now();
    let mut m = node.lock();
    node.settle(&mut m, now);
    let rebooting = m.reboot_until.is_some();
    let fw = s
        .gpu_components
        .get(g)
        .and_then(|&ci| m.components.get(ci))
        .map(|c| c.active().to_owned());
    let mut v = json!({
        "@odata.id": uri,
        "@odata.type": types::PROCESSOR,
        "Id": id,
        "Name": format!("GPU {}", g + l.gpu_index_base),
        "ProcessorType": "GPU",
        "Manufacturer": "NVIDIA",
        "Model": "Simulated GPU",
        "SerialNumber": format!("SIMGPU{:08}{g}", node.index),
        "Status": if rebooting { json!({"State": "Starting", "Health": "OK"}) } else { status_ok() },
        "Metrics": link(format!("{uri}/ProcessorMetrics")),
    });
    if let Some(t) = &l.gpu_chassis {
        v["Links"] = json!({ "Chassis": link(format!("/redfish/v1/Chassis/{}", l.name(t, g))) });
    }
    if let Some(fw) = fw {
        v["FirmwareVersion"] = json!(fw);
    }
    Ok(v)
}

async fn processor(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path((sys, id)): Path<(String, String)>,
) -> RfResult {
    known_system(&s, &sys)?;
    let node = node_of(&s, &c)?;
    ok(processor_doc(&s, node, &sys, &id)?)
}

async fn processor_metrics(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path((sys, id)): Path<(String, String)>,
) -> RfResult {
    let node = node_of(&s, &c)?;
    let g = gpu_index(&s, &sys, &id)?;
    let now = s.now();
    let mut m = node.lock();
    node.settle(&mut m, now);
    let events = s.events_until(node, &mut m, now);
    let xid = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Xid { gpu, .. } if gpu as usize == g))
        .count();
    let aer_c = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Aer { correctable: true }))
        .count();
    let aer_f = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Aer { correctable: false }))
        .count();
    ok(json!({
        "@odata.id": format!("{}/ProcessorMetrics", gpu_uri(&s, g)),
        "@odata.type": types::PROCESSOR_METRICS,
        "Id": "ProcessorMetrics",
        "Name": format!("GPU {} Metrics", g + layout(&s).gpu_index_base),
        "UncorrectableOtherErrorCount": xid,
        "PCIeErrors": { "CorrectableErrorCount": aer_c, "NonFatalErrorCount": aer_f },
    }))
}

/// The log services of `sys`: the GPU system has `EventLog` (GPU events); a host system distinct from
/// it has its own `SEL` and `EventLog` with host entries only.
fn log_service_ids(s: &FleetState, sys: &str) -> &'static [&'static str] {
    if sys == layout(s).gpu_system {
        &["EventLog"]
    } else {
        &["SEL", "EventLog"]
    }
}

fn known_log(s: &FleetState, sys: &str, svc: &str) -> Result<(), RfError> {
    known_system(s, sys)?;
    if log_service_ids(s, sys).contains(&svc) {
        Ok(())
    } else {
        Err(RfError::not_found("LogService"))
    }
}

async fn log_services(State(s): State<Arc<FleetState>>, Path(sys): Path<String>) -> RfResult {
    known_system(&s, &sys)?;
    let base = format!("{}/LogServices", system_uri(&sys));
    ok(collection(
        &base,
        "#LogServiceCollection.LogServiceCollection",
        "Log Service Collection",
        log_service_ids(&s, &sys)
            .iter()
            .map(|id| format!("{base}/{id}"))
            .collect(),
    ))
}

async fn log_service(State(s): State<Arc<FleetState>>, Path((sys, svc)): Path<(String, String)>) -> RfResult {
    known_log(&s, &sys, &svc)?;
    let uri = format!("{}/LogServices/{svc}", system_uri(&sys));
    let gpu_log = sys == layout(&s).gpu_system;
    let mut v = json!({
        "@odata.id": uri,
        "@odata.type": types::LOG_SERVICE,
        "Id": svc,
        "Name": if gpu_log { "System Event Log" } else if svc == "SEL" { "Host IPMI SEL" } else { "Host Event Log" },
        "ServiceEnabled": true,
        "OverWritePolicy": if gpu_log { "NeverOverWrites" } else { "WrapsWhenFull" },
        "DateTime": ts(s.now()),
        "Status": status_ok(),
        "Entries": link(format!("{uri}/Entries")),
    });
    if !gpu_log {
        v["LogEntryType"] = json!(if svc == "SEL" { "SEL" } else { "Event" });
    } else if layout(&s).log_entry_type {
        v["LogEntryType"] = json!("Event");
    }
    ok(v)
}

fn entry_json(s: &FleetState, e: &LogEvent) -> Value {
    let l = layout(s);
    let gpu_system = system_uri(&l.gpu_system);
    let (severity, args, message, origin) = match e.kind {
        EventKind::Xid { gpu, code } => {
            let g = gpu as usize;
            let name = l.name(&l.gpu_id, g);
            let origin = match (l.xid_origin, &l.gpu_chassis) {
                (XidOrigin::Chassis, Some(t)) => format!("/redfish/v1/Chassis/{}", l.name(t, g)),
                _ => gpu_uri(s, g),
            };
            (
                "Critical",
                vec![name.clone(), format!("XID {code}")],
                format!("{name} reported XID {code}."),
                origin,
            )
        }
        EventKind::Aer { correctable } => {
            let what = if correctable {
                "PCIe AER Correctable"
            } else {
                "PCIe AER Uncorrectable NonFatal"
            };
            (
                if correctable { "Warning" } else { "Critical" },
                vec!["PCIe_Root_Port_0".to_owned(), what.to_owned()],
                format!("PCIe_Root_Port_0 reported {what} error."),
                gpu_system.clone(),
            )
        }
        EventKind::LinkDegraded { width } => (
            "Warning",
            vec!["PCIe_Root_Port_0".to_owned(), format!("Link degraded to x{width}")],
            format!("PCIe_Root_Port_0 link degraded: width x16 -> x{width}."),
            gpu_system.clone(),
        ),
    };
    json!({
        "@odata.id": format!("{gpu_system}/LogServices/EventLog/Entries/{}", e.id),
        "@odata.type": types::LOG_ENTRY,
        "Id": e.id.to_string(),
        "Name": "Log Entry",
        "EntryType": "Event",
        "Created": ts(e.created),
        "Severity": severity,
        "Message": message,
        "MessageId": "ResourceEvent.1.3.ResourceErrorsDetected",
        "MessageArgs": args,
        "Links": { "OriginOfCondition": link(origin) },
    })
}

/// The host's own log entries (BIOS and boot records at the fleet's start): nothing a GPU health
/// reader should count, which is why it must not take the host's log for the GPU log.
fn host_entries(s: &FleetState, sys: &str, svc: &str) -> Vec<Value> {
    let base = format!("{}/LogServices/{svc}/Entries", system_uri(sys));
    let created = ts(s.epoch);
    if svc == "SEL" {
        ["System boot completed", "BIOS POST completed"]
            .iter()
            .enumerate()
            .map(|(i, message)| {
                json!({
                    "@odata.id": format!("{base}/{}", i + 1),
                    "@odata.type": types::LOG_ENTRY,
                    "Id": (i + 1).to_string(),
                    "Name": "Log Entry",
                    "EntryType": "SEL",
                    "Created": created,
                    "Severity": "OK",
                    "Message": message,
                    "SensorType": "System Event",
                    "EntryCode": "Assert",
                })
            })
            .collect()
    } else {
        vec![json!({
            "@odata.id": format!("{base}/1"),
            "@odata.type": types::LOG_ENTRY,
            "Id": "1",
            "Name": "Log Entry",
            "EntryType": "Event",
            "Created": created,
            "Severity": "OK",
            "Message": format!("The resource '{sys}' has changed status to OK."),
            "MessageId": "ResourceEvent.1.3.ResourceStatusChangedOK",
            "MessageArgs": [sys, "OK"],
            "Links": { "OriginOfCondition": link(system_uri(sys)) },
        })]
    }
}

#[derive(Deserialize, Default)]
struct Paging {
    #[serde(rename = "$skip")]
    skip: Option<usize>,
    #[serde(rename = "$top")]
    top: Option<usize>,
}

/// Whether node `node`'s GPU event log answers with a `nextLink` that repeats (injected, or the
/// scenario's `bmc_faults.looping_next_link` share).
fn next_link_loops(s: &FleetState, node: &Node) -> bool {
    node.injected.load(Ordering::Relaxed) & fault::LOOPING_NEXT_LINK != 0
        || rng::unit(s.scenario.seed, node.index as u64, Purpose::LoopingNextLink, 0, 0)
            < s.scenario.bmc_faults.looping_next_link
}

async fn log_entries(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path((sys, svc)): Path<(String, String)>,
    Query(paging): Query<Paging>,
) -> RfResult {
    known_log(&s, &sys, &svc)?;
    let node = node_of(&s, &c)?;
    let base = format!("{}/LogServices/{svc}/Entries", system_uri(&sys));
    if sys != layout(&s).gpu_system {
        let entries = host_entries(&s, &sys, &svc);
        return ok(json!({
            "@odata.id": base,
            "@odata.type": "#LogEntryCollection.LogEntryCollection",
            "Name": "Log Entries",
            "Members@odata.count": entries.len(),
            "Members": entries,
        }));
    }
    node.event_log_pages.fetch_add(1, Ordering::Relaxed);
    let now = s.now();
    let events = {
        let mut m = node.lock();
        node.settle(&mut m, now);
        s.events_until(node, &mut m, now)
    };
    let skip = paging.skip.unwrap_or(0);
    let top = paging.top.unwrap_or(LOG_PAGE).min(LOG_PAGE);
    let page: Vec<Value> = events.iter().skip(skip).take(top).map(|e| entry_json(&s, e)).collect();
    let mut v = json!({
        "@odata.id": base,
        "@odata.type": "#LogEntryCollection.LogEntryCollection",
        "Name": "System Event Log Entries",
        "Members@odata.count": events.len(),
        "Members": page,
    });
    if next_link_loops(&s, node) {
        // Every page names the same next page, whatever it is.
        v["Members@odata.nextLink"] = json!(format!("{base}?$skip={top}&$top={top}"));
    } else if skip + top < events.len() {
        v["Members@odata.nextLink"] = json!(format!("{base}?$skip={}&$top={top}", skip + top));
    }
    ok(v)
}

async fn log_entry(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path((sys, svc, id)): Path<(String, String, String)>,
) -> RfResult {
    known_log(&s, &sys, &svc)?;
    let node = node_of(&s, &c)?;
    if sys != layout(&s).gpu_system {
        return host_entries(&s, &sys, &svc)
            .into_iter()
            .find(|e| e["Id"] == json!(id))
            .map_or_else(|| Err(RfError::not_found("LogEntry")), ok);
    }
    let now = s.now();
    let events = {
        let mut m = node.lock();
        s.events_until(node, &mut m, now)
    };
    let e = events
        .iter()
        .find(|e| e.id.to_string() == id)
        .ok_or_else(|| RfError::not_found("LogEntry"))?;
    ok(entry_json(&s, e))
}

// -------------------------------------------------------------------------------------------------------
// Chassis and sensors: the main chassis (the host's, or `1`), the GPU baseboard's when the host is a
// separate system, and one chassis per GPU when the layout has them.

fn chassis_ids(s: &FleetState) -> Vec<String> {
    let l = layout(s);
    let mut ids = vec![l.main_system().to_owned()];
    if l.host_system.is_some() {
        ids.push(l.gpu_system.clone());
    }
    if let Some(t) = &l.gpu_chassis {
        ids.extend((0..s.gpus).map(|g| l.name(t, g)));
    }
    ids
}

/// The GPUs whose sensors chassis `ch` holds (404 for an unknown chassis).
fn chassis_gpus(s: &FleetState, ch: &str) -> Result<Vec<usize>, RfError> {
    if !chassis_ids(s).iter().any(|id| id == ch) {
        return Err(RfError::not_found("Chassis"));
    }
    Ok((0..s.gpus).filter(|&g| sensor_chassis(s, g) == ch).collect())
}

async fn chassis_collection(State(s): State<Arc<FleetState>>) -> RfResult {
    ok(collection(
        "/redfish/v1/Chassis",
        "#ChassisCollection.ChassisCollection",
        "Chassis Collection",
        chassis_ids(&s)
            .into_iter()
            .map(|id| format!("/redfish/v1/Chassis/{id}"))
            .collect(),
    ))
}

async fn chassis(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path(ch): Path<String>,
) -> RfResult {
    let gpus = chassis_gpus(&s, &ch)?;
    let node = node_of(&s, &c)?;
    let l = layout(&s);
    let uri = format!("/redfish/v1/Chassis/{ch}");
    let mut v = if ch == l.main_system() {
        json!({
            "@odata.id": uri,
            "@odata.type": types::CHASSIS,
            "Id": ch,
            "Name": format!("{} chassis", node.name),
            "ChassisType": "RackMount",
            "Manufacturer": "Waveguard",
            "Model": node.labels.sku,
            "PowerState": "On",
            "Status": status_ok(),
            "ThermalSubsystem": link(format!("{uri}/ThermalSubsystem")),
            "Links": {
                "ComputerSystems": [link(system_uri(&ch))],
                "ManagedBy": [link("/redfish/v1/Managers/1")],
            },
        })
    } else if ch == l.gpu_system {
        json!({
            "@odata.id": uri,
            "@odata.type": types::CHASSIS,
            "Id": ch,
            "Name": "HGX Baseboard",
            "ChassisType": "Module",
            "Manufacturer": "NVIDIA",
            "PowerState": "On",
            "Status": status_ok(),
            "Links": {
                "ComputerSystems": [link(system_uri(&ch))],
                "ContainedBy": link(format!("/redfish/v1/Chassis/{}", l.main_system())),
            },
        })
    } else {
        let g = gpus.first().copied().unwrap_or_default();
        let parent = if l.host_system.is_some() {
            &l.gpu_system
        } else {
            l.main_system()
        };
        json!({
            "@odata.id": uri,
            "@odata.type": types::CHASSIS,
            "Id": ch,
            "Name": l.name(&l.gpu_id, g),
            "ChassisType": "Component",
            "Manufacturer": "NVIDIA",
            "PowerState": "On",
            "Status": status_ok(),
            "Links": { "ContainedBy": link(format!("/redfish/v1/Chassis/{parent}")) },
        })
    };
    if !gpus.is_empty() {
        v["Sensors"] = link(format!("{uri}/Sensors"));
    }
    ok(v)
}

async fn thermal_subsystem(State(s): State<Arc<FleetState>>, Path(ch): Path<String>) -> RfResult {
    if ch != layout(&s).main_system() {
        return Err(RfError::not_found("ThermalSubsystem"));
    }
    ok(json!({
        "@odata.id": format!("/redfish/v1/Chassis/{ch}/ThermalSubsystem"),
        "@odata.type": types::THERMAL_SUBSYSTEM,
        "Id": "ThermalSubsystem",
        "Name": "Thermal Subsystem",
        "Status": status_ok(),
        "ThermalMetrics": link(format!("/redfish/v1/Chassis/{ch}/ThermalSubsystem/ThermalMetrics")),
    }))
}

async fn thermal_metrics(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path(ch): Path<String>,
) -> RfResult {
    let l = layout(&s);
    if ch != l.main_system() {
        return Err(RfError::not_found("ThermalMetrics"));
    }
    let node = node_of(&s, &c)?;
    let now = s.now();
    let mut m = node.lock();
    node.settle(&mut m, now);
    let readings: Vec<Value> = (0..s.gpus)
        .map(|g| {
            let (temp, _) = s.gpu_gauges(node, &m, g, now);
            json!({
                "DataSourceUri": format!(
                    "/redfish/v1/Chassis/{}/Sensors/{}",
                    sensor_chassis(&s, g),
                    l.name(&l.temp_sensor, g)
                ),
                "DeviceName": l.name(&l.gpu_id, g),
                "Reading": temp,
            })
        })
        .collect();
    ok(json!({
        "@odata.id": format!("/redfish/v1/Chassis/{ch}/ThermalSubsystem/ThermalMetrics"),
        "@odata.type": types::THERMAL_METRICS,
        "Id": "ThermalMetrics",
        "Name": "Thermal Metrics",
        "TemperatureReadingsCelsius": readings,
    }))
}

/// Which GPU sensor a sensor id is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum GpuSensor {
    Temp,
    MemoryTemp,
    Power,
}

/// How much hotter a GPU's memory reads than the GPU itself (a fixed offset: only its being a
/// different number matters, so a reader that takes it for the GPU's temperature is caught).
const MEMORY_TEMP_OFFSET_C: f64 = 6.0;

fn sensor_ids(s: &FleetState, g: usize) -> Vec<(String, GpuSensor)> {
    let l = layout(s);
    let mut out = vec![(l.name(&l.temp_sensor, g), GpuSensor::Temp)];
    if let Some(t) = &l.memory_temp_sensor {
        out.push((l.name(t, g), GpuSensor::MemoryTemp));
    }
    out.push((l.name(&l.power_sensor, g), GpuSensor::Power));
    out
}

fn sensor_doc(s: &FleetState, node: &Node, ch: &str, g: usize, id: &str, which: GpuSensor) -> Value {
    let now = s.now();
    let (temp, power) = {
        let mut m = node.lock();
        node.settle(&mut m, now);
        s.gpu_gauges(node, &m, g, now)
    };
    let n = g + layout(s).gpu_index_base;
    let (reading, kind, units, context, name) = match which {
        GpuSensor::Temp => (temp, "Temperature", "Cel", "GPU", format!("GPU {n} Temperature")),
        GpuSensor::MemoryTemp => (
            temp + MEMORY_TEMP_OFFSET_C,
            "Temperature",
            "Cel",
            "Memory",
            format!("GPU {n} Memory Temperature"),
        ),
        GpuSensor::Power => (power, "Power", "W", "GPU", format!("GPU {n} Power")),
    };
    json!({
        "@odata.id": format!("/redfish/v1/Chassis/{ch}/Sensors/{id}"),
        "@odata.type": types::SENSOR,
        "Id": id,
        "Name": name,
        "Reading": reading,
        "ReadingType": kind,
        "ReadingUnits": units,
        "ReadingTime": ts(now),
        "PhysicalContext": context,
        "Status": status_ok(),
        "RelatedItem": [link(gpu_uri(s, g))],
    })
}

async fn sensors(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path(ch): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> RfResult {
    let gpus = chassis_gpus(&s, &ch)?;
    if gpus.is_empty() {
        return Err(RfError::not_found("SensorCollection"));
    }
    let uri = format!("/redfish/v1/Chassis/{ch}/Sensors");
    let all: Vec<(usize, String, GpuSensor)> = gpus
        .iter()
        .flat_map(|&g| sensor_ids(&s, g).into_iter().map(move |(id, w)| (g, id, w)))
        .collect();
    let expand = if wants_expand(&s, &query) {
        let node = node_of(&s, &c)?;
        Some(
            all.iter()
                .map(|(g, id, w)| sensor_doc(&s, node, &ch, *g, id, *w))
                .collect(),
        )
    } else {
        None
    };
    ok(collection_of(
        &uri,
        "#SensorCollection.SensorCollection",
        "Sensors",
        all.iter().map(|(_, id, _)| format!("{uri}/{id}")).collect(),
        expand,
    ))
}

async fn sensor(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path((ch, id)): Path<(String, String)>,
) -> RfResult {
    let gpus = chassis_gpus(&s, &ch)?;
    let node = node_of(&s, &c)?;
    let found = gpus.iter().find_map(|&g| {
        sensor_ids(&s, g)
            .into_iter()
            .find(|(sid, _)| *sid == id)
            .map(|(_, w)| (g, w))
    });
    let (g, which) = found.ok_or_else(|| RfError::not_found("Sensor"))?;
    ok(sensor_doc(&s, node, &ch, g, &id, which))
}

// -------------------------------------------------------------------------------------------------------
// Managers.

async fn managers() -> RfResult {
    ok(collection(
        "/redfish/v1/Managers",
        "#ManagerCollection.ManagerCollection",
        "Manager Collection",
        vec!["/redfish/v1/Managers/1".to_owned()],
    ))
}

async fn manager(State(s): State<Arc<FleetState>>, ConnectInfo(c): ConnectInfo<BmcConn>) -> RfResult {
    let node = node_of(&s, &c)?;
    let now = s.now();
    let mut m = node.lock();
    node.settle(&mut m, now);
    let fw = m
        .components
        .iter()
        .find(|c| c.kind == orchestrator_types::ComponentKind::Bmc)
        .map(|c| c.active().to_owned());
    let mut v = json!({
        "@odata.id": "/redfish/v1/Managers/1",
        "@odata.type": types::MANAGER,
        "Id": "1",
        "Name": format!("{} BMC", node.name),
        "ManagerType": "BMC",
        "UUID": uuid_for(s.scenario.seed, node.index, 2),
        "DateTime": ts(now),
        "PowerState": "On",
        "Status": status_ok(),
        "Links": {
            "ManagerForServers": layout(&s).systems().into_iter().map(|id| link(system_uri(id))).collect::<Vec<_>>(),
            "ManagerForChassis": [link(format!("/redfish/v1/Chassis/{}", layout(&s).main_system()))],
        },
        "Actions": {
            "#Manager.Reset": {
                "target": "/redfish/v1/Managers/1/Actions/Manager.Reset",
                "ResetType@Redfish.AllowableValues": ["GracefulRestart", "ForceRestart"],
            }
        },
    });
    if let Some(fw) = fw {
        v["FirmwareVersion"] = json!(fw);
    }
    ok(v)
}

async fn manager_reset(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    body: axum::body::Bytes,
) -> RfResult {
    let node = node_of(&s, &c)?;
    parse_reset(&body, &["GracefulRestart", "ForceRestart"])?;
    let now = s.now();
    let mut m = node.lock();
    update::manager_reset(&s, node, &mut m, now);
    Ok(StatusCode::NO_CONTENT.into_response())
}

// -------------------------------------------------------------------------------------------------------
// UpdateService, FirmwareInventory, tasks.

async fn update_service(State(s): State<Arc<FleetState>>, ConnectInfo(c): ConnectInfo<BmcConn>) -> RfResult {
    let node = node_of(&s, &c)?;
    let profile = &s.scenario.update_service;
    let mut v = json!({
        "@odata.id": "/redfish/v1/UpdateService",
        "@odata.type": types::UPDATE_SERVICE,
        "Id": "UpdateService",
        "Name": "Update Service",
        "ServiceEnabled": true,
        "Status": status_ok(),
        "MaxImageSizeBytes": MAX_IMAGE_BYTES,
        "FirmwareInventory": link("/redfish/v1/UpdateService/FirmwareInventory"),
        "Actions": {},
    });
    if let Some(su) = &profile.simple_update {
        let mut action = json!({ "target": "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate" });
        match su.described_by {
            DescribedBy::Inline => {
                action["TransferProtocol@Redfish.AllowableValues"] = json!(su.transfer_protocols);
                if !su.apply_times.is_empty() {
                    action["@Redfish.OperationApplyTimeSupport"] = json!({
                        "@odata.type": "#Settings.v1_3_5.OperationApplyTimeSupport",
                        "SupportedValues": su.apply_times,
                    });
                }
            }
            DescribedBy::ActionInfo => {
                action["@Redfish.ActionInfo"] = json!("/redfish/v1/UpdateService/SimpleUpdateActionInfo");
            }
        }
        v["Actions"]["#UpdateService.SimpleUpdate"] = action;
    }
    if let Some(mp) = &profile.multipart {
        v["MultipartHttpPushUri"] = json!("/redfish/v1/UpdateService/update-multipart");
        if !mp.apply_times.is_empty() {
            v["MultipartHttpPushUri@Redfish.OperationApplyTimeSupport"] = json!({
                "@odata.type": "#Settings.v1_3_5.OperationApplyTimeSupport",
                "SupportedValues": mp.apply_times,
            });
        }
    }
    let generation = if let Some(hp) = &profile.http_push {
        let m = node.lock();
        v["HttpPushUri"] = json!("/redfish/v1/UpdateService/update");
        v["HttpPushUriOptions"] = json!({
            "HttpPushUriApplyTime": {
                "ApplyTime": if m.http_push.apply_immediate { "Immediate" } else { "OnReset" },
                "ApplyTime@Redfish.AllowableValues": ["Immediate", "OnReset"],
            }
        });
        if hp.targets_settable {
            v["HttpPushUriTargets"] = json!(m.http_push.targets);
            v["HttpPushUriTargetsBusy"] = json!(m.http_push.busy);
        }
        m.http_push.generation
    } else {
        0
    };
    let mut resp = ok(v)?;
    if let Ok(etag) = HeaderValue::from_str(&format!("W/\"{generation}\"")) {
        resp.headers_mut().insert(header::ETAG, etag);
    }
    Ok(resp)
}

async fn simple_update_action_info(State(s): State<Arc<FleetState>>) -> RfResult {
    let su = s
        .scenario
        .update_service
        .simple_update
        .as_ref()
        .filter(|su| su.described_by == DescribedBy::ActionInfo)
        .ok_or_else(|| RfError::not_found("ActionInfo"))?;
    let mut params = vec![
        json!({"Name": "ImageURI", "Required": true, "DataType": "String"}),
        json!({"Name": "TransferProtocol", "Required": su.protocol_required, "DataType": "String",
               "AllowableValues": su.transfer_protocols}),
    ];
    if su.accepts_targets {
        params.push(json!({"Name": "Targets", "Required": false, "DataType": "ObjectArray"}));
    }
    let mut v = json!({
        "@odata.id": "/redfish/v1/UpdateService/SimpleUpdateActionInfo",
        "@odata.type": "#ActionInfo.v1_3_0.ActionInfo",
        "Id": "SimpleUpdateActionInfo",
        "Name": "SimpleUpdate Action Info",
        "Parameters": params,
    });
    if !su.apply_times.is_empty() {
        v["@Redfish.OperationApplyTimeSupport"] = json!({"SupportedValues": su.apply_times});
    }
    ok(v)
}

#[derive(Deserialize)]
struct UpdateServicePatch {
    #[serde(rename = "HttpPushUriTargets", default)]
    targets: Option<Vec<String>>,
    #[serde(rename = "HttpPushUriTargetsBusy", default)]
    busy: Option<bool>,
    #[serde(rename = "HttpPushUriOptions", default)]
    options: Option<Value>,
}

/// PATCH of the UpdateService's `HttpPushUri` settings, conditional on `If-Match` when sent.
async fn patch_update_service(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> RfResult {
    let node = node_of(&s, &c)?;
    let Some(hp) = &s.scenario.update_service.http_push else {
        return Err(RfError::new(
            StatusCode::BAD_REQUEST,
            "Base.1.18.PropertyNotWritable",
            "this UpdateService has no writable properties",
        ));
    };
    let patch: UpdateServicePatch =
        serde_json::from_slice(&body).map_err(|e| RfError::bad_request(format!("PATCH body: {e}")))?;
    let mut m = node.lock();
    if let Some(wanted) = headers.get(header::IF_MATCH).and_then(|v| v.to_str().ok()) {
        let current = format!("W/\"{}\"", m.http_push.generation);
        if wanted.trim() != current && wanted.trim() != "*" {
            return Err(RfError::new(
                StatusCode::PRECONDITION_FAILED,
                "Base.1.18.PreconditionFailed",
                format!("ETag {wanted} does not match the current {current}"),
            ));
        }
    }
    if let Some(targets) = patch.targets {
        if !hp.targets_settable {
            return Err(RfError::new(
                StatusCode::BAD_REQUEST,
                "Base.1.18.PropertyUnknown",
                "HttpPushUriTargets is not a property of this service",
            ));
        }
        update::resolve_targets(&m, &targets).map_err(|e| RfError::bad_request(e.to_string()))?;
        m.http_push.targets = targets;
    }
    if let Some(busy) = patch.busy {
        m.http_push.busy = busy;
    }
    if let Some(apply) = patch
        .options
        .as_ref()
        .and_then(|o| o.pointer("/HttpPushUriApplyTime/ApplyTime"))
        .and_then(Value::as_str)
    {
        m.http_push.apply_immediate = parse_apply_time(Some(apply), &[])?;
    }
    m.http_push.generation += 1;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The raw image POSTed to `HttpPushUri`, applied to the current `HttpPushUriTargets`.
async fn http_push_update(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    body: axum::body::Bytes,
) -> RfResult {
    let node = node_of(&s, &c)?;
    if s.scenario.update_service.http_push.is_none() {
        return Err(RfError::not_found("HttpPushUri"));
    }
    let now = s.now();
    let mut m = node.lock();
    let requested = m.http_push.targets.clone();
    let immediate = m.http_push.apply_immediate;
    let targets = update::resolve_targets(&m, &requested).map_err(|e| RfError::bad_request(e.to_string()))?;
    refuse_concurrent(&mut m, node, now, &targets)?;
    let id = update::create_task(&s, node, &mut m, targets, immediate, Some(Ok(body.to_vec())));
    let task = task_json(&s, node, &mut m, id);
    drop(m);
    task_accepted(&s, id, task.unwrap_or(Value::Null))
}

/// 409 for a second update of components an unfinished update is working on (the way real BMCs
/// refuse it), and for any update while an untargeted one runs.
fn refuse_concurrent(
    m: &mut crate::state::NodeMut,
    node: &Node,
    now: DateTime<Utc>,
    targets: &[usize],
) -> Result<(), RfError> {
    node.settle(m, now);
    let busy = m.tasks.iter().any(|t| {
        let view = t.view(now, &m.components);
        matches!(view.state, "New" | "Running")
            && (t.targets.is_empty() || targets.is_empty() || t.targets.iter().any(|i| targets.contains(i)))
    });
    if busy {
        return Err(RfError::new(
            StatusCode::CONFLICT,
            "Update.1.0.UpdateInProgress",
            "An update is already in progress for these components; try again after it ends.",
        ));
    }
    Ok(())
}

async fn firmware_inventory(State(s): State<Arc<FleetState>>, ConnectInfo(c): ConnectInfo<BmcConn>) -> RfResult {
    let node = node_of(&s, &c)?;
    let m = node.lock();
    ok(collection(
        "/redfish/v1/UpdateService/FirmwareInventory",
        "#SoftwareInventoryCollection.SoftwareInventoryCollection",
        "Firmware Inventory Collection",
        m.components
            .iter()
            .map(|c| format!("/redfish/v1/UpdateService/FirmwareInventory/{}", c.id))
            .collect(),
    ))
}

async fn firmware_entry(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path(id): Path<String>,
) -> RfResult {
    let node = node_of(&s, &c)?;
    let now = s.now();
    let mut m = node.lock();
    node.settle(&mut m, now);
    let comp = m
        .components
        .iter()
        .find(|c| c.id == id)
        .ok_or_else(|| RfError::not_found("SoftwareInventory"))?;
    let mut body = json!({
        "@odata.id": format!("/redfish/v1/UpdateService/FirmwareInventory/{}", comp.id),
        "@odata.type": types::SOFTWARE_INVENTORY,
        "Id": comp.id,
        "Name": format!("{} firmware", comp.id),
        "Version": comp.active(),
        "Updateable": comp.updateable,
        "SoftwareId": format!("{}-{}", comp.kind.as_str(), node.labels.sku),
        "Manufacturer": "Waveguard",
        "Status": status_ok(),
    });
    // Like a real BMC, the property is left out when there is nothing to say.
    if let Some(lowest) = &comp.lowest_supported_version {
        body["LowestSupportedVersion"] = json!(lowest);
    }
    ok(body)
}

#[derive(Deserialize)]
struct SimpleUpdateBody {
    #[serde(rename = "ImageURI")]
    image_uri: String,
    #[serde(rename = "TransferProtocol", default)]
    transfer_protocol: Option<String>,
    #[serde(rename = "Targets", default)]
    targets: Vec<String>,
    #[serde(rename = "@Redfish.OperationApplyTime", default)]
    apply_time: Option<String>,
}

fn parse_apply_time(v: Option<&str>, supported: &[String]) -> Result<bool, RfError> {
    if let Some(wanted) = v
        && !supported.is_empty()
        && !supported.iter().any(|s| s == wanted)
    {
        return Err(RfError::new(
            StatusCode::BAD_REQUEST,
            "Base.1.18.ActionParameterValueNotInList",
            format!(
                "@Redfish.OperationApplyTime '{wanted}' is not supported here ({})",
                supported.join(", ")
            ),
        ));
    }
    match v {
        None | Some("OnReset") => Ok(false),
        Some("Immediate") => Ok(true),
        Some(other) => Err(RfError::new(
            StatusCode::BAD_REQUEST,
            "Base.1.18.PropertyValueNotInList",
            format!("@Redfish.OperationApplyTime '{other}' is not one of Immediate, OnReset"),
        )),
    }
}

/// The answer to an accepted update, as the platform gives it: a DMTF task monitor, the task itself,
/// or 204 with nothing to poll.
fn task_accepted(s: &FleetState, id: u64, body: Value) -> RfResult {
    let location = match s.scenario.update_service.accepted {
        AcceptedAs::NoTask => return Ok(StatusCode::NO_CONTENT.into_response()),
        AcceptedAs::TaskMonitor => format!("/redfish/v1/TaskService/TaskMonitors/{id}"),
        AcceptedAs::Task => format!("/redfish/v1/TaskService/Tasks/{id}"),
    };
    let mut resp = (StatusCode::ACCEPTED, Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(&location) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp.headers_mut()
        .insert("OData-Version", HeaderValue::from_static("4.0"));
    Ok(resp)
}

async fn simple_update(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    body: axum::body::Bytes,
) -> RfResult {
    let node = node_of(&s, &c)?;
    let Some(profile) = &s.scenario.update_service.simple_update else {
        return Err(RfError::not_found("Action"));
    };
    let req: SimpleUpdateBody = serde_json::from_slice(&body)
        .map_err(|e| RfError::bad_request(format!("SimpleUpdate body: {e} (ImageURI is required)")))?;
    if !profile.accepts_targets && !req.targets.is_empty() {
        return Err(RfError::new(
            StatusCode::BAD_REQUEST,
            "Base.1.18.ActionParameterNotSupported",
            "The parameter Targets for the action SimpleUpdate is not supported on the target resource.",
        ));
    }
    if profile.protocol_required && req.transfer_protocol.is_none() {
        return Err(RfError::new(
            StatusCode::BAD_REQUEST,
            "Base.1.18.ActionParameterMissing",
            "The action SimpleUpdate requires the parameter TransferProtocol to be present in the request body.",
        ));
    }
    if let Some(p) = &req.transfer_protocol
        && !matches!(p.as_str(), "HTTP" | "HTTPS")
    {
        return Err(RfError::bad_request(format!(
            "TransferProtocol '{p}' is not supported (HTTP, HTTPS)"
        )));
    }
    let uri = match url_scheme(&req.image_uri) {
        Some("http" | "https") => req.image_uri.clone(),
        Some(other) => {
            return Err(RfError::bad_request(format!(
                "ImageURI scheme '{other}' is not supported"
            )));
        }
        None => {
            // Redfish allows a scheme-less ImageURI with TransferProtocol beside it.
            let scheme = req.transfer_protocol.as_deref().unwrap_or("HTTP").to_ascii_lowercase();
            format!("{scheme}://{}", req.image_uri)
        }
    };
    let immediate = parse_apply_time(req.apply_time.as_deref(), &profile.apply_times)?;
    let (id, body) = {
        let now = s.now();
        let mut m = node.lock();
        let targets = update::resolve_targets(&m, &req.targets).map_err(|e| RfError::bad_request(e.to_string()))?;
        refuse_concurrent(&mut m, node, now, &targets)?;
        let id = update::create_task(&s, node, &mut m, targets, immediate, None);
        (id, task_json(&s, node, &mut m, id))
    };
    update::spawn_fetch(s.clone(), node.index, id, uri);
    task_accepted(&s, id, body.unwrap_or(Value::Null))
}

fn url_scheme(uri: &str) -> Option<&str> {
    uri.split_once("://").map(|(scheme, _)| scheme)
}

async fn multipart_update(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    mut multipart: Multipart,
) -> RfResult {
    let node = node_of(&s, &c)?;
    let Some(profile) = s.scenario.update_service.multipart.clone() else {
        return Err(RfError::not_found("MultipartHttpPushUri"));
    };
    let mut params: Option<Value> = None;
    let mut image: Option<Vec<u8>> = None;
    loop {
        let field = match multipart.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => return Err(RfError::bad_request(format!("malformed multipart body: {e}"))),
        };
        let name = field.name().unwrap_or_default().to_owned();
        let data = field
            .bytes()
            .await
            .map_err(|e| RfError::bad_request(format!("multipart part `{name}`: {e}")))?;
        match name.as_str() {
            "UpdateParameters" => {
                params = Some(
                    serde_json::from_slice(&data)
                        .map_err(|e| RfError::bad_request(format!("UpdateParameters is not JSON: {e}")))?,
                )
            }
            "UpdateFile" => image = Some(data.to_vec()),
            // Unknown parts (OEM parameters) are ignored, as the spec allows.
            _ => {}
        }
    }
    let params = params.ok_or_else(|| RfError::bad_request("missing multipart part `UpdateParameters`"))?;
    let image = image.ok_or_else(|| RfError::bad_request("missing multipart part `UpdateFile`"))?;
    let targets: Vec<String> = match params.get("Targets") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect(),
        Some(_) => {
            return Err(RfError::bad_request(
                "UpdateParameters.Targets must be an array of URIs",
            ));
        }
    };
    let immediate = parse_apply_time(
        params.get("@Redfish.OperationApplyTime").and_then(Value::as_str),
        &profile.apply_times,
    )?;
    let now = s.now();
    let mut m = node.lock();
    let targets = update::resolve_targets(&m, &targets).map_err(|e| RfError::bad_request(e.to_string()))?;
    refuse_concurrent(&mut m, node, now, &targets)?;
    let id = update::create_task(&s, node, &mut m, targets, immediate, Some(Ok(image)));
    let body = task_json(&s, node, &mut m, id);
    drop(m);
    task_accepted(&s, id, body.unwrap_or(Value::Null))
}

async fn task_service(State(s): State<Arc<FleetState>>) -> RfResult {
    ok(json!({
        "@odata.id": "/redfish/v1/TaskService",
        "@odata.type": types::TASK_SERVICE,
        "Id": "TaskService",
        "Name": "Task Service",
        "ServiceEnabled": true,
        "DateTime": ts(s.now()),
        "CompletedTaskOverWritePolicy": "Oldest",
        "LifeCycleEventOnTaskStateChange": false,
        "Status": status_ok(),
        "Tasks": link("/redfish/v1/TaskService/Tasks"),
    }))
}

async fn tasks(State(s): State<Arc<FleetState>>, ConnectInfo(c): ConnectInfo<BmcConn>) -> RfResult {
    let node = node_of(&s, &c)?;
    let m = node.lock();
    ok(collection(
        "/redfish/v1/TaskService/Tasks",
        "#TaskCollection.TaskCollection",
        "Task Collection",
        m.tasks
            .iter()
            .map(|t| format!("/redfish/v1/TaskService/Tasks/{}", t.id))
            .collect(),
    ))
}

fn task_json(s: &FleetState, node: &Node, m: &mut crate::state::NodeMut, id: u64) -> Option<Value> {
    let now = s.now();
    node.settle(m, now);
    let t = m.tasks.iter().find(|t| t.id == id)?;
    let view = t.view(now, &m.components);
    let health = match view.state {
        "Exception" => "Critical",
        _ => "OK",
    };
    let mut messages: Vec<Value> = view
        .messages
        .iter()
        .map(|(mid, text, sev)| {
            json!({
                "MessageId": mid,
                "Message": text,
                "MessageSeverity": sev,
                "Severity": sev,
            })
        })
        .collect();
    if view
        .messages
        .iter()
        .any(|(mid, _, _)| mid.starts_with("Update.1.0.AwaitToActivate"))
    {
        // Base.ResetRequired names the Reset action to POST and the reset type (its MessageArgs),
        // which is what clients such as Ansible's PerformRequestedOperations act on.
        let bmc_target = t
            .targets
            .iter()
            .filter_map(|&i| m.components.get(i))
            .any(|c| c.kind == orchestrator_types::ComponentKind::Bmc);
        let reset = if bmc_target {
            "/redfish/v1/Managers/1/Actions/Manager.Reset".to_owned()
        } else {
            system_reset_uri(s)
        };
        messages.push(json!({
            "MessageId": "Base.1.18.ResetRequired",
            "Message": format!("In order to apply changes, recover from errors, or complete the operation, a component reset is required with the Reset action URI '{reset}' and ResetType 'GracefulRestart'."),
            "MessageArgs": [reset, "GracefulRestart"],
            "MessageSeverity": "Warning",
            "Severity": "Warning",
        }));
    }
    let mut v = json!({
        "@odata.id": format!("/redfish/v1/TaskService/Tasks/{id}"),
        "@odata.type": types::TASK,
        "Id": id.to_string(),
        "Name": format!("Firmware update task {id}"),
        "TaskState": view.state,
        "TaskStatus": health,
        "PercentComplete": view.percent,
        "StartTime": ts(t.created),
        "Messages": messages,
        "TaskMonitor": format!("/redfish/v1/TaskService/TaskMonitors/{id}"),
    });
    if let Some(end) = view.end {
        v["EndTime"] = json!(ts(end));
    }
    Some(v)
}

async fn task(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path(id): Path<String>,
) -> RfResult {
    let node = node_of(&s, &c)?;
    let id: u64 = id.parse().map_err(|_| RfError::not_found("Task"))?;
    let mut m = node.lock();
    let v = task_json(&s, node, &mut m, id).ok_or_else(|| RfError::not_found("Task"))?;
    ok(v)
}

/// The DMTF task monitor: 202 with the task while it runs, then 200 with the finished task. Separate
/// from the Task resource, which always answers 200.
async fn task_monitor(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path(id): Path<String>,
) -> RfResult {
    let node = node_of(&s, &c)?;
    let id: u64 = id.parse().map_err(|_| RfError::not_found("TaskMonitor"))?;
    let mut m = node.lock();
    let v = task_json(&s, node, &mut m, id).ok_or_else(|| RfError::not_found("TaskMonitor"))?;
    let running = matches!(
        v["TaskState"].as_str(),
        Some("New" | "Running" | "Starting" | "Pending")
    );
    let status = if running { StatusCode::ACCEPTED } else { StatusCode::OK };
    let mut resp = (status, Json(v)).into_response();
    resp.headers_mut()
        .insert("OData-Version", HeaderValue::from_static("4.0"));
    if running {
        resp.headers_mut().insert(
            header::LOCATION,
            HeaderValue::from_str(&format!("/redfish/v1/TaskService/TaskMonitors/{id}"))
                .unwrap_or_else(|_| HeaderValue::from_static("/redfish/v1/TaskService")),
        );
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    Ok(resp)
}
