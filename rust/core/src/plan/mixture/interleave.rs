//! The interleave stage: equal-length samples swapped between the plan's slots so that every stretch
//! of training order carries each source near its share (see the module docs of `mixture`).
//!
//! Training order is cut into blocks of [`BLOCK`] slots (set by the plan's size alone, so the result
//! is the same for any thread count), interleaved in parallel. In a block, its samples are grouped
//! into pools by `(length, source)`, each pool in plan order, and its slots are filled in training
//! order. A slot whose length only one source has in the block keeps its sample (its pool is read in
//! plan order, so it would get it back). Otherwise the slot takes the next sample of the source with
//! the highest score:
//!
//! * `lag` — how far the source is behind its even pace through the slots of this length
//!   (`(seen + 1) · count / slots − used`): no pool is drained early and left empty for the
//!   stretches of training order that come after;
//! * `deficit / v` — how far the source is behind the share these slots would give it in
//!   expectation (every slot of length `l` adds each source's share of that length's samples, the
//!   chosen source loses the slot's `v`: `l` tokens, or 1 sample), in slots of this length.
//!
//! Tracking what each slot would give in expectation, rather than the epoch's overall shares, keeps
//! the target reachable: a stretch of long samples is mostly code, and the stage does not push
//! other sources into it. Measured on the seed workload split into four sources of different
//! length profiles (8 ranks × 4, 16K tokens): per-window source TV 0.014 in tokens (0.010 is the
//! floor set by each window's own lengths), p99 0.036; against the epoch's overall shares the
//! deficit alone drained pools and the last windows reached TV 0.2. The lag alone, without the
//! deficit, is a stratified draw per length: 0.055, as each length's rounding adds up.
//!
//! A block swaps samples among its own slots only, so its pools are exactly its own samples: the
//! forming shuffle leaves each block's source mix the epoch's up to chance. A block must hold many
//! samples of each length for the swaps to have choice: with blocks of 2^16 slots (~8 samples a
//! length on the seed workload) the source TV rose from 0.015 to 0.033 (measured), so a block is
//! 2^20 slots — the seed epoch is one block, and 100M samples make ~100 that run in parallel. Each
//! slot's decision is recorded first and the samples gathered after: the gather's random reads then
//! overlap (inside the decisions they stalled them), and the highest score is chosen without branches.
//! Deterministic: ties go to the earlier source, and the figures are f64 sums in a fixed order. The
//! reach of the stage is the density of lengths: measured on the four-source split of the seed
//! workload (8 ranks × 4), TV 0.049 at 20K samples (0.057 without the stage), 0.036 at 50K, 0.034
//! at 200K, 0.015 at 902K.

use crate::lengths::Length;
use crate::memory;
use crate::plan::mixture::{Mix, Unit};
use crate::tasks::run;

/// Slots per block of training order (see the module docs).
pub(crate) const BLOCK: usize = 1 << 20;

/// Rearranges the samples of `order` (a plan in training order) among slots of equal length (see the
/// module docs). Every batch keeps its lengths, so every figure of the plan but the sources' is kept.
pub(crate) fn interleave<L: Length>(
    order: &mut [u32],
    lengths: &[L],
    mix: &Mix,
    pool: Option<&rayon::ThreadPool>,
) {
    if mix.len() < 2 || order.is_empty() {
        return;
    }
    let tokens = mix.spec.unit == Unit::Tokens;
    let blocks: Vec<&mut [u32]> = order.chunks_mut(BLOCK).collect();
    run(pool, blocks, |block| {
        interleave_block(block, lengths, mix, tokens)
    });
}

/// One block of [`interleave`]: each slot's class replaced by the pool position of the sample it takes
/// (see the module docs), then the samples gathered.
fn interleave_block<L: Length>(order: &mut [u32], lengths: &[L], mix: &Mix, tokens: bool) {
    let sources = mix.len();
    let Classes {
        mut of_slot,
        mut classes,
        mut cells,
        pools,
    } = Classes::new(order, lengths, mix, tokens, sources);
    let mut deficit = vec![0f64; sources];
    for taken in &mut of_slot {
        let class = &mut classes[*taken as usize];
        if !class.mixed {
            *taken = KEEP; // one source has this length here: the slot keeps its sample
            continue;
        }
        let own = &mut cells[class.cells..class.cells + sources];
        let ahead = f64::from(class.seen) + 1.0;
        // The highest score among sources with samples left (ties to the earlier one), without
        // branches: which source wins is a coin toss for the branch predictor (21.5 → 13.4 ms on the
        // seed epoch; a tournament over the sources instead of this scan measured the same).
        let (mut best, mut top) = (0usize, f64::NEG_INFINITY);
        for (s, (cell, owed)) in own.iter().zip(deficit.iter_mut()).enumerate() {
            // Scored before this slot's expectation is added (as measured in the module docs).
            let score = ahead * cell.share - f64::from(cell.used) + *owed * class.per_v;
            let score = if cell.used < cell.count {
                score
            } else {
                f64::NEG_INFINITY
            };
            let better = score > top;
            best = if better { s } else { best };
            top = if better { score } else { top };
            *owed += cell.share * class.v;
        }
        deficit[best] -= class.v;
        let cell = &mut own[best];
        *taken = cell.start + cell.used;
        cell.used += 1;
        class.seen += 1;
    }
    for (slot, &taken) in order.iter_mut().zip(&of_slot) {
        if taken != KEEP {
            *slot = pools[taken as usize];
        }
    }
}

/// A slot that keeps its sample.
const KEEP: u32 = u32::MAX;

/// A length class: what a slot of it weighs (`v`: its length in tokens, or 1 sample) and `1 / v`,
/// where its cells start, the slots of it filled so far, and whether more than one source has it.
#[derive(Clone, Copy)]
struct Class {
    v: f64,
    per_v: f64,
    cells: usize,
    seen: u32,
    mixed: bool,
}

/// One source's samples of one class: their share of the class's, how many, how many were placed,
/// and where their pool starts. The cells of a class lie together (one or two cache lines).
#[derive(Clone, Copy)]
struct Cell {
    share: f64,
    count: u32,
    used: u32,
    start: u32,
}

/// A block's samples by `(length class, source)`: a class per distinct length.
struct Classes {
    /// The class of each slot, in training order.
    of_slot: Vec<u32>,
    classes: Vec<Class>,
    /// `class × sources + source`.
    cells: Vec<Cell>,
    /// The samples, pool after pool (a pool per cell), each pool in plan order.
    pools: Vec<u32>,
}

/// Lengths up to this map to their class through a table (4 bytes a length, 1 MB a block at most);
/// longer ones, rare outside pretraining corpora, by binary search over the block's distinct lengths.
const DENSE_LENGTHS: u32 = 1 << 18;

impl Classes {
    /// The block's classes, each with `stride` cells (one per source).
    fn new<L: Length>(
        order: &[u32],
        lengths: &[L],
        mix: &Mix,
        tokens: bool,
        stride: usize,
    ) -> Self {
        let mut of_slot: Vec<u32> = order.iter().map(|&r| lengths[r as usize].into()).collect();
        // Sources number at most MAX_SOURCES (255).
        #[allow(clippy::cast_possible_truncation)]
        let source: Vec<u8> = order.iter().map(|&r| mix.source_of(r) as u8).collect();
        let distinct = number_classes(&mut of_slot);
        let empty = Cell {
            share: 0.0,
            count: 0,
            used: 0,
            start: 0,
        };
        let mut cells = vec![empty; distinct.len() * stride];
        for (&class, &s) in of_slot.iter().zip(&source) {
            cells[class as usize * stride + usize::from(s)].count += 1;
        }
        let mut start = 0u32;
        let mut classes = Vec::with_capacity(distinct.len());
        for (c, &length) in distinct.iter().enumerate() {
            let own = &mut cells[c * stride..(c + 1) * stride];
            let slots: u32 = own.iter().map(|cell| cell.count).sum();
            for cell in own.iter_mut() {
                (cell.share, cell.start) = (f64::from(cell.count) / f64::from(slots), start);
                start += cell.count;
            }
            let v = if tokens { f64::from(length) } else { 1.0 };
            classes.push(Class {
                v,
                per_v: 1.0 / v,
                cells: c * stride,
                seen: 0,
                mixed: own.iter().filter(|cell| cell.count > 0).count() > 1,
            });
        }
        let mut fill: Vec<u32> = cells.iter().map(|cell| cell.start).collect();
        let mut pools = vec![0u32; order.len()];
        for ((&r, &class), &s) in order.iter().zip(&of_slot).zip(&source) {
            let k = class as usize * stride + usize::from(s);
            pools[fill[k] as usize] = r;
            fill[k] += 1;
        }
        Self {
            of_slot,
            classes,
            cells,
            pools,
        }
    }
}

/// Replaces each length of `of_slot` by its class (the rank of its value among the distinct ones) and
/// returns the distinct lengths, ascending.
fn number_classes(of_slot: &mut [u32]) -> Vec<u32> {
    let longest = of_slot.iter().copied().max().unwrap_or(0);
    if longest > DENSE_LENGTHS {
        let mut distinct = of_slot.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        for l in of_slot.iter_mut() {
            // At most as many classes as slots, a u32.
            #[allow(clippy::cast_possible_truncation)]
            let class = distinct.partition_point(|&d| d < *l) as u32;
            *l = class;
        }
        return distinct;
    }
    let mut class = vec![u32::MAX; longest as usize + 1];
    for &l in of_slot.iter() {
        class[l as usize] = 0;
    }
    let mut distinct = Vec::new();
    for (l, c) in class.iter_mut().enumerate().filter(|(_, c)| **c == 0) {
        // Classes and lengths fit u32 (at most `longest + 1` ≤ 2^22 + 1 of them).
        #[allow(clippy::cast_possible_truncation)]
        let (id, length) = (distinct.len() as u32, l as u32);
        *c = id;
        distinct.push(length);
    }
    for l in of_slot.iter_mut() {
        *l = class[*l as usize];
    }
    distinct
}

/// Bytes the stage allocates at most, for blocks on up to `threads` threads at once: per slot of a
/// block its class, source byte and pool entry, and the class table of lengths up to
/// [`DENSE_LENGTHS`].
pub(crate) fn reserve(threads: usize) -> crate::error::Result<()> {
    let per_block = BLOCK as u64 * 9 + 4 * u64::from(DENSE_LENGTHS);
    memory::reserve(
        "interleaving a mixture's sources",
        per_block * threads.max(1) as u64,
    )
}
