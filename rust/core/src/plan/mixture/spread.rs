//! The spread step: a bucket's rows of an epoch's selection written into the epoch buffer in a
//! seeded order that spreads each source evenly through the bucket, so every batch cut from it
//! holds the sources in proportion (see `choose.rs` for what this buys).

use crate::plan::mixture::groups::{Groups, Selection};
use crate::rng::Pcg64;

/// The fixed-point scale of a time: `1.0` is `2^64`.
const ONE: u128 = 1 << 64;

impl Groups {
    /// Writes bucket `b`'s rows of `selection` into `out` in a seeded order that spreads each
    /// source evenly (`rng` drives it): each source's rows shuffled, then merged by time — the
    /// `i`-th of `c` at `(i + u) / c`, `u` drawn per source — so every stretch of the bucket holds
    /// the sources in proportion (see `choose.rs` for what this buys).
    pub(crate) fn fill_bucket(
        &self,
        selection: &Selection,
        b: usize,
        rng: &mut Pcg64,
        out: &mut [u64],
    ) {
        let sources = (self.starts.len() - 1) / self.buckets;
        SCRATCH.with_borrow_mut(|scratch| {
            scratch.clear();
            let mut counts = Vec::with_capacity(sources);
            for s in 0..sources {
                let g = s * self.buckets + b;
                let before = scratch.len();
                for &(lo, hi) in &selection.runs[selection.first[g]..selection.first[g + 1]] {
                    scratch.extend_from_slice(&self.pairs[lo..hi]);
                }
                crate::rng::shuffle(rng, &mut scratch[before..]);
                counts.push(scratch.len() - before);
            }
            merge_by_time(scratch, &counts, rng, out);
        });
    }
}

thread_local! {
    /// [`Groups::fill_bucket`]'s buffer, one per thread (a bucket's rows).
    static SCRATCH: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Merges the runs of `sorted` (`counts[s]` rows of source `s`, one after another) into `out` by
/// time: the `i`-th row of a run of `c` at `u + i · ⌊2^64 / c⌋`, `u` below the step and drawn per
/// source; ties to the earlier source.
pub(super) fn merge_by_time(sorted: &[u64], counts: &[usize], rng: &mut Pcg64, out: &mut [u64]) {
    let mut next: Vec<u64> = Vec::with_capacity(counts.len());
    let mut step: Vec<u64> = Vec::with_capacity(counts.len());
    let mut at: Vec<usize> = Vec::with_capacity(counts.len());
    let mut start = 0;
    for &c in counts {
        at.push(start);
        start += c;
        // A run of one row takes the whole range; longer runs a step of ⌊2^64 / c⌋.
        // Below 2^63 for c ≥ 2.
        #[allow(clippy::cast_possible_truncation)]
        let width = if c > 1 {
            (ONE / c as u128) as u64
        } else {
            u64::MAX
        };
        step.push(width);
        // Exhausted (or empty) runs wait at the end of time, live ones below it.
        next.push(if c == 0 {
            u64::MAX
        } else {
            rng.below(width).min(u64::MAX - 1)
        });
    }
    let ends: Vec<usize> = at.iter().zip(counts).map(|(a, c)| a + c).collect();
    for slot in out.iter_mut() {
        let mut best = 0;
        for (s, &t) in next.iter().enumerate().skip(1) {
            best = if t < next[best] { s } else { best };
        }
        *slot = sorted[at[best]];
        at[best] += 1;
        next[best] = if at[best] == ends[best] {
            u64::MAX
        } else {
            next[best].saturating_add(step[best]).min(u64::MAX - 1)
        };
    }
}
