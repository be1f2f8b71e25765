//! Verdicts and their evidence: the closed set of outcomes a gate can produce, worst wins.

use serde::{Deserialize, Serialize};

use crate::error::DetectError;
use crate::sequential::Look;
use crate::stats::MwuMethod;

/// The outcome of a gate (and of a wave): one set shared with the engine and every reader, defined
/// in `orchestrator-types`.
pub use orchestrator_types::Outcome;

/// Why a gate is inconclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InconclusiveReason {
    /// A cohort has no exposure or no samples at all.
    NoData,
    /// The bake is over but a cohort has less data than the gate requires to pass.
    InsufficientData,
    /// No boundary crossed yet and the bake is not over.
    BakeInProgress,
}

/// Which statistical test produced the evidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TestKind {
    /// Exact conditional binomial test of two Poisson rates; statistic = canary events.
    ConditionalBinomial,
    /// Mann-Whitney U test of (canary - smallest shift) against control; statistic = U.
    MannWhitney {
        /// Exact null distribution or normal approximation.
        method: MwuMethod,
    },
}

/// What the effect estimate measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EffectMeasure {
    /// Canary rate / control rate.
    RateRatio,
    /// Hodges-Lehmann shift canary - control, positive = worse (sign flipped for lower-is-worse gates).
    Shift,
}

/// An effect estimate with its intervals. `None` means unbounded or undefined (for instance the rate
/// ratio when the control has no events), never NaN.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Effect {
    /// What is measured.
    pub measure: EffectMeasure,
    /// Point estimate.
    pub estimate: Option<f64>,
    /// Two-sided 95% interval, lower end, for people reading the evidence.
    pub ci95_lower: Option<f64>,
    /// Two-sided 95% interval, upper end.
    pub ci95_upper: Option<f64>,
    /// One-sided lower confidence bound at this look's nominal level: the bound that decides. The gate
    /// fails when it exceeds `min_effect` (up to ties in level data).
    pub decision_lower_bound: Option<f64>,
    /// The smallest effect that matters (ratio or shift) from the gate.
    pub min_effect: f64,
}

/// Summary of one cohort's data as the test saw it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CohortSummary {
    /// Events counted (rate gates).
    pub events: Option<u64>,
    /// Exposure, e.g. GPU-hours (rate gates).
    pub exposure: Option<f64>,
    /// Events per unit exposure (rate gates with exposure).
    pub rate: Option<f64>,
    /// Number of samples (level gates).
    pub samples: Option<u64>,
    /// Sample median (level gates).
    pub median: Option<f64>,
}

/// Everything needed to audit a gate's decision at one look.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// Gate name.
    pub gate: String,
    /// Test used.
    pub test: TestKind,
    /// Test statistic (see [`TestKind`]).
    pub statistic: f64,
    /// One-sided p-value of `H0: effect <= min_effect`.
    pub p_value: f64,
    /// The effect and its intervals.
    pub effect: Effect,
    /// The updated cohort.
    pub canary: CohortSummary,
    /// The concurrent control cohort.
    pub control: CohortSummary,
    /// The look and the boundary applied at it.
    pub look: Look,
}

/// A gate's verdict at one look. A closed set: the engine must handle every case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Verdict {
    /// End of the bake, enough data, no boundary crossed.
    Pass {
        /// The final look's evidence.
        evidence: Evidence,
    },
    /// The boundary was crossed at this look.
    Fail {
        /// The evidence that crossed it.
        evidence: Evidence,
    },
    /// Not decided: keep baking or hold for a human.
    Inconclusive {
        /// Gate name (also in the evidence, when there is any).
        gate: String,
        /// Why.
        reason: InconclusiveReason,
        /// The statistics so far, when there was anything to compute.
        evidence: Option<Box<Evidence>>,
    },
    /// The gate could not be evaluated.
    Error {
        /// Gate name.
        gate: String,
        /// What went wrong.
        error: DetectError,
    },
}

impl Verdict {
    /// The outcome, for ordering and for the engine's match.
    pub fn outcome(&self) -> Outcome {
        match self {
            Verdict::Pass { .. } => Outcome::Pass,
            Verdict::Fail { .. } => Outcome::Fail,
            Verdict::Inconclusive { .. } => Outcome::Inconclusive,
            Verdict::Error { .. } => Outcome::Error,
        }
    }

    /// The gate this verdict is about.
    pub fn gate(&self) -> &str {
        match self {
            Verdict::Pass { evidence } | Verdict::Fail { evidence } => &evidence.gate,
            Verdict::Inconclusive { gate, .. } | Verdict::Error { gate, .. } => gate,
        }
    }

    /// The evidence, when there is any.
    pub fn evidence(&self) -> Option<&Evidence> {
        match self {
            Verdict::Pass { evidence } | Verdict::Fail { evidence } => Some(evidence),
            Verdict::Inconclusive { evidence, .. } => evidence.as_deref(),
            Verdict::Error { .. } => None,
        }
    }
}

/// The verdict of a wave over all its gates at one look.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Combined {
    /// The worst outcome among the gates; Inconclusive when there are no gates (no data is never a
    /// pass).
    pub outcome: Outcome,
    /// Every gate's verdict, in the order given.
    pub verdicts: Vec<Verdict>,
}

/// Combine gate verdicts: the worst outcome wins. The false-alarm rate of the combination is controlled
/// by building each gate's plan with [`crate::SequentialPlan::bonferroni`].
pub fn combine(verdicts: Vec<Verdict>) -> Combined {
    let outcome = verdicts
        .iter()
        .map(Verdict::outcome)
        .max()
        .unwrap_or(Outcome::Inconclusive);
    Combined { outcome, verdicts }
}
