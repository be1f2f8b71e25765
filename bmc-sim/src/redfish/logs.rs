//! Log services and their entries: the GPU event log (XIDs and the like) and the host's logs.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::{ConnectInfo, Path, Query, State};
use serde::Deserialize;
use serde_json::{Value, json};

use super::layout::{gpu_uri, known_system, layout, system_uri, wants_expand};
use super::response::{RfError, RfResult, collection_of, link, node_of, ok, status_ok, ts, types};
use crate::conn::BmcConn;
use crate::platform::XidOrigin;
use crate::rng::{self, Purpose};
use crate::state::{EventKind, FleetState, LogEvent, Node, fault};

pub(super) mod diagnostics;

/// Most log entries returned per page.
const LOG_PAGE: usize = 500;

/// The log services of `sys`: the GPU system has `EventLog` (GPU events); a host system distinct from
/// it has its own `SEL` and `EventLog` with host entries only.
fn log_service_ids(s: &FleetState, sys: &str) -> &'static [&'static str] {
    if sys == layout(s).gpu_system {
        &["EventLog", diagnostics::DUMP]
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

pub(super) async fn log_services(
    State(s): State<Arc<FleetState>>,
    Path(sys): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> RfResult {
    known_system(&s, &sys)?;
    let base = format!("{}/LogServices", system_uri(&sys));
    let ids = log_service_ids(&s, &sys);
    let expand = wants_expand(&s, &query).then(|| ids.iter().map(|svc| log_service_doc(&s, &sys, svc)).collect());
    ok(collection_of(
        &base,
        "#LogServiceCollection.LogServiceCollection",
        "Log Service Collection",
        ids.iter().map(|id| format!("{base}/{id}")).collect(),
        expand,
    ))
}

pub(super) async fn log_service(
    State(s): State<Arc<FleetState>>,
    Path((sys, svc)): Path<(String, String)>,
) -> RfResult {
    known_log(&s, &sys, &svc)?;
    ok(log_service_doc(&s, &sys, &svc))
}

/// A LogService document, as its own GET and an expanded LogServices collection give it.
fn log_service_doc(s: &FleetState, sys: &str, svc: &str) -> Value {
    if svc == diagnostics::DUMP {
        return diagnostics::service(s, sys);
    }
    let uri = format!("{}/LogServices/{svc}", system_uri(sys));
    let gpu_log = sys == layout(s).gpu_system;
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
    } else if layout(s).log_entry_type {
        v["LogEntryType"] = json!("Event");
    }
    v
}

pub(super) fn entry_json(s: &FleetState, e: &LogEvent) -> Value {
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
pub(super) struct Paging {
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

pub(super) async fn log_entries(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path((sys, svc)): Path<(String, String)>,
    Query(paging): Query<Paging>,
) -> RfResult {
    known_log(&s, &sys, &svc)?;
    let node = node_of(&s, &c)?;
    let base = format!("{}/LogServices/{svc}/Entries", system_uri(&sys));
    if svc == diagnostics::DUMP {
        let entries = diagnostics::entries(&s, node);
        return ok(json!({
            "@odata.id": base,
            "@odata.type": "#LogEntryCollection.LogEntryCollection",
            "Name": "Diagnostic Data Entries",
            "Members@odata.count": entries.len(),
            "Members": entries,
        }));
    }
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

pub(super) async fn log_entry(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path((sys, svc, id)): Path<(String, String, String)>,
) -> RfResult {
    known_log(&s, &sys, &svc)?;
    let node = node_of(&s, &c)?;
    if svc == diagnostics::DUMP {
        return diagnostics::entry(&s, node, &id);
    }
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
