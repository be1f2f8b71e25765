//! The service root, `$metadata` and the OData service document.

use std::sync::Arc;

use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::layout::{layout, uuid_for};
use super::response::{RfResult, link, node_of, ok, types};
use crate::conn::BmcConn;
use crate::state::FleetState;

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
    ("Assembly", &["Assembly", "Assembly.v1_5_1"]),
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

pub(super) async fn redfish_versions() -> RfResult {
    ok(json!({ "v1": "/redfish/v1/" }))
}

pub(super) async fn service_root(State(s): State<Arc<FleetState>>, ConnectInfo(c): ConnectInfo<BmcConn>) -> RfResult {
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
        "ProtocolFeaturesSupported": super::protocol::protocol_features(layout(&s).expand_query),
        "Links": { "Sessions": link("/redfish/v1/SessionService/Sessions") },
    });
    ok(v)
}

pub(super) async fn metadata() -> Response {
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

pub(super) async fn odata() -> RfResult {
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
