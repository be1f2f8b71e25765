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

pub mod error;
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
