//! A rate gate's node-level look: evidence that the release made *some* updated nodes worse, which a
//! pooled ratio dilutes (issue 22: "an effect confined to some nodes").
//!
//! The pooled process ([`super::RateEProcess`]) estimates the exposure-weighted average ratio, so a
//! release that triples the rate on a quarter of the nodes looks like 1.5x, and a 32-node canary that
//! drew few affected nodes looks healthier still. Here each updated node keeps its own count `X` and
//! its expected count `mu` under the null, and the alternative is a mixture: a share `pi` of the
//! updated nodes runs `rho` times the null rate, the rest at the null. For one node the likelihood
//! ratio is `(1 - pi) + pi LR(rho; X, mu)`; the product over nodes, averaged over a fixed grid of
//! `(pi, rho)`, is the evidence. Ville's inequality bounds the chance it ever crosses `1/alpha` by
//! alpha, at any look.
//!
//! Why the null is "no node worse than `min_effect`" and nodes are compared with the control's
//! distribution, not with Poisson: nodes differ (a few hot nodes log more XIDs on either side), and a
//! Poisson null would take that spread for a concentrated effect. Each node's rate is therefore a
//! gamma-distributed draw (negative binomial counts), with the spread `h = var / mean²` of node rates
//! estimated from the control ([`node_heterogeneity`]) and floored at [`MIN_HETEROGENEITY`]; the node's
//! likelihood ratio is the negative-binomial one, `rho^X ((k + mu) / (k + rho mu))^(k + X)` with
//! `k = 1/h`. Assuming more spread than there is only makes the look more cautious (its expectation
//! under a Poisson node is below 1).
//!
//! Why `mu` is conditional on each cell's total: given that `n` events happened in a cell (one hour of
//! one stratum), a node's expected share under the null is `n R0 e_i / (R0 E_updated + E_control)`. The
//! control's rate cancels as in the pooled process, so a fleet-wide confounder is not a regression, and
//! a cell without control events needs no rate estimate.

use super::{FleetError, RateCell, check};

/// The least node-rate spread assumed (`var / mean²` of node rates). XID episode rates of otherwise
/// alike nodes are not exactly equal; 0.05 covers, e.g., 5% of nodes at twice the rate of the rest, and
/// costs the look little: it only matters once a node's expected count approaches `1/h` = 20.
pub const MIN_HETEROGENEITY: f64 = 0.05;

/// Shares of affected nodes in the mixture.
const SHARES: [f64; 3] = [0.125, 0.25, 0.5];
/// Affected nodes' rate as a multiple of the null rate. Below 2x a node's excess is hard to tell from
/// its noise in the counts a canary gathers; a uniform effect of that size is the pooled process's job.
const MULTIPLES: [f64; 5] = [2.0, 3.0, 4.5, 7.0, 11.0];

/// One updated node's events and exposure in one cell.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeObservation {
    /// The node, stable over the rollout (an index or an id).
    pub node: u32,
    /// Its events in the cell (outside its post-reset window).
    pub events: u64,
    /// Its exposure in the cell, finite and >= 0.
    pub exposure: f64,
}

/// One stratum's updated nodes and its concurrent controls over one time bin.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeCell {
    /// The updated nodes of the stratum that were watched in the bin.
    pub updated: Vec<NodeObservation>,
    /// Events on the concurrent controls.
    pub control_events: u64,
    /// The controls' exposure, finite and >= 0.
    pub control_exposure: f64,
}

/// The node-level evidence of one rate gate since the first wave started.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeMixtureProcess {
    null: f64,
    /// Dense index of each node seen, into `nodes`.
    index: std::collections::HashMap<u32, usize>,
    /// Per node: `(X, mu)`.
    nodes: Vec<(f64, f64)>,
    /// Whether the last bin had an event on an updated node.
    rose: bool,
}

impl NodeMixtureProcess {
    /// A process with no data, for a gate whose Fail null is `null` (`min_effect`, or 1).
    pub fn new(null: f64) -> Result<Self, FleetError> {
        check("null ratio", "finite and > 0", null, null.is_finite() && null > 0.0)?;
        Ok(Self {
            null,
            index: std::collections::HashMap::new(),
            nodes: Vec::new(),
            rose: false,
        })
    }

    /// Adds one time bin, one cell per stratum. A cell with no exposure on either side is skipped.
    pub fn observe_bin(&mut self, cells: &[NodeCell]) -> Result<(), FleetError> {
        for cell in cells {
            check(
                "control exposure",
                "finite and >= 0",
                cell.control_exposure,
                cell.control_exposure.is_finite() && cell.control_exposure >= 0.0,
            )?;
            for o in &cell.updated {
                check(
                    "updated exposure",
                    "finite and >= 0",
                    o.exposure,
                    o.exposure.is_finite() && o.exposure >= 0.0,
                )?;
            }
        }
        self.rose = false;
        for cell in cells {
            let totals = RateCell {
                updated_events: cell.updated.iter().fold(0u64, |n, o| n.saturating_add(o.events)),
                updated_exposure: cell.updated.iter().map(|o| o.exposure).sum(),
                control_events: cell.control_events,
                control_exposure: cell.control_exposure,
            };
            let Some(per_exposure) = self.null_per_exposure(&totals) else {
                continue;
            };
            for o in &cell.updated {
                self.add(*o, per_exposure);
                self.rose |= o.events > 0;
            }
        }
        Ok(())
    }

    /// Adds one updated node's part of one cell whose totals (every updated node of the cell, this
    /// one included, and its controls) are `cell`: the same evidence as that node's part of
    /// [`Self::observe_bin`], for a caller that holds each cell's totals and each node's counts apart
    /// rather than every bin's nodes (the engine's judge, whose per-node state then stays one pair of
    /// numbers per updated node). It does not feed [`Self::may_have_risen`], which is per bin.
    pub fn observe_node(&mut self, cell: &RateCell, node: NodeObservation) -> Result<(), FleetError> {
        for (what, v) in [
            ("updated exposure", node.exposure),
            ("cell updated exposure", cell.updated_exposure),
            ("control exposure", cell.control_exposure),
        ] {
            check(what, "finite and >= 0", v, v.is_finite() && v >= 0.0)?;
        }
        if let Some(per_exposure) = self.null_per_exposure(cell) {
            self.add(node, per_exposure);
        }
        Ok(())
    }

    /// A node's expected events per unit of its exposure in a cell with these totals, under the null
    /// and given the cell's total events; `None` when a side of the cell has no exposure (the cell
    /// says nothing about the ratio).
    fn null_per_exposure(&self, cell: &RateCell) -> Option<f64> {
        if cell.updated_exposure <= 0.0 || cell.control_exposure <= 0.0 {
            return None;
        }
        let total = cell.control_events as f64 + cell.updated_events as f64;
        Some(total * self.null / (self.null * cell.updated_exposure + cell.control_exposure))
    }

    fn add(&mut self, o: NodeObservation, per_exposure: f64) {
        let next = self.nodes.len();
        let index = *self.index.entry(o.node).or_insert(next);
        if index == next {
            self.nodes.push((0.0, 0.0));
        }
        let slot = &mut self.nodes[index];
        slot.0 += o.events as f64;
        slot.1 += per_exposure * o.exposure;
    }

    /// `ln` of the mixture likelihood ratio against "no updated node worse than the null", with node
    /// rates spread by `heterogeneity` (`var / mean²`; floored at [`MIN_HETEROGENEITY`]).
    pub fn ln_evidence(&self, heterogeneity: f64) -> f64 {
        let mut terms = Vec::with_capacity(SHARES.len() * MULTIPLES.len());
        for node_ll in self.node_lls(heterogeneity) {
            for &pi in &SHARES {
                let (stay, move_) = ((1.0 - pi).ln(), pi.ln());
                terms.push(node_ll.iter().map(|&ll| log_add(stay, move_ + ll)).sum::<f64>());
            }
        }
        super::rate::log_sum_exp(&terms) - (terms.len() as f64).ln()
    }

    /// Per multiple in [`MULTIPLES`], each node's negative-binomial log likelihood ratio, with node
    /// rates spread by `heterogeneity` (floored at [`MIN_HETEROGENEITY`]).
    fn node_lls(&self, heterogeneity: f64) -> impl Iterator<Item = Vec<f64>> + '_ {
        MULTIPLES
            .iter()
            .map(move |&rho| self.node_ll_at(heterogeneity, rho).collect())
    }

    /// Each node's negative-binomial log likelihood ratio at multiple `rho`.
    fn node_ll_at(&self, heterogeneity: f64, rho: f64) -> impl Iterator<Item = f64> + '_ {
        let h = if heterogeneity.is_finite() {
            heterogeneity.max(MIN_HETEROGENEITY)
        } else {
            MIN_HETEROGENEITY
        };
        let k = 1.0 / h;
        let ln_rho = rho.ln();
        self.nodes
            .iter()
            .filter(|(_, mu)| *mu > 0.0)
            .map(move |&(x, mu)| x * ln_rho + (k + x) * ((k + mu) / (k + rho * mu)).ln())
    }

    /// An upper bound of [`Self::ln_evidence`] at a third of its cost: `ln(1 - pi + pi LR) <= pi (LR -
    /// 1)`, so each alternative's log product is at most `pi (sum LR - n)`, one exponential per node and
    /// multiple instead of one exponential and one logarithm per node and alternative; the mixture's
    /// log-sum-exp only grows with its terms.
    fn ln_evidence_bound(&self, heterogeneity: f64) -> f64 {
        let mut terms = [0.0; SHARES.len() * MULTIPLES.len()];
        for (row, &rho) in terms.chunks_mut(SHARES.len()).zip(&MULTIPLES) {
            let excess = self
                .node_ll_at(heterogeneity, rho)
                .map(|ll| ll.exp() - 1.0)
                .sum::<f64>();
            for (term, &pi) in row.iter_mut().zip(&SHARES) {
                *term = pi * excess;
            }
        }
        super::rate::log_sum_exp(&terms) - (terms.len() as f64).ln()
    }

    /// Whether the evidence rejects the null at `level` (this look's share of the gate's alpha).
    ///
    /// Most looks are far from the boundary, so the exact evidence is computed only when its upper
    /// bound reaches it. The margin is far above the bound's rounding error (about 1e-12 here), so the
    /// shortcut never changes an answer. `policy power`'s forecast asks this at every simulated hour
    /// with an event: on the example GPU policy the command went from 9.6 s to 7.2 s of CPU (debug
    /// build), with the same output.
    pub fn fails(&self, level: f64, heterogeneity: f64) -> Result<bool, FleetError> {
        check("level", "in (0, 1)", level, level > 0.0 && level < 1.0)?;
        let threshold = (1.0 / level).ln();
        if self.ln_evidence_bound(heterogeneity) < threshold - 1e-6 {
            return Ok(false);
        }
        Ok(self.ln_evidence(heterogeneity) >= threshold)
    }

    /// Whether the last bin could have raised the evidence. Between an updated node's events every
    /// node's expected count grows and its likelihood ratio falls (for every alternative), so the
    /// evidence (at a given heterogeneity) can first cross a boundary only at a bin with such an event:
    /// a caller may skip the look at other bins. Skipping removes looks, never adds a rejection.
    pub fn may_have_risen(&self) -> bool {
        self.rose
    }

    /// Updated nodes seen so far.
    pub fn nodes(&self) -> usize {
        self.nodes.iter().filter(|(_, mu)| *mu > 0.0).count()
    }
}

/// `ln(e^a + e^b)`.
fn log_add(a: f64, b: f64) -> f64 {
    let (hi, lo) = if a >= b { (a, b) } else { (b, a) };
    hi + (lo - hi).exp().ln_1p()
}

/// The spread of node rates, `var / mean²`, from the control's node counts (one per node over the
/// same window): the moment estimator `sum((x - m)² - x) / sum(m²)`, with `m` each node's expected count
/// at its stratum's rate, floored at 0. `None` when there is nothing to estimate from (no events).
///
/// Poisson noise alone makes `(x - m)² - x` zero on average, so what remains is the nodes' own spread:
/// hot nodes, older parts, busier workloads. Strata are fitted apart, as in
/// [`super::quasi_poisson_dispersion`].
pub fn node_heterogeneity(nodes: &[super::NodeCount]) -> Option<f64> {
    let mut strata: std::collections::BTreeMap<u32, (f64, f64)> = std::collections::BTreeMap::new();
    let usable = || nodes.iter().filter(|n| n.exposure.is_finite() && n.exposure > 0.0);
    for n in usable() {
        let e = strata.entry(n.stratum).or_default();
        e.0 += n.events as f64;
        e.1 += n.exposure;
    }
    let (mut excess, mut scale) = (0.0, 0.0);
    for n in usable() {
        let (events, exposure) = strata[&n.stratum];
        if events > 0.0 {
            let m = events / exposure * n.exposure;
            let x = n.events as f64;
            excess += (x - m).powi(2) - x;
            scale += m * m;
        }
    }
    (scale > 0.0).then(|| (excess / scale).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::NodeCount;
    use rand::{Rng, SeedableRng};

    fn poisson(rng: &mut impl Rng, mean: f64) -> u64 {
        let limit = (-mean).exp();
        let (mut p, mut k) = (rng.random::<f64>(), 0);
        while p > limit {
            k += 1;
            p *= rng.random::<f64>();
        }
        k
    }

    /// 32 updated nodes against 900 controls, hourly, node `i` at `multiple(i)` times the base rate.
    fn run(seed: u64, hours: u32, multiple: impl Fn(u32) -> f64) -> NodeMixtureProcess {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut p = NodeMixtureProcess::new(1.0).unwrap();
        let base = 0.01;
        for _ in 0..hours {
            let updated = (0..32)
                .map(|node| NodeObservation {
                    node,
                    events: poisson(&mut rng, base * multiple(node)),
                    exposure: 1.0,
                })
                .collect();
            let cell = NodeCell {
                updated,
                control_events: poisson(&mut rng, base * 900.0),
                control_exposure: 900.0,
            };
            p.observe_bin(&[cell]).unwrap();
        }
        p
    }

    #[test]
    fn a_quarter_of_nodes_at_four_times_is_caught_and_alike_nodes_are_not() {
        // 8 of 32 nodes at 4x (1.75x on average) for 300 h: 3 expected events per node.
        let caught = (0..20)
            .filter(|&s| {
                run(s, 300, |n| if n < 8 { 4.0 } else { 1.0 })
                    .fails(0.005, 0.0)
                    .unwrap()
            })
            .count();
        assert!(caught >= 15, "{caught} of 20");
        let false_alarms = (0..20)
            .filter(|&s| run(100 + s, 300, |_| 1.0).fails(0.005, 0.0).unwrap())
            .count();
        assert_eq!(false_alarms, 0);
    }

    #[test]
    fn the_shortcut_bound_is_never_below_the_evidence_and_never_changes_a_decision() {
        // Healthy, concentrated and uniform effects, short and long, at several spreads: the bound
        // dominates the exact evidence, and `fails` answers as the exact comparison does.
        let mut skipped = 0;
        for seed in 0..30 {
            let hours = 20 + 20 * (seed % 8) as u32;
            let effect = match seed % 3 {
                0 => 1.0,
                1 => 3.0,
                _ => 8.0,
            };
            let p = run(200 + seed, hours, |n| if n < 8 || effect < 4.0 { effect } else { 1.0 });
            for h in [0.0, 0.05, 0.3, 2.0] {
                let (bound, exact) = (p.ln_evidence_bound(h), p.ln_evidence(h));
                assert!(bound >= exact, "seed {seed} h {h}: bound {bound} < {exact}");
                for level in [0.5f64, 0.05, 0.005, 1e-4] {
                    let threshold = (1.0 / level).ln();
                    assert_eq!(
                        p.fails(level, h).unwrap(),
                        exact >= threshold,
                        "seed {seed} h {h} {level}"
                    );
                    skipped += usize::from(bound < threshold - 1e-6);
                }
            }
        }
        // The shortcut is taken, and not always.
        assert!((1..30 * 16).contains(&skipped), "{skipped}");
    }

    #[test]
    fn heterogeneity_is_estimated_from_the_control() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let alike: Vec<NodeCount> = (0..2000)
            .map(|i| NodeCount {
                stratum: i % 4,
                events: poisson(&mut rng, 5.0),
                exposure: 100.0,
            })
            .collect();
        assert!(node_heterogeneity(&alike).unwrap() < 0.02);
        // Half the nodes at 3x the rate of the other half: rates 2.5 and 7.5, var/mean² = 0.25.
        let spread: Vec<NodeCount> = (0..2000)
            .map(|i| NodeCount {
                stratum: 0,
                events: poisson(&mut rng, if i % 2 == 0 { 2.5 } else { 7.5 }),
                exposure: 100.0,
            })
            .collect();
        let h = node_heterogeneity(&spread).unwrap();
        assert!((0.2..0.3).contains(&h), "{h}");
        assert_eq!(node_heterogeneity(&[]), None);
    }

    #[test]
    fn a_node_fed_apart_from_its_cell_is_the_same_evidence() {
        // The engine's judge feeds each node against its cell's totals; the bench feeds whole bins.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let mut by_bin = NodeMixtureProcess::new(1.5).unwrap();
        let mut by_node = NodeMixtureProcess::new(1.5).unwrap();
        for _ in 0..50 {
            let cells: Vec<NodeCell> = (0..2u32)
                .map(|stratum| NodeCell {
                    updated: (0..6)
                        .map(|i| NodeObservation {
                            node: stratum * 10 + i,
                            events: poisson(&mut rng, if i == 0 { 0.4 } else { 0.05 }),
                            exposure: 8.0,
                        })
                        .collect(),
                    control_events: poisson(&mut rng, 1.0),
                    control_exposure: 160.0,
                })
                .collect();
            by_bin.observe_bin(&cells).unwrap();
            for cell in &cells {
                let totals = RateCell {
                    updated_events: cell.updated.iter().map(|o| o.events).sum(),
                    updated_exposure: cell.updated.iter().map(|o| o.exposure).sum(),
                    control_events: cell.control_events,
                    control_exposure: cell.control_exposure,
                };
                // Nodes in reverse order: the evidence does not depend on the order of feeding.
                for o in cell.updated.iter().rev() {
                    by_node.observe_node(&totals, *o).unwrap();
                }
            }
        }
        assert_eq!(by_node.nodes(), 12);
        let (a, b) = (by_bin.ln_evidence(0.1), by_node.ln_evidence(0.1));
        assert!(a > 1.0, "node 0 of each stratum runs 8x: {a}");
        assert!((a - b).abs() < 1e-9, "{a} {b}");
        let bad = NodeObservation {
            node: 1,
            events: 1,
            exposure: f64::NAN,
        };
        assert!(by_node.observe_node(&RateCell::default(), bad).is_err());
    }

    #[test]
    fn invalid_input_is_an_error() {
        assert!(NodeMixtureProcess::new(f64::NAN).is_err());
        let mut p = NodeMixtureProcess::new(1.0).unwrap();
        let bad = NodeCell {
            updated: vec![NodeObservation {
                node: 0,
                events: 1,
                exposure: -1.0,
            }],
            control_events: 0,
            control_exposure: 1.0,
        };
        assert!(p.observe_bin(&[bad]).is_err());
        assert!(p.fails(0.0, 0.0).is_err());
        assert_eq!(p.nodes(), 0);
    }
}
