//! The controller's Redfish driver: the only code in Waveguard that talks to BMCs.
//!
//! The engine sees a BMC as an `Arc<dyn` [`Bmc`]`>`: read firmware inventory, push an update (by
//! `SimpleUpdate` or multipart HTTP push) and get a [`TaskHandle`], poll that task, reset a manager or
//! system, read health (sensors and event-log entries since an [`EventCursor`]), and probe liveness.
//! [`RedfishBmc`] implements it over HTTP(S); [`discover_inventory`] reads many BMCs with bounded
//! concurrency for `waveguard fleet discover`.
//!
//! # Robustness
//!
//! Every request has a per-attempt timeout. 503/429/502/504 answers and timeouts are retried with
//! exponential backoff and jitter (honouring `Retry-After`, capped) inside a total deadline
//! ([`RetryPolicy`]). A 401 on a session triggers a fresh login, up to three per request, then the
//! transient [`BmcError::SessionLost`]; only a refused login (or, with Basic, a second 401) is
//! [`BmcError::AuthFailed`], never retried, so the account cannot be locked. Requests that change the BMC (update push, reset) are never re-sent after
//! an ambiguous failure: that yields [`BmcError::OutcomeUnknown`], so a flaky BMC can never cause a
//! double flash. [`BmcError::is_transient`] tells the engine whether requeueing can help.
//!
//! # Why reqwest carries the requests and not `redfish::Client`
//!
//! The `redfish` crate (redfish-rs 0.3.2) supplies the Redfish resource models used to decode
//! responses and build requests here (`SoftwareInventory`, `Task`, `Sensor`, `LogEntry`,
//! `ServiceRoot`, `Collection`, `SimpleUpdateRequest`). Its HTTP client is not used, because:
//!
//! - **TLS trust**: `redfish::ClientBuilder` exposes no CA-bundle or verification setting, so it can
//!   neither trust a private fleet CA only, nor skip verification for an explicitly marked lab BMC.
//!   Production BMCs present certificates from a private CA, so this alone rules it out.
//! - **Auth**: its `Auth` is fixed when the client is built. Re-login after a 401 would mean
//!   rebuilding the client, which drops its connection pool; here the session token is swapped in
//!   place, once, even when many tasks see the 401 at the same time.
//! - **Retries and timeouts**: its retry policy has no total deadline and does not distinguish
//!   "never sent" from "sent, answer lost", which decides whether an update push may be re-sent.
//! - **Connection reuse across BMCs**: each `redfish::Client` owns its own HTTP client; a fleet of
//!   10,000 BMCs needs one shared pool per TLS configuration ([`HttpClients`]).
//! - **Multipart push**: it has no `MultipartHttpPushUri` support at all.
//!
//! # Secrets
//!
//! [`Credentials`] never print their password; auth headers are marked sensitive; response-body
//! excerpts kept in errors are truncated and scrubbed of the password, the session token and any JSON
//! value under a password/token/secret key; base URLs carrying user info are refused.

mod clients;
mod config;
mod connections;
mod discovery;
mod error;
mod interner;
pub mod limits;
mod redfish_bmc;
mod transport;
mod types;
mod update;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub use clients::{ConnectFaults, HttpClients};
pub use config::{AuthMode, BmcEndpoint, Credentials, RetryPolicy, Timeouts, TlsTrust};
pub use connections::{
    CONNECTIONS_PER_BMC, ConnectionLimit, ConnectionUsage, DEFAULT_FILE_RESERVE, DEFAULT_MAX_CONNECTIONS, LimitError,
    default_reserve, soft_open_file_limit,
};
pub use discovery::{
    DEFAULT_DISCOVERY_CONCURRENCY, DiscoveryResult, discover_inventory, discover_inventory_stream, discover_with,
};
pub use error::{BODY_SNIPPET_LIMIT, BmcError, ControllerFault};
pub use redfish_bmc::RedfishBmc;
pub use types::{
    DiagnosticData, DiagnosticDataType, EventBatch, EventCursor, EventLogEntry, FirmwareComponent, GpuPart, GpuUnit,
    ResetTarget, SensorKind, SensorReading, ServiceInfo, TaskHandle, TaskMessage, TaskState, TaskStatus, UpdateMethod,
    UpdateRequest,
};
pub use update::{
    ApplyTime, PushCaps, SimpleUpdateCaps, UpdateCapabilities, UpdateIntent, UpdatePath, UpdatePlan, UpdateRefusal,
    choose_update_path,
};

/// The Redfish `ResetType`s the engine uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ResetKind {
    /// Orderly restart (the usual choice for activating firmware).
    GracefulRestart,
    /// Immediate restart.
    ForceRestart,
    /// Power off then on (some GPU firmware needs the power removed).
    PowerCycle,
    /// Power on.
    On,
    /// Immediate power off.
    ForceOff,
}

impl ResetKind {
    /// The Redfish string, via the `redfish` crate's own enum so spellings stay in one place.
    pub fn as_redfish(self) -> String {
        let rt = match self {
            ResetKind::GracefulRestart => redfish::ResetType::GracefulRestart,
            ResetKind::ForceRestart => redfish::ResetType::ForceRestart,
            ResetKind::PowerCycle => redfish::ResetType::PowerCycle,
            ResetKind::On => redfish::ResetType::On,
            ResetKind::ForceOff => redfish::ResetType::ForceOff,
        };
        match serde_json::to_value(rt) {
            Ok(serde_json::Value::String(s)) => s,
            // Unit variants always serialize to strings; keep a readable fallback anyway.
            _ => format!("{rt:?}"),
        }
    }
}

/// Sensors and new event-log entries read together for a health pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthSnapshot {
    /// All sensor readings (filter with [`SensorReading::is_gpu`] and [`SensorKind`]).
    pub sensors: Vec<SensorReading>,
    /// Event-log entries after the cursor given, and the next cursor.
    pub events: EventBatch,
}

/// One BMC, as the engine uses it. Dyn-compatible: the engine holds `Arc<dyn Bmc>`, and tests can
/// substitute their own implementation.
#[async_trait]
pub trait Bmc: Send + Sync + fmt::Debug {
    /// The BMC's base URL, for logs and error reports.
    fn endpoint(&self) -> &str;

    /// Cheap liveness check: one anonymous `GET /redfish/v1`, one attempt, short timeout.
    async fn probe(&self) -> Result<ServiceInfo, BmcError>;

    /// Every entry of `UpdateService/FirmwareInventory`.
    async fn firmware_inventory(&self) -> Result<Vec<FirmwareComponent>, BmcError>;

    /// What the UpdateService offers (paths, targets, apply times), as read from the service's own
    /// links and annotations; checked before a rollout's first flash. A driver that cannot tell says
    /// [`BmcError::Unsupported`].
    async fn update_capabilities(&self) -> Result<UpdateCapabilities, BmcError> {
        Err(BmcError::Unsupported {
            endpoint: self.endpoint().to_string(),
            feature: "reading update capabilities".to_string(),
        })
    }

    /// Starts an update and returns where to poll it. Never re-sent after an ambiguous failure
    /// ([`BmcError::OutcomeUnknown`]); persist the handle before polling so a restart resumes.
    async fn start_update(&self, request: &UpdateRequest) -> Result<TaskHandle, BmcError>;

    /// The `@odata.id` of every task in the BMC's TaskService, in the BMC's order.
    ///
    /// The engine lists tasks just before an update push and again after a crash that left the push's
    /// outcome unknown: a task that was not there before is the push it made, so it adopts that task
    /// instead of flashing a second time.
    async fn list_tasks(&self) -> Result<Vec<String>, BmcError> {
        Err(BmcError::Unsupported {
            endpoint: self.endpoint().to_string(),
            feature: "listing TaskService tasks".to_string(),
        })
    }

    /// Reads a task once. `Exception`/`Killed`/`Cancelled` come back as [`BmcError::TaskFailed`] with
    /// the task's messages; anything else as a [`TaskStatus`].
    async fn poll_task(&self, task: &TaskHandle) -> Result<TaskStatus, BmcError>;

    /// `Manager.Reset` or `ComputerSystem.Reset`. Returns a task handle when the BMC tracks the reset
    /// as a task. A manager reset often drops the connection before answering, which surfaces as
    /// [`BmcError::OutcomeUnknown`]: probe until the BMC is back, then read the inventory.
    async fn reset(&self, target: &ResetTarget, kind: ResetKind) -> Result<Option<TaskHandle>, BmcError>;

    /// All chassis sensors (GPU temperatures and power among them).
    async fn read_sensors(&self) -> Result<Vec<SensorReading>, BmcError>;

    /// The GPUs of the node: every `Processor` with `ProcessorType` `GPU` under any of the service's
    /// systems (on a DGX they are under `Systems/HGX_Baseboard_0`, not the host's system). The
    /// health collector maps sensors and event-log entries to these units and counts GPU-hours by them.
    async fn gpus(&self) -> Result<Vec<GpuUnit>, BmcError> {
        Err(BmcError::Unsupported {
            endpoint: self.endpoint().to_string(),
            feature: "listing GPU processors".to_string(),
        })
    }

    /// Every GPU with its serial and part number and state, read fresh (not cached like
    /// [`Bmc::gpus`]: a part is replaced, falls off the bus, changes health).
    async fn gpu_parts(&self) -> Result<Vec<GpuPart>, BmcError> {
        Err(BmcError::Unsupported {
            endpoint: self.endpoint().to_string(),
            feature: "reading GPU part inventory".to_string(),
        })
    }

    /// Collects diagnostic data with `LogService.CollectDiagnosticData` on the log service that
    /// advertises it (the GPU event log's first), waits for the task, and reads the new entry's
    /// `AdditionalDataURI`. `Unsupported` when no log service offers the action or the type.
    async fn collect_diagnostic_data(&self, kind: DiagnosticDataType) -> Result<DiagnosticData, BmcError> {
        Err(BmcError::Unsupported {
            endpoint: self.endpoint().to_string(),
            feature: format!("LogService.CollectDiagnosticData ({kind:?})"),
        })
    }

    /// Event-log entries after `since`, oldest first, with the cursor for next time.
    ///
    /// Reads the whole entries collection and filters client-side: `$filter` on `Created` is optional
    /// in Redfish and rarely implemented. BMC event logs are bounded (typically a few thousand
    /// entries), so this costs one paged GET per health pass.
    async fn read_events(&self, since: &EventCursor) -> Result<EventBatch, BmcError>;

    /// Sensors and new events in one call.
    async fn read_health(&self, since: &EventCursor) -> Result<HealthSnapshot, BmcError> {
        let sensors = self.read_sensors().await?;
        let events = self.read_events(since).await?;
        Ok(HealthSnapshot { sensors, events })
    }

    /// Ends the session on the BMC, if one is open (BMCs allow only a few at a time).
    async fn logout(&self) -> Result<(), BmcError>;
}

/// Polls `task` every `interval` until it completes, fails, or `timeout` passes.
///
/// For tools and tests; the engine's reconcilers poll one step per pass instead of blocking. Transient
/// poll errors (a 503, a timeout) are tolerated until the timeout: a BMC busy flashing is slow to
/// answer, and giving up on the first hiccup would abandon a flash that is going fine.
pub async fn wait_for_task(
    bmc: &dyn Bmc,
    task: &TaskHandle,
    interval: Duration,
    timeout: Duration,
) -> Result<TaskStatus, BmcError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last_state = "unread".to_string();
    loop {
        let last_error = match bmc.poll_task(task).await {
            Ok(status) if status.is_completed() => return Ok(status),
            Ok(status) => {
                last_state = status.state.to_string();
                None
            }
            Err(e) if e.is_transient() => Some(e),
            Err(e) => return Err(e),
        };
        if tokio::time::Instant::now() + interval > deadline {
            return Err(last_error.unwrap_or_else(|| BmcError::TaskTimeout {
                endpoint: bmc.endpoint().to_string(),
                task_uri: task.poll_uri().to_string(),
                last_state,
            }));
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_kinds_use_redfish_spelling() {
        assert_eq!(ResetKind::GracefulRestart.as_redfish(), "GracefulRestart");
        assert_eq!(ResetKind::ForceOff.as_redfish(), "ForceOff");
        assert_eq!(ResetKind::PowerCycle.as_redfish(), "PowerCycle");
    }
}
