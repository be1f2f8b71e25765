//! Systems and processors. Ids and names come from the platform's `RedfishLayout`: bmc-sim's own single
//! system `1`, or a DGX-style host system listed first with the GPUs under a baseboard system.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};

use super::layout::{gpu_index, gpu_uri, known_system, layout, system_uri, uuid_for, wants_expand};
use super::response::{RfError, RfResult, collection_of, link, node_of, ok, status_ok, types};
use crate::conn::BmcConn;
use crate::scenario::HardwareFailureMode;
use crate::state::{EventKind, FleetState, Node};
use crate::update;

/// CPUs of a host system distinct from the GPU system (a DGX host has two).
const HOST_CPUS: usize = 2;

pub(super) async fn systems(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Query(query): Query<HashMap<String, String>>,
) -> RfResult {
    let ids = layout(&s).systems();
    let expand = if wants_expand(&s, &query) {
        let node = node_of(&s, &c)?;
        Some(ids.iter().map(|sys| system_doc(&s, node, sys)).collect())
    } else {
        None
    };
    ok(collection_of(
        "/redfish/v1/Systems",
        "#ComputerSystemCollection.ComputerSystemCollection",
        "Computer System Collection",
        ids.into_iter().map(system_uri).collect(),
        expand,
    ))
}

pub(super) async fn system(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path(sys): Path<String>,
) -> RfResult {
    known_system(&s, &sys)?;
    let node = node_of(&s, &c)?;
    ok(system_doc(&s, node, &sys))
}

/// A ComputerSystem document, as its own GET and an expanded Systems collection give it.
fn system_doc(s: &FleetState, node: &Node, sys: &str) -> Value {
    let l = layout(s);
    let uri = system_uri(sys);
    if sys != l.main_system() {
        // The GPU baseboard of a host: its GPUs and its event log, no reset of its own here.
        return json!({
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
        });
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
    v
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct ResetBody {
    #[serde(default)]
    reset_type: Option<String>,
}

pub(super) fn parse_reset(body: &[u8], allowed: &[&str]) -> Result<(), RfError> {
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

pub(super) async fn system_reset(
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

pub(super) async fn processors(
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
    let part = s.current_part(&node.name, &m, g, now);
    let failure = s.failure_at(&m, g, now);
    let status = match failure.map(|f| f.mode) {
        // The BMC lost the device: present in the inventory, not reachable (DMTF `UnavailableOffline`).
        Some(HardwareFailureMode::FallenOffBus) => json!({"State": "UnavailableOffline", "Health": "Critical"}),
        _ if rebooting => json!({"State": "Starting", "Health": "OK"}),
        _ => status_ok(),
    };
    let mut v = json!({
        "@odata.id": uri,
        "@odata.type": types::PROCESSOR,
        "Id": id,
        "Name": format!("GPU {}", g + l.gpu_index_base),
        "ProcessorType": "GPU",
        "Manufacturer": s.scenario.parts.manufacturer,
        "Model": "Simulated GPU",
        "Status": status,
        "Metrics": link(format!("{uri}/ProcessorMetrics")),
        "Assembly": link(format!("{uri}/Assembly")),
    });
    if let Some(p) = &part {
        v["SerialNumber"] = json!(p.serial);
        v["PartNumber"] = json!(p.part_number);
    }
    if let Some(t) = &l.gpu_chassis {
        v["Links"] = json!({ "Chassis": link(format!("/redfish/v1/Chassis/{}", l.name(t, g))) });
    }
    if let Some(fw) = fw {
        v["FirmwareVersion"] = json!(fw);
    }
    Ok(v)
}

pub(super) async fn processor(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path((sys, id)): Path<(String, String)>,
) -> RfResult {
    known_system(&s, &sys)?;
    let node = node_of(&s, &c)?;
    ok(processor_doc(&s, node, &sys, &id)?)
}

pub(super) async fn processor_metrics(
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

/// The GPU's `Assembly` (Processor v1_10 on): the one property a Processor lacks, `ProductionDate`,
/// beside the serial and part number of the part in the slot now.
pub(super) async fn processor_assembly(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path((sys, id)): Path<(String, String)>,
) -> RfResult {
    let node = node_of(&s, &c)?;
    let g = gpu_index(&s, &sys, &id)?;
    let uri = format!("{}/Processors/{id}/Assembly", system_uri(&sys));
    let now = s.now();
    let part = {
        let m = node.lock();
        s.current_part(&node.name, &m, g, now)
    }
    .ok_or_else(|| RfError::not_found("Assembly"))?;
    let name = format!("GPU {}", g + layout(&s).gpu_index_base);
    let maker = &s.scenario.parts.manufacturer;
    ok(json!({
        "@odata.id": uri,
        "@odata.type": types::ASSEMBLY,
        "Id": "Assembly",
        "Name": format!("{name} Assembly"),
        "Assemblies": [{
            "@odata.id": format!("{uri}#/Assemblies/0"),
            "MemberId": "0",
            "Name": name,
            "Model": s.scenario.dcgm.model_name,
            "PartNumber": part.part_number,
            "SerialNumber": part.serial,
            "Vendor": maker,
            "Producer": maker,
            "ProductionDate": format!("{}T00:00:00Z", part.production_date.format("%Y-%m-%d")),
            "PhysicalContext": "GPU",
        }],
        "Assemblies@odata.count": 1,
    }))
}
