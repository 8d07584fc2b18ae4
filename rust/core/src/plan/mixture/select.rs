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
//! Each source's draws come from its own stream `(seed, cycle, source)`, so the population is the
//! same for any thread count. The population lists sources in order, copies first.

use crate::lengths::Length;
use crate::plan::mixture::{Mix, Unit};
use crate::rng::{Pcg64, Stream};
use crate::tasks::run;

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
            self.select(lengths, seed, key, s)
        });
        let mut rows = Vec::with_capacity(parts.iter().map(Vec::len).sum());
        for part in parts {
            rows.extend_from_slice(&part);
        }
        let tokens = rows
            .iter()
            .map(|&r| u64::from(lengths[r as usize].into()))
            .sum();
        Population { rows, tokens }
    }

    /// Source `s`'s rows for `key`: its copies, then its slice of the cycle.
    fn select<L: Length>(&self, lengths: &[L], seed: u64, key: u64, s: usize) -> Vec<u32> {
        let quota = self.quotas[s];
        let own = self.rows_of(s);
        let mut rows = Vec::new();
        for _ in 0..quota.copies {
            rows.extend_from_slice(&own);
        }
        if quota.rest == 0 {
            return rows;
        }
        let total = self.totals[s];
        let slices = (total / quota.rest).max(1);
        let (cycle, slice) = (key / slices, key % slices);
        // Sources number at most MAX_SOURCES.
        #[allow(clippy::cast_possible_truncation)]
        let mut rng = Pcg64::new(seed, cycle, Stream::Source(s as u32));
        let mut order = own.into_owned();
        let taken = match self.spec.unit {
            Unit::Samples => {
                // The rest is below the source's admitted rows, so slices lie inside the cycle.
                let (start, end) = (slice * quota.rest, (slice + 1) * quota.rest);
                let end = usize::try_from(end).unwrap_or(usize::MAX).min(order.len());
                partial_shuffle(&mut rng, &mut order, end);
                let start = usize::try_from(start).unwrap_or(end).min(end);
                start..end
            }
            Unit::Tokens => {
                let wanted = (slice * quota.rest, (slice + 1) * quota.rest);
                token_slice(&mut rng, &mut order, lengths, wanted)
            }
        };
        rows.extend_from_slice(&order[taken]);
        rows
    }
}

/// Shuffles `items` until its first `k` are a uniformly random draw in random order (the first `k`
/// steps of a forward Fisher–Yates; the rest of `items` is left in some order).
fn partial_shuffle(rng: &mut Pcg64, items: &mut [u32], k: usize) {
    let n = items.len();
    for i in 0..k.min(n.saturating_sub(1)) {
        // `i + below(n - i) < n`: the cast back is lossless.
        #[allow(clippy::cast_possible_truncation)]
        let j = i + rng.below((n - i) as u64) as usize;
        items.swap(i, j);
    }
}

/// The positions of the permutation (drawn as far as needed) between the sample boundaries nearest
/// to `wanted.0` and `wanted.1` tokens into it.
fn token_slice<L: Length>(
    rng: &mut Pcg64,
    order: &mut [u32],
    lengths: &[L],
    (from, to): (u64, u64),
) -> std::ops::Range<usize> {
    let n = order.len();
    let (mut start, mut sum, mut i) = (None, 0u64, 0usize);
    let nearest = |before: u64, after: u64, target: u64| target - before > after - target;
    while i < n {
        if i + 1 < n {
            // As in `partial_shuffle`.
            #[allow(clippy::cast_possible_truncation)]
            let j = i + rng.below((n - i) as u64) as usize;
            order.swap(i, j);
        }
        let next = sum + u64::from(lengths[order[i] as usize].into());
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
        i += 1;
    }
    start.unwrap_or(n)..n
}
