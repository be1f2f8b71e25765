//! The BMC's own manager resource and its reset.

use std::sync::Arc;

use axum::extract::{ConnectInfo, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde_json::json;

use super::layout::{layout, system_uri, uuid_for};
use super::response::{RfResult, collection, link, node_of, ok, status_ok, ts, types};
use super::systems::parse_reset;
use crate::conn::BmcConn;
use crate::state::FleetState;
use crate::update;

pub(super) async fn managers() -> RfResult {
    ok(collection(
        "/redfish/v1/Managers",
        "#ManagerCollection.ManagerCollection",
        "Manager Collection",
        vec!["/redfish/v1/Managers/1".to_owned()],
    ))
}

pub(super) async fn manager(State(s): State<Arc<FleetState>>, ConnectInfo(c): ConnectInfo<BmcConn>) -> RfResult {
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

pub(super) async fn manager_reset(
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
