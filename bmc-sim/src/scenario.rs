//! The scenario file: what fleet to simulate, how healthy it is, how each firmware version behaves once
//! active, fleet-wide events and BMC faults.
//!
//! The key names are a contract shared with the controller's tests (issue 3); new keys may be added but
//! existing ones keep their meaning. Parsing is two-step: serde reads a permissive "raw" shape (durations and
//! metric names as strings), then [`Scenario::from_yaml_str`] validates it and reports the first problem with
//! its key path (`firmware[0].effects[1].metric`) and the reason.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use orchestrator_types::ComponentKind;
use serde::Deserialize;

use crate::platform::{RawComponent, UpdateServiceProfile};

mod dcgm;
mod hardware;

pub use dcgm::DcgmSpec;
use dcgm::RawDcgm;
pub use hardware::{DefectiveLot, ExplicitFailure, HardwareFailureMode, HardwareSpec, LotSpec, PartsSpec};
use hardware::{RawHardware, RawParts};

/// Why a scenario was rejected. Every variant names the offending key path so a human can fix the file.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The YAML did not parse or did not have the expected shape (unknown key, wrong type...).
    #[error("scenario is not valid YAML of the expected shape")]
    Syntax(#[source] serde_saphyr::Error),
    /// A value parsed but is not acceptable.
    #[error("scenario key `{path}`: {reason}")]
    Invalid {
        /// Dotted key path, e.g. `firmware[0].effects[1].metric`.
        path: String,
        /// What is wrong with the value.
        reason: String,
    },
}

fn invalid(path: impl Into<String>, reason: impl Into<String>) -> ScenarioError {
    ScenarioError::Invalid {
        path: path.into(),
        reason: reason.into(),
    }
}

/// A health signal the simulator generates and firmware effects / events can move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Metric {
    /// Per-GPU temperature in degrees Celsius (a gauge).
    GpuTempC,
    /// Per-GPU power draw in watts (a gauge).
    GpuPowerW,
    /// Poisson rate of XID-style GPU error log entries, per GPU per hour.
    XidErrorsPerGpuHour,
    /// Poisson rate of PCIe AER error log entries, per node per hour.
    PcieAerPerNodeHour,
    /// Poisson rate of link width/speed degradation log entries, per node per day.
    LinkDegradedPerNodeDay,
    /// Poisson rate of volatile double-bit ECC errors per GPU-hour (DCGM only; baseline in `dcgm:`).
    EccDbePerGpuHour,
    /// Poisson rate of NVLink CRC flit errors per GPU-hour (DCGM only; baseline in `dcgm:`).
    NvlinkCrcPerGpuHour,
    /// Poisson rate of rows remapped for uncorrectable errors per GPU-hour (DCGM only; baseline in `dcgm:`).
    RemappedRowsPerGpuHour,
}

impl Metric {
    /// Every metric, in a stable order.
    pub const ALL: [Metric; 8] = [
        Metric::GpuTempC,
        Metric::GpuPowerW,
        Metric::XidErrorsPerGpuHour,
        Metric::PcieAerPerNodeHour,
        Metric::LinkDegradedPerNodeDay,
        Metric::EccDbePerGpuHour,
        Metric::NvlinkCrcPerGpuHour,
        Metric::RemappedRowsPerGpuHour,
    ];

    /// The scenario-file spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Metric::GpuTempC => "gpu_temp_c",
            Metric::GpuPowerW => "gpu_power_w",
            Metric::XidErrorsPerGpuHour => "xid_errors_per_gpu_hour",
            Metric::PcieAerPerNodeHour => "pcie_aer_per_node_hour",
            Metric::LinkDegradedPerNodeDay => "link_degraded_per_node_day",
            Metric::EccDbePerGpuHour => "ecc_dbe_per_gpu_hour",
            Metric::NvlinkCrcPerGpuHour => "nvlink_crc_per_gpu_hour",
            Metric::RemappedRowsPerGpuHour => "remapped_rows_per_gpu_hour",
        }
    }

    /// Whether the metric is per GPU (as opposed to per node).
    pub fn is_per_gpu(self) -> bool {
        matches!(
            self,
            Metric::GpuTempC
                | Metric::GpuPowerW
                | Metric::XidErrorsPerGpuHour
                | Metric::EccDbePerGpuHour
                | Metric::NvlinkCrcPerGpuHour
                | Metric::RemappedRowsPerGpuHour
        )
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Metric {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Metric::ALL.into_iter().find(|m| m.as_str() == s).ok_or_else(|| {
            let known: Vec<&str> = Metric::ALL.iter().map(|m| m.as_str()).collect();
            format!("unknown metric `{s}` (known: {})", known.join(", "))
        })
    }
}

/// Why a duration did not parse; `raw` is the text as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Blank.
    #[error("empty duration")]
    Empty,
    /// A character that is neither a digit nor a unit.
    #[error("unparsable duration `{raw}`: unexpected `{found}` (use s, m, h or d, e.g. `5m`)")]
    UnknownUnit {
        /// The text.
        raw: String,
        /// The character.
        found: char,
    },
    /// A unit with no number before it.
    #[error("unparsable duration `{raw}`: unit `{unit}` without a number")]
    UnitWithoutNumber {
        /// The text.
        raw: String,
        /// The unit.
        unit: char,
    },
    /// A number beyond `u64`.
    #[error("unparsable duration `{raw}`: number too large")]
    NumberTooLarge {
        /// The text.
        raw: String,
    },
    /// The total overflows.
    #[error("unparsable duration `{raw}`: too large")]
    TooLarge {
        /// The text.
        raw: String,
    },
    /// Trailing digits without a unit.
    #[error("unparsable duration `{raw}`: number without a unit (use s, m, h or d, e.g. `{raw}s`)")]
    NoUnit {
        /// The text.
        raw: String,
    },
}

/// Parses a duration such as `30s`, `5m`, `2h`, `1d` or a compound `1h30m`. Units are required.
pub fn parse_duration(raw: &str) -> Result<Duration, DurationError> {
    let s = raw.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    let mut total: u64 = 0;
    let mut digits = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit_secs = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => {
                return Err(DurationError::UnknownUnit {
                    raw: raw.to_owned(),
                    found: c,
                });
            }
        };
        if digits.is_empty() {
            return Err(DurationError::UnitWithoutNumber {
                raw: raw.to_owned(),
                unit: c,
            });
        }
        let n: u64 = digits
            .parse()
            .map_err(|_| DurationError::NumberTooLarge { raw: raw.to_owned() })?;
        total = n
            .checked_mul(unit_secs)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| DurationError::TooLarge { raw: raw.to_owned() })?;
        digits.clear();
    }
    if !digits.is_empty() {
        return Err(DurationError::NoUnit { raw: raw.to_owned() });
    }
    Ok(Duration::from_secs(total))
}

// ---------------------------------------------------------------------------------------------------------
// Raw (as written) shape.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    #[serde(default)]
    seed: u64,
    fleet: RawFleet,
    #[serde(default)]
    baseline: RawBaseline,
    #[serde(default)]
    firmware: Vec<RawFirmware>,
    #[serde(default)]
    events: Vec<RawEffect>,
    #[serde(default)]
    bmc_faults: RawFaults,
    #[serde(default)]
    dcgm: RawDcgm,
    /// Every GPU as a part: serial scheme, part numbers, lots.
    #[serde(default)]
    parts: RawParts,
    /// GPU hardware failures: a base rate, defective lots, scripted failures.
    #[serde(default)]
    hardware: RawHardware,
    /// A built-in platform profile (`bmc-sim/profiles/`): inventory layout and UpdateService.
    #[serde(default)]
    platform: Option<String>,
    /// Overrides the platform's UpdateService.
    #[serde(default)]
    update_service: Option<UpdateServiceProfile>,
    /// Overrides the platform's Redfish layout (`{expand_query: true}` alone: bmc-sim's own layout,
    /// advertising and honouring `$expand`).
    #[serde(default)]
    redfish_layout: Option<crate::platform::RedfishLayout>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFleet {
    nodes: i64,
    #[serde(default = "one")]
    racks: i64,
    #[serde(default = "one")]
    clusters: i64,
    #[serde(default = "default_region")]
    region: String,
    sku: String,
    #[serde(default)]
    nodes_per_nvlink_domain: Option<i64>,
    #[serde(default = "default_name_prefix")]
    name_prefix: String,
    #[serde(default)]
    components: Vec<RawComponent>,
}

fn one() -> i64 {
    1
}
fn default_region() -> String {
    "sim-region-1".to_owned()
}
fn default_name_prefix() -> String {
    "node".to_owned()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGauge {
    mean: f64,
    #[serde(default)]
    sd: f64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBaseline {
    #[serde(default)]
    gpu_temp_c: Option<RawGauge>,
    #[serde(default)]
    gpu_power_w: Option<RawGauge>,
    #[serde(default)]
    xid_errors_per_gpu_hour: Option<f64>,
    #[serde(default)]
    pcie_aer_per_node_hour: Option<f64>,
    #[serde(default)]
    link_degraded_per_node_day: Option<f64>,
    #[serde(default)]
    event_bucket: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRange {
    min: String,
    max: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFirmware {
    kind: String,
    version: String,
    #[serde(default)]
    flash_time: Option<RawRange>,
    #[serde(default)]
    flash_fail_rate: f64,
    #[serde(default)]
    brick_rate: f64,
    #[serde(default)]
    effects: Vec<RawEffect>,
}

/// Used for both firmware effects (`onset`) and fleet events (`at`, `duration`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEffect {
    metric: String,
    #[serde(default)]
    multiply: Option<f64>,
    #[serde(default)]
    add: Option<f64>,
    #[serde(default)]
    share: Option<f64>,
    #[serde(default)]
    onset: Option<String>,
    #[serde(default)]
    at: Option<String>,
    #[serde(default)]
    duration: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFaults {
    #[serde(default)]
    unavailable_rate: f64,
    #[serde(default)]
    timeout_rate: f64,
    #[serde(default)]
    reset_time: Option<RawRange>,
    #[serde(default)]
    reboot_time: Option<RawRange>,
    #[serde(default)]
    retry_after: Option<String>,
    #[serde(default)]
    looping_next_link: f64,
}

// ---------------------------------------------------------------------------------------------------------
// Validated shape.

/// A validated scenario. Construct with [`Scenario::from_yaml_str`].
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Seed for every random draw; same seed + same requests = same fleet behaviour.
    pub seed: u64,
    /// Fleet shape and initial firmware.
    pub fleet: FleetSpec,
    /// Health of a node running no firmware with effects.
    pub baseline: Baseline,
    /// Behaviour of specific firmware versions once active.
    pub firmware: Vec<FirmwareSpec>,
    /// Fleet-wide events (hot day, cooling fault...), relative to the fleet's start.
    pub events: Vec<FleetEvent>,
    /// Transport-level misbehaviour of the BMCs.
    pub bmc_faults: BmcFaults,
    /// The simulated dcgm-exporter's baselines and settings (`dcgm:`, every key optional).
    pub dcgm: DcgmSpec,
    /// Each GPU as a part (`parts:`, every key optional).
    pub parts: PartsSpec,
    /// GPU hardware failures (`hardware:`, every key optional; none without it).
    pub hardware: HardwareSpec,
    /// The platform profile the scenario named, if any.
    pub platform: Option<String>,
    /// How the UpdateService behaves (the platform's, the scenario's override, or the default).
    pub update_service: UpdateServiceProfile,
    /// Where GPUs, their sensors and the GPU event log are (the platform's, or the default layout).
    pub redfish_layout: crate::platform::RedfishLayout,
}

/// Fleet shape.
#[derive(Debug, Clone)]
pub struct FleetSpec {
    /// Number of nodes (one BMC each).
    pub nodes: usize,
    /// Racks the nodes are spread over (label `rack`).
    pub racks: usize,
    /// Clusters the racks are spread over (label `cluster`).
    pub clusters: usize,
    /// Region label.
    pub region: String,
    /// Platform SKU of every node; images must list it to be applicable.
    pub sku: String,
    /// Nodes sharing an NVLink domain (consecutive nodes within a rack). Default: the whole rack.
    pub nodes_per_nvlink_domain: Option<usize>,
    /// Node names are `{name_prefix}-{index:05}`.
    pub name_prefix: String,
    /// Firmware inventory entries of every node, `{a..b}` ranges already expanded.
    pub components: Vec<ComponentSpec>,
}

/// One firmware inventory entry.
#[derive(Debug, Clone)]
pub struct ComponentSpec {
    /// FirmwareInventory member id, e.g. `HGX_FW_GPU_3`.
    pub id: String,
    /// What kind of component this firmware runs on.
    pub kind: ComponentKind,
    /// Initially active version.
    pub version: String,
    /// Whether the inventory says it can be updated.
    pub updateable: bool,
    /// What the inventory reports as `LowestSupportedVersion`, if anything:
    /// the oldest image the component accepts, as a BMC with a burnt
    /// anti-rollback fuse says it.
    pub lowest_supported_version: Option<String>,
}

/// Mean and standard deviation of a normally distributed gauge.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gauge {
    /// Mean.
    pub mean: f64,
    /// Standard deviation (>= 0).
    pub sd: f64,
}

/// Baseline health.
#[derive(Debug, Clone)]
pub struct Baseline {
    /// GPU temperature, Celsius.
    pub gpu_temp_c: Gauge,
    /// GPU power, watts.
    pub gpu_power_w: Gauge,
    /// XID entries per GPU-hour.
    pub xid_errors_per_gpu_hour: f64,
    /// PCIe AER entries per node-hour.
    pub pcie_aer_per_node_hour: f64,
    /// Link degradation entries per node-day.
    pub link_degraded_per_node_day: f64,
    /// How often event rates are re-evaluated: events of one bucket are drawn at its start's rate, so a
    /// firmware effect shows from the first bucket that starts after its activation. The default suits
    /// simulated clocks (hours pass in seconds); a fleet run on wall time with bakes of minutes wants
    /// seconds here, or a regression would start up to a whole bucket after the flash.
    pub event_bucket: Duration,
}

/// Default `baseline.event_bucket`.
pub const DEFAULT_EVENT_BUCKET: Duration = Duration::from_secs(600);

/// A `{min, max}` duration range; draws are uniform in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationRange {
    /// Inclusive lower bound.
    pub min: Duration,
    /// Inclusive upper bound (>= min).
    pub max: Duration,
}

/// How a firmware version behaves when flashed and once active.
#[derive(Debug, Clone)]
pub struct FirmwareSpec {
    /// Component kind the version is for.
    pub kind: ComponentKind,
    /// The version string, as in the image header.
    pub version: String,
    /// Simulated time a flash of this version takes.
    pub flash_time: DurationRange,
    /// Probability that a flash ends in Exception (old version stays).
    pub flash_fail_rate: f64,
    /// Probability that the BMC stops answering after the flash.
    pub brick_rate: f64,
    /// Health effects while active.
    pub effects: Vec<Effect>,
}

/// A change to one metric on a share of nodes.
#[derive(Debug, Clone)]
pub struct Effect {
    /// Which metric moves.
    pub metric: Metric,
    /// Multiplier (1.0 = none).
    pub multiply: f64,
    /// Additive shift (0.0 = none), applied after the multiplier.
    pub add: f64,
    /// Fraction of nodes affected (chosen deterministically from the seed).
    pub share: f64,
    /// Delay after activation (firmware) before the effect starts.
    pub onset: Duration,
}

/// A fleet-wide event: an [`Effect`] active in a window relative to the fleet's start.
#[derive(Debug, Clone)]
pub struct FleetEvent {
    /// The effect (its `onset` is unused).
    pub effect: Effect,
    /// Start, relative to the fleet's start.
    pub at: Duration,
    /// How long it lasts.
    pub duration: Duration,
}

/// Transport-level BMC misbehaviour.
#[derive(Debug, Clone)]
pub struct BmcFaults {
    /// Fraction of Redfish requests answered 503 with `Retry-After`.
    pub unavailable_rate: f64,
    /// Fraction of Redfish requests that hang past any sane client timeout.
    pub timeout_rate: f64,
    /// How long a `Manager.Reset` keeps the BMC silent (simulated time).
    pub reset_time: DurationRange,
    /// How long a `ComputerSystem.Reset` takes before new host firmware is active (simulated time).
    pub reboot_time: DurationRange,
    /// `Retry-After` value sent with 503s (real seconds: clients wait in real time).
    pub retry_after: Duration,
    /// Fraction of nodes (fixed by the seed) whose event log's `Members@odata.nextLink` names the same
    /// page again and again, as a real BMC did (the client must stop at the first repeat).
    pub looping_next_link: f64,
}

/// Flash time for versions the scenario does not describe.
pub const DEFAULT_FLASH_TIME: DurationRange = DurationRange {
    min: Duration::from_secs(60),
    max: Duration::from_secs(120),
};

impl Scenario {
    /// Parses and validates a scenario; the error names the key path and the reason.
    pub fn from_yaml_str(yaml: &str) -> Result<Scenario, ScenarioError> {
        let raw: RawScenario = serde_saphyr::from_str(yaml).map_err(ScenarioError::Syntax)?;
        validate(raw)
    }

    /// The firmware behaviour for `kind`/`version`, if the scenario describes it.
    pub fn firmware_spec(&self, kind: ComponentKind, version: &str) -> Option<(usize, &FirmwareSpec)> {
        self.firmware
            .iter()
            .enumerate()
            .find(|(_, f)| f.kind == kind && f.version == version)
    }
}

fn check_rate(path: &str, v: f64) -> Result<f64, ScenarioError> {
    if !v.is_finite() || v < 0.0 {
        return Err(invalid(path, format!("rate must be a non-negative number, got {v}")));
    }
    Ok(v)
}

fn check_probability(path: &str, v: f64) -> Result<f64, ScenarioError> {
    if !v.is_finite() || !(0.0..=1.0).contains(&v) {
        return Err(invalid(path, format!("must be between 0 and 1, got {v}")));
    }
    Ok(v)
}

fn duration_at(path: &str, raw: &str) -> Result<Duration, ScenarioError> {
    parse_duration(raw).map_err(|reason| invalid(path, reason.to_string()))
}

fn range_at(path: &str, raw: &RawRange) -> Result<DurationRange, ScenarioError> {
    let min = duration_at(&format!("{path}.min"), &raw.min)?;
    let max = duration_at(&format!("{path}.max"), &raw.max)?;
    if max < min {
        return Err(invalid(
            format!("{path}.max"),
            format!("max {} is below min {}", raw.max, raw.min),
        ));
    }
    Ok(DurationRange { min, max })
}

fn count_at(path: &str, v: i64, min: i64) -> Result<usize, ScenarioError> {
    if v < min {
        return Err(invalid(path, format!("must be at least {min}, got {v}")));
    }
    usize::try_from(v).map_err(|_| invalid(path, format!("too large: {v}")))
}

fn parse_kind(path: &str, raw: &str) -> Result<ComponentKind, ScenarioError> {
    raw.parse::<ComponentKind>().map_err(|e| invalid(path, e.to_string()))
}

/// Expands one `{a..b}` range in a component id (`HGX_FW_GPU_{0..7}` -> 8 ids).
fn expand_id(path: &str, id: &str) -> Result<Vec<String>, ScenarioError> {
    let Some(open) = id.find('{') else {
        return Ok(vec![id.to_owned()]);
    };
    let close = id[open..]
        .find('}')
        .map(|i| open + i)
        .ok_or_else(|| invalid(path, "unclosed `{` in id"))?;
    let inner = &id[open + 1..close];
    let (a, b) = inner
        .split_once("..")
        .ok_or_else(|| invalid(path, format!("`{{{inner}}}` is not a range a..b")))?;
    let a: u32 = a
        .trim()
        .parse()
        .map_err(|_| invalid(path, format!("range start `{a}` is not a number")))?;
    let b: u32 = b
        .trim()
        .parse()
        .map_err(|_| invalid(path, format!("range end `{b}` is not a number")))?;
    if b < a || b - a > 1024 {
        return Err(invalid(path, format!("range {a}..{b} is empty or too large")));
    }
    let (prefix, suffix) = (&id[..open], &id[close + 1..]);
    let mut out = Vec::new();
    for i in a..=b {
        // The suffix may hold another range.
        for rest in expand_id(path, suffix)? {
            out.push(format!("{prefix}{i}{rest}"));
        }
    }
    Ok(out)
}

fn effect_at(path: &str, raw: &RawEffect, is_event: bool) -> Result<Effect, ScenarioError> {
    let metric: Metric = raw
        .metric
        .parse()
        .map_err(|reason: String| invalid(format!("{path}.metric"), reason))?;
    if raw.multiply.is_none() && raw.add.is_none() {
        return Err(invalid(path, "an effect needs `multiply` or `add`"));
    }
    let multiply = raw.multiply.unwrap_or(1.0);
    if !multiply.is_finite() || multiply < 0.0 {
        return Err(invalid(
            format!("{path}.multiply"),
            format!("must be a non-negative number, got {multiply}"),
        ));
    }
    let add = raw.add.unwrap_or(0.0);
    if !add.is_finite() {
        return Err(invalid(format!("{path}.add"), "must be a finite number"));
    }
    let share = check_probability(&format!("{path}.share"), raw.share.unwrap_or(1.0))?;
    if is_event {
        if raw.onset.is_some() {
            return Err(invalid(
                format!("{path}.onset"),
                "events use `at` and `duration`, not `onset`",
            ));
        }
    } else if raw.at.is_some() || raw.duration.is_some() {
        return Err(invalid(path, "firmware effects use `onset`, not `at`/`duration`"));
    }
    let onset = match &raw.onset {
        Some(s) => duration_at(&format!("{path}.onset"), s)?,
        None => Duration::ZERO,
    };
    Ok(Effect {
        metric,
        multiply,
        add,
        share,
        onset,
    })
}

fn validate(raw: RawScenario) -> Result<Scenario, ScenarioError> {
    let f = &raw.fleet;
    let nodes = count_at("fleet.nodes", f.nodes, 1)?;
    let racks = count_at("fleet.racks", f.racks, 1)?;
    let clusters = count_at("fleet.clusters", f.clusters, 1)?;
    if clusters > racks {
        return Err(invalid(
            "fleet.clusters",
            format!("{clusters} clusters need at least as many racks ({racks})"),
        ));
    }
    if f.sku.trim().is_empty() {
        return Err(invalid("fleet.sku", "must not be empty"));
    }
    let nodes_per_nvlink_domain = match f.nodes_per_nvlink_domain {
        Some(v) => Some(count_at("fleet.nodes_per_nvlink_domain", v, 1)?),
        None => None,
    };
    let profile = match &raw.platform {
        Some(name) => Some(crate::platform::built_in(name).map_err(|reason| invalid("platform", reason))?),
        None => None,
    };
    // The scenario's own components win; a platform supplies them otherwise.
    let raw_components = match &profile {
        Some(p) if f.components.is_empty() => &p.components,
        _ => &f.components,
    };
    if raw_components.is_empty() {
        return Err(invalid("fleet.components", "at least one component is needed"));
    }
    let update_service = raw
        .update_service
        .clone()
        .or_else(|| profile.as_ref().and_then(|p| p.update_service.clone()))
        .unwrap_or_default();
    let mut components = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, c) in raw_components.iter().enumerate() {
        let path = format!("fleet.components[{i}]");
        let kind = parse_kind(&format!("{path}.kind"), &c.kind)?;
        if c.version.trim().is_empty() {
            return Err(invalid(format!("{path}.version"), "must not be empty"));
        }
        if c.lowest_supported_version.as_ref().is_some_and(|v| v.trim().is_empty()) {
            return Err(invalid(
                format!("{path}.lowest_supported_version"),
                "must not be empty (leave the key out for none)",
            ));
        }
        for id in expand_id(&format!("{path}.id"), &c.id)? {
            if id.is_empty()
                || !id
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
            {
                return Err(invalid(
                    format!("{path}.id"),
                    format!("`{id}` must be non-empty [A-Za-z0-9_-]"),
                ));
            }
            if !seen.insert(id.clone()) {
                return Err(invalid(format!("{path}.id"), format!("duplicate component id `{id}`")));
            }
            components.push(ComponentSpec {
                id,
                kind,
                version: c.version.clone(),
                updateable: c.updateable,
                lowest_supported_version: c.lowest_supported_version.clone(),
            });
        }
    }

    let b = &raw.baseline;
    let gauge = |path: &str, g: &Option<RawGauge>, default: Gauge| -> Result<Gauge, ScenarioError> {
        match g {
            None => Ok(default),
            Some(g) => {
                if !g.mean.is_finite() {
                    return Err(invalid(format!("{path}.mean"), "must be a finite number"));
                }
                if !g.sd.is_finite() || g.sd < 0.0 {
                    return Err(invalid(
                        format!("{path}.sd"),
                        format!("must be non-negative, got {}", g.sd),
                    ));
                }
                Ok(Gauge { mean: g.mean, sd: g.sd })
            }
        }
    };
    let baseline = Baseline {
        gpu_temp_c: gauge("baseline.gpu_temp_c", &b.gpu_temp_c, Gauge { mean: 60.0, sd: 3.0 })?,
        gpu_power_w: gauge("baseline.gpu_power_w", &b.gpu_power_w, Gauge { mean: 500.0, sd: 30.0 })?,
        xid_errors_per_gpu_hour: check_rate(
            "baseline.xid_errors_per_gpu_hour",
            b.xid_errors_per_gpu_hour.unwrap_or(0.0),
        )?,
        pcie_aer_per_node_hour: check_rate(
            "baseline.pcie_aer_per_node_hour",
            b.pcie_aer_per_node_hour.unwrap_or(0.0),
        )?,
        link_degraded_per_node_day: check_rate(
            "baseline.link_degraded_per_node_day",
            b.link_degraded_per_node_day.unwrap_or(0.0),
        )?,
        event_bucket: match &b.event_bucket {
            None => DEFAULT_EVENT_BUCKET,
            Some(raw) => {
                let bucket = duration_at("baseline.event_bucket", raw)?;
                // Entry ids are `bucket * 10_000 + i` and buckets are counted in i32 steps from the
                // fleet's start: a second keeps 68 years of buckets; a day bounds a bucket's draw.
                if bucket < Duration::from_secs(1) || bucket > Duration::from_secs(86_400) {
                    return Err(invalid(
                        "baseline.event_bucket",
                        format!("must be between 1s and 24h, got {raw}"),
                    ));
                }
                bucket
            }
        },
    };

    let mut firmware = Vec::new();
    for (i, fw) in raw.firmware.iter().enumerate() {
        let path = format!("firmware[{i}]");
        let kind = parse_kind(&format!("{path}.kind"), &fw.kind)?;
        if fw.version.trim().is_empty() {
            return Err(invalid(format!("{path}.version"), "must not be empty"));
        }
        let flash_time = match &fw.flash_time {
            Some(r) => range_at(&format!("{path}.flash_time"), r)?,
            None => DEFAULT_FLASH_TIME,
        };
        let flash_fail_rate = check_probability(&format!("{path}.flash_fail_rate"), fw.flash_fail_rate)?;
        let brick_rate = check_probability(&format!("{path}.brick_rate"), fw.brick_rate)?;
        let effects = fw
            .effects
            .iter()
            .enumerate()
            .map(|(j, e)| effect_at(&format!("{path}.effects[{j}]"), e, false))
            .collect::<Result<Vec<_>, _>>()?;
        firmware.push(FirmwareSpec {
            kind,
            version: fw.version.clone(),
            flash_time,
            flash_fail_rate,
            brick_rate,
            effects,
        });
    }

    let mut events = Vec::new();
    for (i, e) in raw.events.iter().enumerate() {
        let path = format!("events[{i}]");
        let effect = effect_at(&path, e, true)?;
        let at = match &e.at {
            Some(s) => duration_at(&format!("{path}.at"), s)?,
            None => return Err(invalid(format!("{path}.at"), "an event needs `at`")),
        };
        let duration = match &e.duration {
            Some(s) => duration_at(&format!("{path}.duration"), s)?,
            None => return Err(invalid(format!("{path}.duration"), "an event needs `duration`")),
        };
        events.push(FleetEvent { effect, at, duration });
    }

    let fa = &raw.bmc_faults;
    let bmc_faults = BmcFaults {
        unavailable_rate: check_probability("bmc_faults.unavailable_rate", fa.unavailable_rate)?,
        timeout_rate: check_probability("bmc_faults.timeout_rate", fa.timeout_rate)?,
        reset_time: match &fa.reset_time {
            Some(r) => range_at("bmc_faults.reset_time", r)?,
            None => DurationRange {
                min: Duration::from_secs(60),
                max: Duration::from_secs(120),
            },
        },
        reboot_time: match &fa.reboot_time {
            Some(r) => range_at("bmc_faults.reboot_time", r)?,
            None => DurationRange {
                min: Duration::from_secs(120),
                max: Duration::from_secs(300),
            },
        },
        retry_after: match &fa.retry_after {
            Some(s) => duration_at("bmc_faults.retry_after", s)?,
            None => Duration::from_secs(1),
        },
        looping_next_link: check_probability("bmc_faults.looping_next_link", fa.looping_next_link)?,
    };
    if bmc_faults.unavailable_rate + bmc_faults.timeout_rate > 1.0 {
        return Err(invalid(
            "bmc_faults",
            "unavailable_rate + timeout_rate must not exceed 1",
        ));
    }

    let gpus = match components.iter().filter(|c| c.kind == ComponentKind::Gpu).count() {
        // Processors GPU_0..7 exist even if the scenario lists no GPU firmware (see `Fleet::start`).
        0 => 8,
        n => n,
    };
    let parts = PartsSpec::from_raw(&raw.parts)?;
    let hardware = HardwareSpec::from_raw(&raw.hardware, &parts, &f.name_prefix, nodes, gpus)?;
    let redfish_layout = match &raw.redfish_layout {
        Some(layout) => {
            layout.check().map_err(|reason| invalid("redfish_layout", reason))?;
            layout.clone()
        }
        None => profile
            .as_ref()
            .and_then(|p| p.redfish_layout.clone())
            .unwrap_or_default(),
    };
    Ok(Scenario {
        redfish_layout,
        platform: raw.platform.clone(),
        update_service,
        seed: raw.seed,
        fleet: FleetSpec {
            nodes,
            racks,
            clusters,
            region: f.region.clone(),
            sku: f.sku.clone(),
            nodes_per_nvlink_domain,
            name_prefix: f.name_prefix.clone(),
            components,
        },
        baseline,
        firmware,
        events,
        bmc_faults,
        dcgm: DcgmSpec::from_raw(&raw.dcgm)?,
        parts,
        hardware,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ok = [
            ("0s", 0),
            ("30s", 30),
            ("5m", 300),
            ("2h", 7200),
            ("1d", 86_400),
            ("1h30m", 5400),
        ];
        for (raw, secs) in ok {
            assert_eq!(parse_duration(raw), Ok(Duration::from_secs(secs)), "{raw}");
        }
        for raw in ["", "5", "m", "5x", "-5m", "1.5h"] {
            assert!(parse_duration(raw).is_err(), "{raw} should fail");
        }
    }

    #[test]
    fn expands_ranges() {
        let ids = expand_id("p", "HGX_FW_GPU_{0..7}").unwrap_or_default();
        assert_eq!(ids.len(), 8);
        assert_eq!(ids[0], "HGX_FW_GPU_0");
        assert_eq!(ids[7], "HGX_FW_GPU_7");
        assert_eq!(expand_id("p", "BMC").unwrap_or_default(), vec!["BMC".to_owned()]);
        assert!(expand_id("p", "X_{3..1}").is_err());
    }

    #[test]
    fn event_bucket_defaults_to_ten_minutes_and_is_bounded() {
        let with = |extra: &str| {
            Scenario::from_yaml_str(&format!(
                "seed: 1\nfleet: {{nodes: 1, racks: 1, clusters: 1, sku: s, components: \
                 [{{id: BMC, kind: bmc, version: \"1.0\"}}]}}\nbaseline: {{{extra}}}\n"
            ))
            .map_err(|e| match e {
                ScenarioError::Invalid { path, reason } => format!("{path}: {reason}"),
                other => format!("{other:?}"),
            })
        };
        assert_eq!(with("").map(|s| s.baseline.event_bucket), Ok(DEFAULT_EVENT_BUCKET));
        assert_eq!(
            with("event_bucket: 15s").map(|s| s.baseline.event_bucket),
            Ok(Duration::from_secs(15))
        );
        for bad in ["0s", "2d", "soon"] {
            let err = with(&format!("event_bucket: {bad}")).expect_err(bad);
            assert!(err.contains("baseline.event_bucket"), "{bad}: {err}");
        }
    }
}
