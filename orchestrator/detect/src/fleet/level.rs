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
        }
    }

    /// Adds one updated node's concurrent difference from the control (harmful direction positive:
    /// negate lower-is-worse metrics first).
    pub fn observe_node(&mut self, difference: f64) -> Result<(), FleetError> {
        check(
            "level difference",
            "finite with magnitude <= 1e12",
            difference,
            difference.is_finite() && difference.abs() <= 1e12,
        )?;
        self.nodes += 1;
        self.sum += difference;
        Ok(())
    }

    /// Nodes observed so far.
    pub fn nodes(&self) -> u64 {
        self.nodes
    }

    /// Bounds and decisions at one look. `sigma` is the sd of one node's difference (from the control).
    pub fn look(
        &self,
        null_shift: f64,
        must_detect: f64,
        alpha: f64,
        beta: f64,
        sigma: f64,
    ) -> Result<LevelLook, FleetError> {
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
        check("sigma", "finite and > 0", sigma, sigma.is_finite() && sigma > 0.0)?;
        if self.nodes == 0 {
            return Ok(LevelLook {
                fail: false,
                pass_ready: false,
                lower: f64::NEG_INFINITY,
                upper: f64::INFINITY,
                estimate: None,
            });
        }
        let n = self.nodes as f64;
        let v = n * sigma * sigma;
        let rho = self.config.tight_at_nodes.max(1.0) * sigma * sigma;
        let boundary = |level: f64| ((v + rho) * (((v + rho) / rho).ln() + 2.0 * (1.0 / level).ln())).sqrt() / n;
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

    #[test]
    fn clear_shift_fails_small_noise_passes_and_few_nodes_decide_nothing() {
        let mut hot = LevelEProcess::new(LevelEConfig::default());
        for i in 0..32 {
            hot.observe_node(3.0 + if i % 2 == 0 { 0.5 } else { -0.5 }).unwrap();
        }
        let look = hot.look(0.0, 2.0, 0.01, 0.05, 1.0).unwrap();
        assert!(look.fail && !look.pass_ready, "{look:?}");

        let mut calm = LevelEProcess::new(LevelEConfig::default());
        for i in 0..64 {
            calm.observe_node(if i % 2 == 0 { 0.3 } else { -0.3 }).unwrap();
        }
        let look = calm.look(0.0, 2.0, 0.01, 0.05, 1.0).unwrap();
        assert!(!look.fail && look.pass_ready, "{look:?}");

        let mut few = LevelEProcess::new(LevelEConfig::default());
        few.observe_node(1.0).unwrap();
        let look = few.look(0.0, 2.0, 0.01, 0.05, 1.0).unwrap();
        assert!(!look.fail && !look.pass_ready, "{look:?}");
        assert!(few.observe_node(f64::INFINITY).is_err());
        assert!(few.look(0.0, 2.0, 0.01, 0.05, 0.0).is_err());
    }
}
