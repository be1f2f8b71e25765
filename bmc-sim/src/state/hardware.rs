//! GPUs as parts and their hardware failures: the ground truth the RMA pipeline is tested against.
//!
//! Every GPU slot holds a history of installed parts (the original, then each replacement). A part's
//! serial, lot and failure are drawn when it is installed, from (seed, node, GPU, generation), so a run is
//! reproducible and a replacement never changes what the original part did. A part fails at most once
//! (hardware failures are permanent until the part is replaced); its failure's log entries, telemetry and
//! Redfish status follow from the onset and the simulated time, like every other reading here.
//!
//! Invariant: a failure shows only while its part is installed; log entries written before a
//! replacement stay in the log, as they do on a real BMC.

use std::collections::HashMap;

use chrono::{DateTime, Duration, NaiveDate, Utc};
use serde::Serialize;

use super::{EventKind, FleetState, NodeMut};
use crate::rng::{self, Purpose};
use crate::scenario::{HardwareFailureMode, LotSpec, Scenario};

/// A failure drawn for one part.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PartFailure {
    pub mode: HardwareFailureMode,
    pub onset: DateTime<Utc>,
    pub explicit: bool,
}

/// One part in a GPU slot.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct InstalledPart {
    pub serial: String,
    /// Index into [`PartsPlan::lots`] (the spare lot is last).
    pub lot: usize,
    pub installed_at: DateTime<Utc>,
    pub removed_at: Option<DateTime<Utc>>,
    /// 0 for the part the fleet started with, +1 per replacement.
    pub generation: u64,
    pub failure: Option<PartFailure>,
}

impl InstalledPart {
    fn installed_during(&self, t: DateTime<Utc>) -> bool {
        self.installed_at <= t && self.removed_at.is_none_or(|r| t < r)
    }
}

/// The XID entries a failure writes, as offsets from its onset. Fallen off the bus repeats while the
/// driver retries the device (NVIDIA's XID catalogue: 79 "GPU has fallen off the bus"); a row-remap
/// failure is reported once (XID 64); uncorrectable ECC (XID 48) recurs as the bad page is touched again.
fn xid_schedule(mode: HardwareFailureMode) -> &'static [(i64, u16)] {
    match mode {
        HardwareFailureMode::FallenOffBus => &[(0, 79), (10, 79), (25, 79)],
        HardwareFailureMode::RowRemapFailure => &[(0, 64)],
        HardwareFailureMode::UncorrectableEcc => &[(0, 48), (4, 48), (9, 48)],
    }
}

/// What the fleet knows about parts, fixed at start.
#[derive(Debug)]
pub(crate) struct PartsPlan {
    /// The scenario's lots, then the spare lot.
    pub lots: Vec<LotSpec>,
    /// Failure-rate multiplier per lot, same order.
    multipliers: Vec<f64>,
    slots: u64,
    serial_mul: u64,
    serial_add: u64,
    modulus: u64,
    horizon_end: DateTime<Utc>,
    /// (node, gpu) -> scripted failure of the original part.
    explicit: HashMap<(usize, usize), (HardwareFailureMode, DateTime<Utc>)>,
    /// Lot of each original part, by slot (`node * gpus + gpu`).
    initial_lots: Vec<usize>,
    gpus: usize,
}

/// Why a GPU could not be replaced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplaceError {
    /// No node of that name.
    #[error("no node named `{0}`")]
    NoNode(String),
    /// The node has no such GPU.
    #[error("node `{node}` has no GPU {gpu} (0-based)")]
    NoGpu {
        /// Node name.
        node: String,
        /// The index asked for.
        gpu: usize,
    },
    /// `parts.serial_digits` leaves no unused serial for another replacement.
    #[error("no serial left for another replacement (raise parts.serial_digits)")]
    SerialsExhausted,
}

impl PartsPlan {
    pub(crate) fn new(scenario: &Scenario, node_names: &[String], gpus: usize, epoch: DateTime<Utc>) -> Self {
        let parts = &scenario.parts;
        let hw = &scenario.hardware;
        let seed = scenario.seed;
        let mut lots = parts.lots.clone();
        lots.push(parts.spare_lot.clone());
        let multipliers = lots.iter().map(|l| hw.lot_multiplier(&l.id)).collect();
        let modulus = 10u64.pow(parts.serial_digits);
        // Ends in 7: coprime with 10^d, so `mul * i + add` visits every serial once before repeating.
        let serial_mul = (rng::key(seed, 0, Purpose::PartSerial, 0, 0) % (modulus / 10)) * 10 + 7;
        let serial_add = rng::key(seed, 0, Purpose::PartSerial, 1, 0) % modulus;
        let slots = (node_names.len() * gpus) as u64;
        let explicit = hw
            .failures
            .iter()
            .filter_map(|f| {
                let node = node_names.iter().position(|n| *n == f.node)?;
                let at = Duration::from_std(f.at).ok()?;
                Some(((node, f.gpu), (f.mode, epoch + at)))
            })
            .collect();
        Self {
            initial_lots: assign_lots(seed, slots, &parts.lots),
            lots,
            multipliers,
            slots,
            serial_mul,
            serial_add,
            modulus,
            horizon_end: epoch + Duration::from_std(hw.horizon).unwrap_or(Duration::MAX),
            explicit,
            gpus,
        }
    }

    fn serial(&self, scenario: &Scenario, index: u64) -> Option<String> {
        if index >= self.modulus {
            return None;
        }
        let n = ((self.serial_mul as u128 * index as u128 + self.serial_add as u128) % self.modulus as u128) as u64;
        let digits = scenario.parts.serial_digits as usize;
        Some(format!("{}{n:0digits$}", scenario.parts.serial_prefix))
    }

    /// Installs a part of `lot` in (node, gpu) at `at`, drawing its serial and failure.
    fn install(
        &self,
        scenario: &Scenario,
        node: usize,
        gpu: usize,
        generation: u64,
        lot: usize,
        at: DateTime<Utc>,
    ) -> Option<InstalledPart> {
        let slot = (node * self.gpus + gpu) as u64;
        let serial = self.serial(scenario, generation.checked_mul(self.slots)?.checked_add(slot)?)?;
        let seed = scenario.seed;
        let sub = gpu as u64;
        let explicit = (generation == 0)
            .then(|| self.explicit.get(&(node, gpu)))
            .flatten()
            .map(|&(mode, onset)| PartFailure {
                mode,
                onset,
                explicit: true,
            });
        let random = || {
            let rate = scenario.hardware.failures_per_gpu_hour * self.multipliers.get(lot).copied().unwrap_or(1.0);
            if rate <= 0.0 {
                return None;
            }
            // Exponential time to failure: a constant hazard, as for random (non-wear-out) hardware faults.
            let u = rng::unit(seed, node as u64, Purpose::HwFailure, sub, generation);
            let hours = -(1.0 - u).ln() / rate;
            let ms = hours * 3_600_000.0;
            if !ms.is_finite() || ms >= i64::MAX as f64 / 2.0 {
                return None;
            }
            let onset = at + Duration::milliseconds(ms as i64);
            if onset >= self.horizon_end {
                return None;
            }
            let pick = rng::unit(seed, node as u64, Purpose::HwMode, sub, generation);
            let w = scenario.hardware.mode_weights;
            let mut acc = 0.0;
            let mode = HardwareFailureMode::ALL
                .into_iter()
                .zip(w)
                .find(|(_, weight)| {
                    acc += weight;
                    pick < acc
                })
                .map_or(HardwareFailureMode::UncorrectableEcc, |(m, _)| m);
            Some(PartFailure {
                mode,
                onset,
                explicit: false,
            })
        };
        Some(InstalledPart {
            serial,
            lot,
            installed_at: at,
            removed_at: None,
            generation,
            failure: explicit.or_else(random),
        })
    }

    /// The parts node `node` starts with, one per GPU.
    pub(crate) fn initial_parts(
        &self,
        scenario: &Scenario,
        node: usize,
        epoch: DateTime<Utc>,
    ) -> Vec<Vec<InstalledPart>> {
        (0..self.gpus)
            .map(|g| {
                let lot = self.initial_lots.get(node * self.gpus + g).copied().unwrap_or(0);
                self.install(scenario, node, g, 0, lot, epoch).into_iter().collect()
            })
            .collect()
    }

    /// Whether every original part gets a serial.
    pub(crate) fn serials_suffice(&self) -> bool {
        self.slots <= self.modulus
    }

    fn spare_lot(&self) -> usize {
        self.lots.len() - 1
    }
}

/// Lot of each slot: the slots in a seeded random order, cut into runs sized by the lots' shares, so a
/// lot's share is exact (a 3% lot of 512 GPUs has 15) and its GPUs are scattered over nodes.
fn assign_lots(seed: u64, slots: u64, lots: &[LotSpec]) -> Vec<usize> {
    let mut order: Vec<(u64, u64)> = (0..slots)
        .map(|s| (rng::key(seed, s, Purpose::PartLot, 0, 0), s))
        .collect();
    order.sort_unstable();
    let mut out = vec![0; slots as usize];
    let mut cumulative = 0.0;
    let mut start = 0usize;
    for (i, lot) in lots.iter().enumerate() {
        cumulative += lot.share;
        let end = if i + 1 == lots.len() {
            slots as usize
        } else {
            ((cumulative * slots as f64).round() as usize).min(slots as usize)
        };
        for &(_, s) in order.get(start..end.max(start)).unwrap_or(&[]) {
            out[s as usize] = i;
        }
        start = end.max(start);
    }
    out
}

/// A GPU as a part, as the parts manifest and the tests see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuPart {
    /// Node name.
    pub node: String,
    /// 0-based GPU index.
    pub gpu: usize,
    /// Serial number (`Processor.SerialNumber`).
    pub serial: String,
    /// Part number (`Processor.PartNumber`).
    pub part_number: String,
    /// Manufacturing lot (manifest only: Redfish has no lot property).
    pub lot: String,
    /// The manifest's date code.
    pub date_code: String,
    /// `Assembly.ProductionDate`.
    pub production_date: NaiveDate,
    /// When it went into the slot (the fleet's start for original parts).
    pub installed_at: DateTime<Utc>,
    /// When it was replaced, if it was.
    pub removed_at: Option<DateTime<Utc>>,
}

/// A hardware failure, as ground truth.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HardwareFailure {
    /// Node name.
    pub node: String,
    /// 0-based GPU index.
    pub gpu: usize,
    /// The failing part's serial.
    pub serial: String,
    /// Its part number.
    pub part_number: String,
    /// Its lot.
    pub lot: String,
    /// What failed.
    pub mode: HardwareFailureMode,
    /// When it began.
    pub onset: DateTime<Utc>,
    /// Scripted in `hardware.failures` (else drawn from the rates).
    pub explicit: bool,
    /// When the part was replaced, if it was.
    pub replaced_at: Option<DateTime<Utc>>,
}

impl FleetState {
    /// The part in (gpu) at `t`, if one was installed then.
    pub(crate) fn part_at<'a>(&self, m: &'a NodeMut, gpu: usize, t: DateTime<Utc>) -> Option<&'a InstalledPart> {
        m.gpu_parts.get(gpu)?.iter().rev().find(|p| p.installed_during(t))
    }

    /// The failure of the part in `gpu` at `t`, once begun.
    pub(crate) fn failure_at(&self, m: &NodeMut, gpu: usize, t: DateTime<Utc>) -> Option<PartFailure> {
        self.part_at(m, gpu, t)?.failure.filter(|f| f.onset <= t)
    }

    /// The XID entries hardware failures write in [from, to), only while the failing part is installed.
    pub(crate) fn hardware_events(
        &self,
        m: &NodeMut,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Vec<(DateTime<Utc>, EventKind)> {
        let mut out = Vec::new();
        for (g, parts) in m.gpu_parts.iter().enumerate() {
            for p in parts {
                let Some(f) = p.failure else { continue };
                for &(minutes, code) in xid_schedule(f.mode) {
                    let at = f.onset + Duration::minutes(minutes);
                    if at >= from && at < to && p.installed_during(at) {
                        out.push((at, EventKind::Xid { gpu: g as u8, code }));
                    }
                }
            }
        }
        out
    }

    fn gpu_part(&self, node: &str, gpu: usize, p: &InstalledPart) -> GpuPart {
        let lot = &self.parts_plan.lots[p.lot.min(self.parts_plan.lots.len() - 1)];
        GpuPart {
            node: node.to_owned(),
            gpu,
            serial: p.serial.clone(),
            part_number: lot.part_number.clone(),
            lot: lot.id.clone(),
            date_code: lot.date_code.clone(),
            production_date: lot.production_date,
            installed_at: p.installed_at,
            removed_at: p.removed_at,
        }
    }

    /// The part data of the part in `gpu` now (for Redfish and diagnostics).
    pub(crate) fn current_part(&self, node: &str, m: &NodeMut, gpu: usize, now: DateTime<Utc>) -> Option<GpuPart> {
        self.part_at(m, gpu, now).map(|p| self.gpu_part(node, gpu, p))
    }

    /// Every part ever installed, node by node, GPU by GPU, oldest first.
    pub(crate) fn all_parts(&self) -> Vec<GpuPart> {
        let mut out = Vec::new();
        for n in &self.nodes {
            let m = n.lock();
            for (g, parts) in m.gpu_parts.iter().enumerate() {
                out.extend(parts.iter().map(|p| self.gpu_part(&n.name, g, p)));
            }
        }
        out
    }

    /// Failures that happen while their part is installed: begun by `now`, or all when `now` is `None`.
    pub(crate) fn failures(&self, now: Option<DateTime<Utc>>) -> Vec<HardwareFailure> {
        let mut out = Vec::new();
        for n in &self.nodes {
            let m = n.lock();
            for (g, parts) in m.gpu_parts.iter().enumerate() {
                for p in parts {
                    let Some(f) = p.failure else { continue };
                    if !p.installed_during(f.onset) || now.is_some_and(|now| f.onset > now) {
                        continue;
                    }
                    let part = self.gpu_part(&n.name, g, p);
                    out.push(HardwareFailure {
                        node: n.name.clone(),
                        gpu: g,
                        serial: part.serial,
                        part_number: part.part_number,
                        lot: part.lot,
                        mode: f.mode,
                        onset: f.onset,
                        explicit: f.explicit,
                        replaced_at: p.removed_at,
                    });
                }
            }
        }
        out.sort_by(|a, b| (a.onset, &a.node, a.gpu).cmp(&(b.onset, &b.node, b.gpu)));
        out
    }

    /// Puts a new part from the spare lot into (node, gpu) at `now`; the old part's failure ends with it.
    pub(crate) fn replace_gpu(&self, node: &str, gpu: usize) -> Result<GpuPart, ReplaceError> {
        let n = self
            .node_by_name(node)
            .ok_or_else(|| ReplaceError::NoNode(node.to_owned()))?;
        let now = self.now();
        let mut m = n.lock();
        let slot = m.gpu_parts.get_mut(gpu).ok_or_else(|| ReplaceError::NoGpu {
            node: node.to_owned(),
            gpu,
        })?;
        let generation = slot.iter().map(|p| p.generation + 1).max().unwrap_or(0);
        let new = self
            .parts_plan
            .install(
                &self.scenario,
                n.index,
                gpu,
                generation,
                self.parts_plan.spare_lot(),
                now,
            )
            .ok_or(ReplaceError::SerialsExhausted)?;
        for p in slot.iter_mut().filter(|p| p.removed_at.is_none()) {
            p.removed_at = Some(now);
        }
        slot.push(new);
        let installed = slot.last().map(|p| self.gpu_part(node, gpu, p));
        installed.ok_or(ReplaceError::SerialsExhausted)
    }
}

/// The parts manifest's header: exactly the columns `orchestrator_db::parts::MANIFEST_COLUMNS` reads.
pub const PARTS_MANIFEST_COLUMNS: [&str; 5] = ["serial", "part_number", "lot", "date_code", "production_date"];

/// Renders parts as a factory's parts manifest (CSV, header first, one row per serial).
pub(crate) fn manifest_csv(parts: &[GpuPart]) -> String {
    let mut out = PARTS_MANIFEST_COLUMNS.join(",");
    out.push('\n');
    for p in parts {
        let row = [
            p.serial.as_str(),
            p.part_number.as_str(),
            p.lot.as_str(),
            p.date_code.as_str(),
            &p.production_date.format("%Y-%m-%d").to_string(),
        ]
        .map(crate::csv_field);
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lot(id: &str, share: f64) -> LotSpec {
        LotSpec {
            id: id.to_owned(),
            share,
            production_date: NaiveDate::default(),
            date_code: String::new(),
            part_number: String::new(),
        }
    }

    #[test]
    fn lot_shares_are_exact() {
        let lots = [lot("a", 0.03), lot("b", 0.5), lot("c", 0.47)];
        let assigned = assign_lots(7, 512, &lots);
        let count = |i| assigned.iter().filter(|&&l| l == i).count();
        assert_eq!((count(0), count(1), count(2)), (15, 256, 241));
        assert_eq!(assigned, assign_lots(7, 512, &lots));
    }
}
