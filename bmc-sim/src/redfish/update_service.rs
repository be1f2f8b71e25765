//! `UpdateService` and `FirmwareInventory`: the update paths the platform profile offers.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Multipart, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::IntoResponse;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

use super::layout::wants_expand;
use super::response::{RfError, RfResult, collection_of, link, node_of, ok, status_ok, types};
use super::tasks::{task_accepted, task_json};
use crate::conn::BmcConn;
use crate::platform::DescribedBy;
use crate::state::{ComponentState, FleetState, Node};
use crate::update::{self, MAX_IMAGE_BYTES};

pub(super) async fn update_service(State(s): State<Arc<FleetState>>, ConnectInfo(c): ConnectInfo<BmcConn>) -> RfResult {
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

pub(super) async fn simple_update_action_info(State(s): State<Arc<FleetState>>) -> RfResult {
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
pub(super) async fn patch_update_service(
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
pub(super) async fn http_push_update(
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
        t.is_update()
            && matches!(view.state, "New" | "Running")
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

pub(super) async fn firmware_inventory(
    State(s): State<Arc<FleetState>>,
    ConnectInfo(c): ConnectInfo<BmcConn>,
    Query(query): Query<HashMap<String, String>>,
) -> RfResult {
    let node = node_of(&s, &c)?;
    let expand = wants_expand(&s, &query);
    let now = s.now();
    let mut m = node.lock();
    if expand {
        node.settle(&mut m, now);
    }
    ok(collection_of(
        "/redfish/v1/UpdateService/FirmwareInventory",
        "#SoftwareInventoryCollection.SoftwareInventoryCollection",
        "Firmware Inventory Collection",
        m.components
            .iter()
            .map(|c| format!("/redfish/v1/UpdateService/FirmwareInventory/{}", c.id))
            .collect(),
        expand.then(|| m.components.iter().map(|comp| entry_doc(node, comp)).collect()),
    ))
}

pub(super) async fn firmware_entry(
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
    ok(entry_doc(node, comp))
}

/// One SoftwareInventory document, as its own GET and an expanded collection give it.
fn entry_doc(node: &Node, comp: &ComponentState) -> Value {
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
    body
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

pub(super) async fn simple_update(
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

pub(super) async fn multipart_update(
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
