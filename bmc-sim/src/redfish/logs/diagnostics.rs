//! `LogService.CollectDiagnosticData` (LogService v1_2_0 on) on the GPU system's `Dump` log service: a
//! POST starts a task; when it completes the task names the new log entry (`Links.CreatedResources`,
//! `Payload.HttpHeaders` `Location`) and the entry's `AdditionalDataURI` serves the archive.
//!
//! The data lives in its own log service, as bmcweb's `Dump` does, so the GPU event log that health
//! readers count holds only events. The archive is a ustar file built when the request arrives (what a
//! BMC would have collected then) and served unchanged, so downloads are byte-for-byte repeatable.
//! `UserName`/`Password` are accepted as the schema defines them and dropped unread: they would only
//! matter with `TargetURI`, which this service refuses, and a secret must never reach an archive, a
//! task or an error message.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Json;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Duration, Utc};
use serde_json::{Value, json};

use crate::conn::BmcConn;
use crate::redfish::layout::{layout, system_uri};
use crate::redfish::response::{RfError, RfResult, link, node_of, ok, status_ok, ts, types};
use crate::rng::{self, Purpose};
use crate::state::{DiagRecord, FleetState, Node, TaskPhase, TaskRec};

/// The log service that holds collected diagnostic data.
pub(in crate::redfish) const DUMP: &str = "Dump";
const ACTION: &str = "LogService.CollectDiagnosticData";
/// The `DiagnosticDataType`s this service collects (the schema also has `PreOS` and `OS`, which need a
/// host agent the simulator does not have).
const ALLOWED: [&str; 2] = ["Manager", "OEM"];
/// Parameters the schema defines for the action; anything else is refused by name.
const KNOWN_PARAMS: [&str; 6] = [
    "DiagnosticDataType",
    "OEMDiagnosticDataType",
    "TargetURI",
    "UserName",
    "Password",
    "TransferProtocol",
];
/// Event-log entries copied into an archive, newest last.
const ARCHIVE_LOG_ENTRIES: usize = 500;

fn dump_uri(sys: &str) -> String {
    format!("{}/LogServices/{DUMP}", system_uri(sys))
}

fn entry_uri(s: &FleetState, id: u64) -> String {
    format!("{}/Entries/{id}", dump_uri(&layout(s).gpu_system))
}

/// The `Dump` service document.
pub(in crate::redfish) fn service(s: &FleetState, sys: &str) -> Value {
    let uri = dump_uri(sys);
    json!({
        "@odata.id": uri,
        "@odata.type": types::LOG_SERVICE,
        "Id": DUMP,
        "Name": "Diagnostic Data",
        "Description": "Diagnostic data collected with LogService.CollectDiagnosticData",
        "ServiceEnabled": true,
        "OverWritePolicy": "WrapsWhenFull",
        "LogEntryType": "Event",
        "DateTime": ts(s.now()),
        "Status": status_ok(),
        "Entries": link(format!("{uri}/Entries")),
        "Actions": {
            format!("#{ACTION}"): {
                "target": format!("{uri}/Actions/{ACTION}"),
                "DiagnosticDataType@Redfish.AllowableValues": ALLOWED,
            }
        },
    })
}

fn entry_json(s: &FleetState, d: &DiagRecord) -> Value {
    let uri = entry_uri(s, d.id);
    let mut v = json!({
        "@odata.id": uri,
        "@odata.type": types::LOG_ENTRY,
        "Id": d.id.to_string(),
        "Name": format!("Diagnostic Data {}", d.id),
        "EntryType": "Event",
        "Created": ts(d.done),
        "Severity": "OK",
        "Message": format!("{} diagnostic data collected.", d.kind),
        "DiagnosticDataType": d.kind,
        "AdditionalDataURI": format!("{uri}/attachment"),
        "AdditionalDataSizeBytes": d.archive.len(),
    });
    if let Some(oem) = &d.oem_kind {
        v["OEMDiagnosticDataType"] = json!(oem);
    }
    v
}

/// The finished collections of `node` at `now`, as log entries.
pub(in crate::redfish) fn entries(s: &FleetState, node: &Node) -> Vec<Value> {
    let now = s.now();
    let m = node.lock();
    m.diagnostics
        .iter()
        .filter(|d| d.done <= now)
        .map(|d| entry_json(s, d))
        .collect()
}

fn finished(s: &FleetState, node: &Node, id: &str) -> Result<DiagRecord, RfError> {
    let now = s.now();
    let m = node.lock();
    m.diagnostics
        .iter()
        .find(|d| d.id.to_string() == id && d.done <= now)
        .cloned()
        .ok_or_else(|| RfError::not_found("LogEntry"))
}

pub(in crate::redfish) fn entry(s: &FleetState, node: &Node, id: &str) -> RfResult {
    ok(entry_json(s, &finished(s, node, id)?))
}

pub(in crate::redfish) async fn attachment(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path((sys, svc, id)): Path<(String, String, String)>,
) -> Result<Response, RfError> {
    if sys != layout(&s).gpu_system || svc != DUMP {
        return Err(RfError::not_found("LogEntry"));
    }
    let node = node_of(&s, &c)?;
    let d = finished(&s, node, &id)?;
    let mut resp = d.archive.as_ref().clone().into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-tar"));
    if let Ok(v) = HeaderValue::from_str(&format!(
        "attachment; filename=\"diagnostics-{}-{}.tar\"",
        node.name, d.id
    )) {
        resp.headers_mut().insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(resp)
}

fn param_error(message_id: &'static str, message: impl Into<String>) -> RfError {
    RfError::new(StatusCode::BAD_REQUEST, message_id, message)
}

/// The accepted request: the data type and the OEM subtype. Errors name parameters, never values,
/// except `DiagnosticDataType`, which is checked against a fixed list before it is echoed.
fn parse_request(body: &[u8]) -> Result<(&'static str, Option<String>), RfError> {
    let v: Value = serde_json::from_slice(body).map_err(|_| {
        param_error(
            "Base.1.18.MalformedJSON",
            "The request body must be a JSON object of the action's parameters.",
        )
    })?;
    let obj = v.as_object().ok_or_else(|| {
        param_error(
            "Base.1.18.MalformedJSON",
            "The request body must be a JSON object of the action's parameters.",
        )
    })?;
    if let Some(unknown) = obj.keys().find(|k| !KNOWN_PARAMS.contains(&k.as_str())) {
        return Err(param_error(
            "Base.1.18.ActionParameterUnknown",
            format!("The action {ACTION} was submitted with the invalid parameter {unknown}."),
        ));
    }
    if obj.contains_key("TargetURI") || obj.contains_key("TransferProtocol") {
        return Err(param_error(
            "Base.1.18.ActionParameterNotSupported",
            format!(
                "The parameter TargetURI for the action {ACTION} is not supported on the target resource: the data stays on the service, behind the entry's AdditionalDataURI."
            ),
        ));
    }
    for secret in ["UserName", "Password"] {
        if obj.get(secret).is_some_and(|v| !v.is_string()) {
            return Err(param_error(
                "Base.1.18.ActionParameterValueTypeError",
                format!(
                    "The value for the parameter {secret} in the action {ACTION} is of a different type than the parameter can accept."
                ),
            ));
        }
    }
    let kind = match obj.get("DiagnosticDataType") {
        None => {
            return Err(param_error(
                "Base.1.18.ActionParameterMissing",
                format!("The action {ACTION} requires the parameter DiagnosticDataType to be present in the request body."),
            ));
        }
        Some(Value::String(k)) => ALLOWED.into_iter().find(|a| a == k).ok_or_else(|| {
            let shown: String = k.chars().filter(char::is_ascii_alphanumeric).take(32).collect();
            param_error(
                "Base.1.18.ActionParameterValueNotInList",
                format!(
                    "The value '{shown}' for the parameter DiagnosticDataType in the action {ACTION} is not in the list of acceptable values ({}).",
                    ALLOWED.join(", ")
                ),
            )
        })?,
        Some(_) => {
            return Err(param_error(
                "Base.1.18.ActionParameterValueTypeError",
                format!("The value for the parameter DiagnosticDataType in the action {ACTION} is of a different type than the parameter can accept."),
            ));
        }
    };
    let oem = match obj.get("OEMDiagnosticDataType") {
        None => None,
        Some(Value::String(o)) if kind == "OEM" && !o.trim().is_empty() => Some(o.clone()),
        Some(Value::String(_)) if kind == "OEM" => None,
        Some(_) => {
            return Err(param_error(
                "Base.1.18.ActionParameterValueError",
                format!(
                    "The parameter OEMDiagnosticDataType of the action {ACTION} needs DiagnosticDataType OEM and a string."
                ),
            ));
        }
    };
    // An OEM collection on an NVIDIA system is what the vendor's RMA process asks for.
    let oem = (kind == "OEM").then(|| oem.unwrap_or_else(|| "nvidia-bug-report".to_owned()));
    Ok((kind, oem))
}

pub(in crate::redfish) async fn collect(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path((sys, svc)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> RfResult {
    if sys != layout(&s).gpu_system || svc != DUMP {
        return Err(RfError::not_found("Action"));
    }
    let node = node_of(&s, &c)?;
    let (kind, oem) = parse_request(&body)?;
    let now = s.now();
    // Read before the node lock: the exporter takes it itself.
    let dcgm = crate::dcgm::render_one(&s, node);
    let mut m = node.lock();
    node.settle(&mut m, now);
    let task = m.tasks.last().map_or(1, |t| t.id + 1);
    let id = m.diagnostics.last().map_or(1, |d| d.id + 1);
    let u = rng::unit(s.scenario.seed, node.index as u64, Purpose::Diagnostics, task, 0);
    // Real collections take from tens of seconds (a BMC log bundle) to minutes (nvidia-bug-report).
    let done = now + Duration::seconds(30 + (u * 60.0) as i64);
    let archive = build_archive(&s, node, &mut m, now, kind, oem.as_deref(), dcgm.as_deref());
    let entry = entry_uri(&s, id);
    let mut json_body = json!({ "DiagnosticDataType": kind });
    if let Some(o) = &oem {
        json_body["OEMDiagnosticDataType"] = json!(o);
    }
    m.diagnostics.push(DiagRecord {
        id,
        kind,
        oem_kind: oem,
        done,
        archive: Arc::new(archive),
    });
    m.tasks.push(TaskRec {
        id: task,
        created: now,
        targets: Vec::new(),
        immediate: false,
        phase: TaskPhase::Collecting {
            end: done,
            entry,
            target: format!("{}/Actions/{ACTION}", dump_uri(&sys)),
            json_body: json_body.to_string(),
        },
        applied: true,
        activate_delay: Duration::zero(),
    });
    let body = crate::redfish::tasks::task_json(&s, node, &mut m, task).unwrap_or_else(|| json!({}));
    let monitor = format!("/redfish/v1/TaskService/TaskMonitors/{task}");
    let mut resp = (StatusCode::ACCEPTED, Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(&monitor) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp.headers_mut()
        .insert("OData-Version", HeaderValue::from_static("4.0"));
    Ok(resp)
}

/// What was collected: the node's inventory (parts, firmware), its GPU event log and its exporter's
/// metrics at `now`, as text files in a ustar archive.
fn build_archive(
    s: &FleetState,
    node: &Node,
    m: &mut crate::state::NodeMut,
    now: DateTime<Utc>,
    kind: &str,
    oem: Option<&str>,
    dcgm: Option<&str>,
) -> Vec<u8> {
    let l = layout(s);
    let mut inventory = String::new();
    let _ = writeln!(inventory, "node: {}", node.name);
    let _ = writeln!(inventory, "sku: {}", node.labels.sku);
    let _ = writeln!(inventory, "rack: {}", node.labels.rack);
    let _ = writeln!(inventory, "collected: {}", ts(now));
    let _ = writeln!(inventory, "diagnostic_data_type: {kind}");
    if let Some(o) = oem {
        let _ = writeln!(inventory, "oem_diagnostic_data_type: {o}");
    }
    let _ = writeln!(inventory, "\n[gpus]\nslot,serial,part_number,production_date,state");
    for g in 0..s.gpus {
        let state = match s.failure_at(m, g, now) {
            Some(f) => format!("failed:{}@{}", f.mode.as_str(), ts(f.onset)),
            None => "ok".to_owned(),
        };
        if let Some(p) = s.current_part(&node.name, m, g, now) {
            let _ = writeln!(
                inventory,
                "{},{},{},{},{state}",
                l.name(&l.gpu_id, g),
                p.serial,
                p.part_number,
                p.production_date
            );
        }
    }
    let _ = writeln!(inventory, "\n[firmware]\nid,kind,active,pending");
    for c in &m.components {
        let pending = c.pending.as_ref().map_or("", |p| p.version.as_str());
        let _ = writeln!(inventory, "{},{},{},{pending}", c.id, c.kind.as_str(), c.active());
    }
    let events = s.events_until(node, m, now);
    let mut log = String::new();
    let skip = events.len().saturating_sub(ARCHIVE_LOG_ENTRIES);
    for e in &events[skip..] {
        let v = super::entry_json(s, e);
        let _ = writeln!(
            log,
            "{} {} {} {}",
            v["Created"].as_str().unwrap_or_default(),
            e.id,
            v["Severity"].as_str().unwrap_or_default(),
            v["Message"].as_str().unwrap_or_default()
        );
    }
    let mtime = now.timestamp().max(0) as u64;
    let mut tar = Vec::new();
    let files: [(&str, &str); 3] = [
        ("inventory.txt", &inventory),
        ("eventlog.txt", &log),
        (
            "dcgm-metrics.txt",
            dcgm.unwrap_or("# exporter down at collection time\n"),
        ),
    ];
    for (name, body) in files {
        tar_file(
            &mut tar,
            &format!("diagnostics-{}/{name}", node.name),
            body.as_bytes(),
            mtime,
        );
    }
    // Two zero blocks end a tar archive.
    tar.extend_from_slice(&[0u8; 1024]);
    tar
}

/// Appends one regular file in ustar format (POSIX.1-1988), owner root, mode 0644.
fn tar_file(out: &mut Vec<u8>, name: &str, data: &[u8], mtime: u64) {
    let mut h = [0u8; 512];
    let put = |h: &mut [u8; 512], at: usize, bytes: &[u8]| {
        h[at..at + bytes.len()].copy_from_slice(bytes);
    };
    put(&mut h, 0, &name.as_bytes()[..name.len().min(100)]);
    put(&mut h, 100, b"0000644\0");
    put(&mut h, 108, b"0000000\0");
    put(&mut h, 116, b"0000000\0");
    put(&mut h, 124, format!("{:011o}\0", data.len()).as_bytes());
    put(&mut h, 136, format!("{mtime:011o}\0").as_bytes());
    put(&mut h, 148, b"        ");
    h[156] = b'0';
    put(&mut h, 257, b"ustar\0");
    put(&mut h, 263, b"00");
    put(&mut h, 265, b"root");
    put(&mut h, 297, b"root");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    put(&mut h, 148, format!("{sum:06o}\0 ").as_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked_without_echoing_secrets() {
        let ok = parse_request(br#"{"DiagnosticDataType":"Manager","UserName":"u","Password":"hunter2"}"#);
        assert_eq!(ok.ok(), Some(("Manager", None)));
        let oem = parse_request(br#"{"DiagnosticDataType":"OEM"}"#);
        assert_eq!(oem.ok(), Some(("OEM", Some("nvidia-bug-report".to_owned()))));
        for bad in [
            br#"{"DiagnosticDataType":"OS","Password":"hunter2"}"#.as_slice(),
            br#"{"DiagnosticDataType":"Manager","Password":12345}"#,
            br#"{"DiagnosticDataType":"Manager","TargetURI":"ftp://x","Password":"hunter2"}"#,
            br#"{"Password":"hunter2"}"#,
            b"hunter2",
        ] {
            let e = parse_request(bad).expect_err("refused");
            assert!(
                !e.message.contains("hunter2") && !e.message.contains("12345"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn tar_headers_checksum() {
        let mut out = Vec::new();
        tar_file(&mut out, "a/b.txt", b"hello", 0);
        assert_eq!(out.len(), 1024);
        let mut h = out[..512].to_vec();
        let stored = u32::from_str_radix(std::str::from_utf8(&h[148..154]).unwrap(), 8).unwrap();
        h[148..156].copy_from_slice(b"        ");
        assert_eq!(stored, h.iter().map(|&b| u32::from(b)).sum::<u32>());
    }
}
