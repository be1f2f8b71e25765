//! The Redfish service every simulated BMC exposes.
//!
//! One axum `Router` serves all BMCs; the accepted connection says which BMC it reached (see
//! [`crate::conn::BmcConn`]). Resource shapes follow the DMTF CSDL (versions in [`response::types`]); the
//! service is checked with DMTF's redfish-service-validator in `tests/validator.rs`.
//!
//! This module holds the route table and the gate every request passes (faults, then authentication);
//! one submodule per resource family serves the rest, on the shared `response` and `layout` helpers,
//! under the DSP0266 rules of `protocol`.

mod accounts;
mod chassis;
mod layout;
mod logs;
mod managers;
mod protocol;
mod response;
mod root;
mod sessions;
mod systems;
mod tasks;
mod update_service;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;

use self::chassis::{chassis, chassis_collection, sensor, sensors, thermal_metrics, thermal_subsystem};
use self::layout::layout;
use self::logs::{log_entries, log_entry, log_service, log_services};
use self::managers::{manager, manager_reset, managers};
use self::response::RfError;
use self::root::{metadata, odata, redfish_versions, service_root};
use self::sessions::{create_session, delete_session, session, session_service, sessions};
use self::systems::{processor, processor_assembly, processor_metrics, processors, system, system_reset, systems};
use self::tasks::{task, task_monitor, task_service, tasks};
use self::update_service::{
    firmware_entry, firmware_inventory, http_push_update, multipart_update, patch_update_service, simple_update,
    simple_update_action_info, update_service,
};
use crate::conn::BmcConn;
use crate::rng::{self, Purpose};
use crate::state::{FleetState, Node, fault};
use crate::update::MAX_IMAGE_BYTES;

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
        .route(
            "/redfish/v1/Systems/{sys}/Processors/{id}/Assembly",
            get(processor_assembly),
        )
        .route("/redfish/v1/Systems/{sys}/LogServices", get(log_services))
        .route("/redfish/v1/Systems/{sys}/LogServices/{svc}", get(log_service))
        .route("/redfish/v1/Systems/{sys}/LogServices/{svc}/Entries", get(log_entries))
        .route(
            "/redfish/v1/Systems/{sys}/LogServices/{svc}/Entries/{id}",
            get(log_entry),
        )
        .route(
            "/redfish/v1/Systems/{sys}/LogServices/{svc}/Entries/{id}/attachment",
            get(logs::diagnostics::attachment),
        )
        .route(
            "/redfish/v1/Systems/{sys}/LogServices/{svc}/Actions/LogService.CollectDiagnosticData",
            post(logs::diagnostics::collect),
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
    let routes = v1.merge(accounts::routes()).with_state(state.clone());
    // Authentication and faults first (outermost), then the protocol rules, then the resource.
    routes
        .clone()
        .layer(middleware::from_fn_with_state(
            protocol::Protocol::new(routes, layout(&state).expand_query),
            protocol::layer,
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
        // "Session lifetime"); each authenticated request restarts its clock. Real BMCs count it in
        // real time, and so does the session clock unless a test hands its own.
        let now = s.session_now();
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
pub(super) struct Unauthorized(RfError);
