//! Fleet-scale detection (issue 22): anytime-valid evidence pooled across waves and the soak, against
//! every eligible node not yet on the release, with one error budget for the whole rollout.
//!
//! The pieces, each pure and small:
//!
//! - [`RateEProcess`]: a rate gate's evidence over the whole rollout. Events are pooled by time bin
//!   and stratum (Mantel-Haenszel style: each cell is compared only with its own concurrent control,
//!   conditional on the cell's total events), and a mixture likelihood ratio over a grid of rate
//!   ratios gives a confidence sequence for the common ratio that is valid at every look, however
//!   the looks and the bake extensions depend on the data;
//! - [`quasi_poisson_dispersion`]: the over-dispersion of node-level counts, estimated from the
//!   control, which tempers the rate evidence (XIDs burst and cascade across a node's GPUs);
//! - [`NodeMixtureProcess`]: a rate gate's node-level look, a mixture over the share of updated nodes
//!   made worse, against the control's spread of node rates ([`node_heterogeneity`]), for effects a
//!   pooled ratio dilutes;
//! - [`LevelEProcess`]: a level gate's evidence, one value per updated node (its concurrent
//!   difference from the control), with a normal-mixture confidence sequence;
//! - [`decide_wave`] / [`decide_soak`]: the three outcomes with the right nulls — Fail when the
//!   lower bound exceeds `min_effect`; Pass only after the bake and when the upper bound is below
//!   `must_detect`; otherwise Extend up to `max_bake`, then Hold with a plain statement of what the
//!   data rule out;
//! - [`ErrorBudget`]: the rollout's false-rollback and false-pass budgets, split over gates once;
//! - [`counted_hours`] and [`holdback_events_needed`]: the post-reset exclusion rule and the
//!   holdback's size;
//! - [`hours_to_pass`] / [`hours_to_catch`]: median and p95 time to decide, for `policy power`;
//! - [`forecast_catch`]: the chance of a catch by each wave's end, by a seeded Monte Carlo of the
//!   method's own processes on the policy's waves (what `policy power` quotes);
//! - [`sim`]: an I/O-free 1,000-node rollout simulation (the detection bench).
//!
//! The method, its assumptions and its guarantees are in the crate's `README.md` ("Fleet-scale
//! detection").

mod decision;
mod dispersion;
mod draw;
mod forecast;
mod level;
mod nodes;
mod rate;
pub mod sim;
mod soak;
mod timing;

pub use decision::{GateLook, SoakDecision, WaveDecision, WaveTiming, decide_soak, decide_wave};
pub use dispersion::{NodeCount, quasi_poisson_dispersion};
pub use forecast::{FORECAST_SEEDS, Forecast, ForecastGate, ForecastWave, forecast_catch};
pub use level::{
    LevelBatch, LevelEConfig, LevelEProcess, LevelLook, NodeLevel, level_batches_with_pre_period,
    pre_period_coefficient,
};
pub use nodes::{MIN_HETEROGENEITY, NodeCell, NodeMixtureProcess, NodeObservation, node_heterogeneity};
pub use rate::{RateCell, RateEConfig, RateEProcess, RateLook};
pub use soak::{counted_hours, holdback_events_needed, holdback_fraction};
pub use timing::{
    Hours, RateTimingInput, TimedWave, catch_by_wave_end, catch_probability, hours_to_catch, hours_to_pass,
};

/// Why fleet-scale evidence cannot be built or updated. Outside input never panics; it becomes one
/// of these, and the engine holds the wave with the message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FleetError {
    /// A rate or probability outside its domain.
    #[error("{what} must be {expected}, got {value}")]
    Invalid {
        /// Which parameter or measurement.
        what: &'static str,
        /// The domain, in words.
        expected: &'static str,
        /// The rejected value.
        value: f64,
    },
}

pub(crate) fn check(what: &'static str, expected: &'static str, value: f64, ok: bool) -> Result<(), FleetError> {
    if ok {
        Ok(())
    } else {
        Err(FleetError::Invalid { what, expected, value })
    }
}

/// Default rollout-level false-rollback budget: the probability that a healthy release is rolled back
/// anywhere in the rollout (all gates, all waves, the soak).
pub const DEFAULT_FALSE_ROLLBACK: f64 = 0.02;

/// Default rollout-level false-pass budget: the probability that a release at least `must_detect`
/// worse on some gate passes a wave or the soak on that gate.
pub const DEFAULT_FALSE_PASS: f64 = 0.05;

/// The rollout's two error budgets, shared by every gate, wave and the soak.
///
/// Because each gate's evidence is one anytime-valid process over the whole rollout, a budget is spent
/// once per gate, not once per look or per wave; gates share it by Bonferroni.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErrorBudget {
    /// Probability of rolling back a healthy release (policy `detection.false_rollback`).
    pub false_rollback: f64,
    /// Probability of passing a release that is `must_detect` worse (policy `detection.false_pass`).
    pub false_pass: f64,
}

impl Default for ErrorBudget {
    fn default() -> Self {
        Self {
            false_rollback: DEFAULT_FALSE_ROLLBACK,
            false_pass: DEFAULT_FALSE_PASS,
        }
    }
}

impl ErrorBudget {
    /// Validates both budgets (each in (0, 0.5]: a larger budget is a coin toss, not a test).
    pub fn new(false_rollback: f64, false_pass: f64) -> Result<Self, FleetError> {
        let ok = |v: f64| v > 0.0 && v <= 0.5;
        check("false_rollback", "in (0, 0.5]", false_rollback, ok(false_rollback))?;
        check("false_pass", "in (0, 0.5]", false_pass, ok(false_pass))?;
        Ok(Self {
            false_rollback,
            false_pass,
        })
    }

    /// Each of `gates` gates' share: `(alpha, beta)`.
    pub fn per_gate(self, gates: usize) -> (f64, f64) {
        let g = gates.max(1) as f64;
        (self.false_rollback / g, self.false_pass / g)
    }
}
