//! The select stage: the rows an epoch of a mixture trains, for one forming key.
//!
//! Source `s` with quota `copies` whole copies plus `rest` contributes every admitted row `copies`
//! times, then `rest` (samples, or tokens) from its *cycle*: a seeded permutation of its admitted
//! rows, read as consecutive slices of `rest`, one slice per key. Key `k` takes slice `k mod m` of
//! cycle `⌊k / m⌋`, `m = ⌊total / rest⌋` slices fitting a cycle, so keys `0, 1, 2, …` (the epochs)
//! walk through a down-sampled source without repeating a row until the cycle ends, and a slice
//! never holds a row twice. In tokens, a slice's ends are the sample boundaries nearest to
//! `j·rest` and `(j + 1)·rest` tokens into the cycle: a source's tokens are within one sample of
//! its share.
//!
//! Each source's cycle is a permutation keyed by `(seed, source)` and the cycle number, drawn as the
//! epoch's own permutation is, so the population is the same for any thread count. The population
//! lists sources in order, copies first.

use crate::lengths::Length;
use crate::plan::mixture::{Mix, Own, Unit};
use crate::plan::permute::{scatter_into_chunks, shuffle_chunk_pair, Scattered};
use crate::rng::mix64;
use crate::tasks::{run, split_chunks};

/// One epoch's rows (repeated where a source is up-sampled) and their tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Population {
    pub(crate) rows: Vec<u32>,
    pub(crate) tokens: u64,
}

impl Mix {
    /// The population of forming key `key` (see the module docs).
    pub(crate) fn population<L: Length>(
        &self,
        lengths: &[L],
        seed: u64,
        key: u64,
        pool: Option<&rayon::ThreadPool>,
    ) -> Population {
        let parts = run(pool, (0..self.len()).collect(), |s| {
            self.select(lengths, seed, key, s, pool)
        });
        let mut rows = Vec::with_capacity(parts.iter().map(|p| p.0.len()).sum());
        let mut tokens = 0;
        for (part, part_tokens) in parts {
            rows.extend_from_slice(&part);
            tokens += part_tokens;
        }
        Population { rows, tokens }
    }

    /// Source `s`'s rows for `key` — its copies, then its slice of the cycle — and their tokens.
    fn select<L: Length>(
        &self,
        lengths: &[L],
        seed: u64,
        key: u64,
        s: usize,
        pool: Option<&rayon::ThreadPool>,
    ) -> (Vec<u32>, u64) {
        let quota = self.quotas[s];
        let own = self.rows_of(s);
        let mut rows = Vec::new();
        for _ in 0..quota.copies {
            own.extend_into(&mut rows);
        }
        let copied = quota.copies * self.tokens[s];
        if quota.rest == 0 {
            return (rows, copied);
        }
        let slices = (self.totals[s] / quota.rest).max(1);
        let (cycle, slice) = (key / slices, key % slices);
        let (order, values) = cycle_order(own, lengths, seed, cycle, s, pool);
        let taken = match self.spec.unit {
            Unit::Samples => {
                // The rest is below the source's admitted rows, so slices lie inside the cycle.
                let bound = |k: u64| {
                    usize::try_from(k * quota.rest).map_or(order.len(), |k| k.min(order.len()))
                };
                bound(slice)..bound(slice + 1)
            }
            Unit::Tokens => token_slice(&values, (slice * quota.rest, (slice + 1) * quota.rest)),
        };
        let sliced: u64 = values[taken.clone()]
            .iter()
            .map(|&l| u64::from(l.into()))
            .sum();
        rows.extend_from_slice(&order[taken]);
        (rows, copied + sliced)
    }
}

/// Source `s`'s rows `own` in the seeded order of cycle `cycle`, each with its length beside it: a
/// uniform permutation drawn as the epoch's own is (`permute.rs`: a scatter into cache-sized chunks,
/// then a Fisher–Yates per chunk), keyed by a seed of the source's own. A Fisher–Yates over the whole
/// source swapped across hundreds of megabytes at 100M samples (most of an 8.5 s epoch, measured).
fn cycle_order<L: Length>(
    own: Own<'_>,
    lengths: &[L],
    seed: u64,
    cycle: u64,
    s: usize,
    pool: Option<&rayon::ThreadPool>,
) -> (Vec<u32>, Vec<L>) {
    let key = mix64(seed ^ mix64(SOURCE_SALT.wrapping_add(s as u64)));
    let Scattered {
        mut rows,
        companion,
        starts,
    } = match own {
        // A whole range: positions into its lengths, turned into rows below.
        Own::Range(lo, hi) => {
            let part = &lengths[lo as usize..hi as usize];
            scatter_into_chunks(part.len(), None, Some(part), key, cycle, pool)
        }
        Own::List(list) => {
            scatter_into_chunks(list.len(), Some(list), Some(lengths), key, cycle, pool)
        }
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
        shuffle_chunk_pair(key, cycle, c, rows, values);
    });
    (rows, values)
}

/// Keys the cycles of sources apart from the epoch's own permutation (which is keyed by the seed).
const SOURCE_SALT: u64 = 0x6d69_7874_7572_6573;

/// The positions of a cycle (its lengths `values`, in order) between the sample boundaries nearest
/// to `wanted.0` and `wanted.1` tokens into it.
fn token_slice<L: Length>(values: &[L], (from, to): (u64, u64)) -> std::ops::Range<usize> {
    let n = values.len();
    let (mut start, mut sum) = (None, 0u64);
    let nearest = |before: u64, after: u64, target: u64| target - before > after - target;
    for (i, &l) in values.iter().enumerate() {
        let next = sum + u64::from(l.into());
        if start.is_none() && next > from {
            // The boundary before sample i (at `sum`) or after it (at `next`), whichever is nearer.
            start = Some(if nearest(sum, next, from) { i + 1 } else { i });
        }
        if next > to {
            let end = if nearest(sum, next, to) { i + 1 } else { i };
            let start = start.unwrap_or(end).min(end);
            return start..end;
        }
        sum = next;
    }
    start.unwrap_or(n)..n
}
