//! What the health reader needs: the system holding the GPUs, its GPU processors and its event log.

use chrono::{DateTime, Utc};
use redfish::types::LogEntry;
use serde_json::Value;

use crate::error::BmcError;
use crate::limits::ReadBudget;
use crate::types::{EventLogEntry, GpuUnit};

use super::{RedfishBmc, last_segment, odata_id, string_list};

/// One member of `Systems` as the driver keeps it: what the health reader and the system reset need,
/// read with one request under `$expand` (one more per member without it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct SystemMember {
    pub(super) uri: String,
    pub(super) id: String,
    pub(super) name: String,
    pub(super) processors: Option<String>,
    pub(super) log_services: Option<String>,
    /// The `#ComputerSystem.Reset` action's target, when the system advertises one.
    pub(super) reset_target: Option<String>,
}

/// One member of `Systems`, as the health reader needs it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct SystemScan {
    pub(super) id: String,
    pub(super) name: String,
    pub(super) gpus: Vec<GpuUnit>,
    pub(super) log_services: Option<String>,
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

/// A GPU `Processor` document as a unit: its id, URI and chassis link.
pub(super) fn gpu_unit(d: &Value) -> Option<GpuUnit> {
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
}

impl RedfishBmc {
    /// Every member of `Systems`, read once per BMC (the layout does not change while a controller
    /// runs): shared by the health reader's scan and the system reset, so a GPU update's reset and
    /// the health polls after it read the collection once between them.
    pub(super) async fn system_members(&self) -> Result<&Vec<SystemMember>, BmcError> {
        self.system_members
            .get_or_try_init(|| async {
                let systems_uri = self.links().await?.systems.clone();
                let budget = ReadBudget::new("systems");
                let members = self.collection_members_expanded(&systems_uri, &budget).await?;
                let mut out = Vec::new();
                for member in members {
                    let Some(uri) = odata_id(&member) else { continue };
                    let doc: Value = if member.get("Id").is_some() {
                        member.clone()
                    } else {
                        self.get_json_in(uri, &budget).await?
                    };
                    let link = |pointer: &str| doc.pointer(pointer).and_then(Value::as_str).map(str::to_string);
                    out.push(SystemMember {
                        uri: uri.to_string(),
                        id: doc
                            .get("Id")
                            .and_then(Value::as_str)
                            .map_or_else(|| last_segment(uri).to_string(), str::to_string),
                        name: doc.get("Name").and_then(Value::as_str).unwrap_or_default().to_string(),
                        processors: link("/Processors/@odata.id"),
                        log_services: link("/LogServices/@odata.id"),
                        reset_target: link("/Actions/#ComputerSystem.Reset/target"),
                    });
                }
                Ok(super::SHARED_SYSTEM_MEMBERS.intern(out))
            })
            .await
            .map(|members| &**members)
    }

    /// Every member of `Systems` with its GPU processors and its LogServices link, read once per BMC:
    /// the hardware layout does not change while a controller runs.
    pub(super) async fn systems_scan(&self) -> Result<&Vec<SystemScan>, BmcError> {
        self.systems
            .get_or_try_init(|| async {
                let budget = ReadBudget::new("GPU processors");
                let mut out = Vec::new();
                for member in self.system_members().await? {
                    let gpus = match &member.processors {
                        Some(processors) => self.gpu_processors(processors, &budget).await?,
                        None => Vec::new(),
                    };
                    out.push(SystemScan {
                        id: member.id.clone(),
                        name: member.name.clone(),
                        gpus,
                        log_services: member.log_services.clone(),
                    });
                }
                Ok(super::SHARED_SYSTEMS.intern(out))
            })
            .await
            .map(|systems| &**systems)
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
            .filter_map(gpu_unit)
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
    pub(super) async fn event_log_entries_uri(&self) -> Result<&String, BmcError> {
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
            let services = match self.collection_members_expanded(services_uri, budget).await {
                Ok(services) => services,
                Err(BmcError::Rejected { status: 404, .. }) => continue,
                Err(err) => return Err(err),
            };
            let mut services: Vec<(&str, &Value)> = services.iter().filter_map(|s| Some((odata_id(s)?, s))).collect();
            // Prefer the event log over SEL/crash-dump style services.
            services.sort_by_key(|(u, _)| !u.trim_end_matches('/').to_ascii_lowercase().ends_with("/eventlog"));
            if let Some((service_uri, service)) = services.first() {
                // An expanded member names its Entries itself: no request for the service.
                if let Some(entries) = service.pointer("/Entries/@odata.id").and_then(Value::as_str) {
                    return Ok(Some(entries.to_string()));
                }
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
}

pub(super) fn log_entry(e: LogEntry) -> Option<EventLogEntry> {
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
