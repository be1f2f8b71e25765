//! The soak's holdback, sized from the policy's power target (issue 22): one function the planner
//! (which picks the holdback's nodes), `policy lint` and `policy power` (which state the size and the
//! soak time) all call, so what the author reads is what the rollout holds back.
//!
//! The holdback's events are the soak's information: the updated fleet is so much larger that the
//! variance of the log rate ratio is about `1 / holdback events`, so catching `detect` with
//! probability `power` at the soak's one-sided level needs `((z_alpha + z_power) / ln detect)^2`
//! holdback events (`orchestrator_detect::fleet::holdback_events_needed`; 1.5x at 75% power and the
//! 0.5% share of a 2% budget over four gates needs ~64). The level is the gate's share of the
//! rollout's false-rollback budget: the soak continues the rollout's one anytime-valid process and
//! spends no budget of its own.

use orchestrator_detect::fleet::{holdback_events_needed, holdback_fraction};
use orchestrator_policy::{GateKind, GateSource, Policy};
use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use crate::baseline::{BaselineSource, base_rate, rate_exposure_unit};

/// Holdback share when the policy states none and no rate gate gives a base rate to size it from:
/// issue 22's 5% example.
pub const DEFAULT_HOLDBACK_PERCENT: f64 = 5.0;

/// The largest share the sizing may ask for: the holdback is a control, and a control larger than
/// half the fleet would hold back more nodes than it updates.
pub const MAX_HOLDBACK_PERCENT: f64 = 49.0;

/// How big the holdback is and why; see the module documentation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SoakSizing {
    /// Share of the eligible fleet held back, in percent.
    pub holdback_percent: f64,
    /// The policy stated `holdback_percent` (else it is sized from the power target).
    pub stated: bool,
    /// Holdback nodes out of `eligible`: at least one, and never every eligible node.
    pub holdback_nodes: usize,
    /// Eligible nodes the share is taken of.
    pub eligible: usize,
    /// The power target: the rate ratio to catch ...
    pub detect: f64,
    /// ... with this probability.
    pub power: f64,
    /// The gate the target is sized for (the soak wave's first rate gate with a base rate), if any.
    pub gate: Option<String>,
    /// Its base rate, in events per node-hour.
    pub base_per_node_hour: Option<f64>,
    /// Where that base rate came from: given, measured over the fleet's history, or the default
    /// (absent from plans made before the planner took measured rates: those used the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_source: Option<BaselineSource>,
    /// The gate's one-sided level: its share of the rollout's false-rollback budget.
    pub alpha: f64,
    /// Holdback events the target needs.
    pub events_needed: Option<f64>,
    /// Hours of soak the holdback needs to gather them (at the base rate).
    pub hours_needed: Option<f64>,
    /// The policy's shortest and longest soak, in hours.
    pub min_hours: f64,
    /// See `min_hours`.
    pub max_hours: f64,
}

impl SoakSizing {
    /// One line for `policy lint` and `policy power`, e.g. "holdback 50 of 1000 nodes (5%): catching
    /// 1.5x at 75% power needs ~64 holdback events (xid_errors at 0.016/node-hour): ~80 h of soak
    /// (soak 24 h..14 d)".
    pub fn statement(&self) -> String {
        let share = if self.stated {
            format!("{}%, stated", self.holdback_percent)
        } else {
            format!("{:.1}%, sized from the power target", self.holdback_percent)
        };
        let need = match (
            &self.gate,
            self.base_per_node_hour,
            self.events_needed,
            self.hours_needed,
        ) {
            (Some(gate), Some(rate), Some(events), Some(hours)) => {
                let fits = if hours > self.max_hours {
                    format!(
                        "; LONGER than the soak's max {:.0} h, so a healthy soak may hold",
                        self.max_hours
                    )
                } else {
                    String::new()
                };
                let source = match self.rate_source {
                    Some(BaselineSource::Given) => "given",
                    Some(BaselineSource::History) => "measured over the fleet's history",
                    Some(BaselineSource::Policy) => "stated in the policy",
                    Some(BaselineSource::Default) | None => "default rate",
                };
                format!(
                    "catching {}x at {:.0}% power needs ~{events:.0} holdback events ({gate} at {rate:.3}/node-hour, \
                     {source}, alpha {:.4}): ~{hours:.0} h of soak{fits}",
                    self.detect,
                    self.power * 100.0,
                    self.alpha
                )
            }
            _ => "no rate gate with a base rate in the soak wave: the holdback is the default share".to_owned(),
        };
        format!(
            "soak: holdback {} of {} eligible nodes ({share}); {need}; soak {:.0} h min, {:.0} h max",
            self.holdback_nodes, self.eligible, self.min_hours, self.max_hours
        )
    }
}

/// The holdback for `policy` over `eligible` nodes, or `None` when the policy has no soak (or no
/// `detection` block: then the engine runs no soak). Base rates come from `given` (the command
/// line's, by gate or metric name), else `history` (measured over the fleet's recent history, by
/// metric name; [`crate::baseline::history_rates`]), else the defaults the power analysis uses
/// ([`base_rate`]); `gpus_per_node` counts per-GPU metrics per node.
pub fn soak_sizing(
    policy: &Policy,
    eligible: usize,
    given: &BTreeMap<String, f64>,
    history: &BTreeMap<String, f64>,
    gpus_per_node: u32,
) -> Option<SoakSizing> {
    if !policy.detection.enabled {
        return None;
    }
    let soak = policy.detection.soak.as_ref()?;
    let hours = |d: chrono::TimeDelta| d.num_seconds().max(0) as f64 / 3600.0;
    let (min_hours, max_hours) = (hours(soak.min), hours(soak.max));
    // The soak judges the last wave's gates.
    let gates: Vec<&str> = policy
        .waves
        .last()
        .map(|w| w.gates.iter().map(String::as_str).collect())
        .unwrap_or_default();
    let alpha = policy.detection.false_rollback / gates.len().max(1) as f64;
    let rate_gate = gates
        .iter()
        .filter_map(|name| policy.health.gate(name))
        .find_map(|gate| {
            let GateSource::Redfish { metric } = gate.source else {
                return None;
            };
            if gate.kind != GateKind::Rate {
                return None;
            }
            let (rate, source) = base_rate(given, history, gate, metric)?;
            let (unit, _, per_hour) = rate_exposure_unit(metric);
            let per_node = if unit == "gpu" {
                f64::from(gpus_per_node.max(1))
            } else {
                1.0
            };
            Some((gate.name.clone(), rate * per_hour * per_node, source))
        });
    let events_needed = rate_gate
        .as_ref()
        .and_then(|_| holdback_events_needed(soak.detect, alpha, soak.power).ok());
    let sized = match (&rate_gate, events_needed) {
        (Some((_, per_node_hour, _)), Some(events)) => holdback_fraction(
            events,
            *per_node_hour,
            eligible.max(1) as f64,
            max_hours.max(f64::MIN_POSITIVE),
        )
        .ok()
        .map(|f| (f * 100.0).min(MAX_HOLDBACK_PERCENT)),
        _ => None,
    };
    let percent = soak.holdback_percent.or(sized).unwrap_or(DEFAULT_HOLDBACK_PERCENT);
    let holdback_nodes = holdback_nodes(percent, eligible);
    let hours_needed = match (&rate_gate, events_needed) {
        (Some((_, per_node_hour, _)), Some(events)) if holdback_nodes > 0 && *per_node_hour > 0.0 => {
            Some(events / (per_node_hour * holdback_nodes as f64))
        }
        _ => None,
    };
    Some(SoakSizing {
        holdback_percent: percent,
        stated: soak.holdback_percent.is_some(),
        holdback_nodes,
        eligible,
        detect: soak.detect,
        power: soak.power,
        base_per_node_hour: rate_gate.as_ref().map(|(_, r, _)| *r),
        rate_source: rate_gate.as_ref().map(|(_, _, source)| *source),
        gate: rate_gate.map(|(g, _, _)| g),
        alpha,
        events_needed,
        hours_needed,
        min_hours,
        max_hours,
    })
}

/// Nodes for `percent` of `eligible`, rounded up: at least one (a holdback of none is no control),
/// and never all of them (a rollout that updates nothing until the soak is not a rollout). Fewer
/// than two eligible nodes: no holdback.
pub fn holdback_nodes(percent: f64, eligible: usize) -> usize {
    if eligible < 2 || !percent.is_finite() || percent <= 0.0 {
        return 0;
    }
    let wanted = (percent / 100.0 * eligible as f64).ceil();
    // Finite and non-negative here; the float-to-int cast saturates.
    (wanted as usize).clamp(1, eligible - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(soak: &str, gates: &str) -> Policy {
        let source = format!(
            "name: p
target:
  component: gpu
  platforms: [hgx]
waves:
  - name: canary
    count: 8
    bake: 12h
  - name: rest
    rest: true
    bake: 4h
    gates: [{gates}]
concurrency:
  max_in_flight: 4
health:
  gates:
    - {{name: xid, source: redfish, metric: xid_errors_per_gpu_hour, kind: rate, direction: increase_is_bad, min_effect: 1.25, interval: 30m}}
    - {{name: aer, source: redfish, metric: pcie_aer_per_node_hour, kind: rate, direction: increase_is_bad, min_effect: 1.25, interval: 30m}}
    - {{name: temp, source: redfish, metric: gpu_temp_c, kind: level, direction: increase_is_bad, min_effect: 1, interval: 30m}}
    - {{name: power, source: redfish, metric: gpu_power_w, kind: level, direction: increase_is_bad, min_effect: 20, interval: 30m}}
failure_budget:
  max_failed: 1
rollback:
  automatic: true
  scope: wave
detection:
  false_rollback: 0.02
{soak}"
        );
        orchestrator_policy::parse_policy(&source).unwrap_or_else(|e| panic!("{e:?}"))
    }

    fn at_issue_rate() -> BTreeMap<String, f64> {
        [("xid".to_owned(), 0.002)].into()
    }

    fn sizing(p: &Policy) -> Option<SoakSizing> {
        soak_sizing(
            p,
            1000,
            &at_issue_rate(),
            &BTreeMap::new(),
            crate::baseline::DEFAULT_GPUS_PER_NODE,
        )
    }

    #[test]
    fn the_stated_example_64_events_80_h_at_5_percent() {
        // Issue 22: 1.5x at 75% power needs ~64 holdback events; at 0.002/GPU-h that is about 80 h
        // with a 5% holdback of 1,000 nodes (alpha: 2% over four gates).
        let p = policy(
            "  soak: {min: 24h, max: 14d, holdback_percent: 5}\n",
            "xid, aer, temp, power",
        );
        let s = sizing(&p).unwrap();
        assert_eq!((s.holdback_nodes, s.stated), (50, true));
        let events = s.events_needed.unwrap();
        assert!((60.0..68.0).contains(&events), "{events}");
        let hours = s.hours_needed.unwrap();
        assert!((75.0..85.0).contains(&hours), "{hours}");
        let line = s.statement();
        assert!(line.contains("holdback 50 of 1000"), "{line}");
        assert!(
            line.contains("catching 1.5x at 75% power needs ~64 holdback events"),
            "{line}"
        );
        assert!(line.contains("~80 h of soak"), "{line}");
    }

    #[test]
    fn without_a_stated_share_the_holdback_is_sized_to_the_soaks_max() {
        // 80 h max: the 5% of the example; 200 h: about 2%.
        let p = policy("  soak: {min: 24h, max: 80h}\n", "xid, aer, temp, power");
        let s = sizing(&p).unwrap();
        assert!(!s.stated);
        assert!((4.5..5.5).contains(&s.holdback_percent), "{s:?}");
        assert!(s.hours_needed.unwrap() <= 80.0 + 1e-9, "{s:?}");
        let p = policy("  soak: {min: 24h, max: 200h}\n", "xid, aer, temp, power");
        let s = sizing(&p).unwrap();
        assert!((1.8..2.2).contains(&s.holdback_percent), "{s:?}");
        // A tighter target needs a bigger holdback.
        let p = policy(
            "  soak: {min: 24h, max: 200h, detect: 1.3, power: 0.9}\n",
            "xid, aer, temp, power",
        );
        let tight = sizing(&p).unwrap();
        assert!(tight.holdback_percent > s.holdback_percent * 2.0, "{tight:?}");
        // No rate gate: the default share.
        let p = policy("  soak: {min: 24h, max: 200h}\n", "temp");
        let s = sizing(&p).unwrap();
        assert_eq!((s.holdback_percent, s.gate.clone()), (DEFAULT_HOLDBACK_PERCENT, None));
        assert!(s.statement().contains("default share"), "{}", s.statement());
        // No soak, or no detection: no holdback.
        let p = policy("", "xid");
        assert!(sizing(&p).is_none());
    }

    #[test]
    fn base_rates_come_from_the_command_line_then_history_then_the_defaults() {
        let p = policy("  soak: {min: 24h, max: 200h}\n", "xid, aer, temp, power");
        let gpus = crate::baseline::DEFAULT_GPUS_PER_NODE;
        let none = BTreeMap::new();
        // Measured: 40 control XID episodes over 20,000 GPU-hours, 0.002 per GPU-hour.
        let history = crate::baseline::history_rates(&[("xid_errors_per_gpu_hour".to_owned(), 40.0, 20_000.0)]);
        let measured = soak_sizing(&p, 1000, &none, &history, gpus).unwrap();
        assert_eq!(measured.rate_source, Some(BaselineSource::History));
        assert!(
            (measured.base_per_node_hour.unwrap() - 0.016).abs() < 1e-12,
            "{measured:?}"
        );
        assert!(
            measured.statement().contains("measured over the fleet's history"),
            "{}",
            measured.statement()
        );
        // The same rate given on the command line sizes the same holdback, and says so.
        let given = sizing(&p).unwrap();
        assert_eq!(given.rate_source, Some(BaselineSource::Given));
        assert_eq!(given.holdback_percent, measured.holdback_percent);
        assert!(given.statement().contains("given"), "{}", given.statement());
        // A given rate wins over a measured one.
        let louder = crate::baseline::history_rates(&[("xid_errors_per_gpu_hour".to_owned(), 400.0, 20_000.0)]);
        let both = soak_sizing(&p, 1000, &at_issue_rate(), &louder, gpus).unwrap();
        assert_eq!(both.rate_source, Some(BaselineSource::Given));
        assert_eq!(both.holdback_percent, given.holdback_percent);
        // Neither: the default (0.01 per GPU-hour, five times the issue's rate, so a smaller holdback).
        let default = soak_sizing(&p, 1000, &none, &none, gpus).unwrap();
        assert_eq!(default.rate_source, Some(BaselineSource::Default));
        assert!(
            default.holdback_percent < measured.holdback_percent / 3.0,
            "{default:?} {measured:?}"
        );
        assert!(default.statement().contains("default rate"), "{}", default.statement());
    }

    #[test]
    fn a_measured_rate_needs_enough_control_events_and_a_rate_metric() {
        let rates = crate::baseline::history_rates(&[
            ("xid_errors_per_gpu_hour".to_owned(), 30.0, 15_000.0),
            // Too few events to trust: the default stays.
            ("pcie_aer_per_node_hour".to_owned(), 29.0, 100.0),
            // Not rates, or not known.
            ("gpu_temp_c".to_owned(), 1_000.0, 10.0),
            ("flash_failures".to_owned(), 100.0, 1_000.0),
            ("made_up".to_owned(), 100.0, 1_000.0),
            // No exposure.
            ("link_degraded_per_node_day".to_owned(), 100.0, 0.0),
        ]);
        assert_eq!(rates, [("xid_errors_per_gpu_hour".to_owned(), 0.002)].into());
    }

    #[test]
    fn holdback_nodes_are_at_least_one_and_never_all() {
        assert_eq!(holdback_nodes(5.0, 1000), 50);
        assert_eq!(holdback_nodes(5.0, 40), 2);
        assert_eq!(holdback_nodes(0.1, 10), 1);
        assert_eq!(holdback_nodes(49.0, 2), 1);
        assert_eq!(holdback_nodes(5.0, 1), 0);
        assert_eq!(holdback_nodes(f64::NAN, 100), 0);
    }
}
