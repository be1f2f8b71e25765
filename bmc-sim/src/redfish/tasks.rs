//! `TaskService`: the update tasks and their monitors.

use std::sync::Arc;

use axum::Json;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::IntoResponse;
use serde_json::{Value, json};

use super::layout::system_reset_uri;
use super::response::{RfError, RfResult, collection, link, node_of, ok, status_ok, ts, types};
use crate::conn::BmcConn;
use crate::platform::AcceptedAs;
use crate::state::{FleetState, Node, TaskPhase};

/// The answer to an accepted update, as the platform gives it: a DMTF task monitor, the task itself,
/// or 204 with nothing to poll.
pub(super) fn task_accepted(s: &FleetState, id: u64, body: Value) -> RfResult {
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

pub(super) async fn task_service(State(s): State<Arc<FleetState>>) -> RfResult {
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

pub(super) async fn tasks(State(s): State<Arc<FleetState>>, ConnectInfo(c): ConnectInfo<BmcConn>) -> RfResult {
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

pub(super) fn task_json(s: &FleetState, node: &Node, m: &mut crate::state::NodeMut, id: u64) -> Option<Value> {
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
    if let TaskPhase::Collecting {
        entry,
        target,
        json_body,
        ..
    } = &t.phase
    {
        v["Name"] = json!(format!("Diagnostic data collection task {id}"));
        // DSP0266 carries a finished operation's answer in the task: the new entry's `Location`.
        let headers: Vec<String> = if view.state == "Completed" {
            v["Links"] = json!({ "CreatedResources": [link(entry.clone())] });
            vec![format!("Location: {entry}")]
        } else {
            Vec::new()
        };
        v["Payload"] = json!({
            "TargetUri": target,
            "HttpOperation": "POST",
            "JsonBody": json_body,
            "HttpHeaders": headers,
        });
    }
    Some(v)
}

pub(super) async fn task(
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
pub(super) async fn task_monitor(
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
    let created = m
        .tasks
        .iter()
        .find(|t| t.id == id)
        .and_then(|t| t.created_entry(s.now()))
        .map(str::to_owned);
    let mut resp = (status, Json(v)).into_response();
    if let Some(entry) = created.and_then(|e| HeaderValue::from_str(&e).ok()) {
        resp.headers_mut().insert(header::LOCATION, entry);
    }
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
