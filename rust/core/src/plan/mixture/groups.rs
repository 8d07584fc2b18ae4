//! A mixture's rows as every epoch selects from them: each source's admitted rows in groups, one per
//! bucket once the buckets are known (one per source before), each in a fixed seeded order drawn
//! once, with every row's length beside it and a token prefix sum every [`STRIDE`] rows. An epoch's
//! selection (`select.rs`) is a list of runs of these groups; the planner fills its buckets from
//! them (`spread.rs`) or scatters them where they lie (`permute::scatter_runs`).

use std::sync::Mutex;

use crate::lengths::Length;
use crate::plan::mixture::Own;
use crate::plan::permute::{scatter_into_chunks, shuffle_chunk_pair, Runs, Scattered};
use crate::rng::mix64;
use crate::tasks::{run, split_chunks};

/// Rows between two stored token prefix sums of a group.
const STRIDE: usize = 16;

/// A mixture's admitted rows in groups (see the module docs): group `g = source × buckets +
/// bucket`, its rows with their lengths (`row << 32 | length`) at `pairs[starts[g]..starts[g + 1]]`.
#[derive(Debug)]
pub(crate) struct Groups {
    pub(super) pairs: Vec<u64>,
    pub(super) starts: Vec<usize>,
    pub(super) buckets: usize,
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
    pub(super) runs: Vec<(usize, usize)>,
    pub(super) first: Vec<usize>,
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

    pub(super) fn len_of(&self, g: usize) -> usize {
        self.starts[g + 1] - self.starts[g]
    }

    /// Tokens of group `g`'s rows `0..i`.
    pub(super) fn tokens_before(&self, g: usize, i: usize) -> u64 {
        let start = self.starts[g] + i / STRIDE * STRIDE;
        let partial: u64 = self.pairs[start..self.starts[g] + i]
            .iter()
            .map(|&p| u64::from(length_of(p)))
            .sum();
        self.prefix[self.prefix_starts[g] + i / STRIDE] + partial
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

/// Keys the cycles of sources apart from the epoch's own permutation (which is keyed by the seed).
pub(super) const CYCLE_SALT: u64 = 0x6d69_7874_7572_6573;

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

pub(super) fn row_of(pair: u64) -> u32 {
    crate::plan::form::row_of(pair)
}

pub(super) fn length_of(pair: u64) -> u32 {
    crate::plan::form::length_of(pair)
}
