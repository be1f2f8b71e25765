//! The planner's only source of randomness: SplitMix64 from an explicit
//! seed. Written out here rather than taken from `rand` because a stored
//! plan must be reproducible from its seed bit for bit, whatever version of
//! a random-number crate a later build links.

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, and good enough to
/// shuffle node lists; nothing here needs cryptographic quality.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator for one purpose (`wave 3`, `control of wave 1`), so that
    /// drawing more numbers for one wave does not shift another wave's.
    pub(crate) fn derive(seed: u64, purpose: &str, index: u64) -> Self {
        let mut h = Self::new(seed ^ 0x5741_5645_4755_4152); // "WAVEGUAR"
        let mut state = h.next_u64();
        for byte in purpose.bytes().chain(index.to_le_bytes()) {
            state = (state ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        h = Self::new(state);
        h.next_u64();
        h
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), by rejection so there is no modulo bias.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        let n = n as u64;
        let zone = u64::MAX - (u64::MAX % n);
        loop {
            let x = self.next_u64();
            if x < zone {
                // x % n < n, which came from a usize.
                return (x % n) as usize;
            }
        }
    }

    /// Fisher-Yates.
    pub(crate) fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_values_never_change() {
        // Plans are stored with their seed; if these change, every stored
        // plan's recomputation changes too.
        let mut rng = SplitMix64::new(1234567);
        assert_eq!(rng.next_u64(), 6457827717110365317);
        assert_eq!(rng.next_u64(), 3203168211198807973);
    }

    #[test]
    fn shuffle_is_a_permutation_and_seed_dependent() {
        let base: Vec<u32> = (0..50).collect();
        let mut a = base.clone();
        SplitMix64::derive(1, "x", 0).shuffle(&mut a);
        let mut b = base.clone();
        SplitMix64::derive(2, "x", 0).shuffle(&mut b);
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, base);
        assert_ne!(a, b);
        let mut c = base.clone();
        SplitMix64::derive(1, "x", 0).shuffle(&mut c);
        assert_eq!(a, c);
    }
}
