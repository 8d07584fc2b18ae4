//! The select stage: the rows an epoch of a mixture trains, for one forming key.
//!
//! Source `s` with quota `copies` whole copies plus `rest` contributes every admitted row `copies`
//! times, then `rest` (samples, or tokens) from its *cycle*: the epoch's slice, which starts where
//! the epoch before's ended (`slices.rs`; under fixed weights key `k` takes slice `k mod m` of cycle
//! `⌊k / m⌋`, `m = ⌊total / rest⌋`), so keys `0, 1, 2, …` (the epochs) walk through a down-sampled
//! source without repeating a row until the cycle ends, and a slice never holds a row twice. In
//! tokens, a slice's ends are the sample boundaries nearest to its first and last position (tokens
//! into the cycle), shared with the slices before and after:
//! cycle: a source's tokens are within one sample of its share.
//!
//! **Cycles.** A source's rows are kept in groups (`groups.rs`: one per bucket, each in a fixed seeded
//! order drawn once). A cycle is the merge of its source's groups by *time*: in cycle `c`,
//! group `g` (of `n` rows) starts at a seeded offset `o` and its `i`-th row from there has time
//! `(i + φ) / n`, `φ` a seeded phase, ties to the earlier group. Every group is spread evenly
//! through the cycle, so any stretch of it holds each bucket of the source in proportion, and holds
//! of each group a run of consecutive rows (wrapping at most once). A slice is found by bisecting
//! the time at which the cycle's prefix reaches its target, from each group's count of rows before
//! that time and their tokens (prefix sums): no row is visited, and an epoch
//! selects by listing each group's runs. The cycle varies the offsets and phases; which rows follow
//! which inside a group stays as drawn once, so which rows share an epoch repeats between cycles
//! (which share a batch does not: forming shuffles every bucket).
//!
//! Rejected: a seeded permutation of each source per cycle, sliced and grouped by bucket every
//! epoch — 8 ms of a 34 ms seed epoch (four sources, 902,087 rows) and 0.9 s of a 100M one went to
//! drawing it and to the grouping's random reads of lengths (measured).

use crate::plan::mixture::groups::{Selection, CYCLE_SALT};
use crate::plan::mixture::{Groups, Mix, Unit};
use crate::rng::mix64;

/// The fixed-point scale of a time: `1.0` is `2^64`.
const ONE: u128 = 1 << 64;

impl Groups {
    /// The selection of forming key `key` (see the module docs).
    pub(crate) fn select(&self, mix: &Mix, seed: u64, key: u64) -> Selection {
        let groups = self.starts.len() - 1;
        let mut runs = Vec::new();
        let mut first = Vec::with_capacity(groups + 1);
        let (mut samples, mut tokens) = (0usize, 0u64);
        for (s, quota) in mix.slices(key).into_iter().enumerate() {
            let own = s * self.buckets..(s + 1) * self.buckets;
            let slice = (quota.rest > 0).then(|| {
                let cycle = Cycle::new(self, own.clone(), seed, s, quota.cycle);
                let unit = mix.spec.unit;
                let from = cycle.boundary(quota.from, unit);
                let to = cycle.boundary(quota.from + quota.rest, unit);
                (cycle, from, to)
            });
            for (k, g) in own.enumerate() {
                first.push(runs.len());
                let (lo, hi) = (self.starts[g], self.starts[g + 1]);
                let mut push = |a: usize, b: usize| {
                    if a < b {
                        runs.push((a, b));
                        samples += b - a;
                        tokens += self.tokens_before(g, b - lo) - self.tokens_before(g, a - lo);
                    }
                };
                for _ in 0..quota.copies {
                    push(lo, hi);
                }
                if let Some((cycle, from, to)) = &slice {
                    // Cycle positions from[k]..to[k] of the group, which starts at its offset.
                    let (n, offset) = (hi - lo, cycle.offsets[k]);
                    let (a, b) = (offset + from[k], offset + to[k]);
                    if b <= n {
                        push(lo + a, lo + b);
                    } else if a >= n {
                        push(lo + a - n, lo + b - n);
                    } else {
                        push(lo + a, hi);
                        push(lo, lo + b - n);
                    }
                }
            }
        }
        first.push(runs.len());
        Selection {
            runs,
            first,
            samples,
            tokens,
        }
    }
}

/// One source's cycle (see the module docs): its groups, each with the offset its cycle starts at
/// and its phase.
struct Cycle<'g> {
    groups: &'g Groups,
    own: std::ops::Range<usize>,
    offsets: Vec<usize>,
    phases: Vec<u128>,
    /// Tokens of each group's rows before its offset, and in all.
    before: Vec<u64>,
    totals: Vec<u64>,
}

impl<'g> Cycle<'g> {
    fn new(
        groups: &'g Groups,
        own: std::ops::Range<usize>,
        seed: u64,
        s: usize,
        cycle: u64,
    ) -> Self {
        let base = mix64(seed ^ mix64(CYCLE_SALT.wrapping_add(s as u64)) ^ mix64(cycle));
        let (mut offsets, mut phases, mut before, mut totals) = (vec![], vec![], vec![], vec![]);
        for g in own.clone() {
            let n = groups.len_of(g);
            let draw = mix64(base ^ (g as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            // Below n, which is a usize.
            #[allow(clippy::cast_possible_truncation)]
            let offset = if n == 0 {
                0
            } else {
                ((u128::from(draw) * n as u128) >> 64) as usize
            };
            offsets.push(offset);
            phases.push(u128::from(mix64(draw) >> 32));
            before.push(groups.tokens_before(g, offset));
            totals.push(groups.tokens_before(g, n));
        }
        Self {
            groups,
            own,
            offsets,
            phases,
            before,
            totals,
        }
    }

    /// Rows of group `k` (of the cycle's) whose time is below `time` (`ONE` = the whole cycle).
    fn count(&self, k: usize, time: u128) -> usize {
        let n = self.groups.len_of(self.own.start + k) as u128;
        let shifted = self.phases[k] << 32;
        let reach = time * n;
        if reach <= shifted {
            return 0;
        }
        // At most n, a usize.
        #[allow(clippy::cast_possible_truncation)]
        let count = ((reach - shifted).div_ceil(ONE)).min(n) as usize;
        count
    }

    /// Tokens (or samples) of group `k`'s first `count` rows of the cycle.
    fn mass(&self, k: usize, count: usize, unit: Unit) -> u64 {
        if unit == Unit::Samples {
            return count as u64;
        }
        let g = self.own.start + k;
        let (n, offset) = (self.groups.len_of(g), self.offsets[k]);
        let end = offset + count;
        if end <= n {
            self.groups.tokens_before(g, end) - self.before[k]
        } else {
            self.totals[k] - self.before[k] + self.groups.tokens_before(g, end - n)
        }
    }

    fn mass_at(&self, time: u128, unit: Unit) -> u64 {
        (0..self.offsets.len())
            .map(|k| self.mass(k, self.count(k, time), unit))
            .sum()
    }

    /// Each group's rows before the cycle's sample boundary nearest to `target` (samples, or tokens)
    /// into it: bisect the latest time whose prefix stays within `target`, then take the rows due
    /// next, in time order, while the boundary after them is nearer (the earlier boundary on a tie).
    fn boundary(&self, target: u64, unit: Unit) -> Vec<usize> {
        let groups = self.offsets.len();
        if self.mass_at(ONE, unit) <= target {
            return (0..groups)
                .map(|k| self.groups.len_of(self.own.start + k))
                .collect();
        }
        let (mut lo, mut hi) = (0u128, ONE);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.mass_at(mid, unit) <= target {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let mut counts: Vec<usize> = (0..groups).map(|k| self.count(k, lo)).collect();
        let mut mass: u64 = (0..groups).map(|k| self.mass(k, counts[k], unit)).sum();
        // The rows whose time falls in [lo, hi): at most one per group (a group's rows are 2^-32
        // apart at least), ordered by their exact time `(i · 2^32 + φ) / n`, ties by group.
        let mut due: Vec<usize> = (0..groups)
            .filter(|&k| self.count(k, hi) > counts[k])
            .collect();
        let time = |k: usize| {
            let n = self.groups.len_of(self.own.start + k) as u128;
            ((counts[k] as u128) << 32 | self.phases[k], n)
        };
        due.sort_by(|&a, &b| {
            let ((ta, na), (tb, nb)) = (time(a), time(b));
            (ta * nb).cmp(&(tb * na)).then(a.cmp(&b))
        });
        for k in due {
            let after = mass - self.mass(k, counts[k], unit) + self.mass(k, counts[k] + 1, unit);
            // Rows within the target are taken; the one that crosses it only if the boundary
            // after it is strictly nearer.
            let take = after <= target || target - mass > after - target;
            if take {
                counts[k] += 1;
                mass = after;
            }
            if !take || mass > target {
                break;
            }
        }
        counts
    }
}
