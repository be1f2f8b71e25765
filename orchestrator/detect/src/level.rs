//! Level gates: distributions of a measured level (GPU temperature, power draw), canary against its
//! concurrent control, by rank test.

use serde::{Deserialize, Serialize};

use crate::error::DetectError;
use crate::sequential::Look;
use crate::stats::{hodges_lehmann, hodges_lehmann_interval, mann_whitney_greater};
use crate::verdict::{CohortSummary, Effect, EffectMeasure, Evidence, InconclusiveReason, TestKind, Verdict};

/// Which direction of change is harmful.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Temperatures, power, latency: a rise is a regression.
    HigherIsWorse,
    /// Throughput, link bandwidth, clocks: a fall is a regression.
    LowerIsWorse,
}

/// A level gate, as configured by policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelGate {
    /// Gate name (the metric), shown in evidence.
    pub name: String,
    /// Which way is worse.
    pub direction: Direction,
    /// The smallest shift that matters, in the metric's unit, >= 0, in the harmful direction. The test
    /// is of `H0: shift <= min_shift`, done by testing `canary - min_shift` against control.
    pub min_shift: f64,
    /// Samples each cohort must have for a Pass at the end of the bake; fewer is Inconclusive.
    pub min_samples: u64,
}

/// The samples of a level gate: one value per unit (GPU or node), e.g. that unit's mean temperature
/// over the bake so far. Values must be independent between units; several raw samples of one GPU
/// are not independent and must be aggregated before they get here.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LevelCohorts<'a> {
    /// Units of the wave (new firmware).
    pub canary: &'a [f64],
    /// Concurrent control units (old firmware).
    pub control: &'a [f64],
}

/// Largest accepted magnitude of a level or shift: far beyond any temperature or power reading, and
/// small enough that differences of samples never overflow.
pub const MAX_ABS_LEVEL: f64 = 1e12;

fn validate(gate: &LevelGate, cohorts: &LevelCohorts<'_>) -> Result<(), DetectError> {
    if !(gate.min_shift >= 0.0 && gate.min_shift <= MAX_ABS_LEVEL) {
        return Err(DetectError::InvalidParameter {
            gate: gate.name.clone(),
            parameter: "min_shift".into(),
            expected: "in [0, 1e12]".into(),
            value: gate.min_shift,
        });
    }
    for (cohort, samples) in [("canary", cohorts.canary), ("control", cohorts.control)] {
        if let Some(index) = samples.iter().position(|v| v.is_nan() || v.abs() > MAX_ABS_LEVEL) {
            return Err(DetectError::InvalidSample {
                gate: gate.name.clone(),
                cohort: cohort.into(),
                index,
            });
        }
    }
    Ok(())
}

fn median(v: &[f64]) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(s[n / 2]),
        _ => Some(s[n / 2 - 1] + (s[n / 2] - s[n / 2 - 1]) / 2.0),
    }
}

fn summary(samples: &[f64]) -> CohortSummary {
    CohortSummary {
        events: None,
        exposure: None,
        rate: None,
        samples: Some(samples.len() as u64),
        median: median(samples),
    }
}

/// Evaluate a level gate at one look.
///
/// Fail when the one-sided Mann-Whitney test of `canary - min_shift` against control (in the harmful
/// direction) has a p-value at or below the look's nominal level: the canary's distribution is shifted
/// by more than `min_shift`. The Hodges-Lehmann shift and its intervals are the effect evidence. Pass
/// only at the final look with `min_samples` in both cohorts; an empty cohort is Inconclusive.
/// Because canary and control are compared at the same time, a fleet-wide change moves both and is
/// not a regression.
pub fn evaluate_level(gate: &LevelGate, cohorts: &LevelCohorts<'_>, look: &Look) -> Verdict {
    if let Err(error) = validate(gate, cohorts) {
        return Verdict::Error {
            gate: gate.name.clone(),
            error,
        };
    }
    // Work in the harmful direction: positive shift = worse.
    let orient = |v: &[f64]| -> Vec<f64> {
        match gate.direction {
            Direction::HigherIsWorse => v.to_vec(),
            Direction::LowerIsWorse => v.iter().map(|x| -x).collect(),
        }
    };
    let (canary, control) = (orient(cohorts.canary), orient(cohorts.control));
    let shifted: Vec<f64> = canary.iter().map(|x| x - gate.min_shift).collect();
    let Some(test) = mann_whitney_greater(&shifted, &control) else {
        return Verdict::Inconclusive {
            gate: gate.name.clone(),
            reason: InconclusiveReason::NoData,
            evidence: None,
        };
    };
    let ci95 = hodges_lehmann_interval(&canary, &control, 0.025, 0.025);
    let decision_lower_bound = if look.nominal_alpha > 0.0 {
        hodges_lehmann_interval(&canary, &control, look.nominal_alpha, 0.0).lower
    } else {
        None
    };
    let evidence = Evidence {
        gate: gate.name.clone(),
        test: TestKind::MannWhitney { method: test.method },
        statistic: test.u,
        p_value: test.p_value,
        effect: Effect {
            measure: EffectMeasure::Shift,
            estimate: hodges_lehmann(&canary, &control),
            ci95_lower: ci95.lower,
            ci95_upper: ci95.upper,
            decision_lower_bound,
            min_effect: gate.min_shift,
        },
        canary: summary(cohorts.canary),
        control: summary(cohorts.control),
        look: *look,
    };
    // A look that spends nothing (nominal level 0) can never fail.
    if look.nominal_alpha > 0.0 && test.p_value <= look.nominal_alpha {
        return Verdict::Fail { evidence };
    }
    if !look.is_final {
        return Verdict::Inconclusive {
            gate: gate.name.clone(),
            reason: InconclusiveReason::BakeInProgress,
            evidence: Some(Box::new(evidence)),
        };
    }
    let (n1, n2) = (cohorts.canary.len() as u64, cohorts.control.len() as u64);
    if n1 < gate.min_samples || n2 < gate.min_samples {
        return Verdict::Inconclusive {
            gate: gate.name.clone(),
            reason: InconclusiveReason::InsufficientData,
            evidence: Some(Box::new(evidence)),
        };
    }
    Verdict::Pass { evidence }
}
