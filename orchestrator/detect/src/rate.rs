//! Rate gates: event counts per unit of exposure (XID errors per GPU-hour, AER per node-hour, flash
//! failures per flash), canary against its concurrent control.

use serde::{Deserialize, Serialize};

use crate::error::DetectError;
use crate::sequential::Look;
use crate::stats::{poisson_rate_test, rate_ratio_interval};
use crate::verdict::{CohortSummary, Effect, EffectMeasure, Evidence, InconclusiveReason, TestKind, Verdict};

/// Default for [`RateGate::min_canary_events_for_fail`].
///
/// Why: with a small canary beside a large control that saw no events, a single canary event has a
/// conditional p-value of about `E1 / E0`, which can be below the boundary. One or two events cannot
/// establish a *rate* regression, and rolling back good firmware for them erodes trust in the gate.
/// Requiring a few events only removes rejections, so the false-alarm rate stays within alpha, and a
/// real rise produces many events, so it is not hidden.
pub const DEFAULT_MIN_CANARY_EVENTS_FOR_FAIL: u64 = 3;

/// A rate gate, as configured by policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RateGate {
    /// Gate name (the metric), shown in evidence.
    pub name: String,
    /// The smallest rate ratio (canary / control) that matters, >= 1. The test is of
    /// `H0: ratio <= min_effect_ratio`; 1 means "any increase".
    pub min_effect_ratio: f64,
    /// The canary must have at least this many events to fail (see
    /// [`DEFAULT_MIN_CANARY_EVENTS_FOR_FAIL`]).
    #[serde(default = "default_min_events")]
    pub min_canary_events_for_fail: u64,
    /// Exposure each cohort must have reached for a Pass at the end of the bake; less is Inconclusive.
    /// Deliberately without a default: "enough data" is a policy decision (use the power analysis).
    pub min_exposure: f64,
}

fn default_min_events() -> u64 {
    DEFAULT_MIN_CANARY_EVENTS_FOR_FAIL
}

/// Events and exposure of one cohort, cumulative since the start of the bake.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RateSample {
    /// Events counted.
    pub events: u64,
    /// Exposure in the gate's unit (GPU-hours, node-hours, flashes); finite and >= 0.
    pub exposure: f64,
}

/// The two cohorts of a rate gate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RateCohorts {
    /// Nodes of the wave (new firmware).
    pub canary: RateSample,
    /// Concurrent control nodes (old firmware), observed over the same time.
    pub control: RateSample,
}

fn summary(s: RateSample) -> CohortSummary {
    CohortSummary {
        events: Some(s.events),
        exposure: Some(s.exposure),
        rate: Some(s.events as f64 / s.exposure).filter(|r| s.exposure > 0.0 && r.is_finite()),
        samples: None,
        median: None,
    }
}

fn validate(gate: &RateGate, cohorts: &RateCohorts) -> Result<(), DetectError> {
    if !(gate.min_effect_ratio >= 1.0 && gate.min_effect_ratio.is_finite()) {
        return Err(DetectError::InvalidParameter {
            gate: gate.name.clone(),
            parameter: "min_effect_ratio".into(),
            expected: "finite and >= 1".into(),
            value: gate.min_effect_ratio,
        });
    }
    if !(gate.min_exposure >= 0.0 && gate.min_exposure.is_finite()) {
        return Err(DetectError::InvalidParameter {
            gate: gate.name.clone(),
            parameter: "min_exposure".into(),
            expected: "finite and >= 0".into(),
            value: gate.min_exposure,
        });
    }
    for (cohort, s) in [("canary", cohorts.canary), ("control", cohorts.control)] {
        if !(s.exposure >= 0.0 && s.exposure.is_finite()) {
            return Err(DetectError::InvalidExposure {
                gate: gate.name.clone(),
                cohort: cohort.into(),
                value: s.exposure,
            });
        }
    }
    if cohorts.canary.events.checked_add(cohorts.control.events).is_none() {
        return Err(DetectError::CountOverflow {
            gate: gate.name.clone(),
            canary: cohorts.canary.events,
            control: cohorts.control.events,
        });
    }
    Ok(())
}

/// Evaluate a rate gate at one look.
///
/// Fail when the exact conditional test of `H0: canary rate <= min_effect_ratio * control rate` has a
/// p-value at or below the look's nominal level and the canary has at least
/// `min_canary_events_for_fail` events. Pass only at the final look with `min_exposure` reached in
/// both cohorts. A cohort with zero exposure is Inconclusive (no data), never Pass.
pub fn evaluate_rate(gate: &RateGate, cohorts: &RateCohorts, look: &Look) -> Verdict {
    if let Err(error) = validate(gate, cohorts) {
        return Verdict::Error {
            gate: gate.name.clone(),
            error,
        };
    }
    let (c, k) = (cohorts.canary, cohorts.control);
    if c.exposure <= 0.0 || k.exposure <= 0.0 {
        return Verdict::Inconclusive {
            gate: gate.name.clone(),
            reason: InconclusiveReason::NoData,
            evidence: None,
        };
    }
    let p_value = poisson_rate_test(c.events, c.exposure, k.events, k.exposure, gate.min_effect_ratio);
    let ci95 = rate_ratio_interval(c.events, c.exposure, k.events, k.exposure, 0.025, 0.025);
    let decision = rate_ratio_interval(c.events, c.exposure, k.events, k.exposure, look.nominal_alpha, 0.0);
    let estimate = (k.events > 0).then(|| (c.events as f64 / c.exposure) / (k.events as f64 / k.exposure));
    let evidence = Evidence {
        gate: gate.name.clone(),
        test: TestKind::ConditionalBinomial,
        statistic: c.events as f64,
        p_value,
        effect: Effect {
            measure: EffectMeasure::RateRatio,
            estimate: estimate.filter(|e| e.is_finite()),
            ci95_lower: ci95.lower,
            ci95_upper: ci95.upper,
            // With nothing spent at this look there is no decision bound.
            decision_lower_bound: if look.nominal_alpha > 0.0 { decision.lower } else { None },
            min_effect: gate.min_effect_ratio,
        },
        canary: summary(c),
        control: summary(k),
        look: *look,
    };
    // A look that spends nothing (nominal level 0) can never fail, even on an underflowed p-value of 0.
    if look.nominal_alpha > 0.0 && p_value <= look.nominal_alpha && c.events >= gate.min_canary_events_for_fail {
        return Verdict::Fail { evidence };
    }
    if !look.is_final {
        return Verdict::Inconclusive {
            gate: gate.name.clone(),
            reason: InconclusiveReason::BakeInProgress,
            evidence: Some(Box::new(evidence)),
        };
    }
    if c.exposure < gate.min_exposure || k.exposure < gate.min_exposure {
        return Verdict::Inconclusive {
            gate: gate.name.clone(),
            reason: InconclusiveReason::InsufficientData,
            evidence: Some(Box::new(evidence)),
        };
    }
    Verdict::Pass { evidence }
}
