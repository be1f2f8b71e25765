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
use crate::limits::{MAX_COLLECTION_PAGES, ReadBudget};
use crate::transport::{Body, Call, HttpClients, Response, Transport};
use crate::types::{
    ApplyTime, EventBatch, EventCursor, EventLogEntry, FirmwareComponent, GpuUnit, ResetTarget, SensorKind,
    SensorReading, ServiceInfo, TaskHandle, TaskMessage, TaskState, TaskStatus, UpdateMethod, UpdateRequest,
};
use crate::update::{PushCaps, SimpleUpdateCaps, UpdateCapabilities, UpdatePath, choose_update_path};
use crate::{Bmc, ResetKind};

/// How many member GETs one BMC gets at once when a collection lists links only. BMC web servers are
/// small embedded processes; more parallelism mostly earns 503s.
pub(crate) const PER_BMC_FETCH_CONCURRENCY: usize = 2;

// Fixed paths, used only where the service root does not link the resource (the documented
// fallback: every path below is the DMTF-recommended one, which most services use).
const SERVICE_ROOT: &str = "/redfish/v1";
const UPDATE_SERVICE: &str = "/redfish/v1/UpdateService";
const FIRMWARE_INVENTORY: &str = "/redfish/v1/UpdateService/FirmwareInventory";
const SIMPLE_UPDATE: &str = "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate";

/// A push accepted without a task is tracked by reading the inventory; its handle is this URN (stored
/// by the engine like any task URI), carrying the apply time and the versions before the push.
const INVENTORY_WATCH: &str = "urn:waveguard:inventory-watch";

/// Where the service's own links lead, read once per BMC from the service root.
#[derive(Debug, Clone)]
struct ServiceLinks {
    update_service: String,
    /// `TaskService.Tasks`; `None` when the service has no TaskService.
    tasks: Option<String>,
    systems: String,
    chassis: String,
    managers: String,
    /// The `$expand` value this service advertises support for (`ProtocolFeaturesSupported.ExpandQuery`),
    /// used on the collections health reads member by member otherwise.
    expand: Option<&'static str>,
}

/// One member of `Systems`, as the health reader needs it.
#[derive(Debug, Clone)]
struct SystemScan {
    id: String,
    name: String,
    gpus: Vec<GpuUnit>,
    log_services: Option<String>,
}

impl SystemScan {
    /// Whether the system's id or name says it is a GPU baseboard (NVIDIA's `HGX_Baseboard_0`): the
    /// tie-breaker when GPU processors alone do not single out one system.
    fn marks_gpu_baseboard(&self) -> bool {
        [&self.id, &self.name].iter().any(|t| {
            let t = t.to_ascii_uppercase();
            t.contains("HGX") || t.contains("BASEBOARD") || t.contains("GPU")
        })
    }
}

/// The UpdateService facts an update needs, read once per BMC.
#[derive(Debug, Clone)]
struct UpdateServiceInfo {
    firmware_inventory: String,
    caps: UpdateCapabilities,
}

/// A [`Bmc`] reached over Redfish HTTP(S).
///
/// Cheap to share: wrap it in an `Arc` and use it from many tasks; it keeps one session and one
/// connection pool.
#[derive(Debug)]
pub struct RedfishBmc {
    transport: Transport,
    links: OnceCell<ServiceLinks>,
    update_service: OnceCell<UpdateServiceInfo>,
    systems: OnceCell<Vec<SystemScan>>,
    event_log_entries: OnceCell<String>,
    /// The LogService the site named for this BMC ([`BmcEndpoint::event_log`]).
    configured_event_log: Option<String>,
}

impl RedfishBmc {
    /// Prepares a driver for one BMC. Does no I/O: the first request logs in.
    pub fn new(endpoint: &BmcEndpoint, clients: &HttpClients) -> Result<Self, BmcError> {
        Ok(Self {
            transport: Transport::new(endpoint, clients)?,
            links: OnceCell::new(),
            update_service: OnceCell::new(),
            systems: OnceCell::new(),
            event_log_entries: OnceCell::new(),
            configured_event_log: endpoint.event_log.clone(),
        })
    }

    /// Every update path this BMC offers, as read from its UpdateService (cached).
    pub async fn update_capabilities(&self) -> Result<UpdateCapabilities, BmcError> {
        Ok(self.update_service().await?.caps.clone())
    }

    async fn links(&self) -> Result<&ServiceLinks, BmcError> {
        self.links
            .get_or_try_init(|| async {
                let root: Value = match self.transport.get_json(SERVICE_ROOT).await {
                    Ok(root) => root,
                    // A service root that is missing is broken, but its resources may still be at
                    // the DMTF paths: the documented fallback.
                    Err(BmcError::Rejected { status: 404, .. }) => {
                        return Ok(ServiceLinks {
                            update_service: UPDATE_SERVICE.to_string(),
                            tasks: Some("/redfish/v1/TaskService/Tasks".to_string()),
                            systems: "/redfish/v1/Systems".to_string(),
                            chassis: "/redfish/v1/Chassis".to_string(),
                            managers: "/redfish/v1/Managers".to_string(),
                            expand: None,
                        });
                    }
                    Err(err) => return Err(err),
                };
                let link = |key: &str, fallback: &str| {
                    root.pointer(&format!("/{key}/@odata.id"))
                        .and_then(Value::as_str)
                        .unwrap_or(fallback)
                        .to_string()
                };
                // The ServiceRoot schema names the TaskService link `Tasks`; some services say
                // `TaskService`.
                let task_service = root
                    .pointer("/Tasks/@odata.id")
                    .or_else(|| root.pointer("/TaskService/@odata.id"))
                    .and_then(Value::as_str);
                let tasks = match task_service {
                    None => None,
                    Some(task_service) => {
                        let doc: Value = self.transport.get_json(task_service).await?;
                        Some(
                            doc.pointer("/Tasks/@odata.id")
                                .and_then(Value::as_str)
                                .map(str::to_string)
                                .unwrap_or_else(|| format!("{}/Tasks", task_service.trim_end_matches('/'))),
                        )
                    }
                };
                Ok(ServiceLinks {
                    update_service: link("UpdateService", UPDATE_SERVICE),
                    tasks,
                    systems: link("Systems", "/redfish/v1/Systems"),
                    chassis: link("Chassis", "/redfish/v1/Chassis"),
                    managers: link("Managers", "/redfish/v1/Managers"),
                    expand: expand_query(&root),
                })
            })
            .await
    }

    async fn update_service(&self) -> Result<&UpdateServiceInfo, BmcError> {
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

    /// All members of a collection, following `Members@odata.nextLink`. Members are returned as the
    /// BMC sent them: full objects on BMCs that expand, bare `@odata.id` links on the others.
    ///
    /// Bounded by `budget` (bytes, requests, time) and [`MAX_COLLECTION_PAGES`]; a `nextLink` that
    /// names a page already read is an error at its first repeat, so a looping service costs one
    /// extra request, not thousands.
    async fn collection_members(&self, uri: &str, budget: &ReadBudget) -> Result<Vec<Value>, BmcError> {
        let mut members = Vec::new();
        let mut next = Some(uri.to_string());
        let mut seen = std::collections::HashSet::new();
        while let Some(page_uri) = next.take() {
            if !seen.insert(page_uri.clone()) {
                return Err(BmcError::Protocol {
                    endpoint: self.transport.label().to_string(),
                    method: "GET".to_string(),
                    path: uri.to_string(),
                    status: None,
                    reason: format!("Members@odata.nextLink repeats page {page_uri}: the collection loops"),
                    body_snippet: String::new(),
                });
            }
            if seen.len() > MAX_COLLECTION_PAGES {
                return Err(budget.exceeded(
                    self.transport.label(),
                    "pages",
                    format!("{uri} has more than {MAX_COLLECTION_PAGES} pages"),
                ));
            }
            let resp = self.get_ok_in(&page_uri, budget).await?;
            let page: Collection<Value> = self.transport.decode(&resp)?;
            next = page.next_link().map(str::to_string);
            members.extend(page.members);
        }
        Ok(members)
    }

    /// [`Self::collection_members`] with `$expand` when the service advertises it, so a collection of
    /// sensors or processors costs one request instead of one per member. A service that advertises
    /// `$expand` but refuses it (400, 405, 501) is read without.
    async fn collection_members_expanded(&self, uri: &str, budget: &ReadBudget) -> Result<Vec<Value>, BmcError> {
        let Some(expand) = self.links().await?.expand else {
            return self.collection_members(uri, budget).await;
        };
        let sep = if uri.contains('?') { '&' } else { '?' };
        match self
            .collection_members(&format!("{uri}{sep}$expand={expand}"), budget)
            .await
        {
            Err(BmcError::Rejected {
                status: 400 | 405 | 501,
                ..
            }) => self.collection_members(uri, budget).await,
            other => other,
        }
    }

    /// Each member as `T`, fetching it when the collection only linked to it. `inline_key` is a
    /// property whose presence shows that a member is already expanded.
    async fn expand_members<T: DeserializeOwned + Send>(
        &self,
        members: Vec<Value>,
        inline_key: &str,
        path: &str,
        budget: &ReadBudget,
    ) -> Result<Vec<T>, BmcError> {
        stream::iter(members)
            .map(|member| async move {
                if member.get(inline_key).is_some() {
                    return serde_json::from_value::<T>(member).map_err(|e| BmcError::Protocol {
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
                self.get_json_in::<T>(uri, budget).await
            })
            .buffered(PER_BMC_FETCH_CONCURRENCY)
            .try_collect()
            .await
    }

    /// A GET counted against an operation's budget.
    async fn get_ok_in(&self, uri: &str, budget: &ReadBudget) -> Result<Response, BmcError> {
        budget.before_request(self.transport.label())?;
        let resp = self.transport.send(self.transport.get_call(uri)).await?;
        budget.charge(self.transport.label(), resp.body.len())?;
        self.transport.expect_success(resp)
    }

    async fn get_json_in<T: DeserializeOwned>(&self, uri: &str, budget: &ReadBudget) -> Result<T, BmcError> {
        let resp = self.get_ok_in(uri, budget).await?;
        self.transport.decode(&resp)
    }

    /// The `@odata.id` of the member with `id` (or of the first member) of a top-level collection.
    async fn pick_member(&self, collection: &str, id: Option<&str>) -> Result<String, BmcError> {
        let members = self
            .collection_members(collection, &ReadBudget::new("collection listing"))
            .await?;
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

    /// Every member of `Systems` with its GPU processors and its LogServices link, read once per BMC:
    /// the hardware layout does not change while a controller runs.
    async fn systems_scan(&self) -> Result<&Vec<SystemScan>, BmcError> {
        self.systems
            .get_or_try_init(|| async {
                let systems_uri = self.links().await?.systems.clone();
                let budget = ReadBudget::new("systems and GPU processors");
                let members = self.collection_members(&systems_uri, &budget).await?;
                let mut out = Vec::new();
                for member in members {
                    let Some(uri) = odata_id(&member) else { continue };
                    let doc: Value = self.get_json_in(uri, &budget).await?;
                    let gpus = match doc.pointer("/Processors/@odata.id").and_then(Value::as_str) {
                        Some(processors) => self.gpu_processors(processors, &budget).await?,
                        None => Vec::new(),
                    };
                    out.push(SystemScan {
                        id: doc
                            .get("Id")
                            .and_then(Value::as_str)
                            .map_or_else(|| last_segment(uri).to_string(), str::to_string),
                        name: doc.get("Name").and_then(Value::as_str).unwrap_or_default().to_string(),
                        gpus,
                        log_services: doc
                            .pointer("/LogServices/@odata.id")
                            .and_then(Value::as_str)
                            .map(str::to_string),
                    });
                }
                Ok(out)
            })
            .await
    }

    /// The Processors of one system whose `ProcessorType` is `GPU`; a system whose Processors link
    /// leads nowhere (404) has none.
    async fn gpu_processors(&self, processors: &str, budget: &ReadBudget) -> Result<Vec<GpuUnit>, BmcError> {
        let members = match self.collection_members_expanded(processors, budget).await {
            Ok(members) => members,
            Err(BmcError::Rejected { status: 404, .. }) => return Ok(Vec::new()),
            Err(err) => return Err(err),
        };
        let docs: Vec<Value> = self.expand_members(members, "Id", processors, budget).await?;
        Ok(docs
            .iter()
            .filter(|d| d.get("ProcessorType").and_then(Value::as_str) == Some("GPU"))
            .filter_map(|d| {
                let uri = odata_id(d)?.trim_end_matches('/').to_string();
                Some(GpuUnit {
                    id: d
                        .get("Id")
                        .and_then(Value::as_str)
                        .map_or_else(|| last_segment(&uri).to_string(), str::to_string),
                    chassis: d
                        .pointer("/Links/Chassis")
                        .and_then(|c| if c.is_array() { c.get(0) } else { Some(c) })
                        .and_then(odata_id)
                        .map(|c| c.trim_end_matches('/').to_string()),
                    uri,
                })
            })
            .collect())
    }

    /// The entries collection of the log that holds GPU events. In order:
    ///
    /// 1. the LogService the site configured for this BMC ([`BmcEndpoint::event_log`]);
    /// 2. among all `Systems` members, the one whose Processors include GPUs (the DMTF model puts a
    ///    device's events in the log of the system it belongs to), ties broken by an id or name that
    ///    marks a GPU baseboard, then by collection order; within it the LogService with the DMTF
    ///    conventional id `EventLog`, else its first. On a DGX this is
    ///    `Systems/HGX_Baseboard_0/LogServices/EventLog`, not the host's (listed first) BIOS/SEL log;
    /// 3. the first manager's log, for services that log there only.
    async fn event_log_entries_uri(&self) -> Result<&String, BmcError> {
        self.event_log_entries
            .get_or_try_init(|| async {
                let budget = ReadBudget::new("event log discovery");
                if let Some(configured) = &self.configured_event_log {
                    return self.entries_of(configured, &budget).await;
                }
                let systems = self.systems_scan().await?;
                let mut owners: Vec<&SystemScan> = systems.iter().filter(|s| s.log_services.is_some()).collect();
                // Stable: collection order decides among equals.
                owners.sort_by_key(|s| (s.gpus.is_empty(), !s.marks_gpu_baseboard()));
                let candidates: Vec<String> = owners.iter().filter_map(|s| s.log_services.clone()).collect();
                if let Some(entries) = self.first_log_of(&candidates, &budget).await? {
                    return Ok(entries);
                }
                let managers = self.links().await?.managers.clone();
                if let Ok(manager) = self.pick_member(&managers, None).await {
                    let doc: Value = self.get_json_in(&manager, &budget).await?;
                    if let Some(services) = doc.pointer("/LogServices/@odata.id").and_then(Value::as_str)
                        && let Some(entries) = self.first_log_of(&[services.to_string()], &budget).await?
                    {
                        return Ok(entries);
                    }
                }
                Err(BmcError::Unsupported {
                    endpoint: self.transport.label().to_string(),
                    feature: "an event log (LogServices under Systems or Managers)".to_string(),
                })
            })
            .await
    }

    /// The entries of the preferred log service in the first of `collections` (LogService collections)
    /// that has one.
    async fn first_log_of(&self, collections: &[String], budget: &ReadBudget) -> Result<Option<String>, BmcError> {
        for services_uri in collections {
            let services = match self.collection_members(services_uri, budget).await {
                Ok(services) => services,
                Err(BmcError::Rejected { status: 404, .. }) => continue,
                Err(err) => return Err(err),
            };
            let mut uris: Vec<&str> = services.iter().filter_map(odata_id).collect();
            // Prefer the event log over SEL/crash-dump style services.
            uris.sort_by_key(|u| !u.trim_end_matches('/').to_ascii_lowercase().ends_with("/eventlog"));
            if let Some(service_uri) = uris.first() {
                return self.entries_of(service_uri, budget).await.map(Some);
            }
        }
        Ok(None)
    }

    /// The `Entries` collection of a LogService (given by its `@odata.id`, or already its Entries).
    async fn entries_of(&self, service_uri: &str, budget: &ReadBudget) -> Result<String, BmcError> {
        let service_uri = service_uri.trim_end_matches('/');
        if service_uri.ends_with("/Entries") {
            return Ok(service_uri.to_string());
        }
        let service: Value = self.get_json_in(service_uri, budget).await?;
        Ok(service
            .pointer("/Entries/@odata.id")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("{service_uri}/Entries")))
    }

    async fn simple_update(
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

    async fn multipart_push(
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
    async fn update_from_uri(
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
        // Versions before the push: if the BMC answers without a task, the inventory is the only way
        // to see the update land.
        let before = self.firmware_inventory().await?;
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
    async fn poll_inventory_watch(&self, uri: &str) -> Result<TaskStatus, BmcError> {
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

    /// Where to follow an accepted update or reset: the `Location` task monitor (DMTF pattern), else
    /// a Task in the body. `None`: the BMC accepted it without a task (200/204 on many BMCs).
    fn task_handle_from(&self, resp: &Response) -> Result<Option<TaskHandle>, BmcError> {
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

    async fn post_action(&self, uri: &str, body: Body, timeout: Duration) -> Result<Response, BmcError> {
        let call = Call {
            method: Method::POST,
            uri: uri.to_string(),
            body,
            // Re-sending an update or a reset whose answer was lost could flash or reboot twice.
            idempotent: false,
            timeout,
            retry: self.transport.retry,
            if_match: None,
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
            if_match: None,
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
        let inventory_uri = self.update_service().await?.firmware_inventory.clone();
        let budget = ReadBudget::new("firmware inventory");
        let members = self.collection_members(&inventory_uri, &budget).await?;
        let items: Vec<SoftwareInventory> = self.expand_members(members, "Version", &inventory_uri, &budget).await?;
        items
            .into_iter()
            .map(|item| {
                let uri = item.odata_id.clone().ok_or_else(|| BmcError::Protocol {
                    endpoint: self.transport.label().to_string(),
                    method: "GET".to_string(),
                    path: inventory_uri.clone(),
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
                    id: stable_inventory_id(&id),
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
                    related_items: item
                        .extra
                        .get("RelatedItem")
                        .and_then(serde_json::Value::as_array)
                        .map(|links| {
                            links
                                .iter()
                                .filter_map(|l| l.get("@odata.id").and_then(serde_json::Value::as_str))
                                .map(str::to_owned)
                                .collect()
                        })
                        .unwrap_or_default(),
                    name: item.name,
                })
            })
            .collect()
    }

    async fn update_capabilities(&self) -> Result<UpdateCapabilities, BmcError> {
        // The inherent method (callers holding the concrete driver use it too).
        RedfishBmc::update_capabilities(self).await
    }

    async fn start_update(&self, request: &UpdateRequest) -> Result<TaskHandle, BmcError> {
        let info = self.update_service().await?.clone();
        let resp = match &request.method {
            UpdateMethod::SimpleUpdate {
                image_uri,
                transfer_protocol,
            } => {
                let target = info
                    .caps
                    .simple_update
                    .as_ref()
                    .map_or(SIMPLE_UPDATE, |su| su.target.as_str());
                self.simple_update(
                    target,
                    image_uri,
                    transfer_protocol.clone(),
                    request.apply_time,
                    request,
                )
                .await?
            }
            UpdateMethod::MultipartPush { image, filename } => {
                let push_uri = info.caps.multipart.as_ref().ok_or_else(|| BmcError::Unsupported {
                    endpoint: self.transport.label().to_string(),
                    feature: "multipart HTTP push (no MultipartHttpPushUri)".to_string(),
                })?;
                self.multipart_push(&push_uri.uri, image.clone(), filename, request.apply_time, request)
                    .await?
            }
            UpdateMethod::FromImageUri { image_uri, .. } => {
                return self.update_from_uri(&info, request, image_uri).await;
            }
        };
        self.task_handle_from(&resp)?.ok_or_else(|| {
            self.transport.protocol(
                &resp,
                "update accepted without a task monitor (no Location, no Task body)",
            )
        })
    }

    async fn list_tasks(&self) -> Result<Vec<String>, BmcError> {
        let Some(tasks) = self.links().await?.tasks.clone() else {
            // The engine then resolves an ambiguous push from the inventory instead.
            return Err(BmcError::Unsupported {
                endpoint: self.transport.label().to_string(),
                feature: "a TaskService (the service root links none)".to_string(),
            });
        };
        let budget = ReadBudget::new("task list");
        let members = self.collection_members(&tasks, &budget).await?;
        Ok(members.iter().filter_map(odata_id).map(str::to_string).collect())
    }

    async fn poll_task(&self, task: &TaskHandle) -> Result<TaskStatus, BmcError> {
        let uri = task.poll_uri();
        if uri.starts_with(INVENTORY_WATCH) {
            return self.poll_inventory_watch(uri).await;
        }
        let resp = self.transport.send(self.transport.get_call(uri)).await?;
        let resp = self.transport.expect_success(resp)?;
        self.task_status_from(&resp, uri)
    }

    async fn reset(&self, target: &ResetTarget, kind: ResetKind) -> Result<Option<TaskHandle>, BmcError> {
        let links = self.links().await?;
        let (collection, id, action) = match target {
            ResetTarget::Manager(id) => (links.managers.as_str(), id.as_deref(), "#Manager.Reset"),
            ResetTarget::System(id) => (links.systems.as_str(), id.as_deref(), "#ComputerSystem.Reset"),
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
            Ok(self.task_handle_from(&resp).ok().flatten())
        } else {
            Ok(None)
        }
    }

    async fn read_sensors(&self) -> Result<Vec<SensorReading>, BmcError> {
        let chassis_uri = self.links().await?.chassis.clone();
        let budget = ReadBudget::new("sensors");
        let chassis = self.collection_members(&chassis_uri, &budget).await?;
        let mut readings = Vec::new();
        for member in chassis {
            let Some(chassis_uri) = odata_id(&member) else { continue };
            let doc: Value = self.get_json_in(chassis_uri, &budget).await?;
            let chassis_id = doc
                .get("Id")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| chassis_uri.rsplit('/').next().unwrap_or_default().to_string());
            let Some(sensors_uri) = doc.pointer("/Sensors/@odata.id").and_then(Value::as_str) else {
                continue;
            };
            let members = self.collection_members_expanded(sensors_uri, &budget).await?;
            let sensors: Vec<Sensor> = self.expand_members(members, "Reading", sensors_uri, &budget).await?;
            readings.extend(sensors.into_iter().map(|s| {
                let physical_context = s
                    .extra
                    .get("PhysicalContext")
                    .or_else(|| s.resource.extra.get("PhysicalContext"))
                    .and_then(Value::as_str)
                    .map(str::to_string);
                let related = s
                    .extra
                    .get("RelatedItem")
                    .or_else(|| s.resource.extra.get("RelatedItem"))
                    .and_then(Value::as_array)
                    .map(|items| {
                        items
                            .iter()
                            .filter_map(odata_id)
                            .map(|u| u.trim_end_matches('/').to_string())
                            .collect()
                    })
                    .unwrap_or_default();
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
                    related,
                }
            }));
        }
        Ok(readings)
    }

    async fn gpus(&self) -> Result<Vec<GpuUnit>, BmcError> {
        Ok(self
            .systems_scan()
            .await?
            .iter()
            .flat_map(|s| s.gpus.iter().cloned())
            .collect())
    }

    async fn read_events(&self, since: &EventCursor) -> Result<EventBatch, BmcError> {
        let entries_uri = self.event_log_entries_uri().await?.clone();
        let budget = ReadBudget::new("event log");
        let members = self.collection_members_expanded(&entries_uri, &budget).await?;
        let raw: Vec<LogEntry> = self.expand_members(members, "Created", &entries_uri, &budget).await?;
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

fn last_segment(uri: &str) -> &str {
    uri.trim_end_matches('/').rsplit('/').next().unwrap_or_default()
}

/// The `$expand` value to send, from the service root's `ProtocolFeaturesSupported.ExpandQuery`
/// (DSP0266 "Query parameters"): `.` (subordinate resources, which collection members are) where
/// `NoLinks` is supported, else `*` where `ExpandAll` is; one level when `Levels` is supported.
fn expand_query(root: &Value) -> Option<&'static str> {
    let q = root.pointer("/ProtocolFeaturesSupported/ExpandQuery")?;
    let yes = |key: &str| q.get(key).and_then(Value::as_bool) == Some(true);
    let levels = yes("Levels");
    if yes("NoLinks") {
        Some(if levels { ".($levels=1)" } else { "." })
    } else if yes("ExpandAll") {
        Some(if levels { "*($levels=1)" } else { "*" })
    } else {
        None
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

/// Dell puts the version into inventory ids (`Installed-<ComponentID>-<Version>__<FQDD>`), so the id
/// of a component changes with every flash and the post-flash read-back would not find it. The
/// version is dropped (`Installed-<ComponentID>__<FQDD>`): the ComponentID and FQDD identify the
/// component. Other ids are returned unchanged.
pub(crate) fn stable_inventory_id(id: &str) -> String {
    let Some((left, fqdd)) = id.split_once("__") else {
        return id.to_string();
    };
    let Some((state, rest)) = left.split_once('-') else {
        return id.to_string();
    };
    let Some((component, version)) = rest.split_once('-') else {
        return id.to_string();
    };
    let dell_state = matches!(state, "Installed" | "Previous" | "Current" | "Available");
    if dell_state && !component.is_empty() && component.bytes().all(|b| b.is_ascii_digit()) && !version.is_empty() {
        format!("{state}-{component}__{fqdd}")
    } else {
        id.to_string()
    }
}

fn non_empty_str(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
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
    fn dell_version_bearing_ids_become_stable_and_others_stay() {
        assert_eq!(
            stable_inventory_id("Installed-25227-6.10.30.00__iDRAC.Embedded.1-1"),
            "Installed-25227__iDRAC.Embedded.1-1"
        );
        assert_eq!(
            stable_inventory_id("Installed-25227-7.00.00.00__iDRAC.Embedded.1-1"),
            stable_inventory_id("Installed-25227-6.10.30.00__iDRAC.Embedded.1-1"),
            "the same component before and after a flash"
        );
        assert_eq!(
            stable_inventory_id("Previous-159-2.19.1__BIOS.Setup.1-1"),
            "Previous-159__BIOS.Setup.1-1"
        );
        for unchanged in [
            "HGX_FW_GPU_SXM_1",
            "Installed-25227__iDRAC.Embedded.1-1",
            "a-b-c__d",
            "BMC_Firmware",
        ] {
            assert_eq!(stable_inventory_id(unchanged), unchanged);
        }
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
