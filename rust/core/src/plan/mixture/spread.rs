//! The spread step: a bucket's rows of an epoch's selection written into the epoch buffer in a
//! seeded order that spreads each source evenly through the bucket, so every batch cut from it
//! holds the sources in proportion (see `choose.rs` for what this buys).

use crate::plan::mixture::groups::{Groups, Selection};
use crate::rng::Pcg64;
use std::hint::select_unpredictable;

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
    let runs = Runs::new(counts, rng);
    match counts.len() {
        0..=4 => merge_few::<4>(sorted, &runs, out),
        5..=8 => merge_few::<8>(sorted, &runs, out),
        _ => merge_many(sorted, runs, out),
    }
}

/// Each run's next time, step, next row and end, in source order.
struct Runs {
    next: Vec<u64>,
    step: Vec<u64>,
    at: Vec<usize>,
    end: Vec<usize>,
}

impl Runs {
    /// The runs of `counts`, their offsets drawn from `rng` source by source (none for an empty run).
    fn new(counts: &[usize], rng: &mut Pcg64) -> Self {
        let n = counts.len();
        let mut runs = Self {
            next: Vec::with_capacity(n),
            step: Vec::with_capacity(n),
            at: Vec::with_capacity(n),
            end: Vec::with_capacity(n),
        };
        let mut start = 0;
        for &c in counts {
            runs.at.push(start);
            start += c;
            runs.end.push(start);
            // A run of one row takes the whole range; longer runs a step of ⌊2^64 / c⌋.
            // Below 2^63 for c ≥ 2.
            #[allow(clippy::cast_possible_truncation)]
            let width = if c > 1 {
                (ONE / c as u128) as u64
            } else {
                u64::MAX
            };
            runs.step.push(width);
            // Exhausted (or empty) runs wait at the end of time, live ones below it.
            runs.next.push(if c == 0 {
                u64::MAX
            } else {
                rng.below(width).min(u64::MAX - 1)
            });
        }
        runs
    }
}

/// The time after `t` of a run whose row `at` was just taken.
fn advance(t: u64, step: u64, at: usize, end: usize) -> u64 {
    if at == end {
        u64::MAX
    } else {
        t.saturating_add(step).min(u64::MAX - 1)
    }
}

/// [`merge_by_time`] for at most `K` runs, padded with runs that never come: every run's time and
/// row live in fixed-size arrays the compiler keeps in registers, so a row waits on no store of the
/// row before, and the next run is picked by conditional moves (which run comes next is not
/// predictable). 9% of a mixture's epoch less than a loop over the runs' vectors on the seed
/// workload's four sources (median of 5 runs of 101 epochs, one thread); conditional moves for the
/// update too were no faster.
fn merge_few<const K: usize>(sorted: &[u64], runs: &Runs, out: &mut [u64]) {
    let (mut next, mut step, mut at, mut end) =
        ([u64::MAX; K], [0u64; K], [0usize; K], [0usize; K]);
    for s in 0..runs.next.len() {
        (next[s], step[s], at[s], end[s]) = (runs.next[s], runs.step[s], runs.at[s], runs.end[s]);
    }
    for slot in out.iter_mut() {
        // The first least time: ties to the earlier run, as a scan in source order.
        let (mut best, mut least, mut row) = (0, next[0], at[0]);
        for s in 1..K {
            let earlier = next[s] < least;
            best = select_unpredictable(earlier, s, best);
            least = select_unpredictable(earlier, next[s], least);
            row = select_unpredictable(earlier, at[s], row);
        }
        *slot = sorted[row];
        for s in 0..K {
            let hit = s == best;
            let moved = at[s] + usize::from(hit);
            let later = select_unpredictable(
                moved == end[s],
                u64::MAX,
                next[s].saturating_add(step[s]).min(u64::MAX - 1),
            );
            next[s] = if hit { later } else { next[s] };
            at[s] = moved;
        }
    }
}

/// [`merge_by_time`] for any number of runs: a scan of every run's time for each row.
fn merge_many(sorted: &[u64], runs: Runs, out: &mut [u64]) {
    let Runs {
        mut next,
        step,
        mut at,
        end,
    } = runs;
    for slot in out.iter_mut() {
        let mut best = 0;
        for (s, &t) in next.iter().enumerate().skip(1) {
            best = if t < next[best] { s } else { best };
        }
        *slot = sorted[at[best]];
        at[best] += 1;
        next[best] = advance(next[best], step[best], at[best], end[best]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Stream;
    use proptest::prelude::*;

    proptest! {
        /// The register merge is the scan merge, row for row, for any runs (empty ones included).
        #[test]
        fn merging_few_runs_equals_scanning_them(
            counts in prop::collection::vec(0usize..40, 1..=8),
            seed in 0u64..1000,
        ) {
            let total: usize = counts.iter().sum();
            let sorted: Vec<u64> = (0..total as u64).map(|v| v * 7 + 3).collect();
            let (mut fast, mut slow) = (vec![0u64; total], vec![0u64; total]);
            merge_by_time(&sorted, &counts, &mut Pcg64::new(seed, 1, Stream::Workload), &mut fast);
            let runs = Runs::new(&counts, &mut Pcg64::new(seed, 1, Stream::Workload));
            merge_many(&sorted, runs, &mut slow);
            prop_assert_eq!(fast, slow);
        }
    }

    /// The same at a bucket's size, with runs of a power of two (a step of exactly 2^64 / c) and of one.
    #[test]
    fn merging_a_large_bucket_equals_scanning_it() {
        for (seed, counts) in [
            (1, vec![40_000usize, 30_000, 20_000, 10_000]),
            (2, vec![65_536, 1, 4_096, 0, 3, 1 << 14, 7, 1]),
        ] {
            let total: usize = counts.iter().sum();
            let sorted: Vec<u64> = (0..total as u64).collect();
            let (mut fast, mut slow) = (vec![0u64; total], vec![0u64; total]);
            merge_by_time(
                &sorted,
                &counts,
                &mut Pcg64::new(seed, 3, Stream::Workload),
                &mut fast,
            );
            let runs = Runs::new(&counts, &mut Pcg64::new(seed, 3, Stream::Workload));
            merge_many(&sorted, runs, &mut slow);
            assert!(fast == slow, "counts {counts:?}");
        }
    }
}
