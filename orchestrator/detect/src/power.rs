//! Power analysis: the smallest regression a wave can detect, used by `waveguard policy power` and by
//! the policy lint that warns when a canary is too small to catch the effects the policy cares about.
//!
//! Both gates are approximated by a standardised statistic drifting linearly in information, the same
//! model the sequential boundaries are built on: the plan's power at final-look drift `theta` is
//! [`SequentialPlan::crossing_probability`], and `theta` for a given effect comes from the large-sample
//! behaviour of the test (the score-test view of the conditional binomial test, with its different
//! variance under the alternative; the Mann-Whitney test's asymptotic relative efficiency 3/pi against
//! the t-test for normal data). The exact tests are discrete and somewhat more conservative than this
//! approximation, so quoted effects are slightly optimistic; `tests/simulation.rs` checks one case by
//! simulation.

use serde::{Deserialize, Serialize};
use statrs::distribution::{DiscreteCDF, Poisson};

use crate::error::DetectError;
use crate::sequential::SequentialPlan;

/// The power the minimum detectable effect is quoted at, by convention.
pub const TARGET_POWER: f64 = 0.8;

/// Inputs of a rate gate's power analysis, for the whole bake.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RatePowerInput {
    /// Canary exposure over the whole bake (e.g. GPUs in the wave * bake hours).
    pub canary_exposure: f64,
    /// Control exposure over the whole bake.
    pub control_exposure: f64,
    /// Baseline event rate per unit exposure (from history or given), > 0.
    pub baseline_rate: f64,
    /// The gate's smallest effect that matters (>= 1).
    pub min_effect_ratio: f64,
    /// The gate's minimum canary events for a Fail.
    pub min_canary_events_for_fail: u64,
}

/// What limits the minimum detectable effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PowerLimit {
    /// The sampling noise of the test against the sequential boundaries.
    Statistics,
    /// The rule that a Fail needs a minimum number of canary events.
    MinEvents,
}

/// Result of a rate gate's power analysis.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RatePower {
    /// Smallest rate ratio detected with [`TARGET_POWER`]; `None` when no ratio up to 1e12 is.
    pub min_detectable_ratio: Option<f64>,
    /// The power the ratio is quoted at.
    pub power: f64,
    /// Canary events expected over the bake at that ratio.
    pub expected_canary_events: Option<f64>,
    /// Control events expected over the bake.
    pub expected_control_events: f64,
    /// What limits it.
    pub limited_by: PowerLimit,
    /// Final-look drift a unit-variance statistic needs for the target power under the plan (the
    /// rate test's own variance ratio is accounted for separately).
    pub required_drift: f64,
}

/// Inputs of a level gate's power analysis.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LevelPowerInput {
    /// Units (GPUs/nodes) in the canary.
    pub canary_samples: u64,
    /// Units in the control.
    pub control_samples: u64,
    /// Between-unit standard deviation of the level (from history or given), > 0.
    pub sd: f64,
    /// The gate's smallest shift that matters (>= 0).
    pub min_shift: f64,
}

/// Result of a level gate's power analysis.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LevelPower {
    /// Smallest shift (harmful direction, metric units) detected with [`TARGET_POWER`].
    pub min_detectable_shift: f64,
    /// The power the shift is quoted at.
    pub power: f64,
    /// Standardised final-look drift the plan needs for the target power.
    pub required_drift: f64,
}

fn check(parameter: &str, value: f64, ok: bool, expected: &str) -> Result<(), DetectError> {
    if ok && value.is_finite() {
        Ok(())
    } else {
        Err(DetectError::InvalidPowerInput {
            parameter: parameter.into(),
            expected: expected.into(),
            value,
        })
    }
}

/// Drift `theta` at which `plan` crosses a boundary with probability `power`.
pub fn required_drift(plan: &SequentialPlan, power: f64) -> f64 {
    let (mut lo, mut hi) = (0.0_f64, 40.0_f64);
    for _ in 0..40 {
        let mid = 0.5 * (lo + hi);
        if plan.crossing_probability(mid) >= power {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// Asymptotic relative efficiency of the Mann-Whitney test against the t-test for normal data.
const MWU_EFFICIENCY: f64 = 3.0 / std::f64::consts::PI;

/// Final-look drift and alternative/null sd ratio of the conditional rate test at true ratio `ratio`.
///
/// Conditional on `n` events, the canary share is tested against `p0` (the share at the smallest
/// effect) with the null variance `p0 (1 - p0) / n`; under the alternative its mean is `p1` and its
/// variance `p1 (1 - p1) / n`. This is the score-test view of the exact test; `n` is the expected
/// total count over the bake.
fn rate_drift(input: &RatePowerInput, ratio: f64) -> (f64, f64) {
    let mu1 = ratio * input.baseline_rate * input.canary_exposure;
    let mu0 = input.baseline_rate * input.control_exposure;
    let n = mu1 + mu0;
    let p1 = mu1 / n;
    let r0 = input.min_effect_ratio;
    let p0 = r0 * input.canary_exposure / (r0 * input.canary_exposure + input.control_exposure);
    let null_var = p0 * (1.0 - p0);
    let theta = (p1 - p0) * n.sqrt() / null_var.sqrt();
    let sd = (p1 * (1.0 - p1) / null_var).sqrt();
    (theta, sd)
}

fn statistical_power(input: &RatePowerInput, plan: &SequentialPlan, ratio: f64) -> f64 {
    let (theta, sd) = rate_drift(input, ratio);
    plan.crossing_probability_scaled(theta, sd)
}

fn validate_rate(input: &RatePowerInput) -> Result<(), DetectError> {
    check(
        "canary_exposure",
        input.canary_exposure,
        input.canary_exposure > 0.0,
        "finite and > 0",
    )?;
    check(
        "control_exposure",
        input.control_exposure,
        input.control_exposure > 0.0,
        "finite and > 0",
    )?;
    check(
        "baseline_rate",
        input.baseline_rate,
        input.baseline_rate > 0.0,
        "finite and > 0",
    )?;
    check(
        "min_effect_ratio",
        input.min_effect_ratio,
        input.min_effect_ratio >= 1.0,
        "finite and >= 1",
    )
}

/// Probability that a Poisson(`mean`) count reaches `m`.
fn poisson_at_least(m: u64, mean: f64) -> f64 {
    if m == 0 {
        return 1.0;
    }
    match Poisson::new(mean) {
        Ok(p) => 1.0 - p.cdf(m - 1),
        Err(_) => 0.0,
    }
}

/// Power of a rate gate under `plan` when the canary's true rate is `ratio` times the baseline.
pub fn rate_power(input: &RatePowerInput, plan: &SequentialPlan, ratio: f64) -> Result<f64, DetectError> {
    validate_rate(input)?;
    check("ratio", ratio, ratio > 0.0, "finite and > 0")?;
    let statistical = statistical_power(input, plan, ratio);
    let events = poisson_at_least(
        input.min_canary_events_for_fail,
        ratio * input.baseline_rate * input.canary_exposure,
    );
    // Both are needed for a Fail; the minimum is an optimistic but close bound as they are dependent.
    Ok(statistical.min(events))
}

/// The smallest rate ratio a rate gate detects with 80% power under `plan`.
pub fn rate_min_detectable_ratio(input: &RatePowerInput, plan: &SequentialPlan) -> Result<RatePower, DetectError> {
    validate_rate(input)?;
    let theta = required_drift(plan, TARGET_POWER);
    // Ratio 1e12: beyond it nothing is "detectable" in practice.
    const MAX_LOG_RATIO: f64 = 27.6;
    let (mut lo, mut hi) = (
        input.min_effect_ratio.ln(),
        MAX_LOG_RATIO.max(input.min_effect_ratio.ln() + 1.0),
    );
    // Power rises with the ratio; 40 halvings of the log-ratio bracket leave ~3e-11.
    let statistical = if statistical_power(input, plan, hi.exp()) < TARGET_POWER {
        None
    } else {
        for _ in 0..40 {
            let mid = 0.5 * (lo + hi);
            if statistical_power(input, plan, mid.exp()) >= TARGET_POWER {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Some(hi.exp())
    };
    // Ratio at which the canary reaches min events with the target power.
    let m = input.min_canary_events_for_fail;
    let (mut mlo, mut mhi) = (0.0_f64, (m as f64 + 10.0) * 10.0);
    for _ in 0..100 {
        let mid = 0.5 * (mlo + mhi);
        if poisson_at_least(m, mid) >= TARGET_POWER {
            mhi = mid;
        } else {
            mlo = mid;
        }
    }
    let events_ratio = mhi / (input.baseline_rate * input.canary_exposure);
    let (ratio, limited_by) = match statistical {
        Some(r) if r >= events_ratio => (Some(r), PowerLimit::Statistics),
        Some(_) => (Some(events_ratio), PowerLimit::MinEvents),
        None => (None, PowerLimit::Statistics),
    };
    Ok(RatePower {
        min_detectable_ratio: ratio,
        power: TARGET_POWER,
        expected_canary_events: ratio.map(|r| r * input.baseline_rate * input.canary_exposure),
        expected_control_events: input.baseline_rate * input.control_exposure,
        limited_by,
        required_drift: theta,
    })
}

fn validate_level(input: &LevelPowerInput) -> Result<(), DetectError> {
    check(
        "canary_samples",
        input.canary_samples as f64,
        input.canary_samples > 0,
        "> 0",
    )?;
    check(
        "control_samples",
        input.control_samples as f64,
        input.control_samples > 0,
        "> 0",
    )?;
    check("sd", input.sd, input.sd > 0.0, "finite and > 0")?;
    check("min_shift", input.min_shift, input.min_shift >= 0.0, "finite and >= 0")
}

fn level_noise(input: &LevelPowerInput) -> f64 {
    input.sd * (1.0 / input.canary_samples as f64 + 1.0 / input.control_samples as f64).sqrt() / MWU_EFFICIENCY.sqrt()
}

/// Power of a level gate under `plan` when the true shift (harmful direction) is `shift`.
pub fn level_power(input: &LevelPowerInput, plan: &SequentialPlan, shift: f64) -> Result<f64, DetectError> {
    validate_level(input)?;
    check("shift", shift, true, "finite")?;
    Ok(plan.crossing_probability((shift - input.min_shift) / level_noise(input)))
}

/// The smallest shift a level gate detects with 80% power under `plan` (normal data assumed).
pub fn level_min_detectable_shift(input: &LevelPowerInput, plan: &SequentialPlan) -> Result<LevelPower, DetectError> {
    validate_level(input)?;
    let theta = required_drift(plan, TARGET_POWER);
    Ok(LevelPower {
        min_detectable_shift: input.min_shift + theta * level_noise(input),
        power: TARGET_POWER,
        required_drift: theta,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sequential::SpendingFunction;

    #[test]
    fn one_look_drift_is_the_classic_z_sum() {
        // Fixed-sample one-sided test: theta = z_{1-alpha} + z_{power}.
        let plan = SequentialPlan::new(0.05, 1, SpendingFunction::OBrienFleming).unwrap();
        let theta = required_drift(&plan, 0.8);
        assert!((theta - (1.644_853_6 + 0.841_621_2)).abs() < 1e-4, "{theta}");
    }

    #[test]
    fn more_exposure_detects_smaller_ratios() {
        let plan = SequentialPlan::new(0.05, 6, SpendingFunction::OBrienFleming).unwrap();
        let mut input = RatePowerInput {
            canary_exposure: 100.0,
            control_exposure: 1000.0,
            baseline_rate: 0.1,
            min_effect_ratio: 1.5,
            min_canary_events_for_fail: 3,
        };
        let small = rate_min_detectable_ratio(&input, &plan)
            .unwrap()
            .min_detectable_ratio
            .unwrap();
        input.canary_exposure = 1000.0;
        let big = rate_min_detectable_ratio(&input, &plan)
            .unwrap()
            .min_detectable_ratio
            .unwrap();
        assert!(big < small && big > 1.5, "{big} {small}");
        assert!((rate_power(&input, &plan, big).unwrap() - 0.8).abs() < 1e-3);
    }

    #[test]
    fn level_shift_has_target_power() {
        let plan = SequentialPlan::new(0.025, 4, SpendingFunction::Pocock).unwrap();
        let input = LevelPowerInput {
            canary_samples: 16,
            control_samples: 200,
            sd: 2.0,
            min_shift: 1.0,
        };
        let mde = level_min_detectable_shift(&input, &plan).unwrap();
        assert!(mde.min_detectable_shift > 1.0);
        assert!((level_power(&input, &plan, mde.min_detectable_shift).unwrap() - 0.8).abs() < 1e-3);
        assert!(level_min_detectable_shift(&LevelPowerInput { sd: f64::NAN, ..input }, &plan).is_err());
    }
}
