//! Deterministic randomness keyed by what a draw is for, never by request order.
//!
//! Every random quantity is a pure function of (seed, node index, purpose, sub-index, time bucket), so two runs
//! with the same seed agree regardless of which client asked first or how many threads served it.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// What a draw is for; part of the key so unrelated draws never share a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub(crate) enum Purpose {
    TempNoise = 1,
    PowerNoise = 2,
    EffectShare = 3,
    EventShare = 4,
    Xid = 5,
    Aer = 6,
    Link = 7,
    Flash = 8,
    RequestFault = 9,
    Reset = 10,
    DcgmUuid = 11,
    DcgmEcc = 12,
    DcgmNvlink = 13,
    DcgmRows = 14,
    LoopingNextLink = 15,
    PartSerial = 16,
    PartLot = 17,
    HwFailure = 18,
    HwMode = 19,
    Diagnostics = 20,
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A 64-bit hash of the key.
pub(crate) fn key(seed: u64, node: u64, purpose: Purpose, sub: u64, bucket: u64) -> u64 {
    let mut h = splitmix(seed);
    for part in [node, purpose as u64, sub, bucket] {
        h = splitmix(h ^ part);
    }
    h
}

/// A uniform draw in [0, 1) for the key.
pub(crate) fn unit(seed: u64, node: u64, purpose: Purpose, sub: u64, bucket: u64) -> f64 {
    (key(seed, node, purpose, sub, bucket) >> 11) as f64 / (1u64 << 53) as f64
}

/// A standard normal draw for the key (Box-Muller on two derived uniforms).
pub(crate) fn normal(seed: u64, node: u64, purpose: Purpose, sub: u64, bucket: u64) -> f64 {
    let u1 = unit(seed, node, purpose, sub, bucket.wrapping_mul(2)).max(f64::MIN_POSITIVE);
    let u2 = unit(seed, node, purpose, sub, bucket.wrapping_mul(2).wrapping_add(1));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// A seeded stream for the key, for sequences of draws (events inside a time bucket).
pub(crate) fn stream(seed: u64, node: u64, purpose: Purpose, sub: u64, bucket: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(key(seed, node, purpose, sub, bucket))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_spread() {
        assert_eq!(unit(1, 2, Purpose::Xid, 3, 4), unit(1, 2, Purpose::Xid, 3, 4));
        assert_ne!(unit(1, 2, Purpose::Xid, 3, 4), unit(1, 2, Purpose::Aer, 3, 4));
        let mean: f64 = (0..10_000).map(|i| unit(7, i, Purpose::Flash, 0, 0)).sum::<f64>() / 10_000.0;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
        let sd: f64 = ((0..10_000)
            .map(|i| normal(7, i, Purpose::TempNoise, 0, 0).powi(2))
            .sum::<f64>()
            / 10_000.0)
            .sqrt();
        assert!((sd - 1.0).abs() < 0.05, "{sd}");
    }
}
