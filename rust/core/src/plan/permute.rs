//! A seeded, uniformly random permutation of `0..n`, built in parallel in a single buffer.
//!
//! Algorithm (a scatter shuffle):
//!
//! 1. Give every element `r` a random chunk id in `0..C` (`C = 2^bits`, chosen from `n` only, so the
//!    result never depends on the thread count) and counting-sort the elements by chunk id into the
//!    output. Ids come `64 / bits` at a time from one 64-bit draw; with `C` a power of two, taking the
//!    top bits is exactly uniform. The elements are cut into fixed segments, each with its own stream,
//!    so counting and scattering run in parallel (see [`scatter_into_chunks`]).
//! 2. Fisher–Yates every chunk with its own stream, in parallel. Chunks hold ~16K elements, so each
//!    shuffle runs in L2 instead of jumping across the whole array.
//!
//! The result is uniform over all `n!` permutations: for any output arrangement, summing over the chunk
//! sizes `s` gives `Σ_s C^-n · Π 1/s_c! = C^-n · C^n / n! = 1/n!`.
//!
//! Measured on the seed workload (902,087 elements, 2 cores): a plain Fisher–Yates over the whole array
//! takes ~4.6 ms, dominated by cache misses; this takes a fraction of that (see `benches/plan.rs`).

use crate::lengths::Length;
use crate::rng::{shuffle, shuffle_pair, Pcg64, Stream};
use crate::tasks::run;
#[cfg(test)]
use crate::tasks::split_chunks;

/// Average elements per chunk that the chunk count aims for (fits in L2 as `u32`s).
const TARGET_CHUNK: usize = 1 << 14;

/// Rows per segment aimed for when splitting the epoch into parallel segments.
const TARGET_SEGMENT: usize = 1 << 16;

/// Most segments: enough to keep 8 threads busy, few enough that the `chunks × segments` regions
/// of the scatter stay cheap to set up.
const MAX_SEGMENTS: usize = 16;

/// `0..n` cut into equal contiguous segments, their number set by `n` alone (never by the thread count,
/// so that the plan does not depend on it).
pub fn segments(n: usize) -> Vec<std::ops::Range<usize>> {
    let count = (n / TARGET_SEGMENT).clamp(1, MAX_SEGMENTS);
    (0..count)
        .map(|s| s * n / count..(s + 1) * n / count)
        .collect()
}

/// A uniformly random permutation of `0..n` for `(seed, epoch)`; `n` must fit in `u32` (what the
/// scatter and the chunk shuffles make, put together: tests check it is uniform).
#[cfg(test)]
pub(crate) fn random_permutation(
    n: usize,
    seed: u64,
    epoch: u64,
    pool: Option<&rayon::ThreadPool>,
) -> Vec<u32> {
    let scattered = scatter_into_chunks::<u32>(n, None, None, seed, epoch, pool);
    let mut out = scattered.rows;
    let pieces = split_chunks(&mut out, &scattered.starts);
    run(
        pool,
        pieces.into_iter().enumerate().collect(),
        |(c, piece)| shuffle_chunk(seed, epoch, c, piece),
    );
    out
}

/// Every element written to its random chunk (step 1): the permutation is complete once every chunk
/// is shuffled with [`shuffle_chunk`] — callers may do that chunk by chunk, right before using it,
/// while it is hot in cache.
#[derive(Debug)]
pub struct Scattered<L> {
    /// The elements, chunk by chunk.
    pub rows: Vec<u32>,
    /// `companion[i]` is `source[rows[i]]`, when a source was given (see [`scatter_into_chunks`]).
    pub companion: Option<Vec<L>>,
    /// The `C + 1` chunk starts.
    pub starts: Vec<usize>,
}

/// The pairs (`row << 32 | length`) of `runs` of `pairs`, one run after another: the elements of a
/// scatter that permutes a mixture's selection where it lies (`plan/mixture/select.rs`), with
/// their lengths as the companion. Listing rows and lengths first cost ~0.18 s of a 2 s epoch at
/// 100M samples, and 6 bytes a sample (measured).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Runs<'a> {
    pub(crate) pairs: &'a [u64],
    pub(crate) runs: &'a [(usize, usize)],
}

impl Runs<'_> {
    /// Elements in all.
    pub(crate) fn len(&self) -> usize {
        self.runs.iter().map(|(a, b)| b - a).sum()
    }

    /// A reader of the elements from element `from` on, one after another.
    fn from(&self, from: usize) -> impl FnMut() -> u64 + '_ {
        let (mut run, mut at) = (0, 0);
        let mut skip = from;
        while run < self.runs.len() {
            let (a, b) = self.runs[run];
            if skip < b - a {
                at = a + skip;
                break;
            }
            skip -= b - a;
            run += 1;
        }
        move || {
            while at == self.runs[run].1 {
                run += 1;
                at = self.runs[run].0;
            }
            at += 1;
            self.pairs[at - 1]
        }
    }
}

/// Scatters the elements of `runs` into chunks as [`scatter_into_chunks`] scatters a population,
/// each with its length beside it: the same permutation as of the listed rows.
pub(crate) fn scatter_runs<L: Length>(
    runs: Runs<'_>,
    seed: u64,
    epoch: u64,
    pool: Option<&rayon::ThreadPool>,
) -> Scattered<L> {
    let n = runs.len();
    let (bits, segments, counts) = count_chunks(n, seed, epoch, pool);
    let mut rows = vec![0u32; n];
    let mut values = vec![L::narrow(0); n];
    let layout = Layout {
        segments: &segments,
        counts: &counts,
        bits,
    };
    let targets = regions(&mut rows, &layout)
        .into_iter()
        .zip(regions(&mut values, &layout));
    let work: Vec<_> = targets.zip(segments.iter().cloned()).enumerate().collect();
    run(pool, work, |(s, ((owned, owned_values), range))| {
        let mut rows = Slots::new(owned);
        let mut values = Slots::new(owned_values);
        // The chunk ids come in element order, as the elements do.
        let mut next = runs.from(range.start);
        for_each_chunk_id(range, s, bits, seed, epoch, |_, c| {
            let pair = next();
            // The high half is the row, the low half its length.
            #[allow(clippy::cast_possible_truncation)]
            let (row, length) = ((pair >> 32) as u32, pair as u32);
            rows.push(c, row);
            values.push(c, L::narrow(length));
        });
    });
    let starts = chunk_starts(&counts, bits);
    Scattered {
        rows,
        companion: Some(values),
        starts,
    }
}

/// Step 1. With `source`, also writes `source[r]` next to every element `r`: the scatter reads
/// elements in order, so this costs one sequential read, and saves every later reader a random one.
/// With `elements` (an epoch's population, `n` of them), element `i` is `elements[i]` rather than `i`:
/// the permutation is of the population, read in order as well.
pub fn scatter_into_chunks<L: Length>(
    n: usize,
    elements: Option<&[u32]>,
    source: Option<&[L]>,
    seed: u64,
    epoch: u64,
    pool: Option<&rayon::ThreadPool>,
) -> Scattered<L> {
    let (bits, segments, counts) = count_chunks(n, seed, epoch, pool);
    let mut rows = vec![0u32; n];
    let mut companion = source.map(|_| vec![L::narrow(0); n]);
    let layout = Layout {
        segments: &segments,
        counts: &counts,
        bits,
    };
    match (&mut companion, source) {
        (Some(values), Some(source)) => {
            let targets = regions(&mut rows, &layout)
                .into_iter()
                .zip(regions(values, &layout));
            let work: Vec<_> = targets.zip(segments.iter().cloned()).enumerate().collect();
            run(pool, work, |(s, ((owned, owned_values), range))| {
                let mut rows = Slots::new(owned);
                let mut values = Slots::new(owned_values);
                for_each_chunk_id(range, s, bits, seed, epoch, |r, c| {
                    let r = elements.map_or(r, |e| e[r as usize]);
                    rows.push(c, r);
                    values.push(c, source[r as usize]);
                });
            });
        }
        _ => {
            let work: Vec<_> = regions(&mut rows, &layout)
                .into_iter()
                .zip(segments.iter().cloned())
                .enumerate()
                .collect();
            run(pool, work, |(s, (owned, range))| {
                let mut rows = Slots::new(owned);
                match elements {
                    Some(e) => {
                        for_each_chunk_id(range, s, bits, seed, epoch, |r, c| {
                            rows.push(c, e[r as usize]);
                        });
                    }
                    None => for_each_chunk_id(range, s, bits, seed, epoch, |r, c| rows.push(c, r)),
                }
            });
        }
    }
    let starts = chunk_starts(&counts, bits);
    Scattered {
        rows,
        companion,
        starts,
    }
}

/// The chunk bits of `n` elements, their segments, and `counts[s][c]`: the elements of segment `s`
/// that go to chunk `c`. Fixed arrays of 256: ids come from a byte, so indexing needs no bounds
/// check.
fn count_chunks(
    n: usize,
    seed: u64,
    epoch: u64,
    pool: Option<&rayon::ThreadPool>,
) -> (u32, Vec<std::ops::Range<usize>>, Vec<[usize; 256]>) {
    let bits = chunk_bits(n);
    let segments = segments(n);
    let counts = run(pool, segments.iter().enumerate().collect(), |(s, range)| {
        let mut counts = [0usize; 256];
        for_each_chunk_id(range.clone(), s, bits, seed, epoch, |_, c| {
            counts[usize::from(c)] += 1
        });
        counts
    });
    (bits, segments, counts)
}

/// Where each of the `2^bits` chunks starts, from the segments' counts (and the end).
fn chunk_starts(counts: &[[usize; 256]], bits: u32) -> Vec<usize> {
    let chunks = 1usize << bits;
    let mut starts = Vec::with_capacity(chunks + 1);
    starts.push(0);
    for c in 0..chunks {
        starts.push(starts[c] + counts.iter().map(|k| k[c]).sum::<usize>());
    }
    starts
}

/// Step 2 for chunk `c`: a Fisher–Yates with the chunk's own stream.
pub fn shuffle_chunk(seed: u64, epoch: u64, chunk: usize, piece: &mut [u32]) {
    shuffle(&mut chunk_rng(seed, epoch, chunk), piece);
}

/// [`shuffle_chunk`] applied to the chunk and its companion values in lockstep.
pub fn shuffle_chunk_pair<L>(
    seed: u64,
    epoch: u64,
    chunk: usize,
    piece: &mut [u32],
    values: &mut [L],
) {
    shuffle_pair(&mut chunk_rng(seed, epoch, chunk), piece, values);
}

fn chunk_rng(seed: u64, epoch: u64, chunk: usize) -> Pcg64 {
    // Chunk ids are below 2^8 (see `chunk_bits`).
    #[allow(clippy::cast_possible_truncation)]
    Pcg64::new(seed, epoch, Stream::Chunk(chunk as u32))
}

/// Where the scatter writes: the segments and their per-chunk counts.
struct Layout<'a> {
    segments: &'a [std::ops::Range<usize>],
    counts: &'a [[usize; 256]],
    bits: u32,
}

/// Cuts the buffer, chunk by chunk, into one region per segment, so each segment owns disjoint
/// slices and all segments scatter in parallel without sharing. `regions[s][c]` is segment `s`'s
/// part of chunk `c`.
fn regions<'a, T>(out: &'a mut [T], layout: &Layout<'_>) -> Vec<Vec<&'a mut [T]>> {
    let chunks = 1usize << layout.bits;
    let mut regions: Vec<Vec<&mut [T]>> = layout
        .segments
        .iter()
        .map(|_| Vec::with_capacity(chunks))
        .collect();
    let mut rest = out;
    for c in 0..chunks {
        for (owned, count) in regions.iter_mut().zip(layout.counts) {
            let (head, tail) = rest.split_at_mut(count[c]);
            owned.push(head);
            rest = tail;
        }
    }
    regions
}

/// A segment's write cursors into its 256 possible chunk regions (ids come from a byte, so
/// indexing the fixed arrays needs no bounds check).
struct Slots<'a, T> {
    regions: [&'a mut [T]; 256],
    cursor: [usize; 256],
}

impl<'a, T> Slots<'a, T> {
    fn new(owned: Vec<&'a mut [T]>) -> Self {
        let mut regions: [&'a mut [T]; 256] = std::array::from_fn(|_| <&mut [T]>::default());
        for (slot, region) in regions.iter_mut().zip(owned) {
            *slot = region;
        }
        Self {
            regions,
            cursor: [0; 256],
        }
    }

    #[inline]
    fn push(&mut self, chunk: u8, value: T) {
        let c = usize::from(chunk);
        self.regions[c][self.cursor[c]] = value;
        self.cursor[c] += 1;
    }
}

/// Elements moved at a time by [`copy_run`].
pub(crate) const RUN: usize = 8;

/// Copies `src[s..s + len]` to `out[at..]` in fixed runs of [`RUN`] elements, which compile to a few
/// vector moves where `copy_from_slice` of a short, variable length calls `memcpy` (batches average
/// ~6 rows). Runs may write up to `RUN − 1` elements past the end, so `out` carries that much slack
/// and later runs overwrite the excess; near the end of `src` it copies exactly.
#[inline]
pub(crate) fn copy_run(out: &mut [u32], at: usize, src: &[u32], s: usize, len: usize) {
    if s + len.next_multiple_of(RUN) > src.len() {
        out[at..at + len].copy_from_slice(&src[s..s + len]);
        return;
    }
    for k in (0..len).step_by(RUN) {
        let (d, f) = (at + k, s + k);
        out[d..d + RUN].copy_from_slice(&src[f..f + RUN]);
    }
}

/// log2 of the chunk count: about `n / TARGET_CHUNK` chunks, at most 2^8 (a chunk id per byte of a
/// draw). At 100M samples that makes chunks of ~390K elements: larger than L2, still far cheaper than
/// one Fisher–Yates over the whole array.
fn chunk_bits(n: usize) -> u32 {
    (n / TARGET_CHUNK)
        .max(1)
        .next_power_of_two()
        .trailing_zeros()
        .min(8)
}

/// Calls `f(element, chunk)` for every element of `range` in order, drawing chunk ids from the
/// segment's own stream: eight ids per 64-bit draw, the top `bits` bits of each byte.
fn for_each_chunk_id(
    range: std::ops::Range<usize>,
    segment: usize,
    bits: u32,
    seed: u64,
    epoch: u64,
    mut f: impl FnMut(u32, u8),
) {
    // Elements fit in u32 (the planner rejects larger inputs); segments number at most 16.
    #[allow(clippy::cast_possible_truncation)]
    let (start, end, segment) = (range.start as u32, range.end as u32, segment as u32);
    if bits == 0 {
        (start..end).for_each(|r| f(r, 0));
        return;
    }
    let mut rng = Pcg64::new(seed, epoch, Stream::Segment(segment));
    let shift = 8 - bits;
    let mut r = start;
    while end - r >= 8 {
        let bytes = rng.next_u64().to_le_bytes();
        for (k, byte) in bytes.into_iter().enumerate() {
            // k < 8.
            #[allow(clippy::cast_possible_truncation)]
            f(r + k as u32, byte >> shift);
        }
        r += 8;
    }
    let bytes = rng.next_u64().to_le_bytes();
    for (r, byte) in (r..end).zip(bytes) {
        f(r, byte >> shift);
    }
}

#[cfg(test)]
mod tests;
