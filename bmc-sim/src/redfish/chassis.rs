//! Chassis and sensors: the main chassis (the host's, or `1`), the GPU baseboard's when the host is a
//! separate system, and one chassis per GPU when the layout has them.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Query, State};
use serde_json::{Value, json};

use super::layout::{gpu_uri, layout, sensor_chassis, system_uri, wants_expand};
use super::response::{RfError, RfResult, collection_of, link, node_of, ok, status_ok, ts, types};
use crate::conn::BmcConn;
use crate::state::{FleetState, Node};

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

pub(super) async fn chassis_collection(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Query(query): Query<HashMap<String, String>>,
) -> RfResult {
    let ids = chassis_ids(&s);
    let expand = if wants_expand(&s, &query) {
        let node = node_of(&s, &c)?;
        Some(
            ids.iter()
                .map(|ch| chassis_doc(&s, node, ch))
                .collect::<Result<Vec<_>, _>>()?,
        )
    } else {
        None
    };
    ok(collection_of(
        "/redfish/v1/Chassis",
        "#ChassisCollection.ChassisCollection",
        "Chassis Collection",
        ids.iter().map(|id| format!("/redfish/v1/Chassis/{id}")).collect(),
        expand,
    ))
}

pub(super) async fn chassis(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Path(ch): Path<String>,
) -> RfResult {
    let node = node_of(&s, &c)?;
    ok(chassis_doc(&s, node, &ch)?)
}

/// A Chassis document, as its own GET and an expanded Chassis collection give it.
fn chassis_doc(s: &FleetState, node: &Node, ch: &str) -> Result<Value, RfError> {
    let gpus = chassis_gpus(s, ch)?;
    let l = layout(s);
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
                "ComputerSystems": [link(system_uri(ch))],
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
                "ComputerSystems": [link(system_uri(ch))],
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
    Ok(v)
}

pub(super) async fn thermal_subsystem(State(s): State<Arc<FleetState>>, Path(ch): Path<String>) -> RfResult {
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

pub(super) async fn thermal_metrics(
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

pub(super) async fn sensors(
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

pub(super) async fn sensor(
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
