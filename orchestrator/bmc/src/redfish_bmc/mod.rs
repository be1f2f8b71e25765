//! [`RedfishBmc`]: the [`Bmc`] trait over real Redfish HTTP.
//!
//! This module holds the driver, its reads of the service's links and collections, and the [`Bmc`]
//! implementation; `push` starts updates and tracks them (tasks, or the inventory where a BMC gives
//! none), `health` finds the GPUs and the event log the health reader uses.

mod health;
mod parts;
mod push;

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{self, StreamExt, TryStreamExt};
use redfish::types::{Collection, LogEntry, Sensor, ServiceRoot, SoftwareInventory};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::OnceCell;

use crate::clients::HttpClients;
use crate::config::{BmcEndpoint, RetryPolicy};
use crate::error::BmcError;
use crate::interner::Interner;
use crate::limits::{MAX_COLLECTION_PAGES, PER_BMC_FETCH_CONCURRENCY, ReadBudget};
use crate::transport::{Body, Call, Response, Transport};
use crate::types::{
    DiagnosticData, DiagnosticDataType, EventBatch, EventCursor, EventLogEntry, FirmwareComponent, GpuPart, GpuUnit,
    ResetTarget, SensorKind, SensorReading, ServiceInfo, TaskHandle, TaskStatus, UpdateMethod, UpdateRequest,
};
use crate::update::UpdateCapabilities;
use crate::{Bmc, ResetKind};

use self::health::{SystemMember, SystemScan, log_entry};
use self::push::{INVENTORY_WATCH, UpdateServiceInfo};

// Fixed paths, used only where the service root does not link the resource (the documented
// fallback: every path below is the DMTF-recommended one, which most services use).
const SERVICE_ROOT: &str = "/redfish/v1";
const UPDATE_SERVICE: &str = "/redfish/v1/UpdateService";
const FIRMWARE_INVENTORY: &str = "/redfish/v1/UpdateService/FirmwareInventory";
const SIMPLE_UPDATE: &str = "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate";

/// Where the service's own links lead, read once per BMC from the service root.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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

/// Each chassis that holds sensors, by id, with the URI of its Sensors collection.
type SensorCollections = Arc<Vec<(String, String)>>;

// What BMCs of one platform all report alike, stored once for the fleet rather than once per driver.
static SHARED_LINKS: LazyLock<Interner<ServiceLinks>> = LazyLock::new(Interner::default);
static SHARED_SYSTEMS: LazyLock<Interner<Vec<SystemScan>>> = LazyLock::new(Interner::default);
static SHARED_SYSTEM_MEMBERS: LazyLock<Interner<Vec<SystemMember>>> = LazyLock::new(Interner::default);
static SHARED_SENSOR_COLLECTIONS: LazyLock<Interner<Vec<(String, String)>>> = LazyLock::new(Interner::default);

/// A [`Bmc`] reached over Redfish HTTP(S).
///
/// Cheap to share: wrap it in an `Arc` and use it from many tasks; it keeps one session and one
/// connection pool.
#[derive(Debug)]
pub struct RedfishBmc {
    transport: Transport,
    links: OnceCell<Arc<ServiceLinks>>,
    update_service: OnceCell<UpdateServiceInfo>,
    systems: OnceCell<Arc<Vec<SystemScan>>>,
    system_members: OnceCell<Arc<Vec<SystemMember>>>,
    /// Each chassis with sensors and its Sensors collection, found by walking the chassis once: a
    /// health poll then reads only the sensor collections (one request each with `$expand`), not the
    /// chassis collection and every chassis again. Forgotten when a collection is gone (404).
    sensor_collections: std::sync::Mutex<Option<SensorCollections>>,
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
            system_members: OnceCell::new(),
            sensor_collections: std::sync::Mutex::new(None),
            event_log_entries: OnceCell::new(),
            configured_event_log: endpoint.event_log.clone(),
        })
    }

    /// Each chassis that has sensors, with its Sensors collection (see `sensor_collections`).
    async fn sensor_collections(&self, budget: &ReadBudget) -> Result<SensorCollections, BmcError> {
        if let Some(known) = self
            .sensor_collections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Ok(known);
        }
        let chassis_uri = self.links().await?.chassis.clone();
        let chassis = self.collection_members_expanded(&chassis_uri, budget).await?;
        let mut found = Vec::new();
        for member in chassis {
            let Some(chassis_uri) = odata_id(&member) else { continue };
            let doc: Value = if member.get("Id").is_some() {
                member.clone()
            } else {
                self.get_json_in(chassis_uri, budget).await?
            };
            let chassis_id = doc
                .get("Id")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| chassis_uri.rsplit('/').next().unwrap_or_default().to_string());
            if let Some(sensors_uri) = doc.pointer("/Sensors/@odata.id").and_then(Value::as_str) {
                found.push((chassis_id, sensors_uri.to_string()));
            }
        }
        let found = SHARED_SENSOR_COLLECTIONS.intern(found);
        // A BMC still starting up may list its chassis before their sensors: no sensors is not
        // remembered, so the next poll looks again.
        if !found.is_empty() {
            *self.sensor_collections.lock().unwrap_or_else(|p| p.into_inner()) = Some(found.clone());
        }
        Ok(found)
    }

    /// Every update path this BMC offers, as read from its UpdateService (cached).
    pub async fn update_capabilities(&self) -> Result<UpdateCapabilities, BmcError> {
        Ok(self.update_service().await?.caps.clone())
    }

    async fn links(&self) -> Result<&ServiceLinks, BmcError> {
        self.links
            .get_or_try_init(|| async { Ok(SHARED_LINKS.intern(self.read_links().await?)) })
            .await
            .map(|links| &**links)
    }

    async fn read_links(&self) -> Result<ServiceLinks, BmcError> {
        {
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
        }
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
        member_by_id(&uris, |u| u, id)
            .map(|u| u.to_string())
            .ok_or_else(|| self.no_member(collection, id))
    }

    /// `collection` has no member `id` (no member at all without an id).
    fn no_member(&self, collection: &str, id: Option<&str>) -> BmcError {
        BmcError::Unsupported {
            endpoint: self.transport.label().to_string(),
            feature: format!("{collection} member {}", id.unwrap_or("(any)")),
        }
    }

    /// The target of `action` on the `id` member of `collection` (its first without an id), read
    /// from the member itself; the DMTF conventional path when the member advertises none.
    async fn read_reset_target(&self, collection: &str, id: Option<&str>, action: &str) -> Result<String, BmcError> {
        let member = self.pick_member(collection, id).await?;
        let doc: Value = self.transport.get_json(&member).await?;
        Ok(doc
            .pointer(&format!("/Actions/{}/target", action.replace('/', "~1")))
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("{}/Actions/{}", member.trim_end_matches('/'), &action[1..])))
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
        // With `$expand` the whole inventory is one request instead of one per component (a GPU
        // node lists nine or more), read before and after every flash.
        let members = self.collection_members_expanded(&inventory_uri, &budget).await?;
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
        let body = serde_json::json!({ "ResetType": kind.as_redfish() });
        let send = |action_uri: String| {
            let body = Body::json(&body);
            async move {
                self.post_action(&action_uri, body, self.transport.timeouts.request)
                    .await
            }
        };
        let resp = match target {
            // A system's reset target comes from the Systems members the driver keeps (the health
            // reader reads the same collection), so a GPU update's reset costs the POST alone once
            // the collection is known. A target that is gone (404: the layout changed) is looked
            // up afresh once; a 404 means nothing was reset, so sending again is safe.
            ResetTarget::System(id) => {
                let members = self.system_members().await?;
                let Some(member) = member_by_id(members, |m| &m.uri, id.as_deref()) else {
                    return Err(self.no_member(&self.links().await?.systems, id.as_deref()));
                };
                let known = member
                    .reset_target
                    .clone()
                    .unwrap_or_else(|| format!("{}/Actions/ComputerSystem.Reset", member.uri.trim_end_matches('/')));
                match send(known).await {
                    Err(BmcError::Rejected { status: 404, .. }) => {
                        let systems = self.links().await?.systems.clone();
                        send(
                            self.read_reset_target(&systems, id.as_deref(), "#ComputerSystem.Reset")
                                .await?,
                        )
                        .await
                    }
                    other => other,
                }
            }
            ResetTarget::Manager(id) => {
                let managers = self.links().await?.managers.clone();
                send(
                    self.read_reset_target(&managers, id.as_deref(), "#Manager.Reset")
                        .await?,
                )
                .await
            }
        }?;
        if resp.status == StatusCode::ACCEPTED {
            Ok(self.task_handle_from(&resp).ok().flatten())
        } else {
            Ok(None)
        }
    }

    async fn read_sensors(&self) -> Result<Vec<SensorReading>, BmcError> {
        let budget = ReadBudget::new("sensors");
        let collections = self.sensor_collections(&budget).await?;
        let mut readings = Vec::new();
        for (chassis_id, sensors_uri) in collections.iter() {
            let members = match self.collection_members_expanded(sensors_uri, &budget).await {
                Ok(members) => members,
                Err(err) => {
                    // The layout may have changed (a chassis replaced or renumbered): the next read
                    // walks the chassis again.
                    if matches!(err, BmcError::Rejected { status: 404, .. }) {
                        *self.sensor_collections.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    }
                    return Err(err);
                }
            };
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

    async fn gpu_parts(&self) -> Result<Vec<GpuPart>, BmcError> {
        self.read_gpu_parts().await
    }

    async fn collect_diagnostic_data(&self, kind: DiagnosticDataType) -> Result<DiagnosticData, BmcError> {
        self.collect_diagnostics(kind).await
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

/// The member of a collection whose URI ends in `id`, or the first without an id: how a reset target
/// or a member is named (`ResetTarget`'s ids are the last path segment).
fn member_by_id<'a, T>(members: &'a [T], uri: impl Fn(&T) -> &str, id: Option<&str>) -> Option<&'a T> {
    match id {
        Some(id) => members.iter().find(|m| last_segment(uri(m)) == id),
        None => members.first(),
    }
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

fn string_list(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|x| x.as_str().map(str::to_string).unwrap_or_else(|| x.to_string()))
                .collect()
        })
        .unwrap_or_default()
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
