//! The simulator's seeded generator: leda-core's SplitMix64 ([`SimRng`], one
//! implementation for the whole workspace) with the draws the experiments use.
//!
//! Not the `rand` crates: a seed's stream must never change with a dependency upgrade,
//! so that the same seed replays the same trace forever.

use leda_core::sim::SimRng;

/// SplitMix64 generator (Steele, Lea, Flood 2014). Not cryptographic.
#[derive(Debug, Clone)]
pub struct SplitMix64(SimRng);

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(SimRng::new(seed))
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform float in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        self.0.unit()
    }

    /// Uniform integer in `[lo, hi]` (inclusive); returns `lo` when `hi <= lo`.
    pub fn range_inclusive(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        let span = hi - lo + 1;
        lo + self.next_u64() % span
    }

    /// Uniform index in `0..len`; `len` must be non-zero (returns 0 otherwise).
    pub fn index(&mut self, len: usize) -> usize {
        if len == 0 {
            return 0;
        }
        (self.next_u64() % len as u64) as usize
    }

    /// Exponentially distributed value with the given mean, rounded to an integer tick.
    pub fn exponential(&mut self, mean: f64) -> u64 {
        let u = self.next_f64();
        let x = -mean * (1.0 - u).ln();
        if x.is_finite() && x > 0.0 {
            x.round() as u64
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let mut a = SplitMix64::new(42);
        let mut b = SplitMix64::new(42);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mut c = SplitMix64::new(43);
        assert_ne!(SplitMix64::new(42).next_u64(), c.next_u64());
    }

    #[test]
    fn ranges_stay_in_bounds() {
        let mut r = SplitMix64::new(7);
        for _ in 0..1000 {
            let x = r.range_inclusive(3, 9);
            assert!((3..=9).contains(&x));
            assert!(r.index(5) < 5);
            let f = r.next_f64();
            assert!((0.0..1.0).contains(&f));
        }
        let mean: f64 = (0..20_000).map(|_| r.exponential(10.0) as f64).sum::<f64>() / 20_000.0;
        assert!((9.0..11.0).contains(&mean), "mean {mean}");
    }
}
