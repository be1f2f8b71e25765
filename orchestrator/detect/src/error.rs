//! Errors of the detector: invalid configuration or invalid measurements.
//!
//! Statistics never panic on outside input; anything that cannot be evaluated becomes one of these
//! errors, which the verdict functions turn into [`crate::Verdict::Error`] so that a broken gate holds
//! the wave (and is visible) instead of silently passing it.

use serde::{Deserialize, Serialize};

/// Why a gate, a plan or a set of measurements cannot be evaluated.
///
/// Serialisable because it travels inside a verdict into the evidence package and the UI.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DetectError {
    /// The false-alarm rate must lie strictly between 0 and 1.
    #[error("false-alarm rate alpha must be in (0, 1), got {alpha}")]
    InvalidAlpha {
        /// The rejected value.
        #[serde(with = "any_f64")]
        alpha: f64,
    },
    /// A sequential plan needs at least one and at most [`crate::sequential::MAX_LOOKS`] looks.
    #[error("number of looks must be in 1..={max}, got {looks}")]
    InvalidLooks {
        /// The rejected value.
        looks: u32,
        /// The largest supported number of looks.
        max: u32,
    },
    /// A look number outside the plan.
    #[error("look {number} is outside the plan of {planned} looks")]
    LookOutOfPlan {
        /// The requested look (1-based).
        number: u32,
        /// Looks in the plan.
        planned: u32,
    },
    /// The number of gates sharing the family-wise alpha must be at least one.
    #[error("number of gates sharing alpha must be at least 1")]
    NoGates,
    /// A gate parameter is out of its domain (for example a rate ratio below 1 or a NaN).
    #[error("gate {gate:?}: parameter {parameter} must be {expected}, got {value}")]
    InvalidParameter {
        /// The gate's name.
        gate: String,
        /// Which parameter.
        parameter: String,
        /// What the domain is, in words.
        expected: String,
        /// The rejected value.
        #[serde(with = "any_f64")]
        value: f64,
    },
    /// An exposure is negative, NaN or infinite.
    #[error("gate {gate:?}: {cohort} exposure must be finite and >= 0, got {value}")]
    InvalidExposure {
        /// The gate's name.
        gate: String,
        /// `canary` or `control`.
        cohort: String,
        /// The rejected value.
        #[serde(with = "any_f64")]
        value: f64,
    },
    /// Event counts so large that their sum overflows.
    #[error("gate {gate:?}: event counts too large to add ({canary} + {control})")]
    CountOverflow {
        /// The gate's name.
        gate: String,
        /// Canary events.
        canary: u64,
        /// Control events.
        control: u64,
    },
    /// A level sample is NaN, infinite or beyond any physical level (|v| > 1e12): a collector bug,
    /// not a measurement. Bounded so that differences between samples cannot overflow.
    #[error("gate {gate:?}: {cohort} sample {index} is not a finite level with magnitude <= 1e12")]
    InvalidSample {
        /// The gate's name.
        gate: String,
        /// `canary` or `control`.
        cohort: String,
        /// Position of the bad sample.
        index: usize,
    },
    /// An input to a power calculation is out of its domain.
    #[error("power analysis: {parameter} must be {expected}, got {value}")]
    InvalidPowerInput {
        /// Which input.
        parameter: String,
        /// What the domain is, in words.
        expected: String,
        /// The rejected value.
        #[serde(with = "any_f64")]
        value: f64,
    },
}

/// Rejected values are often NaN or infinite, which JSON numbers cannot hold (serde_json would write
/// `null` and then refuse to read it back): those travel as the strings `"NaN"`, `"inf"`, `"-inf"`.
mod any_f64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else {
            s.serialize_str(&v.to_string())
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Number(f64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        match Repr::deserialize(d)? {
            Repr::Number(v) => Ok(v),
            Repr::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}
