//! Sequential decisions: looking repeatedly during a bake without inflating false alarms.
//!
//! Method (see the crate README for the reasoning): group-sequential alpha spending (Lan & DeMets)
//! over `K` equally spaced planned looks, information fraction `t_k = k / K` (elapsed bake / bake
//! time). The spending function `alpha(t)` says how much of the gate's false-alarm rate may have been
//! used by time `t`; the boundary `c_k` at look `k` is chosen so that, for a standardised statistic
//! behaving like Brownian motion (`Z_k * sqrt(t_k)`), `P(no crossing before k, crossing at k) =
//! alpha(t_k) - alpha(t_{k-1})`. The joint probabilities are computed with the Armitage-McPherson-Rowe
//! recursive numerical integration. A gate fails at look `k` when its one-sided p-value is at most the
//! nominal level `1 - Phi(c_k)`.

use serde::{Deserialize, Serialize};

use crate::error::DetectError;
use crate::stats::{norm_isf, norm_sf};

/// Most looks a plan may have. Boundaries cost O(K * grid^2) to compute and looks closer than 2% of
/// the bake apart add almost no speed of detection while each one lowers the per-look level.
pub const MAX_LOOKS: u32 = 50;

/// Grid spacing (in units of one look's increment standard deviation) of the numerical integration;
/// Simpson's rule at this spacing is accurate to ~1e-6 in the crossing probabilities.
const GRID_STEP: f64 = 0.1;

/// The increment kernel is cut off this many standard deviations from its centre (pdf < 1e-16).
const KERNEL_HALF_WIDTH: f64 = 8.5;

/// Densities are integrated over mean +/- this many standard deviations; the mass outside is < 1e-15.
const GRID_HALF_WIDTH_SD: f64 = 8.0;

/// How the gate's false-alarm rate is spent over the bake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpendingFunction {
    /// Lan-DeMets O'Brien-Fleming type, `alpha(t) = 2 * (1 - Phi(z_{1-alpha/2} / sqrt(t)))`: almost
    /// nothing is spent early, so early looks need overwhelming evidence and the final look keeps a
    /// level close to alpha. The default: a bake exists to wait for slow regressions.
    OBrienFleming,
    /// Lan-DeMets Pocock type, `alpha(t) = alpha * ln(1 + (e - 1) t)`: spends evenly, catching a large
    /// regression sooner at the price of a stricter final look.
    Pocock,
}

impl SpendingFunction {
    /// Cumulative false-alarm probability allowed by information fraction `t` (clamped to [0, 1]).
    pub fn spent(self, alpha: f64, t: f64) -> f64 {
        let t = if t.is_nan() { 0.0 } else { t.clamp(0.0, 1.0) };
        if t == 0.0 {
            return 0.0;
        }
        if t == 1.0 {
            // Exactly alpha by definition; the formula would carry the normal quantile's rounding.
            return alpha;
        }
        match self {
            SpendingFunction::OBrienFleming => (2.0 * norm_sf(norm_isf(alpha / 2.0) / t.sqrt())).min(alpha),
            SpendingFunction::Pocock => alpha * (1.0 + (std::f64::consts::E - 1.0) * t).ln(),
        }
    }
}

/// One planned look of a sequential plan, with the boundary that applies there. Recorded in every
/// verdict's evidence so a reader can see which threshold the p-value was held against.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Look {
    /// 1-based look number.
    pub number: u32,
    /// Looks in the plan; look `planned` is the end of the bake.
    pub planned: u32,
    /// `number / planned`, the share of the bake elapsed at this look.
    pub information_fraction: f64,
    /// False-alarm probability spent up to and including this look.
    pub cumulative_alpha: f64,
    /// Boundary on the standardised statistic; `None` when this look spends nothing (cannot fail).
    pub z_boundary: Option<f64>,
    /// The p-value at or below which the gate fails at this look.
    pub nominal_alpha: f64,
    /// Whether this is the end of the bake, the only look at which a gate can pass.
    pub is_final: bool,
}

/// The boundaries of one gate over one bake, computed once and reused at every look.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SequentialPlan {
    /// The gate's overall one-sided false-alarm rate (after any multiple-gate correction).
    pub alpha: f64,
    /// The spending function.
    pub spending: SpendingFunction,
    /// One entry per planned look, in order.
    pub looks: Vec<Look>,
}

impl SequentialPlan {
    /// Boundaries for `looks` equally spaced looks spending `alpha` with `spending`.
    pub fn new(alpha: f64, looks: u32, spending: SpendingFunction) -> Result<Self, DetectError> {
        if !(alpha > 0.0 && alpha < 1.0) {
            return Err(DetectError::InvalidAlpha { alpha });
        }
        if looks == 0 || looks > MAX_LOOKS {
            return Err(DetectError::InvalidLooks { looks, max: MAX_LOOKS });
        }
        let increments: Vec<f64> = (1..=looks)
            .map(|k| {
                let t = |k: u32| f64::from(k) / f64::from(looks);
                (spending.spent(alpha, t(k)) - spending.spent(alpha, t(k - 1))).max(0.0)
            })
            .collect();
        let boundaries = solve_boundaries(&increments);
        let mut cumulative = 0.0;
        let plan_looks = boundaries
            .iter()
            .zip(&increments)
            .enumerate()
            .map(|(i, (&z, &inc))| {
                cumulative += inc;
                let number = i as u32 + 1;
                Look {
                    number,
                    planned: looks,
                    information_fraction: f64::from(number) / f64::from(looks),
                    cumulative_alpha: cumulative.min(alpha),
                    z_boundary: z,
                    nominal_alpha: z.map_or(0.0, norm_sf),
                    is_final: number == looks,
                }
            })
            .collect();
        Ok(Self {
            alpha,
            spending,
            looks: plan_looks,
        })
    }

    /// A plan for one of `gates` gates sharing a family-wise false-alarm rate `family_alpha`:
    /// Bonferroni, each gate gets `family_alpha / gates`. Valid whatever the dependence between the
    /// gates' metrics (errors and temperatures of the same nodes are correlated).
    pub fn bonferroni(
        family_alpha: f64,
        gates: usize,
        looks: u32,
        spending: SpendingFunction,
    ) -> Result<Self, DetectError> {
        if gates == 0 {
            return Err(DetectError::NoGates);
        }
        if !(family_alpha > 0.0 && family_alpha < 1.0) {
            return Err(DetectError::InvalidAlpha { alpha: family_alpha });
        }
        Self::new(family_alpha / gates as f64, looks, spending)
    }

    /// Look number `number` (1-based).
    pub fn look(&self, number: u32) -> Result<Look, DetectError> {
        let planned = self.looks.len() as u32;
        number
            .checked_sub(1)
            .and_then(|i| self.looks.get(i as usize))
            .copied()
            .ok_or(DetectError::LookOutOfPlan { number, planned })
    }

    /// The latest planned look whose time has come after `elapsed` of a bake lasting `bake`; `None`
    /// before the first look. The caller must evaluate each look number once: evaluating the same
    /// boundary repeatedly would spend more than the plan allows.
    pub fn look_at(&self, elapsed: std::time::Duration, bake: std::time::Duration) -> Option<Look> {
        let planned = self.looks.len() as u128;
        let bake = bake.as_nanos();
        if bake == 0 {
            return self.looks.last().copied();
        }
        let number = (elapsed.as_nanos().saturating_mul(planned) / bake).min(planned);
        let number = u32::try_from(number).ok()?;
        self.look(number).ok()
    }

    /// Probability that a statistic whose expected standardised value at the final look is `theta`
    /// (drift) crosses a boundary at some look: the power of the plan. `theta = 0` gives the plan's
    /// false-alarm rate (up to integration error).
    pub fn crossing_probability(&self, theta: f64) -> f64 {
        self.crossing_probability_scaled(theta, 1.0)
    }

    /// Like [`Self::crossing_probability`] for a statistic standardised with its null variance whose
    /// standard deviation under the alternative is `sd` times larger (score tests: the variance of the
    /// canary share differs under H0 and H1). `Z_k >= c_k` is `Z_k / sd >= c_k / sd`, a unit-variance
    /// process with drift `theta / sd` against boundaries `c_k / sd`.
    pub fn crossing_probability_scaled(&self, theta: f64, sd: f64) -> f64 {
        let k = self.looks.len();
        if k == 0 || !theta.is_finite() || !crate::stats::is_positive_finite(sd) {
            return 0.0;
        }
        let boundaries: Vec<Option<f64>> = self.looks.iter().map(|l| l.z_boundary.map(|z| z / sd)).collect();
        let drift = theta / sd / (k as f64).sqrt();
        recursion(&boundaries, drift).iter().sum::<f64>().clamp(0.0, 1.0)
    }
}

/// Boundaries `z_k` (on the standardised scale) that spend `increments[k]` at each look under the
/// null; `None` where nothing is spent.
fn solve_boundaries(increments: &[f64]) -> Vec<Option<f64>> {
    let mut boundaries: Vec<Option<f64>> = Vec::with_capacity(increments.len());
    let mut cont: Vec<(f64, f64)> = Vec::new();
    for (i, &inc) in increments.iter().enumerate() {
        let k = i + 1;
        let z = if inc <= 0.0 {
            None
        } else if k == 1 {
            Some(norm_isf(inc))
        } else {
            // Crossing probability at look k decreases as the boundary rises: bisect on the Z scale.
            let crossing = |z: f64| {
                let b = z * (k as f64).sqrt();
                cont.iter().map(|&(v, wf)| wf * norm_sf(b - v)).sum::<f64>()
            };
            // 52 halvings of the width-50 bracket leave ~1e-14 on the z scale.
            let (mut lo, mut hi) = (-10.0_f64, 40.0_f64);
            for _ in 0..52 {
                let mid = 0.5 * (lo + hi);
                if crossing(mid) > inc {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            Some(hi)
        };
        boundaries.push(z);
        if k < increments.len() {
            cont = advance(&cont, k, z, 0.0);
        }
    }
    boundaries
}

/// Crossing probability at every look for boundaries `z` and per-look drift `drift`.
fn recursion(z: &[Option<f64>], drift: f64) -> Vec<f64> {
    let mut out = Vec::with_capacity(z.len());
    let mut cont: Vec<(f64, f64)> = Vec::new();
    for (i, &zk) in z.iter().enumerate() {
        let k = i + 1;
        let crossing = match zk.map(|zk| zk * (k as f64).sqrt()) {
            None => 0.0,
            Some(b) if k == 1 => norm_sf(b - drift),
            Some(b) => cont.iter().map(|&(v, wf)| wf * norm_sf(b - v - drift)).sum(),
        };
        out.push(crossing);
        if k < z.len() {
            cont = advance(&cont, k, zk, drift);
        }
    }
    out
}

/// One step of the recursion: from the sub-density of `W_{k-1}` on paths that crossed no boundary
/// (ignored for `k == 1`) to that of `W_k = W_{k-1} + N(drift, 1)` on paths that also stay below
/// `z_k`, as (grid point, Simpson weight * density) pairs.
fn advance(prev: &[(f64, f64)], k: usize, z_k: Option<f64>, drift: f64) -> Vec<(f64, f64)> {
    let kf = k as f64;
    let mean = drift * kf;
    let lower = mean - GRID_HALF_WIDTH_SD * kf.sqrt();
    let natural_upper = mean + GRID_HALF_WIDTH_SD * kf.sqrt();
    let upper = z_k.map_or(natural_upper, |zk| (zk * kf.sqrt()).min(natural_upper));
    let grid = simpson_grid(lower, upper);
    if k == 1 {
        return grid
            .into_iter()
            .map(|(w, weight)| (w, weight * normal_pdf(w - drift)))
            .collect();
    }
    grid.into_iter()
        .map(|(w, weight)| {
            // The kernel is negligible (< 1e-16 of its peak) beyond KERNEL_HALF_WIDTH; prev is sorted.
            let centre = w - drift;
            let from = prev.partition_point(|&(v, _)| v < centre - KERNEL_HALF_WIDTH);
            let to = prev.partition_point(|&(v, _)| v <= centre + KERNEL_HALF_WIDTH);
            let density: f64 = prev[from..to].iter().map(|&(v, wf)| wf * normal_pdf(centre - v)).sum();
            (w, weight * density)
        })
        .collect()
}

fn normal_pdf(x: f64) -> f64 {
    (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

/// Points and Simpson weights on `[lower, upper]` with spacing about `GRID_STEP`; empty when the
/// interval is empty (all mass already crossed).
fn simpson_grid(lower: f64, upper: f64) -> Vec<(f64, f64)> {
    if upper.is_nan() || lower.is_nan() || upper <= lower {
        return Vec::new();
    }
    let mut intervals = ((upper - lower) / GRID_STEP).ceil() as usize;
    intervals = intervals.max(2);
    if intervals % 2 == 1 {
        intervals += 1;
    }
    let h = (upper - lower) / intervals as f64;
    (0..=intervals)
        .map(|i| {
            let coefficient = if i == 0 || i == intervals {
                1.0
            } else if i % 2 == 1 {
                4.0
            } else {
                2.0
            };
            (lower + h * i as f64, coefficient * h / 3.0)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_look_is_the_fixed_sample_test() {
        let plan = SequentialPlan::new(0.05, 1, SpendingFunction::OBrienFleming).unwrap();
        let look = plan.look(1).unwrap();
        assert!((look.nominal_alpha - 0.05).abs() < 1e-9);
        assert!(look.is_final);
        assert!((plan.crossing_probability(0.0) - 0.05).abs() < 1e-6);
    }

    #[test]
    fn spending_reaches_alpha_and_plan_spends_it() {
        for spending in [SpendingFunction::OBrienFleming, SpendingFunction::Pocock] {
            assert!((spending.spent(0.05, 1.0) - 0.05).abs() < 1e-12);
            let plan = SequentialPlan::new(0.05, 12, spending).unwrap();
            // The whole plan's null crossing probability is the alpha it was built for.
            assert!((plan.crossing_probability(0.0) - 0.05).abs() < 1e-4, "{spending:?}");
            // Nominal levels are below alpha (repeated looks cost something) but not absurdly so.
            let last = plan.looks.last().unwrap();
            assert!(last.nominal_alpha < 0.05 && last.nominal_alpha > 0.01, "{last:?}");
        }
    }

    #[test]
    fn look_at_maps_elapsed_time_to_planned_looks() {
        use std::time::Duration;
        let plan = SequentialPlan::new(0.05, 4, SpendingFunction::OBrienFleming).unwrap();
        let bake = Duration::from_secs(4 * 3600);
        assert_eq!(plan.look_at(Duration::from_secs(3599), bake), None);
        assert_eq!(plan.look_at(Duration::from_secs(3600), bake).map(|l| l.number), Some(1));
        assert_eq!(
            plan.look_at(Duration::from_secs(4 * 3600), bake).map(|l| l.is_final),
            Some(true)
        );
        assert_eq!(
            plan.look_at(Duration::from_secs(9 * 3600), bake).map(|l| l.number),
            Some(4)
        );
    }

    #[test]
    fn invalid_plans_are_errors() {
        assert!(SequentialPlan::new(0.0, 3, SpendingFunction::Pocock).is_err());
        assert!(SequentialPlan::new(f64::NAN, 3, SpendingFunction::Pocock).is_err());
        assert!(SequentialPlan::new(0.05, 0, SpendingFunction::Pocock).is_err());
        assert!(SequentialPlan::new(0.05, MAX_LOOKS + 1, SpendingFunction::Pocock).is_err());
        assert!(SequentialPlan::bonferroni(0.05, 0, 3, SpendingFunction::Pocock).is_err());
    }
}
