//! The scenario's `parts:` and `hardware:` sections: what each GPU is as a part (serial, part number,
//! lot, production date) and how GPUs fail as hardware (a base rate, a raised rate for defective lots,
//! explicit failures). Both optional: without them every GPU still gets a serial, a part number and a
//! lot, and nothing fails.
//!
//! Unknown keys and unknown failure modes are refused by serde, so the message carries the file's line
//! and column like every other syntax error; value problems name their key path.

use std::time::Duration;

use chrono::{Datelike, NaiveDate};
use serde::Deserialize;

use super::{ScenarioError, invalid};

/// How a GPU fails as hardware (the failure modes NVIDIA's RMA and memory-error documents name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HardwareFailureMode {
    /// The GPU drops off PCIe: XID 79, its telemetry stops, its Processor goes `UnavailableOffline`.
    FallenOffBus,
    /// Row remapping ran out of spare rows: `DCGM_FI_DEV_ROW_REMAP_FAILURE` 1 and XID 64.
    RowRemapFailure,
    /// Uncorrectable (double-bit) ECC errors: XID 48.
    UncorrectableEcc,
}

impl HardwareFailureMode {
    /// Every mode, in the order `hardware.modes` weights are drawn.
    pub const ALL: [HardwareFailureMode; 3] = [
        HardwareFailureMode::FallenOffBus,
        HardwareFailureMode::RowRemapFailure,
        HardwareFailureMode::UncorrectableEcc,
    ];

    /// The scenario-file spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            HardwareFailureMode::FallenOffBus => "fallen_off_bus",
            HardwareFailureMode::RowRemapFailure => "row_remap_failure",
            HardwareFailureMode::UncorrectableEcc => "uncorrectable_ecc",
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawParts {
    #[serde(default)]
    manufacturer: Option<String>,
    #[serde(default)]
    serial_prefix: Option<String>,
    #[serde(default)]
    serial_digits: Option<u32>,
    #[serde(default)]
    part_numbers: Vec<String>,
    #[serde(default)]
    lots: Vec<RawLot>,
    #[serde(default)]
    spare_lot: Option<RawLot>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLot {
    id: String,
    #[serde(default)]
    share: Option<f64>,
    #[serde(default)]
    production_date: Option<String>,
    #[serde(default)]
    date_code: Option<String>,
    #[serde(default)]
    part_number: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHardware {
    #[serde(default)]
    failures_per_gpu_hour: Option<f64>,
    #[serde(default)]
    horizon: Option<String>,
    #[serde(default)]
    modes: Option<RawModes>,
    #[serde(default)]
    defective_lots: Vec<RawDefectiveLot>,
    #[serde(default)]
    failures: Vec<RawFailure>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModes {
    #[serde(default)]
    fallen_off_bus: f64,
    #[serde(default)]
    row_remap_failure: f64,
    #[serde(default)]
    uncorrectable_ecc: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefectiveLot {
    lot: String,
    multiply: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFailure {
    node: String,
    gpu: i64,
    mode: HardwareFailureMode,
    at: String,
}

/// One manufacturing lot.
#[derive(Debug, Clone, PartialEq)]
pub struct LotSpec {
    /// Lot id as a factory's manifest names it (`LOT-2311`).
    pub id: String,
    /// Fraction of the fleet's GPUs from this lot (resolved: lots without `share` split the rest).
    pub share: f64,
    /// When the lot was made; every part of the lot carries it (Redfish `Assembly.ProductionDate`).
    pub production_date: NaiveDate,
    /// The manifest's date code (`YYWW` of the production date unless given).
    pub date_code: String,
    /// Part number of every part of the lot.
    pub part_number: String,
}

/// Validated `parts:` section.
#[derive(Debug, Clone, PartialEq)]
pub struct PartsSpec {
    /// `Processor.Manufacturer` and the Assembly's `Vendor`/`Producer`.
    pub manufacturer: String,
    /// Serials are this prefix and `serial_digits` digits.
    pub serial_prefix: String,
    /// Digits after the prefix; unique serials up to 10^digits parts (originals and replacements).
    pub serial_digits: u32,
    /// Part numbers in use (lots name one each).
    pub part_numbers: Vec<String>,
    /// The lots the fleet's GPUs come from; shares sum to 1.
    pub lots: Vec<LotSpec>,
    /// Where replacement GPUs come from (share unused).
    pub spare_lot: LotSpec,
}

/// A lot with a raised failure rate.
#[derive(Debug, Clone, PartialEq)]
pub struct DefectiveLot {
    /// Lot id (one of `parts.lots` or the spare lot).
    pub lot: String,
    /// Factor on `failures_per_gpu_hour` for the lot's parts.
    pub multiply: f64,
}

/// One scripted failure.
#[derive(Debug, Clone, PartialEq)]
pub struct ExplicitFailure {
    /// Node name (`node-00003`).
    pub node: String,
    /// 0-based GPU index on the node.
    pub gpu: usize,
    /// What fails.
    pub mode: HardwareFailureMode,
    /// Onset, relative to the fleet's start.
    pub at: Duration,
}

/// Validated `hardware:` section.
#[derive(Debug, Clone, PartialEq)]
pub struct HardwareSpec {
    /// Base rate of random failures per GPU-hour (each part fails at most once).
    pub failures_per_gpu_hour: f64,
    /// Random failures are drawn in [start, start + horizon), so the schedule is a finite list.
    pub horizon: Duration,
    /// Weights among the modes, in [`HardwareFailureMode::ALL`] order, summing to 1.
    pub mode_weights: [f64; 3],
    /// Lots with a raised rate.
    pub defective_lots: Vec<DefectiveLot>,
    /// Scripted failures of the original parts (a replacement part only fails at random).
    pub failures: Vec<ExplicitFailure>,
}

/// Part number of an HGX H100 80GB SXM5 module, the default when a scenario names none.
const DEFAULT_PART_NUMBER: &str = "692-2G520-0200-000";
const DEFAULT_HORIZON: Duration = Duration::from_secs(90 * 86_400);

fn date_at(path: &str, raw: &str) -> Result<NaiveDate, ScenarioError> {
    NaiveDate::parse_from_str(raw.trim(), "%Y-%m-%d")
        .map_err(|_| invalid(path, format!("`{raw}` is not a date (YYYY-MM-DD)")))
}

/// `YYWW` of the ISO week, the way GPU date codes print it.
fn date_code_of(d: NaiveDate) -> String {
    let w = d.iso_week();
    format!("{:02}{:02}", w.year().rem_euclid(100), w.week())
}

fn default_lots(part_number: &str) -> Vec<LotSpec> {
    // Four lots a month apart: enough levels for a grouping to mean something.
    let first = NaiveDate::from_ymd_opt(2024, 1, 8).unwrap_or_default();
    (0..4)
        .map(|i| {
            let production_date = first + chrono::Duration::weeks(4 * i);
            let date_code = date_code_of(production_date);
            LotSpec {
                id: format!("LOT-{date_code}"),
                share: 0.25,
                production_date,
                date_code,
                part_number: part_number.to_owned(),
            }
        })
        .collect()
}

impl PartsSpec {
    pub(crate) fn from_raw(raw: &RawParts) -> Result<Self, ScenarioError> {
        let manufacturer = raw.manufacturer.clone().unwrap_or_else(|| "NVIDIA".to_owned());
        if manufacturer.trim().is_empty() {
            return Err(invalid("parts.manufacturer", "must not be empty"));
        }
        let serial_prefix = raw.serial_prefix.clone().unwrap_or_else(|| "1654".to_owned());
        if !serial_prefix.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(invalid("parts.serial_prefix", "must be [A-Za-z0-9-]"));
        }
        let serial_digits = raw.serial_digits.unwrap_or(9);
        if !(6..=12).contains(&serial_digits) {
            return Err(invalid(
                "parts.serial_digits",
                format!("must be between 6 and 12, got {serial_digits}"),
            ));
        }
        let part_numbers = if raw.part_numbers.is_empty() {
            vec![DEFAULT_PART_NUMBER.to_owned()]
        } else {
            raw.part_numbers.clone()
        };
        for (i, p) in part_numbers.iter().enumerate() {
            if p.trim().is_empty() || part_numbers[..i].contains(p) {
                return Err(invalid(
                    format!("parts.part_numbers[{i}]"),
                    "must be non-empty and not repeated",
                ));
            }
        }
        let lot_at = |path: &str, i: usize, l: &RawLot| -> Result<LotSpec, ScenarioError> {
            if l.id.trim().is_empty() || l.id.contains([',', '"', '\n']) {
                return Err(invalid(
                    format!("{path}.id"),
                    "must be non-empty, without , \" or newline",
                ));
            }
            let production_date = match &l.production_date {
                Some(d) => date_at(&format!("{path}.production_date"), d)?,
                None => default_lots(DEFAULT_PART_NUMBER)[i % 4].production_date,
            };
            let part_number = match &l.part_number {
                Some(p) if part_numbers.contains(p) => p.clone(),
                Some(p) => {
                    return Err(invalid(
                        format!("{path}.part_number"),
                        format!("`{p}` is not in parts.part_numbers"),
                    ));
                }
                None => part_numbers[i % part_numbers.len()].clone(),
            };
            let share = match l.share {
                Some(s) if !s.is_finite() || !(0.0..=1.0).contains(&s) => {
                    return Err(invalid(
                        format!("{path}.share"),
                        format!("must be between 0 and 1, got {s}"),
                    ));
                }
                Some(s) => s,
                None => f64::NAN,
            };
            Ok(LotSpec {
                id: l.id.clone(),
                share,
                production_date,
                date_code: l.date_code.clone().unwrap_or_else(|| date_code_of(production_date)),
                part_number,
            })
        };
        let mut lots = if raw.lots.is_empty() {
            default_lots(&part_numbers[0])
        } else {
            raw.lots
                .iter()
                .enumerate()
                .map(|(i, l)| lot_at(&format!("parts.lots[{i}]"), i, l))
                .collect::<Result<Vec<_>, _>>()?
        };
        for (i, l) in lots.iter().enumerate() {
            if lots[..i].iter().any(|o| o.id == l.id) {
                return Err(invalid(
                    format!("parts.lots[{i}].id"),
                    format!("duplicate lot `{}`", l.id),
                ));
            }
        }
        let given: f64 = lots.iter().filter(|l| !l.share.is_nan()).map(|l| l.share).sum();
        let open = lots.iter().filter(|l| l.share.is_nan()).count();
        if given > 1.0 + 1e-9 {
            return Err(invalid("parts.lots", format!("shares sum to {given}, more than 1")));
        }
        if open == 0 && given < 1.0 - 1e-9 {
            return Err(invalid(
                "parts.lots",
                format!("shares sum to {given}; give 1 in total or leave a lot without `share` to take the rest"),
            ));
        }
        let rest = if open == 0 {
            0.0
        } else {
            (1.0 - given).max(0.0) / open as f64
        };
        for l in lots.iter_mut().filter(|l| l.share.is_nan()) {
            l.share = rest;
        }
        let spare_lot = match &raw.spare_lot {
            Some(l) => {
                let mut spare = lot_at("parts.spare_lot", 0, l)?;
                if l.production_date.is_none() {
                    spare.production_date = latest(&lots) + chrono::Duration::weeks(4);
                    spare.date_code = l
                        .date_code
                        .clone()
                        .unwrap_or_else(|| date_code_of(spare.production_date));
                }
                spare.share = 0.0;
                if lots.iter().any(|o| o.id == spare.id) {
                    return Err(invalid(
                        "parts.spare_lot.id",
                        format!("`{}` is also in parts.lots", spare.id),
                    ));
                }
                spare
            }
            None => {
                let production_date = latest(&lots) + chrono::Duration::weeks(4);
                LotSpec {
                    id: "LOT-SPARE".to_owned(),
                    share: 0.0,
                    production_date,
                    date_code: date_code_of(production_date),
                    part_number: part_numbers[0].clone(),
                }
            }
        };
        Ok(Self {
            manufacturer,
            serial_prefix,
            serial_digits,
            part_numbers,
            lots,
            spare_lot,
        })
    }
}

fn latest(lots: &[LotSpec]) -> NaiveDate {
    lots.iter().map(|l| l.production_date).max().unwrap_or_default()
}

impl Default for PartsSpec {
    fn default() -> Self {
        let lots = default_lots(DEFAULT_PART_NUMBER);
        let production_date = latest(&lots) + chrono::Duration::weeks(4);
        Self {
            manufacturer: "NVIDIA".to_owned(),
            serial_prefix: "1654".to_owned(),
            serial_digits: 9,
            part_numbers: vec![DEFAULT_PART_NUMBER.to_owned()],
            lots,
            spare_lot: LotSpec {
                id: "LOT-SPARE".to_owned(),
                share: 0.0,
                production_date,
                date_code: date_code_of(production_date),
                part_number: DEFAULT_PART_NUMBER.to_owned(),
            },
        }
    }
}

impl HardwareSpec {
    /// `nodes`, `name_prefix` and `gpus` are the fleet's, to check explicit failures name real GPUs.
    pub(crate) fn from_raw(
        raw: &RawHardware,
        parts: &PartsSpec,
        name_prefix: &str,
        nodes: usize,
        gpus: usize,
    ) -> Result<Self, ScenarioError> {
        let rate = raw.failures_per_gpu_hour.unwrap_or(0.0);
        if !rate.is_finite() || rate < 0.0 {
            return Err(invalid(
                "hardware.failures_per_gpu_hour",
                format!("must be a non-negative number, got {rate}"),
            ));
        }
        let horizon = match &raw.horizon {
            Some(h) => super::duration_at("hardware.horizon", h)?,
            None => DEFAULT_HORIZON,
        };
        let mode_weights = match &raw.modes {
            None => [0.4, 0.3, 0.3],
            Some(m) => {
                let w = [m.fallen_off_bus, m.row_remap_failure, m.uncorrectable_ecc];
                if w.iter().any(|v| !v.is_finite() || *v < 0.0) {
                    return Err(invalid("hardware.modes", "weights must be non-negative numbers"));
                }
                let total: f64 = w.iter().sum();
                if total <= 0.0 {
                    return Err(invalid("hardware.modes", "at least one weight must be above 0"));
                }
                w.map(|v| v / total)
            }
        };
        let mut defective_lots = Vec::new();
        for (i, d) in raw.defective_lots.iter().enumerate() {
            let path = format!("hardware.defective_lots[{i}]");
            if !parts.lots.iter().chain([&parts.spare_lot]).any(|l| l.id == d.lot) {
                return Err(invalid(
                    format!("{path}.lot"),
                    format!("no lot `{}` in parts.lots", d.lot),
                ));
            }
            if !d.multiply.is_finite() || d.multiply < 0.0 {
                return Err(invalid(
                    format!("{path}.multiply"),
                    format!("must be a non-negative number, got {}", d.multiply),
                ));
            }
            defective_lots.push(DefectiveLot {
                lot: d.lot.clone(),
                multiply: d.multiply,
            });
        }
        let mut failures: Vec<ExplicitFailure> = Vec::new();
        for (i, f) in raw.failures.iter().enumerate() {
            let path = format!("hardware.failures[{i}]");
            let index = f
                .node
                .strip_prefix(name_prefix)
                .and_then(|r| r.strip_prefix('-'))
                .filter(|d| d.len() >= 5 && d.chars().all(|c| c.is_ascii_digit()))
                .and_then(|d| d.parse::<usize>().ok());
            if !index.is_some_and(|n| n < nodes && f.node == format!("{name_prefix}-{n:05}")) {
                return Err(invalid(
                    format!("{path}.node"),
                    format!(
                        "`{}` is not a node of this fleet ({name_prefix}-00000 .. {name_prefix}-{:05})",
                        f.node,
                        nodes.saturating_sub(1)
                    ),
                ));
            }
            let gpu = usize::try_from(f.gpu).ok().filter(|g| *g < gpus).ok_or_else(|| {
                invalid(
                    format!("{path}.gpu"),
                    format!("must be 0..{gpus} (0-based), got {}", f.gpu),
                )
            })?;
            if failures.iter().any(|o| o.node == f.node && o.gpu == gpu) {
                // A part fails once; a second failure of the same GPU is a typo, not a plan.
                return Err(invalid(
                    path,
                    format!("{} GPU {gpu} already has a failure (a part fails once)", f.node),
                ));
            }
            failures.push(ExplicitFailure {
                node: f.node.clone(),
                gpu,
                mode: f.mode,
                at: super::duration_at(&format!("{path}.at"), &f.at)?,
            });
        }
        Ok(Self {
            failures_per_gpu_hour: rate,
            horizon,
            mode_weights,
            defective_lots,
            failures,
        })
    }

    /// The rate multiplier of `lot`.
    pub fn lot_multiplier(&self, lot: &str) -> f64 {
        self.defective_lots
            .iter()
            .filter(|d| d.lot == lot)
            .map(|d| d.multiply)
            .product()
    }
}

impl Default for HardwareSpec {
    fn default() -> Self {
        Self {
            failures_per_gpu_hour: 0.0,
            horizon: DEFAULT_HORIZON,
            mode_weights: [0.4, 0.3, 0.3],
            defective_lots: Vec::new(),
            failures: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn date_codes_are_iso_year_and_week() {
        assert_eq!(date_code_of(NaiveDate::from_ymd_opt(2024, 3, 11).unwrap()), "2411");
        // ISO week 1 of 2025 starts on 2024-12-30.
        assert_eq!(date_code_of(NaiveDate::from_ymd_opt(2024, 12, 30).unwrap()), "2501");
    }

    #[test]
    fn defaults_cover_the_fleet() {
        let p = PartsSpec::default();
        let total: f64 = p.lots.iter().map(|l| l.share).sum();
        assert!((total - 1.0).abs() < 1e-9);
        assert_eq!(p.lots[0].id, "LOT-2402");
    }
}
