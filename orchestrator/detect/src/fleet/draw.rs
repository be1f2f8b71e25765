//! Random draws shared by the fleet simulation and `policy power`'s forecast. Hand-written rather
//! than a distribution crate's so that a seed gives the same rollouts on every platform and every
//! release of that crate: the bench's figures and the forecast's promises are reproducible.

use rand::Rng;

/// A standard normal draw.
pub(super) fn normal(rng: &mut impl Rng) -> f64 {
    // Box-Muller; 1 - u keeps the logarithm finite.
    let u: f64 = 1.0 - rng.random::<f64>();
    let v: f64 = rng.random::<f64>();
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// A Poisson draw with mean `mean`, by Knuth's multiplication method in chunks of at most 20 so that
/// `exp(-chunk)` never underflows.
pub(super) fn poisson(rng: &mut impl Rng, mean: f64) -> u64 {
    if mean <= 0.0 {
        return 0;
    }
    let mut left = mean;
    let mut total = 0;
    while left > 0.0 {
        let chunk = left.min(20.0);
        left -= chunk;
        let limit = (-chunk).exp();
        let mut p = rng.random::<f64>();
        while p > limit {
            total += 1;
            p *= rng.random::<f64>();
        }
    }
    total
}
