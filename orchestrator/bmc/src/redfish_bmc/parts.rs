//! What the RMA pipeline reads: each GPU as a part (serial, part number, production date) and the
//! BMC's diagnostic data (`LogService.CollectDiagnosticData`).
//!
//! Both follow the service's links: GPUs are the `Processor`s with `ProcessorType` `GPU` under any
//! system; the production date is on the Processor's `Assembly` (Processor v1_10 on), since
//! `Processor` itself has none. Diagnostic data comes from the first log service whose `Actions`
//! advertise `#LogService.CollectDiagnosticData` (the GPU event log's system first).

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use serde_json::Value;

use crate::error::BmcError;
use crate::limits::ReadBudget;
use crate::transport::Body;
use crate::types::{DiagnosticData, DiagnosticDataType, GpuPart, TaskHandle};

use super::{RedfishBmc, odata_id};

/// Largest diagnostic archive read; vendors' dumps are a few MiB, and the evidence package caps the
/// whole at 256 MiB.
pub const MAX_DIAGNOSTIC_BYTES: usize = 16 * 1024 * 1024;
/// How long a diagnostic collection may run on the BMC.
const DIAGNOSTIC_TIMEOUT: Duration = Duration::from_secs(600);
const DIAGNOSTIC_POLL: Duration = Duration::from_millis(500);
const COLLECT_ACTION: &str = "#LogService.CollectDiagnosticData";

fn text(doc: &Value, pointer: &str) -> Option<String> {
    doc.pointer(pointer)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

fn date(doc: &Value, pointer: &str) -> Option<DateTime<Utc>> {
    let raw = doc.pointer(pointer)?.as_str()?;
    DateTime::parse_from_rfc3339(raw)
        .ok()
        .map(|d| d.with_timezone(&Utc))
        .or_else(|| {
            chrono::NaiveDate::parse_from_str(raw.get(..10)?, "%Y-%m-%d")
                .ok()?
                .and_hms_opt(0, 0, 0)
                .map(|d| d.and_utc())
        })
}

impl RedfishBmc {
    pub(super) async fn read_gpu_parts(&self) -> Result<Vec<GpuPart>, BmcError> {
        let systems_uri = self.links().await?.systems.clone();
        let budget = ReadBudget::new("GPU part inventory");
        let members = self.collection_members(&systems_uri, &budget).await?;
        let mut out = Vec::new();
        for member in members {
            let Some(uri) = odata_id(&member) else { continue };
            let system: Value = self.get_json_in(uri, &budget).await?;
            let Some(processors) = system.pointer("/Processors/@odata.id").and_then(Value::as_str) else {
                continue;
            };
            let members = match self.collection_members_expanded(processors, &budget).await {
                Ok(m) => m,
                Err(BmcError::Rejected { status: 404, .. }) => continue,
                Err(e) => return Err(e),
            };
            let docs: Vec<Value> = self.expand_members(members, "Id", processors, &budget).await?;
            for doc in docs
                .iter()
                .filter(|d| d.get("ProcessorType").and_then(Value::as_str) == Some("GPU"))
            {
                let Some(unit) = super::health::gpu_unit(doc) else {
                    continue;
                };
                let assembly = match doc.pointer("/Assembly/@odata.id").and_then(Value::as_str) {
                    // An Assembly that cannot be read costs the production date only.
                    Some(a) => match self.get_json_in::<Value>(a, &budget).await {
                        Ok(v) => v.pointer("/Assemblies/0").cloned(),
                        Err(e) if !e.is_controller_fault() => {
                            tracing::debug!(endpoint = self.transport.label(), error = %e, "GPU assembly unreadable");
                            None
                        }
                        Err(e) => return Err(e),
                    },
                    None => None,
                };
                let from_assembly = |key: &str| assembly.as_ref().and_then(|a| text(a, &format!("/{key}")));
                out.push(GpuPart {
                    serial_number: text(doc, "/SerialNumber").or_else(|| from_assembly("SerialNumber")),
                    part_number: text(doc, "/PartNumber").or_else(|| from_assembly("PartNumber")),
                    manufacturer: text(doc, "/Manufacturer").or_else(|| from_assembly("Vendor")),
                    model: text(doc, "/Model").or_else(|| from_assembly("Model")),
                    firmware_version: text(doc, "/FirmwareVersion"),
                    health: text(doc, "/Status/Health"),
                    state: text(doc, "/Status/State"),
                    production_date: assembly.as_ref().and_then(|a| date(a, "/ProductionDate")),
                    unit,
                });
            }
        }
        Ok(out)
    }

    /// The `CollectDiagnosticData` target and the allowable types of each log service offering it,
    /// the GPU system's first.
    async fn diagnostic_targets(&self, budget: &ReadBudget) -> Result<Vec<(String, Vec<String>)>, BmcError> {
        let mut services: Vec<String> = Vec::new();
        let systems = self.systems_scan().await?;
        let mut ordered: Vec<_> = systems.iter().collect();
        // GPU systems first: their log holds the GPUs' events.
        ordered.sort_by_key(|s| s.gpus.is_empty());
        services.extend(ordered.iter().filter_map(|s| s.log_services.clone()));
        let managers = self.links().await?.managers.clone();
        for m in self.collection_members(&managers, budget).await? {
            let Some(uri) = odata_id(&m) else { continue };
            let doc: Value = self.get_json_in(uri, budget).await?;
            if let Some(l) = doc.pointer("/LogServices/@odata.id").and_then(Value::as_str) {
                services.push(l.to_owned());
            }
        }
        let mut out = Vec::new();
        for collection in services {
            let members = match self.collection_members(&collection, budget).await {
                Ok(m) => m,
                Err(BmcError::Rejected { status: 404, .. }) => continue,
                Err(e) => return Err(e),
            };
            for member in members {
                let Some(uri) = odata_id(&member) else { continue };
                let doc: Value = self.get_json_in(uri, budget).await?;
                let Some(action) = doc.pointer(&format!("/Actions/{COLLECT_ACTION}")) else {
                    continue;
                };
                let target = action
                    .get("target")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .unwrap_or_else(|| {
                        format!("{}/Actions/LogService.CollectDiagnosticData", uri.trim_end_matches('/'))
                    });
                let allowed = action
                    .get("DiagnosticDataType@Redfish.AllowableValues")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                    .unwrap_or_default();
                out.push((target, allowed));
            }
        }
        Ok(out)
    }

    pub(super) async fn collect_diagnostics(&self, kind: DiagnosticDataType) -> Result<DiagnosticData, BmcError> {
        let budget = ReadBudget::new("diagnostic data");
        let kind_text = match kind {
            DiagnosticDataType::Manager => "Manager",
            DiagnosticDataType::Oem => "OEM",
        };
        let targets = self.diagnostic_targets(&budget).await?;
        // A service that lists no allowable values accepts what the schema allows.
        let Some((target, _)) = targets
            .into_iter()
            .find(|(_, allowed)| allowed.is_empty() || allowed.iter().any(|a| a == kind_text))
        else {
            return Err(BmcError::Unsupported {
                endpoint: self.transport.label().to_string(),
                feature: format!("LogService.CollectDiagnosticData with DiagnosticDataType {kind_text}"),
            });
        };
        let body = serde_json::json!({ "DiagnosticDataType": kind_text });
        let resp = self
            .post_action(&target, Body::json(&body), self.transport.timeouts.request)
            .await?;
        let entry_uri = if resp.status == StatusCode::ACCEPTED {
            let task = self
                .task_handle_from(&resp)?
                .ok_or_else(|| self.protocol(&target, "202 without a task monitor"))?;
            crate::wait_for_task(self, &task, DIAGNOSTIC_POLL, DIAGNOSTIC_TIMEOUT).await?;
            self.created_entry(&task, &budget).await?
        } else {
            resp.headers
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
                .ok_or_else(|| self.protocol(&target, "answered without a task or the new entry's Location"))?
        };
        let entry: Value = self.get_json_in(&entry_uri, &budget).await?;
        let data_uri = text(&entry, "/AdditionalDataURI")
            .ok_or_else(|| self.protocol(&entry_uri, "the diagnostic log entry has no AdditionalDataURI"))?;
        let data_budget = ReadBudget::new("diagnostic data download");
        let resp = self.get_ok_in(&data_uri, &data_budget).await?;
        if resp.body.len() > MAX_DIAGNOSTIC_BYTES {
            return Err(self.protocol(&data_uri, "diagnostic data is larger than the controller reads"));
        }
        Ok(DiagnosticData {
            created: date(&entry, "/Created"),
            entry_uri,
            data_uri,
            bytes: resp.body.to_vec(),
        })
    }

    /// The log entry a finished collection created, from the most explicit statement a service
    /// makes: the task's `Links.CreatedResources` (Task v1_8), its `Payload.HttpHeaders` `Location`,
    /// the task monitor's own final answer (DSP0266: once done, the monitor answers as the
    /// operation would have, with the new entry's `Location`), else a message argument naming a
    /// log entry.
    async fn created_entry(&self, task: &TaskHandle, budget: &ReadBudget) -> Result<String, BmcError> {
        let doc: Value = self.get_json_in(task.poll_uri(), budget).await?;
        if let Some(created) = doc
            .pointer("/Links/CreatedResources")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find_map(|r| odata_id(r))
        {
            return Ok(created.to_owned());
        }
        let from_headers = doc
            .pointer("/Payload/HttpHeaders")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .find_map(|h| {
                let (name, value) = h.split_once(':')?;
                name.trim()
                    .eq_ignore_ascii_case("Location")
                    .then(|| value.trim().to_owned())
            });
        let from_messages = || {
            doc.get("Messages")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|m| m.get("MessageArgs").and_then(Value::as_array))
                .flatten()
                .filter_map(Value::as_str)
                .find(|a| a.contains("/LogServices/") && a.contains("/Entries/"))
                .map(str::to_owned)
        };
        if let Some(location) = from_headers {
            return Ok(location);
        }
        // A monitor that is gone once read is not an error: the messages may still name the entry.
        let from_monitor = match self.get_ok_in(&task.monitor_uri, budget).await {
            Ok(resp) => resp
                .headers
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
                .filter(|l| l != &task.monitor_uri && l != task.poll_uri()),
            Err(e) if e.is_controller_fault() => return Err(e),
            Err(_) => None,
        };
        from_monitor.or_else(from_messages).ok_or_else(|| {
            self.protocol(
                task.poll_uri(),
                "the finished task does not say which log entry it created",
            )
        })
    }

    fn protocol(&self, path: &str, reason: &str) -> BmcError {
        BmcError::Protocol {
            endpoint: self.transport.label().to_string(),
            method: "POST".to_string(),
            path: path.to_string(),
            status: None,
            reason: reason.to_string(),
            body_snippet: String::new(),
        }
    }
}
