//! The driver's vocabulary: what it reads from a BMC and what it asks a BMC to do.
//!
//! These are deliberately smaller than the Redfish schemas: only what the engine decides on, with
//! owned, serializable fields so they can be stored and compared.

use std::collections::BTreeSet;
use std::fmt;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use orchestrator_types::FirmwareVersion;
use serde::{Deserialize, Serialize};

use crate::update::{ApplyTime, UpdateIntent, UpdatePath};

/// One entry of `/redfish/v1/UpdateService/FirmwareInventory`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirmwareComponent {
    /// `Id`, e.g. `HGX_FW_GPU_0` or `BMC_Firmware`.
    pub id: String,
    /// `@odata.id`: what an update's `Targets` names.
    pub uri: String,
    /// `Version` as the BMC reports it, unparsed (absent for some placeholder entries).
    pub version: Option<String>,
    /// `Updateable`; absent is reported as `false` so nothing is flashed on a guess.
    pub updateable: bool,
    /// `SoftwareId`: the vendor's identifier of the component type.
    pub software_id: Option<String>,
    /// `Status.State`, e.g. `Enabled`, `Absent`, `Updating`.
    pub state: Option<String>,
    /// `Status.Health`, e.g. `OK`, `Warning`, `Critical`.
    pub health: Option<String>,
    /// `LowestSupportedVersion`, unparsed: the BMC refuses images older than
    /// it. Absent when the BMC does not report it (or reports a non-string).
    pub lowest_supported_version: Option<String>,
    /// `Name`: on layouts whose ids say nothing (HPE's `1`, `2`...) the name
    /// says what the component is.
    #[serde(default)]
    pub name: Option<String>,
    /// `RelatedItem` links: the resources the software belongs to (OpenBMC
    /// links `Managers/bmc`, `Systems/system/Bios`).
    #[serde(default)]
    pub related_items: Vec<String>,
}

impl FirmwareComponent {
    /// The component's kind from everything the inventory says about it
    /// ([`ComponentKind::classify_component`]).
    pub fn kind(&self) -> orchestrator_types::ComponentKind {
        orchestrator_types::ComponentKind::classify_component(
            &self.id,
            self.software_id.as_deref(),
            self.name.as_deref(),
            &self.related_items,
        )
    }

    /// The version in Waveguard's ordered form, if present and parsable.
    pub fn parsed_version(&self) -> Option<FirmwareVersion> {
        self.version.as_deref().and_then(|v| FirmwareVersion::parse(v).ok())
    }
}

/// Redfish `TaskState`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaskState {
    /// `New`.
    New,
    /// `Starting`.
    Starting,
    /// `Running`.
    Running,
    /// `Pending`.
    Pending,
    /// `Suspended`.
    Suspended,
    /// `Interrupted`.
    Interrupted,
    /// `Service` (waiting on service action).
    Service,
    /// `Stopping`.
    Stopping,
    /// `Cancelling`.
    Cancelling,
    /// `Completed`.
    Completed,
    /// `Exception`.
    Exception,
    /// `Killed`.
    Killed,
    /// `Cancelled`.
    Cancelled,
    /// Any state this driver does not know; treated as still running, never as success.
    Other(String),
}

impl TaskState {
    /// Parses a Redfish `TaskState` string.
    pub fn parse(raw: &str) -> Self {
        match raw {
            "New" => TaskState::New,
            "Starting" => TaskState::Starting,
            "Running" => TaskState::Running,
            "Pending" => TaskState::Pending,
            "Suspended" => TaskState::Suspended,
            "Interrupted" => TaskState::Interrupted,
            "Service" => TaskState::Service,
            "Stopping" => TaskState::Stopping,
            "Cancelling" => TaskState::Cancelling,
            "Completed" => TaskState::Completed,
            "Exception" => TaskState::Exception,
            "Killed" => TaskState::Killed,
            "Cancelled" => TaskState::Cancelled,
            other => TaskState::Other(other.to_string()),
        }
    }

    /// The terminal states that mean the work did not happen.
    pub fn is_failure(&self) -> bool {
        matches!(self, TaskState::Exception | TaskState::Killed | TaskState::Cancelled)
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskState::Other(s) => f.write_str(s),
            other => write!(f, "{other:?}"),
        }
    }
}

/// A Redfish registry message attached to a task or an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskMessage {
    /// e.g. `Update.1.0.ApplyFailed`.
    pub message_id: Option<String>,
    /// Human-readable text.
    pub message: Option<String>,
    /// `MessageArgs`.
    pub message_args: Vec<String>,
    /// `MessageSeverity` (or the older `Severity`).
    pub severity: Option<String>,
}

/// Where to poll an update: returned by a push, persisted by the engine so a restarted controller
/// resumes polling instead of flashing again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskHandle {
    /// The `Location` of the 202 answer (a task monitor, or the task itself on many BMCs).
    pub monitor_uri: String,
    /// The `@odata.id` of the Task resource when the BMC returned one; polled in preference because
    /// task monitors may vanish once the task is done.
    pub task_uri: Option<String>,
}

impl TaskHandle {
    /// The URI the driver polls.
    pub fn poll_uri(&self) -> &str {
        self.task_uri.as_deref().unwrap_or(&self.monitor_uri)
    }
}

/// A non-failed reading of a task. Failed terminal states come back as `BmcError::TaskFailed`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskStatus {
    /// Current state (never a failure state here).
    pub state: TaskState,
    /// `PercentComplete`, when reported.
    pub percent_complete: Option<u32>,
    /// Messages so far.
    pub messages: Vec<TaskMessage>,
}

impl TaskStatus {
    /// `true` once the task has completed successfully.
    pub fn is_completed(&self) -> bool {
        self.state == TaskState::Completed
    }
}

/// How the image reaches the BMC.
#[derive(Clone)]
pub enum UpdateMethod {
    /// `UpdateService.SimpleUpdate`: the BMC pulls the image from `image_uri`.
    SimpleUpdate {
        /// Where the BMC downloads the image.
        image_uri: String,
        /// `TransferProtocol` (e.g. `HTTP`); omit when the URI has a scheme, as the spec prefers.
        transfer_protocol: Option<String>,
    },
    /// The driver picks the path the BMC offers ([`crate::choose_update_path`]): `SimpleUpdate` where it
    /// can restrict the targets, else a push of the image, which the driver first downloads from
    /// `image_uri` (bounded by [`crate::limits::MAX_PUSH_IMAGE_BYTES`] and the BMC's
    /// `MaxImageSizeBytes`). `apply_time` of the request is a preference unless `strict_apply_time`.
    FromImageUri {
        /// Where the image is served.
        image_uri: String,
        /// Only this path (a policy or release override).
        forced: Option<UpdatePath>,
        /// Refuse instead of falling back to an apply time the BMC supports.
        strict_apply_time: bool,
    },
    /// Multipart push to `MultipartHttpPushUri`: the driver uploads the image bytes.
    MultipartPush {
        /// The image file.
        image: Bytes,
        /// File name for the `UpdateFile` part.
        filename: String,
    },
}

impl fmt::Debug for UpdateMethod {
    // An image is megabytes; printing it would drown any log line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpdateMethod::SimpleUpdate {
                image_uri,
                transfer_protocol,
            } => f
                .debug_struct("SimpleUpdate")
                .field("image_uri", image_uri)
                .field("transfer_protocol", transfer_protocol)
                .finish(),
            UpdateMethod::FromImageUri {
                image_uri,
                forced,
                strict_apply_time,
            } => f
                .debug_struct("FromImageUri")
                .field("image_uri", image_uri)
                .field("forced", forced)
                .field("strict_apply_time", strict_apply_time)
                .finish(),
            UpdateMethod::MultipartPush { image, filename } => f
                .debug_struct("MultipartPush")
                .field("image_len", &image.len())
                .field("filename", filename)
                .finish(),
        }
    }
}

/// One firmware push.
#[derive(Debug, Clone)]
pub struct UpdateRequest {
    /// How the image gets there.
    pub method: UpdateMethod,
    /// Inventory URIs to update (`FirmwareComponent::uri`); empty lets the BMC decide from the image.
    pub targets: Vec<String>,
    /// When to apply; `None` leaves the BMC's default.
    pub apply_time: Option<ApplyTime>,
    /// `ForceUpdate`; `None` omits it (not every BMC accepts the key).
    pub force_update: Option<bool>,
}

impl UpdateRequest {
    /// What [`crate::choose_update_path`] decides on for a [`UpdateMethod::FromImageUri`] request;
    /// `None` for a request that names its path itself. The driver decides from it at the push, and a
    /// controller can ask the same question of a BMC's capabilities before any push.
    pub fn intent(&self) -> Option<UpdateIntent> {
        let UpdateMethod::FromImageUri {
            image_uri,
            forced,
            strict_apply_time,
        } = &self.method
        else {
            return None;
        };
        Some(UpdateIntent {
            targeted: !self.targets.is_empty(),
            apply_time: self.apply_time,
            strict_apply_time: *strict_apply_time,
            forced: *forced,
            image_scheme: url::Url::parse(image_uri).ok().map(|u| u.scheme().to_string()),
        })
    }
}

/// What to reset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResetTarget {
    /// `Manager.Reset` on this manager id, or on the first manager when `None`. Activates BMC firmware;
    /// the BMC stops answering for a while.
    Manager(Option<String>),
    /// `ComputerSystem.Reset` on this system id, or on the first system when `None`. Activates GPU
    /// and other host-side firmware.
    System(Option<String>),
}

/// What a sensor measures, as far as health gating cares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SensorKind {
    /// `ReadingType: Temperature` (Cel).
    Temperature,
    /// `ReadingType: Power` (W).
    Power,
    /// Anything else, with the raw `ReadingType`.
    Other(String),
}

/// One sensor reading.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SensorReading {
    /// Chassis the sensor belongs to.
    pub chassis_id: String,
    /// Sensor `Id`, e.g. `GPU_0_Temp`.
    pub id: String,
    /// What it measures.
    pub kind: SensorKind,
    /// The reading; `None` when the BMC has none (sensor absent or not ready).
    pub reading: Option<f64>,
    /// `ReadingUnits`.
    pub units: Option<String>,
    /// `PhysicalContext`, e.g. `GPU`.
    pub physical_context: Option<String>,
    /// `Status.Health`.
    pub health: Option<String>,
    /// `RelatedItem`: the `@odata.id`s of what the sensor measures (on HGX the GPU's Processor, e.g.
    /// `/redfish/v1/Systems/HGX_Baseboard_0/Processors/GPU_SXM_1` for `HGX_GPU_SXM_1_TEMP_0`).
    #[serde(default)]
    pub related: Vec<String>,
}

/// A GPU as the BMC's inventory lists it: a `Processor` with `ProcessorType` `GPU` under one of the
/// service's systems.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuUnit {
    /// The Processor's `Id` (`GPU_SXM_1`), the unit per-GPU health is kept under.
    pub id: String,
    /// Its `@odata.id`.
    pub uri: String,
    /// `Links.Chassis` of the Processor (on HGX the GPU's own chassis, `.../Chassis/HGX_GPU_SXM_1`),
    /// where event-log entries about the GPU often point.
    pub chassis: Option<String>,
}

impl GpuUnit {
    /// The GPU's number as its id ends (`GPU_SXM_1` -> 1), for people reading evidence.
    pub fn index(&self) -> Option<u32> {
        let digits: String = self
            .id
            .chars()
            .rev()
            .take_while(char::is_ascii_digit)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        digits.parse().ok()
    }
}

impl SensorReading {
    /// Whether this sensor describes a GPU (by `PhysicalContext`, or by name on BMCs that omit it).
    pub fn is_gpu(&self) -> bool {
        self.physical_context.as_deref() == Some("GPU") || self.id.to_ascii_uppercase().contains("GPU")
    }
}

/// One event-log entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventLogEntry {
    /// Entry `Id`.
    pub id: String,
    /// `Created`.
    pub created: DateTime<Utc>,
    /// `Severity` (`OK`, `Warning`, `Critical`).
    pub severity: Option<String>,
    /// `Message`.
    pub message: Option<String>,
    /// `MessageId`, e.g. a GPU XID or PCIe AER registry id.
    pub message_id: Option<String>,
    /// `MessageArgs`.
    pub message_args: Vec<String>,
    /// `EntryType` (`Event`, `SEL`, `Oem`).
    pub entry_type: Option<String>,
    /// `SensorType`.
    pub sensor_type: Option<String>,
    /// `Links.OriginOfCondition.@odata.id`: which component it is about.
    pub origin: Option<String>,
}

/// Position in a BMC's event log: the newest `Created` seen and the entry ids at that instant.
///
/// Keyed by time rather than by id because BMCs number entries differently (some reuse ids after a
/// log wrap). Persist it with serde and hand it back on the next read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventCursor {
    /// Newest `Created` seen so far.
    pub last_created: Option<DateTime<Utc>>,
    /// Ids of the entries created exactly at `last_created` (already returned).
    pub ids_at_last: BTreeSet<String>,
}

impl EventCursor {
    /// Whether `entry` comes after this cursor.
    pub fn is_new(&self, entry: &EventLogEntry) -> bool {
        match self.last_created {
            None => true,
            Some(last) => entry.created > last || (entry.created == last && !self.ids_at_last.contains(&entry.id)),
        }
    }

    /// Moves the cursor past `entry`.
    pub fn advance(&mut self, entry: &EventLogEntry) {
        match self.last_created {
            Some(last) if entry.created < last => {}
            Some(last) if entry.created == last => {
                self.ids_at_last.insert(entry.id.clone());
            }
            _ => {
                self.last_created = Some(entry.created);
                self.ids_at_last = BTreeSet::from([entry.id.clone()]);
            }
        }
    }
}

/// Entries after a cursor, oldest first, and the cursor to use next time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventBatch {
    /// New entries, ordered by `Created` then `Id`.
    pub entries: Vec<EventLogEntry>,
    /// Cursor past the last entry returned.
    pub cursor: EventCursor,
    /// Entries skipped because they had no parsable `Created` (counted, not fatal).
    pub skipped_malformed: usize,
}

/// What the liveness probe learned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceInfo {
    /// `RedfishVersion` of the service root.
    pub redfish_version: String,
    /// `UUID` of the service, if reported.
    pub uuid: Option<String>,
}

/// One GPU as a part: its identity (serial and part number, which Redfish keeps on the `Processor` and
/// its `Assembly`) and state, read fresh for the RMA pipeline's part records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPart {
    /// The Processor it was read from.
    pub unit: GpuUnit,
    /// `SerialNumber` (of the Processor, else of its first Assembly entry).
    pub serial_number: Option<String>,
    /// `PartNumber` (of the Processor, else of its first Assembly entry).
    pub part_number: Option<String>,
    /// `Manufacturer`.
    pub manufacturer: Option<String>,
    /// `Model`.
    pub model: Option<String>,
    /// `FirmwareVersion`, when the Processor reports one.
    pub firmware_version: Option<String>,
    /// `Status.Health`.
    pub health: Option<String>,
    /// `Status.State` (`UnavailableOffline` for a GPU that fell off the bus).
    pub state: Option<String>,
    /// `ProductionDate` of the Processor's `Assembly`, when it links one.
    pub production_date: Option<DateTime<Utc>>,
}

/// What `LogService.CollectDiagnosticData` asks for (LogService v1_2_0 on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DiagnosticDataType {
    /// The manager's (BMC's) own diagnostic data.
    Manager,
    /// Vendor-defined data (`OEMDiagnosticDataType` names which).
    #[serde(rename = "OEM")]
    Oem,
}

/// Diagnostic data collected from a BMC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiagnosticData {
    /// The log entry created for it.
    pub entry_uri: String,
    /// Where its bytes were read (`AdditionalDataURI`).
    pub data_uri: String,
    /// The entry's `Created`, when parsable.
    pub created: Option<DateTime<Utc>>,
    /// The bytes.
    pub bytes: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn entry(id: &str, secs: i64) -> EventLogEntry {
        EventLogEntry {
            id: id.into(),
            created: Utc.timestamp_opt(secs, 0).single().unwrap(),
            severity: None,
            message: None,
            message_id: None,
            message_args: vec![],
            entry_type: None,
            sensor_type: None,
            origin: None,
        }
    }

    #[test]
    fn cursor_returns_each_entry_once_even_with_equal_timestamps() {
        let mut cursor = EventCursor::default();
        let a = entry("1", 100);
        let b = entry("2", 100);
        let c = entry("3", 200);
        assert!(cursor.is_new(&a));
        cursor.advance(&a);
        assert!(!cursor.is_new(&a));
        assert!(cursor.is_new(&b), "same second, different id is new");
        cursor.advance(&b);
        assert!(!cursor.is_new(&b));
        assert!(cursor.is_new(&c));
        cursor.advance(&c);
        assert!(!cursor.is_new(&a) && !cursor.is_new(&b) && !cursor.is_new(&c));
        assert_eq!(cursor.ids_at_last, BTreeSet::from(["3".to_string()]));
        // Advancing with an older entry never moves the cursor back.
        cursor.advance(&a);
        assert_eq!(cursor.last_created, Some(c.created));
    }

    #[test]
    fn task_states_parse_and_classify() {
        for (raw, failed) in [
            ("Completed", false),
            ("Exception", true),
            ("Killed", true),
            ("Running", false),
        ] {
            assert_eq!(TaskState::parse(raw).is_failure(), failed, "{raw}");
            assert_eq!(TaskState::parse(raw).to_string(), raw);
        }
        assert_eq!(TaskState::parse("Weird"), TaskState::Other("Weird".into()));
    }

    #[test]
    fn update_method_debug_hides_image_bytes() {
        let m = UpdateMethod::MultipartPush {
            image: Bytes::from(vec![0x41; 4096]),
            filename: "gpu.fw".into(),
        };
        let text = format!("{m:?}");
        assert!(text.contains("4096") && !text.contains("AAAA"), "{text}");
    }
}
