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
    /// Fleet-scale detection: the planned bake is over but the evidence does
    /// not yet rule out `must_detect`; keep baking, up to the wave's
    /// `max_bake`. Never stored as a wave's final verdict.
    Extend,
    /// Keep baking, or (at the end of the bake) hold for a human.
    Inconclusive,
    /// Fleet-scale detection: `max_bake` reached without enough evidence
    /// either way; a human decides, with a statement of what the data rule
    /// out and what they cannot (promoting is recorded as promote anyway).
    Hold,
    /// The gate could not be evaluated (bad configuration or measurements): hold.
    Error,
    /// A boundary was crossed: the canary is worse than control by more than
    /// the smallest effect that matters, with the gate's false-alarm rate.
    Fail,
}

impl Outcome {
    /// Every outcome, best first.
    pub const ALL: [Outcome; 6] = [
        Outcome::Pass,
        Outcome::Extend,
        Outcome::Inconclusive,
        Outcome::Hold,
        Outcome::Error,
        Outcome::Fail,
    ];

    /// The stored and serialized spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Extend => "extend",
            Outcome::Inconclusive => "inconclusive",
            Outcome::Hold => "hold",
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
                expected: "pass, extend, inconclusive, hold, error, fail",
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

/// The stored evidence of a wave judged by fleet-scale detection (issue 22):
/// the `evidence` of its [`WaveVerdict`], and (one gate's part, a
/// [`FleetGateLook`]) the verdict of each recorded look. The rollout page,
/// the API and the evidence package decode it with this type.
///
/// Bounds are `None` where they are unbounded (nothing ruled out on that
/// side yet), since JSON has no infinity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct FleetEvidence {
    /// Always `"fleet"`: tells this shape from the per-wave judge's.
    pub method: String,
    /// The soak (issue 22): the whole fleet on the release against the holdback; its pass makes the
    /// release fleet-proven. False for every other wave (and in evidence stored before soaks).
    #[serde(default)]
    pub soak: bool,
    /// The rollout's false-rollback budget (policy `detection.false_rollback`), shared by all gates,
    /// waves and the soak.
    pub false_rollback: f64,
    /// The rollout's false-pass budget (policy `detection.false_pass`).
    pub false_pass: f64,
    /// Seconds excluded after a node's flash, on both sides (policy `detection.reset_exclusion`).
    pub reset_exclusion_seconds: i64,
    /// The planned bake: a minimum.
    pub bake_seconds: i64,
    /// The longest the bake may extend before a human decides.
    pub max_bake_seconds: i64,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub bake_started_at: chrono::DateTime<chrono::Utc>,
    /// Seconds since the bake started, at this look.
    pub elapsed_seconds: i64,
    /// The wave's decision at this look: pass, extend, hold or fail (error when a gate could not be
    /// evaluated).
    pub decision: Outcome,
    /// What the data rule out and what they cannot, in words (always set on a hold).
    pub statement: String,
    /// Nodes on the release so far (this wave and the waves before it) that were watched.
    pub updated_nodes: usize,
    /// Concurrent control nodes watched: eligible nodes not yet on the release.
    pub control_nodes: usize,
    /// Strata (platform, cluster) the comparison is made within.
    pub strata: usize,
    /// One entry per gate of the wave.
    pub gates: Vec<FleetGateLook>,
    /// Watched nodes whose latest health poll failed.
    #[serde(default)]
    pub nodes_in_error: Vec<NodeInError>,
}

/// One gate at one look of fleet-scale detection; see [`FleetEvidence`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct FleetGateLook {
    pub gate: String,
    /// `rate` or `level`.
    pub kind: String,
    /// The look's number (one per gate interval since the bake started); a look is recorded once.
    pub look: u32,
    /// Looks until `max_bake`.
    pub max_looks: u32,
    /// `fail` (the lower bound is above the null), `pass` (the upper bound is below `must_detect`),
    /// `extend` (neither yet) or `error`.
    pub outcome: Outcome,
    /// Point estimate: the Mantel-Haenszel rate ratio, or the mean shift (harmful direction positive).
    pub estimate: Option<f64>,
    /// Anytime-valid lower bound at the gate's false-rollback share (`None`: nothing ruled out below).
    pub lower: Option<f64>,
    /// Anytime-valid upper bound at the gate's false-pass share (`None`: nothing ruled out above).
    pub upper: Option<f64>,
    /// The null a Fail must exceed: the gate's `min_effect`.
    pub null: f64,
    /// The effect a Pass must rule out.
    pub must_detect: f64,
    /// This gate's share of the false-rollback budget.
    pub alpha: f64,
    /// This gate's share of the false-pass budget.
    pub beta: f64,
    /// What this gate's data rule out so far, in words.
    pub ruled_out: String,
    /// Share of `max_bake` elapsed (the anytime-valid method spends nothing per look; this is time).
    pub information_fraction: f64,
    /// Rate gates: events the updated nodes would have had at the control's rate (the information
    /// the comparison has, in expected baseline events).
    pub expected_baseline_events: Option<f64>,
    pub updated: FleetCohort,
    pub control: FleetCohort,
    /// Unit of the exposure: `gpu_hours`, `node_hours`, `node_days`; for level gates `node_means`.
    pub exposure_unit: String,
    /// Quasi-Poisson dispersion estimated from the control (>= 1), rate gates.
    pub dispersion: Option<f64>,
    /// Hours after the first bin at which the process that failed started (0: the cumulative one;
    /// later: a delayed onset).
    pub failed_from_hour: Option<u32>,
    /// Why the gate could not be evaluated, when its outcome is `error`.
    pub error: Option<String>,
    /// Rate gates: the node-level look for an effect confined to some updated nodes (absent from
    /// looks recorded before the engine ran it).
    #[serde(default)]
    pub node_look: Option<FleetNodeLook>,
}

/// A rate gate's node-level look at one look: evidence that the release made some updated nodes
/// worse than the gate's null, which the pooled ratio dilutes. It can fail a gate, never pass one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct FleetNodeLook {
    /// Updated nodes in the evidence.
    pub nodes: usize,
    /// `ln` of the mixture likelihood ratio (`None` when not finite).
    pub ln_evidence: Option<f64>,
    /// `ln(1 / level)`: the look fails the gate when the evidence reaches it.
    pub ln_threshold: f64,
    /// The look's share of the gate's false-rollback budget.
    pub level: f64,
    /// The spread of node rates assumed (`var / mean²`: the controls' estimate, floored).
    pub heterogeneity: f64,
    /// Whether the look failed the gate.
    pub fail: bool,
}

/// One side of a fleet comparison at a look.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct FleetCohort {
    /// Nodes that contributed.
    pub nodes: usize,
    /// Events (rate gates).
    pub events: Option<u64>,
    /// Exposure in the gate's unit (rate gates).
    pub exposure: Option<f64>,
}

/// A watched node whose latest health poll failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct NodeInError {
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub node: crate::NodeId,
    pub name: String,
    /// `canary` (on the release) or `control`.
    pub cohort: String,
    pub error: String,
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

    #[test]
    fn a_look_recorded_before_the_node_level_look_still_reads_back() {
        // A recorded look is read back, never recomputed: one stored before `node_look` existed decodes
        // without it, and a new one round-trips with it.
        let old = serde_json::json!({
            "gate": "xid_errors", "kind": "rate", "look": 3, "max_looks": 18, "outcome": "fail",
            "estimate": 3.1, "lower": 1.8, "upper": null, "null": 1.5, "must_detect": 3.0,
            "alpha": 0.01, "beta": 0.025, "ruled_out": "x", "information_fraction": 0.2,
            "expected_baseline_events": 12.0,
            "updated": {"nodes": 10, "events": 40, "exposure": 80.0},
            "control": {"nodes": 30, "events": 36, "exposure": 240.0},
            "exposure_unit": "gpu_hours", "dispersion": 1.0, "failed_from_hour": 0, "error": null
        });
        let mut look: FleetGateLook = serde_json::from_value(old).unwrap();
        assert_eq!(look.node_look, None);
        look.node_look = Some(FleetNodeLook {
            nodes: 10,
            ln_evidence: Some(6.1),
            ln_threshold: 5.3,
            level: 0.005,
            heterogeneity: 0.05,
            fail: true,
        });
        let again: FleetGateLook = serde_json::from_value(serde_json::to_value(&look).unwrap()).unwrap();
        assert_eq!(again, look);
    }
}
