//! Base rates and exposure units the power analysis and the soak's sizing share: a leaf module, so
//! the planner (which sizes the holdback) and `power` (which quotes power) both use it without
//! depending on each other. Re-exported from [`crate::power`].

use std::collections::BTreeMap;

use orchestrator_policy::{HealthGate, RedfishMetric};

/// GPUs per node unless told otherwise: the HGX baseboards this product
/// targets carry eight. The engine's health collector assumes the same for a
/// node whose inventory names none, and reads it from here so the power quoted
/// and the test that runs count the same units.
pub const DEFAULT_GPUS_PER_NODE: u32 = 8;

/// Baselines used when neither the command line nor history gives one, in
/// one place for `policy power` and the lint. Rates are per unit of the
/// metric's exposure; levels are the between-GPU standard deviation of a
/// GPU's mean over a bake.
///
/// Why these numbers: they are deliberately on the quiet side of what HGX
/// fleets report (rare XIDs, occasional corrected AER, rare link retraining;
/// GPUs of one SKU under comparable load within a few degrees and a few tens
/// of watts of each other). Fewer baseline events and a wider spread make the
/// detectable effect *larger*, so a canary that looks adequate with these
/// defaults is not adequate only because of an optimistic guess. Replace them
/// with `--baseline`/`--sd` (or history) for a real fleet.
pub fn default_baseline(metric: RedfishMetric) -> Option<f64> {
    match metric {
        // One XID per GPU every ~4 days.
        RedfishMetric::XidErrorsPerGpuHour => Some(0.01),
        // One corrected AER entry per node every ~10 hours.
        RedfishMetric::PcieAerPerNodeHour => Some(0.1),
        // One link degradation per node every ~20 days.
        RedfishMetric::LinkDegradedPerNodeDay => Some(0.05),
        // Degrees Celsius.
        RedfishMetric::GpuTempC => Some(3.0),
        // Watts.
        RedfishMetric::GpuPowerW => Some(40.0),
        // Not judged against a control (the failure budget covers it).
        RedfishMetric::FlashFailures => None,
    }
}

/// What a rate metric counts its exposure in: `(unit counted, exposure
/// unit, exposure per unit per hour of bake)`, e.g. `("gpu", "gpu-hour",
/// 1.0)`. Public so the pages name the same unit the power analysis and
/// the judge count in.
pub fn rate_exposure_unit(metric: RedfishMetric) -> (&'static str, &'static str, f64) {
    match metric {
        RedfishMetric::XidErrorsPerGpuHour => ("gpu", "gpu-hour", 1.0),
        RedfishMetric::LinkDegradedPerNodeDay => ("node", "node-day", 1.0 / 24.0),
        _ => ("node", "node-hour", 1.0),
    }
}

/// A given baseline for `gate`, by gate name or else by metric name.
pub(crate) fn lookup<'a>(
    map: &'a BTreeMap<String, f64>,
    gate: &HealthGate,
    metric: Option<RedfishMetric>,
) -> Option<&'a f64> {
    map.get(&gate.name).or_else(|| metric.and_then(|m| map.get(m.as_str())))
}
