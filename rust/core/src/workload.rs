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

/// The seed workload's sources for mixture benchmarks: chat, code, math and safety, 40/30/20/10 of the
/// samples, with different length profiles — chat and safety shorter, code longer (mean lengths
/// ~1,900, ~3,200, ~2,200, ~1,300 tokens) — together exactly the seed workload's lengths.
pub const SEED_SOURCES: [&str; 4] = ["chat", "code", "math", "safety"];

/// `P(source | bin)` of each seed bin, fitted so that the sources hold 40/30/20/10 of the samples.
const SOURCE_OF_BIN: [[f64; 4]; 5] = [
    [0.580, 0.054, 0.065, 0.301],
    [0.528, 0.132, 0.157, 0.183],
    [0.408, 0.230, 0.256, 0.106],
    [0.344, 0.399, 0.219, 0.038],
    [0.242, 0.607, 0.135, 0.016],
];

/// `n` seed-workload lengths split into [`SEED_SOURCES`]: the lengths grouped by source (in that
/// order, each source's in draw order) and each source's count.
///
/// [`ErrorKind::OutOfMemory`](crate::error::ErrorKind::OutOfMemory) when they cannot be allocated.
pub fn seed_sources(n: usize, seed: u64) -> crate::error::Result<(Vec<u32>, [u32; 4])> {
    let lengths = seed_lengths(n, seed)?;
    let mut rng = Pcg64::new(seed, 1, Stream::Workload);
    let mut sources = crate::memory::vec_with_capacity("splitting the seed workload", n)?;
    let mut counts = [0u32; 4];
    for &l in &lengths {
        let bin = SEED_BINS
            .iter()
            .position(|&(_, hi, _)| l <= hi)
            .unwrap_or(4);
        // 53 random bits → a float in [0, 1).
        #[allow(clippy::cast_precision_loss)]
        let mut pick = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let source = SOURCE_OF_BIN[bin]
            .iter()
            .position(|&p| {
                pick -= p;
                pick < 0.0
            })
            .unwrap_or(3);
        counts[source] += 1;
        // Sources number 4.
        #[allow(clippy::cast_possible_truncation)]
        sources.push(source as u8);
    }
    let mut grouped = crate::memory::vec_with_capacity("splitting the seed workload", n)?;
    for s in 0..4u8 {
        grouped.extend(
            lengths
                .iter()
                .zip(&sources)
                .filter(|&(_, &k)| k == s)
                .map(|(&l, _)| l),
        );
    }
    Ok((grouped, counts))
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

    #[test]
    fn the_sources_hold_their_shares_and_profiles() {
        let (lengths, counts) = seed_sources(200_000, 0).unwrap();
        let mut same = seed_lengths(200_000, 0).unwrap();
        let mut grouped = lengths.clone();
        same.sort_unstable();
        grouped.sort_unstable();
        assert_eq!(grouped, same, "the seed workload's lengths, regrouped");
        let mut start = 0usize;
        let mut means = Vec::new();
        for (&count, share) in counts.iter().zip([0.4, 0.3, 0.2, 0.1]) {
            let part = &lengths[start..start + count as usize];
            assert!(
                (f64::from(count) / 200_000.0 - share).abs() < 0.005,
                "{counts:?}"
            );
            means.push(part.iter().map(|&l| f64::from(l)).sum::<f64>() / part.len() as f64);
            start += count as usize;
        }
        assert!(
            means[1] > means[2] && means[2] > means[0] && means[0] > means[3],
            "{means:?}"
        );
    }
}
