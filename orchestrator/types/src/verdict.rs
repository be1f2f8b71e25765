//! The health verdict of a wave: one outcome set from the detector's gates
//! to the engine's decision, the stored column, the API and the reports.
//!
//! The detector (`orchestrator-detect`) re-exports [`Outcome`] for its
//! per-gate verdicts; the engine stores a [`WaveVerdict`] in the wave's
//! verdict column through serde, and every reader decodes it with this type
//! instead of picking keys out of JSON.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// The outcome of a gate or of a wave, ordered from best to worst so that
/// combining gates is `max`.
///
/// Fail is worse than Error: a gate that proved a regression must roll back
/// even if another gate could not be evaluated. Error is worse than
/// Inconclusive because it needs a human to fix something.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// End of bake, enough data, no boundary crossed: promote.
    Pass,
    /// Keep baking, or (at the end of the bake) hold for a human.
    Inconclusive,
    /// The gate could not be evaluated (bad configuration or measurements): hold.
    Error,
    /// A boundary was crossed: the canary is worse than control by more than
    /// the smallest effect that matters, with the gate's false-alarm rate.
    Fail,
}

impl Outcome {
    /// Every outcome, best first.
    pub const ALL: [Outcome; 4] = [Outcome::Pass, Outcome::Inconclusive, Outcome::Error, Outcome::Fail];

    /// The stored and serialized spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Inconclusive => "inconclusive",
            Outcome::Error => "error",
            Outcome::Fail => "fail",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for Outcome {
    type Err = crate::ParseEnumError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Outcome::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| crate::ParseEnumError {
                what: "verdict outcome",
                value: s.to_owned(),
                expected: "pass, inconclusive, error, fail",
            })
    }
}

/// A wave's health verdict over all its gates, as stored on the wave and
/// shown to people. Rows stored by earlier versions have exactly this shape
/// (`outcome`, `summary`, `evidence`), whatever their evidence holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct WaveVerdict {
    /// The worst outcome among the wave's gates.
    pub outcome: Outcome,
    /// One line for the UI.
    pub summary: String,
    /// What the judge measured (per-gate looks, statistics, cohorts); its
    /// shape is the judge's, kept whole for the evidence package.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub evidence: serde_json::Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_text_round_trips_and_orders_worst_last() {
        for outcome in Outcome::ALL {
            assert_eq!(outcome.as_str().parse::<Outcome>(), Ok(outcome));
            assert_eq!(serde_json::to_value(outcome).unwrap(), outcome.as_str());
        }
        assert!("passed".parse::<Outcome>().is_err());
        assert_eq!(Outcome::ALL.iter().max(), Some(&Outcome::Fail));
        assert!(Outcome::Error > Outcome::Inconclusive);
    }
}
