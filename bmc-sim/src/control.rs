//! The control server: test hooks under `/sim/...` and fleet-wide Prometheus exposition at `/metrics`.
//!
//! | Method + path                           | What                                                            |
//! |-----------------------------------------|-----------------------------------------------------------------|
//! | `GET /sim/nodes`                        | every node: url, labels, versions, flash counts, faults, status |
//! | `GET /sim/nodes/{name}`                 | one node                                                        |
//! | `GET /sim/versions`                     | `{node: [{id, kind, active, pending}]}`                         |
//! | `GET /sim/flash-counts`                 | `{node: {version: flashes started}}` (nodes with flashes only)  |
//! | `PUT /sim/nodes/{name}/faults`          | body `{"brick":b,"unavailable":b,"timeout":b,"malformed":b,"looping_next_link":b}` |
//! | `DELETE /sim/nodes/{name}/faults`       | clear injected faults                                           |
//! | `POST /sim/nodes/{name}/expire-sessions`| drop every session (clients must log in again)                  |
//! | `GET /sim/clock`                        | `{"now": RFC 3339 simulated time}`                              |
//! | `GET /metrics`                          | Prometheus text format, labelled by node (and gpu)              |
//! | `GET /sim/dcgm/metrics`, `/sim/dcgm/{name}/metrics`, `POST /sim/nodes/{name}/dcgm` | simulated dcgm-exporters ([`crate::dcgm`]) |
//! | `GET /sim/parts-manifest`               | every GPU part ever installed as a parts manifest (CSV)          |
//! | `GET /sim/hardware-failures[?all=true]` | hardware failures begun by now (`all`: also those to come), JSON |
//! | `POST /sim/nodes/{name}/gpus/{gpu}/replace` | a new part (spare lot) in GPU `gpu` (0-based); answers the part |

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use orchestrator_types::ComponentKind;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::state::{EventKind, FleetState, Node, fault};

pub(crate) fn router(state: Arc<FleetState>) -> Router {
    Router::new()
        .route("/sim/nodes", get(nodes))
        .route("/sim/nodes/{name}", get(node))
        .route(
            "/sim/nodes/{name}/faults",
            get(get_faults).put(set_faults).post(set_faults).delete(clear_faults),
        )
        .route("/sim/nodes/{name}/expire-sessions", post(expire_sessions))
        .route("/sim/versions", get(versions))
        .route("/sim/flash-counts", get(flash_counts))
        .route("/sim/clock", get(clock))
        .route("/sim/clock/skip", post(skip_clock))
        .route("/metrics", get(metrics))
        .route("/sim/dcgm/metrics", get(crate::dcgm::all_metrics))
        .route("/sim/dcgm/{name}/metrics", get(crate::dcgm::node_metrics))
        .route("/sim/nodes/{name}/dcgm", post(crate::dcgm::control))
        .route("/sim/parts-manifest", get(parts_manifest))
        .route("/sim/hardware-failures", get(hardware_failures))
        .route("/sim/nodes/{name}/gpus/{gpu}/replace", post(replace_gpu))
        .with_state(state)
}

fn not_found(name: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({"error": format!("no node named `{name}`")})),
    )
        .into_response()
}

/// Versions of one firmware component on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ComponentVersions {
    /// FirmwareInventory id.
    pub id: String,
    /// Component kind.
    pub kind: ComponentKind,
    /// Version running now.
    pub active: String,
    /// Version flashed and waiting for its reset, if any.
    pub pending: Option<String>,
}

pub(crate) fn versions_of(s: &FleetState, n: &Node) -> Vec<ComponentVersions> {
    let mut m = n.lock();
    n.settle(&mut m, s.now());
    m.components
        .iter()
        .map(|c| ComponentVersions {
            id: c.id.clone(),
            kind: c.kind,
            active: c.active().to_owned(),
            pending: c.pending.as_ref().map(|p| p.version.clone()),
        })
        .collect()
}

/// Injected faults of one node.
#[derive(Debug, Default, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct InjectedFaults {
    /// The BMC stops answering (connections closed) until cleared.
    pub brick: bool,
    /// Every request is answered 503 with `Retry-After`.
    pub unavailable: bool,
    /// Every request hangs (see `FleetOptions::hang_for`).
    pub timeout: bool,
    /// Every response body is cut mid-JSON.
    pub malformed: bool,
    /// The event log's `Members@odata.nextLink` names the same page on every page.
    pub looping_next_link: bool,
}

impl InjectedFaults {
    fn from_bits(b: u8) -> Self {
        Self {
            brick: b & fault::BRICK != 0,
            unavailable: b & fault::UNAVAILABLE != 0,
            timeout: b & fault::TIMEOUT != 0,
            malformed: b & fault::MALFORMED != 0,
            looping_next_link: b & fault::LOOPING_NEXT_LINK != 0,
        }
    }
    fn bits(self) -> u8 {
        (if self.brick { fault::BRICK } else { 0 })
            | (if self.unavailable { fault::UNAVAILABLE } else { 0 })
            | (if self.timeout { fault::TIMEOUT } else { 0 })
            | (if self.malformed { fault::MALFORMED } else { 0 })
            | (if self.looping_next_link {
                fault::LOOPING_NEXT_LINK
            } else {
                0
            })
    }
}

fn node_json(s: &FleetState, n: &Node) -> Value {
    let now_ms = s.now().timestamp_millis();
    let versions = versions_of(s, n);
    let flash_counts = n.lock().flash_counts.clone();
    json!({
        "name": n.name,
        "bmc_url": n.bmc_url(),
        "labels": n.labels,
        "components": versions,
        "flash_counts": flash_counts,
        "faults": InjectedFaults::from_bits(n.injected.load(Ordering::Relaxed)),
        "answering": !n.is_down(now_ms),
        "bricked": n.is_bricked(),
        "event_log_pages": n.event_log_pages.load(Ordering::Relaxed),
    })
}

async fn nodes(State(s): State<Arc<FleetState>>) -> Json<Value> {
    Json(Value::Array(s.nodes.iter().map(|n| node_json(&s, n)).collect()))
}

async fn node(State(s): State<Arc<FleetState>>, Path(name): Path<String>) -> Response {
    match s.node_by_name(&name) {
        Some(n) => Json(node_json(&s, n)).into_response(),
        None => not_found(&name),
    }
}

async fn get_faults(State(s): State<Arc<FleetState>>, Path(name): Path<String>) -> Response {
    match s.node_by_name(&name) {
        Some(n) => Json(InjectedFaults::from_bits(n.injected.load(Ordering::Relaxed))).into_response(),
        None => not_found(&name),
    }
}

async fn set_faults(State(s): State<Arc<FleetState>>, Path(name): Path<String>, body: axum::body::Bytes) -> Response {
    let Some(n) = s.node_by_name(&name) else {
        return not_found(&name);
    };
    let faults: InjectedFaults = match serde_json::from_slice(&body) {
        Ok(f) => f,
        Err(e) => return (StatusCode::BAD_REQUEST, Json(json!({"error": e.to_string()}))).into_response(),
    };
    n.injected.store(faults.bits(), Ordering::Relaxed);
    Json(faults).into_response()
}

async fn clear_faults(State(s): State<Arc<FleetState>>, Path(name): Path<String>) -> Response {
    let Some(n) = s.node_by_name(&name) else {
        return not_found(&name);
    };
    n.injected.store(0, Ordering::Relaxed);
    StatusCode::NO_CONTENT.into_response()
}

async fn expire_sessions(State(s): State<Arc<FleetState>>, Path(name): Path<String>) -> Response {
    let Some(n) = s.node_by_name(&name) else {
        return not_found(&name);
    };
    n.lock().sessions.clear();
    StatusCode::NO_CONTENT.into_response()
}

async fn versions(State(s): State<Arc<FleetState>>) -> Json<BTreeMap<String, Vec<ComponentVersions>>> {
    Json(s.nodes.iter().map(|n| (n.name.clone(), versions_of(&s, n))).collect())
}

async fn flash_counts(State(s): State<Arc<FleetState>>) -> Json<BTreeMap<String, BTreeMap<String, u32>>> {
    Json(
        s.nodes
            .iter()
            .filter_map(|n| {
                let counts = n.lock().flash_counts.clone();
                (!counts.is_empty()).then(|| (n.name.clone(), counts))
            })
            .collect(),
    )
}

async fn parts_manifest(State(s): State<Arc<FleetState>>) -> Response {
    let mut resp = crate::state::hardware::manifest_csv(&s.all_parts()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/csv; charset=utf-8"),
    );
    resp
}

#[derive(Debug, Deserialize)]
struct FailuresQuery {
    #[serde(default)]
    all: bool,
}

async fn hardware_failures(
    State(s): State<Arc<FleetState>>,
    Query(q): Query<FailuresQuery>,
) -> Json<Vec<crate::state::hardware::HardwareFailure>> {
    Json(s.failures(if q.all { None } else { Some(s.now()) }))
}

async fn replace_gpu(State(s): State<Arc<FleetState>>, Path((name, gpu)): Path<(String, usize)>) -> Response {
    match s.replace_gpu(&name, gpu) {
        Ok(part) => Json(part).into_response(),
        Err(e @ crate::state::hardware::ReplaceError::SerialsExhausted) => {
            (StatusCode::CONFLICT, Json(json!({"error": e.to_string()}))).into_response()
        }
        Err(e) => (StatusCode::NOT_FOUND, Json(json!({"error": e.to_string()}))).into_response(),
    }
}

/// `{"to": RFC 3339}`: jumps simulated time forward (never back), as the controller's own clock did.
async fn skip_clock(State(s): State<Arc<FleetState>>, Json(body): Json<Value>) -> Response {
    let Some(clock) = &s.skips else {
        return (
            StatusCode::CONFLICT,
            "this fleet's clock is not controlled here (start bmc-sim with --clock-epoch)",
        )
            .into_response();
    };
    let Some(to) = body
        .get("to")
        .and_then(Value::as_str)
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
    else {
        return (StatusCode::BAD_REQUEST, "expected {\"to\": an RFC 3339 time}").into_response();
    };
    clock.skip_to(to.with_timezone(&chrono::Utc));
    Json(json!({ "now": s.now().to_rfc3339() })).into_response()
}

async fn clock(State(s): State<Arc<FleetState>>) -> Json<Value> {
    Json(json!({ "now": s.now().to_rfc3339(), "epoch": s.epoch.to_rfc3339() }))
}

/// Renders the whole fleet; runs on a blocking thread because 10,000 nodes is a few MB of text.
async fn metrics(State(s): State<Arc<FleetState>>) -> Response {
    let text = match tokio::task::spawn_blocking(move || render_metrics(&s)).await {
        Ok(t) => t,
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    };
    let mut resp = text.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

pub(crate) fn render_metrics(s: &FleetState) -> String {
    let now = s.now();
    let now_ms = now.timestamp_millis();
    let mut temp = String::new();
    let mut power = String::new();
    let mut xid = String::new();
    let mut aer = String::new();
    let mut link = String::new();
    let mut up = String::new();
    let mut fw = String::new();
    let mut flashes = String::new();
    for n in &s.nodes {
        let node = label(&n.name);
        let mut m = n.lock();
        n.settle(&mut m, now);
        let events = s.events_until(n, &mut m, now);
        let mut xid_by_gpu = vec![0u64; s.gpus];
        let (mut aer_c, mut aer_u, mut links) = (0u64, 0u64, 0u64);
        for e in &events {
            match e.kind {
                EventKind::Xid { gpu, .. } => {
                    if let Some(c) = xid_by_gpu.get_mut(gpu as usize) {
                        *c += 1;
                    }
                }
                EventKind::Aer { correctable: true } => aer_c += 1,
                EventKind::Aer { correctable: false } => aer_u += 1,
                EventKind::LinkDegraded { .. } => links += 1,
            }
        }
        for (g, count) in xid_by_gpu.iter().enumerate() {
            let (t, p) = s.gpu_gauges(n, &m, g, now);
            let _ = writeln!(
                temp,
                "bmcsim_gpu_temperature_celsius{{node=\"{node}\",gpu=\"GPU_{g}\"}} {t}"
            );
            let _ = writeln!(power, "bmcsim_gpu_power_watts{{node=\"{node}\",gpu=\"GPU_{g}\"}} {p}");
            let _ = writeln!(
                xid,
                "bmcsim_gpu_xid_errors_total{{node=\"{node}\",gpu=\"GPU_{g}\"}} {count}"
            );
        }
        let _ = writeln!(
            aer,
            "bmcsim_pcie_aer_errors_total{{node=\"{node}\",severity=\"correctable\"}} {aer_c}"
        );
        let _ = writeln!(
            aer,
            "bmcsim_pcie_aer_errors_total{{node=\"{node}\",severity=\"uncorrectable\"}} {aer_u}"
        );
        let _ = writeln!(link, "bmcsim_link_degraded_events_total{{node=\"{node}\"}} {links}");
        let _ = writeln!(up, "bmcsim_bmc_up{{node=\"{node}\"}} {}", u8::from(!n.is_down(now_ms)));
        for c in &m.components {
            let _ = writeln!(
                fw,
                "bmcsim_firmware_info{{node=\"{node}\",component=\"{}\",kind=\"{}\",version=\"{}\"}} 1",
                label(&c.id),
                c.kind.as_str(),
                label(c.active())
            );
        }
        let _ = writeln!(flashes, "bmcsim_flashes_total{{node=\"{node}\"}} {}", m.flashes);
    }
    let mut out = String::with_capacity(temp.len() * 4 + fw.len() + 4096);
    let sections = [
        ("bmcsim_gpu_temperature_celsius", "gauge", "GPU temperature.", temp),
        ("bmcsim_gpu_power_watts", "gauge", "GPU power draw.", power),
        (
            "bmcsim_gpu_xid_errors_total",
            "counter",
            "XID-style GPU errors logged.",
            xid,
        ),
        (
            "bmcsim_pcie_aer_errors_total",
            "counter",
            "PCIe AER errors logged.",
            aer,
        ),
        (
            "bmcsim_link_degraded_events_total",
            "counter",
            "Link width/speed degradation events logged.",
            link,
        ),
        (
            "bmcsim_bmc_up",
            "gauge",
            "1 if the BMC answers, 0 while resetting or bricked.",
            up,
        ),
        (
            "bmcsim_firmware_info",
            "gauge",
            "Active firmware version per component.",
            fw,
        ),
        ("bmcsim_flashes_total", "counter", "Firmware flashes started.", flashes),
    ];
    for (name, kind, help, body) in sections {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        out.push_str(&body);
    }
    out
}
