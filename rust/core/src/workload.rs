//! The seed workload (see `shared/CONTEXT.md`): lengths drawn from the DFlash dataset's histogram.
//!
//! Each sample draws its bin from the seed's shares and its length log-uniformly inside the bin. Used by
//! tests, benches and the demo so every figure is measured on the same shape of data.

use crate::rng::{Pcg64, Stream};

/// `(lowest, highest, share)` of each bin of the seed histogram.
pub const SEED_BINS: [(u32, u32, f64); 5] = [
    (64, 511, 0.054),
    (512, 1023, 0.192),
    (1024, 2047, 0.337),
    (2048, 4095, 0.283),
    (4096, 8192, 0.134),
];

/// Samples in the seed dataset.
pub const SEED_SAMPLES: usize = 902_087;

/// `n` lengths of the seed workload, reproducible from `seed` ([`ErrorKind::OutOfMemory`] when `n`
/// lengths cannot be allocated).
///
/// [`ErrorKind::OutOfMemory`]: crate::error::ErrorKind::OutOfMemory
pub fn seed_lengths(n: usize, seed: u64) -> crate::error::Result<Vec<u32>> {
    let mut lengths = crate::memory::vec_with_capacity("generating the seed workload", n)?;
    let mut rng = Pcg64::new(seed, 0, Stream::Workload);
    let mut unit = || {
        // 53 random bits → a float in [0, 1).
        #[allow(clippy::cast_precision_loss)]
        let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        u
    };
    lengths.extend((0..n).map(|_| {
        let mut pick = unit();
        let &(lo, hi, _) = SEED_BINS
            .iter()
            .find(|&&(_, _, share)| {
                pick -= share;
                pick < 0.0
            })
            .unwrap_or(&SEED_BINS[SEED_BINS.len() - 1]);
        let span = f64::from(hi + 1) / f64::from(lo);
        // Log-uniform in [lo, hi + 1), floored and clamped: always within the bin.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let length = (f64::from(lo) * span.powf(unit())) as u32;
        length.clamp(lo, hi)
    }));
    Ok(lengths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_seed_statistics() {
        let lengths = seed_lengths(200_000, 0).unwrap();
        let mean = lengths.iter().map(|&l| f64::from(l)).sum::<f64>() / lengths.len() as f64;
        let mut sorted = lengths.clone();
        sorted.sort_unstable();
        let median = sorted[sorted.len() / 2];
        assert!((2_200.0..2_350.0).contains(&mean), "mean {mean}");
        assert!((1_650..1_800).contains(&median), "median {median}");
        assert!(lengths.iter().all(|&l| (64..=8192).contains(&l)));
    }
}
