//! A rate gate's evidence over the whole rollout: a mixture likelihood ratio for the common rate
//! ratio of updated nodes to their concurrent controls, conditional on each cell's total events.
//!
//! Why conditional: given that `n` events happened in a cell (one time bin of one stratum), each is
//! the updated cohort's with probability `p(R) = R e / (1 + R e)`, `e` = updated / control exposure
//! in that cell. The control's rate, whatever it is and however a fleet-wide event moves it, cancels
//! (Mantel-Haenszel's idea; a hot day raises both sides of the cell alike). Comparing only within a
//! cell also means an early-updated node is never compared with a later-updated one.
//!
//! Why a mixture likelihood ratio: for a fixed alternative `R1 > R0` the conditional likelihood ratio
//! is a non-negative supermartingale under every `R <= R0` (monotone likelihood ratio), and so is any
//! average of such ratios; Ville's inequality then bounds the chance that it ever crosses `1/alpha`
//! by alpha, at any number of looks, however the bake is extended on the data (Robbins 1970; Howard,
//! Ramdas, McAuliffe & Sekhon 2021; Ramdas, Grünwald, Vovk & Shafer 2023). Inverting these tests over a
//! grid of ratios gives a confidence sequence whose bounds decide Fail and Pass.
//!
//! The sufficient statistics are the updated cohort's events `x1` and, for every grid ratio `R`,
//! `A(R) = sum over cells of n ln(1 + R e)`: the log likelihood ratio of `R1` against `R0` is
//! `x1 ln(R1/R0) + A(R0) - A(R1)`. Both are updated once per cell, so a look costs a few hundred
//! exponentials whatever the fleet size.

use super::{FleetError, check};

/// Grid points per doubling of the ratio: bounds are reported on this grid (steps of 4.4%), rounded
/// outward so that rounding never helps a decision.
const STEPS_PER_DOUBLING: i32 = 16;
/// Lowest grid ratio, 2^-4 = 1/16.
const GRID_LOW: i32 = -4 * STEPS_PER_DOUBLING;
/// Highest grid ratio, 2^6 = 64: a ratio beyond it is reported as "> 64".
const GRID_HIGH: i32 = 6 * STEPS_PER_DOUBLING;
/// The downward mixture (Pass: ruling out `must_detect`) puts its alternatives every second grid point
/// up to 16x below the tested ratio: 32 points of weight 1/32 each.
const MIX_STRIDE: usize = 2;
const MIX_POINTS: usize = 32;
/// The upward mixture (Fail) puts weight `1/15` on each of these grid offsets above the tested ratio:
/// ratios `2^(d/16)` from 1.19x to 7.0x beyond it, evenly spaced in `sqrt(theta)`, `theta = ln(R1/R0)`
/// (`sqrt(theta)` = 0.416, 0.486, ... 1.396), i.e. a prior density on `theta` proportional to
/// `theta^(-1/2)` between ln 1.19 and ln 7.
///
/// Why this shape. At the look where a mixture first crosses, its log is about the best alternative's
/// log likelihood ratio less `ln(sqrt(I / (2 pi)) / w(theta))`, where `w` is the prior density of
/// `theta` and `I` the information gathered (Laplace's approximation). A crossing needs `theta² I / 2`
/// of about 8 nats, so `sqrt(I)` is about `4 / theta` and the price is `ln(1.6 / (theta w(theta)))`.
/// The earlier mixture (every second grid point up to 16x: `w` uniform) paid most for the small
/// effects a policy most wants caught: 2.6 nats at 1.5x over a 1.1 null, 2.0 at 2x, 0.9 at 6x. A
/// log-uniform prior (`w ~ 1/theta`) pays 1.3 nats everywhere, which is measured to help 1.5x and 2x
/// but to slow 6x by an hour (6 h to 7 h); `theta^(-1/2)` sits between: 1.7, 1.4 and 0.8 nats
/// (`detection_cells -- 100 400`: median time to catch 2x on all nodes at 0.002 96 h -> 90 h, 1.5x
/// 365 h -> 320 h, 3x 23 h -> 21 h, 6x unchanged; BENCHMARKS.md). Effects beyond 7x are caught at
/// once by the top point; effects below 1.19x beyond the null are not worth failing a wave early for.
///
/// Validity is unchanged: every alternative lies above the tested ratio, so each component is a
/// non-negative supermartingale under `H0: R <= grid[i]` (monotone likelihood ratio), and the weights
/// sum to 1 (less, when the grid's top cuts some off), so the mixture is one too and Ville's
/// inequality bounds its chance of ever crossing `1/level` by `level`. The weights are fixed before
/// any data, so choosing them from the bench costs nothing in validity.
const FAIL_OFFSETS: [usize; 15] = [4, 5, 7, 9, 11, 14, 16, 19, 22, 25, 29, 32, 36, 41, 45];

/// One cell of one time bin: a stratum's updated nodes and its concurrent controls over the bin.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RateCell {
    /// Events on updated nodes (outside their post-reset window).
    pub updated_events: u64,
    /// Their exposure (GPU-hours or node-hours), finite and >= 0.
    pub updated_exposure: f64,
    /// Events on the concurrent controls (eligible, not yet updated, not in maintenance, quarantine,
    /// an RMA case or another rollout; during the soak, the holdback).
    pub control_events: u64,
    /// Their exposure, finite and >= 0.
    pub control_exposure: f64,
}

/// How a gate's evidence looks for delayed onsets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateEConfig {
    /// A fresh process starts every this many bins, so an effect that begins hours after the flash is
    /// not diluted by the quiet hours before it; 0 for none.
    pub restart_every_bins: u32,
    /// At most this many fresh processes (they share half the gate's budget equally, less the node
    /// look's share).
    pub max_restarts: u32,
    /// Share of the gate's false-rollback budget kept for the node-level look
    /// ([`super::NodeMixtureProcess`]), taken from the fresh processes' half; 0 when the caller runs no
    /// node-level look. At most 1/2.
    pub node_look_share: f64,
}

impl Default for RateEConfig {
    /// Hourly bins: a fresh look every 12 hours, for the first 4 days.
    fn default() -> Self {
        Self {
            restart_every_bins: 12,
            max_restarts: 8,
            node_look_share: 0.0,
        }
    }
}

impl RateEConfig {
    /// The default with a node-level look beside the pooled one: it gets a quarter of the gate's
    /// budget, the fresh processes the other quarter of their half.
    pub fn with_node_look() -> Self {
        Self {
            node_look_share: 0.25,
            ..Self::default()
        }
    }

    /// The node-level look's level at a gate's false-rollback share `alpha` (0 without one).
    pub fn node_look_level(&self, alpha: f64) -> f64 {
        alpha * self.node_look_share.clamp(0.0, 0.5)
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Snapshot {
    bin: u32,
    x1: f64,
    a: Vec<f64>,
}

/// A rate gate's evidence since the first wave started; see the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub struct RateEProcess {
    config: RateEConfig,
    ln_grid: Vec<f64>,
    grid: Vec<f64>,
    bins: u32,
    x1: f64,
    a: Vec<f64>,
    /// Start states of the fresh processes (the first is the empty state: the cumulative process).
    starts: Vec<Snapshot>,
    updated_events: u64,
    control_events: u64,
    updated_exposure: f64,
    control_exposure: f64,
    mh_num: f64,
    mh_den: f64,
}

/// What a gate's evidence says at one look.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLook {
    /// The anytime lower bound exceeds the null (`min_effect`, or 1): a regression that matters.
    pub fail: bool,
    /// Bin at which the process that failed started (0: the cumulative one; later: a delayed onset).
    pub failed_from_bin: Option<u32>,
    /// The anytime upper bound is below `must_detect`: the data rule out an effect that must be caught.
    pub pass_ready: bool,
}

impl RateEProcess {
    /// A process with no data yet.
    pub fn new(config: RateEConfig) -> Self {
        let ln_grid: Vec<f64> = (GRID_LOW..=GRID_HIGH)
            .map(|k| f64::from(k) / f64::from(STEPS_PER_DOUBLING) * std::f64::consts::LN_2)
            .collect();
        let grid: Vec<f64> = ln_grid.iter().map(|l| l.exp()).collect();
        let a = vec![0.0; grid.len()];
        Self {
            config,
            starts: vec![Snapshot {
                bin: 0,
                x1: 0.0,
                a: a.clone(),
            }],
            ln_grid,
            grid,
            bins: 0,
            x1: 0.0,
            a,
            updated_events: 0,
            control_events: 0,
            updated_exposure: 0.0,
            control_exposure: 0.0,
            mh_num: 0.0,
            mh_den: 0.0,
        }
    }

    /// Adds one time bin: one cell per stratum. A cell with no exposure on either side says nothing
    /// about the ratio (all its events are on one side by construction) and is skipped.
    pub fn observe_bin(&mut self, cells: &[RateCell]) -> Result<(), FleetError> {
        for cell in cells {
            for (what, v) in [
                ("updated exposure", cell.updated_exposure),
                ("control exposure", cell.control_exposure),
            ] {
                check(what, "finite and >= 0", v, v.is_finite() && v >= 0.0)?;
            }
        }
        for cell in cells {
            self.updated_events = self.updated_events.saturating_add(cell.updated_events);
            self.control_events = self.control_events.saturating_add(cell.control_events);
            self.updated_exposure += cell.updated_exposure;
            self.control_exposure += cell.control_exposure;
            if cell.updated_exposure <= 0.0 || cell.control_exposure <= 0.0 {
                continue;
            }
            let x1 = cell.updated_events as f64;
            let x0 = cell.control_events as f64;
            let n = x1 + x0;
            let total = cell.updated_exposure + cell.control_exposure;
            self.mh_num += x1 * cell.control_exposure / total;
            self.mh_den += x0 * cell.updated_exposure / total;
            if n == 0.0 {
                continue;
            }
            let e = cell.updated_exposure / cell.control_exposure;
            self.x1 += x1;
            for (a, r) in self.a.iter_mut().zip(&self.grid) {
                *a += n * (r * e).ln_1p();
            }
        }
        self.bins += 1;
        let every = self.config.restart_every_bins;
        if every > 0 && self.bins.is_multiple_of(every) && self.starts.len() <= self.config.max_restarts as usize {
            self.starts.push(Snapshot {
                bin: self.bins,
                x1: self.x1,
                a: self.a.clone(),
            });
        }
        Ok(())
    }

    /// Bins observed so far.
    pub fn bins(&self) -> u32 {
        self.bins
    }

    /// Events and exposure so far: `(updated events, updated exposure, control events, control exposure)`.
    pub fn totals(&self) -> (u64, f64, u64, f64) {
        (
            self.updated_events,
            self.updated_exposure,
            self.control_events,
            self.control_exposure,
        )
    }

    /// The Mantel-Haenszel estimate of the common ratio, `None` before the control saw an event.
    pub fn estimate(&self) -> Option<f64> {
        (self.mh_den > 0.0).then(|| self.mh_num / self.mh_den)
    }

    /// Budget share of each fresh process: the cumulative one gets half (all of it, less the node
    /// look's share, without restarts), the restarts split the other half less the node look's share.
    /// With the node look's share the shares add up to at most 1, so the gate's budget holds.
    fn weight(&self, index: usize) -> f64 {
        let node = self.config.node_look_share.clamp(0.0, 0.5);
        if self.config.restart_every_bins == 0 || self.config.max_restarts == 0 {
            1.0 - node
        } else if index == 0 {
            0.5
        } else {
            (0.5 - node) / f64::from(self.config.max_restarts)
        }
    }

    /// `ln` of the mixture likelihood ratio against `H0: ratio <= grid[i]` (`upward`) or
    /// `H0: ratio >= grid[i]` (downward), for the data since `start`, tempered by `dispersion`.
    fn ln_mixture(&self, start: &Snapshot, i: usize, upward: bool, dispersion: f64) -> f64 {
        let x1 = self.x1 - start.x1;
        let a = |j: usize| self.a[j] - start.a[j];
        let ll = |j: usize| (x1 * (self.ln_grid[j] - self.ln_grid[i]) + a(i) - a(j)) / dispersion;
        // Alternatives beyond the grid's ends are dropped with their weight: the rest weigh less than
        // 1, which keeps the mixture a supermartingale (and only makes it more cautious).
        if upward {
            let terms: Vec<f64> = FAIL_OFFSETS
                .iter()
                .map(|d| i + d)
                .take_while(|&j| j < self.grid.len())
                .map(ll)
                .collect();
            log_sum_exp(&terms) - (FAIL_OFFSETS.len() as f64).ln()
        } else {
            let terms: Vec<f64> = (1..=MIX_POINTS)
                .map_while(|step| i.checked_sub(step * MIX_STRIDE))
                .map(ll)
                .collect();
            log_sum_exp(&terms) - (MIX_POINTS as f64).ln()
        }
    }

    fn rejects(&self, i: usize, upward: bool, level: f64, dispersion: f64, start: usize) -> bool {
        // Only Fail is shared with the fresh processes; Pass uses the cumulative process alone and so
        // its whole level.
        let weight = if upward { self.weight(start) } else { 1.0 };
        let threshold = (1.0 / (level * weight)).ln();
        self.ln_mixture(&self.starts[start], i, upward, dispersion) >= threshold
    }

    /// Whether the process started at `start` rejects every grid ratio at or below index `top`.
    fn rejects_all_below(&self, top: usize, alpha: f64, dispersion: f64, start: usize) -> bool {
        (0..=top).rev().all(|i| self.rejects(i, true, alpha, dispersion, start))
    }

    /// Whether the cumulative process rejects every grid ratio at or above index `bottom`.
    fn rejects_all_above(&self, bottom: usize, beta: f64, dispersion: f64) -> bool {
        (bottom..self.grid.len()).all(|i| self.rejects(i, false, beta, dispersion, 0))
    }

    /// The decision-relevant facts at one look.
    ///
    /// - `null` is the ratio a Fail must exceed (`min_effect`, or 1 for "any increase");
    /// - `must_detect` is the ratio a Pass must rule out;
    /// - `alpha` and `beta` are this gate's shares of the rollout's false-rollback and false-pass
    ///   budgets; `dispersion` the quasi-Poisson factor (>= 1) from [`super::quasi_poisson_dispersion`].
    ///
    /// Fail is "the lower confidence-sequence bound exceeds `null`", checked on the grid as "every
    /// grid ratio up to the first one above `null` is rejected", so whatever the true ratio `R <= null`
    /// is, the first grid point at or above it was rejected while true: probability at most alpha, at
    /// any look. Pass is the mirror image with beta and only the cumulative process (a delayed onset is
    /// a reason to fail, never to pass).
    pub fn look(
        &self,
        null: f64,
        must_detect: f64,
        alpha: f64,
        beta: f64,
        dispersion: f64,
    ) -> Result<RateLook, FleetError> {
        check("null ratio", "finite and > 0", null, null.is_finite() && null > 0.0)?;
        check(
            "must_detect",
            "finite and > the null ratio",
            must_detect,
            must_detect.is_finite() && must_detect > null,
        )?;
        check("alpha", "in (0, 1)", alpha, alpha > 0.0 && alpha < 1.0)?;
        check("beta", "in (0, 1)", beta, beta > 0.0 && beta < 1.0)?;
        check(
            "dispersion",
            "finite and >= 1",
            dispersion,
            dispersion.is_finite() && dispersion >= 1.0,
        )?;
        let mut look = RateLook {
            fail: false,
            failed_from_bin: None,
            pass_ready: false,
        };
        // First grid point strictly above the null: rejecting it and everything below is "L > null".
        if let Some(top) = self.grid.iter().position(|&r| r > null) {
            for start in 0..self.starts.len() {
                if self.rejects_all_below(top, alpha, dispersion, start) {
                    look.fail = true;
                    look.failed_from_bin = Some(self.starts[start].bin);
                    break;
                }
            }
        }
        // Last grid point strictly below must_detect: rejecting it and everything above is "U < must_detect".
        if let Some(bottom) = self.grid.iter().rposition(|&r| r < must_detect) {
            look.pass_ready = self.rejects_all_above(bottom, beta, dispersion);
        }
        Ok(look)
    }

    /// The cumulative process's confidence-sequence bounds, rounded outward to the grid:
    /// `(lower at alpha, upper at beta)`. The lower bound is 0 when nothing is ruled out below, the upper
    /// `f64::INFINITY` when nothing is ruled out above the grid's top (64x).
    pub fn bounds(&self, alpha: f64, beta: f64, dispersion: f64) -> (f64, f64) {
        let d = dispersion.max(1.0);
        let n = self.grid.len();
        let lower = (0..n)
            .take_while(|&i| self.rejects(i, true, alpha, d, 0))
            .last()
            .map_or(0.0, |i| self.grid[i]);
        let upper = (0..n)
            .rev()
            .take_while(|&i| self.rejects(i, false, beta, d, 0))
            .last()
            .map_or(f64::INFINITY, |i| self.grid[i]);
        (lower, upper)
    }
}

pub(super) fn log_sum_exp(terms: &[f64]) -> f64 {
    let max = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !max.is_finite() {
        return max;
    }
    max + terms.iter().map(|t| (t - max).exp()).sum::<f64>().ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bin(updated: (u64, f64), control: (u64, f64)) -> Vec<RateCell> {
        vec![RateCell {
            updated_events: updated.0,
            updated_exposure: updated.1,
            control_events: control.0,
            control_exposure: control.1,
        }]
    }

    #[test]
    fn strong_rise_fails_and_no_data_neither_fails_nor_passes() {
        let mut p = RateEProcess::new(RateEConfig::default());
        let empty = p.look(1.25, 2.0, 0.01, 0.05, 1.0).unwrap();
        assert!(!empty.fail && !empty.pass_ready);
        for _ in 0..10 {
            // Updated 10% of exposure but 40% of the events: a 6x ratio.
            p.observe_bin(&bin((8, 100.0), (12, 900.0))).unwrap();
        }
        let look = p.look(1.25, 2.0, 0.01, 0.05, 1.0).unwrap();
        assert!(look.fail);
        assert_eq!(look.failed_from_bin, Some(0));
        assert!(!look.pass_ready);
        let (lower, upper) = p.bounds(0.01, 0.05, 1.0);
        assert!(lower > 3.0 && upper > 6.0 && upper < 12.0, "{lower} {upper}");
    }

    #[test]
    fn dispersion_tempers_the_evidence() {
        let mut p = RateEProcess::new(RateEConfig::default());
        // 3x: 50 of 200 events on 10% of the exposure.
        for _ in 0..10 {
            p.observe_bin(&bin((5, 100.0), (15, 900.0))).unwrap();
        }
        assert!(p.look(1.0, 2.0, 0.01, 0.05, 1.0).unwrap().fail);
        assert!(!p.look(1.0, 2.0, 0.01, 0.05, 4.0).unwrap().fail);
    }

    #[test]
    fn invalid_input_is_an_error_not_a_panic() {
        let mut p = RateEProcess::new(RateEConfig::default());
        assert!(p.observe_bin(&bin((1, f64::NAN), (1, 1.0))).is_err());
        assert!(p.observe_bin(&bin((1, -1.0), (1, 1.0))).is_err());
        assert!(p.look(1.5, 1.2, 0.01, 0.05, 1.0).is_err());
        assert!(p.look(1.0, 2.0, 0.0, 0.05, 1.0).is_err());
        assert!(p.look(1.0, 2.0, 0.01, 0.05, 0.5).is_err());
        assert_eq!(p.bins(), 0);
    }

    #[test]
    fn delayed_onset_is_caught_by_a_fresh_process() {
        let config = RateEConfig {
            restart_every_bins: 12,
            max_restarts: 8,
            node_look_share: 0.0,
        };
        let mut p = RateEProcess::new(config);
        // 48 quiet hours with many events at ratio 1, then a 3x rise.
        for _ in 0..48 {
            p.observe_bin(&bin((10, 1000.0), (10, 1000.0))).unwrap();
        }
        let mut failed = None;
        for hour in 0..48 {
            p.observe_bin(&bin((30, 1000.0), (10, 1000.0))).unwrap();
            let look = p.look(1.0, 2.0, 0.01, 0.05, 1.0).unwrap();
            if look.fail {
                failed = Some((hour, look.failed_from_bin));
                break;
            }
        }
        let (hour, from) = failed.expect("a 3x rise after 48 h is caught");
        assert!(
            from.unwrap() >= 36,
            "a fresh process caught it, not the diluted cumulative one: {from:?}"
        );
        assert!(hour < 12, "{hour}");
    }
}
