//! Regression detection for staged firmware rollouts: pure statistics, no I/O.
//!
//! A wave's health is compared with its concurrent control cohort, so fleet-wide events that move both
//! are not blamed on the firmware. Each gate produces a [`Verdict`] with its [`Evidence`]:
//!
//! - rate gates ([`evaluate_rate`]): exact conditional binomial test of two Poisson rates against the
//!   smallest rate ratio that matters, with a Clopper-Pearson based interval for the ratio;
//! - level gates ([`evaluate_level`]): Mann-Whitney U test against the smallest shift that matters,
//!   with the Hodges-Lehmann shift and its distribution-free interval;
//! - repeated looks during the bake spend each gate's alpha with a [`SequentialPlan`] (group-sequential
//!   alpha spending), and several gates share the family-wise alpha by Bonferroni;
//! - [`combine`] takes the worst outcome; [`rate_min_detectable_ratio`] and
//!   [`level_min_detectable_shift`] say what a wave can detect.
//!
//! The method, its assumptions and the reasons are in this crate's `README.md`.
//!
//! ```
//! use std::time::Duration;
//! use orchestrator_detect::*;
//!
//! // Two gates share a 5% family-wise false-alarm rate over a 6-hour bake looked at every 30 min.
//! let plan = SequentialPlan::bonferroni(0.05, 2, 12, SpendingFunction::OBrienFleming)?;
//! let xid = RateGate {
//!     name: "xid_per_gpu_hour".into(),
//!     min_effect_ratio: 1.5,
//!     min_canary_events_for_fail: 3,
//!     min_exposure: 100.0,
//! };
//! let temp = LevelGate { name: "gpu_temp_c".into(), direction: Direction::HigherIsWorse, min_shift: 1.0, min_samples: 8 };
//!
//! // The engine evaluates each planned look once, with cumulative data.
//! let look = plan.look_at(Duration::from_secs(6 * 3600), Duration::from_secs(6 * 3600)).expect("bake over");
//! let rates = RateCohorts {
//!     canary: RateSample { events: 14, exposure: 192.0 },
//!     control: RateSample { events: 41, exposure: 1920.0 },
//! };
//! let canary_temps = [71.0, 72.5, 70.8, 73.1, 71.9, 72.2, 70.5, 71.4];
//! let control_temps: Vec<f64> = (0..80).map(|i| 66.0 + f64::from(i % 9) * 0.5).collect();
//! let verdict = combine(vec![
//!     evaluate_rate(&xid, &rates, &look),
//!     evaluate_level(&temp, &LevelCohorts { canary: &canary_temps, control: &control_temps }, &look),
//! ]);
//! assert_eq!(verdict.outcome, Outcome::Fail);
//! let failed: Vec<&str> = verdict.verdicts.iter().filter(|v| v.outcome() == Outcome::Fail).map(Verdict::gate).collect();
//! assert_eq!(failed, ["xid_per_gpu_hour", "gpu_temp_c"]);
//! # Ok::<(), DetectError>(())
//! ```

pub mod error;
pub mod fleet;
pub mod judging;
pub mod level;
pub mod power;
pub mod rate;
pub mod sequential;
pub mod stats;
pub mod verdict;

pub use error::DetectError;
pub use level::{Direction, LevelCohorts, LevelGate, evaluate_level};
pub use power::{
    LevelPower, LevelPowerInput, RatePower, RatePowerInput, level_min_detectable_shift, level_power,
    rate_min_detectable_ratio, rate_power,
};
pub use rate::{RateCohorts, RateGate, RateSample, evaluate_rate};
pub use sequential::{Look, SequentialPlan, SpendingFunction};
pub use verdict::{
    CohortSummary, Combined, Effect, EffectMeasure, Evidence, InconclusiveReason, Outcome, TestKind, Verdict, combine,
};
