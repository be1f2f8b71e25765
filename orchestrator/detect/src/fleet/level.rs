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

    /// Adds a [`LevelBatch`].
    pub fn observe(&mut self, batch: &LevelBatch) -> Result<(), FleetError> {
        self.observe_batch(&batch.differences, batch.sd, batch.controls)
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

/// One node's level relative to the mean of its concurrent controls, hour by hour, averaged: over its
/// watched hours of the wave being judged (`post`), and over the hours it was watched as a control
/// before that wave (`pre`, `None` when it never was: the canary, or a node that was not eligible).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeLevel {
    pub post: f64,
    pub pre: Option<f64>,
}

/// A wave's nodes ready for [`LevelEProcess::observe_batch`].
#[derive(Debug, Clone, PartialEq)]
pub struct LevelBatch {
    pub differences: Vec<f64>,
    pub sd: f64,
    pub controls: usize,
}

/// Controls with a pre-period needed to estimate the adjustment's coefficient.
const MIN_PRE_PERIOD_CONTROLS: usize = 3;

/// The sd floor: a perfectly flat control (a simulator's constant sensor) still has measurement error.
const MIN_NODE_SD: f64 = 1e-3;

/// CUPED's coefficient (Deng, Xu, Kohavi & Walker 2013) over the controls' `(post, pre)` values: the
/// regression slope of the wave's level on the pre-period level, clamped to [0, 1]. It is the share of
/// a node's pre-period difference that persists: near 1 when nodes differ persistently (a hot rack
/// position, a fan curve) and the pre-period is long, near 0 when the differences are noise, so the
/// adjusted value is never noisier than the unadjusted one by more than the estimate's own error.
/// `None` with too few controls or a flat pre-period.
pub fn pre_period_coefficient(controls: &[(f64, f64)]) -> Option<f64> {
    if controls.len() < MIN_PRE_PERIOD_CONTROLS {
        return None;
    }
    let n = controls.len() as f64;
    let (post_sum, pre_sum) = controls
        .iter()
        .fold((0.0, 0.0), |(a, b), (post, pre)| (a + post, b + pre));
    let (post_mean, pre_mean) = (post_sum / n, pre_sum / n);
    let (cov, var) = controls.iter().fold((0.0, 0.0), |(cov, var), (post, pre)| {
        (
            cov + (post - post_mean) * (pre - pre_mean),
            var + (pre - pre_mean) * (pre - pre_mean),
        )
    });
    (var > 0.0 && cov.is_finite()).then(|| (cov / var).clamp(0.0, 1.0))
}

fn sample_sd(values: &[f64]) -> f64 {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    var.sqrt().max(MIN_NODE_SD)
}

/// A wave's level batches: the updated nodes with a pre-period, adjusted by it (CUPED, the coefficient
/// and the sd estimated from the controls' own values of the same statistic, each value taken from
/// the controls' mean of it), and the updated nodes without one, unadjusted as before. Either is left
/// out when it has no node, or fewer than 2 controls to measure its sd.
///
/// Why a pre-period: a node's level differs from the fleet's persistently (its position in the rack,
/// its fans, its GPUs' bins; 2-3 °C between nodes against about 1 °C of hour-to-hour noise), and an
/// unadjusted comparison carries that spread into every node's value. A node of a later wave was
/// watched as a control during the earlier waves' bakes, so the engine already holds its pre-period;
/// subtracting it leaves mostly the hour-to-hour noise, several times less variance. Why from the
/// controls only: under no regression the updated nodes are exchangeable with the controls, so a
/// coefficient and a centre taken from the controls keep the comparison's null; the batch's variance
/// counts the controls' mean as shared error as before.
pub fn level_batches_with_pre_period(updated: &[NodeLevel], controls: &[NodeLevel]) -> Vec<LevelBatch> {
    let paired: Vec<(f64, f64)> = controls.iter().filter_map(|c| Some((c.post, c.pre?))).collect();
    let theta = pre_period_coefficient(&paired).filter(|_| updated.iter().any(|u| u.pre.is_some()));
    let mut batches = Vec::new();
    let plain: Vec<f64> = updated
        .iter()
        .filter(|u| theta.is_none() || u.pre.is_none())
        .map(|u| u.post)
        .collect();
    if let Some(theta) = theta {
        let adjusted_controls: Vec<f64> = paired.iter().map(|(post, pre)| post - theta * pre).collect();
        let centre = adjusted_controls.iter().sum::<f64>() / adjusted_controls.len() as f64;
        let differences: Vec<f64> = updated
            .iter()
            .filter_map(|u| Some(u.post - theta * u.pre? - centre))
            .collect();
        batches.push(LevelBatch {
            differences,
            sd: sample_sd(&adjusted_controls),
            controls: adjusted_controls.len(),
        });
    }
    let control_posts: Vec<f64> = controls.iter().map(|c| c.post).collect();
    if !plain.is_empty() && control_posts.len() >= 2 {
        batches.push(LevelBatch {
            differences: plain,
            sd: sample_sd(&control_posts),
            controls: control_posts.len(),
        });
    }
    batches
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

    /// Nodes whose levels differ persistently by `offset_sd` around the fleet, read with `noise_sd`
    /// in the pre-period and in the wave, `shift` added to the wave's reading.
    fn nodes(rng: &mut rand_chacha::ChaCha8Rng, n: usize, offset_sd: f64, noise_sd: f64, shift: f64) -> Vec<NodeLevel> {
        use crate::fleet::draw::normal;
        (0..n)
            .map(|_| {
                let offset = offset_sd * normal(rng);
                NodeLevel {
                    post: offset + shift + noise_sd * normal(rng),
                    pre: Some(offset + noise_sd * normal(rng)),
                }
            })
            .collect()
    }

    #[test]
    fn a_pre_period_removes_persistent_node_offsets() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let controls = nodes(&mut rng, 400, 2.5, 0.3, 0.0);
        let updated = nodes(&mut rng, 32, 2.5, 0.3, 1.0);
        let batches = level_batches_with_pre_period(&updated, &controls);
        assert_eq!(batches.len(), 1, "{batches:?}");
        let adjusted = &batches[0];
        assert_eq!((adjusted.differences.len(), adjusted.controls), (32, 400));
        // The offsets' 2.5 are gone: what is left is the two readings' noise, 0.3 * sqrt(2).
        assert!((0.3..0.55).contains(&adjusted.sd), "{}", adjusted.sd);
        let mean = adjusted.differences.iter().sum::<f64>() / 32.0;
        assert!((mean - 1.0).abs() < 0.25, "{mean}");
        let mut process = LevelEProcess::new(LevelEConfig::default());
        process.observe(adjusted).unwrap();
        assert!(process.look(0.5, 2.0, 0.005, 0.0125).unwrap().fail);
        // Without the pre-period the same nodes prove nothing against the +0.5 null.
        let unadjusted: Vec<NodeLevel> = updated.iter().map(|u| NodeLevel { pre: None, ..*u }).collect();
        let plain = level_batches_with_pre_period(&unadjusted, &controls);
        assert_eq!(plain.len(), 1);
        assert!(plain[0].sd > 2.0, "{}", plain[0].sd);
        let mut process = LevelEProcess::new(LevelEConfig::default());
        process.observe(&plain[0]).unwrap();
        assert!(!process.look(0.5, 2.0, 0.005, 0.0125).unwrap().fail);
    }

    #[test]
    fn a_pre_period_of_pure_noise_is_given_no_weight() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        // No persistent offsets: the pre-period says nothing about the wave, and subtracting it
        // whole would double the variance.
        let controls = nodes(&mut rng, 2000, 0.0, 1.0, 0.0);
        let pairs: Vec<(f64, f64)> = controls.iter().map(|c| (c.post, c.pre.unwrap())).collect();
        let theta = pre_period_coefficient(&pairs).unwrap();
        assert!(theta < 0.1, "{theta}");
        let persistent = nodes(&mut rng, 2000, 2.5, 0.5, 0.0);
        let pairs: Vec<(f64, f64)> = persistent.iter().map(|c| (c.post, c.pre.unwrap())).collect();
        assert!(pre_period_coefficient(&pairs).unwrap() > 0.9);
        assert_eq!(pre_period_coefficient(&pairs[..2]), None);
        assert_eq!(pre_period_coefficient(&[(1.0, 3.0); 10]), None);
    }

    #[test]
    fn nodes_without_a_pre_period_are_judged_unadjusted_beside_the_rest() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let controls = nodes(&mut rng, 100, 2.5, 0.3, 0.0);
        let mut updated = nodes(&mut rng, 10, 2.5, 0.3, 0.0);
        updated[0].pre = None;
        updated[1].pre = None;
        let batches = level_batches_with_pre_period(&updated, &controls);
        let sizes: Vec<usize> = batches.iter().map(|b| b.differences.len()).collect();
        assert_eq!(sizes, vec![8, 2]);
        assert_eq!(batches[1].differences, vec![updated[0].post, updated[1].post]);
        // Controls without a pre-period: everything is unadjusted.
        let bare: Vec<NodeLevel> = controls.iter().map(|c| NodeLevel { pre: None, ..*c }).collect();
        let batches = level_batches_with_pre_period(&updated, &bare);
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].differences.len(), 10);
        // Nothing to compare with: no batch.
        assert!(level_batches_with_pre_period(&updated, &bare[..1]).is_empty());
    }
}
