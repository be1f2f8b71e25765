//! Over-dispersion of node-level event counts, estimated from the control.
//!
//! XID errors burst and cascade across a node's GPUs, so a node's count is not Poisson: its variance
//! is some `phi` times its mean. A test that assumed Poisson would count one burst of eight as eight
//! independent pieces of evidence and fail good firmware. The quasi-Poisson model keeps the mean and
//! scales the variance by `phi`, estimated by Pearson's statistic over the control's nodes (McCullagh &
//! Nelder 1989, §4.5); the rate evidence is then tempered by `1/phi` (each burst counts once, roughly).
//! The control is used because it is large and because the firmware may change the updated nodes'
//! dispersion itself (a regression on a quarter of the nodes is over-dispersion).

/// One control node's count over the estimation window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeCount {
    /// The node's stratum: rates are fitted per stratum, so that persistent differences between
    /// strata (a hot row, an older SKU) are not mistaken for over-dispersion.
    pub stratum: u32,
    /// Events.
    pub events: u64,
    /// Exposure (GPU-hours or node-hours).
    pub exposure: f64,
}

/// Pearson's quasi-Poisson dispersion `phi = X^2 / (n - k)` with a rate per stratum (`k` strata with
/// events), floored at 1 (under-dispersion is not credited: it would make the test bolder than
/// Poisson).
///
/// `None` when there is nothing to estimate from: fewer than two nodes per fitted rate, or no events
/// at all. The caller then uses its prior (1 when the metric is known not to burst, the last estimate
/// otherwise).
pub fn quasi_poisson_dispersion(nodes: &[NodeCount]) -> Option<f64> {
    let usable: Vec<&NodeCount> = nodes
        .iter()
        .filter(|n| n.exposure.is_finite() && n.exposure > 0.0)
        .collect();
    // (events, exposure) per stratum.
    let mut strata: std::collections::BTreeMap<u32, (f64, f64)> = std::collections::BTreeMap::new();
    for n in &usable {
        let e = strata.entry(n.stratum).or_default();
        e.0 += n.events as f64;
        e.1 += n.exposure;
    }
    let mut chi2 = 0.0;
    let mut units = 0usize;
    for n in &usable {
        let (events, exposure) = strata[&n.stratum];
        // A stratum without events has no rate to fit and says nothing about dispersion.
        if events > 0.0 {
            let mu = events / exposure * n.exposure;
            chi2 += (n.events as f64 - mu).powi(2) / mu;
            units += 1;
        }
    }
    let fitted = strata.values().filter(|(events, _)| *events > 0.0).count();
    if fitted == 0 || units < 2 * fitted {
        return None;
    }
    let phi = chi2 / (units - fitted) as f64;
    phi.is_finite().then_some(phi.max(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn poisson(rng: &mut impl Rng, mean: f64) -> u64 {
        // Knuth: the means here are small.
        let limit = (-mean).exp();
        let (mut p, mut k) = (1.0, 0);
        loop {
            p *= rng.random::<f64>();
            if p <= limit {
                return k;
            }
            k += 1;
        }
    }

    #[test]
    fn poisson_counts_give_about_one_and_bursts_give_their_size() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let plain: Vec<NodeCount> = (0..2000)
            .map(|_| NodeCount {
                stratum: 0,
                events: poisson(&mut rng, 2.0),
                exposure: 100.0,
            })
            .collect();
        let phi = quasi_poisson_dispersion(&plain).unwrap();
        assert!((1.0..1.15).contains(&phi), "{phi}");
        // Bursts of 4 (a cascade across half a node's GPUs): variance 4x the mean.
        let bursty: Vec<NodeCount> = (0..2000)
            .map(|_| NodeCount {
                stratum: 0,
                events: 4 * poisson(&mut rng, 0.5),
                exposure: 100.0,
            })
            .collect();
        let phi = quasi_poisson_dispersion(&bursty).unwrap();
        assert!((3.5..4.5).contains(&phi), "{phi}");
        // Two Poisson strata with a 4x rate difference: not over-dispersed within either.
        let strata: Vec<NodeCount> = (0..2000)
            .map(|i| NodeCount {
                stratum: i % 2,
                events: poisson(&mut rng, if i % 2 == 0 { 8.0 } else { 2.0 }),
                exposure: 100.0,
            })
            .collect();
        let phi = quasi_poisson_dispersion(&strata).unwrap();
        assert!((1.0..1.15).contains(&phi), "{phi}");
        let merged: Vec<NodeCount> = strata.iter().map(|n| NodeCount { stratum: 0, ..*n }).collect();
        assert!(quasi_poisson_dispersion(&merged).unwrap() > 2.0);
    }

    #[test]
    fn nothing_to_estimate_from_is_none() {
        assert_eq!(quasi_poisson_dispersion(&[]), None);
        let quiet = [NodeCount {
            stratum: 0,
            events: 0,
            exposure: 5.0,
        }; 3];
        assert_eq!(quasi_poisson_dispersion(&quiet), None);
        let bad = [
            NodeCount {
                stratum: 0,
                events: 3,
                exposure: f64::NAN,
            },
            NodeCount {
                stratum: 0,
                events: 1,
                exposure: 2.0,
            },
        ];
        assert_eq!(quasi_poisson_dispersion(&bad), None);
    }
}
