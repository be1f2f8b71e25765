//! Updates: reading the UpdateService once, choosing and sending the push, and tracking it by its task
//! or, when the BMC answers without one, by watching the inventory.

use redfish::types::{SimpleUpdateRequest, Task};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::Bmc;
use crate::error::BmcError;
use crate::limits::ReadBudget;
use crate::transport::{Body, Call, Response};
use crate::types::{FirmwareComponent, TaskHandle, TaskMessage, TaskState, TaskStatus, UpdateRequest};
use crate::update::{ApplyTime, PushCaps, SimpleUpdateCaps, UpdateCapabilities, UpdatePath, choose_update_path};

use super::{FIRMWARE_INVENTORY, RedfishBmc, SIMPLE_UPDATE, non_empty_str, odata_id, string_list};

/// A push accepted without a task is tracked by reading the inventory; its handle is this URN (stored
/// by the engine like any task URI), carrying the apply time and the versions before the push.
pub(super) const INVENTORY_WATCH: &str = "urn:waveguard:inventory-watch";

/// The UpdateService facts an update needs, read once per BMC.
#[derive(Debug, Clone)]
pub(super) struct UpdateServiceInfo {
    pub(super) firmware_inventory: String,
    pub(super) caps: UpdateCapabilities,
}

impl RedfishBmc {
    pub(super) async fn update_service(&self) -> Result<&UpdateServiceInfo, BmcError> {
        self.update_service
            .get_or_try_init(|| async {
                let uri = self.links().await?.update_service.clone();
                let svc: Value = match self.transport.get_json(&uri).await {
                    Ok(svc) => svc,
                    // No UpdateService document: no advertised path, inventory at the DMTF path.
                    Err(BmcError::Rejected { status: 404, .. }) => Value::Null,
                    Err(err) => return Err(err),
                };
                let firmware_inventory = svc
                    .pointer("/FirmwareInventory/@odata.id")
                    .and_then(Value::as_str)
                    .unwrap_or(FIRMWARE_INVENTORY)
                    .to_string();
                let simple_update = match svc.pointer("/Actions/#UpdateService.SimpleUpdate") {
                    Some(action) => Some(self.simple_update_caps(action).await?),
                    None => None,
                };
                let multipart = non_empty_str(svc.get("MultipartHttpPushUri")).map(|push_uri| PushCaps {
                    uri: push_uri,
                    // A property annotation on the URI, or one on the service itself.
                    apply_times: apply_time_support(
                        svc.get("MultipartHttpPushUri@Redfish.OperationApplyTimeSupport")
                            .or_else(|| svc.get("@Redfish.OperationApplyTimeSupport")),
                    ),
                    targets_settable: true,
                });
                let http_push = non_empty_str(svc.get("HttpPushUri")).map(|push_uri| PushCaps {
                    uri: push_uri,
                    apply_times: svc
                        .pointer("/HttpPushUriOptions/HttpPushUriApplyTime/ApplyTime@Redfish.AllowableValues")
                        .map(|v| apply_time_list(Some(v)))
                        .unwrap_or_default(),
                    targets_settable: svc.get("HttpPushUriTargets").is_some(),
                });
                Ok(UpdateServiceInfo {
                    firmware_inventory,
                    caps: UpdateCapabilities {
                        simple_update,
                        multipart,
                        http_push,
                        max_image_bytes: svc.get("MaxImageSizeBytes").and_then(Value::as_u64),
                    },
                })
            })
            .await
    }

    /// The SimpleUpdate action as this BMC describes it: inline annotations first (Dell-style), then
    /// the `@Redfish.ActionInfo` resource, which also says whether `Targets` is a parameter at all.
    async fn simple_update_caps(&self, action: &Value) -> Result<SimpleUpdateCaps, BmcError> {
        let mut caps = SimpleUpdateCaps {
            target: non_empty_str(action.get("target")).unwrap_or_else(|| SIMPLE_UPDATE.to_string()),
            protocols: string_list(action.get("TransferProtocol@Redfish.AllowableValues")),
            protocol_required: false,
            accepts_targets: None,
            apply_times: apply_time_support(action.get("@Redfish.OperationApplyTimeSupport")),
        };
        if let Some(info_uri) = action.get("@Redfish.ActionInfo").and_then(Value::as_str) {
            let info: Value = self.transport.get_json(info_uri).await?;
            if let Some(params) = info.get("Parameters").and_then(Value::as_array) {
                let named = |name: &str| {
                    params
                        .iter()
                        .find(|p| p.get("Name").and_then(Value::as_str) == Some(name))
                };
                caps.accepts_targets = Some(named("Targets").is_some());
                if let Some(tp) = named("TransferProtocol") {
                    caps.protocol_required = tp.get("Required").and_then(Value::as_bool).unwrap_or(false);
                    if caps.protocols.is_empty() {
                        caps.protocols = string_list(tp.get("AllowableValues"));
                    }
                }
            }
        }
        Ok(caps)
    }

    pub(super) async fn simple_update(
        &self,
        target: &str,
        image_uri: &str,
        transfer_protocol: Option<String>,
        apply_time: Option<ApplyTime>,
        request: &UpdateRequest,
    ) -> Result<Response, BmcError> {
        let mut req = SimpleUpdateRequest::new(image_uri.to_string()).targets(request.targets.iter().cloned());
        if let Some(protocol) = transfer_protocol {
            req = req.transfer_protocol(protocol);
        }
        if let Some(force) = request.force_update {
            req = req.force_update(force);
        }
        let mut body = serde_json::to_value(&req).map_err(|e| BmcError::Config {
            endpoint: self.transport.label().to_string(),
            reason: "cannot encode SimpleUpdate request".to_string(),
            source: Some(Box::new(e)),
        })?;
        if let (Some(apply), Some(obj)) = (apply_time, body.as_object_mut()) {
            obj.insert("@Redfish.OperationApplyTime".into(), apply.as_str().into());
        }
        self.post_action(target, Body::json(&body), self.transport.timeouts.request)
            .await
    }

    pub(super) async fn multipart_push(
        &self,
        push_uri: &str,
        image: bytes::Bytes,
        filename: &str,
        apply_time: Option<ApplyTime>,
        request: &UpdateRequest,
    ) -> Result<Response, BmcError> {
        let mut params = serde_json::json!({ "Targets": request.targets });
        if let Some(obj) = params.as_object_mut() {
            if let Some(apply) = apply_time {
                obj.insert("@Redfish.OperationApplyTime".into(), apply.as_str().into());
            }
            if let Some(force) = request.force_update {
                obj.insert("ForceUpdate".into(), force.into());
            }
        }
        let body = Body::Multipart {
            params: params.to_string().into(),
            image,
            filename: filename.to_string(),
        };
        self.post_action(push_uri, body, self.transport.timeouts.upload).await
    }

    /// The older `HttpPushUri`: targets are a global setting of the UpdateService, so they are set by
    /// a PATCH conditional on the ETag just read (a 412 means another client changed them: nothing is
    /// pushed), reserved with `HttpPushUriTargetsBusy`, and refused while someone else holds them.
    async fn http_push(
        &self,
        info: &UpdateServiceInfo,
        push_uri: &str,
        image: bytes::Bytes,
        apply_time: Option<ApplyTime>,
        request: &UpdateRequest,
    ) -> Result<Response, BmcError> {
        let service_uri = self.links().await?.update_service.clone();
        let targeted = !request.targets.is_empty();
        if targeted || apply_time.is_some() {
            let resp = self.get_ok_in(&service_uri, &ReadBudget::new("update service")).await?;
            let svc: Value = self.transport.decode(&resp)?;
            if svc.get("HttpPushUriTargetsBusy").and_then(Value::as_bool) == Some(true) {
                return Err(BmcError::Unavailable {
                    endpoint: self.transport.label().to_string(),
                    method: "PATCH".to_string(),
                    path: service_uri,
                    status: 409,
                    retry_after: None,
                    attempts: 0,
                });
            }
            let etag = resp.headers.get(reqwest::header::ETAG).cloned();
            let mut patch = serde_json::Map::new();
            if targeted && info.caps.http_push.as_ref().is_some_and(|h| h.targets_settable) {
                patch.insert("HttpPushUriTargets".into(), request.targets.clone().into());
                patch.insert("HttpPushUriTargetsBusy".into(), true.into());
            }
            if let Some(apply) = apply_time
                && svc.pointer("/HttpPushUriOptions/HttpPushUriApplyTime").is_some()
            {
                patch.insert(
                    "HttpPushUriOptions".into(),
                    serde_json::json!({ "HttpPushUriApplyTime": { "ApplyTime": apply.as_str() } }),
                );
            }
            if !patch.is_empty() {
                let call = Call {
                    method: Method::PATCH,
                    uri: service_uri.clone(),
                    body: Body::json(&Value::Object(patch)),
                    // Setting the same values twice is harmless.
                    idempotent: true,
                    timeout: self.transport.timeouts.request,
                    retry: self.transport.retry,
                    if_match: etag,
                };
                let resp = self.transport.send(call).await?;
                self.transport.expect_success(resp)?;
            }
        }
        let pushed = self
            .post_action(push_uri, Body::Octet(image), self.transport.timeouts.upload)
            .await;
        if targeted {
            // Release the reservation whatever happened; a failure here only delays the next push.
            let call = Call {
                method: Method::PATCH,
                uri: service_uri,
                body: Body::json(&serde_json::json!({ "HttpPushUriTargetsBusy": false })),
                idempotent: true,
                timeout: self.transport.timeouts.request,
                retry: self.transport.retry,
                if_match: None,
            };
            if let Err(err) = self.transport.send(call).await {
                tracing::warn!(endpoint = self.transport.label(), error = %err, "cannot release HttpPushUriTargets");
            }
        }
        pushed
    }

    /// [`UpdateMethod::FromImageUri`]: choose the path from the BMC's capabilities, send, and turn the
    /// answer into a handle (a task, a task monitor, or an inventory watch when there is no task).
    pub(super) async fn update_from_uri(
        &self,
        info: &UpdateServiceInfo,
        request: &UpdateRequest,
        image_uri: &str,
    ) -> Result<TaskHandle, BmcError> {
        let Some(intent) = request.intent() else {
            return Err(BmcError::Unsupported {
                endpoint: self.transport.label().to_string(),
                feature: "choosing an update path for a request that names its own".to_string(),
            });
        };
        let plan = choose_update_path(&info.caps, &intent).map_err(|refusal| BmcError::NoUpdatePath {
            endpoint: self.transport.label().to_string(),
            reasons: refusal.to_string(),
        })?;
        if let Some(note) = &plan.note {
            tracing::info!(endpoint = self.transport.label(), path = %plan.path, note, "update path chosen");
        }
        // Versions before the push: if the BMC answers an immediate update without a task, the
        // inventory is the only way to see it land. A staged update is done once accepted (the reset
        // activates it, and the step reads the inventory after that), so it needs no read here.
        let before = if plan.apply_time == Some(ApplyTime::Immediate) {
            self.firmware_inventory().await?
        } else {
            Vec::new()
        };
        let image_limit = info
            .caps
            .max_image_bytes
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(usize::MAX)
            .min(crate::limits::MAX_PUSH_IMAGE_BYTES);
        let filename = image_uri
            .rsplit('/')
            .next()
            .filter(|n| !n.is_empty())
            .unwrap_or("firmware.bin")
            .to_string();
        let resp = match plan.path {
            UpdatePath::SimpleUpdate => {
                let target = info
                    .caps
                    .simple_update
                    .as_ref()
                    .map_or(SIMPLE_UPDATE, |su| su.target.as_str());
                self.simple_update(
                    target,
                    image_uri,
                    plan.transfer_protocol.clone(),
                    plan.apply_time,
                    request,
                )
                .await?
            }
            UpdatePath::MultipartPush => {
                let uri = info.caps.multipart.as_ref().map(|m| m.uri.clone()).unwrap_or_default();
                let image = self.transport.fetch_image(image_uri, image_limit).await?;
                self.multipart_push(&uri, image, &filename, plan.apply_time, request)
                    .await?
            }
            UpdatePath::HttpPush => {
                let uri = info.caps.http_push.as_ref().map(|m| m.uri.clone()).unwrap_or_default();
                let image = self.transport.fetch_image(image_uri, image_limit).await?;
                self.http_push(info, &uri, image, plan.apply_time, request).await?
            }
        };
        if let Some(handle) = self.task_handle_from(&resp)? {
            return Ok(handle);
        }
        Ok(TaskHandle {
            monitor_uri: inventory_watch_uri(plan.apply_time, &request.targets, &before),
            task_uri: None,
        })
    }

    /// A push accepted without a task: staged-for-reset updates are done being accepted (the reset
    /// activates them); immediate ones are done when every target's version differs from before.
    pub(super) async fn poll_inventory_watch(&self, uri: &str) -> Result<TaskStatus, BmcError> {
        let watch = parse_inventory_watch(uri);
        if watch.apply != Some(ApplyTime::Immediate) {
            return Ok(TaskStatus {
                state: TaskState::Completed,
                percent_complete: None,
                messages: Vec::new(),
            });
        }
        let now = self.firmware_inventory().await?;
        let changed = |(target, before): &(String, String)| {
            now.iter()
                .find(|c| &c.uri == target)
                .is_some_and(|c| c.version.as_deref().unwrap_or_default() != before)
        };
        let done = match (watch.targets.is_empty(), watch.any) {
            (true, _) => false,
            // Untargeted: the BMC chose; any entry that moved is the update landing.
            (false, true) => watch.targets.iter().any(changed),
            (false, false) => watch.targets.iter().all(changed),
        };
        Ok(TaskStatus {
            state: if done { TaskState::Completed } else { TaskState::Running },
            percent_complete: None,
            messages: Vec::new(),
        })
    }

    pub(super) fn task_status_from(&self, resp: &Response, uri: &str) -> Result<TaskStatus, BmcError> {
        let has_body = !resp.body.iter().all(u8::is_ascii_whitespace);
        let doc: Option<Value> = if has_body {
            Some(self.transport.decode(resp)?)
        } else {
            None
        };
        let is_task = doc.as_ref().is_some_and(|d| d.get("TaskState").is_some());
        if !is_task {
            // A task monitor answers 202 while the work runs, then the operation's own result.
            return Ok(TaskStatus {
                state: if resp.status == StatusCode::ACCEPTED {
                    TaskState::Running
                } else {
                    TaskState::Completed
                },
                percent_complete: None,
                messages: Vec::new(),
            });
        }
        let task: Task = self.transport.decode(resp)?;
        let state = TaskState::parse(task.task_state.as_deref().unwrap_or_default());
        let messages = task.messages.iter().map(task_message).collect();
        if state.is_failure() {
            return Err(BmcError::TaskFailed {
                endpoint: self.transport.label().to_string(),
                task_uri: uri.to_string(),
                state,
                messages,
            });
        }
        Ok(TaskStatus {
            state,
            percent_complete: task.percent_complete,
            messages,
        })
    }

    /// Where to follow an accepted update or reset: the `Location` task monitor (DMTF pattern), else
    /// a Task in the body. `None`: the BMC accepted it without a task (200/204 on many BMCs).
    pub(super) fn task_handle_from(&self, resp: &Response) -> Result<Option<TaskHandle>, BmcError> {
        let location = resp
            .headers
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(str::to_string);
        let body: Option<Value> = serde_json::from_slice(&resp.body).ok();
        let task_uri = body
            .as_ref()
            .filter(|b| b.get("TaskState").is_some())
            .and_then(|b| odata_id(b))
            .map(str::to_string);
        Ok(match (location, task_uri) {
            (Some(monitor_uri), task_uri) => Some(TaskHandle { monitor_uri, task_uri }),
            (None, Some(task_uri)) => Some(TaskHandle {
                monitor_uri: task_uri.clone(),
                task_uri: Some(task_uri),
            }),
            (None, None) => None,
        })
    }
}

fn task_message(m: &redfish::types::TaskMessage) -> TaskMessage {
    TaskMessage {
        message_id: m.message_id.clone(),
        message: m.message.clone(),
        message_args: string_list(m.extra.get("MessageArgs")),
        severity: m
            .extra
            .get("MessageSeverity")
            .or_else(|| m.extra.get("Severity"))
            .and_then(Value::as_str)
            .map(str::to_string),
    }
}

/// `@Redfish.OperationApplyTimeSupport` → its `SupportedValues` the driver knows.
fn apply_time_support(annotation: Option<&Value>) -> Vec<ApplyTime> {
    apply_time_list(annotation.and_then(|a| a.get("SupportedValues")))
}

fn apply_time_list(values: Option<&Value>) -> Vec<ApplyTime> {
    string_list(values).iter().filter_map(|v| ApplyTime::parse(v)).collect()
}

/// What an inventory-watch handle carries.
#[derive(Debug, Default, PartialEq)]
struct InventoryWatch {
    apply: Option<ApplyTime>,
    /// `(inventory URI, version before the push)`.
    targets: Vec<(String, String)>,
    /// Untargeted: done when any entry changed.
    any: bool,
}

fn inventory_watch_uri(apply: Option<ApplyTime>, targets: &[String], before: &[FirmwareComponent]) -> String {
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    if let Some(apply) = apply {
        query.append_pair("apply", apply.as_str());
    }
    let watched: Vec<&FirmwareComponent> = if targets.is_empty() {
        query.append_pair("any", "1");
        before.iter().filter(|c| c.updateable).collect()
    } else {
        before.iter().filter(|c| targets.contains(&c.uri)).collect()
    };
    for c in watched {
        query.append_pair("t", &c.uri);
        query.append_pair("v", c.version.as_deref().unwrap_or_default());
    }
    format!("{INVENTORY_WATCH}?{}", query.finish())
}

fn parse_inventory_watch(uri: &str) -> InventoryWatch {
    let query = uri.split_once('?').map_or("", |(_, q)| q);
    let mut watch = InventoryWatch::default();
    let mut pending: Option<String> = None;
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        match key.as_ref() {
            "apply" => watch.apply = ApplyTime::parse(&value),
            "any" => watch.any = value == "1",
            "t" => pending = Some(value.into_owned()),
            "v" => {
                if let Some(t) = pending.take() {
                    watch.targets.push((t, value.into_owned()));
                }
            }
            _ => {}
        }
    }
    watch
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comp(id: &str, version: &str) -> FirmwareComponent {
        FirmwareComponent {
            id: id.into(),
            uri: format!("/redfish/v1/UpdateService/FirmwareInventory/{id}"),
            version: Some(version.into()),
            updateable: true,
            software_id: None,
            state: None,
            health: None,
            lowest_supported_version: None,
            name: None,
            related_items: Vec::new(),
        }
    }

    #[test]
    fn inventory_watch_round_trips_targets_versions_and_apply_time() {
        let before = vec![
            comp("HGX_FW_GPU_SXM_1", "1.0 & b"),
            comp("HGX_FW_ERoT_GPU_SXM_1", "2.0"),
        ];
        let uri = inventory_watch_uri(
            Some(ApplyTime::Immediate),
            &["/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_SXM_1".into()],
            &before,
        );
        assert!(uri.starts_with(INVENTORY_WATCH), "{uri}");
        let watch = parse_inventory_watch(&uri);
        assert_eq!(watch.apply, Some(ApplyTime::Immediate));
        assert!(!watch.any);
        assert_eq!(
            watch.targets,
            vec![(before[0].uri.clone(), "1.0 & b".to_string())],
            "only the target is watched, with its version intact"
        );
        let untargeted = parse_inventory_watch(&inventory_watch_uri(None, &[], &before));
        assert!(untargeted.any && untargeted.apply.is_none());
        assert_eq!(untargeted.targets.len(), 2);
    }

    #[test]
    fn apply_time_annotations_parse_known_values_only() {
        let v = serde_json::json!({ "SupportedValues": ["Immediate", "AtMaintenanceWindowStart", "OnReset"] });
        assert_eq!(
            apply_time_support(Some(&v)),
            vec![ApplyTime::Immediate, ApplyTime::OnReset]
        );
        assert!(apply_time_support(None).is_empty());
    }
}
