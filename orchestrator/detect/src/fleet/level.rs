//! A level gate's evidence over the whole rollout: one value per updated node, with a normal-mixture
//! confidence sequence for the mean shift.
//!
//! The unit is the node, not the GPU or the reading: a node's GPUs share its cooling and power, so
//! readings cluster by node, and treating them as independent would make the test far too eager. Each
//! updated node contributes once, when its measurement window (after the post-reset exclusion) is
//! complete: the difference between its mean and the mean of its concurrent controls over the same
//! window, so a hot day moves both and cancels. The variance of that difference is estimated from the
//! controls' own spread over the window (plug-in; the control has hundreds of nodes).
//!
//! With `S` the sum of the `n` differences minus `n` times the null shift and `V = n sigma^2`, the
//! normal-mixture martingale `sqrt(rho / (V + rho)) exp(S^2 / (2 (V + rho)))` crosses `1/alpha` with
//! probability at most alpha under the null at any number of looks (Robbins 1970; Howard et al. 2021,
//! eq. 14): the boundary is `|S| >= sqrt((V + rho) (ln((V + rho)/rho) + 2 ln(1/alpha)))`. `rho` is
//! tuned so the boundary is tightest near the canary's size.

use super::{FleetError, check};

/// The mixture's scale, as a share of the variance at which the boundary should be tightest, that
/// minimises the boundary there in units of the sd: `r` minimising `(1 + r) (ln((1 + r) / r) + 2 ln(1/level))`.
///
/// Why not `rho = V` (r = 1): the boundary in sd units, `sqrt((1 + rho/V) (ln(1 + V/rho) + 2 ln(1/alpha)))`,
/// is lowest where `V` is about `2 ln(1/alpha)` times `rho`, not at `V = rho`; at alpha 0.005 it is
/// 3.8 sd there against 4.75 sd at `V = rho` (the information a shift needs falls by about 1.6x). The
/// scale depends only on the level, fixed before any data, so the guarantee is unchanged.
fn mixture_scale(level: f64) -> f64 {
    let cost = |r: f64| (1.0 + r) * (((1.0 + r) / r).ln() + 2.0 * (1.0 / level).ln());
    (-80..=16)
        .map(|k| 2f64.powf(f64::from(k) / 8.0))
        .min_by(|a, b| cost(*a).total_cmp(&cost(*b)))
        .unwrap_or(1.0)
}

/// Tuning of a level gate's confidence sequence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LevelEConfig {
    /// Number of nodes at which the boundary is tightest (the canary's size is a good choice).
    pub tight_at_nodes: f64,
}

impl Default for LevelEConfig {
    fn default() -> Self {
        Self { tight_at_nodes: 32.0 }
    }
}

/// A level gate's evidence since the first wave started.
#[derive(Debug, Clone, PartialEq)]
pub struct LevelEProcess {
    config: LevelEConfig,
    nodes: u64,
    sum: f64,
    /// Variance of `sum` (the mixture's intrinsic time).
    variance: f64,
    /// The mixture's scale, fixed at the first batch (a predictable choice keeps the guarantee).
    rho: Option<f64>,
}

/// What a level gate's evidence says at one look.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LevelLook {
    /// The anytime lower bound of the shift exceeds the null shift.
    pub fail: bool,
    /// The anytime upper bound is below `must_detect`.
    pub pass_ready: bool,
    /// Lower bound at alpha (harmful direction positive); `-inf` before any node.
    pub lower: f64,
    /// Upper bound at beta; `+inf` before any node.
    pub upper: f64,
    /// Mean shift so far, `None` before any node.
    pub estimate: Option<f64>,
}

impl LevelEProcess {
    /// A process with no data yet.
    pub fn new(config: LevelEConfig) -> Self {
        Self {
            config,
            nodes: 0,
            sum: 0.0,
            variance: 0.0,
            rho: None,
        }
    }

    /// Adds a batch of updated nodes whose measurement windows ended together: each one's difference
    /// from the mean of the same `control_nodes` controls over the same window (harmful direction
    /// positive: negate lower-is-worse metrics first). `node_sd` is the sd of one node's value over
    /// the window, estimated from the controls' spread.
    ///
    /// Why a batch: the nodes share one control mean, whose error does not shrink with the batch's
    /// size; the batch's variance `n sd^2 + n^2 sd^2 / control_nodes` counts it, so a large last wave
    /// against a small holdback is not taken for more evidence than it is.
    pub fn observe_batch(&mut self, differences: &[f64], node_sd: f64, control_nodes: usize) -> Result<(), FleetError> {
        check(
            "node sd",
            "finite and > 0",
            node_sd,
            node_sd.is_finite() && node_sd > 0.0,
        )?;
        check("control nodes", ">= 2", control_nodes as f64, control_nodes >= 2)?;
        for &d in differences {
            check(
                "level difference",
                "finite with magnitude <= 1e12",
                d,
                d.is_finite() && d.abs() <= 1e12,
            )?;
        }
        if differences.is_empty() {
            return Ok(());
        }
        let n = differences.len() as f64;
        let var = node_sd * node_sd;
        self.nodes += differences.len() as u64;
        self.sum += differences.iter().sum::<f64>();
        self.variance += n * var + n * n * var / control_nodes as f64;
        self.rho.get_or_insert(self.config.tight_at_nodes.max(1.0) * var);
        Ok(())
    }

    /// Nodes observed so far.
    pub fn nodes(&self) -> u64 {
        self.nodes
    }

    /// Bounds and decisions at one look.
    pub fn look(&self, null_shift: f64, must_detect: f64, alpha: f64, beta: f64) -> Result<LevelLook, FleetError> {
        check(
            "null shift",
            "finite and >= 0",
            null_shift,
            null_shift.is_finite() && null_shift >= 0.0,
        )?;
        check(
            "must_detect",
            "finite and > the null shift",
            must_detect,
            must_detect.is_finite() && must_detect > null_shift,
        )?;
        check("alpha", "in (0, 1)", alpha, alpha > 0.0 && alpha < 1.0)?;
        check("beta", "in (0, 1)", beta, beta > 0.0 && beta < 1.0)?;
        let Some(rho) = self.rho.filter(|_| self.nodes > 0) else {
            return Ok(LevelLook {
                fail: false,
                pass_ready: false,
                lower: f64::NEG_INFINITY,
                upper: f64::INFINITY,
                estimate: None,
            });
        };
        let n = self.nodes as f64;
        let v = self.variance;
        let boundary = |level: f64| {
            let rho = rho * mixture_scale(level);
            ((v + rho) * (((v + rho) / rho).ln() + 2.0 * (1.0 / level).ln())).sqrt() / n
        };
        let mean = self.sum / n;
        let lower = mean - boundary(alpha);
        let upper = mean + boundary(beta);
        Ok(LevelLook {
            fail: lower > null_shift,
            pass_ready: upper < must_detect,
            lower,
            upper,
            estimate: Some(mean),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alternating(n: usize, centre: f64, spread: f64) -> Vec<f64> {
        (0..n)
            .map(|i| centre + if i % 2 == 0 { spread } else { -spread })
            .collect()
    }

    #[test]
    fn clear_shift_fails_small_noise_passes_and_few_nodes_decide_nothing() {
        let mut hot = LevelEProcess::new(LevelEConfig::default());
        hot.observe_batch(&alternating(32, 3.0, 0.5), 1.0, 900).unwrap();
        let look = hot.look(0.0, 2.0, 0.01, 0.05).unwrap();
        assert!(look.fail && !look.pass_ready, "{look:?}");

        let mut calm = LevelEProcess::new(LevelEConfig::default());
        calm.observe_batch(&alternating(64, 0.0, 0.3), 1.0, 900).unwrap();
        let look = calm.look(0.0, 2.0, 0.01, 0.05).unwrap();
        assert!(!look.fail && look.pass_ready, "{look:?}");

        let mut few = LevelEProcess::new(LevelEConfig::default());
        few.observe_batch(&[1.0], 1.0, 900).unwrap();
        let look = few.look(0.0, 2.0, 0.01, 0.05).unwrap();
        assert!(!look.fail && !look.pass_ready, "{look:?}");
        assert!(few.observe_batch(&[f64::INFINITY], 1.0, 900).is_err());
        assert!(few.observe_batch(&[1.0], 0.0, 900).is_err());
        assert!(few.look(0.0, 0.0, 0.01, 0.05).is_err());
    }

    #[test]
    fn the_mixture_scale_lowers_the_boundary_where_the_evidence_is() {
        let boundary_sd = |r: f64, level: f64| ((1.0 + r) * (((1.0 + r) / r).ln() + 2.0 * (1.0 / level).ln())).sqrt();
        let r = mixture_scale(0.005);
        assert!((0.05..0.15).contains(&r), "{r}");
        assert!((boundary_sd(1.0, 0.005) - 4.75).abs() < 0.01);
        assert!(boundary_sd(r, 0.005) < 3.8, "{}", boundary_sd(r, 0.005));
        // A laxer level spends less of the evidence on the boundary, so its scale is larger.
        assert!(mixture_scale(0.05) > r);
    }

    #[test]
    fn a_shared_small_control_limits_what_a_large_batch_proves() {
        // 800 nodes 0.3 above a 50-node holdback: the holdback's mean alone is uncertain by
        // 1/sqrt(50) = 0.14 node sd, so a 0.3 shift is not proven beyond 0.1 ...
        let mut against_holdback = LevelEProcess::new(LevelEConfig::default());
        against_holdback
            .observe_batch(&alternating(800, 0.3, 1.0), 1.0, 50)
            .unwrap();
        assert!(!against_holdback.look(0.1, 2.0, 0.01, 0.05).unwrap().fail);
        // ... while against 5,000 controls it is.
        let mut against_fleet = LevelEProcess::new(LevelEConfig::default());
        against_fleet
            .observe_batch(&alternating(800, 0.3, 1.0), 1.0, 5000)
            .unwrap();
        assert!(against_fleet.look(0.1, 2.0, 0.01, 0.05).unwrap().fail);
    }
}
