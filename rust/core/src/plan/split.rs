//! Split for ranks: a formed epoch brought to its batch count, so every rank runs the same steps,
//! without repeating or losing samples; and the row movers the stages share (`gather`,
//! `reorder_region`).
//!
//! Every rank must run the same number of steps, or the ranks that finish first hang in the next
//! collective. Batches arrive here already in training order as CSR (see [`crate::plan::planner`]).
//!
//! * `drop_last=false`: the batch count is raised to the epoch's target — a multiple of `world_size`
//!   that every epoch shares (`planner.rs`) — by *splitting* batches: the one with the most rows first
//!   (ties: the earliest), into near-equal contiguous parts. Splitting only inserts offsets; no index
//!   moves, and a part never costs more padding than its batch did. On the seed workload ~14 batches
//!   of 142,256 are split an epoch (measured).
//! * `drop_last=true`: the batches past the target are dropped and counted.
//!
//! Rejected: padding the last step with repeated samples (`DistributedSampler`'s choice), which
//! double-counts samples in the loss and makes "samples seen" differ from the dataset size.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::error::{ErrorKind, Result};
use crate::lengths::to_usize;
use crate::plan::permute::{copy_run, RUN};
use crate::tasks::run;

/// What a split changed (see [`split_to`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// Batches split.
    pub batches: u64,
    /// Their total cost before splitting.
    pub before: u64,
    /// The total cost of their parts.
    pub after: u64,
    /// `(batch, parts)` for every split batch, by batch number before the split.
    pub parts: Vec<(usize, u64)>,
}

/// Splits batches in place until their count is a multiple of `world_size`.
///
/// `offsets` is the CSR of the epoch. Batches from `first` on are split when they have the rows
/// (the planner's tail, so earlier batches keep their place); any batch otherwise. `cost(members)`
/// prices a batch for [`Split`]'s totals.
#[cfg(test)]
pub(crate) fn split_for_ranks(
    offsets: &mut Vec<u32>,
    indices: &[u32],
    world_size: u32,
    first: usize,
    cost: impl Fn(&[u32]) -> u64,
) -> Result<Split> {
    let batches = offsets.len() - 1;
    let target = batches.next_multiple_of(world_size as usize);
    split_to(offsets, indices, target, world_size, first, cost)
}

/// Splits batches in place until there are `target` of them (at least as many as now: the
/// planner's target is a multiple of `world_size`, which only names the ranks in the error when rows
/// run out).
pub fn split_to(
    offsets: &mut Vec<u32>,
    indices: &[u32],
    target: usize,
    world_size: u32,
    first: usize,
    cost: impl Fn(&[u32]) -> u64,
) -> Result<Split> {
    let batches = offsets.len() - 1;
    let needed = target.saturating_sub(batches);
    if needed == 0 {
        return Ok(Split::default());
    }
    let too_few = || ErrorKind::TooFewSamplesForRanks {
        samples: indices.len(),
        world_size,
        drop_last: false,
        batches,
        needed: target,
    };
    // Every batch keeps at least one row: without enough rows no split can work, and trying sized
    // a heap by `needed` (34 GB for world_size = 2^31: an abort).
    if batches + needed > indices.len() {
        return Err(too_few().into());
    }
    let rows = |i: usize| u64::from(offsets[i + 1] - offsets[i]);
    let parts = choose_parts(first.min(batches)..batches, needed, rows);
    let parts = parts.or_else(|| choose_parts(0..batches, needed, rows));
    let parts = parts.ok_or_else(too_few)?;
    let members = |s: u32, e: u32| &indices[s as usize..e as usize];
    let (mut before, mut after) = (0, 0);
    for &(i, p) in &parts {
        before += cost(members(offsets[i], offsets[i + 1]));
        after += part_bounds(offsets[i], offsets[i + 1], p)
            .map(|(s, e)| cost(members(s, e)))
            .sum::<u64>();
    }
    expand(offsets, &parts, needed);
    Ok(Split {
        batches: parts.len() as u64,
        before,
        after,
        parts,
    })
}

/// Per-batch values (`of_batch`, one per batch before the split) carried over a split: a split batch
/// gives each of its parts `of_part(start, end)` of the part's rows (`parts` as in [`Split`]).
pub fn expand_per_batch<T: Copy + Default>(
    of_batch: &mut Vec<T>,
    split: &Split,
    offsets_after: &[u32],
    of_part: impl Fn(u32, u32) -> T,
) {
    let Some(&(first, _)) = split.parts.first() else {
        return;
    };
    // From the first split batch on, rebuild the tail (the values before it do not move).
    let tail: Vec<T> = of_batch.split_off(first);
    let mut next_split = split.parts.iter().peekable();
    for (i, &value) in tail.iter().enumerate() {
        match next_split.peek() {
            Some(&&(b, p)) if b == first + i => {
                next_split.next();
                for _ in 0..p {
                    let k = of_batch.len();
                    of_batch.push(of_part(offsets_after[k], offsets_after[k + 1]));
                }
            }
            _ => of_batch.push(value),
        }
    }
}

/// Which batches to split and into how many parts: `(batch, parts)` sorted by batch, or `None` when
/// there are not enough rows. Only the `needed` largest batches can ever be chosen, so the heap holds
/// just those.
fn choose_parts(
    batches: std::ops::Range<usize>,
    needed: usize,
    rows: impl Fn(usize) -> u64,
) -> Option<Vec<(usize, u64)>> {
    // Max-heap on the largest part; `Reverse(index)` breaks ties toward the earliest batch.
    let mut top: BinaryHeap<Reverse<(u64, Reverse<usize>)>> =
        BinaryHeap::with_capacity(needed.min(batches.len()) + 1);
    for i in batches {
        let entry = Reverse((rows(i), Reverse(i)));
        // Most batches lose to the current `needed`-th largest: one comparison, no heap traffic.
        if top.len() == needed && top.peek().is_some_and(|smallest| entry >= *smallest) {
            continue;
        }
        top.push(entry);
        if top.len() > needed {
            top.pop();
        }
    }
    let mut heap: BinaryHeap<(u64, Reverse<usize>, u64)> =
        top.into_iter().map(|Reverse((r, i))| (r, i, 1)).collect();
    for _ in 0..needed {
        let (largest, Reverse(i), parts) = heap.pop()?;
        if largest < 2 {
            return None;
        }
        heap.push((rows(i).div_ceil(parts + 1), Reverse(i), parts + 1));
    }
    let mut chosen: Vec<(usize, u64)> = heap
        .into_iter()
        .filter(|&(_, _, p)| p > 1)
        .map(|(_, Reverse(i), p)| (i, p))
        .collect();
    chosen.sort_unstable();
    Some(chosen)
}

/// Moves the batches of one contiguous region of `rows` into `sequence` order (a permutation of
/// the region's batch numbers `0..n`, whose bounds are `bound(0) ≤ … ≤ bound(n)`), through a
/// region-sized buffer; `end_of(k, end)` learns where the `k`-th batch of the new order ends.
pub(crate) fn reorder_region(
    rows: &mut [u32],
    bound: impl Fn(usize) -> usize,
    sequence: &[u32],
    mut end_of: impl FnMut(usize, usize),
) {
    let (start, end) = (bound(0), bound(sequence.len()));
    SCRATCH.with_borrow_mut(|moved| {
        // Slack for `copy_run`'s fixed-size runs. Only growth is zeroed: the buffer lives on with
        // its thread, so later epochs reuse it (zeroing a fresh one per group cost ~3M instructions
        // an epoch, measured).
        if moved.len() < end - start + RUN {
            moved.resize(end - start + RUN, 0);
        }
        let mut at = 0;
        for (k, &id) in sequence.iter().enumerate() {
            let id = id as usize;
            let (s, e) = (bound(id), bound(id + 1));
            copy_run(moved, at, rows, s, e - s);
            at += e - s;
            end_of(k, start + at);
        }
        rows[start..start + at].copy_from_slice(&moved[..at]);
    });
}

thread_local! {
    /// [`reorder_region`]'s buffer, one per thread (a forming group's rows: ~225 KB at 1M samples).
    static SCRATCH: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The plan with its batches in `sequence` order (batch numbers into the CSR `offsets` over
/// `order`; batches left out of `sequence` are left out of the plan): rows gathered into `rows` (a
/// recycled buffer, or empty), in parallel over fixed ranges of the sequence, and the offsets rebuilt. This is the one
/// place where rows move after forming.
pub(crate) fn gather(
    order: &[u32],
    offsets: &[u32],
    sequence: &[u32],
    mut rows: Vec<u32>,
    pool: Option<&rayon::ThreadPool>,
) -> (Vec<u32>, Vec<u32>) {
    let mut new_offsets = Vec::with_capacity(sequence.len() + 1);
    new_offsets.push(0u32);
    let mut end = 0;
    for &id in sequence {
        let id = id as usize;
        end += offsets[id + 1] - offsets[id];
        new_offsets.push(end);
    }
    let rows_total = to_usize(end);
    // Every element is overwritten, so a recycled buffer is not cleared (fresh pages are what cost
    // here: ~1 ms an epoch of page faults at 1M samples, measured); slack for `copy_run`'s runs.
    if rows.len() < rows_total + RUN {
        rows.resize(rows_total + RUN, 0);
    } else {
        rows.truncate(rows_total + RUN);
    }
    let block = 8192;
    let mut tasks = Vec::with_capacity(sequence.len() / block + 1);
    let mut rest: &mut [u32] = &mut rows;
    for first in (0..sequence.len()).step_by(block) {
        let last = (first + block).min(sequence.len());
        let size = to_usize(new_offsets[last] - new_offsets[first]);
        // The last task keeps the slack.
        let take = if last == sequence.len() {
            rest.len()
        } else {
            size
        };
        let (head, tail) = rest.split_at_mut(take);
        tasks.push((&sequence[first..last], head));
        rest = tail;
    }
    run(pool, tasks, |(ids, out)| {
        let mut at = 0;
        for &id in ids {
            let id = id as usize;
            let (s, e) = (to_usize(offsets[id]), to_usize(offsets[id + 1]));
            if at + (e - s).next_multiple_of(RUN) <= out.len() {
                copy_run(out, at, order, s, e - s);
            } else {
                out[at..at + e - s].copy_from_slice(&order[s..e]);
            }
            at += e - s;
        }
    });
    rows.truncate(rows_total);
    (rows, new_offsets)
}

/// The `(start, end)` of each of `parts` near-equal pieces of `start..end` (larger pieces first).
fn part_bounds(start: u32, end: u32, parts: u64) -> impl Iterator<Item = (u32, u32)> {
    // At most `end - start` parts (every part keeps a row): the count fits u32.
    let parts = u32::try_from(parts).unwrap_or(u32::MAX);
    let (base, extra) = ((end - start) / parts, (end - start) % parts);
    (0..parts).scan(start, move |s, p| {
        let e = *s + base + u32::from(p < extra);
        let piece = (*s, e);
        *s = e;
        Some(piece)
    })
}

/// Rewrites `offsets` in place with the split points of `parts` (sorted by batch), walking from the
/// back: the unsplit batches between two splits move up as one block (`copy_within`, memory speed:
/// a per-offset loop cost ~4M instructions an epoch on the seed workload), so every old offset is
/// read before its slot is overwritten.
fn expand(offsets: &mut Vec<u32>, parts: &[(usize, u64)], needed: usize) {
    let batches = offsets.len() - 1;
    offsets.resize(batches + 1 + needed, 0);
    let mut shift = needed; // where old offsets after the current split move: up by the parts left
    let mut tail = batches + 1; // old offsets `i + 2..tail` follow split batch `i` and are unplaced
    for &(i, p) in parts.iter().rev() {
        offsets.copy_within(i + 2..tail, i + 2 + shift);
        let (start, end) = (offsets[i], offsets[i + 1]);
        let extra = to_usize(p) - 1;
        let first = i + 1 + shift - extra;
        for (k, (_, e)) in part_bounds(start, end, p).enumerate() {
            offsets[first + k] = e;
        }
        shift -= extra;
        tail = i + 1; // old offset `i + 1` (this batch's end) is placed; `i` is the previous end
    }
}

/// What [`drop_to`] removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// Batches dropped.
    pub batches: u64,
    /// Their rows: a range of the plan's indices, at its end.
    pub rows: std::ops::Range<usize>,
    /// Their total cost.
    pub cost: u64,
}

/// Truncates the epoch's offsets to a multiple of `world_size` batches; `cost` prices what is dropped.
#[cfg(test)]
pub(crate) fn drop_remainder(
    offsets: &mut Vec<u32>,
    indices: &[u32],
    world_size: u32,
    cost: impl Fn(&[u32]) -> u64,
) -> Dropped {
    let batches = offsets.len() - 1;
    drop_to(
        offsets,
        indices,
        batches - batches % world_size as usize,
        cost,
    )
}

/// Truncates the epoch's offsets to its first `keep` batches (all of them when it has fewer);
/// `cost` prices what is dropped.
pub fn drop_to(
    offsets: &mut Vec<u32>,
    indices: &[u32],
    keep: usize,
    cost: impl Fn(&[u32]) -> u64,
) -> Dropped {
    let batches = offsets.len() - 1;
    let keep = keep.min(batches);
    let rows = to_usize(offsets[keep])..to_usize(offsets[batches]);
    let cost = offsets[keep..]
        .windows(2)
        .map(|w| cost(&indices[to_usize(w[0])..to_usize(w[1])]))
        .sum();
    offsets.truncate(keep + 1);
    Dropped {
        batches: (batches - keep) as u64,
        rows,
        cost,
    }
}

#[cfg(test)]
mod tests;
