//! Platform profiles: what one vendor's Redfish service looks like, as data files in
//! `bmc-sim/profiles/*.yaml` (format in `bmc-sim/README.md`, "Platform profiles").
//!
//! A profile names the inventory layout (component ids and kinds) and how the UpdateService behaves:
//! which update paths exist, how they are described (ActionInfo or inline annotations), which apply
//! times they take, and how an accepted update answers (DMTF task monitor, the task itself, or no
//! task). A scenario picks one with `platform: <name>`; its own `fleet.components` and
//! `update_service` override the profile's.

use serde::Deserialize;

/// The profile format this build reads. A file with another `profile_version` is refused rather
/// than half-understood.
pub const PROFILE_FORMAT_VERSION: u32 = 1;

/// The built-in profiles, embedded so the binary needs no data directory.
const BUILT_IN: &[(&str, &str)] = &[
    ("generic-dmtf", include_str!("../profiles/generic-dmtf.yaml")),
    ("hgx-h100", include_str!("../profiles/hgx-h100.yaml")),
    ("gb200", include_str!("../profiles/gb200.yaml")),
    ("dell", include_str!("../profiles/dell.yaml")),
    // An assumed layout (AWS publishes none): see the file's header.
    ("trn2", include_str!("../profiles/trn2.yaml")),
];

/// Names of the built-in profiles.
pub fn built_in_names() -> Vec<&'static str> {
    BUILT_IN.iter().map(|(n, _)| *n).collect()
}

/// How an accepted update answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AcceptedAs {
    /// 202 with `Location` of a task monitor (202 while running), the Task in the body (DMTF).
    #[default]
    TaskMonitor,
    /// 202 with `Location` of the Task itself (many vendors).
    Task,
    /// 204 and nothing to poll: the client watches the inventory.
    NoTask,
}

/// Where a SimpleUpdate's parameters are described.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DescribedBy {
    /// Annotations on the action object (`TransferProtocol@Redfish.AllowableValues`, ...).
    #[default]
    Inline,
    /// An `@Redfish.ActionInfo` resource listing the parameters.
    ActionInfo,
}

/// `UpdateService.SimpleUpdate` as the platform offers it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimpleUpdateProfile {
    /// Whether `Targets` is a parameter (a request with it is refused 400 otherwise).
    #[serde(default = "yes")]
    pub accepts_targets: bool,
    /// Allowable `TransferProtocol` values.
    #[serde(default = "http_protocols")]
    pub transfer_protocols: Vec<String>,
    /// Whether a request without `TransferProtocol` is refused.
    #[serde(default)]
    pub protocol_required: bool,
    /// How the parameters are advertised.
    #[serde(default)]
    pub described_by: DescribedBy,
    /// Supported `@Redfish.OperationApplyTime` values; empty: not advertised, both accepted.
    #[serde(default)]
    pub apply_times: Vec<String>,
}

/// A push URI as the platform offers it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushProfile {
    /// Supported apply times; empty: not advertised, both accepted.
    #[serde(default)]
    pub apply_times: Vec<String>,
}

/// `HttpPushUri` as the platform offers it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpPushProfile {
    /// Whether the UpdateService has the `HttpPushUriTargets` setting.
    #[serde(default = "yes")]
    pub targets_settable: bool,
}

/// The UpdateService of a platform.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateServiceProfile {
    /// `SimpleUpdate`, if offered.
    #[serde(default)]
    pub simple_update: Option<SimpleUpdateProfile>,
    /// `MultipartHttpPushUri`, if offered.
    #[serde(default)]
    pub multipart: Option<PushProfile>,
    /// `HttpPushUri`, if offered.
    #[serde(default)]
    pub http_push: Option<HttpPushProfile>,
    /// How accepted updates answer.
    #[serde(default)]
    pub accepted: AcceptedAs,
}

impl Default for UpdateServiceProfile {
    /// What bmc-sim offered before profiles existed: SimpleUpdate with targets, multipart push.
    fn default() -> Self {
        Self {
            simple_update: Some(SimpleUpdateProfile {
                accepts_targets: true,
                transfer_protocols: http_protocols(),
                protocol_required: false,
                described_by: DescribedBy::Inline,
                apply_times: Vec::new(),
            }),
            multipart: Some(PushProfile::default()),
            http_push: None,
            accepted: AcceptedAs::TaskMonitor,
        }
    }
}

fn yes() -> bool {
    true
}

fn http_protocols() -> Vec<String> {
    vec!["HTTP".to_owned(), "HTTPS".to_owned()]
}

/// Where a platform puts its GPUs, their sensors and the GPU event log in the Redfish tree.
///
/// Templates take `{n}`: the GPU's index plus `gpu_index_base`. Without a `redfish_layout` section a
/// profile has bmc-sim's original single-system layout (the defaults below). Written from the DMTF
/// schemas (ComputerSystem, Processor, Chassis, Sensor, LogService, LogEntry) and, for the HGX values,
/// NVIDIA's public DGX H100 / HGX Redfish documentation.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedfishLayout {
    /// The host's own system, listed first in `Systems` with its own SEL and event log (BIOS and host
    /// events only); `None`: the GPU system is the only system.
    #[serde(default)]
    pub host_system: Option<String>,
    /// The system holding the GPU `Processors` and the log service `EventLog` where GPU events (XIDs,
    /// PCIe errors) are logged.
    #[serde(default = "default_gpu_system")]
    pub gpu_system: String,
    /// A GPU's Processor `Id`.
    #[serde(default = "default_gpu_id")]
    pub gpu_id: String,
    /// Added to the 0-based GPU index to make `{n}` (HGX numbers its GPUs from 1).
    #[serde(default)]
    pub gpu_index_base: usize,
    /// A Chassis per GPU holding that GPU's sensors; `None`: every GPU sensor on the main chassis.
    #[serde(default)]
    pub gpu_chassis: Option<String>,
    /// The GPU temperature Sensor `Id`.
    #[serde(default = "default_temp_sensor")]
    pub temp_sensor: String,
    /// The GPU power Sensor `Id`.
    #[serde(default = "default_power_sensor")]
    pub power_sensor: String,
    /// A GPU memory temperature Sensor `Id` (`PhysicalContext: Memory`, same `RelatedItem`), if any:
    /// a second temperature per GPU that a reader must not mistake for the GPU's.
    #[serde(default)]
    pub memory_temp_sensor: Option<String>,
    /// Whether the GPU log service states its `LogEntryType` (optional in the schema; HGX omits it).
    #[serde(default = "yes")]
    pub log_entry_type: bool,
    /// Where an XID entry's `Links.OriginOfCondition` points: the GPU's `processor` or its `chassis`.
    #[serde(default)]
    pub xid_origin: XidOrigin,
    /// Whether `ProtocolFeaturesSupported.ExpandQuery` is advertised and `$expand=.` / `$expand=*`
    /// (one level) honoured on the Systems, Chassis, LogServices, Processors, Sensors and
    /// FirmwareInventory collections (log entries always come inline).
    #[serde(default)]
    pub expand_query: bool,
}

/// Where an XID entry's `OriginOfCondition` points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum XidOrigin {
    /// The GPU's Processor resource.
    #[default]
    Processor,
    /// The GPU's own Chassis (needs `gpu_chassis`).
    Chassis,
}

impl Default for RedfishLayout {
    /// bmc-sim's original layout: `Systems/1` with `Processors/GPU_0..`, sensors `GPU_{n}_Temp` on
    /// `Chassis/1`.
    fn default() -> Self {
        Self {
            host_system: None,
            gpu_system: default_gpu_system(),
            gpu_id: default_gpu_id(),
            gpu_index_base: 0,
            gpu_chassis: None,
            temp_sensor: default_temp_sensor(),
            power_sensor: default_power_sensor(),
            memory_temp_sensor: None,
            log_entry_type: true,
            xid_origin: XidOrigin::Processor,
            expand_query: false,
        }
    }
}

impl RedfishLayout {
    /// `template` with `{n}` replaced for GPU `g` (0-based).
    pub fn name(&self, template: &str, g: usize) -> String {
        template.replace("{n}", &(g + self.gpu_index_base).to_string())
    }

    /// The 0-based GPU whose `template` name is `name`, among `gpus`.
    pub fn gpu_of(&self, template: &str, name: &str, gpus: usize) -> Option<usize> {
        (0..gpus).find(|&g| self.name(template, g) == name)
    }

    /// The system every non-GPU resource hangs off: the host's when there is one.
    pub fn main_system(&self) -> &str {
        self.host_system.as_deref().unwrap_or(&self.gpu_system)
    }

    /// Systems in collection order: the host first, as a DGX lists it.
    pub fn systems(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self.host_system.iter().map(String::as_str).collect();
        out.push(&self.gpu_system);
        out
    }

    /// Checks the templates name each GPU distinctly.
    pub(crate) fn check(&self) -> Result<(), String> {
        for (key, t) in [
            ("gpu_id", Some(&self.gpu_id)),
            ("temp_sensor", Some(&self.temp_sensor)),
            ("power_sensor", Some(&self.power_sensor)),
            ("gpu_chassis", self.gpu_chassis.as_ref()),
            ("memory_temp_sensor", self.memory_temp_sensor.as_ref()),
        ] {
            if let Some(t) = t
                && !t.contains("{n}")
            {
                return Err(format!("redfish_layout.{key} `{t}` must contain {{n}}"));
            }
        }
        if self.xid_origin == XidOrigin::Chassis && self.gpu_chassis.is_none() {
            return Err("redfish_layout.xid_origin: chassis needs gpu_chassis".to_owned());
        }
        if self.host_system.as_deref() == Some(self.gpu_system.as_str()) {
            return Err("redfish_layout.host_system must differ from gpu_system".to_owned());
        }
        Ok(())
    }
}

fn default_gpu_system() -> String {
    "1".to_owned()
}
fn default_gpu_id() -> String {
    "GPU_{n}".to_owned()
}
fn default_temp_sensor() -> String {
    "GPU_{n}_Temp".to_owned()
}
fn default_power_sensor() -> String {
    "GPU_{n}_Power".to_owned()
}

/// A profile file as written. Components stay raw here; the scenario validates them like its own.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawProfile {
    pub profile_version: u32,
    pub name: String,
    /// For readers of the file only.
    #[serde(default, rename = "description")]
    pub _description: String,
    #[serde(default)]
    pub components: Vec<RawComponent>,
    #[serde(default)]
    pub update_service: Option<UpdateServiceProfile>,
    /// Where GPUs, sensors and the GPU event log are (absent: the original single-system layout).
    #[serde(default)]
    pub redfish_layout: Option<RedfishLayout>,
}

/// The built-in profile `name`, parsed; the error says what is wrong.
pub(crate) fn built_in(name: &str) -> Result<RawProfile, String> {
    let (_, text) = BUILT_IN
        .iter()
        .find(|(n, _)| *n == name)
        .ok_or_else(|| format!("unknown platform `{name}` (built in: {})", built_in_names().join(", ")))?;
    let profile: RawProfile =
        serde_saphyr::from_str(text).map_err(|e| format!("profile `{name}` does not parse: {e}"))?;
    if profile.profile_version != PROFILE_FORMAT_VERSION {
        return Err(format!(
            "profile `{name}` has profile_version {}, this bmc-sim reads {PROFILE_FORMAT_VERSION}",
            profile.profile_version
        ));
    }
    if profile.name != name {
        return Err(format!("profile file for `{name}` names itself `{}`", profile.name));
    }
    if let Some(layout) = &profile.redfish_layout {
        layout.check().map_err(|e| format!("profile `{name}`: {e}"))?;
    }
    Ok(profile)
}

/// One component as a scenario or platform profile writes it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawComponent {
    pub(crate) id: String,
    pub(crate) kind: String,
    pub(crate) version: String,
    #[serde(default = "yes")]
    pub(crate) updateable: bool,
    #[serde(default)]
    pub(crate) lowest_supported_version: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_profile_parses_and_names_itself() {
        for name in built_in_names() {
            let p = built_in(name).unwrap_or_else(|e| panic!("{e}"));
            assert!(!p.components.is_empty(), "{name}");
            assert!(p.update_service.is_some(), "{name}");
        }
        assert!(built_in("nope").unwrap_err().contains("hgx-h100"));
    }

    #[test]
    fn hgx_h100_simple_update_cannot_target_and_gb200_is_push_only() {
        let hgx = built_in("hgx-h100").unwrap().update_service.unwrap();
        assert!(!hgx.simple_update.unwrap().accepts_targets);
        let gb = built_in("gb200").unwrap().update_service.unwrap();
        assert!(gb.simple_update.is_none());
        assert_eq!(gb.multipart.unwrap().apply_times, vec!["Immediate".to_string()]);
    }

    #[test]
    fn trn2_is_labelled_an_assumption_and_lists_sixteen_accelerators() {
        let text = BUILT_IN.iter().find(|(n, _)| *n == "trn2").unwrap().1;
        assert!(
            text.starts_with("# ASSUMPTION"),
            "the header must say the layout is assumed"
        );
        let yaml = "seed: 1\nplatform: trn2\nfleet:\n  nodes: 4\n  racks: 1\n  clusters: 1\n  region: r\n  \
                    sku: trn2\n  nodes_per_nvlink_domain: 4\n";
        let scenario = crate::Scenario::from_yaml_str(yaml).unwrap();
        let chips: Vec<&str> = scenario
            .fleet
            .components
            .iter()
            .filter(|c| c.kind == orchestrator_types::ComponentKind::Gpu)
            .map(|c| c.id.as_str())
            .collect();
        assert_eq!(chips.len(), 16, "{chips:?}");
        assert_eq!(chips[0], "NeuronDevice_0");
        assert_eq!(chips[15], "NeuronDevice_15");
    }
}
