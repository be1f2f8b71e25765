//! How long the rate evidence takes to decide: the expected (median) and p95 hours for a healthy
//! wave to pass and for an effect to be caught, so `policy power` can show the cost of a tight
//! `must_detect` before anyone approves it.
//!
//! Model: against a control much larger than the updated side, the log likelihood ratio of the best
//! grid alternative `R1 = R` against the null `R0`, after `mu` expected baseline events on the
//! updated side, has mean `mu (R ln(R/R0) - (R - R0))` and variance `phi mu R ln(R/R0)^2`. The
//! mixture crosses when that exceeds `phi ln(32 / (level w))` (the mixture's cost for not knowing the
//! effect, the gate's level and the cumulative process's share `w`: 1/2 to fail, 1 to pass). The normal approximation
//! of the crossing gives the median (z = 0) and the p95 (z = 1.645). `mu` grows with the updated
//! nodes' exposure, so the caller says how many baseline events came before the wave and how many
//! accrue per hour during it (all nodes on the release so far).

use super::{FleetError, check};

/// The mixture's alternatives (see `rate.rs`): the cost of the mixture in nats is `ln` of this.
const MIX_POINTS: f64 = 32.0;
/// Share of the gate's false-rollback level given to the cumulative process (Pass has it all).
const CUMULATIVE_SHARE: f64 = 0.5;
const Z95: f64 = 1.644_853_626_951_472_2;

/// Inputs of a timing estimate for one gate during one wave.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateTimingInput {
    /// Expected baseline events on the updated side before this wave's bake starts (earlier waves).
    pub prior_events: f64,
    /// Expected baseline events per hour on the updated side during this wave.
    pub events_per_hour: f64,
    /// The null a Fail must exceed (`min_effect`, or 1).
    pub null: f64,
    /// The ratio a Pass must rule out.
    pub must_detect: f64,
    /// The gate's false-rollback share.
    pub alpha: f64,
    /// The gate's false-pass share.
    pub beta: f64,
    /// Quasi-Poisson dispersion (>= 1).
    pub dispersion: f64,
}

/// Median and p95 hours into the wave's bake; infinite when the decision never comes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hours {
    /// Median (the normal approximation's mean crossing).
    pub median: f64,
    /// 95th percentile.
    pub p95: f64,
}

fn validate(i: &RateTimingInput) -> Result<(), FleetError> {
    check(
        "prior events",
        "finite and >= 0",
        i.prior_events,
        i.prior_events.is_finite() && i.prior_events >= 0.0,
    )?;
    check(
        "events per hour",
        "finite and > 0",
        i.events_per_hour,
        i.events_per_hour.is_finite() && i.events_per_hour > 0.0,
    )?;
    check(
        "null ratio",
        "finite and > 0",
        i.null,
        i.null.is_finite() && i.null > 0.0,
    )?;
    check(
        "must_detect",
        "finite and > null",
        i.must_detect,
        i.must_detect.is_finite() && i.must_detect > i.null,
    )?;
    check("alpha", "in (0, 1)", i.alpha, i.alpha > 0.0 && i.alpha < 1.0)?;
    check("beta", "in (0, 1)", i.beta, i.beta > 0.0 && i.beta < 1.0)?;
    check(
        "dispersion",
        "finite and >= 1",
        i.dispersion,
        i.dispersion.is_finite() && i.dispersion >= 1.0,
    )
}

/// Hours (median, p95) until the evidence with true ratio `truth` rejects `null_ratio` at `level`.
fn crossing(i: &RateTimingInput, truth: f64, null_ratio: f64, level: f64, share: f64) -> Hours {
    let l = (truth / null_ratio).ln();
    let drift = truth * l - (truth - null_ratio);
    let variance = i.dispersion * truth * l * l;
    let threshold = i.dispersion * (MIX_POINTS / (level * share)).ln();
    let at = |z: f64| {
        let drifts_away = drift > 0.0;
        if !drifts_away {
            return f64::INFINITY;
        }
        let s = (z * variance.sqrt() + (z * z * variance + 4.0 * drift * threshold).sqrt()) / (2.0 * drift);
        ((s * s - i.prior_events) / i.events_per_hour).max(0.0)
    };
    Hours {
        median: at(0.0),
        p95: at(Z95),
    }
}

/// Hours into the wave for a healthy release (ratio 1) to have ruled out `must_detect`. The wave
/// passes at the later of this and its bake; beyond `max_bake` it holds.
pub fn hours_to_pass(input: &RateTimingInput) -> Result<Hours, FleetError> {
    validate(input)?;
    Ok(crossing(input, 1.0, input.must_detect, input.beta, 1.0))
}

/// Hours into the wave for a release at `ratio` to fail (infinite when `ratio` does not exceed the
/// null: such a release is not a regression that matters and is never failed on purpose).
pub fn hours_to_catch(input: &RateTimingInput, ratio: f64) -> Result<Hours, FleetError> {
    validate(input)?;
    check("ratio", "finite and > 0", ratio, ratio.is_finite() && ratio > 0.0)?;
    if ratio <= input.null {
        return Ok(Hours {
            median: f64::INFINITY,
            p95: f64::INFINITY,
        });
    }
    Ok(crossing(input, ratio, input.null, input.alpha, CUMULATIVE_SHARE))
}

/// Probability that the evidence of a release at `ratio` has failed `input.null` by `hours` into the
/// wave: the same normal approximation as [`hours_to_catch`] (its median is where this is 1/2), read
/// the other way. Zero for a ratio at or below the null (never failed on purpose).
pub fn catch_probability(input: &RateTimingInput, ratio: f64, hours: f64) -> Result<f64, FleetError> {
    validate(input)?;
    check("ratio", "finite and > 0", ratio, ratio.is_finite() && ratio > 0.0)?;
    check("hours", ">= 0", hours, hours >= 0.0)?;
    if ratio <= input.null {
        return Ok(0.0);
    }
    let mu = input.prior_events + input.events_per_hour * hours.min(1e9);
    if mu <= 0.0 {
        return Ok(0.0);
    }
    let l = (ratio / input.null).ln();
    let drift = ratio * l - (ratio - input.null);
    let sd = (input.dispersion * ratio * l * l * mu).sqrt();
    let threshold = input.dispersion * (MIX_POINTS / (input.alpha * CUMULATIVE_SHARE)).ln();
    Ok(crate::stats::norm_sf((threshold - mu * drift) / sd))
}

/// One wave as the timing model sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimedWave {
    /// Expected baseline events per hour on the updated side during this wave (all nodes on the
    /// release so far).
    pub events_per_hour: f64,
    /// Planned bake, hours.
    pub bake_hours: f64,
    /// `max_bake`, hours.
    pub max_bake_hours: f64,
    /// The ratio this wave's Pass must rule out.
    pub must_detect: f64,
}

/// For a release at `ratio`, the probability that it has been caught by the end of each wave (the
/// calibration `bench --only detection` checks against simulation, and what `policy power` quotes).
///
/// A wave ends at the median time for the evidence to rule out its `must_detect` (a release below
/// `must_detect` passes like a healthy one, only later), no earlier than its bake; a release the wave
/// cannot pass runs to `max_bake` and holds there, so no later wave starts and the probability stays.
/// Evidence carries from wave to wave. One gate's view: with several gates a wave passes when the
/// slowest is ready, so the quoted probabilities are for this gate alone.
pub fn catch_by_wave_end(
    waves: &[TimedWave],
    ratio: f64,
    null: f64,
    alpha: f64,
    beta: f64,
    dispersion: f64,
) -> Result<Vec<f64>, FleetError> {
    let mut out = Vec::with_capacity(waves.len());
    let mut prior = 0.0;
    let mut caught: f64 = 0.0;
    let mut held = false;
    for wave in waves {
        check(
            "bake hours",
            "finite, >= 0 and <= max_bake",
            wave.bake_hours,
            wave.bake_hours.is_finite() && wave.bake_hours >= 0.0 && wave.bake_hours <= wave.max_bake_hours,
        )?;
        check(
            "max_bake hours",
            "finite",
            wave.max_bake_hours,
            wave.max_bake_hours.is_finite(),
        )?;
        let input = RateTimingInput {
            prior_events: prior,
            events_per_hour: wave.events_per_hour,
            null,
            must_detect: wave.must_detect,
            alpha,
            beta,
            dispersion,
        };
        validate(&input)?;
        if held {
            out.push(caught);
            continue;
        }
        let pass = if ratio < wave.must_detect {
            crossing(&input, ratio, wave.must_detect, beta, 1.0).median
        } else {
            f64::INFINITY
        };
        held = pass > wave.max_bake_hours;
        let end = pass.clamp(wave.bake_hours, wave.max_bake_hours);
        caught = caught.max(catch_probability(&input, ratio, end)?);
        out.push(caught);
        prior += wave.events_per_hour * end;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{RateCell, RateEConfig, RateEProcess};
    use rand::{Rng, SeedableRng};

    fn poisson(rng: &mut impl Rng, mean: f64) -> u64 {
        let limit = (-mean).exp();
        let (mut p, mut k) = (rng.random::<f64>(), 0);
        while p > limit {
            k += 1;
            p *= rng.random::<f64>();
        }
        k
    }

    /// Simulated hours to fail (or to be pass-ready) with one updated cohort of `rate` baseline
    /// events per hour against a control 30x its size.
    fn simulate(ratio: f64, rate: f64, pass: bool, seeds: u64) -> Vec<f64> {
        let mut out = Vec::new();
        for seed in 0..seeds {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let mut p = RateEProcess::new(RateEConfig::default());
            for hour in 1..=2000 {
                let cell = RateCell {
                    updated_events: poisson(&mut rng, rate * ratio),
                    updated_exposure: 1.0,
                    control_events: poisson(&mut rng, rate * 30.0),
                    control_exposure: 30.0,
                };
                p.observe_bin(&[cell]).unwrap();
                let look = p.look(1.0, 2.0, 0.005, 0.0125, 1.0).unwrap();
                if (pass && look.pass_ready) || (!pass && look.fail) {
                    out.push(f64::from(hour));
                    break;
                }
            }
        }
        out.sort_by(f64::total_cmp);
        out
    }

    #[test]
    fn predicted_times_match_the_process_within_the_approximation() {
        let input = RateTimingInput {
            prior_events: 0.0,
            events_per_hour: 0.5,
            null: 1.0,
            must_detect: 2.0,
            alpha: 0.005,
            beta: 0.0125,
            dispersion: 1.0,
        };
        let catch = hours_to_catch(&input, 3.0).unwrap();
        let sim = simulate(3.0, 0.5, false, 200);
        let median = sim[sim.len() / 2];
        // The conditional test against a finite control and the grid make the process a little
        // slower than the known-control approximation; within 35% is what `policy power` promises.
        assert!(
            (median / catch.median - 1.0).abs() < 0.35,
            "sim {median} vs predicted {}",
            catch.median
        );
        let pass = hours_to_pass(&input).unwrap();
        let sim = simulate(1.0, 0.5, true, 200);
        let median = sim[sim.len() / 2];
        assert!(
            (median / pass.median - 1.0).abs() < 0.35,
            "sim {median} vs predicted {}",
            pass.median
        );
        assert!(pass.p95 > pass.median && catch.p95 > catch.median);
    }

    #[test]
    fn no_regression_that_matters_is_never_caught_and_prior_evidence_shortens_the_wait() {
        let input = RateTimingInput {
            prior_events: 0.0,
            events_per_hour: 1.0,
            null: 1.25,
            must_detect: 2.0,
            alpha: 0.005,
            beta: 0.0125,
            dispersion: 1.0,
        };
        assert!(hours_to_catch(&input, 1.2).unwrap().median.is_infinite());
        let fresh = hours_to_pass(&input).unwrap();
        let pooled = hours_to_pass(&RateTimingInput {
            prior_events: 10.0,
            ..input
        })
        .unwrap();
        assert!(pooled.median < fresh.median);
        let bursty = hours_to_pass(&RateTimingInput {
            dispersion: 3.0,
            ..input
        })
        .unwrap();
        assert!(bursty.median > 2.5 * fresh.median);
        assert!(
            hours_to_pass(&RateTimingInput {
                events_per_hour: 0.0,
                ..input
            })
            .is_err()
        );
    }

    #[test]
    fn catch_probability_is_one_half_at_the_median_and_waves_carry_evidence() {
        let input = RateTimingInput {
            prior_events: 0.0,
            events_per_hour: 0.5,
            null: 1.1,
            must_detect: 2.0,
            alpha: 0.005,
            beta: 0.0125,
            dispersion: 1.0,
        };
        let median = hours_to_catch(&input, 3.0).unwrap().median;
        assert!((catch_probability(&input, 3.0, median).unwrap() - 0.5).abs() < 1e-9);
        assert!(catch_probability(&input, 3.0, 2.0 * median).unwrap() > 0.9);
        assert_eq!(catch_probability(&input, 1.05, 1e6).unwrap(), 0.0);
        let waves = [
            TimedWave {
                events_per_hour: 0.5,
                bake_hours: 12.0,
                max_bake_hours: 240.0,
                must_detect: 2.0,
            },
            TimedWave {
                events_per_hour: 2.0,
                bake_hours: 8.0,
                max_bake_hours: 168.0,
                must_detect: 1.5,
            },
        ];
        // 3x cannot pass the canary: caught there or held, so the second wave adds nothing.
        let p = catch_by_wave_end(&waves, 3.0, 1.1, 0.005, 0.0125, 1.0).unwrap();
        assert!(p[0] > 0.99 && p[1] == p[0], "{p:?}");
        // 1.4x passes the canary (below its 2x) and is more likely caught by the end of the second wave.
        let p = catch_by_wave_end(&waves, 1.4, 1.1, 0.005, 0.0125, 1.0).unwrap();
        assert!(p[1] > p[0], "{p:?}");
        assert!(catch_by_wave_end(&waves, 1.4, 1.1, 0.005, 0.0125, 0.5).is_err());
    }
}
