//! The judge's fixed choices: how many looks a bake gets, how the gates of a wave share the
//! policy's false-alarm rate, and the data minimums a verdict needs.
//!
//! The engine's judge and the power analysis (`waveguard policy power`, the policy lint) both read
//! them from here, so the power quoted for a policy is the power of the test the judge will run,
//! not of a look-alike that drifted from it.

use crate::error::DetectError;
use crate::sequential::{SequentialPlan, SpendingFunction};

/// Most looks per bake: the boundary recursion supports 50, and looks closer than a fiftieth of the
/// bake add cost without power.
pub const MAX_LOOKS: u32 = 50;

/// Exposure (GPU-hours, node-hours or node-days, per the metric) each cohort needs before a rate
/// gate may pass: less than one unit of exposure cannot say anything about a rate, so the gate
/// stays inconclusive.
pub const MIN_EXPOSURE: f64 = 1.0;

/// Units (GPUs) each cohort needs before a level gate may pass: below about eight the rank test
/// cannot reject anything at the usual alphas.
pub const MIN_LEVEL_UNITS: u64 = 8;

/// Canary events a rate gate needs before it may fail: one or two events cannot establish a rate
/// regression (see the README).
pub const MIN_CANARY_EVENTS_FOR_FAIL: u64 = 3;

/// The spending function the judge uses unless told otherwise: O'Brien-Fleming keeps almost all of
/// the alpha for the end of the bake, where the data are (see the README).
pub const DEFAULT_SPENDING: SpendingFunction = SpendingFunction::OBrienFleming;

/// Planned looks for a gate evaluated every `interval_seconds` over a bake of `bake_seconds`: one
/// per interval, at least one, at most [`MAX_LOOKS`].
pub fn planned_looks(bake_seconds: i64, interval_seconds: i64) -> u32 {
    let interval = interval_seconds.max(1);
    let looks = bake_seconds.max(0) / interval;
    u32::try_from(looks).unwrap_or(MAX_LOOKS).clamp(1, MAX_LOOKS)
}

/// The sequential plan of one of a wave's `gates` gates (every gate the wave names counts, judged
/// or not): the policy's `alpha` split by Bonferroni, spent over `looks` looks.
pub fn gate_plan(
    alpha: f64,
    gates: usize,
    looks: u32,
    spending: SpendingFunction,
) -> Result<SequentialPlan, DetectError> {
    SequentialPlan::bonferroni(alpha, gates, looks, spending)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looks_follow_the_interval_within_limits() {
        assert_eq!(planned_looks(6 * 3600, 1800), 12);
        assert_eq!(planned_looks(600, 1800), 1);
        assert_eq!(planned_looks(7 * 86_400, 300), MAX_LOOKS);
        assert_eq!(planned_looks(-5, 0), 1);
    }

    #[test]
    fn gates_share_alpha() {
        let plan = gate_plan(0.05, 2, 4, DEFAULT_SPENDING).unwrap();
        let one = gate_plan(0.025, 1, 4, DEFAULT_SPENDING).unwrap();
        assert_eq!(plan, one);
        assert!(gate_plan(0.05, 0, 4, DEFAULT_SPENDING).is_err());
    }
}
