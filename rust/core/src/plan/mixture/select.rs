//! The select stage: the rows an epoch of a mixture trains, for one forming key.
//!
//! Source `s` with quota `copies` whole copies plus `rest` contributes every admitted row `copies`
//! times, then `rest` (samples, or tokens) from its *cycle*, read as consecutive slices of `rest`,
//! one slice per key. Key `k` takes slice `k mod m` of cycle `⌊k / m⌋`, `m = ⌊total / rest⌋`
//! slices fitting a cycle, so keys `0, 1, 2, …` (the epochs) walk through a down-sampled source
//! without repeating a row until the cycle ends, and a slice never holds a row twice. In tokens, a
//! slice's ends are the sample boundaries nearest to `j·rest` and `(j + 1)·rest` tokens into the
//! cycle: a source's tokens are within one sample of its share.
//!
//! **Groups.** Each source's admitted rows are kept in groups, one per bucket once the buckets are
//! known (one per source before), each in a fixed seeded order drawn once, with every row's length
//! beside it ([`Groups`]). A cycle is the merge of its source's groups by *time*: in cycle `c`,
//! group `g` (of `n` rows) starts at a seeded offset `o` and its `i`-th row from there has time
//! `(i + φ) / n`, `φ` a seeded phase, ties to the earlier group. Every group is spread evenly
//! through the cycle, so any stretch of it holds each bucket of the source in proportion, and holds
//! of each group a run of consecutive rows (wrapping at most once). A slice is found by bisecting
//! the time at which the cycle's prefix reaches its target, from each group's count of rows before
//! that time and their tokens (prefix sums every [`STRIDE`] rows): no row is visited, and an epoch
//! selects by listing each group's runs. The cycle varies the offsets and phases; which rows follow
//! which inside a group stays as drawn once, so which rows share an epoch repeats between cycles
//! (which share a batch does not: forming shuffles every bucket).
//!
//! Rejected: a seeded permutation of each source per cycle, sliced and grouped by bucket every
//! epoch — 8 ms of a 34 ms seed epoch (four sources, 902,087 rows) and 0.9 s of a 100M one went to
//! drawing it and to the grouping's random reads of lengths (measured).

use std::sync::Mutex;

use crate::lengths::Length;
use crate::plan::mixture::{Mix, Own, Unit};
use crate::plan::permute::{scatter_into_chunks, shuffle_chunk_pair, Runs, Scattered};
use crate::rng::{mix64, Pcg64};
use crate::tasks::{run, split_chunks};

/// Rows between two stored token prefix sums of a group.
const STRIDE: usize = 16;

/// The fixed-point scale of a time: `1.0` is `2^64`.
const ONE: u128 = 1 << 64;

/// A mixture's admitted rows in groups (see the module docs): group `g = source × buckets +
/// bucket`, its rows with their lengths (`row << 32 | length`) at `pairs[starts[g]..starts[g + 1]]`.
#[derive(Debug)]
pub(crate) struct Groups {
    pairs: Vec<u64>,
    starts: Vec<usize>,
    buckets: usize,
    /// Tokens of group `g`'s first `k · STRIDE` rows at `prefix[prefix_starts[g] + k]`.
    prefix: Vec<u64>,
    prefix_starts: Vec<usize>,
    /// The epoch buffer of the last padded plan, for the next (concurrent plans take their own).
    spare: Mutex<Vec<u64>>,
}

/// One epoch's selection: runs of the groups' pairs, listed group by group (`runs[first[g]..first[g
/// + 1]]` are group `g`'s), and the rows and tokens they hold.
#[derive(Debug)]
pub(crate) struct Selection {
    runs: Vec<(usize, usize)>,
    first: Vec<usize>,
    pub(crate) samples: usize,
    pub(crate) tokens: u64,
}

impl Groups {
    /// No group (a placeholder while a mixture is checked).
    pub(crate) fn empty() -> Self {
        Self::with_prefix(Vec::new(), vec![0], 1)
    }

    /// One group per source: its admitted rows (`own(s)`) in a seeded order (drawn as the epoch's
    /// own permutation is: a scatter into cache-sized chunks, then a Fisher–Yates per chunk). The
    /// sources are drawn one after another, each into its place: at 100M samples the working copies
    /// of all sources at once, beside the result, set the process's peak (measured).
    pub(crate) fn new<'o, L: Length>(
        sources: usize,
        own: impl Fn(usize) -> Own<'o> + Sync,
        lengths: &[L],
        seed: u64,
        pool: Option<&rayon::ThreadPool>,
    ) -> Self {
        let mut starts = vec![0];
        for s in 0..sources {
            starts.push(starts[s] + own(s).len());
        }
        let mut pairs = vec![0u64; starts[sources]];
        for (s, out) in split_chunks(&mut pairs, &starts).into_iter().enumerate() {
            fixed_order(own(s), lengths, seed, s, pool, out);
        }
        Self::with_prefix(pairs, starts, 1)
    }

    /// The same rows regrouped by bucket (`bucket_of(length)`, below `buckets`) inside each source,
    /// each group in the order its rows had: a stable counting sort, source by source in place
    /// (one source's copy at a time beside the rows).
    pub(crate) fn by_bucket(mut self, buckets: usize, bucket_of: impl Fn(u32) -> usize) -> Self {
        debug_assert_eq!(self.buckets, 1);
        let sources = self.starts.len() - 1;
        let mut starts = vec![0usize; sources * buckets + 1];
        for s in 0..sources {
            for &pair in &self.pairs[self.starts[s]..self.starts[s + 1]] {
                starts[s * buckets + bucket_of(length_of(pair)) + 1] += 1;
            }
        }
        for g in 0..sources * buckets {
            starts[g + 1] += starts[g];
        }
        let mut next = starts.clone();
        let mut pairs = std::mem::take(&mut self.pairs);
        for s in 0..sources {
            let base = self.starts[s];
            let copy = pairs[base..self.starts[s + 1]].to_vec();
            for pair in copy {
                let at = &mut next[s * buckets + bucket_of(length_of(pair))];
                pairs[*at] = pair;
                *at += 1;
            }
        }
        Self::with_prefix(pairs, starts, buckets)
    }

    fn with_prefix(pairs: Vec<u64>, starts: Vec<usize>, buckets: usize) -> Self {
        let mut prefix = Vec::with_capacity(pairs.len() / STRIDE + starts.len() * 2);
        let mut prefix_starts = Vec::with_capacity(starts.len());
        for group in starts.windows(2) {
            prefix_starts.push(prefix.len());
            let mut sum = 0;
            prefix.push(0);
            for stride in pairs[group[0]..group[1]].chunks(STRIDE) {
                sum += stride.iter().map(|&p| u64::from(length_of(p))).sum::<u64>();
                prefix.push(sum);
            }
        }
        prefix_starts.push(prefix.len());
        Self {
            pairs,
            starts,
            buckets,
            prefix,
            prefix_starts,
            spare: Mutex::new(Vec::new()),
        }
    }

    fn len_of(&self, g: usize) -> usize {
        self.starts[g + 1] - self.starts[g]
    }

    /// Tokens of group `g`'s rows `0..i`.
    fn tokens_before(&self, g: usize, i: usize) -> u64 {
        let start = self.starts[g] + i / STRIDE * STRIDE;
        let partial: u64 = self.pairs[start..self.starts[g] + i]
            .iter()
            .map(|&p| u64::from(length_of(p)))
            .sum();
        self.prefix[self.prefix_starts[g] + i / STRIDE] + partial
    }

    /// The selection of forming key `key` (see the module docs).
    pub(crate) fn select(&self, mix: &Mix, seed: u64, key: u64) -> Selection {
        let groups = self.starts.len() - 1;
        let mut runs = Vec::new();
        let mut first = Vec::with_capacity(groups + 1);
        let (mut samples, mut tokens) = (0usize, 0u64);
        for s in 0..mix.len() {
            let quota = mix.quotas[s];
            let own = s * self.buckets..(s + 1) * self.buckets;
            let slice = (quota.rest > 0).then(|| {
                let slices = (mix.totals[s] / quota.rest).max(1);
                let cycle = Cycle::new(self, own.clone(), seed, s, key / slices);
                let (j, unit) = (key % slices, mix.spec.unit);
                let from = cycle.boundary(j * quota.rest, unit);
                let to = cycle.boundary((j + 1) * quota.rest, unit);
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

    /// The rows of `selection`, group after group (repeats included).
    pub(crate) fn rows(&self, selection: &Selection) -> Vec<u32> {
        let mut rows = Vec::with_capacity(selection.samples);
        for &(a, b) in &selection.runs {
            rows.extend(self.pairs[a..b].iter().map(|&p| row_of(p)));
        }
        rows
    }

    /// The pairs of `selection` where they lie, in the order [`Groups::rows`] lists them.
    pub(crate) fn runs<'a>(&'a self, selection: &'a Selection) -> Runs<'a> {
        Runs {
            pairs: &self.pairs,
            runs: &selection.runs,
        }
    }

    /// Where each bucket's rows of `selection` start in an epoch buffer holding them bucket after
    /// bucket (the last entry: their count).
    pub(crate) fn bucket_starts(&self, selection: &Selection) -> Vec<usize> {
        let sources = (self.starts.len() - 1) / self.buckets;
        let mut starts = vec![0usize; self.buckets + 1];
        for s in 0..sources {
            for b in 0..self.buckets {
                let g = s * self.buckets + b;
                let runs = &selection.runs[selection.first[g]..selection.first[g + 1]];
                starts[b + 1] += runs.iter().map(|(a, b)| b - a).sum::<usize>();
            }
        }
        for b in 0..self.buckets {
            starts[b + 1] += starts[b];
        }
        starts
    }

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

    /// An epoch buffer of `len` pairs: the spare one, or a new one. Its contents are garbage.
    pub(crate) fn take_buffer(&self, len: usize) -> Vec<u64> {
        let mut buffer = self
            .spare
            .lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default();
        // Grown, never shrunk: an epoch's selection varies in size by a few rows.
        buffer.resize(len, 0);
        buffer
    }

    /// Keeps `buffer` for the next epoch.
    pub(crate) fn give_back(&self, buffer: Vec<u64>) {
        if let Ok(mut spare) = self.spare.lock() {
            *spare = buffer;
        }
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

/// Keys the cycles of sources apart from the epoch's own permutation (which is keyed by the seed).
const CYCLE_SALT: u64 = 0x6d69_7874_7572_6573;

/// Writes source `s`'s rows `own` into `out` in their fixed seeded order (see [`Groups::new`]),
/// each with its length.
fn fixed_order<L: Length>(
    own: Own<'_>,
    lengths: &[L],
    seed: u64,
    s: usize,
    pool: Option<&rayon::ThreadPool>,
    out: &mut [u64],
) {
    let key = mix64(seed ^ mix64(CYCLE_SALT.wrapping_add(s as u64)));
    let Scattered {
        mut rows,
        companion,
        starts,
    } = match own {
        // A whole range: positions into its lengths, turned into rows below.
        Own::Range(lo, hi) => {
            let part = &lengths[lo as usize..hi as usize];
            scatter_into_chunks(part.len(), None, Some(part), key, 0, pool)
        }
        Own::List(list) => scatter_into_chunks(list.len(), Some(list), Some(lengths), key, 0, pool),
    };
    if let Own::Range(lo, _) = own {
        for row in &mut rows {
            *row += lo;
        }
    }
    let mut values = companion.unwrap_or_default();
    let chunks: Vec<_> = split_chunks(&mut rows, &starts)
        .into_iter()
        .zip(split_chunks(&mut values, &starts))
        .enumerate()
        .collect();
    run(pool, chunks, |(c, (rows, values))| {
        shuffle_chunk_pair(key, 0, c, rows, values);
    });
    for ((slot, &r), &l) in out.iter_mut().zip(&rows).zip(&values) {
        *slot = u64::from(r) << 32 | u64::from(l.into());
    }
}

fn row_of(pair: u64) -> u32 {
    crate::plan::form::row_of(pair)
}

fn length_of(pair: u64) -> u32 {
    crate::plan::form::length_of(pair)
}
