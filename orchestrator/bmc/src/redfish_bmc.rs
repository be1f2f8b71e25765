//! [`RedfishBmc`]: the [`Bmc`] trait over real Redfish HTTP.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::stream::{self, StreamExt, TryStreamExt};
use redfish::types::{Collection, LogEntry, Sensor, ServiceRoot, SimpleUpdateRequest, SoftwareInventory, Task};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::OnceCell;

use crate::config::{BmcEndpoint, RetryPolicy};
use crate::error::BmcError;
use crate::transport::{Body, Call, HttpClients, Response, Transport};
use crate::types::{
    EventBatch, EventCursor, EventLogEntry, FirmwareComponent, ResetTarget, SensorKind, SensorReading, ServiceInfo,
    TaskHandle, TaskMessage, TaskState, TaskStatus, UpdateMethod, UpdateRequest,
};
use crate::{Bmc, ResetKind};

/// How many member GETs one BMC gets at once when a collection lists links only. BMC web servers are
/// small embedded processes; more parallelism mostly earns 503s.
pub(crate) const PER_BMC_FETCH_CONCURRENCY: usize = 2;

/// Upper bound on `@odata.nextLink` pages followed, so a BMC with a looping link cannot hold a worker.
const MAX_COLLECTION_PAGES: usize = 64;

const UPDATE_SERVICE: &str = "/redfish/v1/UpdateService";
const FIRMWARE_INVENTORY: &str = "/redfish/v1/UpdateService/FirmwareInventory";
const TASKS: &str = "/redfish/v1/TaskService/Tasks";
const SIMPLE_UPDATE: &str = "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate";

/// The UpdateService facts an update needs, read once per BMC.
#[derive(Debug, Clone)]
struct UpdateServiceInfo {
    simple_update_target: String,
    multipart_push_uri: Option<String>,
}

/// A [`Bmc`] reached over Redfish HTTP(S).
///
/// Cheap to share: wrap it in an `Arc` and use it from many tasks; it keeps one session and one
/// connection pool.
#[derive(Debug)]
pub struct RedfishBmc {
    transport: Transport,
    update_service: OnceCell<UpdateServiceInfo>,
    event_log_entries: OnceCell<String>,
}

impl RedfishBmc {
    /// Prepares a driver for one BMC. Does no I/O: the first request logs in.
    pub fn new(endpoint: &BmcEndpoint, clients: &HttpClients) -> Result<Self, BmcError> {
        Ok(Self {
            transport: Transport::new(endpoint, clients)?,
            update_service: OnceCell::new(),
            event_log_entries: OnceCell::new(),
        })
    }

    async fn update_service(&self) -> Result<&UpdateServiceInfo, BmcError> {
        self.update_service
            .get_or_try_init(|| async {
                let svc: Value = self.transport.get_json(UPDATE_SERVICE).await?;
                let simple_update_target = svc
                    .pointer("/Actions/#UpdateService.SimpleUpdate/target")
                    .and_then(Value::as_str)
                    .unwrap_or(SIMPLE_UPDATE)
                    .to_string();
                let multipart_push_uri = svc
                    .get("MultipartHttpPushUri")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string);
                Ok(UpdateServiceInfo {
                    simple_update_target,
                    multipart_push_uri,
                })
            })
            .await
    }

    /// All members of a collection, following `Members@odata.nextLink`. Members are returned as the
    /// BMC sent them: full objects on BMCs that expand, bare `@odata.id` links on the others.
    async fn collection_members(&self, uri: &str) -> Result<Vec<Value>, BmcError> {
        let mut members = Vec::new();
        let mut next = Some(uri.to_string());
        let mut pages = 0;
        while let Some(page_uri) = next.take() {
            pages += 1;
            if pages > MAX_COLLECTION_PAGES {
                tracing::warn!(
                    endpoint = self.transport.label(),
                    uri,
                    "collection paging limit reached"
                );
                break;
            }
            let resp = self.get_ok(&page_uri).await?;
            let page: Collection<Value> = self.transport.decode(&resp)?;
            next = page.next_link().map(str::to_string);
            members.extend(page.members);
        }
        Ok(members)
    }

    /// Each member as `T`, fetching it when the collection only linked to it. `inline_key` is a
    /// property whose presence shows that a member is already expanded.
    async fn expand_members<T: DeserializeOwned + Send>(
        &self,
        members: Vec<Value>,
        inline_key: &str,
        path: &str,
    ) -> Result<Vec<T>, BmcError> {
        stream::iter(members)
            .map(|member| async move {
                if member.get(inline_key).is_some() {
                    return serde_json::from_value::<T>(member.clone()).map_err(|e| BmcError::Protocol {
                        endpoint: self.transport.label().to_string(),
                        method: "GET".to_string(),
                        path: path.to_string(),
                        status: None,
                        reason: format!("malformed collection member: {e}"),
                        body_snippet: String::new(),
                    });
                }
                let uri = odata_id(&member).ok_or_else(|| BmcError::Protocol {
                    endpoint: self.transport.label().to_string(),
                    method: "GET".to_string(),
                    path: path.to_string(),
                    status: None,
                    reason: "collection member without @odata.id".to_string(),
                    body_snippet: String::new(),
                })?;
                self.transport.get_json::<T>(uri).await
            })
            .buffered(PER_BMC_FETCH_CONCURRENCY)
            .try_collect()
            .await
    }

    async fn get_ok(&self, uri: &str) -> Result<Response, BmcError> {
        let resp = self.transport.send(self.transport.get_call(uri)).await?;
        self.transport.expect_success(resp)
    }

    /// The `@odata.id` of the member with `id` (or of the first member) of a top-level collection.
    async fn pick_member(&self, collection: &str, id: Option<&str>) -> Result<String, BmcError> {
        let members = self.collection_members(collection).await?;
        let uris: Vec<&str> = members.iter().filter_map(odata_id).collect();
        let found = match id {
            Some(id) => uris
                .iter()
                .find(|u| u.trim_end_matches('/').rsplit('/').next() == Some(id)),
            None => uris.first(),
        };
        found.map(|u| u.to_string()).ok_or_else(|| BmcError::Unsupported {
            endpoint: self.transport.label().to_string(),
            feature: format!("{collection} member {}", id.unwrap_or("(any)")),
        })
    }

    async fn event_log_entries_uri(&self) -> Result<&String, BmcError> {
        self.event_log_entries
            .get_or_try_init(|| async {
                for collection in ["/redfish/v1/Systems", "/redfish/v1/Managers"] {
                    let Ok(owner) = self.pick_member(collection, None).await else {
                        continue;
                    };
                    let owner_doc: Value = self.transport.get_json(&owner).await?;
                    let Some(services_uri) = owner_doc.pointer("/LogServices/@odata.id").and_then(Value::as_str) else {
                        continue;
                    };
                    let services = self.collection_members(services_uri).await?;
                    let mut uris: Vec<&str> = services.iter().filter_map(odata_id).collect();
                    // Prefer the event log over SEL/crash-dump style services.
                    uris.sort_by_key(|u| !u.to_ascii_lowercase().ends_with("eventlog"));
                    let Some(service_uri) = uris.first() else { continue };
                    let service: Value = self.transport.get_json(service_uri).await?;
                    let entries = service
                        .pointer("/Entries/@odata.id")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .unwrap_or_else(|| format!("{}/Entries", service_uri.trim_end_matches('/')));
                    return Ok(entries);
                }
                Err(BmcError::Unsupported {
                    endpoint: self.transport.label().to_string(),
                    feature: "an event log (LogServices under Systems or Managers)".to_string(),
                })
            })
            .await
    }

    fn task_status_from(&self, resp: &Response, uri: &str) -> Result<TaskStatus, BmcError> {
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

    fn task_handle_from(&self, resp: &Response) -> Result<TaskHandle, BmcError> {
        let location = resp
            .headers
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body: Option<Value> = serde_json::from_slice(&resp.body).ok();
        let task_uri = body
            .as_ref()
            .filter(|b| b.get("TaskState").is_some())
            .and_then(|b| odata_id(b))
            .map(str::to_string);
        match (location, task_uri) {
            (Some(monitor_uri), task_uri) => Ok(TaskHandle { monitor_uri, task_uri }),
            (None, Some(task_uri)) => Ok(TaskHandle {
                monitor_uri: task_uri.clone(),
                task_uri: Some(task_uri),
            }),
            (None, None) => Err(self.transport.protocol(
                resp,
                "update accepted without a task monitor (no Location, no Task body)",
            )),
        }
    }

    async fn post_action(&self, uri: &str, body: Body, timeout: Duration) -> Result<Response, BmcError> {
        let call = Call {
            method: Method::POST,
            uri: uri.to_string(),
            body,
            // Re-sending an update or a reset whose answer was lost could flash or reboot twice.
            idempotent: false,
            timeout,
            retry: self.transport.retry,
        };
        let resp = self.transport.send(call).await?;
        self.transport.expect_success(resp)
    }
}

#[async_trait]
impl Bmc for RedfishBmc {
    fn endpoint(&self) -> &str {
        self.transport.label()
    }

    async fn probe(&self) -> Result<ServiceInfo, BmcError> {
        let call = Call {
            method: Method::GET,
            uri: "/redfish/v1".to_string(),
            body: Body::Empty,
            idempotent: true,
            timeout: self.transport.timeouts.probe,
            // One attempt: the probe answers "is it up now", and the caller polls it anyway.
            retry: RetryPolicy {
                deadline: self.transport.timeouts.probe,
                ..RetryPolicy::no_retries()
            },
        };
        let resp = self.transport.send_anonymous(call).await?;
        let resp = self.transport.expect_success(resp)?;
        let root: ServiceRoot = self.transport.decode(&resp)?;
        Ok(ServiceInfo {
            redfish_version: root.redfish_version,
            uuid: root.uuid,
        })
    }

    async fn firmware_inventory(&self) -> Result<Vec<FirmwareComponent>, BmcError> {
        let members = self.collection_members(FIRMWARE_INVENTORY).await?;
        let items: Vec<SoftwareInventory> = self.expand_members(members, "Version", FIRMWARE_INVENTORY).await?;
        items
            .into_iter()
            .map(|item| {
                let uri = item.odata_id.clone().ok_or_else(|| BmcError::Protocol {
                    endpoint: self.transport.label().to_string(),
                    method: "GET".to_string(),
                    path: FIRMWARE_INVENTORY.to_string(),
                    status: None,
                    reason: format!("inventory item {:?} has no @odata.id", item.id),
                    body_snippet: String::new(),
                })?;
                let id = item.id.clone().unwrap_or_else(|| {
                    uri.trim_end_matches('/')
                        .rsplit('/')
                        .next()
                        .unwrap_or_default()
                        .to_string()
                });
                Ok(FirmwareComponent {
                    id,
                    uri,
                    version: item.version,
                    updateable: item.updateable.unwrap_or(false),
                    software_id: item.software_id,
                    state: item.status.as_ref().and_then(|s| s.state.clone()),
                    health: item.status.as_ref().and_then(|s| s.health.clone()),
                    // Not a field of the schema crate's SoftwareInventory, so
                    // it arrives among the unmodelled properties.
                    lowest_supported_version: item
                        .extra
                        .get("LowestSupportedVersion")
                        .and_then(serde_json::Value::as_str)
                        .map(str::trim)
                        .filter(|v| !v.is_empty())
                        .map(str::to_owned),
                })
            })
            .collect()
    }

    async fn start_update(&self, request: &UpdateRequest) -> Result<TaskHandle, BmcError> {
        let info = self.update_service().await?.clone();
        let resp = match &request.method {
            UpdateMethod::SimpleUpdate {
                image_uri,
                transfer_protocol,
            } => {
                let mut req = SimpleUpdateRequest::new(image_uri.clone()).targets(request.targets.iter().cloned());
                if let Some(protocol) = transfer_protocol {
                    req = req.transfer_protocol(protocol.clone());
                }
                if let Some(force) = request.force_update {
                    req = req.force_update(force);
                }
                let mut body = serde_json::to_value(&req).map_err(|e| BmcError::Config {
                    endpoint: self.transport.label().to_string(),
                    reason: "cannot encode SimpleUpdate request".to_string(),
                    source: Some(Box::new(e)),
                })?;
                if let (Some(apply), Some(obj)) = (request.apply_time, body.as_object_mut()) {
                    obj.insert("@Redfish.OperationApplyTime".into(), apply.as_str().into());
                }
                self.post_action(
                    &info.simple_update_target,
                    Body::json(&body),
                    self.transport.timeouts.request,
                )
                .await?
            }
            UpdateMethod::MultipartPush { image, filename } => {
                let push_uri = info
                    .multipart_push_uri
                    .as_deref()
                    .ok_or_else(|| BmcError::Unsupported {
                        endpoint: self.transport.label().to_string(),
                        feature: "multipart HTTP push (no MultipartHttpPushUri)".to_string(),
                    })?;
                let mut params = serde_json::json!({ "Targets": request.targets });
                if let Some(obj) = params.as_object_mut() {
                    if let Some(apply) = request.apply_time {
                        obj.insert("@Redfish.OperationApplyTime".into(), apply.as_str().into());
                    }
                    if let Some(force) = request.force_update {
                        obj.insert("ForceUpdate".into(), force.into());
                    }
                }
                let body = Body::Multipart {
                    params: params.to_string().into(),
                    image: image.clone(),
                    filename: filename.clone(),
                };
                self.post_action(push_uri, body, self.transport.timeouts.upload).await?
            }
        };
        self.task_handle_from(&resp)
    }

    async fn list_tasks(&self) -> Result<Vec<String>, BmcError> {
        let members = self.collection_members(TASKS).await?;
        Ok(members.iter().filter_map(odata_id).map(str::to_string).collect())
    }

    async fn poll_task(&self, task: &TaskHandle) -> Result<TaskStatus, BmcError> {
        let uri = task.poll_uri();
        let resp = self.transport.send(self.transport.get_call(uri)).await?;
        let resp = self.transport.expect_success(resp)?;
        self.task_status_from(&resp, uri)
    }

    async fn reset(&self, target: &ResetTarget, kind: ResetKind) -> Result<Option<TaskHandle>, BmcError> {
        let (collection, id, action) = match target {
            ResetTarget::Manager(id) => ("/redfish/v1/Managers", id.as_deref(), "#Manager.Reset"),
            ResetTarget::System(id) => ("/redfish/v1/Systems", id.as_deref(), "#ComputerSystem.Reset"),
        };
        let member = self.pick_member(collection, id).await?;
        let doc: Value = self.transport.get_json(&member).await?;
        let action_uri = doc
            .pointer(&format!("/Actions/{}/target", action.replace('/', "~1")))
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("{}/Actions/{}", member.trim_end_matches('/'), &action[1..]));
        let body = serde_json::json!({ "ResetType": kind.as_redfish() });
        let resp = self
            .post_action(&action_uri, Body::json(&body), self.transport.timeouts.request)
            .await?;
        if resp.status == StatusCode::ACCEPTED {
            Ok(self.task_handle_from(&resp).ok())
        } else {
            Ok(None)
        }
    }

    async fn read_sensors(&self) -> Result<Vec<SensorReading>, BmcError> {
        let chassis = self.collection_members("/redfish/v1/Chassis").await?;
        let mut readings = Vec::new();
        for member in chassis {
            let Some(chassis_uri) = odata_id(&member) else { continue };
            let doc: Value = self.transport.get_json(chassis_uri).await?;
            let chassis_id = doc
                .get("Id")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| chassis_uri.rsplit('/').next().unwrap_or_default().to_string());
            let Some(sensors_uri) = doc.pointer("/Sensors/@odata.id").and_then(Value::as_str) else {
                continue;
            };
            let members = self.collection_members(sensors_uri).await?;
            let sensors: Vec<Sensor> = self.expand_members(members, "Reading", sensors_uri).await?;
            readings.extend(sensors.into_iter().map(|s| {
                let physical_context = s
                    .extra
                    .get("PhysicalContext")
                    .or_else(|| s.resource.extra.get("PhysicalContext"))
                    .and_then(Value::as_str)
                    .map(str::to_string);
                SensorReading {
                    chassis_id: chassis_id.clone(),
                    id: s.resource.id.clone().unwrap_or_else(|| s.resource.odata_id.clone()),
                    kind: match s.reading_type.as_deref() {
                        Some("Temperature") => SensorKind::Temperature,
                        Some("Power") => SensorKind::Power,
                        other => SensorKind::Other(other.unwrap_or_default().to_string()),
                    },
                    reading: s.reading,
                    units: s.reading_units,
                    physical_context,
                    health: s.status.and_then(|st| st.health),
                }
            }));
        }
        Ok(readings)
    }

    async fn read_events(&self, since: &EventCursor) -> Result<EventBatch, BmcError> {
        let entries_uri = self.event_log_entries_uri().await?.clone();
        let members = self.collection_members(&entries_uri).await?;
        let raw: Vec<LogEntry> = self.expand_members(members, "Created", &entries_uri).await?;
        let mut skipped_malformed = 0;
        let mut entries: Vec<EventLogEntry> = raw
            .into_iter()
            .filter_map(|e| {
                let parsed = log_entry(e);
                if parsed.is_none() {
                    skipped_malformed += 1;
                }
                parsed
            })
            .filter(|e| since.is_new(e))
            .collect();
        if skipped_malformed > 0 {
            tracing::warn!(
                endpoint = self.transport.label(),
                skipped_malformed,
                "event log entries without a usable Created/Id"
            );
        }
        entries.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| natural_id_cmp(&a.id, &b.id)));
        let mut cursor = since.clone();
        for e in &entries {
            cursor.advance(e);
        }
        Ok(EventBatch {
            entries,
            cursor,
            skipped_malformed,
        })
    }

    async fn logout(&self) -> Result<(), BmcError> {
        self.transport.logout().await
    }
}

fn odata_id(v: &Value) -> Option<&str> {
    v.get("@odata.id").and_then(Value::as_str)
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

fn string_list(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|x| x.as_str().map(str::to_string).unwrap_or_else(|| x.to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn log_entry(e: LogEntry) -> Option<EventLogEntry> {
    let created: DateTime<Utc> = DateTime::parse_from_rfc3339(e.created.as_deref()?)
        .ok()?
        .with_timezone(&Utc);
    let id = e.resource.id.clone()?;
    let origin = e
        .extra
        .get("Links")
        .or_else(|| e.resource.extra.get("Links"))
        .and_then(|l| l.pointer("/OriginOfCondition/@odata.id"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let args = e
        .extra
        .get("MessageArgs")
        .or_else(|| e.resource.extra.get("MessageArgs"));
    Some(EventLogEntry {
        id,
        created,
        severity: e.severity,
        message: e.message,
        message_id: e.message_id,
        message_args: string_list(args),
        entry_type: e.entry_type,
        sensor_type: e.sensor_type,
        origin,
    })
}

/// Numeric ids compare as numbers ("9" < "10"), anything else as text.
fn natural_id_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(x), Ok(y)) => x.cmp(&y),
        _ => a.cmp(b),
    }
}
