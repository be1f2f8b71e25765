//! Base rates and exposure units the power analysis and the soak's sizing share: a leaf module, so
//! the planner (which sizes the holdback) and `power` (which quotes power) both use it without
//! depending on each other. Re-exported from [`crate::power`].

use std::collections::BTreeMap;

use orchestrator_policy::{GateKind, HealthGate, RedfishMetric};
use serde::{Deserialize, Serialize};

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

/// Where a gate's baseline came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BaselineSource {
    /// `--baseline` / `--sd`.
    Given,
    /// Measured over the fleet's recent health history ([`history_rates`]).
    History,
    /// Stated in the policy (the gate's `baseline`).
    Policy,
    /// [`default_baseline`].
    Default,
}

/// How far back a base rate measured from the fleet's history reaches: long enough to gather events
/// of rare metrics on a large control, short enough to follow the fleet's present state (driver and
/// workload changes move base rates over months).
pub const HISTORY_DAYS: i64 = 30;

/// Fewest control events a measured base rate needs. With fewer, its relative standard error is above
/// `1/sqrt(30)`, about 18%, and the default (chosen on the quiet side) is the safer guess.
pub const MIN_HISTORY_EVENTS: f64 = 30.0;

/// Base rates measured over the fleet's history, by metric name, from each metric's totals on control
/// nodes (`(metric, events, exposure)`, exposure in the metric's own unit, as the collector stores
/// it): `events / exposure` for each rate metric with at least [`MIN_HISTORY_EVENTS`] events.
///
/// Control nodes only: they ran the fleet's current firmware, so a regression under test never
/// raises the base rate it is judged against. The events are what the judge counts (XID episodes,
/// not log entries), so the rate is in the judge's own unit.
pub fn history_rates(totals: &[(String, f64, f64)]) -> BTreeMap<String, f64> {
    totals
        .iter()
        .filter(|(metric, events, exposure)| {
            history_metric(metric)
                && events.is_finite()
                && *events >= MIN_HISTORY_EVENTS
                && exposure.is_finite()
                && *exposure > 0.0
        })
        .map(|(metric, events, exposure)| (metric.clone(), events / exposure))
        .collect()
}

/// Whether a stored metric's base rate can be measured from history: a Redfish rate over time (not
/// a level, and not flash failures, which are counted per flash).
pub fn history_metric(metric: &str) -> bool {
    RedfishMetric::from_name(metric).is_some_and(|m| m.kind() == GateKind::Rate && m != RedfishMetric::FlashFailures)
}

/// A Redfish rate gate's base rate and where it came from: given (by gate or metric name), else
/// measured over the fleet's history (by metric name), else stated in the policy (the gate's
/// `baseline`), else the default. The one precedence the power analysis, the timing forecast and the
/// holdback's sizing share.
///
/// Why history outranks the policy: a stated rate is what a fleet plans with before it has history
/// of its own (a new SKU, a new cluster); once its controls have gathered [`MIN_HISTORY_EVENTS`],
/// the measurement is the better estimate, and every report names the source it used.
pub fn base_rate(
    given: &BTreeMap<String, f64>,
    history: &BTreeMap<String, f64>,
    gate: &HealthGate,
    metric: RedfishMetric,
) -> Option<(f64, BaselineSource)> {
    if let Some(v) = lookup(given, gate, Some(metric)) {
        return Some((*v, BaselineSource::Given));
    }
    if let Some(v) = history.get(metric.as_str()) {
        return Some((*v, BaselineSource::History));
    }
    stated_or_default(gate, Some(metric))
}

/// The gate's `baseline` from the policy, else the metric's default (none for a Prometheus query).
pub fn stated_or_default(gate: &HealthGate, metric: Option<RedfishMetric>) -> Option<(f64, BaselineSource)> {
    gate.baseline
        .map(|v| (v, BaselineSource::Policy))
        .or_else(|| metric.and_then(default_baseline).map(|v| (v, BaselineSource::Default)))
}
